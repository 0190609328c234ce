"""Hostile clients at the connection level (service/server.py): oversized heads, idle, half-sent and
trickled connections, connection floods, bodies sent after the answer, uploads cut by a shutdown.

Each attack runs against the real service on loopback, bounded in time, while a prober asks ``/health``
on a new connection every 50 ms: its p99 is printed (run with ``-s`` to see it) and asserted loosely
(timings are not the subject of tests; a hung or starved service is)."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import multiprocessing
import os
import re
import resource
import signal
import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.server import ConnectionLimits
from service.settings import Settings
from tests.service.conftest import (
    address,
    get,
    health_once,
    probing,
    read_answer,
    read_one,
    running_service,
    service_process,
    serving,
)
from tests.service.test_hardening import HANDWRITTEN, MODELS, random_samples
from tests.service.test_service import metric


def error_of(answer: bytes) -> tuple[int, dict[str, str], dict]:
    """Status, headers and error object of a raw HTTP answer in the service's error format."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
    return int(status_line.split()[1]), headers, json.loads(body)["error"]


def read_answer_while_trickling(conn: socket.socket, seconds: float = 10, data: bytes = b"x" * 100) -> bytes:
    """Send ``data`` a byte per 0.2 s (``conn`` has that timeout) until the server closes ``conn``, for at
    most ``seconds``; what it answered meanwhile."""
    answer = b""
    for i in range(int(seconds / 0.2)):
        try:
            if i < len(data):
                conn.sendall(data[i : i + 1])
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if not chunk:
            break
        answer += chunk
    return answer


