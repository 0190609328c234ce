"""The real service under uvicorn on a loopback port, talked to over HTTP: in this process (a server thread:
no start-up cost, for black-box tests of what it answers) or as its own process (``python -m service``: for
start-up, signals and worker processes)."""

from __future__ import annotations

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

import httpx
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
    *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`running_service`, yielding the process too (to signal it)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The log goes to a file, not a pipe: a pipe nobody reads fills up (access logs) and blocks the service.
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), *args],
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


def start_and_fail(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m service ARGS`` on a free port, expecting it to refuse to start; returns the process."""
    command = [sys.executable, "-m", "service", "--port", str(free_port()), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )
