"""The v1 protocol's codec: a JSON ``/predict`` body -> an :class:`~service.inference.InferenceRequest`, and a
:class:`~service.inference.Result` -> the JSON answer. Errors say what is wrong and where, in v1's grammar
(``samples[i].views.<name>``).

Two decoders give the same answers. The fast one parses with simdjson and reads each view's numbers straight
into an array (in C, no per-float Python: :mod:`service.json_numbers`); it declines anything unusual. The
strict one, the authority, walks the document in Python and names the first problem exactly; it runs only
when the fast one declines, so bad input costs more than good input, both bounded by the body-size limit.
Both read the grammar of :class:`service.schemas.PredictRequest`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np
import orjson

from service import json_numbers
from service.errors import InvalidInput, UnsupportedMediaType
from service.inference import (
    InferenceRequest,
    JSONConstant,
    ModelSignature,
    Result,
    check_json_containers,
    check_json_text,
    request_options,
    too_many_samples,
)
from service.outputs import FIELDS, json_array, slices
from service.schemas import PredictRequest

PROTOCOL = "rest"  # the protocol label of its requests' metrics
MEDIA_TYPE = "application/json"
_JSON = {"content-type": MEDIA_TYPE}
# The body's fields, as the wire type spells them (the strict decoder refuses any other).
_BODY_FIELDS = tuple(field.encode_name for field in msgspec.structs.fields(PredictRequest))
_FIELD_NAMES = tuple(output.name for output in FIELDS)
_BODY_KEYS = frozenset(_BODY_FIELDS)
_SCALARS = (str, int, float, bool, type(None))


def accept(headers: Mapping[str, str]) -> None:
    """Refuse, before the body is read, what this protocol does not take: anything but JSON (415)."""
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != MEDIA_TYPE:
        raise UnsupportedMediaType(
            f"send the body as application/json, not {content_type or 'no content type'!r}"
        )


def body_bytes(body: bytes, headers: Mapping[str, str]) -> tuple[int, int]:
    """JSON: text, all of it."""
    return len(body), 0


def binary_answer(signature: ModelSignature) -> bool:
    """JSON: text."""
    return False


def decode(
    body: bytes, headers: Mapping[str, str], signature: ModelSignature, *, max_samples: int
) -> tuple[InferenceRequest, ModelSignature]:
    """Validate a body against the model's views (:class:`InvalidInput`, :class:`PayloadTooLarge`); the
    context to answer with is the signature itself."""
    return parse(body, signature, max_samples=max_samples), signature


def encode(signature: ModelSignature, result: Result) -> tuple[bytes, dict[str, str]]:
    """The JSON answer: per sample the fields of the output registry (views not sent are ``null`` in the
    conflict matrix and absent from ``discount`` and ``views``); a big one rendered in slices of samples."""
    ranges = slices(signature, len(result))
    if len(ranges) == 1:
        predictions: Any = _predictions(signature, result)
    else:
        predictions = orjson.Fragment(
            json_array(orjson.dumps(_predictions(signature, result.rows(*rows))) for rows in ranges)
        )
    answer = {
        "model": signature.name,
        "method": result.method,
        "lambda": result.lam,
        "coverage": result.coverage,
        "views": signature.view_names,
        "predictions": predictions,
    }
    return orjson.dumps(answer), _JSON


def _predictions(signature: ModelSignature, result: Result) -> list[dict[str, Any]]:
    """One dict per sample of ``result``: each field's column at once (tolist is fast), then the rows."""
    columns = [output.field.column(result, signature) for output in FIELDS]
    return [dict(zip(_FIELD_NAMES, values, strict=True)) for values in zip(*columns, strict=True)]


def locate(error: InvalidInput, signature: ModelSignature) -> InvalidInput:
    """A core error about one sample's view, worded in v1's grammar."""
    return error.located(f"samples[{error.sample}].views.{signature.views[error.view].name}")


def parse(body: bytes, signature: ModelSignature, *, max_samples: int) -> InferenceRequest:
    """Validate a request body against the model's views (:class:`InvalidInput`, :class:`PayloadTooLarge`)."""
    brackets = check_json_text(body, signature, max_samples=max_samples)
    request = _parse_fast(body, signature, max_samples, brackets)
    if request is not None:
        return request
    check_json_containers(body, brackets, signature, max_samples=max_samples)  # json makes a dict of each
    return _parse_strict(body, signature, max_samples)


