"""Server-side micro-batching: concurrent requests for the same model, fusion and coverage run as one batch.

Like Triton's dynamic batcher: requests wait in a queue (bounded by the service's in-flight limit), and a
batch closes when it holds ``max_samples`` samples or its first request has waited ``max_delay`` seconds.
A batch takes one of the ``limiter``'s slots (an inference thread) while it runs; while all are taken, the
queue keeps filling, so batches grow with the load and an idle service adds no delay (``max_delay`` 0: a
batch is whatever has arrived by the time a slot is free). A request may ask its batch to wait longer
(:class:`BatchWait`): a front end whose concurrent requests reach the core one at a time, as gRPC's do (each
call is accepted, then its message received, one completion after another, milliseconds apart under load),
would otherwise batch few of them. Such a wait is taken in steps, again while the last step brought more
requests: a lone request waits one step, a stream of them fills the batch, up to the wait's longest; a
batch as large as the largest of the last second or two waits no more (its callers are all in).
Where a batch runs, on a thread or on the event loop, is ``run``'s choice
(:meth:`service.dataplane.DataPlane.predict`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from service import metrics
from service.inference import InferenceRequest, Result
from service.repository import LoadedModel


@dataclass(frozen=True)
class BatchWait:
    """How long a batch holding a request waits for more: ``step`` seconds, and again while the last step
    brought more requests and the batch holds fewer than the largest batch of the last second or two,
    ``longest`` seconds in all at most (one step at least). A batch holding requests that ask for
    different waits takes the longest step and the longest in all."""

    step: float = 0.0
    longest: float = 0.0


@dataclass
class _Waiting:
    model: LoadedModel
    request: InferenceRequest
    future: asyncio.Future[Result]
    wait: BatchWait


@dataclass
class MicroBatcher:
    """``await batcher.submit(model, request)`` gives the same :class:`Result` as
    ``await run(model, request)``."""

    run: Callable[[LoadedModel, InferenceRequest], Awaitable[Result]]
    limiter: anyio.CapacityLimiter
    max_samples: int
    max_delay: float = 0.0
    _queues: dict[tuple, list[_Waiting]] = field(default_factory=dict)
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _recent: _RecentLargest = field(init=False)  # the batch sizes a wait aims at

    def __post_init__(self) -> None:
        self._recent = _RecentLargest()

    async def submit(
        self, model: LoadedModel, request: InferenceRequest, wait: BatchWait | None = None
    ) -> Result:
        future = asyncio.get_running_loop().create_future()
        key = (model.name, id(model), request.method, request.lam, request.coverage)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = []
            task = asyncio.create_task(self._drain(key, queue))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        queue.append(_Waiting(model, request, future, wait or _NO_WAIT))
        return await future

    async def _drain(self, key: tuple, queue: list[_Waiting]) -> None:
        """Close batches from ``queue`` until it is empty, then retire it."""
        try:
            while queue:
                await self._gather(queue)
                token = object()  # the batch's own token: _run releases it from another task
                await self.limiter.acquire_on_behalf_of(token)  # a free slot; meanwhile requests arrive
                taken, size = [], 0
                while queue and (not taken or size + len(queue[0].request) <= self.max_samples):
                    waiting = queue.pop(0)
                    taken.append(waiting)
                    size += len(waiting.request)
                self._recent.add(len(taken), time.monotonic())
                metrics.MICRO_BATCH.labels(taken[0].model.name).observe(len(taken))
                task = asyncio.create_task(self._run(taken, token))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                await asyncio.sleep(0)  # let the batch start before closing the next one
        finally:
            del self._queues[key]

    async def _gather(self, queue: list[_Waiting]) -> None:
        """Wait for more requests as the queue's ask (:class:`BatchWait`), while the batch has room. Under
        load, calls keep coming while the batch waits, and the batch grows to what the load brings; where a
        few callers wait on each other's answers, all are in once it holds as many as batches lately held,
        and waiting one more step would only leave the event loop idle."""
        waited, seen = 0.0, 0
        while len(queue) > seen and sum(len(w.request) for w in queue) < self.max_samples:
            step = max(self.max_delay, max(w.wait.step for w in queue))
            if step <= 0 or (
                waited
                and (
                    waited + step > max(w.wait.longest for w in queue) * (1 + 1e-9)
                    or 0 < self._recent.largest(time.monotonic()) <= len(queue)
                )
            ):
                return
            seen = len(queue)
            await _sleep(step)
            waited += step

    async def _run(self, taken: list[_Waiting], token: object) -> None:
        try:
            requests = [w.request for w in taken]
            model = taken[0].model
            try:
                result = await self.run(model, InferenceRequest.concat(requests))
            except Exception as error:
                if len(taken) == 1:
                    _settle(taken[0].future, error=error)
                    return
                # One request's samples spoilt the batch (features that overflow a head, say): run each
                # request alone so the error reaches its sender only.
                for waiting in taken:
                    try:
                        one = await self.run(model, waiting.request)
                    except Exception as own:
                        _settle(waiting.future, error=own)
                    else:
                        _settle(waiting.future, result=one)
                return
            start = 0
            for waiting in taken:
                stop = start + len(waiting.request)
                _settle(waiting.future, result=result.rows(start, stop))
                start = stop
        finally:
            self.limiter.release_on_behalf_of(token)


_NO_WAIT = BatchWait()
_sleep = asyncio.sleep  # a batch's wait (the tests' script of arrivals stands in for it)


class _RecentLargest:
    """The most requests a batch held within the last one to two ``window`` seconds (two windows kept)."""

    def __init__(self, window: float = 1.0) -> None:
        self.window, self.started, self.current, self.previous = window, 0.0, 0, 0

    def add(self, size: int, now: float) -> None:
        self._roll(now)
        self.current = max(self.current, size)

    def largest(self, now: float) -> int:
        self._roll(now)
        return max(self.current, self.previous)

    def _roll(self, now: float) -> None:
        if now - self.started >= self.window:
            self.previous = self.current if now - self.started < 2 * self.window else 0
            self.current, self.started = 0, now


def _settle(future: asyncio.Future, *, result: Result | None = None, error: BaseException | None = None):
    if future.done():  # its request was cancelled (the client went away)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
