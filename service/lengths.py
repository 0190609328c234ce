"""Byte lengths declared in request headers (``Content-Length``, the Open Inference Protocol's
``Inference-Header-Content-Length``), read one way wherever they are read (:mod:`service.api.body`,
:mod:`service.v2`, :mod:`service.server`)."""

from __future__ import annotations

# More significant digits than this is a length over any body this service takes; int() of thousands of
# digits would raise rather than refuse.
MAX_DIGITS = 18
# What a longer number reads as: over every limit, and an int that costs nothing to compare.
BEYOND = 10**MAX_DIGITS


def declared_length(text: str) -> int | None:
    """The number of bytes ``text`` spells (ASCII digits, leading zeros allowed; :data:`BEYOND` for a number
    of more than :data:`MAX_DIGITS` digits), or None if it spells none (a sign, a space, other digits)."""
    if not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0") or "0"
    return BEYOND if len(significant) > MAX_DIGITS else int(significant)
