"""Inference over HTTP, for every REST protocol through one route function (:func:`serve`): the request's
body received (:class:`~service.api.body.Received`) and handed to the core's pipeline
(:meth:`service.dataplane.DataPlane.serve`) with the protocol's codec. The v1 routes are here; the Open
Inference Protocol's are in :mod:`service.api.routes.open_inference`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service import v1
from service.api.body import Received
from service.api.direct import DirectRoute
from service.api.openapi import documented, ok, ref
from service.dataplane import Codec, DataPlane

router = APIRouter(tags=["inference"], route_class=DirectRoute)


async def serve(request: Request, codec: Codec, name: str | None, version: str | None = None) -> Response:
    """One inference request in ``codec``'s protocol, for the model ``name`` (the default for None)."""
    plane: DataPlane = request.app.state.dataplane
    content, headers = await plane.serve(codec, name, version, request.headers, Received(request, plane))
    return Response(content, headers=headers)


PREDICT = {
    "openapi_extra": {
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("PredictRequest")}}}
    },
    "response_class": Response,
    **documented(ok("PredictResponse"), 400, 404, 408, 413, 415, 503),
}


@router.post("/predict", **PREDICT)
async def predict_default(request: Request) -> Response:
    """Fuse the views of each sample with the default model; see ``/v1/models/{name}/predict``."""
    return await serve(request, v1, None)


@router.post("/v1/models/{name}/predict", **PREDICT)
async def predict_named(name: str, request: Request) -> Response:
    """Per sample: the fused prediction, its uncertainty, the conflict matrix between views, each view's
    discount, the calibrated ``high_conflict`` flag and the view most to blame when flagged."""
    return await serve(request, v1, name)
