"""What flows through the core, in no protocol's terms: a model's signature, a request as arrays, a result as
arrays. numpy only, so that codecs and clients can use these without the server's dependencies."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np

from service.errors import InvalidInput, PayloadTooLarge


@dataclass(frozen=True)
class ViewSpec:
    name: str
    dim: int


@dataclass(frozen=True)
class ModelSignature:
    """What a protocol needs to know of a model to decode a request for it and encode the answer."""

    name: str
    version: str
    views: tuple[ViewSpec, ...]  # in the model's order: the V axis of every array
    classes: tuple[str, ...]  # in label order: the K axis
    method: str  # the default fusion
    lam: float
    methods: tuple[str, ...]  # the fusion methods a request may ask for
    # Calibrated confidence and prediction sets (a model of manifest schema 1 has neither): the coverage of
    # a request that names none, and the most its calibration set supports.
    default_coverage: float | None = None
    max_coverage: float | None = None
    # Where its heads run, by batch size, in words (service.placement.Placement): shown, not compared.
    placement: str | None = field(default=None, compare=False)

    @property
    def calibrated(self) -> bool:
        return self.default_coverage is not None

    @cached_property
    def view_index(self) -> dict[str, int]:
        """View name -> its position (in every ``(N, V, ...)`` array)."""
        return {view.name: v for v, view in enumerate(self.views)}

    @cached_property
    def view_names(self) -> list[str]:
        return [view.name for view in self.views]

    @cached_property
    def view_layout(self) -> tuple[tuple[str, int, int, int], ...]:
        """Per view in order: its name, its dimension, and where its values start and end in a sample's
        views laid side by side."""
        ends = np.cumsum([view.dim for view in self.views]).tolist()
        return tuple(
            (view.name, view.dim, end - view.dim, end) for view, end in zip(self.views, ends, strict=True)
        )

    @cached_property
    def view_dims(self) -> np.ndarray:
        """(V,) each view's dimension."""
        return np.array([view.dim for view in self.views])

    def json_items(self, max_samples: int) -> int:
        """The most items (array elements and object members) a JSON request of at most ``max_samples``
        samples holds: per sample its features, a member per view and two around them (v1's sample object
        and its ``views``), and :data:`JSON_BESIDE_SAMPLES` for the rest (options, shapes, outputs)."""
        return max_samples * (int(self.view_dims.sum()) + len(self.views) + 2) + JSON_BESIDE_SAMPLES

    def json_containers(self, max_samples: int) -> int:
        """The most arrays and objects a JSON request of at most ``max_samples`` samples holds: per sample
        an array per view (v1's, or a row of v2's nested data) and two objects (v1's), four per input (v2's
        object, parameters, shape and data), and :data:`JSON_BESIDE_SAMPLES` for the rest."""
        return max_samples * (len(self.views) + 2) + 4 * len(self.views) + JSON_BESIDE_SAMPLES


# JSON texts up to this size are parsed whatever they hold (the cost is bounded by their size); bigger ones
# are first counted by :func:`check_json_text` and :func:`check_json_containers`.
JSON_CHECKED_BYTES = 64 * 1024
# Room in a JSON request for what is not its samples: options, shapes, outputs, parameters, an id.
JSON_BESIDE_SAMPLES = 4096


class JSONConstant(str):
    """``NaN``, ``Infinity`` or ``-Infinity`` where JSON has a number: not JSON, but what Python's json writes
    for a float that is none. Python's parser reads it as this (``parse_constant``), no number, so that the
    refusal can say where it stands; its repr says what it is."""

    def __repr__(self) -> str:
        return f"{self!s}, which is not a JSON number"


def check_json_text(text: bytes, signature: ModelSignature, *, max_samples: int) -> int:
    """A 413 for JSON ``text`` holding more items than a request of at most ``max_samples`` samples of the
    model does, before any parser reads it; return how many ``[`` it has (the fast readers compare that
    with the arrays they read, and :func:`check_json_containers` adds it up).

    A parser's memory and time grow with a document's items, not its bytes: two bytes (``0,`` or ``{},``)
    make a number on simdjson's tape (16 bytes) and a float64 (8), or a Python dict (64 and more). Items
    are counted by their commas (a container's items but its first follow one; those in strings count
    too, so the count never falls short).
    """
    from service import json_numbers  # the server's (simdjson); clients never decode requests

    brackets = json_numbers.opening_brackets(text)
    if len(text) > JSON_CHECKED_BYTES:
        most = signature.json_items(max_samples)
        if json_numbers.commas(text) >= most:
            raise PayloadTooLarge(
                f"the JSON body holds more than {most} items (numbers and other values); a request of at "
                f"most {max_samples} samples of model {signature.name!r} holds fewer: send fewer samples a "
                "request"
            )
    return brackets


def too_many_samples(n: int, max_samples: int) -> PayloadTooLarge:
    """The 413 for a request of ``n`` samples, more than ``DBF_MAX_SAMPLES`` (``max_samples``) lets in,
    whatever its protocol: naming the setting, as the body's and the answer's limits do."""
    return PayloadTooLarge(
        f"{n} samples in one request; at most {max_samples} are accepted (DBF_MAX_SAMPLES): send them in "
        "requests of fewer"
    )


