"""Split conformal prediction sets over DBF's projected probability, with a finite-sample coverage guarantee.

Calibration (at export) scores each validation sample's true class with a nonconformity score ``s(x, y)``
(large = the class fits the sample badly) and keeps the sorted scores. At request time, for a coverage
``c``, ``q = the ceil((n + 1) c)-th smallest calibration score`` and the prediction set of a sample is
``{k : s(x, k) <= q}``. If the request's sample and its true class are exchangeable with the n calibration
samples, the set contains the true class with probability at least ``c`` (Vovk et al. 2005; Angelopoulos &
Bates, "A gentle introduction to conformal prediction", 2021, section 1); with continuous scores, at most
``c + 1 / (n + 1)``. The guarantee is marginal (on average over samples like the calibration set's), not per
sample, and covers only samples like those calibrated on: for dbf-serve, clean samples with every view
present. On conflictive samples or with views missing nothing is guaranteed; what happens is measured.

Which probabilities: DBF's projected probability ``P = b + u / K``, the one the service returns. Any fixed
score function keeps the guarantee, but one fitted on the calibration data itself (a temperature fitted on
the same validation split) strictly does not; the projected probability is fixed before that data is seen,
so the guarantee holds exactly, the sets do not depend on which confidence calibrator won, and a user can
check a LAC set against the served probabilities (the classes whose probability is at least ``1 - q``).

Scores (:class:`NonconformityScore`), all deterministic (the service answers the same request the same way):

* ``"lac"`` (Sadinle et al., 2019): ``s = 1 - P_y``; the set is the classes with ``P_k >= 1 - q``. The
  smallest mean set size for a given coverage, counting empty sets as 0. A set may be empty: no class
  reaches ``1 - q``, which happens to flat, highly uncertain opinions (DBF's answer to conflict) and, when
  the model is more accurate than the coverage asked for, to its least confident samples; an empty set
  means "no class is plausible enough at this coverage". Sets are as MAPIE's.
* ``"aps"`` (Romano et al., 2020): ``s`` = the probability mass of the classes at least as probable as ``y``
  (``y`` included). Adaptive: flat opinions get large sets. Not randomised: Romano et al. subtract
  ``U * P_y`` (``U`` uniform) from the score and drop the set's last class at random, which makes coverage
  exact rather than at least ``c``; without it, coverage is still at least ``c`` and sets are a little
  larger, which is the price of answering deterministically. The predicted label is always in the set
  (what MAPIE calls ``include_last_label=False``): otherwise the most confident samples, whose top class
  alone has more mass than ``q``, would get empty sets.
* ``"raps"`` (Angelopoulos et al., 2021): APS plus ``penalty * max(0, rank(y) - free_rank)`` (rank from 1),
  which discourages long tails of unlikely classes; the same rule for the label.

:func:`choose_score` picks the score whose sets leave the fewest classes to choose from at equal coverage
(cross-validated; an empty set leaves all K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from calibration.folds import cross_validation_folds

ScoreKind = Literal["lac", "aps", "raps"]
SCORE_KINDS: tuple[str, ...] = ("lac", "aps", "raps")
# (n + 1) c is computed in floating point: for n = 89, c = 0.7 it gives 63.00000000000001, whose ceiling
# would take the 64th score where the rule means the 63rd. Products within this of an integer count as it.
_RANK_TOLERANCE = 1e-9
# RAPS penalties tried by choose_score: the grid of Angelopoulos et al. (2021), as MAPIE uses.
RAPS_PENALTIES: tuple[float, ...] = (0.001, 0.01, 0.1, 0.2, 0.5)


class CoverageError(ValueError):
    """A coverage level that is not in (0, 1), or that the calibration set is too small for.

    Attributes
    ----------
    coverage : float
        The level asked for.
    samples : int
        The number of calibration scores.
    """

    def __init__(self, message: str, *, coverage: float, samples: int) -> None:
        super().__init__(message)
        self.coverage = coverage
        self.samples = samples


@dataclass(frozen=True)
class NonconformityScore:
    """A nonconformity score: ``kind`` and, for RAPS, its regularisation.

    Parameters
    ----------
    kind : {"lac", "aps", "raps"}
    penalty : float
        RAPS's ``lambda >= 0``: added per rank beyond ``free_rank``; 0 for LAC and APS.
    free_rank : int
        RAPS's ``k_reg >= 0``: ranks up to it are free; 0 for LAC and APS.

    Examples
    --------
    >>> p = np.array([[0.5, 0.3, 0.2]])
    >>> NonconformityScore("lac").class_scores(p).round(2).tolist()
    [[0.5, 0.7, 0.8]]
    >>> NonconformityScore("aps").class_scores(p).round(2).tolist()
    [[0.5, 0.8, 1.0]]
    >>> NonconformityScore("raps", penalty=0.1, free_rank=1).class_scores(p).round(2).tolist()
    [[0.5, 0.9, 1.2]]
    """

    kind: ScoreKind = "lac"
    penalty: float = 0.0
    free_rank: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCORE_KINDS:
            raise ValueError(
                f"unknown nonconformity score {self.kind!r}; expected one of {', '.join(SCORE_KINDS)}"
            )
        if not (np.isfinite(self.penalty) and self.penalty >= 0) or int(self.free_rank) != self.free_rank:
            raise ValueError(
                f"penalty must be >= 0 and free_rank an integer, got {self.penalty}, {self.free_rank}"
            )
        if self.free_rank < 0 or (self.kind != "raps" and (self.penalty, self.free_rank) != (0, 0)):
            raise ValueError(f"{self.kind} takes no penalty or free_rank (only raps does, free_rank >= 0)")

    def class_scores(self, probability: npt.ArrayLike, /) -> np.ndarray:
        """The score ``s(x, k)`` of every class of every sample: (N, K) -> (N, K).

        LAC and APS scores lie in [0, 1]; RAPS adds up to ``penalty * (K - free_rank)``. Among tied
        probabilities, APS ranks the lower class index first, as ``argmax`` does.
        """
        p = np.asarray(probability, dtype=np.float64)
        if p.ndim != 2:
            raise ValueError(f"probability must have shape (N, K), got {p.shape}")
        if self.kind == "lac":
            return 1.0 - p
        order = np.argsort(-p, axis=1, kind="stable")  # most probable first, ties by class index
        rows = np.arange(p.shape[0])[:, None]
        by_rank = np.cumsum(p[rows, order], axis=1)  # the APS score of the class at each rank
        if self.kind == "raps":
            # Ranks beyond K are free as well: the same scores, and ranks within int64's (free_rank 10**30
            # made an object array that numpy could not add, a 500 for every request of the model).
            free = min(self.free_rank, p.shape[1])
            by_rank += self.penalty * np.maximum(0, np.arange(1 - free, p.shape[1] + 1 - free))
        scores = np.empty_like(by_rank)
        scores[rows, order] = by_rank  # back to class order
        return scores

    def label_scores(self, probability: npt.ArrayLike, labels: npt.ArrayLike, /) -> np.ndarray:
        """``s(x_i, y_i)`` (N,): the calibration scores of samples with true classes ``labels`` (N,)."""
        scores = self.class_scores(probability)
        y = _checked_labels(labels, scores.shape)
        return scores[np.arange(y.size), y]


LAC = NonconformityScore("lac")
APS = NonconformityScore("aps")


def conformal_rank(samples: int, /, *, coverage: float) -> int:
    """``ceil((n + 1) c)``: which order statistic of n calibration scores is the threshold for coverage c.

    Raises
    ------
    CoverageError
        If ``c`` is not in (0, 1), or the rank exceeds ``n``: the level needs ``n >= c / (1 - c)``
        calibration samples; n of them support coverage up to ``n / (n + 1)``.

    Examples
    --------
    >>> conformal_rank(68, coverage=0.9), conformal_rank(19, coverage=0.95)
    (63, 19)
    >>> conformal_rank(18, coverage=0.95)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    calibration.conformal.CoverageError: coverage 0.95 needs at least 19 calibration samples ...
    """
    if not (isinstance(coverage, (int, float, np.floating)) and 0 < coverage < 1):
        raise CoverageError(
            f"coverage must be a number in (0, 1), got {coverage!r}", coverage=coverage, samples=samples
        )
    product = (samples + 1) * float(coverage)
    nearest = round(product)
    rank = nearest if abs(product - nearest) <= _RANK_TOLERANCE * (samples + 1) else math.ceil(product)
    if rank > samples:
        raise CoverageError(
            f"coverage {float(coverage)!r} needs at least {min_calibration_samples(coverage)} calibration "
            f"samples (n >= c / (1 - c)); this model was calibrated on {samples}, enough for coverage up to "
            f"n / (n + 1) = {max_coverage(samples):.6g}",
            coverage=coverage,
            samples=samples,
        )
    return max(rank, 1)


def max_coverage(samples: int, /) -> float:
    """``n / (n + 1)``: the highest coverage n calibration samples can guarantee.

    Examples
    --------
    >>> max_coverage(68)
    0.9855072463768116
    """
    return samples / (samples + 1.0)


def min_calibration_samples(coverage: float, /) -> int:
    """The fewest calibration samples that support ``coverage``: the least n with ``ceil((n + 1) c) <= n``.

    Examples
    --------
    >>> min_calibration_samples(0.9), min_calibration_samples(0.95), min_calibration_samples(0.99)
    (9, 19, 99)
    """
    bound = coverage / (1.0 - coverage)
    nearest = round(bound)
    return int(nearest if abs(bound - nearest) <= _RANK_TOLERANCE * (bound + 1) else math.ceil(bound))


def conformal_quantile(scores_sorted: npt.ArrayLike, /, *, coverage: float) -> float:
    """The threshold ``q``: the ``ceil((n + 1) c)``-th smallest of the n calibration scores (sorted, (n,)).

    Examples
    --------
    >>> conformal_quantile(np.arange(1, 20) / 20, coverage=0.9)  # the 18th of 19
    0.9
    """
    scores = np.asarray(scores_sorted)
    return float(scores[conformal_rank(scores.shape[0], coverage=coverage) - 1])


def calibration_scores(
    probability: npt.ArrayLike, labels: npt.ArrayLike, /, *, score: NonconformityScore = LAC
) -> np.ndarray:
    """The sorted scores (n,) of calibration samples with probabilities (n, K) and true classes (n,).

    Examples
    --------
    >>> calibration_scores(np.array([[0.9, 0.1], [0.4, 0.6]]), np.array([0, 0])).round(2).tolist()
    [0.1, 0.6]
    """
    return np.sort(score.label_scores(probability, labels))


def prediction_set(
    probability: npt.ArrayLike,
    scores_sorted: npt.ArrayLike,
    /,
    *,
    coverage: float,
    score: NonconformityScore = LAC,
) -> np.ndarray:
    """Membership (N, K) of the conformal prediction sets of samples with probabilities (N, K).

    Parameters
    ----------
    probability : array_like, shape (N, K)
        DBF's projected probability (the probabilities the calibration scores were computed from).
    scores_sorted : array_like, shape (n,)
        The calibration scores, ascending (:func:`calibration_scores`).
    coverage : float
        The guaranteed probability that a set holds the true class; at most ``n / (n + 1)``
        (:class:`CoverageError` otherwise).
    score : NonconformityScore
        The score the calibration scores were computed with.

    Returns
    -------
    ndarray of bool, shape (N, K)
        True where class k is in sample i's set. Sets grow with ``coverage`` (nested).

    Examples
    --------
    >>> validation = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    >>> scores = calibration_scores(validation, np.array([0, 0, 1, 0]))
    >>> scores.round(2).tolist()
    [0.1, 0.2, 0.3, 0.4]
    >>> prediction_set(np.array([[0.75, 0.25], [0.5, 0.5]]), scores, coverage=0.6).tolist()  # q = 0.3
    [[True, False], [False, False]]

    APS and RAPS sets hold every class tied with one they hold (here q = 0.8 takes the first three):

    >>> aps = calibration_scores(validation, np.array([0, 0, 1, 0]), score=APS)
    >>> prediction_set(np.full((1, 4), 0.25), aps, coverage=0.6, score=APS).tolist()
    [[True, True, True, True]]
    """
    q = conformal_quantile(scores_sorted, coverage=coverage)
    p = np.asarray(probability, dtype=np.float64)
    members = score.class_scores(p) <= q
    if score.kind != "lac":  # APS and RAPS always hold the label (see the module notes)
        members[np.arange(p.shape[0]), np.argmax(p, axis=1)] = True
        # And every class as probable as one they hold: ranked among themselves by index, tied classes
        # made a flat opinion's set its first classes by number (two of ten equally probable ones, for a
        # sample fused from no view), which the model never said. A larger set keeps the guarantee.
        lowest = np.where(members, p, np.inf).min(axis=1, keepdims=True)
        members |= p >= lowest
    return members


def label_ranks(probability: npt.ArrayLike, labels: npt.ArrayLike, /) -> np.ndarray:
    """The rank (N,) of each true class among its sample's classes, 1 = most probable; ties by class index.

    Examples
    --------
    >>> label_ranks(np.array([[0.2, 0.5, 0.3], [0.4, 0.4, 0.2]]), np.array([0, 1])).tolist()
    [3, 2]
    """
    p = np.asarray(probability, dtype=np.float64)
    y = _checked_labels(labels, p.shape)
    p_label = p[np.arange(y.size), y][:, None]
    before = (p > p_label) | ((p == p_label) & (np.arange(p.shape[1])[None, :] < y[:, None]))
    return 1 + before.sum(axis=1)


@dataclass(frozen=True, eq=False)
class ScoreChoice:
    """What :func:`choose_score` chose, and the evidence, each figure cross-validated per candidate.

    Candidates are named ``"lac"``, ``"aps"`` and ``"raps(penalty=0.1)"`` (RAPS with each fold's own
    ``free_rank``).

    Parameters
    ----------
    score : NonconformityScore
        The winner (for RAPS, with ``free_rank`` recomputed on all the data).
    name : str
        Its candidate name.
    mean_candidates : dict of str to float
        The criterion: the mean number of classes a set leaves to choose from (its size; all K if empty).
    mean_set_size, coverage : dict of str to float
        Mean set size (an empty set counting 0) and empirical coverage.
    """

    score: NonconformityScore
    name: str
    mean_candidates: dict[str, float]
    mean_set_size: dict[str, float]
    coverage: dict[str, float]


def choose_score(
    probability: npt.ArrayLike,
    labels: npt.ArrayLike,
    /,
    *,
    coverage: float,
    folds: int = 5,
    seed: int = 0,
    raps_penalties: tuple[float, ...] = RAPS_PENALTIES,
) -> ScoreChoice:
    """The score, LAC, APS or a RAPS, whose sets leave the fewest classes to choose from at ``coverage``.

    The criterion is the mean number of classes a set leaves a user to choose from: its size, or all K
    when it is empty (an empty LAC set rules no class in, so it decides nothing). Counting an empty set as
    0 instead, as the plain mean set size does, would reward LAC for answering "nothing" wherever a model
    is more accurate than the coverage asked for: on HandWritten (97% accurate) at coverage 0.9, LAC
    leaves 7.5% of clean and 66% of conflictive test samples with empty sets (conflictive coverage 0.33),
    where RAPS answers one class for 92% of clean samples and, for conflictive ones, mostly the two
    classes the views disagree on (conflictive coverage 0.98).

    Each candidate is calibrated on all but one fold and its sets are measured on that fold, so the choice
    is not made on the data the quantile was taken from; all are held to the same nominal coverage. RAPS's
    ``free_rank`` is, as in Angelopoulos et al. (2021), the conformal quantile at ``coverage`` of the true
    class's rank on the calibration part; its penalties are theirs. Ties go to the simpler score (LAC,
    then APS, then RAPS).

    Parameters
    ----------
    probability : array_like, shape (n, K)
        DBF's projected probability of the validation samples.
    labels : array_like of int, shape (n,)
    coverage : float
        The level sets are compared at (the model's default coverage).
    folds, seed : int
        The cross-validation folds.
    raps_penalties : tuple of float
        RAPS candidates.

    Examples
    --------
    Well-calibrated, fairly confident probabilities: LAC's sets are the smallest.

    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.full(4, 0.3), size=400)
    >>> labels = np.array([rng.choice(4, p=row) for row in p])
    >>> choice = choose_score(p, labels, coverage=0.9)
    >>> choice.name, round(choice.mean_candidates["lac"], 2), round(choice.mean_candidates["aps"], 2)
    ('lac', 1.65, 2.2)
    """
    p = np.asarray(probability, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"probability must have shape (n, K), got {p.shape}")
    y = _checked_labels(labels, p.shape)

    def candidates(fit: np.ndarray) -> dict[str, NonconformityScore]:
        free_rank = _raps_free_rank(p[fit], y[fit], coverage=coverage)
        raps = {
            f"raps(penalty={penalty:g})": NonconformityScore("raps", penalty=penalty, free_rank=free_rank)
            for penalty in raps_penalties
        }
        return {"lac": LAC, "aps": APS, **raps}  # simplest first

    sizes: dict[str, list[np.ndarray]] = {}
    covered: dict[str, list[np.ndarray]] = {}
    for fit, held in cross_validation_folds(y.size, folds=folds, seed=seed):
        for name, candidate in candidates(fit).items():
            scores = calibration_scores(p[fit], y[fit], score=candidate)
            members = prediction_set(p[held], scores, coverage=coverage, score=candidate)
            sizes.setdefault(name, []).append(members.sum(axis=1))
            covered.setdefault(name, []).append(members[np.arange(held.size), y[held]])
    size = {name: np.concatenate(parts) for name, parts in sizes.items()}
    left = {name: float(np.mean(np.where(s == 0, p.shape[1], s))) for name, s in size.items()}
    best = min(left, key=left.get)  # the first among equals: the simplest
    return ScoreChoice(
        score=candidates(np.arange(y.size))[best],
        name=best,
        mean_candidates=left,
        mean_set_size={name: float(np.mean(s)) for name, s in size.items()},
        coverage={name: float(np.mean(np.concatenate(parts))) for name, parts in covered.items()},
    )


def _raps_free_rank(probability: np.ndarray, labels: np.ndarray, *, coverage: float) -> int:
    """RAPS's ``k_reg``: the conformal quantile at ``coverage`` of the true classes' ranks."""
    ranks = np.sort(label_ranks(probability, labels))
    return int(ranks[conformal_rank(ranks.size, coverage=coverage) - 1])


def _checked_labels(labels: npt.ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    y = np.asarray(labels)
    if y.shape != shape[:1] or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers of shape ({shape[0]},), got {y.dtype} {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= shape[1]):
        raise ValueError(f"labels must lie in 0 .. {shape[1] - 1}")
    return y.astype(np.int64)


__all__ = [
    "APS",
    "LAC",
    "RAPS_PENALTIES",
    "SCORE_KINDS",
    "CoverageError",
    "NonconformityScore",
    "ScoreChoice",
    "ScoreKind",
    "calibration_scores",
    "choose_score",
    "conformal_quantile",
    "conformal_rank",
    "label_ranks",
    "max_coverage",
    "min_calibration_samples",
    "prediction_set",
]
