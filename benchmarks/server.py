"""The cost of the connection-level limits (service/server.py) per request, against uvicorn's own httptools
protocol as the yardstick: the same requests parsed and answered by each protocol class, in one process,
through a stand-in transport and a minimal ASGI app, so that only the protocols' own work differs.

Cases: a keep-alive request of ~200 bytes of head (what wrk and most clients send), the same with 60 header
fields (~3 KB), a new connection per request (the connection cap's bookkeeping), and the head of an attack:
a 1 MB header field (refused at DBF_MAX_HEADER_BYTES by the guarded protocol; parsed in full by uvicorn's).
Prints CPU microseconds per request (this process's CPU time: a busy neighbour on a shared machine adds
little to it) and the ratio guarded / uvicorn (medians of alternated runs); asserts nothing.

    python -m benchmarks.server [--requests 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from service.server import ConnectionLimits, GuardedHttpProtocol
from service.settings import Settings

SMALL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
MANY = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(
    b"X-Field-%02d: %s\r\n" % (i, b"v" * 32) for i in range(60)
)
MANY += b"\r\n"
HUGE = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n"


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class Transport(asyncio.Transport):
    """Takes whatever the protocol writes; closing is remembered."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: bytes) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # the client takes every byte at once

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _protocols() -> dict[str, Any]:
    limits = ConnectionLimits.from_settings(Settings())
    return {"uvicorn": HttpToolsProtocol, "guarded": functools.partial(GuardedHttpProtocol, limits=limits)}


def run(kind: Any, request: bytes, requests: int, *, new_connections: bool) -> float:
    """CPU seconds per request for ``requests`` requests through protocol class ``kind``."""
    config = Config(app=app, lifespan="off", access_log=False, log_level="error")
    config.load()
    loop = asyncio.new_event_loop()
    state = ServerState()
    chunks = [request[i : i + 65536] for i in range(0, len(request), 65536)]  # as the socket reads it

    def connect() -> tuple[Any, Transport]:
        protocol = kind(config=config, server_state=state, app_state={}, _loop=loop)
        transport = Transport()
        protocol.connection_made(transport)
        return protocol, transport

    protocol, transport = connect()
    started = time.process_time()  # this process's CPU: what the protocols cost, whatever the neighbours do
    for _ in range(requests):
        if new_connections or transport.closing:
            protocol.connection_lost(None)
            protocol, transport = connect()
        for chunk in chunks:
            if transport.closing:
                break
            protocol.data_received(chunk)
        if state.tasks:
            loop.run_until_complete(asyncio.gather(*state.tasks))
    elapsed = time.process_time() - started
    protocol.connection_lost(None)
    loop.close()
    return elapsed / requests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cases = [
        ("keep-alive, 4 fields", SMALL, args.requests, False),
        ("keep-alive, 62 fields", MANY, args.requests, False),
        ("new connection each", SMALL, args.requests, True),
        ("1 MB header field", HUGE, max(1, args.requests // 100), False),
    ]
    print("# CPU per request: uvicorn's HttpToolsProtocol (yardstick) and GuardedHttpProtocol, medians of")
    print(f"# {args.repeat} alternated runs; ratio = guarded / uvicorn")
    print(f"{'case':<24}{'uvicorn us':>12}{'guarded us':>12}{'ratio':>8}")
    for name, request, requests, new_connections in cases:
        times: dict[str, list[float]] = {"uvicorn": [], "guarded": []}
        for _ in range(args.repeat):
            for label, kind in _protocols().items():
                times[label].append(run(kind, request, requests, new_connections=new_connections))
        yardstick, guarded = statistics.median(times["uvicorn"]), statistics.median(times["guarded"])
        print(
            f"{name:<24}{yardstick * 1e6:>12.1f}{guarded * 1e6:>12.1f}{guarded / yardstick:>8.2f}", flush=True
        )


if __name__ == "__main__":
    main()
