"""``/v1/models``: the models served, each with its manifest, the execution providers running each view, and
where each batch size runs (:mod:`service.placement`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.api.openapi import documented, ok
from service.auth import ProtectedRoute
from service.dataplane import DataPlane
from service.repository import LoadedModel

router = APIRouter(prefix="/v1/models", tags=["models"], route_class=ProtectedRoute)


@router.get("", **documented(ok("ModelListing"), 503))
def list_models(request: Request) -> dict[str, Any]:
    """Every model's manifest, with the execution provider running each view."""
    repository = request.app.state.dataplane.ready()
    return {"default": repository.default, "models": [describe(m) for m in repository.models.values()]}


@router.get("/{name}", **documented(ok("ModelDescription"), 404, 503))
def get_model(name: str, request: Request) -> dict[str, Any]:
    plane: DataPlane = request.app.state.dataplane
    return describe(plane.model(name))


def describe(model: LoadedModel) -> dict[str, Any]:
    return {
        **model.manifest.model_dump(mode="json", by_alias=True),
        "providers": model.providers,
        "placement": model.placement.describe(),
    }