def _parse_fast(
    body: bytes, signature: ModelSignature, max_samples: int, brackets: int
) -> InferenceRequest | None:
    """The request, or None where :func:`_parse_strict` must decide (and explain); ``brackets``: how many
    ``[`` the body has."""
    read = json_numbers.read(body, lambda document: _read(document, signature, max_samples))
    if read is None:
        return None
    options, values, present, arrays = read
    # Each array the reader took as a view's values holds only numbers, and as many as the view's
    # dimension; as many brackets as those arrays (and ``samples``') means none was a nested array.
    if brackets != arrays + 1:
        return None
    try:
        method, lam, coverage = _options(options, signature)
    except InvalidInput:
        return None
    with np.errstate(over="ignore"):  # beyond float32: infinity, found below
        values = values.astype(np.float32)
    # Beyond float32 a value becomes infinity. The sum is not finite if a value is not, or (rarely) if finite
    # ones overflow float32: either way the strict parser decides. A float64 sum would cost more.
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(values)
    if not math.isfinite(total):
        return None
    features = _views_of(values, present, signature, complete=bool(present.all()))
    return InferenceRequest(features, present, method, lam, coverage)


def _read(
    document: Any, signature: ModelSignature, max_samples: int
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, int] | None:
    """From simdjson's document: the options, the values of all the views sent (sample after sample, view
    after view in the manifest's order: a view not sent takes no room), which views each sample has, and
    how many arrays were read. None if anything is unusual."""
    keys = json_numbers.object_keys(document)
    if keys is None or not set(keys) <= _BODY_KEYS or "samples" not in keys:
        return None
    options = {key: document[key] for key in keys if key != "samples"}
    if not all(type(value) in _SCALARS for value in options.values()):
        return None  # an object or a list: the strict parser words it
    # Numbers arrive as floats from the other parsers (integers too): as floats here, for _options.
    options = {key: float(value) if type(value) is int else value for key, value in options.items()}
    samples = document["samples"]
    if type(samples) is not json_numbers.Array or not samples:
        return None
    if len(samples) > max_samples:
        raise too_many_samples(len(samples), max_samples)
    layout, names = signature.view_layout, signature.view_index.keys()
    present, buffers = [], []
    for sample in samples:
        if json_numbers.object_keys(sample) != ["views"]:
            return None
        views = sample["views"]
        given = json_numbers.object_keys(views)
        if not given or not names >= set(given):  # not an object, a repeated key, none or unknown views
            return None
        for name, dim, _, _ in layout:
            if name in given:
                values = views[name]
                if type(values) is not json_numbers.Array or len(values) != dim:
                    return None
                buffers.append(values)
        present.append([name in given for name, _, _, _ in layout])
    values = json_numbers.numbers(*buffers)
    if values is None:
        return None
    return options, values, np.array(present, dtype=bool), len(buffers)


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
            body, parse_constant=JSONConstant, parse_int=float, object_pairs_hook=json_numbers.unique_keys
        )
    except RecursionError:  # deeper than the decoder recurses (its message names its internals)
        raise InvalidInput("body is not valid JSON: nested too deeply") from None
    except ValueError as error:
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
        raise too_many_samples(len(samples), max_samples)
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


def _options(payload: dict, signature: ModelSignature) -> tuple[str, float, float | None]:
    """The request's fusion (method, lambda) and coverage, checked by the core (v1 names them quoted)."""
    return request_options(payload, signature, repr)


_MISSING = "a view a sample lacks is left out of its views"


def _vector(values: Any, dim: int, where: str) -> np.ndarray:
    if values is None:
        raise InvalidInput(f"{where}: expected a list of {dim} numbers, got null; {_MISSING}")
    if not isinstance(values, list):
        got = repr(values) if isinstance(values, JSONConstant) else type(values).__name__
        raise InvalidInput(f"{where}: expected a list of {dim} numbers, got {got}")
    if len(values) != dim:
        raise InvalidInput(f"{where}: expected {dim} values, got {len(values)}")
    # JSON numbers all arrive as float (parse_int=float): anything else (true, "1.5", null, [..]) is refused,
    # where numpy would quietly convert booleans and numeric strings.
    kinds = set(map(type, values))
    if kinds != {float}:
        odd = next(i for i, x in enumerate(values) if type(x) is not float)
        if values[odd] is None or isinstance(values[odd], JSONConstant):
            got = "null" if values[odd] is None else repr(values[odd])
            raise InvalidInput(f"{where}[{odd}]: every value must be a number, got {got}; {_MISSING}")
        got = json.dumps(values[odd], default=repr)  # as the request spelled it: true, "1.5", [1.0]
        raise InvalidInput(f"{where}[{odd}]: every value must be a number, got {got}")
    array = np.asarray(values, dtype=np.float64)
    if not np.isfinite(array).all():  # 1e999 and huge integers arrive as infinity
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise InvalidInput(f"{where}[{bad}]: values must be finite numbers, got {values[bad]!r}")
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    if not np.isfinite(array).all():  # what rounds to a finite float32 fits; the rest would be infinity
        raise InvalidInput(f"{where}: values must fit in float32")
    return array
