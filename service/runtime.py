"""A batch's way through a model: each present view's head -> evidence -> fusion -> flag -> :class:`Result`,
and the result as the JSON answer. Nothing here touches the disk or the event loop: it runs in a worker
thread.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import orjson

from fusion import fuse, opinion_from_evidence
from service import metrics
from service.errors import InvalidInput
from service.parsing import Batch
from service.repository import LoadedModel


@dataclass(frozen=True)
class Result:
    """Per-sample answers as arrays (N samples, V views, K classes); :meth:`rows` slices them."""

    present: np.ndarray  # (N, V) bool
    label: np.ndarray  # (N,) int
    probability: np.ndarray  # (N, K)
    belief: np.ndarray  # (N, K)
    uncertainty: np.ndarray  # (N,)
    conflict: np.ndarray  # (N, V, V)
    discount: np.ndarray  # (N, V)
    high_conflict: np.ndarray  # (N,) bool
    blamed_view: np.ndarray  # (N,) int, the view in most conflict (meaningful where flagged)
    view_belief: np.ndarray  # (N, V, K)
    view_uncertainty: np.ndarray  # (N, V)
    method: str
    lam: float

    def __len__(self) -> int:
        return self.label.shape[0]

    def rows(self, start: int, stop: int) -> Result:
        sliced = {
            f.name: getattr(self, f.name)[start:stop] for f in fields(self) if f.name not in ("method", "lam")
        }
        return Result(**sliced, method=self.method, lam=self.lam)


def predict(model: LoadedModel, batch: Batch) -> Result:
    """Run the heads on the rows that carry each view, fuse, flag, and record the metrics."""
    manifest = model.manifest
    n, k = len(batch), len(manifest.classes)
    evidence = np.zeros((n, len(manifest.views), k), dtype=np.float32)
    complete = bool(batch.present.all())  # the common case: no masks to apply (fusion's fixed cost -40%)
    for v, view in enumerate(manifest.views):
        if complete:
            evidence[:, v] = model.sessions[view.name].run(
                ["evidence"], {"features": batch.features[view.name]}
            )[0]
            continue
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
    mask = None if complete else batch.present  # all present: the same fusion, without the masking
    fused = fuse(opinions, batch.method, lam=batch.lam, mask=mask)
    flag = manifest.conflict_flag
    max_conflict = fused.conflict.max(axis=(-1, -2))  # the same for every method and lambda
    if flag.score == "uncertainty":
        # The threshold was calibrated on the manifest's fusion: judge every request by that, whatever
        # fusion the client asked for, so the flag keeps its false-positive rate.
        calibrated = (manifest.fusion.method, manifest.fusion.lam) == (batch.method, batch.lam)
        reference = (
            fused
            if calibrated
            else fuse(opinions, manifest.fusion.method, lam=manifest.fusion.lam, mask=mask)
        )
        score = reference.uncertainty
    else:
        score = max_conflict
    flagged = score >= flag.threshold
    # The view most to blame: the one in most conflict with the others (for DBF, the most discounted).
    blame = np.where(batch.present, fused.conflict.sum(-1), -1.0).argmax(-1)
    _record(model, batch, fused, max_conflict, flagged, blame)
    return Result(
        present=batch.present,
        label=fused.probability.argmax(-1),
        probability=fused.probability,
        belief=fused.belief,
        uncertainty=fused.uncertainty,
        conflict=fused.conflict,
        discount=fused.discount,
        high_conflict=flagged,
        blamed_view=blame,
        view_belief=opinions.belief,
        view_uncertainty=opinions.uncertainty,
        method=batch.method,
        lam=batch.lam,
    )


def render(model: LoadedModel, result: Result) -> bytes:
    """The JSON answer: per sample the prediction, its opinion, conflict matrix, discounts, flag and views.

    Views not sent are ``null`` in the conflict matrix and absent from ``discount`` and ``views``.
    """
    names = [view.name for view in model.manifest.views]
    classes = model.manifest.classes
    # Lists once per array (tolist is fast), then plain Python per sample.
    label, probability, belief = result.label.tolist(), result.probability.tolist(), result.belief.tolist()
    uncertainty, conflict = result.uncertainty.tolist(), result.conflict.tolist()
    discount, flagged, blame = (
        result.discount.tolist(),
        result.high_conflict.tolist(),
        result.blamed_view.tolist(),
    )
    view_belief, view_uncertainty = result.view_belief.tolist(), result.view_uncertainty.tolist()
    predictions = []
    for i, present in enumerate(result.present.tolist()):
        if all(present):
            matrix = conflict[i]
        else:
            matrix = [
                [value if present[b] else None for b, value in enumerate(row)] if present[a] else None
                for a, row in enumerate(conflict[i])
            ]
        predictions.append(
            {
                "label": label[i],
                "class_name": classes[label[i]],
                "probability": probability[i],
                "belief": belief[i],
                "uncertainty": uncertainty[i],
                "conflict": matrix,
                "discount": {name: discount[i][v] for v, name in enumerate(names) if present[v]},
                "high_conflict": flagged[i],
                "blamed_view": names[blame[i]] if flagged[i] else None,
                "views": {
                    name: {"belief": view_belief[i][v], "uncertainty": view_uncertainty[i][v]}
                    for v, name in enumerate(names)
                    if present[v]
                },
            }
        )
    answer = {
        "model": model.manifest.name,
        "method": result.method,
        "lambda": result.lam,
        "views": names,
        "predictions": predictions,
    }
    return orjson.dumps(answer)


def _record(model, batch, fused, max_conflict, flagged, blame) -> None:
    """Per-sample metrics, observed in bulk (one histogram update per bucket, not per sample)."""
    children = metrics.children(
        model.manifest.name, batch.method, [view.name for view in model.manifest.views]
    )
    children.predictions.inc(len(flagged))
    children.high_conflict.inc(int(flagged.sum()))
    metrics.observe_many(children.uncertainty, fused.uncertainty)
    metrics.observe_many(children.max_conflict, max_conflict)
    for v, view_children in enumerate(children.views):
        metrics.observe_many(view_children.discount, fused.discount[batch.present[:, v], v])
        blamed = int((flagged & (blame == v)).sum())
        if blamed:
            view_children.flagged.inc(blamed)
