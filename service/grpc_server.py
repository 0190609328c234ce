"""The gRPC front end: the Open Inference Protocol's ``inference.GRPCInferenceService`` on ``grpc.aio``, in
the process and event loop of the HTTP server (each worker process serves it: :func:`start` is called by the
app's lifespan), with ``grpc.health.v1`` (Kubernetes' gRPC probes) and server reflection beside it.

Inference goes through the core's pipeline (:meth:`service.dataplane.DataPlane.serve`) with
:mod:`service.grpc_codec`; the limits are REST's: a message of at most what ``DBF_MAX_SAMPLES`` samples take
as tensors (:func:`service.repository.message_limit`; decompressed: gzip is gRPC's own), read a few at a
time within the body timeout (:mod:`service.grpc_reads`), held in the body budget while it is served,
``DBF_MAX_SAMPLES``, the in-flight slots, the client's deadline (its cancellation frees the slot),
``DBF_API_KEY`` as ``authorization: Bearer <key>`` metadata, checked before the message is read
(:class:`KeyFirst`). Answers that their clients do not take (a call whose client never reads: gRPC holds its
answer until the client's flow-control window lets it go) are counted until their calls end
(:class:`HeldAnswers`), and connections are closed after ``DBF_GRPC_MAX_CONNECTION_AGE_SECONDS`` (gRPC
cannot drop one call), so that neither holds memory for good. Domain errors become gRPC status codes
here, with REST's messages (:data:`STATUS`); a bug is INTERNAL, never a client's mistake.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from service import grpc_codec, metrics
from service.auth import TWICE, bearer_token, verify_token
from service.batching import BatchWait
from service.dataplane import BodyBudget, DataPlane
from service.errors import Overloaded, RequestTimeout, ServiceError, Unauthorized
from service.grpc_reads import BoundedServer, MessageReads
from service.proto import grpc_predict_v2_pb2 as pb
from service.repository import message_limit
from service.settings import Settings

log = logging.getLogger("dbf.grpc")

# Each domain error's status code (by its type, as service.api.errors maps them to HTTP statuses).
STATUS = {
    "invalid_input": grpc.StatusCode.INVALID_ARGUMENT,
    "unsupported_media_type": grpc.StatusCode.INVALID_ARGUMENT,
    "payload_too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "model_not_found": grpc.StatusCode.NOT_FOUND,
    "not_ready": grpc.StatusCode.UNAVAILABLE,
    "overloaded": grpc.StatusCode.UNAVAILABLE,
    "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
    "request_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
}

# A message this big or smaller is parsed on the event loop. Parsing costs a copy of its tensors' bytes
# (raw, or packed fp32_contents: protobuf copies them as they are), not the JSON parsing that the core's
# INLINE_BODY_BYTES is sized for: up to here a fraction of a millisecond, less than the codec thread's hop.
INLINE_MESSAGE_BYTES = 1 << 20

# Calls open at once on one connection, as nginx's and Envoy's HTTP/2 defaults are of this order.
STREAMS_PER_CONNECTION = 128

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class _Held:
    """``async with``: a received message, its bytes held in the body budget until the answer is made (the
    gRPC side of :class:`service.api.body.Received`: gRPC has received the message already)."""

    __slots__ = ("budget", "message")

    def __init__(self, budget: BodyBudget, message: grpc_codec.Message) -> None:
        self.budget, self.message = budget, message

    async def __aenter__(self) -> grpc_codec.Message:
        self.budget.reserve(len(self.message), body=len(self.message))
        return self.message

    async def __aexit__(self, *exc_info: object) -> None:
        self.budget.release(len(self.message))


class HeldAnswers:
    """Bytes of ModelInfer answers whose calls have not ended: gRPC holds an answer until the client's
    flow-control window takes it, and a client that never reads (a window of 0, a call it never consumes)
    left it there for good; 40 such calls held 145 MB. Past ``limit`` (``DBF_BODY_MEMORY_BYTES``), new calls
    are shed (UNAVAILABLE) until the connections holding them close
    (``DBF_GRPC_MAX_CONNECTION_AGE_SECONDS``): gRPC cannot drop one call's answer. (Each answer held costs
    about 3.5 times its size: the two copies counted, and the call's buffers in gRPC.)"""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit, self.retry_after, self.bytes = limit, retry_after, 0

    def admit(self, size: int = 0) -> None:
        """Shed a call (:class:`Overloaded`) while the answers held and ``size`` bytes more pass the limit
        (an answer alone passes: a limit below the biggest answer must not refuse every one)."""
        if self.bytes and self.bytes + size > self.limit:
            raise Overloaded(
                f"{self.bytes} bytes of answers wait for clients that have not taken them, the most this "
                "service holds (DBF_BODY_MEMORY_BYTES); retry later",
                headers={"Retry-After": str(self.retry_after)},
            )

    def hold(self, answer: bytes, context: grpc.aio.ServicerContext) -> None:
        """Count ``answer`` until its call ends (sent, cancelled, or its connection gone); shed where it
        does not fit (calls admitted together may answer more than the room left)."""
        size = 2 * len(answer)  # the service's bytes, held by grpc.aio until it is sent, and gRPC's copy
        self.admit(size)
        self.bytes += size
        context.add_done_callback(lambda _: self._release(size))

    def _release(self, size: int) -> None:
        self.bytes -= size


