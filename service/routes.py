"""HTTP routes, thin: they find the model, hand the body to :mod:`service.runtime` off the event loop, and
return its result. Errors are raised as domain errors (:mod:`service.errors`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service import metrics, v2
from service.errors import ModelNotFound, NotReady, Overloaded, PayloadTooLarge, UnsupportedMediaType
from service.parsing import Batch, parse
from service.reload import reload_repository
from service.repository import LoadedModel, Repository
from service.runtime import Result, predict, render

# Open to all: liveness, readiness and metrics (the Open Inference Protocol's too).
probes = APIRouter(tags=["probes"])
open_inference_probes = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"])
# Behind DBF_API_KEY when the service has one (service.app attaches service.auth.require_api_key to these).
inference = APIRouter(tags=["inference"])
open_inference = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"])
models = APIRouter(prefix="/v1/models", tags=["models"])
admin = APIRouter(prefix="/v1/admin", tags=["admin"])
PROTECTED = (inference, open_inference, models, admin)

# Bodies up to this size are parsed and answers rendered on the event loop (tens of microseconds); larger
# ones in a worker thread, so that one big request never stalls the others or /health.
INLINE_BYTES = 64 * 1024

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
    async with admitted(request):
        model = _model(request, name)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise UnsupportedMediaType(
                f"send the body as application/json, not {content_type or 'no content type'!r}"
            )
        settings = request.app.state.settings
        body = await _read_body(request, settings.max_body_bytes)
        started = time.perf_counter()
        try:
            content = await infer(
                request,
                model,
                lambda: parse(body, model, max_samples=settings.max_samples),
                lambda result: render(model, result),
                inline=len(body) <= INLINE_BYTES,
            )
        finally:
            metrics.REQUEST_SECONDS.labels(model.name).observe(time.perf_counter() - started)
        return Response(content, media_type="application/json")


@asynccontextmanager
async def admitted(request: Request) -> AsyncIterator[None]:
    """Count the request in flight, or shed it at once with 503 + Retry-After when too many are."""
    state, settings = request.app.state, request.app.state.settings
    if state.in_flight >= settings.max_in_flight:
        raise Overloaded(
            f"{state.in_flight} requests in flight, the most this service takes (DBF_MAX_IN_FLIGHT); "
            "retry later",
            headers={"Retry-After": str(settings.retry_after_seconds)},
        )
    state.in_flight += 1  # one event loop: no lock needed
    try:
        yield
    finally:
        state.in_flight -= 1


async def infer(
    request: Request,
    model: LoadedModel,
    decode: Callable[[], Batch],
    encode: Callable[[Result], bytes],
    *,
    inline: bool,
) -> bytes:
    """decode -> predict (micro-batched, or alone) -> encode, with nothing heavy on the event loop."""
    state = request.app.state
    limiter = state.inference_limiter
    if state.batcher is None or not inline:  # a big request is a batch already: one thread hop for it all

        def work() -> bytes:
            batch = decode()
            metrics.BATCH_SIZE.labels(model.name).observe(len(batch))
            return encode(predict(model, batch))

        return await anyio.to_thread.run_sync(work, limiter=limiter)
    # A small request: decoded and encoded here (tens of microseconds), its samples fused with others'.
    batch = decode()
    metrics.BATCH_SIZE.labels(model.name).observe(len(batch))
    return encode(await state.batcher.submit(model, batch))


@admin.post("/reload", responses={409: {"description": "the new models failed; the old ones still serve"}})
async def reload(request: Request) -> dict[str, Any]:
    """Verify and load the model directory afresh and swap it in atomically; a model that fails its checks
    never replaces a good one (409, naming the file). With several worker processes, each must reload:
    use DBF_RELOAD_POLL_SECONDS there."""
    repository = await reload_repository(request.app)
    return {"status": "reloaded", "models": sorted(repository.models), "default": repository.default}


@open_inference_probes.get("")
def v2_server(request: Request) -> dict[str, Any]:
    """Server metadata (Open Inference Protocol)."""
    return {"name": "dbf-serve", "version": request.app.version, "extensions": ["binary_tensor_data"]}


@open_inference_probes.get("/health/live")
def v2_live() -> dict[str, bool]:
    return {"live": True}


@open_inference_probes.get("/health/ready", responses={503: {"description": "models not loaded"}})
def v2_ready(request: Request) -> JSONResponse:
    ready = request.app.state.repository is not None
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


@open_inference.get("/models/{name}", responses={404: {}})
def v2_model(name: str, request: Request) -> dict[str, Any]:
    """The input tensors (one FP32 [N, dim] per view) and output tensors of a model."""
    return v2.metadata(_model(request, name))


@open_inference.get("/models/{name}/ready", responses={404: {}})
def v2_model_ready(name: str, request: Request) -> dict[str, Any]:
    return {"name": _model(request, name).name, "ready": True}


@open_inference.post(
    "/models/{name}/infer",
    responses={400: {}, 404: {}, 413: {}, 503: {}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
)
async def v2_infer(name: str, request: Request) -> Response:
    """Inference with tensors: JSON, or the binary tensor data extension (see :mod:`service.v2`)."""
    async with admitted(request):
        model = _model(request, name)
        settings = request.app.state.settings
        body = await _read_body(request, settings.max_body_bytes)
        header_length = request.headers.get(v2.HEADER_LENGTH)
        started = time.perf_counter()
        decoded: list[v2.Decoded] = []
        answer_headers: dict[str, str] = {}

        def decode() -> Batch:
            decoded.append(v2.decode(body, header_length, model, max_samples=settings.max_samples))
            return decoded[0].batch

        def encode(result: Result) -> bytes:
            content, headers = v2.encode(model, decoded[0], result)
            answer_headers.update(headers)
            return content

        try:
            content = await infer(request, model, decode, encode, inline=len(body) <= INLINE_BYTES)
        finally:
            metrics.REQUEST_SECONDS.labels(model.name).observe(time.perf_counter() - started)
        media_type = answer_headers.pop("content-type")
        return Response(content, media_type=media_type, headers=answer_headers)


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
