"""HTTP routes, thin: they find the model, hand the body to :mod:`service.runtime` off the event loop, and
return its result. Errors are raised as domain errors (:mod:`service.errors`)."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service import metrics
from service.errors import ModelNotFound, NotReady, PayloadTooLarge, UnsupportedMediaType
from service.repository import LoadedModel, Repository
from service.runtime import parse, predict

probes = APIRouter(tags=["probes"])
models = APIRouter(prefix="/v1/models", tags=["models"])
inference = APIRouter(tags=["inference"])

PREDICT_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {"$ref": "#/components/schemas/PredictRequest"},
        }
    },
}


@probes.get("/health")
def health() -> dict[str, str]:
    """Liveness: the process answers (inference runs off the event loop, so this stays fast under load)."""
    return {"status": "ok"}


@probes.get("/ready", responses={503: {"description": "models not loaded or failed verification"}})
def ready(request: Request) -> JSONResponse:
    """Readiness: 200 once every model is loaded and verified, else 503 with the reason."""
    repository: Repository | None = request.app.state.repository
    if repository is None:
        return JSONResponse({"status": "not ready", "reason": request.app.state.load_error}, status_code=503)
    return JSONResponse({"status": "ready", "models": sorted(repository.models)})


@probes.get("/metrics", response_class=Response)
def prometheus_metrics() -> Response:
    """Prometheus exposition format."""
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@models.get("")
def list_models(request: Request) -> dict[str, Any]:
    """Every model's manifest, with the execution provider running each view."""
    repository = _repository(request)
    return {"default": repository.default, "models": [_describe(m) for m in repository.models.values()]}


@models.get("/{name}", responses={404: {"description": "unknown model"}})
def get_model(name: str, request: Request) -> dict[str, Any]:
    return _describe(_model(request, name))


@inference.post("/predict", openapi_extra={"requestBody": PREDICT_BODY})
async def predict_default(request: Request) -> JSONResponse:
    """Fuse the views of each sample with the default model; see ``/v1/models/{name}/predict``."""
    return await _predict(request, None)


@inference.post("/v1/models/{name}/predict", openapi_extra={"requestBody": PREDICT_BODY})
async def predict_named(name: str, request: Request) -> JSONResponse:
    """Per sample: the fused prediction, its uncertainty, the conflict matrix between views, each view's
    discount, the calibrated ``high_conflict`` flag and the view most to blame when flagged."""
    return await _predict(request, name)


async def _predict(request: Request, name: str | None) -> Response:
    model = _model(request, name)
    settings = request.app.state.settings
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise UnsupportedMediaType(
            f"send the body as application/json, not {content_type or 'no content type'!r}"
        )
    body = await _read_body(request, settings.max_body_bytes)

    def work() -> bytes:
        # Parsing, heads, fusion and rendering all here, off the event loop; latency covers all of them.
        started = time.perf_counter()
        try:
            result = predict(model, parse(body, model, max_samples=settings.max_samples))
            return json.dumps(result, allow_nan=False, separators=(",", ":")).encode()
        finally:
            metrics.REQUEST_SECONDS.labels(model.name).observe(time.perf_counter() - started)

    content = await anyio.to_thread.run_sync(work, limiter=request.app.state.inference_limiter)
    return Response(content, media_type="application/json")


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` (before anything is parsed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"body of {int(declared)} bytes; at most {limit} are accepted (DBF_MAX_BODY_BYTES)"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"body over {limit} bytes; at most {limit} are accepted (DBF_MAX_BODY_BYTES)"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _repository(request: Request) -> Repository:
    repository = request.app.state.repository
    if repository is None:
        raise NotReady(f"models are not loaded: {request.app.state.load_error}")
    return repository


def _model(request: Request, name: str | None) -> LoadedModel:
    repository = _repository(request)
    model = repository.get(name)
    if model is None:
        raise ModelNotFound(f"no model named {name!r}; available: {sorted(repository.models)}")
    return model


def _describe(model: LoadedModel) -> dict[str, Any]:
    return {**model.manifest.model_dump(mode="json", by_alias=True), "providers": model.providers}
