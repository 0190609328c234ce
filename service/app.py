"""Application wiring: settings, model repository (loaded at start-up), routes, errors, metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

import anyio
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from service import errors, metrics, routes
from service.auth import require_api_key
from service.batching import MicroBatcher
from service.reload import serve, watch_repository
from service.repository import ModelLoadError, load_repository, repository_fingerprint
from service.runtime import predict
from service.settings import Settings

log = logging.getLogger("dbf.app")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    _configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before loading: a change made while the models load is then seen, and reloaded, by the watcher.
        seen = repository_fingerprint(settings.model_dir) if settings.reload_poll_seconds > 0 else ()
        try:
            serve(app, load_repository(settings))
        except ModelLoadError as error:
            # Like Triton on a load error: log the file at fault and refuse to start (uvicorn exits non-zero).
            log.error("model repository failed to load: %s", error)
            raise SystemExit(1) from None
        async with anyio.create_task_group() as tasks:
            if settings.reload_poll_seconds > 0:
                tasks.start_soon(watch_repository, app, settings.reload_poll_seconds, seen)
            yield
            tasks.cancel_scope.cancel()

    app = FastAPI(title="dbf-serve", version=_version(), lifespan=lifespan)
    app.state.settings = settings
    app.state.repository = None
    app.state.load_error = "models are loading"
    app.state.inference_limiter = anyio.CapacityLimiter(settings.inference_threads)
    app.state.in_flight = 0
    app.state.reload_lock = anyio.Lock()
    app.state.batcher = (
        MicroBatcher(
            predict,
            app.state.inference_limiter,
            max_samples=settings.batch_max_samples,
            max_delay=settings.batch_max_delay_ms / 1000,
        )
        if settings.batching
        else None
    )
    errors.install(app)
    # Predict first: routes are matched in order, and it is the one that carries the load. Without an API
    # key there is nothing to check, so no dependency to solve on every request.
    guard = [Depends(require_api_key)] if settings.api_key is not None else []
    for router in routes.PROTECTED:
        app.include_router(router, dependencies=guard)
    app.include_router(routes.probes)
    app.include_router(routes.open_inference_probes)
    metrics.BUILD.labels(_version()).set(1)
    app.openapi = lambda: _openapi(app)
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema plus the predict body's, with a working example for the default model."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    example: dict[str, Any] = {"samples": [{"views": {}}], "method": "dbf", "lambda": 1.0}
    repository = app.state.repository
    if repository is not None:
        views = repository.get().manifest.views
        example["samples"][0]["views"] = {view.name: [0.0] * view.dim for view in views}
    schema.setdefault("components", {}).setdefault("schemas", {})["PredictRequest"] = {
        "type": "object",
        "required": ["samples"],
        "properties": {
            "samples": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["views"],
                    "properties": {
                        "views": {
                            "type": "object",
                            "minProperties": 1,
                            "additionalProperties": {"type": "array", "items": {"type": "number"}},
                            "description": "raw features per view name, as the training data stores them",
                        }
                    },
                },
            },
            "method": {"type": "string", "enum": ["bcf", "cbf", "baf", "gbaf", "dbf"]},
            "lambda": {"type": "number", "exclusiveMinimum": 0},
        },
        "example": example,
    }
    app.openapi_schema = schema
    return schema


def _configure_logging(level: str) -> None:
    """The service's own loggers (``dbf.*``) beside uvicorn's, in the same style."""
    logger = logging.getLogger("dbf")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())


def _version() -> str:
    try:
        return metadata.version("dbf-serve")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def app_from_environment() -> FastAPI:
    """uvicorn's factory: settings from ``DBF_*`` variables (so every worker process builds the same app)."""
    return create_app(Settings())
