"""``python -m service --host H --port P [--grpc-port G] [--workers N|auto] [--model-dir DIR]
[--device auto|cuda|cpu]``; defaults from ``DBF_*``."""

from __future__ import annotations

import os
import signal


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _exit_while_importing(signum: int, frame: object) -> None:
    # Nothing is open or written yet. An exception raised here, within an extension module's own
    # initialisation (onnxruntime's), became its ImportError: a traceback and exit 1 (a test saw it once).
    os._exit(0)


if __name__ == "__main__":
    # Before the imports below (a second or more): PID 1 in a container gets no signal it has no handler
    # for, so a `docker stop` (or a pod deleted) while they ran was dropped, and the process killed after
    # the whole stop timeout. main() hands SIGTERM to _exit_cleanly, and uvicorn takes over while it serves.
    signal.signal(signal.SIGTERM, _exit_while_importing)

import argparse
import atexit
import ipaddress
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from service.repository import ModelLoadError, handed_placements, load_repository
from service.server import supervise, uvicorn_options
from service.settings import Settings, available_cores, session_threads, unknown_variables


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _exit_cleanly)  # imports done: an orderly exit from here on
    defaults = _settings()
    args = _arguments(argv, defaults)
    _warn(args, defaults)
    _hand_on(args)
    if args.workers > 1:
        _load_before_the_workers()
        _share_metrics(args.workers)
    _serve(args, defaults)


def _settings() -> Settings:
    """The ``DBF_*`` settings, or an exit naming each variable that is wrong (never its value: a key)."""
    unknown = unknown_variables(os.environ)
    if unknown:
        sys.exit(
            f"error: {', '.join(unknown)}: not a setting of the service, so it would be ignored; correct its "
            "name or unset it (the settings: docs/operations/configuration.md)"
        )
    try:
        return Settings()
    except ValidationError as error:  # e.g. an empty DBF_API_KEY: say which variable, not a traceback
        # The setting (a union's members name themselves after it in the place), never its value (a key).
        problems = "; ".join(
            dict.fromkeys(f"DBF_{str(e['loc'][0]).upper()}: {e['msg']}" for e in error.errors())
        )
        sys.exit(f"error: invalid settings: {problems}")


def _arguments(argv: list[str] | None, defaults: Settings) -> argparse.Namespace:
    """The command line, each flag's default its ``DBF_*`` variable's; ``--workers auto`` resolved."""
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=_port(1), default=defaults.port, help="HTTP port (1 to 65535)")
    parser.add_argument(
        "--grpc-port",
        type=_port(0),
        default=defaults.grpc_port,
        help="gRPC (Open Inference Protocol) port (1 to 65535); 0: none",
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=defaults.workers,
        help="worker processes, or auto: one per core this process may use (affinity, cgroup CPU quota)",
    )
    parser.add_argument(
        "--model-dir", type=_model_dir, default=defaults.model_dir, help="one model or a repository"
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default=defaults.device,
        help="where the heads run: auto (each batch where it ran fastest at load), cuda or cpu",
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,
        default=defaults.log_level,
        choices=["debug", "info", "warning", "error", "critical"],
    )
    args = parser.parse_args(argv)
    _check_host(parser, args.host)
    if args.grpc_port == args.port:
        parser.error(f"--grpc-port {args.grpc_port} is --port's too: give gRPC a port of its own, or 0")
    if args.workers == "auto":
        args.workers = available_cores()
    return args


def _check_host(parser: argparse.ArgumentParser, host: str) -> None:
    """Refuse a host nothing can listen on, before anything loads: uvicorn read an empty one as every
    interface, and one that does not resolve (``[::1]``, a typo) failed only once the models had loaded,
    in a message that named DBF_GRPC_PORT."""
    if not host.strip():
        parser.error("--host '' (or DBF_HOST): empty; give an address to listen on (127.0.0.1, 0.0.0.0)")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        reason = error.strerror if isinstance(error, socket.gaierror) else "not a host name"
        parser.error(
            f"--host {host!r} (or DBF_HOST): not an address to listen on ({reason}); give an IP address "
            "(127.0.0.1, 0.0.0.0, ::1, without brackets) or a name this machine resolves"
        )


