"""How the gRPC server reads request messages: a few at a time, each within a deadline.

gRPC core opens a stream's flow-control window for the whole message as soon as a handler asks for it, and
a unary handler asks at once: every open call could hold a message up to the size limit, partly sent, with
nothing counting it (the body budget sees a message only once it is whole). Here every method's handler is
wrapped (:meth:`MessageReads.bounded`) so that it asks for its messages itself, one read slot each: a call
waiting for a slot has asked for nothing, and holds at most the stream's small initial window. Reads in
progress are ``DBF_BODY_MEMORY_BYTES`` over the message limit (at least one); calls waiting for a slot
beyond ``DBF_MAX_IN_FLIGHT`` are refused (UNAVAILABLE, as REST's overload), and a message not in within
``DBF_BODY_TIMEOUT_SECONDS`` (checked a few times per timeout) ends its call (DEADLINE_EXCEEDED, as REST's
408).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc

from service.errors import InvalidInput, Overloaded, RequestTimeout


class MessageReads:
    """Read slots for request messages, shared by every call of one gRPC server."""

    def __init__(self, *, slots: int, max_waiting: int, timeout: float, retry_after: int) -> None:
        self._slots = asyncio.Semaphore(max(1, slots))
        self.max_waiting, self.timeout, self.retry_after = max_waiting, timeout, retry_after
        self.waiting = 0
        # Reads in progress and their deadlines, checked by one sweeping task: a timer per read
        # (asyncio.timeout) cost one-sample calls 4% of their throughput.
        self._reading: dict[asyncio.Task, float] = {}
        self._expired: set[asyncio.Task] = set()
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
        self._reading[task] = loop.time() + self.timeout
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        try:
            return await context.read()
        except asyncio.CancelledError:
            if task not in self._expired:  # the client went away, or the server stops
                raise
            self._expired.discard(task)
            task.uncancel()
            raise RequestTimeout(
                f"the request message did not arrive within {self.timeout:g} s (DBF_BODY_TIMEOUT_SECONDS)"
            ) from None
        finally:
            del self._reading[task]
            self._slots.release()

    async def _sweep(self) -> None:
        """Cancel the reads past their deadline, a few times per timeout, while any is in progress."""
        loop = asyncio.get_running_loop()
        try:
            while self._reading:
                await asyncio.sleep(min(1.0, self.timeout / 4))
                now = loop.time()
                for task, deadline in list(self._reading.items()):
                    if deadline <= now and task not in self._expired:
                        self._expired.add(task)
                        task.cancel()
        finally:
            self._sweeper = None

    async def _wait_for_slot(self) -> None:
        if self.waiting >= self.max_waiting:
            raise Overloaded(
                f"{self.waiting} calls are waiting to send their messages, the most this service queues "
                "(DBF_MAX_IN_FLIGHT); retry later",
                headers={"Retry-After": str(self.retry_after)},
            )
        self.waiting += 1
        try:
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
        deserialize = handler.request_deserializer or _as_is
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


def _as_is(message: Any) -> Any:
    return message


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
