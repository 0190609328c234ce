"""A request's way through a model: each present view's head -> evidence -> fusion -> flag -> :class:`Result`.
Nothing here touches the disk or awaits, or knows a protocol: the data plane runs it on an inference thread,
or on the event loop for a small batch (:meth:`service.dataplane.DataPlane.predict`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from fusion import FusedOpinion, Opinion, agrees_with_the_others, fuse, opinion_from_evidence
from manifest import Manifest
from service import metrics
from service.errors import InvalidInput, ModelFault
from service.inference import InferenceRequest, Result
from service.repository import LoadedModel

log = logging.getLogger("dbf.runtime")


def predict(model: LoadedModel, request: InferenceRequest) -> Result:
    """Run the heads on the rows that carry each view, fuse the views in range, flag, calibrate, and record
    the metrics."""
    evidence, excess = _head_evidence(model, request)
    _check_evidence(model.manifest, evidence)
    mask, out_of_range = _views_to_fuse(model.manifest, request.present, evidence, excess)
    opinions = opinion_from_evidence(evidence)
    fused = fuse(opinions, request.method, lam=request.lam, mask=mask)
    judged = _judged(model, request, opinions, fused, mask=mask)
    fused_views = request.present if mask is None else mask
    blame = _blamed_views(fused.conflict, fused_views, out_of_range, excess)
    _record(model, request, fused, judged, blame, out_of_range, fused_views, complete=mask is None)
    if model.agreeing_views is not None and (rows := model.agreement.rows(len(request))) is not None:
        _record_agreement(model, opinions, mask, rows)
    return Result(
        present=request.present,
        out_of_range=out_of_range,
        label=judged.label,
        probability=fused.probability,
        belief=fused.belief,
        uncertainty=fused.uncertainty,
        conflict=fused.conflict,
        discount=fused.discount,
        high_conflict=judged.flagged,
        blamed_view=blame,
        view_belief=opinions.belief,
        view_uncertainty=opinions.uncertainty,
        confidence=judged.confidence,
        prediction_set=judged.sets,
        method=request.method,
        lam=request.lam,
        coverage=judged.coverage,
    )


# -- the steps -------------------------------------------------------------------------------------------


def _head_evidence(model: LoadedModel, request: InferenceRequest) -> tuple[np.ndarray, np.ndarray]:
    """Each view's evidence (N, V, K), 0 where a sample lacks the view, and its range excess (N, V), 0 where
    in range or not checked: each head run on the rows that carry its view."""
    manifest = model.manifest
    n, k = len(request), len(manifest.classes)
    evidence = np.zeros((n, len(manifest.views), k), dtype=np.float32)
    excess = np.zeros((n, len(manifest.views)), dtype=np.float32)
    complete = bool(request.present.all())
    heads = model.heads_for(n)  # on the provider fastest at this batch size (service.placement)
    for v, view in enumerate(manifest.views):
        rows = slice(None) if complete else request.present[:, v]  # the view's features are those rows' only
        if complete or rows.any():
            features = request.features[view.name]
            given, *checked = heads[view.name].run(features)
            if given.shape != (len(features), k) or (checked and checked[0].shape != (len(features),)):
                # Assigned, a single row was broadcast to every sample of the batch, other requests' too:
                # the load's probe, with batches of up to 3, sees no head that does so for larger ones.
                shapes = " and ".join(str(output.shape) for output in (given, *checked))
                raise _model_fault(
                    manifest.name, view.name, f"gives outputs of shape {shapes} for {len(features)} samples"
                )
            evidence[rows, v] = given
            if checked:
                excess[rows, v] = checked[0]
    return evidence, excess


def _check_evidence(manifest: Manifest, evidence: np.ndarray) -> None:
    """Refuse evidence that no answer can be made of: overflowing (the request's fault) or negative (the
    head's)."""
    with np.errstate(over="ignore"):
        # Each view's total too: finite evidence summing past float32's range made a Dirichlet strength of
        # inf, so beliefs, uncertainty and probabilities of 0, answered 200.
        finite = np.isfinite(evidence.sum(-1))
    if not finite.all():  # features in float32's range can still overflow a head (inf - inf in its matmul)
        i, v = map(int, np.argwhere(~finite)[0])
        raise InvalidInput("features too large for the model (its evidence overflows)", sample=i, view=v)
    if (evidence < 0).any():
        # No working head gives it (its last step is an exp or a softplus), and the load's probe sees zeros
        # only: fused, it made beliefs below 0 and an uncertainty above 1, answered 200 as if right.
        i, v, _ = map(int, np.argwhere(evidence < 0)[0])
        raise _model_fault(
            manifest.name,
            manifest.views[v].name,
            f"gives negative evidence ({evidence[i, v].min():g} for sample {i}); a head's evidence is never "
            "negative",
        )


def _views_to_fuse(
    manifest: Manifest, present: np.ndarray, evidence: np.ndarray, excess: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """The fusion's mask, the views fused (N, V), None where that is every view of every sample (the common
    case, fusion's cheaper path); and the views far outside their training range (N, V), fused as if
    missing, a head's certainty there meaning nothing. Their evidence is zeroed in place, so that their own
    opinions, reported per view, are vacuous as well."""
    out_of_range = ~(excess <= manifest.out_of_range.threshold)  # NaN is out of range too
    if out_of_range.any():
        evidence[out_of_range] = 0.0
        return present & ~out_of_range, out_of_range
    return (None if present.all() else present), out_of_range


@dataclass(frozen=True)
class _Judgement:
    """What is said of each sample's fused opinion: its label, the flag, the calibrated confidence and the
    prediction set at ``coverage`` (None where the model is not calibrated)."""

    label: np.ndarray
    max_conflict: np.ndarray
    flagged: np.ndarray
    confidence: np.ndarray
    sets: np.ndarray
    coverage: float | None


def _judged(
    model: LoadedModel,
    request: InferenceRequest,
    opinions: Opinion,
    fused: FusedOpinion,
    *,
    mask: np.ndarray | None,
) -> _Judgement:
    """Flag, confidence and prediction set of ``fused``, each as the manifest's fusion fitted it."""
    manifest, calibration = model.manifest, model.calibration
    n, k = len(request), len(manifest.classes)
    flag = manifest.conflict_flag
    max_conflict = fused.conflict.max(axis=(-1, -2))  # the same for every method and lambda
    # The flag's threshold, the confidence calibrator and the conformal scores were fitted on the manifest's
    # fusion: every request is judged by that one, whatever fusion it asks for, so that the flag keeps its
    # false-positive rate and the prediction sets their coverage.
    reference = fused
    if (flag.score == "uncertainty" or calibration is not None) and (
        (manifest.fusion.method, manifest.fusion.lam) != (request.method, request.lam)
    ):
        reference = fuse(opinions, manifest.fusion.method, lam=manifest.fusion.lam, mask=mask)
    flagged = (reference.uncertainty if flag.score == "uncertainty" else max_conflict) >= flag.threshold
    if calibration is not None:
        confidence = calibration.confidence(reference.belief, reference.uncertainty).astype(np.float32)
        coverage = calibration.default_coverage if request.coverage is None else request.coverage
        # b + u / K in float64, as fit computed the calibration scores: in float32 a strongly discounted
        # opinion's probabilities all round to 1 / K, and APS and RAPS would rank tied classes by index.
        probability = calibration.projected_probability(reference.belief, reference.uncertainty)
        sets = calibration.prediction_set(probability, coverage=coverage)
    else:
        confidence, coverage = np.full(n, np.nan, np.float32), None
        sets = np.zeros((n, k), dtype=bool)
    # The projected probability's argmax is the belief's (b + u / K adds the same to every class), taken on
    # the belief: where a strong discount leaves beliefs of 1e-12 and an uncertainty of 1 in float32, every
    # probability rounds to 1 / K, and its argmax was class 0 by the tie.
    label = fused.belief.argmax(-1)
    if reference is not fused:
        # The calibrator's probability is that the model's own fusion's label is right: where the fusion asked
        # for answers another label, no calibrated probability of it being right exists.
        confidence = np.where(reference.belief.argmax(-1) == label, confidence, np.float32(np.nan))
    return _Judgement(label, max_conflict, flagged, confidence, sets, coverage)


def _model_fault(model: str, view: str, what: str) -> ModelFault:
    """The refusal of a request that ``view``'s head of ``model`` answered as no working head does, logged:
    the operator's to see, and no fault of the request's."""
    fault = f"model {model!r} is broken: the head of view {view!r} {what}"
    log.error("%s", fault)
    return ModelFault(f"{fault}; the service's operator must replace the model")


def _blamed_views(
    conflict: np.ndarray, fused_views: np.ndarray, out_of_range: np.ndarray, excess: np.ndarray
) -> np.ndarray:
    """The view most to blame in each sample (N,): the one furthest outside its training range where any view
    is (the sample's most certain fault: its head's certainty means nothing there, and the views left may
    agree perfectly, as when one alone is left); else the fused view in most conflict with the others (for
    DBF, the most discounted); -1 (none) where fewer than two views were fused: nothing conflicts there,
    and a flag on the fused uncertainty raised by the views not sent is no fault of the one that was."""
    in_most_conflict = np.where(fused_views, conflict.sum(-1), -1.0).argmax(-1)
    in_most_conflict[fused_views.sum(-1) < 2] = -1
    if not out_of_range.any():
        return in_most_conflict
    furthest = np.where(out_of_range, excess, -1.0).argmax(-1)  # NaN (a NaN feature) counts as most
    return np.where(out_of_range.any(-1), furthest, in_most_conflict)


def _record(
    model, request, fused, judged: _Judgement, blame, out_of_range, fused_views, *, complete: bool
) -> None:
    """Per-sample metrics, observed in bulk (one histogram update per bucket, not per sample); ``fused_views``
    (N, V) the views fused, all of them where ``complete``."""
    children = metrics.children(
        model.manifest.name, request.method, [view.name for view in model.manifest.views]
    )
    flagged = judged.flagged
    children.predictions.inc(len(flagged))
    # The histograms of values in [0, 1] (one set of buckets) in one pass.
    unit, values = [children.uncertainty, children.max_conflict], [fused.uncertainty, judged.max_conflict]
    if request.method == "dbf":  # the other methods discount nothing: their 1s would dilute DBF's mean
        for v, view_children in enumerate(children.views):
            unit.append(view_children.discount)
            values.append(fused.discount[:, v] if complete else fused.discount[fused_views[:, v], v])
    if model.calibration is not None:
        unit.append(children.confidence)
        values.append(judged.confidence)
        metrics.observe_many([children.set_size], [judged.sets.sum(-1)])
    metrics.observe_many(unit, values)
    fused_counts = [len(flagged)] * len(children.views) if complete else fused_views.sum(0).tolist()
    for view_children, count in zip(children.views, fused_counts, strict=True):
        if count:
            view_children.fused.inc(count)
    if out_of_range.any():
        for view_children, count in zip(children.views, out_of_range.sum(0).tolist(), strict=True):
            if count:
                view_children.out_of_range.inc(count)
    if flagged.any():
        children.high_conflict.inc(int(flagged.sum()))
        blamed = blame[flagged]
        blamed = np.bincount(blamed[blamed >= 0], minlength=len(children.views)).tolist()
        for view_children, count in zip(children.views, blamed, strict=True):
            if count:
                view_children.flagged.inc(count)


def _record_agreement(model, opinions, fused_views, rows: slice) -> None:
    """Each measured view's agreement with the other views, over the ``rows`` sampled
    (:class:`metrics.AgreementSampler`) in which every view is fused (``fused_views``; None: all): one
    increment of each counter per view and batch. Only those: the clean rate the alert starts from was
    measured so, and a view beside fewer others agrees at another rate (HandWritten's pix beside mor alone:
    30% of clean samples, under its threshold of 51%, so a sound view was named)."""
    measured, names = model.agreeing_views
    belief, uncertainty = opinions.belief[rows], opinions.uncertainty[rows]
    if fused_views is not None:
        whole = fused_views[rows].all(-1)
        belief, uncertainty = belief[whole], uncertainty[whole]
    agrees, compared = agrees_with_the_others(Opinion(belief, uncertainty), xp=np)
    counts = agrees[:, measured].sum(0).tolist()
    compared = compared[:, measured].sum(0).tolist()
    for children, count, total in zip(
        metrics.agreement_children(model.name, names), counts, compared, strict=True
    ):
        if total:
            children.compared.inc(total)
            if count:
                children.agreed.inc(count)
