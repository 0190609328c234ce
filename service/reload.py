"""Hot reload: the model repository verified and loaded afresh, then swapped in atomically; a model that
fails its checks never replaces one being served. By ``POST /v1/admin/reload`` or by watching the model
directory (``DBF_RELOAD_POLL_SECONDS``)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

from fusion import METHODS
from service import errors, metrics
from service.repository import ModelLoadError, Repository, load_repository, repository_fingerprint
from service.settings import Settings

if TYPE_CHECKING:
    from service.dataplane import DataPlane

log = logging.getLogger("dbf.reload")

T = TypeVar("T")


def serve(plane: DataPlane, repository: Repository) -> None:
    """Make ``repository`` the one requests use, in one assignment: a request already running keeps the
    model it started with, every later one gets the new. Metric series follow the new models."""
    loaded = repository.models.values()
    metrics.describe_models(
        (model.name, view, provider) for model in loaded for view, provider in model.providers.items()
    )
    metrics.describe_placements(
        (model.name, provider, samples) for model in loaded for provider, samples in model.placement.sizes()
    )
    metrics.describe_flag_clean_rates(
        {m.name: m.manifest.conflict_flag.target_false_positive_rate for m in loaded}
    )
    metrics.describe_view_agreement(
        {
            (m.name, view): (rates.clean_low, rates.chance)
            for m in loaded
            for view, rates in (m.manifest.view_agreement or {}).items()
        }
    )
    metrics.initialise(
        {m.name: [v.name for v in m.manifest.views] for m in loaded},
        METHODS,
        errors.REASONS,
        agreeing={m.name: list(m.manifest.view_agreement) for m in loaded if m.manifest.view_agreement},
    )
    plane.repository = repository
    # The application and its models live on: keep them out of the garbage collector's full passes, which
    # otherwise walk every object at each one (a stalled event loop: the p99 latency under load).
    # Frozen objects are still freed by reference counting when a reload drops them, but never by the
    # collector: the calls in flight at the last freeze, whose objects make reference cycles once they end
    # (a gRPC call's context and state), are unfrozen to be collected now (else each reload under load kept
    # a few calls' for good).
    gc.unfreeze()
    _free_memory()
    gc.freeze()


def _free_memory() -> None:
    """Collect what a load left behind (the models it replaced, or a refused load's, which its error's
    traceback may hold in a reference cycle) and hand the memory back to the system: glibc's malloc keeps
    freed memory for reuse, but a load's many small blocks, interleaved with others that live on, seldom
    come free as a whole, and without the trim each reload of a large repository added to the resident
    memory (sessions really were freed: the arena settings of onnxruntime change nothing)."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None where the C library has none (musl, macOS): nothing to trim there."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


async def reload_repository(plane: DataPlane) -> Repository:
    """Verify and load the model directory afresh, then swap it in; on any error, or past
    ``DBF_RELOAD_TIMEOUT_SECONDS``, the models being served stay (:class:`ReloadFailed` says why). One
    reload at a time."""
    settings = plane.settings
    try:
        with anyio.move_on_after(settings.reload_timeout_seconds) as deadline:
            async with plane.reload_lock:
                repository = await plane.loads.load(settings)
                serve(plane, repository)
        if deadline.cancelled_caught:
            raise LoadNotDone(
                f"not done within {settings.reload_timeout_seconds:g} s (DBF_RELOAD_TIMEOUT_SECONDS): a file "
                "that blocks on read (a hung network mount?), or a reload queued behind such a one"
            )
    except ModelLoadError as error:
        refusal = f"reload refused, still serving the previous models: {error}"
        not_done = isinstance(error, LoadNotDone)
    else:
        metrics.RELOADS.labels("success").inc()
        log.info("reloaded models %s from %s", sorted(repository.models), settings.model_dir)
        return repository
    _free_memory()  # out of the except clause: the error, and the sessions its traceback holds, are gone
    metrics.RELOADS.labels("failure").inc()
    log.error("%s", refusal)
    raise ReloadNotDone(refusal) if not_done else errors.ReloadFailed(refusal)


class LoadNotDone(ModelLoadError):
    """The load did not end in time, or could not start beside one that did not: no fault of the files."""


