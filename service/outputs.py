"""The registry of what an answer holds, per sample: one entry per output, read by everything that lists or
renders outputs (the v1 renderer, v2's output tensors and model metadata, the OpenAPI response schema, the
Python client's ``Prediction``). A new output is one entry here, plus its computation in the core's
:class:`~service.inference.Result`.

Each output has a v2 tensor (datatype, per-sample shape from K classes and V views, how to take it from a
result), a v1 field (its JSON type per sample, and how to render the column of it), or both. numpy and
msgspec only: the client imports this.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec
import numpy as np

from service.inference import ModelSignature, Result

# Open Inference Protocol datatypes and the little-endian numpy dtypes of their binary form.
DTYPES = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8"), "BOOL": np.dtype("?")}
# A big answer is rendered this many numbers at a time (:func:`slices`): a renderer's C calls hold the GIL,
# and the event loop waits for it no longer than one slice takes.
SLICE_VALUES = 64 * 1024


class ViewOpinion(msgspec.Struct, frozen=True):
    """One view's own opinion, before fusion."""

    belief: list[float]
    uncertainty: float


@dataclass(frozen=True)
class Tensor:
    """An output as an Open Inference Protocol tensor ``[N, *shape(K, V)]``."""

    datatype: str
    shape: Callable[[int, int], tuple[int, ...]]
    take: Callable[[Result], np.ndarray]  # (N, *shape), in the datatype's dtype


@dataclass(frozen=True)
class Field:
    """An output as a field of each prediction of the v1 JSON answer."""

    type: Any  # its JSON value's type, as a Python annotation (the schema and the client are built from it)
    column: Callable[[Result, ModelSignature], list]  # the field's value for every sample, in order
    # Its numbers per sample, as a shape from K and V (at most), where the output has no tensor to say it.
    shape: Callable[[int, int], tuple[int, ...]] | None = None


@dataclass(frozen=True)
class Output:
    name: str
    description: str
    tensor: Tensor | None = None
    field: Field | None = None
    calibrated: bool = False  # only a calibrated model gives it (v1: null otherwise; v2: not offered)

    def __post_init__(self) -> None:
        if self.tensor is None and (self.field is None or self.field.shape is None):
            raise TypeError(f"output {self.name!r}: a field without a tensor needs its shape (answer_values)")

    def values(self, k: int, v: int) -> int:
        """Its numbers in one sample's answer, for K classes and V views."""
        shape = self.tensor.shape if self.tensor is not None else self.field.shape
        return math.prod(shape(k, v))


def _scalar(k: int, v: int) -> tuple[int, ...]:
    return ()


def _classes(k: int, v: int) -> tuple[int, ...]:
    return (k,)


def _views(k: int, v: int) -> tuple[int, ...]:
    return (v,)


def _column(attribute: str) -> Callable[[Result, ModelSignature], list]:
    return lambda result, _: getattr(result, attribute).tolist()


def _as(attribute: str, dtype: str) -> Callable[[Result], np.ndarray]:
    return lambda result: getattr(result, attribute).astype(DTYPES[dtype], copy=False)


def _class_names(result: Result, signature: ModelSignature) -> list[str]:
    return [signature.classes[label] for label in result.label.tolist()]


def _present_conflict(result: Result, _: ModelSignature) -> list:
    """The V x V matrix per sample, with ``None`` rows and columns for views not fused (not sent, or out of
    range)."""
    rows = []
    for matrix, present in zip(result.conflict.tolist(), result.fused_views.tolist(), strict=True):
        if all(present):
            rows.append(matrix)
            continue
        rows.append(
            [
                [value if present[b] else None for b, value in enumerate(row)] if present[a] else None
                for a, row in enumerate(matrix)
            ]
        )
    return rows


def _present_discount(result: Result, signature: ModelSignature) -> list[dict[str, float]]:
    names = signature.view_names
    return [
        {name: eta[v] for v, name in enumerate(names) if present[v]}
        for eta, present in zip(result.discount.tolist(), result.fused_views.tolist(), strict=True)
    ]


def _out_of_range_names(result: Result, signature: ModelSignature) -> list[list[str]]:
    if not result.out_of_range.any():  # the usual answer: one shared empty list, only ever encoded
        return [[]] * len(result)
    names = signature.view_names
    return [
        [name for name, out in zip(names, row, strict=True) if out] for row in result.out_of_range.tolist()
    ]


def _blamed(result: Result) -> np.ndarray:
    return np.where(result.high_conflict, result.blamed_view, -1).astype(DTYPES["INT64"])


def _blamed_name(result: Result, signature: ModelSignature) -> list[str | None]:
    names = signature.view_names
    flags, blamed = result.high_conflict.tolist(), result.blamed_view.tolist()
    return [names[v] if flagged and v >= 0 else None for v, flagged in zip(blamed, flags, strict=True)]


def _if_calibrated(
    column: Callable[[Result, ModelSignature], list],
) -> Callable[[Result, ModelSignature], list]:
    return lambda result, signature: (
        column(result, signature) if signature.calibrated else [None] * len(result)
    )


def _set_members(result: Result, _: ModelSignature) -> list[list[int]]:
    return [[k for k, member in enumerate(row) if member] for row in result.prediction_set.tolist()]


def _view_opinions(result: Result, signature: ModelSignature) -> list[dict[str, dict]]:
    names = signature.view_names
    return [
        {
            name: {"belief": belief[v], "uncertainty": uncertainty[v]}
            for v, name in enumerate(names)
            if present[v]
        }
        for belief, uncertainty, present in zip(
            result.view_belief.tolist(),
            result.view_uncertainty.tolist(),
            result.fused_views.tolist(),
            strict=True,
        )
    ]