class InferenceServicer:
    """The RPCs of ``inference.GRPCInferenceService`` over the data plane."""

    def __init__(
        self, plane: DataPlane, version: str, answers: HeldAnswers, *, batch_wait: BatchWait | None = None
    ) -> None:
        self.plane, self.version, self.answers, self.batch_wait = plane, version, answers, batch_wait

    async def server_live(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.repository is not None)

    async def server_metadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="dbf-serve", version=self.version, extensions=["binary_tensor_data"]
        )

    async def model_ready(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        self.plane.model(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=True)

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        return grpc_codec.metadata(self.plane.model(request.name, request.version or None).signature)

    async def model_infer(self, body: bytes, context: Any) -> bytes:
        """ModelInfer, its request and answer as bytes: the message is parsed here (off the event loop when
        big: :data:`INLINE_MESSAGE_BYTES`), its parse errors the client's (INVALID_ARGUMENT)."""
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:  # queued past its deadline: nobody awaits the answer
            raise RequestTimeout("the call's deadline passed before it could be served")
        self.answers.admit()
        headers = _metadata(context)
        plane = self.plane
        message = await plane.run(grpc_codec.parse, body, inline=len(body) <= INLINE_MESSAGE_BYTES)
        del body  # the message holds what is needed of it
        request = message.request
        name, version = request.model_name, request.model_version or None
        held = _Held(plane.bodies, message)
        answer = await plane.serve(grpc_codec, name, version, headers, held, batch_wait=self.batch_wait)
        self.answers.hold(answer, context)
        return answer

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The service's method handlers by name, requests and answers as bytes (the messages read by
        :func:`_typed`, ModelInfer's by :meth:`model_infer`); the server puts them behind its message reads
        and :func:`_answering` (:class:`service.grpc_reads.BoundedServer`)."""
        unary = grpc.unary_unary_rpc_method_handler
        typed = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest),
            "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest),
            "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest),
        }
        methods = {name: unary(_typed(method, request)) for name, (method, request) in typed.items()}
        methods["ModelInfer"] = unary(self.model_infer)
        return methods


def _metadata(context: Any) -> dict[str, str]:
    """The call's metadata as headers (keys in lower case, as gRPC sends them; binary ones left out)."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


def _typed(method: Handler, kind: type) -> Handler:
    """``method`` (message in, message out) over bytes: the request read by :func:`grpc_codec.read`."""

    async def call(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        answer = await method(grpc_codec.read(kind, body), context)
        return answer.SerializeToString()

    return call


def _answering(method: Handler, *, stopping: asyncio.Event) -> Handler:
    """``method`` with its errors as gRPC statuses: a domain error's code (:data:`STATUS`) and message,
    counted by reason as REST's; anything else a bug: logged, counted, INTERNAL. Once ``stopping`` is set
    (the server drains), a call that gRPC ends (the drain's grace passed) is counted as REST's requests cut
    at shutdown are, and left to gRPC to end."""

    async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(request, context)
        except asyncio.CancelledError:  # the client went away, or its deadline passed, or the drain's grace
            cut = "shutting_down" if stopping.is_set() else "client_disconnected"
            metrics.ERRORS.labels(reason=cut).inc()
            raise
        except grpc.aio.AbortError:  # a status the method set itself (health's NOT_FOUND)
            raise
        except grpc.aio.BaseError as error:
            # A call that stopped waiting (for a read slot, a batch) after gRPC's server stopped: any use of
            # its context raises, and grpc.aio ends it (UNAVAILABLE). Misuse (UsageError) is still a bug.
            if stopping.is_set() and not isinstance(error, grpc.aio.UsageError):
                metrics.ERRORS.labels(reason="shutting_down").inc()
                raise
            code, message = _internal_error()
        except ServiceError as error:
            code = STATUS.get(error.type)
            if code is None:  # a domain error with no client's cause (a broken model's): the server's
                code = grpc.StatusCode.INTERNAL
            metrics.ERRORS.labels(reason=error.type).inc()
            retry = (error.headers or {}).get("Retry-After")
            if retry is not None:
                context.set_trailing_metadata((("retry-after", retry),))
            message = error.message
        except Exception:
            code, message = _internal_error()
        await context.abort(code, status_details(message))

    return answer


def _internal_error() -> tuple[grpc.StatusCode, str]:
    """A bug, while its exception is handled: logged with its traceback, counted; the status to end with."""
    log.exception("unexpected error serving a gRPC call")
    metrics.ERRORS.labels(reason="internal_error").inc()
    return grpc.StatusCode.INTERNAL, "internal error; see the service log"


# The methods behind DBF_API_KEY: what REST guards under /v2/models. Liveness, readiness, server metadata,
# health and reflection stay open, as REST's probes do.
PROTECTED = frozenset(
    f"/{grpc_codec.SERVICE}/{method}" for method in ("ModelReady", "ModelMetadata", "ModelInfer")
)


class KeyFirst(grpc.aio.ServerInterceptor):
    """``DBF_API_KEY`` checked on a call's metadata before its message is read. A unary handler gets its
    message whole from gRPC, so a check inside it comes after the bytes (up to the message limit, per call)
    are in memory: unauthenticated clients could fill it. A call refused here gets a streaming handler that
    never asks for the message, and UNAUTHENTICATED with REST's message, counted as REST's 401s are."""

    def __init__(self, key: SecretStr) -> None:
        self.key = key

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method in PROTECTED:
            try:
                verify_token(_token(details.invocation_metadata or ()), self.key)
            except ServiceError as error:
                metrics.ERRORS.labels(reason=error.type).inc()
                return grpc.stream_unary_rpc_method_handler(_refusal(error.message))
        return await continuation(details)


def _token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The bearer token of the call's one ``authorization`` entry (two are refused, as REST refuses two
    Authorization headers: a proxy and the service could each read another)."""
    values = [value for key, value in metadata if key == "authorization"]
    if len(values) > 1:
        raise Unauthorized(TWICE, headers={"WWW-Authenticate": "Bearer"})
    return bearer_token(values[0] if values and isinstance(values[0], str) else None)


def _refusal(
    message: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    """A call's behaviour that reads none of its messages (streaming in: any call's kind) and ends it."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, status_details(message))

    return refuse