class ReloadNotDone(errors.ReloadFailed):
    """A reload refused for :class:`LoadNotDone`: the same files may load once the load can end."""


class ModelLoads:
    """The loads of the model repository for reloads: each in a daemon thread of its own
    (:func:`in_daemon_thread`), one at a time. A load given up (its reload past its time, or cut by the
    shutdown) is told to stop, and does at its next file or session; one stuck in the kernel meanwhile (a
    read from a hung network mount) keeps its place, and no other load starts beside it."""

    def __init__(self) -> None:
        self._running = threading.Lock()  # held by the thread loading

    async def load(self, settings: Settings) -> Repository:
        stop = threading.Event()

        def load() -> Repository:
            if not self._running.acquire(blocking=False):
                raise LoadNotDone(
                    "an earlier load, given up, is still running (stuck reading a file?); no other starts "
                    "until it ends"
                )
            try:
                return load_repository(settings, stop)
            except ModelLoadError as error:
                refusal = str(error)
            except Exception as error:
                # A fault no check names (a symlink loop met by Path.resolve, a head's output no check
                # foresaw): still a refused reload, the models being served stay. Let through, it answered
                # 500, counted no failure, and stopped the watcher for good (its task group ended).
                log.exception("loading the model repository %s failed", settings.model_dir)
                refusal = (
                    f"{settings.model_dir}: the load failed ({type(error).__name__}: {error}); the traceback "
                    "is in the service log"
                )
            finally:
                self._running.release()
            # Raised afresh, out of the except clauses: the error caught holds, through its traceback (and
            # its cause's), the load's frames, every head's bytes and the sessions built; handed to the
            # waiting future it made a reference cycle, which kept them past the trim after the refusal.
            raise ModelLoadError(refusal)

        try:
            return await in_daemon_thread(load)
        finally:
            stop.set()  # nobody waits for it any more (if it is still running)

    async def wait_stopped(self, within: float) -> None:
        """Wait up to ``within`` seconds for a load given up to end. One still inside onnxruntime when the
        interpreter exits aborts the process (onnxruntime's static objects are destroyed under it); one
        stuck in the kernel is left there."""
        with anyio.move_on_after(within):
            while self._running.locked():
                await anyio.sleep(0.01)


async def in_daemon_thread(function: Callable[[], T]) -> T:
    """``function()`` in a daemon thread of its own. Cancelled (a timeout, the end of a graceful shutdown),
    the wait ends at once and the thread is left to finish alone: anyio's worker threads would hold the
    cancelled task until the call returns, and the interpreter's exit too, for ever if it is stuck in the
    kernel (a read from a hung network mount)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            outcome = function(), None
        except BaseException as error:  # handed to the waiting task, as a worker thread would
            outcome = None, error
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, *outcome)

    threading.Thread(target=run, name="dbf-repository", daemon=True).start()
    return await done


def _settle(done: asyncio.Future, result: object, error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


async def watch_repository(plane: DataPlane, every: float, seen: tuple) -> None:
    """Reload when a file of the model directory changes from ``seen``, its fingerprint when the models
    being served were loaded (each worker process watches for itself). A reload refused for time
    (:class:`ReloadNotDone`) is tried again, 1, 2, 4... polls later (at most :data:`RETRY_MAX_SECONDS`
    apart): a change refused so was never loaded once the load could end (a hung network mount come back),
    and a retry at every poll kept a repository too large for its time limit loading for ever."""
    model_dir = plane.settings.model_dir
    retry_in, retry_at = every, None
    while True:
        await anyio.sleep(every)
        now = await in_daemon_thread(lambda: repository_fingerprint(model_dir))
        due = retry_at is not None and anyio.current_time() >= retry_at
        if now != seen or due:
            retry_in = retry_in if now == seen else every
            seen, retry_at = now, None
            try:
                await reload_repository(plane)
            except ReloadNotDone:
                retry_at = anyio.current_time() + retry_in
                retry_in = min(2 * retry_in, max(every, RETRY_MAX_SECONDS))
            except errors.ReloadFailed:  # logged and counted; the old models serve on
                pass


RETRY_MAX_SECONDS = 300.0
"""The longest the watcher waits to try again a reload refused for time."""