def push(conn: socket.socket, head: bytes, total: int, seconds: float) -> int:
    """Send ``head`` then filler up to ``total`` bytes, for at most ``seconds``; the bytes the server took
    before closing the connection (or all of them, if it never did)."""
    conn.settimeout(seconds)
    sent, deadline, chunk = 0, time.monotonic() + seconds, b"a" * 65536
    try:
        conn.sendall(head)
        sent = len(head)
        while sent < total and time.monotonic() < deadline:
            sent += conn.send(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


def test_oversized_heads_are_refused_with_431_at_once():
    """The issue's attack: 8 sockets each sending a 60 MB header (and one of 100 MB). Each is answered 431
    after a bounded read, and /health stays fast meanwhile. Count, target and malformed heads too."""
    results: list[tuple[int, bytes]] = []

    def attacker(i: int, url: str, until: float) -> None:
        while time.monotonic() < until:  # again and again for 3 s, for the prober to see it
            with socket.create_connection(address(url), timeout=10) as conn:
                size = 100_000_000 if i == 0 else 60_000_000
                sent = push(conn, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", size, seconds=10)
                conn.settimeout(5)
                results.append((sent, read_answer(conn)))

    with running_service("--model-dir", HANDWRITTEN) as url:
        with probing(url, "8 sockets sending 60 MB headers"):
            until = time.monotonic() + 3
            threads = [threading.Thread(target=attacker, args=(i, url, until)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        print(f"{len(results)} oversized heads refused")
        assert len(results) >= 8
        for sent, answer in results:
            status, headers, error = error_of(answer)
            assert (status, error["type"], headers["connection"]) == (431, "headers_too_large", "close")
            assert "DBF_MAX_HEADER_BYTES" in error["message"]
            assert sent < 16 * 1024 * 1024  # the server stopped reading (what it took: kernel buffers)

        def raw(head: bytes) -> bytes:
            with socket.create_connection(address(url), timeout=10) as conn:
                conn.sendall(head)
                return read_answer(conn)

        many = b"".join(b"X-%d: 1\r\n" % i for i in range(101))
        status, _, error = error_of(raw(b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"))
        assert (status, error["type"]) == (431, "headers_too_large") and "DBF_MAX_HEADER_COUNT" in error[
            "message"
        ]
        status, _, error = error_of(raw(b"GET /" + b"a" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert (status, error["type"]) == (414, "uri_too_long")
        status, _, error = error_of(raw(b"GET /health HTTP/1.1\r\nHost: x\r\nBad\x01Name: 1\r\n\r\n"))
        assert (status, error["type"]) == (400, "malformed_request")
        # Big but within the limits (99 fields with httpx's own 5, 30 KB): served.
        fields = {f"x-field-{i}": "v" * 310 for i in range(94)}
        assert httpx.get(url + "/health", headers=fields).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        assert f'dbf_errors_total{{reason="headers_too_large"}} {len(results) + 1}.0' in metrics


def test_idle_half_sent_and_trickled_connections_are_closed():
    """Idle before the first request and after an answer: closed after DBF_IDLE_TIMEOUT_SECONDS. A head
    half sent, or trickled a byte at a time, or line breaks only: 408 (or closed) by the head deadline."""
    env = {"DBF_IDLE_TIMEOUT_SECONDS": "1", "DBF_HEADER_TIMEOUT_SECONDS": "2"}

    def closed_after(conn: socket.socket, trickle: bytes = b"") -> tuple[float, bytes]:
        """Seconds until the server closes ``conn`` (sending ``trickle`` a byte per 0.2 s meanwhile)."""
        started = time.monotonic()
        conn.settimeout(0.2)
        answer = read_answer_while_trickling(conn, data=trickle)
        return time.monotonic() - started, answer

    with running_service("--model-dir", HANDWRITTEN, env=env) as url, ExitStack() as sockets:
        idle, answered, half = (
            sockets.enter_context(socket.create_connection(address(url))) for _ in range(3)
        )
        answered.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")

        seconds, answer = closed_after(idle)
        assert answer == b"" and seconds < 3, seconds
        seconds, answer = closed_after(answered)
        assert answer.startswith(b"HTTP/1.1 200 ") and seconds < 3, seconds
        seconds, answer = closed_after(half)
        status, headers, error = error_of(answer)
        assert (status, error["type"], headers["connection"]) == (408, "header_timeout", "close")
        assert "DBF_HEADER_TIMEOUT_SECONDS" in error["message"] and seconds < 4
        # A byte every 0.2 s does not extend the head's deadline (slowloris).
        trickled, breaks = (sockets.enter_context(socket.create_connection(address(url))) for _ in range(2))
        seconds, answer = closed_after(trickled, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100)
        assert error_of(answer)[0] == 408 and seconds < 4, seconds
        seconds, answer = closed_after(breaks, b"\r\n" * 50)
        assert answer == b"" and seconds < 4, seconds


def _raise_open_file_limit(wanted: int) -> int:
    """Let this process hold ``wanted`` sockets if it may (raising the hard limit needs root); returns how
    many it can hold, with room to spare."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted + 512), max(hard, wanted + 512)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return min(wanted, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 512)


def open_connections(url: str) -> float:
    return float(_metric_line(url, "dbf_open_connections"))


def flood(where: tuple[str, int], wanted: int, opened: Any, stop: Any) -> None:
    """In a process of its own (so that the prober's timings are the service's, not this one's): open
    ``wanted`` connections, every other one with an unfinished head, put how many into ``opened`` and hold
    them until ``stop`` is set."""
    count = _raise_open_file_limit(wanted)
    sockets, started = [], time.monotonic()
    for i in range(count):
        if time.monotonic() > started + 60:  # bounded even where connections no longer open
            break
        if i % 100 == 0:  # at most 2,000 a second: the subject is how many, not how fast
            time.sleep(max(0.0, started + i / 2000 - time.monotonic()))
        try:
            # From four loopback addresses: 20,000 sockets would nearly fill one address's ephemeral ports.
            conn = socket.create_connection(where, timeout=5, source_address=(f"127.0.0.{2 + i % 4}", 0))
            sockets.append(conn)
            if i % 2:
                conn.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
        except OSError:  # the server closed it already: it was among the stalest
            pass
    opened.put(len(sockets))
    stop.wait(60)


def test_a_flood_of_idle_and_half_sent_connections_keeps_probes_in():
    """The issue's attack: 21,000 idle sockets (here half of them with an unfinished head) exhausted the
    service's open files and /health stopped answering. Now each new connection over DBF_MAX_CONNECTIONS
    takes the place of the stalest waiting one: the service holds at most that many, and answers."""
    processes = multiprocessing.get_context("fork")
    opened, stop = processes.Queue(), processes.Event()
    with running_service("--model-dir", HANDWRITTEN) as url:
        attacker = processes.Process(target=flood, args=(address(url), 21_000, opened, stop), daemon=True)
        attacker.start()
        most = 0.0
        with probing(url, "a flood of 21,000 idle and half-sent connections (as many as open files allow)"):
            while opened.empty() and attacker.is_alive():
                most = max(most, open_connections(url))
                time.sleep(0.2)
            count = opened.get(timeout=5)
        most = max(most, open_connections(url))
        stop.set()
        attacker.join(timeout=30)
        print(f"{count} connections opened; the service held at most {most:.0f}")
        assert most <= 1024 and count > 10_000
        answer = httpx.post(url + "/predict", json={"samples": random_samples(1)}, timeout=10)
        assert answer.status_code == 200
        assert float(_metric_line(url, 'dbf_connections_shed_total{state="waiting"}')) > 0


def _metric_line(url: str, series: str) -> str:
    text = get(url, "/metrics").decode()
    [line] = [line for line in text.splitlines() if line.startswith(series + " ")]
    return line.split()[1]


def worker_pids(service: Any) -> set[int]:
    """The process ids of the service's uvicorn workers (its children but multiprocessing's resource tracker;
    a worker that has died stays among them until the supervisor notices)."""
    pids = set()
    for children in Path(f"/proc/{service.pid}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.add(int(pid))
            except FileNotFoundError:  # gone meanwhile
                pass
    return pids


def served_connection(url: str) -> socket.socket:
    """A new connection that has had one request answered, and stays open."""
    conn = socket.create_connection(address(url), timeout=10)
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_one(conn).startswith(b"HTTP/1.1 200 ")
    return conn


def holder(url: str, conn: socket.socket, pids: set[int]) -> int | None:
    """Which of the processes ``pids`` holds the service's end of ``conn`` (Linux: from /proc)."""
    ports = (address(url)[1], conn.getsockname()[1])  # the service's end: its port, and ours as the peer's
    inode = next(
        fields[9]
        for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if (int(fields[1].rpartition(":")[2], 16), int(fields[2].rpartition(":")[2], 16)) == ports
    )
    for pid in pids:
        for descriptor in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(descriptor) == f"socket:[{inode}]":
                    return pid
            except FileNotFoundError:  # closed meanwhile
                pass
    return None


def test_a_killed_workers_connections_are_no_longer_counted():
    """Issue 29: after SIGKILL of one of two workers, dbf_open_connections still counted its connections
    (prometheus-client's file of a dead process is still read). Once the supervisor has replaced it, the
    live workers count theirs alone."""
    env = {"DBF_IDLE_TIMEOUT_SECONDS": "300"}  # no connection closes on its own meanwhile
    with (
        service_process("--model-dir", HANDWRITTEN, "--workers", "2", env=env) as (url, service),
        ExitStack() as sockets,
    ):
        workers = worker_pids(service)
        held: dict[socket.socket, int | None] = {}  # each open connection: the worker holding it
        deadline = time.monotonic() + 60
        while len(set(held.values()) & workers) < 2:  # both workers up, and each holding some
            assert time.monotonic() < deadline, "both workers did not take connections within 60 s"
            conn = sockets.enter_context(served_connection(url))
            held[conn] = holder(url, conn, workers)
            time.sleep(0.05)
        victim = next(iter(held.values()))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in worker_pids(service):  # until the supervisor has seen it go
            assert time.monotonic() < deadline, "the supervisor did not notice the killed worker"
            time.sleep(0.1)
        while True:  # until its replacement is up: it has taken a connection
            assert time.monotonic() < deadline, "the killed worker was not replaced within 60 s"
            live = worker_pids(service)
            conn = sockets.enter_context(served_connection(url))
            held[conn] = holder(url, conn, live)
            if held[conn] in live - workers:
                break
            time.sleep(0.05)
        still_open = [conn for conn, pid in held.items() if pid != victim]
        assert len(still_open) < len(held)
        assert open_connections(url) == len(still_open) + 1  # and the one asking for /metrics


def test_an_upgrade_request_is_answered_as_plain_http():
    """Issue 29: GET /health asking to Upgrade to a websocket got 400 "... `on_message_complete` callback
    error". The service speaks no other protocol: it answers such a request as plain HTTP and closes the
    connection (its parser reads nothing after an upgrade request), refuses one with a body it could not
    read, and never names its internals."""
    upgrades = {
        "websocket": b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        "h2c": b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
    }
    body = json.dumps({"samples": random_samples(1)}).encode()
    with running_service("--model-dir", HANDWRITTEN) as url:
        for name, fields in upgrades.items():
            for target, answered in ((b"GET /health", b'{"status":"ok"}'), (b"HEAD /health", b"")):
                with socket.create_connection(address(url), timeout=10) as conn:
                    conn.sendall(target + b" HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
                    answer = read_answer(conn)  # all of it: the service closes the connection
                head, _, content = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head.lower(), name
                assert content == answered, (name, answer)
            with socket.create_connection(address(url), timeout=10) as conn:
                conn.sendall(
                    b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + fields
                    + b"Content-Length: %d\r\n\r\n" % len(body)
                    + body
                )
                status, headers, error = error_of(read_answer(conn))
            assert (status, error["type"], headers["connection"]) == (400, "malformed_request", "close"), name
            assert "Upgrade" in error["message"]
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
            status, _, error = error_of(read_answer(conn))
        assert (status, error) == (
            400,
            {"type": "malformed_request", "message": "not a valid HTTP/1.1 request: invalid request target"},
        )


def test_a_head_refused_by_the_server_is_answered_in_the_format_of_the_route_asked_for():
    """The refusals the server writes itself (431, 414, 400, 408) came in v1's error format on /v2 routes
    too: tritonclient raised an InferenceServerException whose message was a dict. Each is now in the format
    of the route its request target names, as far as the target has arrived. And a request line that is not
    HTTP/1.0 or 1.1 (llhttp took HTTP/2.0, and HTTP/0.9's line without a version), or an HTTP/1.1 request
    without Host (RFC 9112, 3.2), was served as HTTP/1.1: now refused as not HTTP/1.1."""
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(101))

    def raw(head: bytes) -> bytes:
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(head)
            return read_answer(conn)

    with running_service("--model-dir", HANDWRITTEN, env={"DBF_HEADER_TIMEOUT_SECONDS": "1"}) as url:
        for target, form in ((b"POST /v2/models/handwritten/infer", str), (b"POST /predict", dict)):
            heads = {
                431: target + b" HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n",
                414: target + b"/" + b"a" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                400: target + b" HTTP/1.1\r\nHost: x\r\nContent-Type: a\r\nContent-Type: b\r\n\r\n",
                408: target + b" HTTP/1.1\r\nHost: x\r\n",  # never finished: the head's deadline ends it
            }
            for status, head in heads.items():
                got, _, error = error_of(raw(head))
                assert (got, type(error)) == (status, form), (target, status, error)
        refused = {
            b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n": "HTTP/2.0 is not served here",
            b"GET /health\r\n\r\n": "HTTP/0.9 is not served here",
            b"GET /health HTTP/1.1\r\n\r\n": "needs a Host header",
        }
        for head, message in refused.items():
            status, _, error = error_of(raw(head))
            assert (status, error["type"]) == (400, "malformed_request") and message in error["message"], head
        status, _, error = error_of(raw(b"GET /v2/health/ready HTTP/2.0\r\nHost: x\r\n\r\n"))
        assert status == 400 and "HTTP/2.0 is not served here" in error
        assert raw(b"GET /health HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")  # Host is 1.1's


def test_requests_pipelined_before_a_malformed_one_are_answered_first():
    """A valid request sent in the same read as a malformed one after it went unanswered: the 400 closed
    the connection first. RFC 9112 (9.3.2): answered in order, then the 400, then closed. So for a POST
    without Content-Length whose body follows at once (its body is taken for the next request)."""
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    cases = {
        health + b"GARBAGE\r\n\r\n": [200, 400],
        health * 2 + b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n": [
            200,
            200,
            400,
        ],
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n{}": [400, 400],
    }
    with running_service("--model-dir", HANDWRITTEN) as url:
        for sent, statuses in cases.items():
            with socket.create_connection(address(url), timeout=10) as conn:
                conn.sendall(sent)
                answers = read_answer(conn)
            assert [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)] == statuses, answers


def test_a_malformed_chunk_is_refused_at_once_with_a_400():
    """A chunked body whose chunk size is not hexadecimal: the parser fails mid-body, and the refusal waited
    for the answer to the request it belonged to, whose app waited for the rest of that body: a 408 after
    the body timeout, the connection held meanwhile (found by a probe). Refused when it arrives, and
    counted once, as what it is: the app, told the body will not come, also counted a client gone."""
    head = (
        b"POST /v1/models/handwritten/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    with running_service("--model-dir", HANDWRITTEN, env={"DBF_BODY_TIMEOUT_SECONDS": "600"}) as url:
        before = {reason: metric(url, "dbf_errors_total", reason=reason) for reason in COUNTED_AS}
        for body in (b"zz\r\n", b"1\r\n{\r\nzz\r\n"):
            with socket.create_connection(address(url), timeout=60) as conn:
                conn.sendall(head + body)
                status, headers, error = error_of(read_answer(conn))
            assert (status, error["type"], headers["connection"]) == (400, "malformed_request", "close"), body
            assert "chunk size" in error["message"], error
        assert httpx.get(url + "/health").status_code == 200
        counted = {
            reason: metric(url, "dbf_errors_total", reason=reason) - before[reason] for reason in COUNTED_AS
        }
        assert counted == {"malformed_request": 2, "client_disconnected": 0}


COUNTED_AS = ("malformed_request", "client_disconnected")


def test_only_an_http_1_1_client_expecting_100_continue_gets_a_100():
    """RFC 9110 (10.1.1): a server MUST ignore a 100-continue expectation in an HTTP/1.0 request, whose
    client need not read an interim answer; uvicorn wrote "HTTP/1.1 100 Continue" before the answer. An
    HTTP/1.1 client still gets its 100, then the answer."""
    body = json.dumps({"samples": random_samples(1)}).encode()
    with running_service("--model-dir", HANDWRITTEN) as url:
        for version, statuses in ((b"1.0", [200]), (b"1.1", [100, 200])):
            with socket.create_connection(address(url), timeout=10) as conn:
                conn.sendall(
                    b"POST /predict HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n" % version
                    + b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
                    + body
                )
                answer = read_answer(conn)
            assert [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)] == statuses, (version, answer)


def test_a_body_framed_two_ways_or_in_a_coding_not_undone_is_refused():
    """A header that says how to read the body, or Host, given twice (a proxy taking the other value would
    read another request, or route it elsewhere), and a transfer coding besides chunked (llhttp undid the
    chunking and the body was read still gzipped, or taken as plain JSON): 400, the connection closed. One
    of each, and chunked alone, are read."""
    body = json.dumps({"samples": random_samples(1)}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    sized = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    refused = {
        "Content-Type twice": (b"Content-Type: application/json\r\nContent-Type: text/plain\r\n" + sized),
        "Content-Encoding twice": (
            b"Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Encoding: identity\r\n"
            + sized
        ),
        "Inference-Header-Content-Length twice": (
            b"Content-Type: application/json\r\nInference-Header-Content-Length: 5\r\n"
            b"Inference-Header-Content-Length: 7\r\n" + sized
        ),
        # RFC 9112 section 3.2: a 400; the attack probe got 200 (a proxy routing on the other would differ)
        "Host twice": b"Host: y\r\nContent-Type: application/json\r\n" + sized,
        "gzip, chunked": b"Content-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        + chunked,
        "gzip then chunked": (
            b"Content-Type: application/json\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
        ),
    }
    taken = {
        "chunked": b"Content-Type: application/json\r\nTransfer-Encoding: Chunked \r\n\r\n" + chunked,
        "sized": b"Content-Type: application/json\r\n" + sized,
    }
    with running_service("--model-dir", HANDWRITTEN) as url:
        for name, rest in refused.items():
            with socket.create_connection(address(url), timeout=10) as conn:
                conn.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n" + rest)
                status, headers, error = error_of(read_answer(conn))
            assert (status, error["type"], headers["connection"]) == (400, "malformed_request", "close"), name
            assert ("twice" if "twice" in name else "Transfer-Encoding") in error["message"], (name, error)
        for name, rest in taken.items():
            with socket.create_connection(address(url), timeout=10) as conn:
                conn.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + rest)
                answer = read_answer(conn)
            assert answer.startswith(b"HTTP/1.1 200 "), (name, answer[:300])


def test_when_every_connection_is_receiving_a_body_a_probe_takes_the_stalest_place():
    """DBF_MAX_CONNECTIONS sockets all uploading slowly: a probe still gets in, in the place of the upload
    that started first (closed), and the service never holds more than the cap."""
    env = {"DBF_MAX_CONNECTIONS": "16"}
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )
    with running_service("--model-dir", HANDWRITTEN, env=env) as url, ExitStack() as sockets:
        uploads = []
        for _ in range(16):
            conn = sockets.enter_context(socket.create_connection(address(url), timeout=5))
            conn.sendall(head)
            uploads.append(conn)
            time.sleep(0.02)  # in order: the first is the stalest
        assert health_once(url) < 5
        uploads[0].settimeout(5)
        assert read_answer(uploads[0]) == b""  # closed, with nothing to say: its client is not reading
        assert open_connections(url) <= 16
        assert _metric_line(url, 'dbf_connections_shed_total{state="receiving"}') != "0.0"


def test_a_body_over_the_limit_is_refused_and_not_read():
    """A 413 on a declared 100 MB body, or on a streamed body over DBF_MAX_BODY_BYTES: the answer says
    Connection: close and the server reads no more (the issue: 10 GB read in 20 s, connection kept)."""
    env = {"DBF_MAX_BODY_BYTES": str(1024 * 1024)}
    post = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    declared = post + b"Content-Length: 100000000\r\n\r\n"
    streamed = post + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % 100_000_000  # one chunk of 100 MB
    with running_service("--model-dir", HANDWRITTEN, env=env) as url, probing(url, "100 MB bodies"):
        until = time.monotonic() + 3
        while time.monotonic() < until:  # for 3 s, for the prober to see it
            for head in (declared, streamed):
                with socket.create_connection(address(url), timeout=10) as conn:
                    started = time.monotonic()
                    sent = push(conn, head, 100_000_000, seconds=5)
                    conn.settimeout(5)
                    status, headers, error = error_of(read_answer(conn))
                    assert (status, error["type"], headers["connection"]) == (
                        413,
                        "payload_too_large",
                        "close",
                    )
                    assert sent < 32 * 1024 * 1024 and time.monotonic() - started < 5, sent


def test_a_body_a_little_over_the_limit_is_read_through_so_that_its_client_gets_the_413():
    """A client that sends its whole body before reading (http.client, httpx's async client) lost the 413
    to a body declared over DBF_MAX_BODY_BYTES: the connection closed on bytes unread, and its next send
    was reset. A body declared up to twice the limit is read and dropped: every byte is taken, the 413
    read, and the connection stays usable; one declared over twice the limit is still not read."""
    limit = 1 << 20
    post = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    post += b"Content-Length: %d\r\n\r\n"
    piece = b" " * 65536
    with running_service("--model-dir", HANDWRITTEN, env={"DBF_MAX_BODY_BYTES": str(limit)}) as url:
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(post % (2 * limit))
            for _ in range(2 * limit // len(piece)):  # as over a network: the answer comes before the end
                conn.sendall(piece)
                time.sleep(0.005)
            status, headers, error = error_of(read_one(conn))
            assert (status, error["type"], headers.get("connection")) == (413, "payload_too_large", None)
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_one(conn).startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(address(url), timeout=10) as conn:  # one byte more: not read
            conn.sendall(post % (2 * limit + 1) + piece)
            status, headers, error = error_of(read_answer(conn))
            assert (status, error["type"], headers["connection"]) == (413, "payload_too_large", "close")


def test_the_rest_of_a_body_answered_early_is_read_within_limits():
    """An answer before a body within the limit (415, 503 overloaded, 401): the rest is read and dropped,
    so that a client still sending gets its answer and the connection stays usable; but a rest trickled
    in is cut at DBF_IDLE_TIMEOUT_SECONDS."""
    env = {"DBF_IDLE_TIMEOUT_SECONDS": "1"}
    body = b"x" * 4_000_000

    async def uploads(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:  # anyio: loses an answer on a reset
            posts = (
                client.post(url + "/predict", content=body, headers={"content-type": "text/plain"})
                for _ in range(8)
            )
            return [r.status_code for r in await asyncio.gather(*posts)]

    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
    with running_service("--model-dir", HANDWRITTEN, env=env) as url:
        assert asyncio.run(uploads(url)) == [415] * 8
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(head % 5)
            assert read_one(conn).startswith(b"HTTP/1.1 415 ")
            conn.sendall(b"12345GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # the rest, then a request
            assert read_one(conn).startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(head % 500_000 + b"x")
            assert read_one(conn).startswith(b"HTTP/1.1 415 ")
            started = time.monotonic()
            conn.settimeout(0.2)
            assert read_answer_while_trickling(conn) == b""
            assert time.monotonic() - started < 4


# PIE's answer to 1024 samples of one view is 4.7 MB of JSON, its request 1.8 kB gzipped.
PIE_REQUEST = gzip.compress(json.dumps({"samples": [{"views": {"lbp": [0] * 256}}] * 1024}).encode())
PIE_HEAD = (
    b"POST /v1/models/pie/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Encoding: gzip\r\nContent-Length: %d\r\n" % len(PIE_REQUEST)
)


ANSWERED = 'dbf_request_duration_seconds_count{model="pie",protocol="rest"}'
UNREAD = 'dbf_connections_shed_total{state="unread"}'


def unread(url: str, connection: bytes = b"keep-alive") -> socket.socket:
    """A connection that asks for PIE's big answer and does not read it (its window a kilobyte or so)."""
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect: a small window
    conn.connect(address(url))
    conn.sendall(PIE_HEAD + b"Connection: %s\r\n\r\n" % connection + PIE_REQUEST)
    return conn


def dropped(conn: socket.socket) -> bool:
    """Whether the server has reset ``conn`` (what reached it before is read first, a few reads at most)."""
    conn.setblocking(False)
    try:
        for _ in range(16):
            if not conn.recv(65536):
                return True  # closed
    except BlockingIOError:
        return False  # open, its answer waiting
    except ConnectionResetError:
        return True
    return False


def test_an_answer_the_client_does_not_take_is_dropped_with_its_connection():
    """A client that asks and never reads: its answer stayed in the service's memory with the socket for
    good (a closing transport waits to send it all; the attack probe held 186 MB with 40 sockets, past
    every timeout). Now a client must take its answer at DBF_BODY_MIN_BYTES_PER_SECOND over each
    DBF_IDLE_TIMEOUT_SECONDS, or the connection is dropped; one that reads gets it all."""
    with serving(MODELS / "pie", idle_timeout_seconds=1) as url:
        shed = float(_metric_line(url, UNREAD))  # (the metrics are this process's, every test's)
        waiting = [unread(url, connection) for connection in (b"keep-alive", b"close")]
        with socket.create_connection(address(url), timeout=10) as reader:
            reader.sendall(PIE_HEAD + b"Connection: close\r\n\r\n" + PIE_REQUEST)
            whole = read_answer(reader)
        assert whole.startswith(b"HTTP/1.1 200 ") and len(whole) > 4_000_000, whole[:200]
        time.sleep(2.5)  # two windows of 1 s without taking anything
        assert [dropped(conn) for conn in waiting] == [True, True]
        assert float(_metric_line(url, UNREAD)) - shed == 2
        for conn in waiting:
            conn.close()


@pytest.mark.parametrize(
    ("idle", "rate", "least"),
    [(15.0, 1024, 15 * 1024), (math.inf, 1024, 1 << 62), (math.inf, 0, 1), (1.0, 0, 1)],
)
def test_what_a_client_must_take_of_its_answer_follows_the_settings_even_unbounded(idle, rate, least):
    """Bytes a window, from DBF_BODY_MIN_BYTES_PER_SECOND and DBF_IDLE_TIMEOUT_SECONDS (which may be
    infinite: an int of infinity, or of 0 x infinity, stopped the start)."""
    settings = Settings(idle_timeout_seconds=idle, body_min_bytes_per_second=rate)
    assert ConnectionLimits.from_settings(settings).min_send_bytes == least


def test_answers_not_taken_are_held_within_the_body_memory_budget():
    """Within the time a client has to take its answer, clients that take none: the answers held for them
    stay within DBF_BODY_MEMORY_BYTES (but the newest), the connections that have held theirs longest
    dropped first (the attack probe: 200 sockets of 1.8 kB requests took the service to 651 MB in 8 s)."""
    with serving(MODELS / "pie", body_memory_bytes=8 << 20) as url, ExitStack() as sockets:
        shed, answered = (float(_metric_line(url, series)) for series in (UNREAD, ANSWERED))
        waiting = []
        for _ in range(4):  # about 3 MB of each held (the rest in the kernel): more than two are over
            waiting.append(sockets.enter_context(unread(url)))
            answered += 1
            deadline = time.monotonic() + 10
            while float(_metric_line(url, ANSWERED)) < answered and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.1)  # encoded: written
        states = [dropped(conn) for conn in waiting]
        assert states[0] and not states[-1] and states == sorted(states, reverse=True), states
        assert float(_metric_line(url, UNREAD)) - shed == sum(states)


def test_an_upload_cut_by_the_end_of_the_graceful_shutdown_gets_a_503():
    """SIGTERM while a body is still arriving, slower than DBF_GRACEFUL_SHUTDOWN_SECONDS: the request is
    answered 503 shutting_down in the error format (uvicorn alone: a text/plain 500), and the exit is 0."""
    env = {"DBF_GRACEFUL_SHUTDOWN_SECONDS": "1"}
    body = json.dumps({"samples": random_samples(1)}).encode()
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with service_process("--model-dir", HANDWRITTEN, env=env) as (url, proc):
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(head + body[:10])
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            status, headers, error = error_of(read_answer(conn))
        assert (status, error["type"]) == (503, "shutting_down"), error
        assert headers["content-type"] == "application/json"
        assert proc.wait(timeout=30) == 0
