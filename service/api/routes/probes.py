"""Liveness, readiness and metrics, open to all (the Open Inference Protocol's too). They answer GET and HEAD
(probes that only look at the status)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service import metrics
from service.api.openapi import documented, ok
from service.auth import GetAnswersHead
from service.dataplane import DataPlane

router = APIRouter(tags=["probes"], route_class=GetAnswersHead)
open_inference = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"], route_class=GetAnswersHead)


# The probes are coroutines: answered on the event loop, with no hop to a worker thread, whose GIL handoffs
# behind busy codec and inference threads cost tens of milliseconds (a sync route runs in the thread pool).
@router.get("/health", **documented(ok("Health")))
async def health() -> dict[str, str]:
    """Liveness: the process answers (inference runs off the event loop, so this stays fast under load)."""
    return {"status": "ok"}


@router.get(
    "/ready",
    **documented(ok("Readiness"), unavailable=ok("Readiness", "models not loaded, or failed verification")),
)
async def ready(request: Request) -> JSONResponse:
    """Readiness: 200 once every model is loaded and verified, else 503 with the reason."""
    plane: DataPlane = request.app.state.dataplane
    if plane.repository is None:
        return JSONResponse({"status": "not ready", "reason": plane.load_error}, status_code=503)
    return JSONResponse({"status": "ready", "models": sorted(plane.repository.models)})


@router.get(
    "/metrics",
    response_class=Response,
    **documented({"description": "Prometheus exposition format", "content": {"text/plain": {}}}),
)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus exposition format."""
    exposition: metrics.Exposition = request.app.state.exposition
    return Response(await exposition.text(), media_type=CONTENT_TYPE_LATEST)


@open_inference.get("", **documented(ok("ServerMetadata")))
def server_metadata(request: Request) -> dict[str, object]:
    """Server metadata (Open Inference Protocol)."""
    return {"name": "dbf-serve", "version": request.app.version, "extensions": ["binary_tensor_data"]}


@open_inference.get("/health/live", **documented(ok("ServerLiveness")))
async def server_live() -> dict[str, bool]:
    return {"live": True}


@open_inference.get(
    "/health/ready",
    **documented(ok("ServerReadiness"), unavailable=ok("ServerReadiness", "models not loaded")),
)
async def server_ready(request: Request) -> JSONResponse:
    ready = request.app.state.dataplane.repository is not None
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)
