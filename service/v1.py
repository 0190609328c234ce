"""The v1 protocol's codec: a JSON ``/predict`` body -> an :class:`~service.inference.InferenceRequest`, and a
:class:`~service.inference.Result` -> the JSON answer. Errors say what is wrong and where, in v1's grammar
(``samples[i].views.<name>``).

Two decoders give the same answers. The fast one decodes with msgspec straight into typed lists (in C, no
per-float Python) and converts every view to numpy at once; it declines anything unusual. The strict one,
the authority, walks the document in Python and names the first problem exactly; it runs only when the fast
one declines, so bad input costs more than good input, both bounded by the body-size limit. Both read the
grammar of :class:`service.schemas.PredictRequest`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np
import orjson

from service.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from service.inference import InferenceRequest, ModelSignature, Result
from service.outputs import FIELDS
from service.schemas import PredictRequest

MEDIA_TYPE = "application/json"
_JSON = {"content-type": MEDIA_TYPE}
# The body's fields, as the wire type spells them (the strict decoder refuses any other).
_BODY_FIELDS = tuple(field.encode_name for field in msgspec.structs.fields(PredictRequest))
_FIELD_NAMES = tuple(output.name for output in FIELDS)


def accept(headers: Mapping[str, str]) -> None:
    """Refuse, before the body is read, what this protocol does not take: anything but JSON (415)."""
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != MEDIA_TYPE:
        raise UnsupportedMediaType(
            f"send the body as application/json, not {content_type or 'no content type'!r}"
        )


def decode(
    body: bytes, headers: Mapping[str, str], signature: ModelSignature, *, max_samples: int
) -> tuple[InferenceRequest, ModelSignature]:
    """Validate a body against the model's views (:class:`InvalidInput`, :class:`PayloadTooLarge`); the
    context to answer with is the signature itself."""
    return parse(body, signature, max_samples=max_samples), signature


def encode(signature: ModelSignature, result: Result) -> tuple[bytes, dict[str, str]]:
    """The JSON answer: per sample the fields of the output registry (views not sent are ``null`` in the
    conflict matrix and absent from ``discount`` and ``views``)."""
    # Each field's column at once (tolist is fast), then one dict per sample.
    columns = [output.field.column(result, signature) for output in FIELDS]
    predictions = [dict(zip(_FIELD_NAMES, values, strict=True)) for values in zip(*columns, strict=True)]
    answer = {
        "model": signature.name,
        "method": result.method,
        "lambda": result.lam,
        "coverage": result.coverage,
        "views": signature.view_names,
        "predictions": predictions,
    }
    return orjson.dumps(answer), _JSON


def locate(error: InvalidInput, signature: ModelSignature) -> InvalidInput:
    """A core error about one sample's view, worded in v1's grammar."""
    return error.located(f"samples[{error.sample}].views.{signature.views[error.view].name}")


def parse(body: bytes, signature: ModelSignature, *, max_samples: int) -> InferenceRequest:
    """Validate a request body against the model's views (:class:`InvalidInput`, :class:`PayloadTooLarge`)."""
    request = _parse_fast(body, signature, max_samples)
    return request if request is not None else _parse_strict(body, signature, max_samples)


_DECODER = msgspec.json.Decoder(PredictRequest)
# Values are converted to numpy a block of samples at a time: one call per block rather than one per view,
# and no single call holding the GIL for long on a big body (the event loop waits for it meanwhile).
_BLOCK_SAMPLES = 64
# A key is a string followed by a colon; with no backslash in the body no string can hold a quote, so this
# counts every key of the document (to find duplicate keys, which msgspec, like most parsers, lets through).
_KEY = re.compile(rb'"[ \t\r\n]*:')


def _parse_fast(body: bytes, signature: ModelSignature, max_samples: int) -> InferenceRequest | None:
    """The request, or None where :func:`_parse_strict` must decide (and explain)."""
    if b"\\" in body:  # escapes could spell a duplicate key differently
        return None
    try:
        decoded = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    samples = decoded.samples
    if not samples:
        return None
    if len(samples) > max_samples:
        raise PayloadTooLarge(_too_many(len(samples), max_samples))
    given = (("method", decoded.method), ("lambda", decoded.lam), ("coverage", decoded.coverage))
    options = {key: value for key, value in given if value is not msgspec.UNSET}
    keys = 1 + len(options) + sum(1 + len(sample.views) for sample in samples)
    # Every key is followed by a colon outside any string: as many colons as keys msgspec kept means no
    # key was repeated (a colon inside a string only makes the count look worse; the regex then decides).
    if body.count(b":") != keys and len(_KEY.findall(body)) != keys:
        return None
    try:
        method, lam, coverage = _options(options, signature)
    except InvalidInput:
        return None
    # The values of all the views sent in one list, sample after sample and view after view in the manifest's
    # order, converted a block of samples at a time: one numpy call per block rather than one per view. A
    # view not sent takes no room (at its dimension, zeros for it could take more than the body).
    layout, absent, blocks = signature.view_layout, [], []
    for start in range(0, len(samples), _BLOCK_SAMPLES):
        flat: list[float] = []
        for i, sample in enumerate(samples[start : start + _BLOCK_SAMPLES], start):
            views, found = sample.views, 0
            for v, (name, dim, _, _) in enumerate(layout):
                values = views.get(name)
                if values is None:
                    absent.append((i, v))
                elif len(values) != dim:
                    return None
                else:
                    flat += values
                    found += 1
            if found == 0 or found != len(views):  # no views, or names the model does not have
                return None
        with np.errstate(over="ignore"):  # beyond float32: infinity, found below
            blocks.append(np.fromiter(flat, np.float32, count=len(flat)))  # 15-20% under np.array
    values = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    # Beyond float32 a value becomes infinity. The sum is not finite if a value is not, or (rarely) if finite
    # ones overflow float32: either way the strict parser decides. A float64 sum costs 4x more here.
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(values)
    if not math.isfinite(total):
        return None
    present = np.ones((len(samples), len(layout)), dtype=bool)
    if absent:
        present[tuple(np.array(absent).T)] = False
    features = _views_of(values, present, signature, complete=not absent)
    return InferenceRequest(features, present, method, lam, coverage)


