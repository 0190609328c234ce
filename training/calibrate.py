"""Everything fitted on clean samples once the heads are trained, and how it measures on any split.

:func:`calibrate` is the one place post-hoc fits happen, for exports and fits alike (:mod:`training.fit`),
on the clean validation split or on every non-test sample's out-of-fold evidence (:mod:`training.crossfit`):

* the high-conflict flag: which score (fused uncertainty or largest pairwise conflict) and which threshold
  flag conflictive samples best while flagging a set share of clean ones (:func:`calibrate_flag`);
* the manifest's ``calibration`` section, ``confidence`` and ``prediction_set``
  (:func:`fit_confidence_and_sets`: the ``calibration`` package does the fitting, on clean samples only).

:func:`evaluate_calibration` measures a calibration on any split, clean and conflictive: ECE and
reliability diagrams before and after, and coverage and set sizes at several requested levels. No torch:
evidence or fused outputs in, numbers out.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> def split(n):
...     uncertainty = rng.uniform(0.2, 0.9, size=n)
...     belief = rng.dirichlet(np.full(4, 0.3), size=n) * (1 - uncertainty)[:, None]
...     truth = scaled_probability(belief, uncertainty, temperature=0.2)  # under-confident opinions
...     labels = (rng.random(n)[:, None] > truth.cumsum(axis=1)).sum(axis=1)
...     return FusedSplit(Opinion(belief, uncertainty), labels)
>>> section = fit_confidence_and_sets(split(300), default_coverage=0.9)
>>> section.confidence.kind, section.conformal.score.kind, len(section.conformal.calibration_scores)
('temperature', 'lac', 300)
>>> report = evaluate_calibration(section, split(2000), coverages=(0.8, 0.9))
>>> report.ece_confidence < 0.05 < report.ece_projected
True
>>> all(abs(report.clean[level].coverage - level) < 0.06 for level in (0.8, 0.9))  # coverage ~ level
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from calibration import (
    CoverageError,
    ModelCalibration,
    ReliabilityDiagram,
    calibration_scores,
    choose_score,
    conformal_rank,
    ece_gap_low,
    ece_noise,
    expected_calibration_error,
    fit_confidence,
    max_coverage,
    reliability_diagram,
    scaled_probability,
    top_probability,
)
from fusion import (
    FusedOpinion,
    Method,
    Opinion,
    agrees_with_the_others,
    fuse,
    opinion_from_evidence,
    top_class_of_the_others,
)
from manifest import (
    Calibration,
    CalibrationFigures,
    CalibrationSamples,
    CalibrationSelection,
    ConflictFlag,
    ConformalScore,
    ConformalSets,
    FlagRates,
    ViewAgreement,
)
from training.data import DataError, MultiViewData
from training.metrics import Rate, auroc
from training.protocol import SPLIT_FRACTIONS, EvaluationSets, Samples, smallest_class_for_validation

DEFAULT_COVERAGE = 0.9
CALIBRATION_FOLDS = 5
# A flag that raises on conflictive samples less than this many times as often as on clean ones is blind: the
# conflict alerts (deploy/prometheus/alerts.yml) fire at twice the clean rate.
BLIND_FLAG_LIFT = 2.0
REPORT_COVERAGES = (0.8, 0.85, 0.9, 0.95)


@dataclass(frozen=True, eq=False)
class FusedSplit:
    """DBF's fused output on one split, fused once: every measure and fit of the split reads it.

    Parameters
    ----------
    clean : fusion.Opinion
        Fused belief (N, K) and uncertainty (N,) of the split's samples (a :class:`fusion.FusedOpinion`,
        with the views' conflict, where :meth:`of_evidence` made it: the flag's scores need it).
    labels : ndarray of int, shape (N,)
        Their true classes.
    conflictive : fusion.Opinion, optional
        The fused output of their conflictive copies, when there are any.
    conflictive_labels : ndarray of int, optional
        The copies' true classes (default: ``labels``, copies in the same order; a copy is only made of a
        sample with two views or more, so with missing views there may be fewer).
    views : fusion.Opinion, optional
        Each view's own opinion of the clean samples, belief (N, V, K) and uncertainty (N, V).
    present : ndarray of bool, shape (N, V), optional
        Which views each clean sample has (None: all).
    """

    clean: Opinion
    labels: np.ndarray
    conflictive: Opinion | None = None
    conflictive_labels: np.ndarray | None = None
    views: Opinion | None = None
    present: np.ndarray | None = None

    @classmethod
    def of_evidence(
        cls,
        evidence: np.ndarray,
        labels: np.ndarray,
        *,
        method: Method,
        lam: float,
        present: np.ndarray | None = None,
        conflictive: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None,
    ) -> FusedSplit:
        """The split fused as the model serves it: ``evidence`` (N, V, K) with its views ``present`` (N, V),
        and optionally its conflictive copies as (evidence, labels, present)."""
        views = opinion_from_evidence(evidence)
        clean = fuse(views, method, lam=lam, mask=present)
        if conflictive is None:
            return cls(clean, labels, views=views, present=present)
        copies, copy_labels, copy_present = conflictive
        fused_copies = fuse(opinion_from_evidence(copies), method, lam=lam, mask=copy_present)
        return cls(clean, labels, fused_copies, copy_labels, views=views, present=present)

    def flag_scores(self) -> tuple[FlagScores, FlagScores]:
        """The flag's candidate scores of the clean samples and of their conflictive copies."""
        return flag_scores(self.clean), flag_scores(self.conflictive)


