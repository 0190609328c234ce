"""A request's body, read defensively: its declared length checked before anything arrives, its bytes bounded
(``DBF_MAX_BODY_BYTES``, decompressed too), its arrival timed (``DBF_BODY_TIMEOUT_SECONDS`` and
``DBF_BODY_MIN_BYTES_PER_SECOND``), and its memory reserved in the data plane's budget
(``DBF_BODY_MEMORY_BYTES``) until the answer is sent. ``Content-Encoding: gzip`` and ``deflate`` bodies (as
tritonclient's ``request_compression_algorithm`` sends them) are decompressed, never past the size limit.
"""

from __future__ import annotations

import asyncio
import zlib

from starlette.requests import ClientDisconnect, Request

from service.dataplane import INLINE_BODY_BYTES, DataPlane
from service.errors import InvalidInput, PayloadTooLarge, RequestTimeout, UnsupportedMediaType

# A length of more digits than this is over any limit (and int() of thousands of digits raises).
_MAX_DIGITS = 18
_WBITS = {"gzip": (16 + zlib.MAX_WBITS,), "deflate": (zlib.MAX_WBITS, -zlib.MAX_WBITS)}  # zlib, else raw
# A body may take this long before its average rate counts (a client's warm-up, a pause on a slow link).
_RATE_GRACE_SECONDS = 10.0


class Received:
    """``async with Received(request, plane) as body``: the whole body (decompressed), its bytes held in the
    body budget until the block ends. (A class: an async generator's machinery cost a one-sample request
    several microseconds.)"""

    __slots__ = ("plane", "request", "reserved")

    def __init__(self, request: Request, plane: DataPlane) -> None:
        self.request, self.plane, self.reserved = request, plane, 0

    async def __aenter__(self) -> bytes:
        try:
            return await self._read()
        except BaseException:
            self.plane.bodies.release(self.reserved)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self.plane.bodies.release(self.reserved)

    def _reserve(self, size: int) -> None:
        if size > self.reserved:
            self.plane.bodies.reserve(size - self.reserved)
            self.reserved = size

    async def _read(self) -> bytes:
        request, plane, reserve = self.request, self.plane, self._reserve
        settings = plane.settings
        limit = settings.max_body_bytes
        declared = content_length(request.headers.get("content-length"), limit)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity" and encoding not in _WBITS:
            raise UnsupportedMediaType(
                f"Content-Encoding {encoding[:40]!r} is not supported; send identity, gzip or deflate"
            )
        if declared is not None:
            reserve(declared)
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout, min_rate = settings.body_timeout_seconds, settings.body_min_bytes_per_second
        # One deadline for the whole body, moved on as bytes arrive: the overall limit, or the moment the
        # bytes so far fall below the minimum rate, whichever comes first. (asyncio's own timeout: a tenth
        # of the cost of anyio's cancel scope, which a one-sample request felt.)
        try:
            async with asyncio.timeout_at(started + _allowed(0, timeout, min_rate)) as arrival:
                more = True
                while more:
                    message = await request.receive()
                    if message["type"] == "http.disconnect":
                        raise ClientDisconnect()
                    chunk, more = message.get("body", b""), message.get("more_body", False)
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(too_large(f"body over {limit} bytes", limit))
                    reserve(size)  # a body of undeclared length (chunked) reserves as it arrives
                    chunks.append(chunk)
                    if more and min_rate:
                        arrival.reschedule(started + _allowed(size, timeout, min_rate))
        except TimeoutError:
            raise RequestTimeout(
                f"the body did not arrive in time: {size} bytes in {loop.time() - started:.1f} s "
                f"(DBF_BODY_TIMEOUT_SECONDS {timeout:g}, DBF_BODY_MIN_BYTES_PER_SECOND {min_rate})"
            ) from None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if encoding != "identity":
            small = len(body) <= INLINE_BODY_BYTES // 8  # it may inflate a hundredfold
            body = await plane.run(decompress, body, encoding, limit, inline=small)
            reserve(size + len(body))
        return body


def _allowed(received: int, timeout: float, min_rate: int) -> float:
    """Seconds from its start a body may take to bring its next bytes, having brought ``received``."""
    return timeout if not min_rate else min(timeout, _RATE_GRACE_SECONDS + received / min_rate)


def content_length(text: str | None, limit: int) -> int | None:
    """The declared body length (None if not declared), refused with 413 when over ``limit``."""
    if text is None:
        return None
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidInput(f"Content-Length {digits[:40]!r} is not a number of bytes")
    significant = digits.lstrip("0") or "0"
    if len(significant) > _MAX_DIGITS or int(significant) > limit:
        shown = significant if len(significant) <= 40 else f"a {len(significant)}-digit number of"
        raise PayloadTooLarge(too_large(f"body of {shown} bytes", limit))
    return int(significant)


def too_large(what: str, limit: int) -> str:
    return f"{what}; at most {limit} are accepted (DBF_MAX_BODY_BYTES)"


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate (zlib, or raw) body, refused with 413 as soon as it would exceed ``limit``: a
    compressed body of a few kilobytes can stand for gigabytes."""
    for wbits in _WBITS[encoding]:
        decompressor = zlib.decompressobj(wbits)
        try:
            out = decompressor.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or decompressor.unconsumed_tail:
            raise PayloadTooLarge(too_large(f"body over {limit} bytes once decompressed", limit))
        if not decompressor.eof:
            raise InvalidInput(f"the {encoding} body ends before its compressed stream does")
        return out
    raise InvalidInput(f"the body is not {encoding}-compressed data (Content-Encoding: {encoding})")
