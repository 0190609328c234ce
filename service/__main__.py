"""``python -m service --host H --port P [--grpc-port G] [--workers N] [--model-dir DIR]``; defaults from
``DBF_*``."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from service.repository import ModelLoadError, load_repository
from service.server import supervise, uvicorn_options
from service.settings import Settings


def main(argv: list[str] | None = None) -> None:
    try:
        defaults = Settings()
    except ValidationError as error:  # e.g. an empty DBF_API_KEY: say which variable, not a traceback
        problems = "; ".join(
            f"DBF_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in error.errors()
        )
        sys.exit(f"error: invalid settings: {problems}")
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument(
        "--grpc-port", type=int, default=defaults.grpc_port, help="gRPC (Open Inference Protocol); 0: none"
    )
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument(
        "--model-dir", type=Path, default=defaults.model_dir, help="one model or a repository"
    )
    parser.add_argument("--log-level", default=defaults.log_level)
    args = parser.parse_args(argv)
    # Each worker process builds the app from the environment: hand the command line's choices on.
    os.environ["DBF_MODEL_DIR"] = str(args.model_dir)
    os.environ["DBF_GRPC_PORT"] = str(args.grpc_port)
    if args.workers > 1:
        # uvicorn's supervisor would swallow a worker's load failure and exit 0: verify and load once here
        # first. (A single worker's failure already stops uvicorn with a non-zero status.)
        try:
            load_repository(Settings())
        except ModelLoadError as error:
            print(f"error: model repository failed to load: {error}", file=sys.stderr)
            sys.exit(1)
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Separate processes, separate counters: prometheus-client's multiprocess mode adds them up.
        try:
            shared = tempfile.mkdtemp(prefix="dbf-metrics-")
        except OSError as error:  # e.g. a read-only root filesystem with nothing mounted on /tmp
            print(
                f"error: --workers {args.workers} needs a writable directory for the workers' shared metrics "
                f"({error}): mount one on /tmp (docker run --read-only --tmpfs /tmp) or set "
                "PROMETHEUS_MULTIPROC_DIR to one",
                file=sys.stderr,
            )
            sys.exit(1)
        atexit.register(shutil.rmtree, shared, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = shared
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


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    main()
