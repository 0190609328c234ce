"""What service/ relies on in other libraries beyond their public API, checked on the releases installed.

No public API does what these parts do: uvicorn has no hook for the per-connection limits of
:class:`service.server.GuardedHttpProtocol` (a subclass of its httptools protocol, using its attributes) nor
for :class:`service.server.WorkerSupervisor`; prometheus-client has no bulk observation
(:func:`service.metrics.observe_many` writes a histogram's bucket and sum values). pyproject.toml bounds both
libraries to the releases tested; an upgrade that changes what is relied on fails here, with a message naming
the library, its release and the attribute or behaviour, rather than as a less obvious failure of the
behaviour tests (tests/service/test_connections.py, test_hardening.py, test_metrics.py).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import importlib.metadata
import inspect
import math
import textwrap
import weakref
from typing import Any

import httptools
import prometheus_client
import pytest
import uvicorn
from prometheus_client import CollectorRegistry, Histogram
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState
from uvicorn.supervisors import Multiprocess, multiprocess

from service import server
from tests.service.conftest import free_port

UVICORN = f"uvicorn {importlib.metadata.version('uvicorn')}"
PROMETHEUS_CLIENT = f"prometheus-client {importlib.metadata.version('prometheus-client')}"


def broken(library: str, what: str, user: str) -> str:
    """The failure message: what changed in which release, and who relies on it."""
    return (
        f"{library}: {what}. {user} relies on it: adapt it to this release (or keep the release out), then "
        "widen the bound in pyproject.toml"
    )


# --- uvicorn --------------------------------------------------------------------------------------------

# uvicorn's HttpToolsProtocol.data_received, which GuardedHttpProtocol.data_received replaces (it does what
# uvicorn's does, with the head limits): the digest of its source, as in the releases tested.
DATA_RECEIVED_SOURCES = {"02c2572f"}


def source_digest(function: Any) -> str:
    return hashlib.sha256(textwrap.dedent(inspect.getsource(function)).encode()).hexdigest()[:8]


def test_uvicorn_protocol_methods_that_guarded_protocol_overrides():
    user = "service/server.py's GuardedHttpProtocol"
    assert issubclass(server.GuardedHttpProtocol, HttpToolsProtocol)
    for name in (
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_headers_complete",
        "on_message_complete",
        "on_response_complete",
        "pause_writing",
        "timeout_keep_alive_handler",
        "_unset_keepalive_if_required",
    ):
        assert callable(getattr(HttpToolsProtocol, name, None)), broken(
            UVICORN, f"HttpToolsProtocol has no method {name}", user
        )
    parameters = set(inspect.signature(HttpToolsProtocol.__init__).parameters)
    assert {"config", "server_state", "app_state", "_loop"} <= parameters, broken(
        UVICORN, f"HttpToolsProtocol(...) takes {sorted(parameters)}", user
    )
    digest = source_digest(HttpToolsProtocol.data_received)
    assert digest in DATA_RECEIVED_SOURCES, broken(
        UVICORN,
        f"HttpToolsProtocol.data_received is not the one tested (source digest {digest}), and "
        "GuardedHttpProtocol.data_received replaces it: port its change, then add the digest to "
        "DATA_RECEIVED_SOURCES",
        user,
    )


def test_uvicorn_supervisor_that_worker_supervisor_extends():
    user = "service/server.py's WorkerSupervisor"
    assert issubclass(server.WorkerSupervisor, Multiprocess)
    parameters = list(inspect.signature(Multiprocess.__init__).parameters)
    assert parameters[1:3] == ["config", "sockets"], broken(
        UVICORN, f"Multiprocess(...) takes {parameters}", user
    )
    for name in ("run", "handle_signals", "keep_subprocess_alive"):
        assert callable(getattr(Multiprocess, name, None)), broken(
            UVICORN, f"Multiprocess has no method {name}", user
        )
    assert callable(getattr(Config, "bind_socket", None)), broken(UVICORN, "Config.bind_socket is gone", user)
    supervisor = Multiprocess(Config(app=None, workers=1), sockets=[])
    assert isinstance(supervisor.processes, list), broken(
        UVICORN, "Multiprocess.processes is not a list", user
    )
    assert isinstance(getattr(multiprocess.Process, "pid", None), property), broken(
        UVICORN, "a Multiprocess worker (Process) has no pid", user
    )
    # keep_subprocess_alive is WorkerSupervisor's own (a replacement that fails to start is started again
    # later): what it uses of uvicorn's.
    for name in ("pid", "exitcode"):
        assert isinstance(getattr(multiprocess.Process, name, None), property), broken(
            UVICORN, f"a Multiprocess worker (Process) has no {name}", user
        )
    for name in ("start", "kill", "join", "is_alive"):
        assert callable(getattr(multiprocess.Process, name, None)), broken(
            UVICORN, f"a Multiprocess worker (Process) has no method {name}", user
        )
    parameters = list(inspect.signature(multiprocess.Process.__init__).parameters)
    assert parameters[1:3] == ["config", "sockets"], broken(UVICORN, f"Process(...) takes {parameters}", user)
    # A starting worker's first health check is WorkerSupervisor's own: a ping on the worker's pipe.
    worker = multiprocess.Process(Config(app=None), [])
    pipe = getattr(worker, "parent_conn", None)
    assert all(callable(getattr(pipe, name, None)) for name in ("send", "poll", "recv")), broken(
        UVICORN, "a Multiprocess worker (Process) has no parent_conn pipe for its health check", user
    )
    assert multiprocess.STARTUP_FAILURE == 3, broken(UVICORN, "STARTUP_FAILURE is no longer 3", user)
    assert isinstance(Config(app=None).timeout_worker_healthcheck, int | float), broken(
        UVICORN, "Config has no timeout_worker_healthcheck", user
    )
    assert hasattr(supervisor, "should_exit"), broken(UVICORN, "Multiprocess has no should_exit", user)


def test_uvicorn_server_state_keys_the_connection_books():
    """GuardedHttpProtocol keeps one connection book per server, keyed weakly by the server's state."""
    try:
        weakref.ref(ServerState())
    except TypeError:
        pytest.fail(broken(UVICORN, "ServerState cannot be weakly referenced", "GuardedHttpProtocol"))


