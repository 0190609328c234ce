"""Server-side micro-batching: concurrent requests for the same model, fusion and coverage run as one batch.

Like Triton's dynamic batcher: requests wait in a queue (bounded by the service's in-flight limit), and a
batch closes when it holds ``max_samples`` samples or its first request has waited ``max_delay`` seconds.
A batch takes one of the ``limiter``'s slots (an inference thread) while it runs; while all are taken, the
queue keeps filling, so batches grow with the load and an idle service adds no delay (``max_delay`` 0: a
batch is whatever has arrived by the time a slot is free). A request may ask its batch to wait longer
(``delay``): a front end whose concurrent requests reach the core one at a time, as gRPC's do (each call
is accepted, then its message received, one completion after another), would otherwise batch none of them.
Where a batch runs, on a thread or on the event loop, is ``run``'s choice
(:meth:`service.dataplane.DataPlane.predict`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from service.inference import InferenceRequest, Result
from service.repository import LoadedModel


@dataclass
class _Waiting:
    model: LoadedModel
    request: InferenceRequest
    future: asyncio.Future[Result]
    delay: float


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

    async def submit(self, model: LoadedModel, request: InferenceRequest, delay: float = 0.0) -> Result:
        future = asyncio.get_running_loop().create_future()
        key = (model.name, id(model), request.method, request.lam, request.coverage)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = []
            task = asyncio.create_task(self._drain(key, queue))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        queue.append(_Waiting(model, request, future, delay))
        return await future

    async def _drain(self, key: tuple, queue: list[_Waiting]) -> None:
        """Close batches from ``queue`` until it is empty, then retire it."""
        try:
            while queue:
                delay = max(self.max_delay, max(w.delay for w in queue))
                if delay > 0 and sum(len(w.request) for w in queue) < self.max_samples:
                    await asyncio.sleep(delay)
                token = object()  # the batch's own token: _run releases it from another task
                await self.limiter.acquire_on_behalf_of(token)  # a free slot; meanwhile requests arrive
                taken, size = [], 0
                while queue and (not taken or size + len(queue[0].request) <= self.max_samples):
                    waiting = queue.pop(0)
                    taken.append(waiting)
                    size += len(waiting.request)
                task = asyncio.create_task(self._run(taken, token))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                await asyncio.sleep(0)  # let the batch start before closing the next one
        finally:
            del self._queues[key]

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


def _settle(future: asyncio.Future, *, result: Result | None = None, error: BaseException | None = None):
    if future.done():  # its request was cancelled (the client went away)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
