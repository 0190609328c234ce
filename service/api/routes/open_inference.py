"""The Open Inference Protocol's model routes (KServe v2, as Triton serves them), each with and without a
model version: metadata, readiness and inference (:mod:`service.v2` is the codec). Server-level routes
(``/v2``, ``/v2/health/*``) are probes, open to all (:mod:`service.api.routes.probes`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from service import v2
from service.api.direct import DirectRoute
from service.api.openapi import documented, ok, ref
from service.api.routes.inference import serve
from service.auth import ProtectedRoute
from service.dataplane import DataPlane

TAGS = ["open inference protocol (v2)"]
router = APIRouter(prefix="/v2/models/{name}", tags=TAGS, route_class=ProtectedRoute)
# Inference itself, served directly (DirectRoute), like v1's predict.
inference = APIRouter(prefix="/v2/models/{name}", tags=TAGS, route_class=DirectRoute)

INFER = {
    "openapi_extra": {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": ref("InferRequest")},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
    "response_class": Response,
    **documented(
        {
            "description": "the output tensors; binary ones after the JSON header, whose length is in "
            "Inference-Header-Content-Length",
            "content": {
                "application/json": {"schema": ref("InferResponse")},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        400,
        404,
        408,
        413,
        415,
        503,
        v2=True,
    ),
}
METADATA = documented(ok("ModelMetadata"), 404, 503, v2=True)
# Triton's statistics of every model (what tritonclient's get_inference_statistics() asks for) share the
# metadata route's path: unless a model has this name, the path is that extension, not a missing model.
STATISTICS = "stats"
READY = documented(ok("ModelReadiness"), 404, 503, v2=True)


@router.get("", **METADATA)
def model_metadata(name: str, request: Request) -> dict[str, Any]:
    """The input tensors (one FP32 [N, dim] per view) and output tensors of a model."""
    plane = _plane(request)
    if name == STATISTICS and plane.ready().get(name) is None:
        raise HTTPException(status_code=404)  # answered as a path not served, saying what is
    return v2.metadata(plane.model(name).signature)


@router.get("/versions/{version}", **METADATA)
def model_version_metadata(name: str, version: str, request: Request) -> dict[str, Any]:
    return v2.metadata(_plane(request).model(name, version).signature)


@router.get("/ready", **READY)
def model_ready(name: str, request: Request) -> dict[str, Any]:
    return {"name": _plane(request).model(name).name, "ready": True}


@router.get("/versions/{version}/ready", **READY)
def model_version_ready(name: str, version: str, request: Request) -> dict[str, Any]:
    return {"name": _plane(request).model(name, version).name, "ready": True}


@inference.post("/infer", **INFER)
async def infer(name: str, request: Request) -> Response:
    """Inference with tensors: JSON, or the binary tensor data extension (see :mod:`service.v2`)."""
    return await serve(request, v2, name)


@inference.post("/versions/{version}/infer", **INFER)
async def infer_version(name: str, version: str, request: Request) -> Response:
    return await serve(request, v2, name, version)


def _plane(request: Request) -> DataPlane:
    return request.app.state.dataplane
