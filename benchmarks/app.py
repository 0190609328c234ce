"""The application's own cost per request, without HTTP: ``POST /predict`` called as an ASGI app by
concurrent clients in one event loop, against the yardstick (:mod:`benchmarks.yardstick`) called the same
way, in one run. Where ``benchmarks.service`` measures what users get, this isolates what the app spends
(routing, dependencies, parsing, micro-batching, fusion, rendering) from uvicorn and wrk, and ``--profile``
says where: the event loop's functions by own time (cProfile sees that thread only: small batches' heads
and fusion run on it and show, a batch run on the inference threads, a large one, shows as waiting).

    python -m benchmarks.app [--samples 1] [--concurrency 16] [--requests 8000] [--profile]

Prints microseconds per request (wall and process CPU) and the ratio of the service's requests per second
to the yardstick's, as ``benchmarks.service`` does; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import time
from pathlib import Path

from benchmarks.service import json_body
from benchmarks.yardstick import app as yardstick
from service.app import create_app
from service.server import guarded
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1, help="samples per request")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=8000, help="per run")
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs per app; medians printed")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "handwritten")
    parser.add_argument("--profile", action="store_true", help="cProfile one more run of the service")
    args = parser.parse_args()
    body = json_body(args.model_dir, args.samples)
    app = create_app(Settings(model_dir=args.model_dir, log_level="warning"))
    try:  # the event loop uvicorn runs the service on, where installed
        import uvloop
    except ImportError:
        asyncio.run(_compare(app, body, args))
    else:
        uvloop.run(_compare(app, body, args))


async def _compare(app, body: bytes, args: argparse.Namespace) -> None:
    service = guarded(app)  # as the server runs it: inference routes answered directly
    async with app.router.lifespan_context(app):
        runs: dict[str, list[tuple[float, float]]] = {"yardstick": [], "service": []}
        for served in (yardstick, service):  # warm-up: caches, thread pools
            await _load(served, body, args.concurrency, 50 * args.concurrency)
        for _ in range(args.repeat):
            for name, served in (("yardstick", yardstick), ("service", service)):
                runs[name].append(await _load(served, body, args.concurrency, args.requests))
        print(
            f"# app per request over ASGI, no HTTP: {args.samples} sample(s), concurrency "
            f"{args.concurrency}, median of {args.repeat} runs of {args.requests} requests"
        )
        wall = {name: statistics.median(w for w, _ in r) for name, r in runs.items()}
        for name, r in runs.items():
            cpu = statistics.median(c for _, c in r)
            print(f"{name:<10} {wall[name]:8.1f} us wall {cpu:8.1f} us cpu")
        print(f"ratio (service / yardstick requests per second): {wall['yardstick'] / wall['service']:.2f}")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            await _load(service, body, args.concurrency, args.requests)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)


async def _load(app, body: bytes, concurrency: int, requests: int) -> tuple[float, float]:
    """``requests`` POSTs of ``body`` by ``concurrency`` clients; microseconds per request (wall, CPU)."""

    async def client(count: int) -> None:
        for _ in range(count):
            await _post(app, body)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client(requests // concurrency) for _ in range(concurrency)))
    done = requests // concurrency * concurrency
    return (time.perf_counter() - wall) / done * 1e6, (time.process_time() - cpu) / done * 1e6


async def _post(app, body: bytes) -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/predict",
        "raw_path": b"/predict",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"benchmark"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    received = False
    status: list[int] = []

    async def receive() -> dict:
        nonlocal received
        if received:  # the app asks again only to watch for a disconnect: none comes
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"POST /predict answered {status}")


if __name__ == "__main__":
    main()
