"""A request's body, read defensively: its declared length checked before anything arrives, its bytes bounded
(``DBF_MAX_BODY_BYTES``, decompressed too), its arrival timed (``DBF_BODY_TIMEOUT_SECONDS`` and
``DBF_BODY_MIN_BYTES_PER_SECOND``), and its memory reserved in the data plane's budget
(``DBF_BODY_MEMORY_BYTES``) as its bytes arrive, until the answer is sent. ``Content-Encoding: gzip`` and
``deflate`` bodies (as tritonclient's ``request_compression_algorithm`` sends them) are decompressed a piece
at a time, each piece's memory reserved in the budget before it is produced, never past the size limit.
"""

from __future__ import annotations

import asyncio
import re
import zlib

from starlette.requests import ClientDisconnect, Request

from service.dataplane import INLINE_BODY_BYTES, DataPlane
from service.errors import InvalidInput, PayloadTooLarge, RequestTimeout, UnsupportedMediaType
from service.lengths import declared_length

_WBITS = {"gzip": (16 + zlib.MAX_WBITS,), "deflate": (zlib.MAX_WBITS, -zlib.MAX_WBITS)}  # zlib, else raw
_GZIP_MAGIC = b"\x1f\x8b"  # how each gzip member begins
_NOT_ZERO = re.compile(rb"[^\x00]")  # gzip members may be padded with zero bytes (gzip.decompress skips them)
# Compressed bytes first given to a stream's decompressor, doubled each time it needs more: what it leaves
# unread after its end is copied, so a body of many tiny gzip members must not cost a big copy for each.
_FIRST_FEED_BYTES = 256
# Inflated pieces grow fourfold from INLINE_BODY_BYTES up to this: a body reserves little ahead of what it
# holds, and a big one takes a few trips to the codec thread.
_MOST_PIECE_BYTES = 1 << 20
# A body may take this long before its average rate counts (a client's warm-up, a pause on a slow link).
_RATE_GRACE_SECONDS = 10.0

BODY_REFUSED = "dbf.body_refused"
"""The request scope's key the server sets where it refused a body itself, mid-way (a malformed chunk): it
has answered and counted that refusal, and tells the app its client is gone."""


class BodyRefusedByServer(ClientDisconnect):
    """The body will not come: the server refused it and answered (:data:`BODY_REFUSED`)."""


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
            self.plane.bodies.reserve(size - self.reserved, body=size)
            self.reserved = size

    def _keep(self, size: int) -> None:
        """Hold ``size`` bytes of the budget from now on, no more (what a decompressed body still holds)."""
        self.plane.bodies.release(self.reserved - size)
        self.reserved = size

    def _limit(self) -> int:
        """The body limit the models served make (:func:`service.repository.body_limit`), or before they
        are loaded ``DBF_MAX_BODY_BYTES``."""
        repository = self.plane.repository
        return self.plane.settings.max_body_bytes if repository is None else repository.max_body_bytes

    async def _read(self) -> bytes:
        request = self.request
        declared = content_length(request.headers.get("content-length"), self._limit())
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        encoding = "gzip" if encoding == "x-gzip" else encoding  # the same (RFC 9110 8.4.1.3)
        if encoding != "identity" and encoding not in _WBITS:
            raise UnsupportedMediaType(
                f"Content-Encoding {encoding[:40]!r} is not supported; send identity, gzip or deflate"
            )
        if declared is not None:
            # Room is held for the bytes that have come, not for those declared: a declared length reserved
            # up front let four sockets that sent a byte each shut every body out (503) for 10 s at a time.
            # A body the whole budget cannot hold is refused now (413), unread.
            self.plane.bodies.reserve(0, body=declared)
        body = await self._receive()
        if encoding == "identity":
            return body
        body = await self._inflate(body, encoding)
        self._keep(len(body))  # the compressed bytes went as ``body`` took the decompressed ones
        return body

    async def _receive(self) -> bytes:
        """The body's bytes as they arrive, reserved as they do, in time."""
        request, reserve, settings = self.request, self._reserve, self.plane.settings
        limit = self._limit()
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
                        raise BodyRefusedByServer() if BODY_REFUSED in request.scope else ClientDisconnect()
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
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _inflate(self, data: bytes, encoding: str) -> bytes:
        """``data`` decompressed a piece at a time, the room for each piece reserved before it is produced
        (503 overloaded when the budget has none), the first on the event loop when ``data`` is small
        (it may inflate a hundredfold), the others on the codec thread."""
        plane = self.plane
        inflater = Inflater(data, encoding, self._limit())
        small = len(data) <= INLINE_BODY_BYTES // 8
        pieces: list[bytes] = []
        room = INLINE_BODY_BYTES
        try:
            while not inflater.done:
                self._reserve(len(data) + inflater.size + room)
                pieces.append(await plane.run(inflater.inflate, room, inline=small and not pieces))
                room = min(4 * room, _MOST_PIECE_BYTES)
            if len(pieces) == 1:
                return pieces[0]
            self._reserve(len(data) + 2 * inflater.size)  # the pieces, and the body they make
            return b"".join(pieces)
        except BaseException:
            pieces.clear()  # now: a traceback would keep them as long as it keeps this frame
            raise