class Recorder(HttpToolsProtocol):
    """uvicorn's protocol, noting what GuardedHttpProtocol reads at each of the hooks it overrides."""

    seen: list[tuple[str, str, bool]]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.note("connection_made", "transport", self.transport is transport)
        self.note("connection_made", "loop", isinstance(self.loop, asyncio.AbstractEventLoop))
        self.note("connection_made", "timeout_keep_alive", isinstance(self.timeout_keep_alive, int | float))
        self.note("connection_made", "timeout_keep_alive_task", hasattr(self, "timeout_keep_alive_task"))
        self.note("connection_made", "server_state", isinstance(self.server_state, ServerState))
        headers = self.server_state.default_headers
        self.note("connection_made", "server_state.default_headers", _byte_pairs(headers))
        self.note("connection_made", "parser", isinstance(self.parser, httptools.HttpRequestParser))
        # requests read and waiting for the one being answered (empty until one is pipelined)
        self.note(
            "connection_made", "pipeline", isinstance(self.pipeline, collections.deque) and not self.pipeline
        )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.note("on_message_begin", "cycle", self.cycle is None)  # the first request's: none yet

    def on_headers_complete(self) -> None:
        self.note("on_headers_complete", "url", self.url == b"/contract?x=1")
        self.note("on_headers_complete", "headers", _byte_pairs(self.headers) and len(self.headers) == 3)
        # set by on_header for an Expect: 100-continue (none here), read by on_headers_complete: the guarded
        # protocol clears it for an HTTP/1.0 request
        self.note("on_headers_complete", "expect_100_continue", self.expect_100_continue is False)
        super().on_headers_complete()
        cycle = self.cycle
        self.note("on_headers_complete", "cycle.keep_alive", cycle.keep_alive is True)
        self.note("on_headers_complete", "cycle.response_complete", cycle.response_complete is False)
        self.note("on_headers_complete", "cycle.more_body", cycle.more_body is True)
        cycle.keep_alive = False  # as GuardedHttpProtocol does for an Upgrade request: answer, then close

    def on_response_complete(self) -> None:
        self.note("on_response_complete", "cycle.response_complete", self.cycle.response_complete is True)
        self.note("on_response_complete", "cycle.more_body", self.cycle.more_body is False)  # body read
        super().on_response_complete()

    def note(self, hook: str, attribute: str, as_expected: bool) -> None:
        self.seen.append((hook, attribute, as_expected))


def _byte_pairs(pairs: Any) -> bool:
    return isinstance(pairs, list) and all(isinstance(n, bytes) and isinstance(v, bytes) for n, v in pairs)


