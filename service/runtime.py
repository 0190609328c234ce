"""A predict request's way: JSON -> one float32 array per view -> each view's head -> fusion -> response.

Validation is bulk (one ``numpy`` conversion per view and sample, not per float) and says what is wrong and
where (``samples[i].views.<name>``). Nothing here touches the disk or the event loop: :func:`predict` is
called in a worker thread.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusion import METHODS, fuse, opinion_from_evidence
from service import metrics
from service.errors import InvalidInput, PayloadTooLarge
from service.repository import LoadedModel


@dataclass(frozen=True)
class Batch:
    """A validated request: features per view ``(N, dim)`` (zeros where missing), presence ``(N, V)``."""

    features: dict[str, np.ndarray]
    present: np.ndarray
    method: str
    lam: float


def parse(body: bytes, model: LoadedModel, *, max_samples: int) -> Batch:
    """Validate a request body against ``model``'s views (:class:`InvalidInput`, :class:`PayloadTooLarge`)."""
    try:
        # Integers as floats (a 400-digit integer becomes inf, then is refused); duplicate keys refused.
        payload = json.loads(
            body, parse_constant=_reject_constant, parse_int=float, object_pairs_hook=_no_duplicates
        )
    except (ValueError, RecursionError) as error:
        raise InvalidInput(f"body is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise InvalidInput("body must be a JSON object with a 'samples' list")
    unknown = set(payload) - {"samples", "method", "lambda"}
    if unknown:
        raise InvalidInput(f"unknown field(s) {sorted(unknown)}; expected 'samples', 'method', 'lambda'")
    method, lam = _fusion_options(payload, model)
    samples = payload.get("samples")
    if not isinstance(samples, list):
        raise InvalidInput("'samples' must be a list of {'views': {view name: [numbers]}}")
    if not samples:
        raise InvalidInput("'samples' is empty: send at least one sample")
    if len(samples) > max_samples:
        raise PayloadTooLarge(f"{len(samples)} samples in one request; at most {max_samples} are accepted")
    views = model.manifest.views
    index = {view.name: v for v, view in enumerate(views)}
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
    features = {}
    for v, view in enumerate(views):
        full = np.zeros((len(samples), view.dim), dtype=np.float32)
        if rows[view.name]:
            full[present[:, v]] = np.stack(rows[view.name])
        features[view.name] = full
    return Batch(features, present, method, lam)


def predict(model: LoadedModel, batch: Batch) -> dict[str, Any]:
    """Run the heads on the rows that carry each view, fuse, flag, and build the response."""
    manifest = model.manifest
    n, k = batch.present.shape[0], len(manifest.classes)
    evidence = np.zeros((n, len(manifest.views), k), dtype=np.float32)
    for v, view in enumerate(manifest.views):
        rows = batch.present[:, v]
        if rows.any():
            features = batch.features[view.name] if rows.all() else batch.features[view.name][rows]
            evidence[rows, v] = model.sessions[view.name].run(["evidence"], {"features": features})[0]
    finite = np.isfinite(evidence).all(-1)
    if not finite.all():  # features in float32's range can still overflow a head (inf - inf in its matmul)
        i, v = map(int, np.argwhere(~finite)[0])
        name = manifest.views[v].name
        raise InvalidInput(
            f"samples[{i}].views.{name}: features too large for the model (its evidence overflows)"
        )
    opinions = opinion_from_evidence(evidence)
    fused = fuse(opinions, batch.method, lam=batch.lam, mask=batch.present)
    flag = manifest.conflict_flag
    max_conflict = fused.conflict.max(axis=(-1, -2))  # the same for every method and lambda
    if flag.score == "uncertainty":
        # The threshold was calibrated on the manifest's fusion: judge every request by that, whatever
        # fusion the client asked for, so the flag keeps its false-positive rate.
        calibrated = (manifest.fusion.method, manifest.fusion.lam) == (batch.method, batch.lam)
        reference = (
            fused
            if calibrated
            else fuse(opinions, manifest.fusion.method, lam=manifest.fusion.lam, mask=batch.present)
        )
        score = reference.uncertainty
    else:
        score = max_conflict
    flagged = score >= flag.threshold
    # The view most to blame: the one in most conflict with the others (for DBF, the most discounted).
    blame = np.where(batch.present, fused.conflict.sum(-1), -1.0).argmax(-1)
    predictions = _predictions(model, batch, opinions, fused, flagged, blame)
    _record(model, batch, fused, max_conflict, flagged, blame)
    return {
        "model": manifest.name,
        "method": batch.method,
        "lambda": batch.lam,
        "views": [view.name for view in manifest.views],
        "predictions": predictions,
    }


def _predictions(model, batch, opinions, fused, flagged, blame) -> list[dict[str, Any]]:
    names = [view.name for view in model.manifest.views]
    classes = model.manifest.classes
    labels = fused.probability.argmax(-1)
    out = []
    # Lists once per array (tolist is fast), then plain Python per sample.
    probability, belief = fused.probability.tolist(), fused.belief.tolist()
    uncertainty, conflict, discount = (
        fused.uncertainty.tolist(),
        fused.conflict.tolist(),
        fused.discount.tolist(),
    )
    view_belief, view_uncertainty = opinions.belief.tolist(), opinions.uncertainty.tolist()
    for i, present in enumerate(batch.present.tolist()):
        matrix = [
            [value if present[a] and present[b] else None for b, value in enumerate(row)]
            for a, row in enumerate(conflict[i])
        ]
        out.append(
            {
                "label": int(labels[i]),
                "class_name": classes[labels[i]],
                "probability": probability[i],
                "belief": belief[i],
                "uncertainty": uncertainty[i],
                "conflict": [row if present[a] else None for a, row in enumerate(matrix)],
                "discount": {name: discount[i][v] for v, name in enumerate(names) if present[v]},
                "high_conflict": bool(flagged[i]),
                "blamed_view": names[blame[i]] if flagged[i] else None,
                "views": {
                    name: {"belief": view_belief[i][v], "uncertainty": view_uncertainty[i][v]}
                    for v, name in enumerate(names)
                    if present[v]
                },
            }
        )
    return out


def _record(model, batch, fused, max_conflict, flagged, blame) -> None:
    name, method = model.manifest.name, batch.method
    n = len(flagged)
    metrics.PREDICTIONS.labels(name, method).inc(n)
    metrics.HIGH_CONFLICT.labels(name, method).inc(int(flagged.sum()))
    metrics.BATCH_SIZE.labels(name).observe(n)
    uncertainty, conflict = (
        metrics.UNCERTAINTY.labels(name, method),
        metrics.MAX_CONFLICT.labels(name, method),
    )
    for u, c in zip(fused.uncertainty.tolist(), max_conflict.tolist(), strict=True):
        uncertainty.observe(u)
        conflict.observe(c)
    for v, view in enumerate(model.manifest.views):
        histogram = metrics.VIEW_DISCOUNT.labels(name, view.name)
        for eta in fused.discount[batch.present[:, v], v].tolist():
            histogram.observe(eta)
        blamed = int((flagged & (blame == v)).sum())
        if blamed:
            metrics.FLAGGED_BY_VIEW.labels(name, view.name).inc(blamed)


def _fusion_options(payload: dict, model: LoadedModel) -> tuple[str, float]:
    method = payload.get("method", model.manifest.fusion.method)
    if method not in METHODS:
        raise InvalidInput(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    lam = payload.get("lambda", model.manifest.fusion.lam)
    if type(lam) is not float or not math.isfinite(lam) or lam <= 0:
        raise InvalidInput(f"'lambda' must be a positive finite number, got {lam!r}")
    return method, float(lam)


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
    if np.abs(array).max(initial=0) > np.finfo(np.float32).max:
        raise InvalidInput(f"{where}: values must fit in float32")
    return array.astype(np.float32)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key(s) {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)