def _views_of(
    values: np.ndarray, present: np.ndarray, signature: ModelSignature, *, complete: bool
) -> dict[str, np.ndarray]:
    """Each view's rows ``(samples that have it, dim)`` out of the sent values, laid out sample by sample."""
    if complete:  # the common case: every row as long, each view a column range (a copy: a view when N is 1)
        rows = values.reshape(len(present), -1)
        return {
            name: np.ascontiguousarray(rows[:, start:end]) for name, _, start, end in signature.view_layout
        }
    # Where each sent view starts in ``values``: the sizes of the views sent before it, in sending order.
    sizes = np.where(present, signature.view_dims, 0).ravel()
    starts = (np.cumsum(sizes) - sizes).reshape(present.shape)
    return {
        name: values[starts[present[:, v], v][:, None] + np.arange(dim)]
        for v, (name, dim, _, _) in enumerate(signature.view_layout)
    }


def _parse_strict(body: bytes, signature: ModelSignature, max_samples: int) -> InferenceRequest:
    try:
        # Integers as floats (a 400-digit integer becomes inf, then is refused); duplicate keys refused.
        payload = json.loads(
            body, parse_constant=_reject_constant, parse_int=float, object_pairs_hook=_no_duplicates
        )
    except (ValueError, RecursionError) as error:
        raise InvalidInput(f"body is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise InvalidInput("body must be a JSON object with a 'samples' list")
    unknown = set(payload) - set(_BODY_FIELDS)
    if unknown:
        expected = ", ".join(repr(name) for name in _BODY_FIELDS)
        raise InvalidInput(f"unknown field(s) {sorted(unknown)}; expected {expected}")
    method, lam, coverage = _options(payload, signature)
    samples = payload.get("samples")
    if not isinstance(samples, list):
        raise InvalidInput("'samples' must be a list of {'views': {view name: [numbers]}}")
    if not samples:
        raise InvalidInput("'samples' is empty: send at least one sample")
    if len(samples) > max_samples:
        raise PayloadTooLarge(_too_many(len(samples), max_samples))
    views, index = signature.views, signature.view_index
    rows: dict[str, list[np.ndarray]] = {view.name: [] for view in views}
    present = np.zeros((len(samples), len(views)), dtype=bool)
    for i, sample in enumerate(samples):
        given = sample.get("views") if isinstance(sample, dict) else None
        if not isinstance(given, dict) or (isinstance(sample, dict) and set(sample) - {"views"}):
            raise InvalidInput(f"samples[{i}] must be an object {{'views': {{view name: [numbers]}}}}")
        if not given:
            raise InvalidInput(f"samples[{i}] has no views; send at least one of {list(index)}")
        for name, values in given.items():
            if name not in index:
                raise InvalidInput(f"samples[{i}].views: unknown view {name!r}; this model has {list(index)}")
            present[i, index[name]] = True
            rows[name].append(_vector(values, views[index[name]].dim, f"samples[{i}].views.{name}"))
    features = {
        view.name: np.stack(rows[view.name]) if rows[view.name] else np.empty((0, view.dim), np.float32)
        for view in views
    }
    return InferenceRequest(features, present, method, lam, coverage)


def _too_many(n: int, max_samples: int) -> str:
    return f"{n} samples in one request; at most {max_samples} are accepted"


def _options(payload: dict, signature: ModelSignature) -> tuple[str, float, float | None]:
    """The request's fusion (method, lambda) and coverage, checked (numbers arrive as floats)."""
    method = payload.get("method", signature.method)
    if method not in signature.methods:
        raise InvalidInput(f"unknown method {method!r}; expected one of {', '.join(signature.methods)}")
    lam = payload.get("lambda", signature.lam)
    if type(lam) is not float or not math.isfinite(lam) or lam <= 0:
        raise InvalidInput(f"'lambda' must be a positive finite number, got {lam!r}")
    coverage = payload.get("coverage")
    if coverage is not None and (type(coverage) is not float or not 0 < coverage < 1):
        raise InvalidInput(f"'coverage' must be a number between 0 and 1, got {coverage!r}")
    return method, float(lam), coverage


def _vector(values: Any, dim: int, where: str) -> np.ndarray:
    if not isinstance(values, list):
        raise InvalidInput(f"{where}: expected a list of {dim} numbers, got {type(values).__name__}")
    if len(values) != dim:
        raise InvalidInput(f"{where}: expected {dim} values, got {len(values)}")
    # JSON numbers all arrive as float (parse_int=float): anything else (true, "1.5", null, [..]) is refused,
    # where numpy would quietly convert booleans and numeric strings.
    kinds = set(map(type, values))
    if kinds != {float}:
        odd = next(i for i, x in enumerate(values) if type(x) is not float)
        raise InvalidInput(f"{where}[{odd}]: every value must be a number, got {values[odd]!r}")
    array = np.asarray(values, dtype=np.float64)
    if not np.isfinite(array).all():  # 1e999 and huge integers arrive as infinity
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise InvalidInput(f"{where}[{bad}]: values must be finite numbers, got {values[bad]!r}")
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    if not np.isfinite(array).all():  # what rounds to a finite float32 fits; the rest would be infinity
        raise InvalidInput(f"{where}: values must fit in float32")
    return array


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key(s) {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)