async def _ok(scope: dict, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_uvicorn_protocol_attributes_that_guarded_protocol_reads():
    """A request through uvicorn's own server, with what GuardedHttpProtocol reads noted at each hook."""
    seen: list[tuple[str, str, bool]] = []
    port = free_port()

    async def one_request() -> bytes:
        config = Config(_ok, host="127.0.0.1", port=port, http=Recorder, lifespan="off", log_level="warning")
        Recorder.seen = seen
        served = uvicorn.Server(config)
        task = asyncio.create_task(served.serve())
        while not served.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /contract?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi")
        try:  # all of it: the connection closes after the answer
            answer = await asyncio.wait_for(reader.read(), timeout=30)
        except TimeoutError:
            pytest.fail(
                broken(
                    UVICORN, "a connection whose cycle is not kept alive stays open", "GuardedHttpProtocol"
                )
            )
        writer.close()
        served.should_exit = True
        await task
        return answer

    answer = asyncio.run(one_request())
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nok"), answer
    assert b"\r\nconnection: close\r\n" in answer.lower(), broken(
        UVICORN,
        "an answer after the protocol set cycle.keep_alive to False does not say Connection: close",
        "GuardedHttpProtocol (answering an Upgrade request as plain HTTP, then closing)",
    )
    hooks = {(hook, attribute) for hook, attribute, _ in seen}
    expected = {
        ("connection_made", "transport"),
        ("connection_made", "loop"),
        ("connection_made", "timeout_keep_alive"),
        ("connection_made", "timeout_keep_alive_task"),
        ("connection_made", "server_state"),
        ("connection_made", "server_state.default_headers"),
        ("connection_made", "parser"),
        ("connection_made", "pipeline"),
        ("on_message_begin", "cycle"),
        ("on_headers_complete", "url"),
        ("on_headers_complete", "headers"),
        ("on_headers_complete", "expect_100_continue"),
        ("on_headers_complete", "cycle.keep_alive"),
        ("on_headers_complete", "cycle.response_complete"),
        ("on_headers_complete", "cycle.more_body"),
        ("on_response_complete", "cycle.response_complete"),
        ("on_response_complete", "cycle.more_body"),
    }
    assert hooks == expected, broken(
        UVICORN,
        f"HttpToolsProtocol no longer calls the hooks of {sorted(expected - hooks)}",
        "GuardedHttpProtocol",
    )
    wrong = [f"{hook}: {attribute}" for hook, attribute, as_expected in seen if not as_expected]
    assert not wrong, broken(
        UVICORN,
        f"HttpToolsProtocol's attributes are not as tested: {', '.join(wrong)}",
        "GuardedHttpProtocol",
    )


# --- prometheus-client ------------------------------------------------------------------------------------


def test_prometheus_histogram_internals_that_observe_many_writes():
    """A labelled histogram's ``_upper_bounds`` (the buckets, +Inf last), ``_buckets`` (one value per bucket,
    not cumulated: exposition cumulates them) and ``_sum``, each value with ``inc``; ``observe`` counting a
    value in the first bucket whose bound is at least it, NaN in none."""
    user = "service/metrics.py's observe_many"
    child = Histogram("contract", "d", ["m"], buckets=(0.5, 1.0), registry=CollectorRegistry()).labels("a")
    bounds = getattr(child, "_upper_bounds", None)
    assert bounds == [0.5, 1.0, math.inf], broken(
        PROMETHEUS_CLIENT, f"Histogram._upper_bounds is {bounds!r}", user
    )
    for name in ("_buckets", "_sum"):
        assert hasattr(child, name), broken(PROMETHEUS_CLIENT, f"a Histogram has no {name}", user)
    assert len(child._buckets) == len(bounds), broken(
        PROMETHEUS_CLIENT, "one _buckets value per bound no more", user
    )
    for value in (*child._buckets, child._sum):
        assert callable(getattr(value, "inc", None)) and callable(getattr(value, "get", None)), broken(
            PROMETHEUS_CLIENT, f"{type(value).__name__} has no inc and get", user
        )
    for x in (0.5, 0.7, 3.0, float("nan")):
        child.observe(x)
    counts = [value.get() for value in child._buckets]
    assert counts == [1, 1, 1], broken(
        PROMETHEUS_CLIENT,
        f"observe of 0.5, 0.7, 3 and NaN counts {counts} in the buckets, not [1, 1, 1]",
        user,
    )
    child._buckets[0].inc(2)
    child._sum.inc(1.0)
    exposed = {s.labels.get("le"): s.value for s in child.collect()[0].samples if s.name.endswith("_bucket")}
    assert exposed == {"0.5": 3, "1.0": 4, "+Inf": 5}, broken(
        PROMETHEUS_CLIENT, f"values written to _buckets are exposed as {exposed}", user
    )
    # Multiprocess mode (python -m service --workers N) keeps the same values in files: the same class.
    multiprocess_value = prometheus_client.values.MultiProcessValue()
    assert callable(getattr(multiprocess_value, "inc", None)), broken(
        PROMETHEUS_CLIENT, "MultiProcessValue has no inc", user
    )
