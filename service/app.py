"""Application wiring: settings, the data plane and its models (loaded at start-up), routes, errors and the
OpenAPI schema."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

import anyio
from fastapi import Depends, FastAPI

from service import grpc_server, metrics
from service.api import errors, openapi
from service.api.routes import OPEN, PROTECTED
from service.auth import require_api_key
from service.dataplane import DataPlane
from service.reload import serve, watch_repository
from service.repository import ModelLoadError, load_repository, repository_fingerprint
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
            _load(plane, settings)
            front_end = await _start_grpc(plane, settings) if settings.grpc_port else None
        except SystemExit:
            app.state.start_refused = True  # its reason logged: the server adds no traceback (service.server)
            raise
        if front_end is not None:
            front_end.stop_on_signals(settings.graceful_shutdown_seconds)
        async with anyio.create_task_group() as tasks:
            if settings.reload_poll_seconds > 0:
                tasks.start_soon(watch_repository, plane, settings.reload_poll_seconds, seen)
            yield
            tasks.cancel_scope.cancel()
        if front_end is not None:  # begun by the signal already, where one stopped the server
            await front_end.stop(settings.graceful_shutdown_seconds)
        await plane.loads.wait_stopped(within=1.0)  # a reload cut by the shutdown: its load stops

    # No slash redirects: a redirect would be built from the client's Host header, and no route needs one.
    # The documentation is served by service.api.routes.docs, behind the API key when there is one.
    app = FastAPI(
        title="dbf-serve",
        version=_version(),
        lifespan=lifespan,
        redirect_slashes=False,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.dataplane = plane = DataPlane(settings)
    app.state.exposition = metrics.Exposition(min_interval=metrics.RENDER_INTERVAL)
    errors.install(app)
    # Without an API key there is nothing to check, so no dependency to solve on every request.
    guard = [Depends(require_api_key)] if settings.api_key is not None else []
    for router in PROTECTED:
        app.include_router(router, dependencies=guard)
    for router in OPEN:
        app.include_router(router)
    metrics.BUILD.labels(_version()).set(1)
    app.openapi = lambda: _openapi(app)
    return app


def _load(plane: DataPlane, settings: Settings) -> None:
    """The models served, or exit 1 naming the file at fault (as Triton refuses to start on a load error)."""
    try:
        serve(plane, load_repository(settings))
    except ModelLoadError as error:
        log.error("model repository failed to load: %s", error)
        raise SystemExit(1) from None


async def _start_grpc(plane: DataPlane, settings: Settings) -> grpc_server.GrpcFrontEnd:
    """The gRPC front end on ``DBF_GRPC_PORT``, or exit 1 (as for a load error) if it cannot bind."""
    try:
        return await grpc_server.start(plane, settings, _version())
    except RuntimeError as error:
        log.error(
            "cannot serve gRPC on %s port %d (DBF_HOST, DBF_GRPC_PORT; 0 turns it off): %s",
            settings.host,
            settings.grpc_port,
            error,
        )
        raise SystemExit(1) from None


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The schema (:mod:`service.api.openapi`), with a working predict example for the default model."""
    if app.openapi_schema:
        return app.openapi_schema
    example = None
    repository = app.state.dataplane.repository
    default = None if repository is None else repository.get()
    if default is not None:  # (with several models and none the default, requests name theirs)
        example = {"samples": [{"views": {view.name: [0.0] * view.dim for view in default.signature.views}}]}
    app.openapi_schema = openapi.build(app, example)
    return app.openapi_schema


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