def _warn(args: argparse.Namespace, defaults: Settings) -> None:
    """Say what the settings leave open (no key on a reachable host) or cut (a session's threads)."""
    if defaults.api_key is None and not _loopback(args.host):
        print(
            f"warning: listening on {args.host} without DBF_API_KEY: any client that reaches the port can "
            "ask for predictions (admin endpoints answer this host only); set a key, see "
            "docs/operations/security.md",
            file=sys.stderr,
        )
    threads = session_threads(defaults.onnx_threads, args.workers, available_cores())
    if threads < defaults.onnx_threads:
        print(
            f"warning: DBF_ONNX_THREADS={defaults.onnx_threads} with {args.workers} worker(s) on "
            f"{available_cores()} core(s) would run more threads than cores: each session gets {threads} "
            "(at most the cores over the workers)",
            file=sys.stderr,
        )


def _hand_on(args: argparse.Namespace) -> None:
    """Each worker process builds the app from the environment: the command line's choices are handed on
    there (a flag beats its DBF_* variable, for the gRPC server's address too)."""
    os.environ["DBF_HOST"] = args.host
    os.environ["DBF_PORT"] = str(args.port)
    os.environ["DBF_MODEL_DIR"] = str(args.model_dir)
    os.environ["DBF_DEVICE"] = args.device
    os.environ["DBF_GRPC_PORT"] = str(args.grpc_port)
    os.environ["DBF_LOG_LEVEL"] = args.log_level  # the service's own loggers too, not only uvicorn's
    os.environ["DBF_WORKERS"] = str(args.workers)  # each worker knows it has siblings (admin reload)


def _load_before_the_workers() -> None:
    """Verify and load the repository once, here: uvicorn's supervisor would swallow a worker's load
    failure and exit 0 (a single worker's failure already stops uvicorn with a non-zero status). The
    placements measured here, alone on the box, are handed to the workers."""
    try:
        repository = load_repository(Settings())
    except ModelLoadError as error:
        print(f"error: model repository failed to load: {error}", file=sys.stderr)
        sys.exit(1)
    os.environ["DBF_PLACEMENT"] = handed_placements(repository)
    del repository  # its sessions go before the workers start (a CUDA context, if made, stays)


def _share_metrics(workers: int) -> None:
    """Separate processes, separate counters: prometheus-client's multiprocess mode adds them up, in a
    directory of their own unless PROMETHEUS_MULTIPROC_DIR names one."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    try:
        shared = tempfile.mkdtemp(prefix="dbf-metrics-")
    except OSError as error:  # e.g. a read-only root filesystem with nothing mounted on /tmp
        print(
            f"error: --workers {workers} needs a writable directory for the workers' shared metrics "
            f"({error}): mount one on /tmp (docker run --read-only --tmpfs /tmp) or set "
            "PROMETHEUS_MULTIPROC_DIR to one",
            file=sys.stderr,
        )
        sys.exit(1)
    atexit.register(shutil.rmtree, shared, ignore_errors=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = shared


def _serve(args: argparse.Namespace, defaults: Settings) -> None:
    """Run uvicorn (its supervisor with several workers) until a stop signal."""
    # Graceful shutdown: on SIGTERM (or Ctrl-C) uvicorn stops accepting, lets in-flight requests finish
    # (up to DBF_GRACEFUL_SHUTDOWN_SECONDS), then raises the signal again under the handlers it found.
    # These make that a clean exit 0, which is what docker stop and Kubernetes expect of a deliberate stop.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, _exit_cleanly)
    options = dict(
        app="service.server:application",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        timeout_graceful_shutdown=defaults.graceful_shutdown_seconds,
        **uvicorn_options(defaults),  # connection-level limits: header size, timeouts, connection cap
    )
    if args.workers > 1:
        supervise(uvicorn.Config(**options))  # uvicorn's supervisor; it also forgets dead workers' gauges
    else:
        uvicorn.run(**options)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _port(lowest: int) -> Callable[[str], int]:
    """An argparse type: a TCP port from ``lowest`` (0: none) to 65535."""

    def port(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = -1
        if not lowest <= number <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port ({lowest} to 65535)")
        return number

    return port


def _model_dir(text: str) -> Path:
    """An argparse type: a path that is not empty (``Path("")`` is the working directory, unasked, and one of
    blanks failed in each worker's settings, a traceback)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty: give the model repository's path")
    return Path(text)


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        workers = int(text)
    except ValueError:
        workers = 0
    if workers < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of workers (1 or more) nor auto")
    return workers


if __name__ == "__main__":
    main()
