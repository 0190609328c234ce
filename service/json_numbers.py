"""JSON bodies read by simdjson, their arrays of numbers straight into float64 arrays: the codecs' fast paths.

msgspec and orjson make a Python float of every number (166,000 for a 256-sample HandWritten body: most of
its decode's time), and numpy's text parsers are slower still; simdjson parses the
document in C and ``as_buffer`` copies an array's numbers out as doubles. What it cannot read (not JSON, a
number beyond float64, nesting deeper than 1024) comes back None: the codec's other path decides and words
the error. Server side only: clients never decode requests.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import simdjson

T = TypeVar("T")

# A parser keeps the buffers of the largest document it read (about twice its size), and allocating them
# costs about as much as the parse: parsers are lent, and those that read at most _KEPT_BYTES are kept for
# the next request, a few at most (more concurrent parses get fresh ones).
_IDLE: queue.SimpleQueue[simdjson.Parser] = queue.SimpleQueue()
_KEPT = min(os.cpu_count() or 1, 4)
_KEPT_BYTES = 4 << 20
_OPENING_BRACKET, _OPENING_BRACE, _COLON, _COMMA = ord("["), ord("{"), ord(":"), ord(",")
# From this size numpy's comparison counts a byte faster than ``bytes.count``; below it, its set-up costs
# more than it saves.
_NUMPY_COUNT_BYTES = 4096
Array, Object = simdjson.Array, simdjson.Object  # a document's proxies


def read(text: bytes, reader: Callable[[Any], T]) -> T | None:
    """``reader(document)`` on ``text`` parsed, or None if simdjson cannot read ``text``.

    ``reader`` gets the document as simdjson's proxies (``simdjson.Object``, ``simdjson.Array``, Python
    scalars), valid during the call only: it returns plain values. An exception it raises propagates, but
    for a KeyError: simdjson cannot look up a key holding a NUL character (``object[key]``), so None too.

    >>> read(b'{"data": [1, 2.5]}', lambda doc: numbers(doc["data"]).tolist())
    [1.0, 2.5]
    >>> read(b'{"data": [1e999]}', lambda doc: 0) is None
    True
    >>> read(b'{"a\\\\u0000": 1}', lambda doc: [doc[key] for key in doc.keys()]) is None
    True
    """
    try:
        parser = _IDLE.get_nowait()
    except queue.Empty:
        parser = simdjson.Parser()
    try:
        document = parser.parse(text)
    except (ValueError, RuntimeError):  # not JSON, too deep (ValueError); an integer beyond 64 bits
        return None
    try:
        result = reader(document)  # an exception leaves the parser to the garbage collector with its proxies
    except KeyError:
        return None
    del document
    if len(text) <= _KEPT_BYTES and _IDLE.qsize() < _KEPT:
        _IDLE.put(parser)
    return result


def numbers(*arrays: Any) -> np.ndarray | None:
    """The numbers of JSON arrays, one after another, as float64 (integers converted); None if one is not
    an array of numbers.

    Nested arrays are flattened: where that matters, count the brackets (:func:`opening_brackets`).

    >>> read(b'[[1, 2], [3]]', numbers).tolist()
    [1.0, 2.0, 3.0]
    >>> read(b'[[1, 2], [3]]', lambda doc: numbers(doc[1], doc[0]).tolist())
    [3.0, 1.0, 2.0]
    >>> read(b'[1, true]', numbers) is None
    True
    """
    try:
        buffers = [array.as_buffer(of_type="d") for array in arrays]
    except (TypeError, AttributeError):  # an element that is not a number; not an array
        return None
    # Several: one copy of them all, rather than an array of each to concatenate.
    return np.frombuffer(buffers[0] if len(buffers) == 1 else b"".join(buffers), np.float64)


def opening_brackets(text: bytes) -> int:
    """How many ``[`` there are in ``text`` (in strings too): as many as the arrays a reader saw means none
    was nested in another.

    >>> opening_brackets(b'{"a": [1, 2], "b": [[3]]}')
    3
    """
    return _count(text, _OPENING_BRACKET)


def opening_braces(text: bytes) -> int:
    """How many ``{`` there are in ``text`` (in strings too): at least as many as its objects.

    >>> opening_braces(b'[{}, {"a": {"b": "{"}}]')
    4
    """
    return _count(text, _OPENING_BRACE)


def commas(text: bytes) -> int:
    """How many ``,`` there are in ``text`` (in strings too): one before each item of its arrays and
    objects but the first of each.

    >>> commas(b'{"a": [1, 2, 3], "b": "x,y"}')
    4
    """
    return _count(text, _COMMA)


def colons(text: bytes) -> int:
    """How many ``:`` there are in ``text``: one for each member of its objects, and those in its strings.

    >>> colons(b'{"a": 1, "b": {"c": "d:e"}}')
    4
    """
    return _count(text, _COLON)


def _count(text: bytes, byte: int) -> int:
    if len(text) < _NUMPY_COUNT_BYTES:
        return text.count(byte)
    return int(np.count_nonzero(np.frombuffer(text, np.uint8) == byte))


def object_keys(value: Any) -> list[str] | None:
    """An object's keys, or None if it is not an object or repeats a key (``object[key]`` reads the first,
    where msgspec and ``as_dict`` keep the last).

    >>> read(b'{"a": 1, "b": 2}', object_keys), read(b'{"a": 1, "a": 2}', object_keys)
    (['a', 'b'], None)
    """
    if type(value) is not Object:
        return None
    keys = list(value.keys())
    return keys if len(set(keys)) == len(keys) else None


def repeated_key(value: Any) -> str | None:
    """The first key an object repeats (None if it repeats none, or is not an object).

    >>> read(b'{"a": 1, "b": 2, "a": 3}', repeated_key), read(b'{"a": {"b": 1, "b": 2}}', repeated_key)
    ('a', None)
    """
    if type(value) is not Object:
        return None
    keys = list(value.keys())
    if len(set(keys)) == len(keys):
        return None
    return next(key for i, key in enumerate(keys) if key in keys[:i])


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` that refuses an object repeating a key (ValueError).

    >>> import json
    >>> json.loads('{"a": {"b": 1, "b": 2}}', object_pairs_hook=unique_keys)
    Traceback (most recent call last):
    ...
    ValueError: duplicate key(s) ['b']
    """
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key(s) {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)


def plain(value: Any) -> Any:
    """A proxy as Python values (dicts, lists, scalars); a scalar as it is."""
    if type(value) is Object:
        return value.as_dict()
    return value.as_list() if type(value) is Array else value


def lists_in(value: Any) -> int:
    """How many lists there are in Python values (to compare with :func:`opening_brackets`).

    >>> lists_in({"a": [1, [2]], "b": {"c": []}})
    3
    """
    if isinstance(value, dict):
        return sum(lists_in(v) for v in value.values())
    return 1 + sum(lists_in(v) for v in value) if isinstance(value, list) else 0