@dataclass(frozen=True)
class SetFigures:
    """Prediction sets at one coverage on one set of samples."""

    coverage: float
    """Share of samples whose set holds the true class."""
    mean_set_size: float
    empty: float
    """Share of empty sets (LAC: no class is plausible enough)."""
    singleton: float
    """Share of sets of exactly one class."""


@dataclass(frozen=True, eq=False)
class CalibrationReport:
    """What :func:`evaluate_calibration` measured on one split.

    ``clean`` and ``conflictive`` map each requested coverage to its :class:`SetFigures`; levels the
    calibration set is too small for are left out and listed in ``refused``.
    """

    samples: int
    accuracy: float
    ece_projected: float
    ece_confidence: float
    reliability_projected: ReliabilityDiagram
    reliability_confidence: ReliabilityDiagram
    clean: dict[float, SetFigures]
    conflictive: dict[float, SetFigures] | None = None
    conflictive_accuracy: float | None = None
    conflictive_ece_confidence: float | None = None
    refused: list[float] = field(default_factory=list)

    def figures(self, coverage: float) -> CalibrationFigures:
        """The manifest's figures at ``coverage`` (one of the evaluated levels)."""
        clean = self.clean[coverage]
        conflictive = self.conflictive[coverage] if self.conflictive is not None else None
        return CalibrationFigures(
            samples=self.samples,
            ece_projected=self.ece_projected,
            ece_confidence=self.ece_confidence,
            coverage=clean.coverage,
            mean_set_size=clean.mean_set_size,
            conflictive_coverage=conflictive.coverage if conflictive else None,
            conflictive_mean_set_size=conflictive.mean_set_size if conflictive else None,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the reliability diagrams as lists (NaN, in empty bins, as None), levels as strings."""

        def diagram(d: ReliabilityDiagram) -> dict[str, list]:
            return {
                "edges": d.edges.tolist(),
                "count": d.count.tolist(),
                "mean_confidence": [None if np.isnan(v) else float(v) for v in d.mean_confidence],
                "accuracy": [None if np.isnan(v) else float(v) for v in d.accuracy],
            }

        def sets(by_level: dict[float, SetFigures] | None) -> dict[str, dict] | None:
            return None if by_level is None else {f"{c:g}": asdict(f) for c, f in by_level.items()}

        return {
            "samples": self.samples,
            "accuracy": self.accuracy,
            "ece_projected": self.ece_projected,
            "ece_confidence": self.ece_confidence,
            "reliability_projected": diagram(self.reliability_projected),
            "reliability_confidence": diagram(self.reliability_confidence),
            "clean": sets(self.clean),
            "conflictive": sets(self.conflictive),
            "conflictive_accuracy": self.conflictive_accuracy,
            "conflictive_ece_confidence": self.conflictive_ece_confidence,
            "refused": list(self.refused),
        }


def fit_confidence_and_sets(
    validation: FusedSplit,
    *,
    default_coverage: float = DEFAULT_COVERAGE,
    test: FusedSplit | None = None,
    folds: int = CALIBRATION_FOLDS,
    seed: int = 0,
    fitted_on: CalibrationSamples | None = None,
) -> Calibration:
    """The manifest's ``calibration`` section: confidence and prediction sets, fitted on clean samples (the
    validation split's, or cross-fitted).

    The confidence calibrator is whichever of temperature scaling and isotonic binning has the lower
    cross-validated Brier score; the conformal score is whichever of LAC, APS and RAPS gives the smallest
    cross-validated mean set size at ``default_coverage``; the sorted scores of all validation samples are
    kept, so a request may ask for any coverage up to ``n / (n + 1)``. Only clean samples calibrate: the
    coverage guarantee is for samples like them. ``validation.conflictive`` and ``test`` only add figures.

    Parameters
    ----------
    validation : FusedSplit
        DBF's fused output on the validation split, with labels.
    default_coverage : float
        The coverage of a request that names none; also the level candidate scores are compared at.
    test : FusedSplit, optional
        Held-out data for the section's ``test`` figures.
    folds, seed : int
        The cross-validation the choices are made on.
    fitted_on : CalibrationSamples, optional
        What ``validation`` is, for the manifest.
    """
    b, u, y = _arrays(validation)
    confidence = fit_confidence(b, u, y, folds=folds, seed=seed)
    probability = scaled_probability(b, u, temperature=1.0)  # DBF's projected probability, b + u / K
    choice = choose_score(probability, y, coverage=default_coverage, folds=folds, seed=seed)
    calibrated = ModelCalibration(
        confidence_calibrator=confidence.calibrator,
        score=choice.score,
        calibration_scores=calibration_scores(probability, y, score=choice.score),
        default_coverage=default_coverage,
    )
    in_sample = evaluate_calibration(calibrated, validation, coverages=(default_coverage,))
    # Cross-validated where the fit saw the data: each sample's confidence and set come from a fit without it.
    validation_figures = in_sample.figures(default_coverage).model_copy(
        update={
            "ece_confidence": expected_calibration_error(confidence.out_of_fold, b.argmax(axis=1) == y),
            "coverage": choice.coverage[choice.name],
            "mean_set_size": choice.mean_set_size[choice.name],
        }
    )
    test_figures = None
    if test is not None:
        test_report = evaluate_calibration(calibrated, test, coverages=(default_coverage,))
        test_figures = test_report.figures(default_coverage)
    score = choice.score
    return Calibration(
        confidence=confidence.calibrator.parameters(),
        conformal=ConformalSets(
            score=ConformalScore(kind=score.kind, penalty=score.penalty, free_rank=score.free_rank),
            calibration_scores=calibrated.calibration_scores.tolist(),
            default_coverage=default_coverage,
        ),
        selection=CalibrationSelection(
            confidence_brier=confidence.brier, mean_candidates=choice.mean_candidates
        ),
        validation=validation_figures,
        test=test_figures,
        fitted_on=fitted_on,
    )


def evaluate_calibration(
    calibration: Calibration | ModelCalibration,
    split: FusedSplit,
    *,
    coverages: Sequence[float] = REPORT_COVERAGES,
    bins: int = 15,
) -> CalibrationReport:
    """Measure a calibration (a manifest section, or applied) on a split: clean and conflictive samples.

    ECE (``bins`` equal-width bins) and reliability diagrams of the projected probability's top class and of
    ``confidence`` on the clean samples; for each requested coverage, the empirical coverage, mean set
    size and shares of empty and one-class sets, clean and conflictive (coverage vs requested level). The
    conflictive samples keep their true labels; nothing is guaranteed for them, this measures what happens.
    """
    calibrated = calibration.applied() if isinstance(calibration, Calibration) else calibration
    b, u, y = _arrays(split)
    correct = b.argmax(axis=1) == y
    confidence = calibrated.confidence(b, u)
    projected = top_probability(b, u)
    levels, refused = [], []
    for level in coverages:
        try:
            conformal_rank(calibrated.calibration_scores.size, coverage=level)
            levels.append(level)
        except CoverageError:
            refused.append(level)
    conflictive = conflictive_accuracy = conflictive_ece = None
    if split.conflictive is not None:
        yc = y if split.conflictive_labels is None else np.asarray(split.conflictive_labels, np.int64)
        bc, uc = _opinion(split.conflictive, yc.size)
        conflictive_correct = bc.argmax(axis=1) == yc
        conflictive = _set_figures(calibrated, bc, uc, yc, levels)
        conflictive_accuracy = float(conflictive_correct.mean())
        conflictive_ece = expected_calibration_error(
            calibrated.confidence(bc, uc), conflictive_correct, bins=bins
        )
    return CalibrationReport(
        samples=y.size,
        accuracy=float(correct.mean()),
        ece_projected=expected_calibration_error(projected, correct, bins=bins),
        ece_confidence=expected_calibration_error(confidence, correct, bins=bins),
        reliability_projected=reliability_diagram(projected, correct, bins=bins),
        reliability_confidence=reliability_diagram(confidence, correct, bins=bins),
        clean=_set_figures(calibrated, b, u, y, levels),
        conflictive=conflictive,
        conflictive_accuracy=conflictive_accuracy,
        conflictive_ece_confidence=conflictive_ece,
        refused=refused,
    )


def confidence_noise(calibration: Calibration, split: FusedSplit) -> float:
    """The ECE that a perfectly calibrated ``confidence``, with ``split``'s clean samples' confidences,
    exceeds one time in 20 (:func:`calibration.ece_noise`): how small an ECE the split can tell from noise."""
    return ece_noise(calibration.applied().confidence(split.clean.belief, split.clean.uncertainty))


def confidence_gap_low(calibration: Calibration, split: FusedSplit) -> float:
    """How much less calibrated the served ``confidence`` is than the projected probability on ``split``'s
    clean samples, at least, 19 times in 20 (:func:`calibration.ece_gap_low`, their ECE's gap over paired
    resamples): at or below 0, the split cannot tell which of the two is better calibrated."""
    b, u, y = _arrays(split)
    confidence = calibration.applied().confidence(b, u)
    return ece_gap_low(confidence, top_probability(b, u), b.argmax(axis=1) == y)


def confidence_warnings(calibration: Calibration, *, noise: float, gap_low: float) -> list[str]:
    """Where the served ``confidence`` is less calibrated on the test split than the projected probability
    it was fitted to improve, beyond ``noise`` (:func:`confidence_noise`) and by a gap beyond chance
    (``gap_low`` above 0, :func:`confidence_gap_low`): its calibrator did not carry over.
    An audit's fit had ECE 0.173 against 0.098, noise up to 0.144, and its card said the figures only. A
    probe's had 0.234 against 0.156 on 29 test samples, a gap the samples could not tell from chance, and
    on 20,000 new ones 0.127 against 0.281: the warning's advice, to read the probability, was wrong."""
    figures = calibration.test
    if figures is None or figures.ece_confidence <= max(figures.ece_projected, noise) or gap_low <= 0:
        return []
    return [
        f"the served `confidence` ({calibration.confidence.kind}) has ECE {figures.ece_confidence:.3f} on "
        f"the {figures.samples} clean test samples, above the projected probability's "
        f"{figures.ece_projected:.3f} (by at least {gap_low:.3f}, 19 times in 20) and above what sampling "
        f"noise explains there ({noise:.3f}): its calibrator did not carry over to new data; until a fit "
        "on more data calibrates it, read the answers' `probability`"
    ]


def class_coverage(calibration: Calibration, split: FusedSplit, *, coverage: float) -> list[Rate]:
    """For each class, how often the prediction sets at ``coverage`` hold it on ``split``'s clean samples of
    it: the guarantee is over all samples, and a class with few samples may be covered far less often.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> def split(n):
    ...     belief = rng.dirichlet(np.full(3, 0.5), size=n) * 0.8
    ...     labels = np.array([rng.choice(3, p=row / row.sum()) for row in belief])
    ...     return FusedSplit(Opinion(belief, np.full(n, 0.2)), labels)
    >>> section = fit_confidence_and_sets(split(300), default_coverage=0.9)
    >>> rates = class_coverage(section, split(600), coverage=0.9)
    >>> len(rates), sum(rate.total for rate in rates), all(0.8 < rate.value <= 1 for rate in rates)
    (3, 600, True)
    """
    calibrated = calibration.applied()
    b, u, y = _arrays(split)
    members = calibrated.prediction_set(calibrated.projected_probability(b, u), coverage=coverage)
    covered = members[np.arange(y.size), y]
    return [Rate.of(covered[y == k]) for k in range(b.shape[1])]


def _set_figures(
    calibrated: ModelCalibration, b: np.ndarray, u: np.ndarray, y: np.ndarray, levels: Sequence[float]
) -> dict[float, SetFigures]:
    probability = calibrated.projected_probability(b, u)
    out = {}
    for level in levels:
        members = calibrated.prediction_set(probability, coverage=level)
        size = members.sum(axis=1)
        out[level] = SetFigures(
            coverage=float(members[np.arange(y.size), y].mean()),
            mean_set_size=float(size.mean()),
            empty=float(np.mean(size == 0)),
            singleton=float(np.mean(size == 1)),
        )
    return out


def _arrays(split: FusedSplit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.asarray(split.labels)
    b, u = _opinion(split.clean, y.shape[0] if y.ndim == 1 else -1)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be a vector of integers, got {y.dtype} {y.shape}")
    return b, u, y.astype(np.int64)


def _opinion(opinion: Opinion, n: int) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(opinion.belief, dtype=np.float64)
    u = np.asarray(opinion.uncertainty, dtype=np.float64)
    if b.ndim != 2 or u.shape != b.shape[:1] or b.shape[0] != n:
        raise ValueError(
            f"expected fused belief ({n}, K) and uncertainty ({n},), got {b.shape} and {u.shape}"
        )
    return b, u


# --- each view's agreement with the other views fused ------------------------------------------------


def agreeing_views(split: FusedSplit) -> tuple[np.ndarray, np.ndarray]:
    """Which views of ``split``'s clean samples agree with the other views fused, and where it is measured.

    Returns
    -------
    agreed : ndarray of bool, shape (N, V)
        The view's top class is that of the others fused (:func:`fusion.agrees_with_the_others`).
    compared : ndarray of bool, shape (N, V)
        The sample has every view (fused): as the service compares them, a view beside fewer others
        agreeing at another rate.
    """
    if split.views is None:
        raise ValueError("the split holds no per-view opinions: fuse it with FusedSplit.of_evidence")
    agreed, compared = agrees_with_the_others(split.views, mask=split.present)
    compared = np.asarray(compared)
    if split.present is not None:
        compared = compared & split.present.all(-1, keepdims=True)
    return np.asarray(agreed), compared


def view_agreement(
    fitted: FusedSplit, view_names: Sequence[str], *, test: FusedSplit | None = None
) -> dict[str, ViewAgreement] | None:
    """The manifest's ``view_agreement``: per view, its agreement rate with the other views fused on the
    clean samples fitted on that have every view (with the low end of its 95% interval), the rate a view
    independent of the others would have there (its chance level), and its rate on ``test``'s such samples.
    None where no sample has every view (or the model has one view).

    Examples
    --------
    >>> belief = np.array([[[0.9, 0.0], [0.8, 0.0], [0.6, 0.1]], [[0.0, 0.9], [0.7, 0.0], [0.0, 0.8]]])
    >>> views = Opinion(belief, 1 - belief.sum(-1))
    >>> fused = Opinion(np.array([[0.95, 0.0], [0.1, 0.5]]), np.array([0.05, 0.4]))
    >>> rates = view_agreement(FusedSplit(fused, np.array([0, 1]), views=views), ["a", "b", "c"])
    >>> rates["a"].clean, rates["b"].clean, rates["b"].chance, rates["b"].samples
    (1.0, 0.5, 0.5, 2)
    """
    agreed, compared = agreeing_views(fitted)
    chance = _chance_agreement(fitted, compared)
    tested = None if test is None else agreeing_views(test)
    rates = {}
    for v, name in enumerate(view_names):
        fitted_rate = Rate.of(agreed[compared[:, v], v])
        if not fitted_rate.total:
            continue
        test_rate = None if tested is None else Rate.of(tested[0][tested[1][:, v], v])
        rates[name] = ViewAgreement(
            clean=fitted_rate.value,
            clean_low=fitted_rate.interval[0],
            samples=fitted_rate.total,
            chance=chance[v],
            test=test_rate.value if test_rate and test_rate.total else None,
            test_samples=test_rate.total if test_rate and test_rate.total else None,
        )
    return rates or None


def agreement_warnings(fitted: FusedSplit, test: FusedSplit, view_names: Sequence[str]) -> list[str]:
    """Where a view's agreement with the others on the clean test samples lies below the rate the
    ``DBFViewDisagreement`` alert fires at (:attr:`manifest.ViewAgreement.alert_below`, from the samples
    fitted on), beyond chance (the upper end of its 95% interval below it): the served heads agree less than
    those the threshold was measured on (fold models, underfitted ones), and the alert would fire on clean
    traffic. Views with the same figures (two views agree or disagree together) share one note."""
    rates = view_agreement(fitted, view_names) or {}
    agreed, compared = agreeing_views(test)
    groups: dict[tuple[int, int, float], list[str]] = {}
    for v, name in enumerate(view_names):
        if name not in rates:
            continue
        rate = Rate.of(agreed[compared[:, v], v])
        if rate.total and rate.interval[1] < rates[name].alert_below:
            groups.setdefault((rate.count, rate.total, rates[name].alert_below), []).append(f"`{name}`")
    notes = []
    for (count, total, below), names in groups.items():
        rate = Rate(count, total)
        low, high = rate.interval
        who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
        notes.append(
            f"{who} agreed with the other views on {rate.value:.1%} [{low:.1%}, {high:.1%}] of the {total} "
            f"clean test samples, below the {below:.1%} the DBFViewDisagreement alert fires at (set on the "
            "samples the calibrations were fitted on): the served heads agree less than those it was "
            "measured on, and the alert would fire on clean traffic; train longer (--epochs, --max-minutes) "
            "or fit more data, else leave the view out (--views) or silence that alert for this model"
        )
    return notes


def _chance_agreement(split: FusedSplit, compared: np.ndarray) -> list[float]:
    """Per view, the agreement of a top class drawn independently of the other views' (as a view shuffled
    between samples has): the sum over classes of the view's share of top classes times the others', over
    the samples where the view is compared."""
    view_top = np.asarray(split.views.belief).argmax(axis=-1)
    others_top = np.asarray(top_class_of_the_others(split.views, mask=split.present))
    k = np.asarray(split.views.belief).shape[-1]
    out = []
    for v in range(compared.shape[1]):
        rows = compared[:, v]
        n = max(int(rows.sum()), 1)
        view_share = np.bincount(view_top[rows, v], minlength=k) / n
        others_share = np.bincount(others_top[rows, v], minlength=k) / n
        # math.fsum of the products, correctly rounded: a BLAS dot product's last bit follows the CPU's
        # vector width (committed manifests computed on one machine differed from another's in it).
        out.append(math.fsum(view_share * others_share))
    return out


# --- the high-conflict flag, and everything at once ---------------------------------------------------

FlagScores = dict[str, np.ndarray]
"""A set's candidate flag scores: ``{"uncertainty": (N,), "max_conflict": (N,)}``."""


def flag_scores(fused: FusedOpinion) -> FlagScores:
    """The flag's two candidate scores of fused samples: fused uncertainty and the largest pairwise
    conflict between their views, each (N,)."""
    return {"uncertainty": fused.uncertainty, "max_conflict": fused.conflict.max(axis=(-1, -2))}


def calibrate_flag(
    clean: FlagScores,
    conflictive: FlagScores,
    *,
    target_false_positive_rate: float,
) -> tuple[str, float, dict[str, float]]:
    """Choose the flag's score and threshold on calibration data.

    For each candidate score, the threshold flags ``target_false_positive_rate`` of the clean samples
    (``score >= threshold``; more only where scores tie); the score kept is the one whose threshold flags
    the most conflictive samples (ties: the higher AUROC). The flag is served at that one threshold, so that
    is where the scores are compared; AUROC averages over every threshold: on PIE both score 0.71 on the
    test split, where at a 5% clean rate the largest conflict flags 46% of conflictive samples and fused
    uncertainty 7%, and 544 cross-fitted samples chose the latter by AUROC (0.646 against 0.641).

    Parameters
    ----------
    clean, conflictive : FlagScores
        Scores of clean calibration samples and of their conflictive copies.

    Returns
    -------
    (score, threshold, AUROC per score)
    """
    positive = np.concatenate(
        [np.zeros(len(clean["uncertainty"]), bool), np.ones(len(conflictive["uncertainty"]), bool)]
    )
    separation, thresholds, detected = {}, {}, {}
    for name in ("uncertainty", "max_conflict"):
        separation[name] = auroc(np.concatenate([clean[name], conflictive[name]]), positive)
        thresholds[name] = float(np.quantile(clean[name], 1 - target_false_positive_rate, method="higher"))
        detected[name] = float(np.mean(conflictive[name] >= thresholds[name]))
    score = max(separation, key=lambda name: (detected[name], separation[name]))
    return score, thresholds[score], separation


MIN_EXPECTED_FLAGS = 10
"""The fewest flags the target rate must expect among the clean calibration samples: below it the threshold
is one of the few highest scores, and the rate it gives new data strays far from the target (18 samples at
5%: 0.9 expected, and a test rate of 13.7% measured on wine)."""


@dataclass(frozen=True, eq=False)
class PostHoc:
    """What :func:`calibrate` fitted: the flag, the manifest's calibration section, and the samples both
    were fitted on (``fitted``, described by ``fitted_on``)."""

    score: str
    threshold: float
    target_false_positive_rate: float
    separation: dict[str, float]  # AUROC of each candidate score on the samples fitted on
    fitted: FusedSplit
    fitted_on: CalibrationSamples
    section: Calibration

    def raised(self, split: FusedSplit) -> tuple[Rate, Rate]:
        """How many of ``split``'s clean samples, and of their conflictive copies, the flag raises."""
        return tuple(Rate.of(scores[self.score] >= self.threshold) for scores in split.flag_scores())

    def conflict_flag(self, test: FusedSplit) -> ConflictFlag:
        """The manifest's flag, with its rates on the samples fitted on and on the test split ``test``."""

        def rates(split: FusedSplit) -> FlagRates:
            clean, conflictive = self.raised(split)
            return FlagRates(clean=clean.value, conflictive=conflictive.value)

        return ConflictFlag(
            score=self.score,
            threshold=self.threshold,
            target_false_positive_rate=self.target_false_positive_rate,
            validation_auroc=self.separation,
            validation=rates(self.fitted),
            test=rates(test),
        )

    def view_agreement(self, test: FusedSplit, view_names: Sequence[str]) -> dict[str, ViewAgreement] | None:
        """The manifest's ``view_agreement``: measured on the samples fitted on, and on ``test``."""
        return view_agreement(self.fitted, view_names, test=test)

    def calibration_section(self, test: FusedSplit) -> Calibration:
        """The manifest's calibration section, with its figures on the test split ``test``."""
        coverage = self.section.conformal.default_coverage
        figures = evaluate_calibration(self.section, test, coverages=(coverage,)).figures(coverage)
        return self.section.model_copy(update={"test": figures})

    def agreement_warnings(self, test: FusedSplit, view_names: Sequence[str]) -> list[str]:
        """Views whose agreement on ``test`` lies below their alert's threshold
        (:func:`agreement_warnings`)."""
        return agreement_warnings(self.fitted, test, view_names)

    def flag_warnings(self, test: FusedSplit) -> list[str]:
        """Where the flag's rate on the clean test samples is far from its target: its 95% interval
        excludes the target and the rate is below half of it or above twice it (an interval alone misses
        the target in one fit of twenty by chance). The threshold was fitted on other samples (out-of-fold
        evidence, or the validation split): a view that carries nothing (a constant one, whose head's
        single opinion differs from model to model) moves every sample's conflict at once."""
        clean, conflictive = self.raised(test)
        low, high = clean.interval
        target = self.target_false_positive_rate
        notes = []
        fitted, _ = self.raised(self.fitted)
        if fitted.value > 2 * target:  # a quantile: above it only where scores tie at it (or too few)
            notes.append(
                f"the flag raised {fitted.value:.1%} of the {fitted.total} clean samples its threshold was "
                f"fitted on (and {clean.value:.1%} of the {clean.total} clean test samples), against its "
                f"target {target:.1%}: their scores tie at the threshold, so none gives the target. Seen "
                "where the fused opinions are alike on every sample (heads that learnt nothing yet, or "
                "every view discounted to vacuous by a small --lambda)"
            )
        elif not (low <= target <= high or target / 2 <= clean.value <= 2 * target):
            notes.append(
                f"the flag raised {clean.value:.1%} [{low:.1%}, {high:.1%}] of the {clean.total} clean test "
                f"samples, against its target {target:.1%} on the samples its threshold was fitted on: it "
                "does not carry over to new data. Seen where a view carries nothing (a constant one: leave "
                "it out with --views) and where a view is missing for some classes only; else fit more data"
            )
        catches_none = conflictive.total > 0 and conflictive.count == 0
        if conflictive.value < BLIND_FLAG_LIFT * clean.value or catches_none:
            notes.append(
                f"the flag hardly tells conflictive test samples from clean ones: it raised "
                f"{conflictive.value:.1%} of conflictive and {clean.value:.1%} of clean ones (less than "
                f"{BLIND_FLAG_LIFT:g} times, or none): do not route samples on it alone, and its alerts "
                "cannot see a modality that fails within its training range (each view's agreement with "
                "the others can: DBFViewDisagreement). Seen where the views each "
                "classify weakly and seldom disagree with confidence"
            )
        return notes

    def warnings(self) -> list[str]:
        """What the samples fitted on cannot support: the flag's target rate, the default coverage."""
        n, target = self.fitted_on.samples, self.target_false_positive_rate
        notes = []
        if n * target < MIN_EXPECTED_FLAGS:
            notes.append(
                f"the flag's target, {target:.1%} of clean samples, rests on {n} clean calibration samples "
                f"({n * target:.1f} expected flags, fewer than {MIN_EXPECTED_FLAGS}): its rate on new data "
                "may be far from the target; fit more data (or ask for a higher --target-fpr)"
            )
        coverage = self.section.conformal.default_coverage
        if coverage < DEFAULT_COVERAGE:
            notes.append(
                f"{n} clean calibration samples support prediction sets up to coverage {coverage:.3g}, not "
                f"{DEFAULT_COVERAGE:g}: requests that name none get {coverage:.3g}; fit more data"
            )
        return notes


def check_calibration_splits(data: MultiViewData, sets: EvaluationSets) -> None:
    """Refuse, before training, splits :func:`calibrate` cannot use.

    It cross-validates on the clean validation samples, and fits the high-conflict flag on conflictive copies
    of them (measured on the test split's own copies): copies are made of samples with two views or more.

    Raises
    ------
    DataError
        Fewer validation samples than :data:`CALIBRATION_FOLDS`, or no validation or test sample with two
        views; saying how many there are and what to do.
    """
    source, folds = data.source or data.name, CALIBRATION_FOLDS
    validation = sets.validation
    if len(validation) < folds:
        counts = np.bincount(validation.labels, minlength=data.num_classes)
        held = ", ".join(f"{int(n)} of {name!r}" for name, n in zip(data.class_names, counts, strict=True))
        if data.split is None:
            per_class = smallest_class_for_validation(folds, data.num_classes)
            remedy = (
                f"with {data.num_classes} classes that takes at least {per_class} samples per class "
                f"({SPLIT_FRACTIONS[1]:.0%} of each goes to validation), or a split column (--split-column) "
                f"with at least {folds} validation samples"
            )
        else:
            remedy = f"put at least {folds} samples in validation in the split column"
        raise DataError(
            f"{source}: the validation split holds {len(validation)} samples ({held}); the calibration "
            f"cross-validates on {folds} folds, so it needs at least {folds}: {remedy}"
        )
    for split, use in (("validation", "fitted"), ("test", "measured")):
        if len(sets.conflictive[split]) == 0:
            raise DataError(
                f"{source}: no {split} sample has two views or more; the high-conflict flag is {use} on "
                "conflictive copies of them (one view replaced by another class's), so some need two views"
                + _out_of_range_note(data, getattr(sets, split))
            )


def _out_of_range_note(data: MultiViewData, samples: Samples) -> str:
    """What a refusal adds where views of ``samples`` the data has are left out as out of range."""
    if samples.present is None:
        return ""
    beyond = int((data.present[samples.rows] & ~samples.present).any(axis=1).sum())
    if not beyond:
        return ""
    return (
        f"; {beyond} of its {len(samples)} samples have a view far outside the training split's range, "
        "fused as missing as the service fuses it: are the splits' features measured alike?"
    )


def supported_coverage(samples: int, *, folds: int = CALIBRATION_FOLDS) -> float:
    """The default coverage, or less where ``samples`` calibration samples cannot support it: 0.9 needs 9
    calibration samples, and the cross-validation that chooses the score calibrates on all but a fold."""
    return min(DEFAULT_COVERAGE, max_coverage(samples - -(-samples // folds)))


def calibrate(
    split: FusedSplit,
    *,
    target_false_positive_rate: float,
    folds: int | None = None,
    seed: int = 0,
) -> PostHoc:
    """Fit everything post-hoc on ``split``'s clean samples (and choose the flag's score with their
    conflictive copies).

    Parameters
    ----------
    split : FusedSplit
        The clean validation split fused as the model serves (with its conflictive copies), or the
        out-of-fold evidence of every non-test sample, fused alike (:mod:`training.crossfit`).
    target_false_positive_rate : float
        The share of clean samples the flag raises.
    folds : int, optional
        The number of fold models when ``split`` is cross-fitted; None for the validation split.
    seed : int
        The cross-validation the calibrators are chosen by.
    """
    clean, conflictive = split.flag_scores()
    score, threshold, separation = calibrate_flag(
        clean, conflictive, target_false_positive_rate=target_false_positive_rate
    )
    fitted_on = CalibrationSamples(
        kind="validation" if folds is None else "cross-fitted", samples=len(split.labels), folds=folds
    )
    section = fit_confidence_and_sets(
        split, default_coverage=supported_coverage(len(split.labels)), seed=seed, fitted_on=fitted_on
    )
    return PostHoc(
        score=score,
        threshold=threshold,
        target_false_positive_rate=target_false_positive_rate,
        separation=separation,
        fitted=split,
        fitted_on=fitted_on,
        section=section,
    )


__all__ = [
    "DEFAULT_COVERAGE",
    "MIN_EXPECTED_FLAGS",
    "REPORT_COVERAGES",
    "CalibrationReport",
    "FlagScores",
    "FusedSplit",
    "PostHoc",
    "SetFigures",
    "agreeing_views",
    "agreement_warnings",
    "calibrate",
    "calibrate_flag",
    "check_calibration_splits",
    "evaluate_calibration",
    "fit_confidence_and_sets",
    "flag_scores",
    "view_agreement",
]
