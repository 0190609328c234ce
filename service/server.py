"""The HTTP server around the app: uvicorn's httptools protocol with the connection-level limits it lacks.

uvicorn parses with httptools (llhttp), which bounds neither a request head's size nor its header count
(httptools accumulates an unfinished header value by concatenation: cost grows with the square of its
length), arms its keep-alive timer only after a response (a connection that never sends a request, or
sends half a head, stays open for ever), and counts no connections (``--limit-concurrency`` answers 503 to
every request alike, probes included, and still accepts the sockets). :class:`GuardedHttpProtocol` adds, per
connection:

- **head limits**: at most ``DBF_MAX_HEADER_BYTES`` of request line and header fields (counted per chunk
  read, before httptools gets to concatenate, and per field), at most ``DBF_MAX_HEADER_COUNT`` fields;
  beyond them a 431 (414 for the request target alone) and the connection closed;
- **timeouts**: a connection waiting for a request (before its first one too) is closed after
  ``DBF_IDLE_TIMEOUT_SECONDS``; a request head must arrive in full within ``DBF_HEADER_TIMEOUT_SECONDS`` of
  its first byte (a deadline, not an inactivity timer: a byte now and then does not extend it), else 408;
- **a connection cap**: at most ``DBF_MAX_CONNECTIONS`` per worker process. A new connection over the cap
  closes the one that has waited longest for a request (idle keep-alive or unfinished head), else the one
  that has been receiving its body longest; never one whose request is in and being answered. So a flood
  of idle, half-sent or slow-body sockets cannot shut anyone out, probes included: each new connection
  takes the place of the stalest one. Only when every connection is being answered is a new one refused;

- **answers not taken**: an answer is written whole, and what the client's socket does not take is held in
  memory (a closing transport too keeps it, and its socket, until it is sent): a client that asks and never
  reads kept its answer for good. While some is held, the client must take at least
  ``DBF_BODY_MIN_BYTES_PER_SECOND`` on average over each ``DBF_IDLE_TIMEOUT_SECONDS`` (a byte at least),
  and all connections together hold at most ``DBF_BODY_MEMORY_BYTES`` besides the newest answer: else the
  connection is dropped (the one that has held its answer longest, for the second), answer and all;
- **upgrades**: a request asking to Upgrade (to a websocket, h2c) or a CONNECT is answered as plain HTTP/1.1
  and its connection then closed (the parser reads nothing after it; one with a body is refused, 400); a
  head the parser refuses is answered in the service's words, never with the name of a failed callback,
  and so is one the parser takes but HTTP/1.1 does not (a version other than 1.0 and 1.1, HTTP/1.1 without
  ``Host``: 400); a refused head is answered after the requests pipelined before it, in order;

and :class:`ConnectionAnswers` (ASGI, around the app) two answers uvicorn gets wrong:

- an answer refusing a body too large to read through (any answer to a body declared over twice
  ``DBF_MAX_BODY_BYTES``, a 413 to a streamed one), or one that stalled (408), says ``Connection: close``:
  uvicorn then closes the connection after it instead of reading and discarding the rest of the body,
  however large. The rest of a smaller body answered early (a 413 to a body declared a little over the
  limit, 401, 415, 503 overloaded) is read and dropped, as uvicorn does, but within limits
  (:func:`drained_bytes` within ``DBF_IDLE_TIMEOUT_SECONDS``): the connection stays usable, and a client
  still sending can read its answer (closing on unread bytes resets the connection: clients that send
  their whole body before reading, as http.client and httpx's async client do, then lose the answer);
- a request still running when the graceful-shutdown period ends (a slow upload, say) is answered 503
  ``shutting_down`` in the service's error format, not uvicorn's text/plain 500.

Refusals are in the error format of the route asked for, as far as the request target has arrived
(:mod:`service.api.errors`), and counted in ``dbf_errors_total``.

Several workers run under :class:`WorkerSupervisor`, uvicorn's supervisor, which also stops counting the
live gauges of a worker that has ended (``dbf_open_connections``: a killed worker's connections).
"""

from __future__ import annotations

import asyncio
import http
import logging
import pickle
import resource
import socket
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import httptools
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

from service import metrics
from service.api.body import BODY_REFUSED
from service.api.direct import DirectRoutes
from service.api.errors import error_body, error_response
from service.api.routes import DIRECT
from service.lengths import declared_length
from service.settings import Settings