def check_json_containers(text: bytes, brackets: int, signature: ModelSignature, *, max_samples: int) -> None:
    """A 400 for JSON ``text`` (of ``brackets`` ``[``) holding more arrays and objects than a request of at
    most ``max_samples`` samples does: before a parser that makes a Python object of each (json, msgspec)
    reads it. (The fast readers, walking a simdjson document, bound their own walks.)"""
    if len(text) <= JSON_CHECKED_BYTES:
        return
    from service import json_numbers  # the server's (simdjson); clients never decode requests

    containers, most = brackets + json_numbers.opening_braces(text), signature.json_containers(max_samples)
    if containers > most:
        raise InvalidInput(
            f"not an inference request: {containers} JSON arrays and objects, where a request of at most "
            f"{max_samples} samples of model {signature.name!r} has at most {most}"
        )


def request_options(
    given: Mapping[str, Any], signature: ModelSignature, name: Callable[[str], str]
) -> tuple[str, float, float | None]:
    """A request's fusion method, lambda and coverage from ``given`` (what it sent, as JSON values: an
    option left out is the model's default), checked the one way for every protocol; ``name`` words an
    option's place in the protocol's grammar (``'lambda'`` in v1, ``parameters.lambda`` in v2 and gRPC)."""
    method = given.get("method", signature.method)
    if method not in signature.methods:
        expected = ", ".join(signature.methods)
        raise InvalidInput(f"{name('method')}: unknown method {method!r}; expected one of {expected}")
    lam = given.get("lambda", signature.lam)
    if not (_number(lam) and lam > 0):
        shown = repr(lam) if len(repr(lam)) <= 40 else f"{repr(lam)[:40]}..."
        raise InvalidInput(f"{name('lambda')} must be a positive finite number, got {shown}")
    coverage = given.get("coverage")  # null is no number: refused, as for method and lambda
    if "coverage" in given and not (_number(coverage) and 0 < coverage < 1):
        raise InvalidInput(f"{name('coverage')} must be a number between 0 and 1, got {coverage!r}")
    return method, float(lam), None if coverage is None else float(coverage)


def _number(value: Any) -> bool:
    """A finite int or float (not a bool); an integer beyond float64 (10**309) is as refused as infinity."""
    try:
        return type(value) in (int, float) and math.isfinite(float(value))
    except OverflowError:
        return False


@dataclass(frozen=True)
class InferenceRequest:
    """A validated request: presence ``(N, V)``, the features of each view ``(samples that have it, dim)``
    float32 (in sample order: an absent view takes no room), the fusion asked for, and the coverage of its
    prediction sets (the model's default for None)."""

    features: dict[str, np.ndarray]
    present: np.ndarray
    method: str
    lam: float
    coverage: float | None = None

    def __len__(self) -> int:
        return self.present.shape[0]

    @classmethod
    def concat(cls, requests: list[InferenceRequest]) -> InferenceRequest:
        """One request of the samples of ``requests``, which share their fusion and coverage."""
        first = requests[0]
        if len(requests) == 1:
            return first
        features = {name: np.concatenate([r.features[name] for r in requests]) for name in first.features}
        present = np.concatenate([r.present for r in requests])
        return cls(features, present, first.method, first.lam, first.coverage)


@dataclass(frozen=True)
class Result:
    """Per-sample answers as arrays (N samples, V views, K classes); :meth:`rows` slices them."""

    present: np.ndarray  # (N, V) bool, the views sent
    out_of_range: np.ndarray  # (N, V) bool, views sent but too far outside their training range: not fused
    label: np.ndarray  # (N,) int
    probability: np.ndarray  # (N, K)
    belief: np.ndarray  # (N, K)
    uncertainty: np.ndarray  # (N,)
    conflict: np.ndarray  # (N, V, V)
    discount: np.ndarray  # (N, V)
    high_conflict: np.ndarray  # (N,) bool
    blamed_view: np.ndarray  # (N,) int, the view most to blame (meaningful where flagged)
    view_belief: np.ndarray  # (N, V, K)
    view_uncertainty: np.ndarray  # (N, V)
    confidence: np.ndarray  # (N,) calibrated probability that the label is right (NaN: no calibration)
    prediction_set: np.ndarray  # (N, K) bool, the conformal set at ``coverage`` (empty: no calibration)
    method: str
    lam: float
    coverage: float | None  # None: the model has no calibration

    def __len__(self) -> int:
        return self.label.shape[0]

    @cached_property
    def fused_views(self) -> np.ndarray:
        """(N, V) bool: the views that went into the fusion, those sent and in range."""
        return self.present & ~self.out_of_range

    def rows(self, start: int, stop: int) -> Result:
        sliced = {name: getattr(self, name)[start:stop] for name in _PER_SAMPLE}
        return Result(**sliced, method=self.method, lam=self.lam, coverage=self.coverage)


# Result's per-sample arrays (method, lam and coverage are the request's).
_PER_SAMPLE = tuple(f.name for f in fields(Result) if f.name not in ("method", "lam", "coverage"))