MOST_DETAILS_BYTES = 4096
"""The most bytes of a status's message as sent: it travels in the call's trailers, percent-encoded (a
character not printable ASCII takes three bytes for each of its UTF-8 bytes), which gRPC clients refuse
beyond 8 KiB by default; they then see RESOURCE_EXHAUSTED, not the status. Messages quote what the request
named (a model, an input, a method), which may be megabytes long."""


def status_details(message: str) -> str:
    """``message``, its middle cut where it takes more than :data:`MOST_DETAILS_BYTES` sent (a name quoted
    in it: the place and the fault, at its ends, stay), saying so."""
    if len(message) * 12 <= MOST_DETAILS_BYTES or len(_fitting(message, MOST_DETAILS_BYTES)) == len(message):
        return message
    cut = f" [... {len(message)} characters, cut ...] "
    room = (MOST_DETAILS_BYTES - len(cut)) // 2
    head = _fitting(message, room)
    tail = _fitting(message[::-1], room)[::-1]
    return f"{head}{cut}{tail}"


def _fitting(text: str, room: int) -> str:
    """The longest start of ``text`` sent in at most ``room`` bytes (read no further)."""
    used = 0
    for i, c in enumerate(text):
        used += 1 if " " <= c <= "~" and c != "%" else 3 * len(c.encode())
        if used > room:
            return text[:i]
    return text