# uvicorn's HttpToolsProtocol and Multiprocess, subclassed here, are not public API: pyproject.toml bounds
# uvicorn to the releases whose attributes and hooks tests/service/test_dependency_contracts.py checks.

log = logging.getLogger("dbf.server")
_supervisor_log = logging.getLogger("uvicorn.error")  # configured in the supervisor process too

# File descriptors a worker needs besides its connections: listening socket, event loop, log files, model
# and metrics files, onnxruntime's and the thread pool's.
_SPARE_DESCRIPTORS = 256


@dataclass(frozen=True)
class ConnectionLimits:
    """The per-connection limits (from :class:`~service.settings.Settings`), handed to each protocol."""

    max_header_bytes: int
    max_header_count: int
    header_timeout: float
    max_connections: int
    max_drained_bytes: int  # of a body answered before it was all read (drained_bytes)
    send_window: float  # seconds within which a client must take min_send_bytes of an answer held for it
    min_send_bytes: int
    max_unsent_bytes: int  # of answers held for clients, all connections together

    @classmethod
    def from_settings(cls, settings: Settings, *, max_connections: int | None = None) -> ConnectionLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
            header_timeout=settings.header_timeout_seconds,
            max_connections=max_connections or settings.max_connections,
            max_drained_bytes=drained_bytes(settings.max_body_bytes),
            send_window=settings.idle_timeout_seconds,
            min_send_bytes=_bytes_within(settings.body_min_bytes_per_second, settings.idle_timeout_seconds),
            max_unsent_bytes=settings.body_memory_bytes,
        )


def drained_bytes(max_body_bytes: int) -> int:
    """How many bytes of a body answered before it was all read are still read and dropped, at most: twice
    the body limit. A client that sends its whole body before it reads (http.client, httpx's async client)
    loses the answer if the connection closes on bytes unread (the kernel resets it): a body declared a
    little over the limit, the usual mistake, is read through so that its client gets the 413. That costs
    no more than a request within the limit and no memory (the bytes are dropped as they come); a larger
    declared body is refused without reading on."""
    return 2 * max_body_bytes


