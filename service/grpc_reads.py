"""How the gRPC server reads request messages: a few at a time, each within a deadline.

gRPC core opens a stream's flow-control window for the whole message as soon as a handler asks for it, and
a unary handler asks at once: every open call could hold a message up to the size limit, partly sent, with
nothing counting it (the body budget sees a message only once it is whole). Here every method's handler is
wrapped (:meth:`MessageReads.bounded`) so that it asks for its messages itself, one read slot each: a call
waiting for a slot has asked for nothing, and holds at most the stream's small initial window. Reads in
progress are ``DBF_BODY_MEMORY_BYTES`` over the message limit (at least one); calls waiting for a slot
beyond ``DBF_MAX_IN_FLIGHT`` are refused (UNAVAILABLE, as REST's overload), and a message not in within
``DBF_BODY_TIMEOUT_SECONDS`` (checked a few times a second) ends its call (DEADLINE_EXCEEDED, as REST's
408).

How much of a message has come is not known until all of it has, so a call that sends nothing holds its
slot as long as one that sends megabytes: 19 calls that never sent their messages (from one connection,
calling an open method such as health's) held every slot for the timeout, and every other call waited,
the kubelet's liveness probe (gRPC health) too, again as they came back. So while calls wait for a slot,
the reads that have taken longer than :data:`STALE_READ_SECONDS` give theirs up, longest first (their calls
UNAVAILABLE: retry later), as the HTTP side closes the stalest connection over its cap.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from service.errors import InvalidInput, Overloaded, RequestTimeout

STALE_READ_SECONDS = 1.0
"""A read in progress this long gives its slot up to a call waiting for one: a message of the largest size
takes a fraction of it on any network a client of this service is on, and a probe waits at most about that
long (the kubelet's gRPC probe allows 1 s by default)."""
# How often the reads in progress are looked at (deadlines, stale reads): a fraction of STALE_READ_SECONDS.
_SWEEP_SECONDS = STALE_READ_SECONDS / 4


class MessageReads:
    """Read slots for request messages, shared by every call of one gRPC server."""

    def __init__(self, *, slots: int, max_waiting: int, timeout: float, retry_after: int) -> None:
        self._slots = asyncio.Semaphore(max(1, slots))
        self.max_waiting, self.timeout, self.retry_after = max_waiting, timeout, retry_after
        self.waiting = 0
        # Reads in progress (oldest first) and their starts, checked by one sweeping task: a timer per read
        # (asyncio.timeout) cost one-sample calls 4% of their throughput. Reads cut, and why.
        self._reading: dict[asyncio.Task, float] = {}
        self._expired: dict[asyncio.Task, Exception] = {}
        self._sweeper: asyncio.Task | None = None

    async def read(self, context: grpc.aio.ServicerContext) -> Any:
        """The call's next message as gRPC hands it over (bytes without a deserializer), or
        ``grpc.aio.EOF`` once the client has sent its last."""
        if self._slots.locked():
            await self._wait_for_slot()
        else:
            await self._slots.acquire()  # free: returns at once
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        self._reading[task] = loop.time()
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        try:
            return await context.read()
        except asyncio.CancelledError:
            cut = self._expired.pop(task, None)
            if cut is None:  # the client went away, or the server stops
                raise
            task.uncancel()
            raise cut from None
        finally:
            del self._reading[task]
            self._slots.release()

    async def _sweep(self) -> None:
        """Cut the reads past their deadline, and stale ones while calls wait for a slot, a few times a
        second while any read is in progress."""
        loop = asyncio.get_running_loop()
        try:
            while self._reading:
                await asyncio.sleep(min(_SWEEP_SECONDS, self.timeout / 4))
                now = loop.time()
                for task, started in list(self._reading.items()):
                    if started + self.timeout <= now and task not in self._expired:
                        self._cut(task, RequestTimeout(_LATE % self.timeout))
                self._shed_stale(now)
        finally:
            self._sweeper = None

    def _shed_stale(self, now: float) -> None:
        """For each call waiting for a slot (that no read already cut frees), cut the read that has taken
        longest, if it has taken :data:`STALE_READ_SECONDS` or more."""
        wanted = self.waiting - len(self._expired)
        for task, started in list(self._reading.items()):  # oldest first
            if wanted <= 0 or now - started < STALE_READ_SECONDS:
                return
            if task not in self._expired:
                retry = {"Retry-After": str(self.retry_after)}
                self._cut(task, Overloaded(_SHED % STALE_READ_SECONDS, headers=retry))
                wanted -= 1

    def _cut(self, task: asyncio.Task, error: Exception) -> None:
        self._expired[task] = error
        task.cancel()

    async def _wait_for_slot(self) -> None:
        if self.waiting >= self.max_waiting:
            raise Overloaded(
                f"{self.waiting} calls are waiting to send their messages, the most this service queues "
                "(DBF_MAX_IN_FLIGHT); retry later",
                headers={"Retry-After": str(self.retry_after)},
            )
        self.waiting += 1
        try:
            self._shed_stale(asyncio.get_running_loop().time())
            await self._slots.acquire()
        finally:
            self.waiting -= 1

    def bounded(
        self, handler: grpc.RpcMethodHandler, answering: Callable[[Any], Any]
    ) -> grpc.RpcMethodHandler:
        """``handler`` reading its messages through :meth:`read`, then deserializing them as it did.

        ``answering`` wraps the new behaviour so that the reads' refusals become statuses (the front end's
        error mapping): it takes and returns a coroutine function ``(requests, context)``.
        """
        deserialize = _as_is if handler.request_deserializer is None else _read(handler.request_deserializer)
        if handler.request_streaming:
            inner = handler.stream_stream if handler.response_streaming else handler.stream_unary

            def requests(context: grpc.aio.ServicerContext) -> Any:
                return self._messages(context, deserialize)
        else:
            inner = handler.unary_stream if handler.response_streaming else handler.unary_unary

            async def one(context: grpc.aio.ServicerContext) -> Any:
                return deserialize(await self._one(context))

        if handler.response_streaming:

            async def streaming(unread: Any, context: grpc.aio.ServicerContext) -> None:
                request = requests(context) if handler.request_streaming else await one(context)
                answers = inner(request, context)
                if inspect.isasyncgen(answers):
                    async for answer in answers:
                        await context.write(answer)
                else:  # a coroutine that writes its answers itself
                    await answers

            return grpc.stream_stream_rpc_method_handler(
                answering(streaming), None, handler.response_serializer
            )

        async def unary(unread: Any, context: grpc.aio.ServicerContext) -> Any:
            request = requests(context) if handler.request_streaming else await one(context)
            return await inner(request, context)

        return grpc.stream_unary_rpc_method_handler(answering(unary), None, handler.response_serializer)

    async def _one(self, context: grpc.aio.ServicerContext) -> Any:
        message = await self.read(context)
        if message is grpc.aio.EOF:
            raise InvalidInput("the call sent no request message")
        return message

    async def _messages(
        self, context: grpc.aio.ServicerContext, deserialize: Callable[[Any], Any]
    ) -> AsyncIterator[Any]:
        while (message := await self.read(context)) is not grpc.aio.EOF:
            yield deserialize(message)


_LATE = "the request message did not arrive within %g s (DBF_BODY_TIMEOUT_SECONDS)"
_SHED = (
    "the request message had not arrived after %g s while other calls waited to send theirs (every read "
    "slot taken); retry later"
)


def _as_is(message: Any) -> Any:
    return message


def _read(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserialize`` (health's, reflection's: protobuf's parser), bytes that are no such message the
    client's mistake (INVALID_ARGUMENT), not a bug of the service's (INTERNAL, logged, alerting)."""

    def read(message: bytes) -> Any:
        try:
            return deserialize(message)
        except DecodeError as error:
            raise InvalidInput(f"not a request message of this method: {error}") from None

    return read


class BoundedServer:
    """A ``grpc.aio.Server`` seen by code that adds services to it (the generated ``add_*_to_server``,
    reflection's ``enable_server_reflection``): every handler added is :meth:`MessageReads.bounded`."""

    def __init__(self, server: grpc.aio.Server, reads: MessageReads, answering: Callable[[Any], Any]) -> None:
        self.server, self.reads, self.answering = server, reads, answering

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(tuple(_BoundedGeneric(h, self) for h in handlers))

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        self.server.add_registered_method_handlers(
            service, {method: self.bound(handler) for method, handler in handlers.items()}
        )

    def bound(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        return self.reads.bounded(handler, self.answering)


class _BoundedGeneric(grpc.GenericRpcHandler):
    """A generic handler's methods, bounded once each (a call looks its method up here every time)."""

    def __init__(self, inner: grpc.GenericRpcHandler, server: BoundedServer) -> None:
        self.inner, self.server = inner, server
        self._bounded: dict[str, grpc.RpcMethodHandler | None] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        try:
            return self._bounded[details.method]
        except KeyError:
            handler = self.inner.service(details)
            bounded = None if handler is None else self.server.bound(handler)
            if len(self._bounded) < _CACHED_METHODS:  # method names are the client's: never cache them all
                self._bounded[details.method] = bounded
            return bounded


_CACHED_METHODS = 256
