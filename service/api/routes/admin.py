"""``/v1/admin``: operations on the running service."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from service.api.openapi import documented, ok
from service.auth import ProtectedRoute, require_local_admin
from service.errors import ReloadFailed
from service.reload import reload_repository

router = APIRouter(
    prefix="/v1/admin",
    tags=["admin"],
    route_class=ProtectedRoute,
    dependencies=[Depends(require_local_admin)],
)


@router.post("/reload", **documented(ok("Reloaded"), 403, 409))
async def reload(request: Request) -> dict[str, Any]:
    """Verify and load the model directory afresh and swap it in atomically; a model that fails its checks
    never replaces a good one (409, naming the file). Without DBF_API_KEY, only clients on the service's
    host may call it (403 for others). With several worker processes a call reaches one of them, so it is
    refused (409): each worker reloads by itself with DBF_RELOAD_POLL_SECONDS."""
    workers = request.app.state.settings.workers
    if workers != 1:
        raise ReloadFailed(
            f"reload refused: this service runs {workers} worker processes and a call reaches only one; "
            "set DBF_RELOAD_POLL_SECONDS, and every worker reloads when the model directory changes"
        )
    repository = await reload_repository(request.app.state.dataplane)
    return {"status": "reloaded", "models": sorted(repository.models), "default": repository.default}