def _bytes_within(rate: float, seconds: float) -> int:
    """Bytes at ``rate`` a second within ``seconds`` (which may be infinite): one at least."""
    wanted = rate * seconds
    return int(min(wanted, 1 << 62)) if wanted >= 1 else 1  # (no rate: any, one byte a window)


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a head that broke a limit (answered by the caller)."""


class ConnectionBook:
    """This worker's open connections by what they do: waiting for a request, receiving a request's body,
    or being answered (request in). Oldest first within each, so the stalest is found at once; each
    connection knows where it is (``book_place``), so that a move costs two dictionary operations."""

    def __init__(self) -> None:
        self.places: dict[str, OrderedDict[GuardedHttpProtocol, None]] = {
            "waiting": OrderedDict(),
            "receiving": OrderedDict(),
            "answering": OrderedDict(),
        }
        self.count = 0
        # Connections holding bytes of answers their clients have not taken, held longest first, with the
        # bytes counted at the last look; and those bytes, all together.
        self.unsent: OrderedDict[GuardedHttpProtocol, int] = OrderedDict()
        self.unsent_bytes = 0

    def move(self, connection: GuardedHttpProtocol, place: str) -> None:
        """To the newest end of ``place``; a connection closed (or shed) stays out."""
        if connection.book_place is not None:
            del self.places[connection.book_place][connection]
            self.places[place][connection] = None
            connection.book_place = place

    def close(self, connection: GuardedHttpProtocol) -> None:
        if connection.book_place is not None:
            del self.places[connection.book_place][connection]
            connection.book_place = None
            self.count -= 1
            metrics.OPEN_CONNECTIONS.dec()

    def admit(self, connection: GuardedHttpProtocol, limit: int) -> bool:
        """Count ``connection`` in (waiting for its request), at ``limit`` first closing the stalest other
        one; False if there is none to close (all are being answered): ``connection`` is then refused."""
        if self.count >= limit:
            for place in ("waiting", "receiving"):
                stalest = next(iter(self.places[place]), None)
                if stalest is not None:
                    metrics.CONNECTIONS_SHED.labels(place).inc()
                    self.close(stalest)
                    stalest.transport.close()
                    break
            else:
                metrics.CONNECTIONS_SHED.labels("new").inc()
                return False
        self.places["waiting"][connection] = None
        connection.book_place = "waiting"
        self.count += 1
        metrics.OPEN_CONNECTIONS.inc()
        return True

    def hold(self, connection: GuardedHttpProtocol, size: int, limit: int) -> None:
        """Count ``size`` bytes of answers held for ``connection``'s client now (0: none, or gone); past
        ``limit`` for all together, drop the connections that have held theirs longest (but ``connection``)
        until the rest fit."""
        counted = self.unsent.get(connection)
        if counted is None and not size:
            return
        if size:
            self.unsent[connection] = size  # (a connection counted already keeps its place)
        else:
            del self.unsent[connection]
        self.unsent_bytes += size - (counted or 0)
        if self.unsent_bytes > limit:
            self._shed_unsent(limit, connection)

    def _shed_unsent(self, limit: int, newest: GuardedHttpProtocol) -> None:
        for other in list(self.unsent):  # the counts first: clients may have taken theirs since
            held = other.transport.get_write_buffer_size()
            self.unsent_bytes += held - self.unsent[other]
            if held:
                self.unsent[other] = held
            else:
                del self.unsent[other]
        for other in list(self.unsent):
            if self.unsent_bytes <= limit:
                return
            if other is not newest:
                self.unsent_bytes -= self.unsent.pop(other)
                other.drop_unread()


# SO_LINGER on, for 0 s: a socket closed with bytes unsent is reset, its bytes discarded.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)

# One book per uvicorn server (in practice: per worker process), found from the state its protocols share.
_BOOKS: WeakKeyDictionary[ServerState, ConnectionBook] = WeakKeyDictionary()


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits, idle and head timeouts and a connection cap.

    uvicorn builds one per connection as ``http_protocol_class(config=, server_state=, app_state=, _loop=)``:
    pass ``functools.partial(GuardedHttpProtocol, limits=...)`` (see :func:`uvicorn_options`).
    """

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        book = _BOOKS.get(self.server_state)
        if book is None:
            book = _BOOKS[self.server_state] = ConnectionBook()
        self.book = book
        self.book_place: str | None = None  # where in the book (None: not, or no longer, counted)
        # The head's deadline, or, after an early answer, the deadline for the rest of the body.
        self.deadline: asyncio.TimerHandle | None = None
        self.head_open = True  # the next bytes belong to a request head (none of it complete yet)
        self.head_started = False  # some of that head has arrived (a 408 then, not a silent close)
        self.head_fed = 0  # bytes of whole chunks read while the head stayed unfinished
        self.chunk_len = 0  # this chunk's, if the head began with it (else more than the limit: count)
        self.refusal: tuple[int, str, str] | None = None
        self.drain_left: int | None = None  # bytes still taken of an answered request's body (None: none)
        self.refused_in_turn: tuple[int, str, str] | None = None  # once the requests before it are answered
        # While asyncio holds bytes of answers for the client: the next check that it takes them, and how
        # many were held at the last (or since the last answer's end).
        self.send_check: asyncio.TimerHandle | None = None
        self.send_held = 0

    # --- connection ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.book.admit(self, self.limits.max_connections):
            log.warning("refused a connection: all %d are being answered", self.limits.max_connections)
            transport.close()
            return
        # uvicorn's keep-alive timer, armed before the first request too: an idle connection is closed.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.book.close(self)
        self._cancel_deadline()
        self.book.hold(self, 0, self.limits.max_unsent_bytes)
        if self.send_check is not None:
            self.send_check.cancel()
            self.send_check = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        # asyncio holds more than its high-water mark of answers the client has not taken.
        super().pause_writing()
        self._hold_unsent(new_answer=False)

    def resume_writing(self) -> None:
        # The client took all but asyncio's low-water mark of it.
        super().resume_writing()
        self.book.hold(self, self.transport.get_write_buffer_size(), self.limits.max_unsent_bytes)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, with the head limits and the head deadline.
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        whole_chunk_is_head = self.head_open
        self.chunk_len = len(data) if whole_chunk_is_head else self.limits.max_header_bytes + 1
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # it stops after an upgrade request, answered as plain HTTP (on_headers_complete)
        except httptools.HttpParserError as error:
            refusal = self.refusal or _malformed(error)
            if self.cycle is not None and not self.cycle.response_complete and self.cycle.more_body:
                self._refuse_body(refusal)
            else:
                self._refuse_in_turn(refusal)
            return
        if self.drain_left is not None:  # the rest of a body answered early: taken only within limits
            self.drain_left -= len(data)
            if self.drain_left < 0:
                self.transport.close()
            return
        if not self.head_open or not (self.cycle is None or self.cycle.response_complete):
            return  # a request is in (or still being answered): its head is done with
        if whole_chunk_is_head:
            # An unfinished header reaches no callback: count it by the bytes read. (A chunk in which the
            # previous request ended is not counted: it is at most one read.)
            self.head_fed += len(data)
        refusal = self._too_large()
        if refusal is not None:
            self._refuse_in_turn(refusal)
            return
        if self.deadline is None:  # a deadline from the head's first chunk, however it trickles in
            self.deadline = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    # --- parser callbacks ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_started = True
        self.head_fed = 0

    def on_headers_complete(self) -> None:
        limits = self.limits
        # The head is at most the chunks read for it: only when those could exceed the limit are its
        # fields counted (a few hundred bytes for most clients: nothing to count).
        if (
            self.head_fed + self.chunk_len > limits.max_header_bytes
            or len(self.headers) > limits.max_header_count
        ):
            refusal = self._too_large()
            if refusal is not None:
                self.refusal = refusal
                raise _Refused
        # An Upgrade request (to a websocket, h2c...) or a CONNECT: the service speaks HTTP/1.1 alone
        # (uvicorn_options: no websockets) and answers it as a plain request, as RFC 9110 lets a server do.
        # But the parser reads nothing after its head: a body would go unread (refused), and the
        # connection closes after the answer.
        upgrade = self.parser.should_upgrade()
        if upgrade and _declared_length(self.headers) != 0:
            self.refusal = (
                400,
                "malformed_request",
                "a request asking to Upgrade cannot carry a body here: send it without the Upgrade header",
            )
            raise _Refused
        version = self.parser.get_http_version()
        fault = _head_fault(version, self.headers)
        if fault is not None:
            self.refusal = fault
            raise _Refused
        if version == "1.0":
            # RFC 9110, 10.1.1: a server MUST ignore an HTTP/1.0 request's 100-continue expectation (its
            # client need not read an interim answer); uvicorn would write one when the body is first read.
            self.expect_100_continue = False
        self._cancel_deadline()
        self.head_open = self.head_started = False
        super().on_headers_complete()
        if upgrade:
            self.cycle.keep_alive = False
        self.book.move(self, "receiving")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.head_open = True
        if self.drain_left is not None:  # the body answered early is all in: on to the next request
            self.drain_left = None
            self._cancel_deadline()
            self.book.move(self, "waiting")
        elif not self.cycle.response_complete:
            self.book.move(self, "answering")

    def on_response_complete(self) -> None:
        body_unread = self.cycle.more_body
        super().on_response_complete()
        if self.transport.get_write_buffer_size():
            # Some of the answer waits for the client, which may never take it: watched from its end (an
            # answer is only written once the one before has mostly gone).
            self._hold_unsent(new_answer=True)
        if self.transport.is_closing():  # Connection: close (a body too large to read, see ConnectionAnswers)
            return
        if self.refused_in_turn is not None and self.cycle.response_complete:  # none pipelined left
            self._refuse(*self.refused_in_turn)
            return
        if not self.cycle.response_complete:  # a pipelined request, all in, has just been started
            self.book.move(self, "answering")
        elif body_unread:
            # Answered before its body was in (401, 415, 503 overloaded...): uvicorn reads the rest and
            # discards it, which keeps the connection usable and lets a client still sending read the
            # answer (closing on unread bytes resets the connection, and async clients lose the answer).
            # But within limits: at most drained_bytes, within DBF_IDLE_TIMEOUT_SECONDS.
            self.drain_left = self.limits.max_drained_bytes
            self.deadline = self.loop.call_later(self.timeout_keep_alive, self._drain_timed_out)
            self.book.move(self, "receiving")
        else:  # kept alive: waiting for the next request
            self.book.move(self, "waiting")

    # --- refusals -----------------------------------------------------------------------------------
    def _head_timed_out(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if not self.head_started:  # nothing but line breaks: an idle connection, closed as such
            self.transport.close()
            return
        self._refuse(
            408,
            "header_timeout",
            f"request head not complete within {self.limits.header_timeout:g} s (DBF_HEADER_TIMEOUT_SECONDS)",
        )

    def _drain_timed_out(self) -> None:
        self.deadline = None
        self.transport.close()

    def _too_large(self) -> tuple[int, str, str] | None:
        """The refusal of a head that breaks a limit (None if it keeps them)."""
        limits = self.limits
        url, fields = (self.url, self.headers) if self.head_started else (b"", [])
        if len(url) > limits.max_header_bytes:
            return (
                414,
                "uri_too_long",
                f"request target over {limits.max_header_bytes} bytes (DBF_MAX_HEADER_BYTES)",
            )
        if len(fields) > limits.max_header_count:
            return (
                431,
                "headers_too_large",
                f"more than {limits.max_header_count} header fields (DBF_MAX_HEADER_COUNT)",
            )
        size = len(url) + sum(len(name) + len(value) + 4 for name, value in fields)  # ": " and CRLF
        if max(size, self.head_fed) > limits.max_header_bytes:
            return (
                431,
                "headers_too_large",
                f"request head over {limits.max_header_bytes} bytes (DBF_MAX_HEADER_BYTES)",
            )
        return None

    def _refuse_in_turn(self, refusal: tuple[int, str, str]) -> None:
        """Refuse a head (:meth:`_refuse`) once the requests before it on this connection are answered, in
        order (RFC 9112, 9.3.2): a valid request pipelined before a malformed one, in the same read, went
        unanswered. Nothing more is read meanwhile (the parser, having failed, can read no more)."""
        if self.cycle is None or (self.cycle.response_complete and not self.pipeline):
            self._refuse(*refusal)
            return
        self.refused_in_turn = refusal
        self.transport.pause_reading()  # not uvicorn's flow control, which resumes after each answer

    def _refuse_body(self, refusal: tuple[int, str, str]) -> None:
        """Refuse the request whose body the parser refused (a malformed chunk), now: its app waited for the
        rest of the body, and a refusal in turn after its answer waited with it, for the body timeout (408
        after 30 s, the connection held). The app is told its client is gone; an answer it has begun
        cannot be replaced, so that connection is only closed."""
        self.cycle.scope[BODY_REFUSED] = True  # answered and counted here, not as a client gone
        self.cycle.disconnected = True
        self.cycle.message_event.set()
        if self.cycle.response_started:
            self.transport.close()
        else:
            self._refuse(*refusal)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` in the error format and close: the rest of what the client sends is not read."""
        self._cancel_deadline()
        self._unset_keepalive_if_required()
        # In the error format of the route asked for, as far as the request target has come (none: v1's).
        target = self.url if self.head_started else b""
        body = error_body(target.partition(b"?")[0].decode("latin-1"), reason, message)
        head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        self.transport.write(b"".join(head) + body)
        self.transport.close()
        if self.transport.get_write_buffer_size():
            self._hold_unsent(new_answer=False)

    # --- answers the client has not taken -----------------------------------------------------------
    def _hold_unsent(self, *, new_answer: bool) -> None:
        """Count what asyncio holds for the client now in the book (:meth:`ConnectionBook.hold`), and check
        a send window from now that the client has taken enough of it (:meth:`_check_sending`): from a new
        answer's end, or from now if no check is due."""
        held = self.transport.get_write_buffer_size()
        self.book.hold(self, held, self.limits.max_unsent_bytes)
        if self.send_check is None or new_answer:
            self._check_sending_later(held)

    def _check_sending_later(self, held: int) -> None:
        if self.send_check is not None:
            self.send_check.cancel()
        self.send_held = held
        self.send_check = self.loop.call_later(self.limits.send_window, self._check_sending)

    def _check_sending(self) -> None:
        """Drop the connection if its client took less than ``min_send_bytes`` of the answers held for it
        in the last send window; else check again a window later, while any are held."""
        self.send_check = None
        held = self.transport.get_write_buffer_size()
        self.book.hold(self, held, self.limits.max_unsent_bytes)
        if not held:
            return
        if self.send_held - held < self.limits.min_send_bytes:
            self.book.hold(self, 0, self.limits.max_unsent_bytes)
            self.drop_unread()
            return
        self._check_sending_later(held)

    def drop_unread(self) -> None:
        """Reset the connection, answers held and all: close() would wait for the client to take what
        asyncio holds, and the kernel would still send what its socket holds (megabytes) once closed."""
        log.debug("dropped a connection whose client does not take its answer")
        metrics.CONNECTIONS_SHED.labels("unread").inc()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        self.transport.abort()

    def _cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None


def _malformed(error: httptools.HttpParserError) -> tuple[int, str, str]:
    """The answer to a head the parser refused: llhttp's diagnosis of the request (``Invalid header token``),
    but never the name of a callback that failed. One failing on the request target (uvicorn parses it
    then) is the request's fault; any other is a bug of the server's, logged with its traceback."""
    if not isinstance(error, httptools.HttpParserCallbackError):
        log.warning("invalid HTTP request received: %s", error)
        return 400, "malformed_request", f"not a valid HTTP/1.1 request: {error}"
    cause = error.__context__
    if isinstance(cause, httptools.HttpParserInvalidURLError | UnicodeDecodeError):
        log.warning("invalid request target received: %s", cause)
        return 400, "malformed_request", "not a valid HTTP/1.1 request: invalid request target"
    log.error("parsing a request head failed", exc_info=cause)
    return 500, "internal_error", "internal error; see the service log"


class ConnectionAnswers:
    """ASGI wrapper: ``Connection: close`` on an answer that refuses a body too large to read through (the
    rest is never read), and 503 ``shutting_down`` for a request cut at the end of the graceful-shutdown
    period; and a start the app refused for a reason it logged (``state.start_refused``) without the
    traceback the framework would add to it."""

    def __init__(self, app: Any, *, max_body_bytes: int, state: Any = None) -> None:
        self.app = app
        self.max_drained_bytes = drained_bytes(max_body_bytes)
        self.state = state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, self._quiet_refusal(send) if scope["type"] == "lifespan" else send)
            return
        declared = _declared_length(scope["headers"])
        body_pending = declared != 0
        started = False

        async def receive_body() -> dict:
            nonlocal body_pending
            message = await receive()
            if not message.get("more_body", False):  # the last piece, or the client is gone
                body_pending = False
            return message

        async def send_closing(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                # The rest of a body too large to read through, streamed past the limit or stalled (408)
                # is not read: uvicorn, seeing the header, closes the connection after the answer. (A
                # smaller rest is read and dropped: GuardedHttpProtocol.)
                if body_pending and (
                    message["status"] == 408
                    or (declared is None and message["status"] == 413)
                    or (declared is not None and declared > self.max_drained_bytes)
                ):
                    message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        try:
            await self.app(scope, receive_body if body_pending else receive, send_closing)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when the graceful-shutdown period ends: answer, if not yet.
            if started:
                raise
            log.warning("%s %s cut by the end of the graceful shutdown: 503", scope["method"], scope["path"])
            answer = error_response(
                scope["path"],
                503,
                "shutting_down",
                "the service is shutting down; retry on another instance",
                headers={"Connection": "close"},
            )
            await answer(scope, receive, send)

    def _quiet_refusal(self, send: Any) -> Any:
        """``send`` of the lifespan, with a refused start's traceback left out: Starlette sends it as the
        failure's message and uvicorn logs it, after the reason the app logged itself."""

        async def sending(message: dict) -> None:
            refused = getattr(self.state, "start_refused", False)
            if message["type"] == "lifespan.startup.failed" and refused:
                message = {**message, "message": ""}
            await send(message)

        return sending


_CLOSE = (b"connection", b"close")


# The headers that say how to read a body (Content-Length: the parser's), and Host (RFC 9112 section 3.2:
# twice is a 400). Given twice, the server and a proxy before it could each take another and read different
# requests, or route one to another virtual host.
_FRAMING = frozenset(
    (b"transfer-encoding", b"content-encoding", b"content-type", b"inference-header-content-length", b"host")
)


def _head_fault(version: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, str, str] | None:
    """The refusal (400) of a head that is not HTTP/1.0 or 1.1 (llhttp takes ``HTTP/2.0`` and a request line
    with no version, HTTP/0.9's), of an HTTP/1.1 one without ``Host`` (RFC 9112, 3.2), one giving a header
    of :data:`_FRAMING` twice, or a transfer coding besides ``chunked`` (llhttp takes ``gzip, chunked`` and
    undoes the chunking alone: the body would be read still gzipped); None for none of them. RFC 9110 and
    9112 suggest 505 and 501 for the first and last, but a client's mistake gets a 4xx here."""
    if version not in ("1.0", "1.1"):
        return (
            400,
            "malformed_request",
            f"not a valid HTTP/1.1 request: HTTP/{version} is not served here, HTTP/1.1 is (gRPC on its own "
            "port)",
        )
    if version == "1.1" and not any(name == b"host" for name, _ in headers):
        return 400, "malformed_request", "an HTTP/1.1 request needs a Host header (RFC 9112, 3.2)"
    seen = set()
    for name, value in headers:
        if name in _FRAMING:
            if name in seen:
                return 400, "malformed_request", f"the {name.decode()} header is given twice: send it once"
            seen.add(name)
            if name == b"transfer-encoding" and value.strip().lower() != b"chunked":
                shown = value.decode("latin-1")[:40]
                return (
                    400,
                    "malformed_request",
                    f"Transfer-Encoding {shown!r} is not supported: send the body chunked alone, or with a "
                    "Content-Length (compressed: Content-Encoding)",
                )
    return None


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's declared length: 0 for none, None when chunked (unknown until it ends)."""
    for name, value in headers:
        if name == b"content-length":
            return declared_length(value.decode("latin-1")) or 0  # httptools has checked they are digits
        if name == b"transfer-encoding":
            return None
    return 0


def application() -> ConnectionAnswers:
    """uvicorn's factory: the app from ``DBF_*`` settings (:func:`service.app.app_from_environment`), as
    :func:`guarded` makes it."""
    from service.app import app_from_environment

    # Live gauges of processes gone (a worker killed before its supervisor noticed, which this one may
    # replace; or an earlier run's, in a PROMETHEUS_MULTIPROC_DIR of the operator's) are counted no longer.
    metrics.forget_gone_processes()
    return guarded(app_from_environment())


def guarded(app: FastAPI) -> ConnectionAnswers:
    """A :func:`service.app.create_app` app as the server runs it: its inference routes answered directly
    (:class:`~service.api.direct.DirectRoutes`), all of it wrapped in :class:`ConnectionAnswers`."""
    direct = DirectRoutes(app, DIRECT)
    return ConnectionAnswers(direct, max_body_bytes=app.state.settings.max_body_bytes, state=app.state)


class WorkerSupervisor(Multiprocess):
    """uvicorn's supervisor of worker processes (it replaces one that dies or hangs, and retires or replaces
    them on SIGTTOU or SIGHUP), which also forgets the live gauges of each worker it has seen go: in
    multiprocess mode a worker's metrics files outlive it (:func:`service.metrics.forget_processes`)."""

    def __init__(self, config: Config, sockets: list[Any]) -> None:
        super().__init__(config, sockets)
        self.known: set[int | None] = set()  # the workers' process ids at the last look
        self.retry_at: dict[int, float] = {}  # worker slot -> when to start it again (its start failed)
        self.retry_delay: dict[int, float] = {}  # worker slot -> the wait after its next failed start
        self.failed = False  # stopped because no worker could start: the process exits non-zero
        self.first_seen: dict[Process, float] = {}  # a worker -> when its first health check was sent
        self.answered: set[Process] = set()  # the workers that have answered a health check once

    def handle_signals(self) -> None:
        super().handle_signals()
        self._forget_departed()

    def keep_subprocess_alive(self) -> None:
        """uvicorn's, but for a replacement worker that fails to start. uvicorn then stops every worker: a
        model directory changed since the start in a way the watchers refuse (a bad model dropped in, a copy
        half done) made one worker's death (OOM, SIGKILL) an outage, though the others served on. Now, while
        another worker lives, the slot is started again later (1 s, doubling to 30 s); only when none lives
        does the service stop, with a non-zero status."""
        if self.should_exit.is_set():
            return
        for slot, process in enumerate(self.processes):
            if slot in self.retry_at:
                if process.process.is_alive():  # replaced meanwhile (SIGHUP's restart, SIGTTIN's new one)
                    del self.retry_at[slot]
                elif time.monotonic() >= self.retry_at[slot]:
                    del self.retry_at[slot]
                    self._start(slot)
                    continue
                else:
                    continue
            if self._starting(process):
                continue
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung: kill it
            process.join()
            if self.should_exit.is_set():
                return
            if process.exitcode != STARTUP_FAILURE:
                _supervisor_log.info("worker process [%s] died; starting another", process.pid)
                self.retry_delay.pop(slot, None)
                self._start(slot)
                continue
            living = [
                other.pid
                for index, other in enumerate(self.processes)
                if index != slot and index not in self.retry_at and other.process.is_alive()
            ]
            if not living:
                _supervisor_log.error(
                    "worker process [%s] failed to start, and no other serves: stopping", process.pid
                )
                self.failed = True
                self.should_exit.set()
                return
            delay = self.retry_delay.get(slot, 1.0)
            self.retry_delay[slot] = min(2 * delay, 30.0)
            self.retry_at[slot] = time.monotonic() + delay
            _supervisor_log.error(
                "worker process [%s] failed to start (see its error above; has the model directory changed "
                "since the service started?); workers %s serve on; starting it again in %g s",
                process.pid,
                living,
                delay,
            )
        self._forget_departed()

    def _starting(self, process: Process) -> bool:
        """Whether ``process`` is a worker still starting: one that has not yet answered uvicorn's health
        check, alive, and first seen less than :data:`WORKER_START_SECONDS` ago. A worker answers only once
        its interpreter has started and imported the service (3 s on a busy 2-core VM): held to the check's
        5 s from the start, workers starting beside other work were killed as hung, and their replacements
        too. One ping is sent and its answer awaited here (more would queue answers, each a later check
        would take for a live worker's)."""
        if process in self.answered:
            return False
        try:
            if process not in self.first_seen:
                self.first_seen[process] = time.monotonic()
                process.parent_conn.send(b"ping")
            if process.parent_conn.poll(0):
                process.parent_conn.recv()
                self.answered.add(process)
                return False
        except (OSError, EOFError, pickle.UnpicklingError):
            return False  # dead: replaced as any other
        alive = process.process.is_alive()
        return alive and time.monotonic() - self.first_seen[process] < WORKER_START_SECONDS

    def _start(self, slot: int) -> None:
        process = Process(self.config, self.sockets)
        process.start()
        self.processes[slot] = process

    def terminate_all(self) -> None:
        """Stop the workers, the listening socket closed here first: it stays open while any process holds
        it, and the kernel would queue new connections that no draining worker accepts (held for the whole
        grace, then reset), where with one worker they are refused at once."""
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

    def _forget_departed(self) -> None:
        for gone in set(self.first_seen).difference(self.processes):
            del self.first_seen[gone]
        self.answered.intersection_update(self.processes)
        current = {process.pid for process in self.processes}
        metrics.forget_processes(pid for pid in self.known - current if pid is not None)
        self.known = current


WORKER_START_SECONDS = 60.0
"""How long a worker may take to answer its first health check (its interpreter's start and imports) before
it is taken for hung; once it has answered, uvicorn's check (5 s) holds."""


def supervise(config: Config) -> None:
    """Run ``config.workers`` worker processes on one socket bound here, as ``uvicorn.run`` does, under
    :class:`WorkerSupervisor`."""
    try:
        bound = config.bind_socket()
    except SystemExit:  # uvicorn logged the OSError alone ('[Errno 98] Address already in use'), no address
        _supervisor_log.error(
            "cannot listen on %s port %d (DBF_HOST, DBF_PORT; --host, --port)", config.host, config.port
        )
        raise
    supervisor = WorkerSupervisor(config, sockets=[bound])
    supervisor.run()
    if supervisor.failed:
        raise SystemExit(1)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run`` keyword arguments for the guarded protocol and the wrapped app (all picklable: each
    worker process gets them)."""
    import functools

    limits = ConnectionLimits.from_settings(settings, max_connections=fit_descriptor_limit(settings))
    return {
        "http": functools.partial(GuardedHttpProtocol, limits=limits),
        "ws": "none",  # no websocket routes: an upgrade request is answered as plain HTTP
        # The lifespan loads the models: a fault in it stops the server ("auto" would serve without them).
        "lifespan": "on",
        "timeout_keep_alive": settings.idle_timeout_seconds,
        # The proxies whose X-Forwarded-For names the client (service.auth.require_local_admin judges it):
        # this host's, never uvicorn's FORWARDED_ALLOW_IPS from the environment. "*" there, which uvicorn
        # suggests in containers, let a client on another host name itself 127.0.0.1 and reload.
        "forwarded_allow_ips": LOCAL_PROXIES,
        # Every answer, the server's own refusals too: a browser must not read an error that echoes a
        # request (a model name, a path) as anything but its declared type (OWASP's REST security sheet).
        "headers": [("X-Content-Type-Options", "nosniff")],
    }


LOCAL_PROXIES = "127.0.0.1,::1"
"""The peers trusted to name their client in X-Forwarded-For: uvicorn's default, this host's loopback."""


def fit_descriptor_limit(settings: Settings) -> int:
    """Raise this process's open-file limit (inherited by its workers) to hold ``DBF_MAX_CONNECTIONS``
    connections, as far as the hard limit allows; returns the connection cap that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = settings.max_connections + _SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitting = max(1, soft - _SPARE_DESCRIPTORS)
        log.warning(
            "DBF_MAX_CONNECTIONS=%d needs %d open files, the limit is %d: capping connections at %d",
            settings.max_connections,
            needed,
            soft,
            fitting,
        )
        return fitting
    return settings.max_connections
