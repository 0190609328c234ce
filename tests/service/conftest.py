"""The real service under uvicorn on a loopback port, talked to over HTTP: in this process (a server thread:
no start-up cost, for black-box tests of what it answers) or as its own process (``python -m service``: for
start-up, signals and worker processes)."""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn

from service.app import create_app
from service.server import guarded, uvicorn_options
from service.settings import Settings

MODELS = Path(__file__).resolve().parents[2] / "models"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_service(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> Iterator[str]:
    """Run ``python -m service`` on a free loopback port until the block ends; yields its base URL."""
    with service_process(*args, env=env, timeout=timeout) as (url, _):
        yield url


@contextmanager
def service_process(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    cgroup: Path | None = None,
    under: tuple[str, ...] = (),
) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`running_service`, yielding the process too (to signal it, or read its memory); in the control
    group ``cgroup`` if one is given (joined before the service allocates anything); run by the command
    ``under`` if one is given (``setpriv ...``: with fewer privileges)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [*under, sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), *args]
    if cgroup is not None:
        command = ["sh", "-c", f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"', "sh", *command]
    # The log goes to a file, not a pipe: a pipe nobody reads fills up (access logs) and blocks the service.
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"service exited with {proc.returncode}:\n{log.read()}")
                try:
                    httpx.get(f"{url}/health", timeout=1.0)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"service did not answer on {url} within {timeout} s") from None
                    time.sleep(0.1)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def serving(model_dir: Path = MODELS, **settings: object) -> Iterator[str]:
    """The app on uvicorn in a thread of this process, on a free loopback port, until the block ends; yields
    its base URL. ``settings`` are :class:`~service.settings.Settings` fields (``max_samples=64``...). The
    server is the one ``python -m service`` runs: the guarded protocol, the wrapped app."""
    configured = Settings(model_dir=model_dir, log_level="warning", **settings)
    port = free_port()
    app, options = guarded(create_app(configured)), uvicorn_options(configured)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, name=f"uvicorn:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the in-process service stopped during start-up (see the log above)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the in-process service did not start on port {port} within 60 s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@functools.cache
def _training_ranges(model_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from training.export import training_ranges

    return training_ranges(model_dir)


def in_range_samples(
    n: int, seed: int = 0, model_dir: Path = MODELS / "handwritten", views=None
) -> list[dict]:
    """``n`` v1 samples of random features within each view's training range (or of ``views`` only):
    features in [0, 1) lie outside several HandWritten views' ranges, which are then fused as missing."""
    rng = np.random.default_rng(seed)
    ranges = _training_ranges(model_dir)
    names = list(ranges) if views is None else list(views)
    return [
        {"views": {v: (ranges[v][0] + rng.random(ranges[v][0].size) * ranges[v][1]).tolist() for v in names}}
        for _ in range(n)
    ]


def start_and_fail(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m service ARGS`` on a free port (in ``cwd``, default this one), expecting it to refuse
    to start; returns the process."""
    command = [sys.executable, "-m", "service", "--port", str(free_port()), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}, cwd=cwd
    )


# --- attacks: /health probed while they run -------------------------------------------------------------

# Loose: a starved event loop shows as seconds; the goal (issue 17) is 100 ms, printed by each attack test.
HEALTH_P99_BOUND = 1.0


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def read_answer(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    answer = b""
    try:
        while chunk := conn.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def read_one(conn: socket.socket) -> bytes:
    """One whole answer (head and a Content-Length body) off a connection that stays open, without the start
    of an answer to a request pipelined after it; what came before the server closed it, if it did."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = conn.recv(65536)
        if not chunk:
            return answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (int(f.split(b":")[1]) for f in head.lower().split(b"\r\n") if f.startswith(b"content-length:")), None
    )
    while length is not None and len(body) < length and (chunk := conn.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body[:length]


def get(url: str, path: str) -> bytes:
    """``GET path`` on a new connection, raw (an HTTP client's set-up would hold the GIL, and the
    prober's thread waiting for it would time the test, not the service)."""
    with socket.create_connection(address(url), timeout=5) as conn:
        conn.sendall(b"GET %s HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n" % path.encode())
        return read_answer(conn)


def _probe(url: str, started: Any, stop: Any, results: Any) -> None:
    """The prober's loop (a child process): ``/health`` every 50 ms until ``stop``, then the latencies."""
    latencies = []
    while not stop.is_set():
        latencies.append(health_once(url))
        started.set()  # the attack begins once the service has been probed
        stop.wait(0.05)
    results.put(latencies)


def health_once(url: str) -> float:
    """Seconds for ``GET /health`` on a new connection (inf when it fails or takes over 5 s)."""
    started = time.perf_counter()
    try:
        ok = get(url, "/health").startswith(b"HTTP/1.1 200 ")
    except OSError:
        ok = False
    return time.perf_counter() - started if ok else math.inf


@contextmanager
def probing(url: str, attack: str) -> Iterator[list[float]]:
    """Probe ``/health`` every 50 ms while the block runs; prints the p99 and checks it loosely. The prober
    is a process of its own: a thread here would wait for this process's GIL, held by the attack's client,
    and time the attacker rather than the service."""
    latencies: list[float] = []
    context = multiprocessing.get_context("spawn")
    started, stop, results = context.Event(), context.Event(), context.Queue()
    prober = context.Process(target=_probe, args=(url, started, stop, results), daemon=True)
    prober.start()
    assert started.wait(60), "the /health prober did not start"
    try:
        yield latencies
    finally:
        stop.set()
        latencies.extend(results.get(timeout=60))
        prober.join(timeout=10)
    p99 = sorted(latencies)[max(0, math.ceil(0.99 * len(latencies)) - 1)]
    most = max(latencies)
    print(
        f"\n{attack}: /health p99 {p99 * 1000:.1f} ms, max {most * 1000:.0f} ms, over {len(latencies)} probes"
    )
    assert latencies and p99 < HEALTH_P99_BOUND, (attack, sorted(latencies)[-5:])