class NotServed(grpc.GenericRpcHandler):
    """Any method the other handlers do not serve: UNIMPLEMENTED saying what is served, where gRPC would
    say only "Method not found!" (Triton's clients call its extensions: model configuration, statistics,
    repository control, shared memory, streaming). Its message is never read. Counted as REST's 404s."""

    def __init__(self, served: Iterable[str]) -> None:
        self.served = ", ".join(served)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if method in _RELOADS:
            message = f"{method} is not served: POST /v1/admin/reload (REST) loads the model repository again"
        else:
            message = (
                f"{method} is not served; this service answers {self.served} (the Open Inference "
                "Protocol), grpc.health.v1 and server reflection: Triton's extensions (model "
                "configuration, statistics, repository, shared memory, streaming) are not implemented"
            )
        metrics.ERRORS.labels(reason="not_found").inc()
        return grpc.stream_unary_rpc_method_handler(_refusal(message, grpc.StatusCode.UNIMPLEMENTED))


_RELOADS = frozenset(
    f"/{grpc_codec.SERVICE}/{method}" for method in ("RepositoryModelLoad", "RepositoryModelUnload")
)


class GrpcFrontEnd:
    """The gRPC server of one worker process: started by :func:`start`, drained by :meth:`stop`, which
    begins as soon as the process is told to stop (:meth:`stop_on_signals`)."""

    def __init__(
        self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer, stopping: asyncio.Event
    ) -> None:
        self.server, self.health = server, health_servicer
        self.stopping = stopping  # set as the drain begins (what the calls' answers count cuts by)
        self._drain_task: asyncio.Task | None = None

    async def stop(self, grace: float) -> None:
        """Not serving (health says so at once), then the calls in progress finish within ``grace``
        seconds; later ones are refused (UNAVAILABLE). Begun once: a second call waits for the first."""
        await asyncio.shield(self._begin_stop(grace))

    def _begin_stop(self, grace: float) -> asyncio.Task:
        if self._drain_task is None:
            self.stopping.set()
            self._drain_task = asyncio.ensure_future(self._drain(grace))
        return self._drain_task

    async def _drain(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)

    def stop_on_signals(self, grace: float) -> None:
        """Begin :meth:`stop` on SIGINT or SIGTERM, beside the HTTP server's drain rather than after it
        (which would give a shutdown twice ``grace``, past a Kubernetes pod's termination grace period).
        The handlers in place (uvicorn's, which starts the HTTP drain) still run first. Only the main
        thread can take signals; elsewhere (an app in a test's thread) the stop waits for the lifespan."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for number in (signal.SIGINT, signal.SIGTERM):
            before = signal.getsignal(number)
            if not callable(before):  # default or ignored: nothing of the server's to chain
                continue

            def chained(signum: int, frame: Any, before: Callable[..., Any] = before) -> None:
                before(signum, frame)
                loop.call_soon_threadsafe(self._begin_stop, grace)

            signal.signal(number, chained)


async def start(plane: DataPlane, settings: Settings, version: str) -> GrpcFrontEnd:
    """Serve gRPC on ``DBF_HOST``:``DBF_GRPC_PORT`` in this event loop. The port is shared with the other
    worker processes (SO_REUSEPORT: the kernel spreads connections among them, as the HTTP side's shared
    socket does); the message size limit is what the models loaded at start take as tensors
    (:func:`service.repository.message_limit`; a reload does not change it)."""
    repository = plane.repository
    limit = message_limit(settings, () if repository is None else repository.models.values())
    siblings = settings.workers != 1
    options = [
        # Worker processes share the port; a single one binds it alone, so that a port another server
        # holds is refused rather than shared with it.
        ("grpc.so_reuseport", int(siblings)),
        ("grpc.max_receive_message_length", _int32(limit)),
        ("grpc.max_send_message_length", -1),  # an answer is bounded by DBF_MAX_ANSWER_VALUES
        # HTTP's connection limits: idle connections close, and at most so many are open at once (else a
        # flood of sockets that only say hello holds the process's file descriptors, probes' included).
        ("grpc.max_connection_idle_ms", _int32(settings.idle_timeout_seconds * 1000)),
        # A connection's life, then its calls' time to end: the only way gRPC drops a call whose client
        # does not take its answer (HeldAnswers counts them meanwhile).
        ("grpc.max_connection_age_ms", _int32(settings.grpc_max_connection_age_seconds * 1000)),
        ("grpc.max_connection_age_grace_ms", _int32(settings.graceful_shutdown_seconds * 1000)),
        ("grpc.max_allowed_incoming_connections", _int32(settings.max_connections)),
        # HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS (gRPC sends none unless asked): a client opens at most
        # so many calls on one connection, and queues the others itself.
        ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
        # What a call may send before the service asks for its message (service.grpc_reads): HTTP/2's
        # initial window, 64 KiB. gRPC's bandwidth probe grows it to megabytes on a fast link, and calls
        # not yet taken held their whole messages, outside every budget: 1,200 concurrent 1 MB calls took
        # the service from 154 MB to 1.2 GB. A message asked for is let in whole all the same.
        ("grpc.http2.bdp_probe", 0),
        # Streams past that limit are still refused (a client that ignores it), but not those past it
        # counted with the calls the server has yet to free after the client saw them end: that "overload
        # protection" refused a well-behaved client's queued calls (UNAVAILABLE, "Stream removed", no
        # retry-after) once it kept more than about 130 calls going. The service's own admission bounds the
        # calls (read slots, DBF_MAX_IN_FLIGHT), and a rapid reset fared no better with it.
        ("grpc.http.overload_protection", 0),
    ]
    key = settings.api_key
    server = grpc.aio.server(options=options, interceptors=() if key is None else (KeyFirst(key),))
    reads = MessageReads(
        slots=settings.body_memory_bytes // limit,
        max_waiting=settings.max_in_flight,
        timeout=settings.body_timeout_seconds,
        retry_after=settings.retry_after_seconds,
    )
    stopping = asyncio.Event()
    bounded = BoundedServer(server, reads, functools.partial(_answering, stopping=stopping))
    answers = HeldAnswers(settings.body_memory_bytes, settings.retry_after_seconds)
    # grpc.aio hands calls over one at a time: their batches wait for more (service.batching)
    wait = BatchWait(settings.grpc_batch_delay_ms / 1000, settings.grpc_batch_max_delay_ms / 1000)
    methods = InferenceServicer(plane, version, answers, batch_wait=wait).method_handlers()
    bounded.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(grpc_codec.SERVICE, methods),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, bounded)
    services = (grpc_codec.SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection_servicer = reflection.aio.ReflectionServicer(services, pool=_described())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection_servicer, bounded)
    server.add_generic_rpc_handlers((NotServed(methods),))  # last: what no other handler serves; never reads
    address = f"{_bracketed(settings.host)}:{settings.grpc_port}"
    server.add_insecure_port(address)  # RuntimeError if it cannot bind
    await server.start()
    # The models are loaded before the server starts (the app's lifespan): serving from the first call.
    for service in ("", grpc_codec.SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC (Open Inference Protocol) on %s", address)
    return GrpcFrontEnd(server, health_servicer, stopping)


def _int32(value: float) -> int:
    """A gRPC channel option's value: a C int, which a larger setting (DBF_MAX_SAMPLES of 400,000, an idle
    timeout of a month) overflows, failing the start; below its largest (gRPC's connection quota checks
    that it is less)."""
    return round(min(value, 2**31 - 2))


def _described() -> descriptor_pool.DescriptorPool:
    """The services reflection describes, in a pool of their own (the messages live in
    :data:`service.proto.grpc_predict_v2_pb2.POOL`, health's and reflection's in protobuf's default)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (pb, health_pb2, reflection_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


def _bracketed(host: str) -> str:
    """An IPv6 address in brackets, as gRPC's addresses take it."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