OUTPUTS: tuple[Output, ...] = (
    Output(
        "label",
        "predicted class index",
        Tensor("INT64", _scalar, _as("label", "INT64")),
        Field(int, _column("label")),
    ),
    Output("class_name", "predicted class name", field=Field(str, _class_names, _scalar)),
    Output(
        "probability",
        "projected probability of the fused opinion (belief plus a share of uncertainty)",
        Tensor("FP32", _classes, _as("probability", "FP32")),
        Field(list[float], _column("probability")),
    ),
    Output(
        "belief",
        "fused belief masses; with uncertainty they sum to 1",
        Tensor("FP32", _classes, _as("belief", "FP32")),
        Field(list[float], _column("belief")),
    ),
    Output(
        "uncertainty",
        "fused uncertainty mass: too little evidence, or views that disagree",
        Tensor("FP32", _scalar, _as("uncertainty", "FP32")),
        Field(float, _column("uncertainty")),
    ),
    Output(
        "conflict",
        "degree of conflict between views (0 agree .. 1 confident and opposite); v1: null rows and columns "
        "for views not fused (not sent, or out of range), v2: 0 there",
        Tensor("FP32", lambda k, v: (v, v), _as("conflict", "FP32")),
        Field(list[list[float | None] | None], _present_conflict),
    ),
    Output(
        "discount",
        "how far DBF trusted each view (1 fully, near 0 its belief became uncertainty); v1: views fused "
        "only, v2: 1 where a view is missing or out of range",
        Tensor("FP32", _views, _as("discount", "FP32")),
        Field(dict[str, float], _present_discount),
    ),
    Output(
        "high_conflict",
        "the calibrated flag (raised on the manifest's target share of clean samples)",
        Tensor("BOOL", _scalar, _as("high_conflict", "BOOL")),
        Field(bool, _column("high_conflict")),
    ),
    Output(
        "blamed_view",
        "where flagged, the view most to blame: the one furthest out of its training range if any is, else "
        "the one in most conflict with the others (v1: its name, v2: its index); else null (v2: -1), and "
        "so where fewer than two views were fused (nothing conflicts: a flag on the fused uncertainty "
        "raised by views not sent)",
        Tensor("INT64", _scalar, _blamed),
        Field(str | None, _blamed_name),
    ),
    Output(
        "confidence",
        "calibrated probability that the label is right, fitted on clean samples the heads did not train "
        "on (the validation split, or on small data out-of-fold evidence of every non-test sample) "
        "(null for a model without calibration, and where a fusion other than the model's answers another "
        "label than the model's own would; NaN in binary and gRPC tensors)",
        Tensor("FP32", _scalar, _as("confidence", "FP32")),
        Field(float | None, _if_calibrated(_column("confidence"))),
        calibrated=True,
    ),
    Output(
        "prediction_set",
        "the classes that remain plausible: the set holds the true class for the answer's coverage of "
        "samples like the clean calibration samples (at least that, by split conformal's guarantee, where "
        "they were the validation split; about that where cross-fitted; the model card says which) (v1: "
        "class indices, v2: membership per class)",
        Tensor("BOOL", _classes, _as("prediction_set", "BOOL")),
        Field(list[int] | None, _if_calibrated(_set_members)),
        calibrated=True,
    ),
    Output(
        "out_of_range",
        "views sent whose features lie too far outside their training range (the manifest's "
        "out_of_range.threshold) to be trusted: fused as if missing (v1: their names, v2: per view)",
        Tensor("BOOL", _views, _as("out_of_range", "BOOL")),
        Field(list[str], _out_of_range_names),
    ),
    Output(
        "views",
        "each view fused: its own belief and uncertainty before fusion",
        field=Field(dict[str, ViewOpinion], _view_opinions, lambda k, v: (v, k + 1)),
    ),
    Output(
        "view_belief",
        "each view's own belief before fusion (0 where a view is missing or out of range)",
        Tensor("FP32", lambda k, v: (v, k), _as("view_belief", "FP32")),
    ),
    Output(
        "view_uncertainty",
        "each view's own uncertainty before fusion (1 where a view is missing or out of range)",
        Tensor("FP32", _views, _as("view_uncertainty", "FP32")),
    ),
)

TENSORS: dict[str, Output] = {output.name: output for output in OUTPUTS if output.tensor is not None}
FIELDS: tuple[Output, ...] = tuple(output for output in OUTPUTS if output.field is not None)


@cache
def answer_values(k: int, v: int) -> int:
    """Numbers in one sample's answer for K classes and V views, in the protocol that gives more (v1's fields,
    v2's tensors): what a sample costs to compute, encode and send. Every output counts, new ones too."""
    fields = sum(output.values(k, v) for output in FIELDS)
    return max(fields, sum(output.values(k, v) for output in TENSORS.values()))


def slices(signature: ModelSignature, samples: int) -> list[tuple[int, int]]:
    """Ranges of ``samples`` whose answers are rendered one after another, about ``SLICE_VALUES`` numbers
    each (one range for a small answer)."""
    step = max(1, SLICE_VALUES // answer_values(len(signature.classes), len(signature.views)))
    return [(start, min(start + step, samples)) for start in range(0, samples, step)]


def json_array(pieces: Iterable[bytes]) -> bytes:
    """One JSON array of the items of the JSON arrays ``pieces`` (two or more, none empty: the renderings of
    an answer's slices), in order, copied once: the first's bracket opens it, the last's closes it."""
    views = [memoryview(piece) for piece in pieces]
    return b",".join([views[0][:-1], *(view[1:-1] for view in views[1:-1]), views[-1][1:]])