class Inflater:
    """A gzip body (every member, as :func:`gzip.decompress` reads them) or a deflate one (zlib, else raw)
    decompressed a piece at a time, so that its memory can be reserved before it exists; refused with 413
    as soon as it would exceed ``limit`` (a compressed body of a few kilobytes can stand for gigabytes),
    with 400 if it is not such data, ends too soon, or has other bytes after its end."""

    __slots__ = ("_data", "_decompressor", "_encoding", "_fed", "_feed", "_limit", "_wbits", "done", "size")

    def __init__(self, data: bytes, encoding: str, limit: int) -> None:
        self._data, self._encoding, self._limit = memoryview(data), encoding, limit
        self._wbits = _WBITS[encoding]
        self._decompressor = zlib.decompressobj(self._wbits[0])
        self._fed, self._feed = 0, _FIRST_FEED_BYTES  # bytes of data given to decompressors; the next feed
        self.done, self.size = False, 0  # all read; bytes produced

    def inflate(self, most: int) -> bytes:
        """The next at most ``most`` bytes, from at most about ``most`` more bytes of compressed data (a
        piece's work is bounded whatever the data: tiny gzip members, empty blocks); ``done`` once all is
        read."""
        most = min(most, self._limit + 1 - self.size)  # a byte past the limit is enough to refuse the body
        pieces: list[bytes] = []
        share, taken = most, 0
        while most > 0 and not self.done:
            decompressor = self._decompressor
            data = decompressor.unconsumed_tail
            if not data:
                if taken >= share:
                    break  # this piece's share of the compressed data: the next piece goes on
                data = self._data[self._fed : self._fed + min(self._feed, share - taken)]
                self._fed, self._feed, taken = self._fed + len(data), 2 * self._feed, taken + len(data)
            try:
                piece = decompressor.decompress(data, most)
            except zlib.error:
                self._not_compressed()
                continue
            pieces.append(piece)
            most, self.size = most - len(piece), self.size + len(piece)
            if decompressor.eof:
                self._after_stream(len(decompressor.unused_data))
            elif not piece and not data:
                raise InvalidInput(f"the {self._encoding} body ends before its compressed stream does")
        if self.size > self._limit:
            limit = self._limit
            raise PayloadTooLarge(too_large(f"body over {limit} bytes once decompressed", limit))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _not_compressed(self) -> None:
        """Data a decompressor refused: a deflate body that is no zlib stream may be a raw one (tried from
        its start, if nothing came out yet); anything else is a 400."""
        if self.size == 0 and len(self._wbits) > 1:
            self._wbits = self._wbits[1:]
            self._decompressor = zlib.decompressobj(self._wbits[0])
            self._fed, self._feed = 0, _FIRST_FEED_BYTES
            return
        encoding = self._encoding
        raise InvalidInput(f"the body is not {encoding}-compressed data (Content-Encoding: {encoding})")

    def _after_stream(self, unused: int) -> None:
        """After a stream's end (``unused`` of the bytes given were not its): the body's end, another gzip
        member (after zero bytes of padding, if any), or a 400 for the bytes that follow."""
        self._fed -= unused
        if self._encoding == "gzip":
            found = _NOT_ZERO.search(self._data, self._fed)
            self._fed = len(self._data) if found is None else found.start()
        rest = len(self._data) - self._fed
        if not rest:
            self.done = True
        elif self._encoding == "gzip" and self._data[self._fed : self._fed + 2] == _GZIP_MAGIC:
            self._decompressor, self._feed = zlib.decompressobj(self._wbits[0]), _FIRST_FEED_BYTES
        else:
            raise InvalidInput(
                f"the {self._encoding} body has {rest} bytes after the end of its compressed data"
            )


def _allowed(received: int, timeout: float, min_rate: int) -> float:
    """Seconds from its start a body may take to bring its next bytes, having brought ``received``."""
    return timeout if not min_rate else min(timeout, _RATE_GRACE_SECONDS + received / min_rate)


def content_length(text: str | None, limit: int) -> int | None:
    """The declared body length (None if not declared), refused with 413 when over ``limit``."""
    if text is None:
        return None
    digits = text.strip()
    length = declared_length(digits)
    if length is None:
        raise InvalidInput(f"Content-Length {digits[:40]!r} is not a number of bytes")
    if length > limit:
        significant = digits.lstrip("0")
        shown = significant if len(significant) <= 40 else f"a {len(significant)}-digit number of"
        raise PayloadTooLarge(too_large(f"body of {shown} bytes", limit))
    return length


def too_large(what: str, limit: int) -> str:
    return f"{what}; at most {limit} are accepted (DBF_MAX_BODY_BYTES)"
