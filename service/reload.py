"""Hot reload: the model repository verified and loaded afresh, then swapped in atomically; a model that
fails its checks never replaces one being served. By ``POST /v1/admin/reload`` or by watching the model
directory (``DBF_RELOAD_POLL_SECONDS``)."""

from __future__ import annotations

import contextlib
import gc
import logging

import anyio
from fastapi import FastAPI

from fusion import METHODS
from service import errors, metrics
from service.repository import ModelLoadError, Repository, load_repository, repository_fingerprint

log = logging.getLogger("dbf.reload")


def serve(app: FastAPI, repository: Repository) -> None:
    """Make ``repository`` the one requests use, in one assignment: a request already running keeps the
    model it started with, every later one gets the new. Metric series follow the new models."""
    loaded = repository.models.values()
    metrics.describe_models(
        (model.name, view, provider) for model in loaded for view, provider in model.providers.items()
    )
    metrics.initialise(
        {m.name: [v.name for v in m.manifest.views] for m in loaded},
        METHODS,
        errors.REASONS,
        {m.name: m.manifest.conflict_flag.target_false_positive_rate for m in loaded},
    )
    app.state.dataplane.repository = repository
    # The application and its models live on: keep them out of the garbage collector's full passes, which
    # otherwise walk every object at each one (tens of ms of stalled event loop: the p99 latency under load).
    # Frozen objects are still freed by reference counting when a reload drops them.
    gc.collect()
    gc.freeze()


async def reload_repository(app: FastAPI) -> Repository:
    """Verify and load the model directory afresh, then swap it in; on any error the models being served
    stay (:class:`ReloadFailed` names the file). One reload at a time."""
    async with app.state.reload_lock:
        try:
            repository = await anyio.to_thread.run_sync(load_repository, app.state.settings)
        except ModelLoadError as error:
            metrics.RELOADS.labels("failure").inc()
            log.error("reload refused, still serving the previous models: %s", error)
            raise errors.ReloadFailed(f"reload refused, still serving the previous models: {error}") from None
        serve(app, repository)
        metrics.RELOADS.labels("success").inc()
        log.info("reloaded models %s from %s", sorted(repository.models), app.state.settings.model_dir)
        return repository


async def watch_repository(app: FastAPI, every: float, seen: tuple) -> None:
    """Reload when a file of the model directory changes from ``seen``, its fingerprint when the models
    being served were loaded (each worker process watches for itself)."""
    while True:
        await anyio.sleep(every)
        now = await anyio.to_thread.run_sync(repository_fingerprint, app.state.settings.model_dir)
        if now != seen:
            seen = now
            with contextlib.suppress(errors.ReloadFailed):  # logged and counted; the old models serve on
                await reload_repository(app)
