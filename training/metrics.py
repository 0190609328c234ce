"""Evaluation metrics for evidential multi-view classifiers, in plain numpy.

Every metric takes arrays positionally and options by keyword, validates shapes, accepts float32 or float64
inputs and computes in float64. ``probability`` is an ``(N, K)`` matrix of class probabilities (for an
evidential head, the expected probability ``alpha / S`` of its Dirichlet); its rows are expected to sum to 1,
which is not checked, but every entry must be finite and in ``[0, 1]`` (up to float32 rounding,
:data:`ROUNDING`, which is clipped: fused near-dogmatic opinions can sum to ``1 + 1.2e-7``). ``labels`` are
integers ``0 .. K-1``.

Examples
--------
>>> probability = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
>>> labels = np.array([0, 1, 1])
>>> accuracy(probability, labels)
0.6666666666666666
>>> round(brier_score(probability, labels), 4)
0.2733
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import rankdata

from calibration import expected_calibration_error as top_label_ece
from calibration import reliability_diagram

__all__ = [
    "accuracy",
    "auroc",
    "expected_calibration_error",
    "reliability",
    "brier_score",
    "negative_log_likelihood",
    "uncertainty_summary",
    "Rate",
    "rate_interval",
    "coverage_band",
]


ROUNDING = 1e-6
"""How far outside ``[0, 1]`` a probability may lie, as float32 rounding leaves it, before it is an error."""


def _as_probability_and_labels(
    probability: npt.ArrayLike, labels: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``probability`` (N, K) and ``labels`` (N,); return them as float64 and int64 arrays."""
    p = np.asarray(probability)
    y = np.asarray(labels)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] == 0:
        raise ValueError(f"probability must have shape (N, K) with N >= 1 and K >= 1, got shape {p.shape}")
    n, k = p.shape
    if y.shape != (n,):
        raise ValueError(f"labels must have shape (N,) = ({n},) to match probability (N, K), got {y.shape}")
    if not np.issubdtype(p.dtype, np.floating):
        raise ValueError(f"probability must be a float array, got dtype {p.dtype}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be an integer array, got dtype {y.dtype}")
    p = p.astype(np.float64)
    if not np.all(np.isfinite(p)) or p.min() < -ROUNDING or p.max() > 1.0 + ROUNDING:
        raise ValueError("probability entries must be finite and in [0, 1]")
    p = np.clip(p, 0.0, 1.0)
    if y.min() < 0 or y.max() >= k:
        raise ValueError(f"labels must lie in 0 .. K-1 = 0 .. {k - 1}, got range {y.min()} .. {y.max()}")
    return p, y.astype(np.int64)


def accuracy(probability: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Fraction of samples whose most probable class is the label.

    Parameters
    ----------
    probability : array_like, shape (N, K)
        Class probabilities.
    labels : array_like of int, shape (N,)
        True classes, ``0 .. K-1``.

    Returns
    -------
    float
        Accuracy in ``[0, 1]``. A tie between classes goes to the lowest index (``np.argmax``).

    Examples
    --------
    >>> accuracy(np.array([[0.5, 0.5], [0.1, 0.9]]), np.array([1, 1]))
    0.5
    """
    p, y = _as_probability_and_labels(probability, labels)
    return float(np.mean(np.argmax(p, axis=1) == y))


def auroc(scores: npt.ArrayLike, positive: npt.ArrayLike) -> float:
    """Area under the ROC curve of ``scores`` for detecting ``positive`` samples.

    Computed exactly in the Mann-Whitney form, the probability that a random positive sample scores higher
    than a random negative one, ties counting 1/2, from average ranks in ``O(N log N)``. In this project the
    score is usually the fused uncertainty and ``positive`` marks the conflictive samples.

    Parameters
    ----------
    scores : array_like, shape (N,)
        Finite real scores; higher means "more likely positive".
    positive : array_like of bool, shape (N,)
        Which samples are positive. Both classes must be non-empty.

    Returns
    -------
    float
        AUROC in ``[0, 1]``: 1 when every positive outscores every negative, 0.5 for constant scores.

    Raises
    ------
    ValueError
        On a shape or dtype mismatch, non-finite scores, or when all samples are positive or all negative.

    Examples
    --------
    >>> auroc(np.array([0.1, 0.4, 0.4, 0.9]), np.array([False, False, True, True]))
    0.875
    """
    s = np.asarray(scores)
    pos = np.asarray(positive)
    if s.ndim != 1:
        raise ValueError(f"scores must have shape (N,), got shape {s.shape}")
    if pos.shape != s.shape:
        raise ValueError(f"positive must have shape (N,) = {s.shape} to match scores, got {pos.shape}")
    if pos.dtype != np.bool_:
        raise ValueError(f"positive must be a boolean array (use .astype(bool)), got dtype {pos.dtype}")
    if not np.issubdtype(s.dtype, np.number) or np.issubdtype(s.dtype, np.complexfloating):
        raise ValueError(f"scores must be a real numeric array, got dtype {s.dtype}")
    s = s.astype(np.float64)
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    n_pos = int(np.count_nonzero(pos))
    n_neg = s.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"AUROC needs at least one positive and one negative sample, got {n_pos} positive and "
            f"{n_neg} negative"
        )
    ranks = rankdata(s, method="average")  # 1-based, ties share their average rank
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0  # pairs (positive, negative) won, ties as 1/2
    return float(u / (n_pos * n_neg))


def expected_calibration_error(probability: npt.ArrayLike, labels: npt.ArrayLike, *, bins: int = 15) -> float:
    """Top-label expected calibration error with equal-width confidence bins (Guo et al., 2017).

    The confidence of a sample is its largest probability, its prediction the argmax (ties to the lowest
    index). With edges ``np.linspace(0, 1, bins + 1)``, bin ``m`` holds the confidences in
    ``(edge[m], edge[m + 1]]``, and confidence 0 goes into the first bin; so 1.0 lies in the last. Then
    ``ECE = sum_m |acc_m - conf_m| * n_m / N`` over the non-empty bins.

    Parameters
    ----------
    probability : array_like, shape (N, K)
        Class probabilities.
    labels : array_like of int, shape (N,)
        True classes, ``0 .. K-1``.
    bins : int, optional
        Number of equal-width bins over ``[0, 1]``, at least 1. Default 15.

    Returns
    -------
    float
        ECE in ``[0, 1]``.

    Examples
    --------
    >>> probability = np.array([[0.8, 0.2], [0.8, 0.2], [0.3, 0.7], [0.3, 0.7]])
    >>> round(expected_calibration_error(probability, np.array([0, 1, 1, 1]), bins=10), 4)
    0.3
    """
    p, y = _as_probability_and_labels(probability, labels)
    # The top-label ECE of a confidence is calibration's (one implementation for training and the service).
    return top_label_ece(p.max(axis=1), np.argmax(p, axis=1) == y, bins=bins)


def reliability(
    probability: npt.ArrayLike, labels: npt.ArrayLike, *, bins: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reliability diagram's points: per confidence bin (as :func:`expected_calibration_error` bins),
    the mean confidence, the accuracy and the number of samples; NaN for an empty bin.

    Returns
    -------
    confidence, accuracy : ndarray of float64, shape (bins,)
    count : ndarray of int64, shape (bins,)

    Examples
    --------
    >>> probability = np.array([[0.8, 0.2], [0.8, 0.2], [0.3, 0.7], [0.3, 0.7]])
    >>> confidence, accuracy, count = reliability(probability, np.array([0, 1, 1, 1]), bins=2)
    >>> confidence.tolist(), accuracy.tolist(), count.tolist()
    ([nan, 0.75], [nan, 0.75], [0, 4])
    """
    p, y = _as_probability_and_labels(probability, labels)
    diagram = reliability_diagram(p.max(axis=1), np.argmax(p, axis=1) == y, bins=bins)
    return diagram.mean_confidence, diagram.accuracy, diagram.count


def brier_score(probability: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Multi-class Brier score: the mean over samples of ``sum_k (p_k - y_k)^2`` with ``y`` one-hot.

    Parameters
    ----------
    probability : array_like, shape (N, K)
        Class probabilities.
    labels : array_like of int, shape (N,)
        True classes, ``0 .. K-1``.

    Returns
    -------
    float
        Brier score in ``[0, 2]``: 0 for confident correct predictions, 2 for confident wrong ones.

    Examples
    --------
    >>> round(brier_score(np.array([[0.7, 0.2, 0.1]]), np.array([0])), 4)
    0.14
    """
    p, y = _as_probability_and_labels(probability, labels)
    diff = p.copy()
    diff[np.arange(p.shape[0]), y] -= 1.0
    return float(np.mean(np.sum(diff * diff, axis=1)))


def negative_log_likelihood(
    probability: npt.ArrayLike, labels: npt.ArrayLike, *, eps: float = 1e-12
) -> float:
    """Mean negative log-likelihood ``-log p_label``, with ``p_label`` clipped below at ``eps``.

    Parameters
    ----------
    probability : array_like, shape (N, K)
        Class probabilities.
    labels : array_like of int, shape (N,)
        True classes, ``0 .. K-1``.
    eps : float, optional
        Positive floor on the label's probability, so that a zero gives ``-log(eps)``, not infinity.

    Returns
    -------
    float
        NLL in ``[0, -log(eps)]``.

    Examples
    --------
    >>> round(negative_log_likelihood(np.array([[0.5, 0.5], [0.1, 0.9]]), np.array([0, 1])), 4)
    0.3993
    """
    if not (np.isfinite(eps) and 0.0 < eps <= 1.0):
        raise ValueError(f"eps must be in (0, 1], got {eps!r}")
    p, y = _as_probability_and_labels(probability, labels)
    p_label = np.maximum(p[np.arange(p.shape[0]), y], eps)
    return float(np.mean(-np.log(p_label)))


def uncertainty_summary(uncertainty: npt.ArrayLike) -> dict[str, float] | dict[str, list[float]]:
    """Mean and (population) standard deviation of uncertainties, per column for a matrix.

    Parameters
    ----------
    uncertainty : array_like, shape (N,) or (N, V)
        Fused uncertainties, or one column per view.

    Returns
    -------
    dict
        ``{"mean": float, "std": float}`` for a 1-D input; ``{"mean": [V floats], "std": [V floats]}`` for a
        2-D one.

    Examples
    --------
    >>> uncertainty_summary(np.array([0.1, 0.3]))
    {'mean': 0.2, 'std': 0.09999999999999999}
    >>> uncertainty_summary(np.array([[0.0, 1.0], [1.0, 1.0]]))
    {'mean': [0.5, 1.0], 'std': [0.5, 0.0]}
    """
    u = np.asarray(uncertainty)
    if u.ndim not in (1, 2) or u.shape[0] == 0:
        raise ValueError(f"uncertainty must have shape (N,) or (N, V) with N >= 1, got shape {u.shape}")
    if not np.issubdtype(u.dtype, np.number) or np.issubdtype(u.dtype, np.complexfloating):
        raise ValueError(f"uncertainty must be a real numeric array, got dtype {u.dtype}")
    u = u.astype(np.float64)
    mean = u.mean(axis=0)
    std = u.std(axis=0)
    if u.ndim == 1:
        return {"mean": float(mean), "std": float(std)}
    return {"mean": mean.tolist(), "std": std.tolist()}


# -- intervals ---------------------------------------------------------------------------------------------


def rate_interval(successes: int, trials: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a rate: ``successes`` out of ``trials``, exact (never below its level).

    The bounds are quantiles of Beta distributions: ``Beta(k, n - k + 1)`` at ``(1 - confidence) / 2`` and
    ``Beta(k + 1, n - k)`` at ``(1 + confidence) / 2``; 0 and 1 where ``k = 0`` and ``k = n``.

    Examples
    --------
    >>> [round(bound, 4) for bound in rate_interval(1, 18)]  # one sample of 18 flagged
    [0.0014, 0.2729]
    >>> rate_interval(0, 0)  # nothing measured: anything is possible
    (0.0, 1.0)
    """
    from scipy.stats import beta

    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} and {trials}")
    tail = (1 - confidence) / 2
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def coverage_band(
    trials: int, level: float, *, calibration: int | None = None, confidence: float = 0.95
) -> tuple[float, float]:
    """The central ``confidence`` range of the share of ``trials`` test samples that prediction sets
    covering with probability ``level`` hold the true class of: where a correct method's measured coverage
    lands (outside it one time in 20 at 0.95).

    Without ``calibration``: ``Binomial(trials, level) / trials``. With it, the sets are split conformal's,
    calibrated on that many samples: their coverage is itself random, ``Beta(l, n + 1 - l)`` with
    ``l = ceil((n + 1) level)``, so the measured share is Beta-binomial (exact for continuous scores; ties
    only raise coverage).

    Examples
    --------
    >>> coverage_band(400, 0.9)
    (0.87, 0.9275)
    >>> [round(bound, 4) for bound in coverage_band(400, 0.9, calibration=200)]  # a little wider
    [0.845, 0.945]
    """
    from scipy.stats import betabinom, binom

    tails = [(1 - confidence) / 2, (1 + confidence) / 2]
    if calibration is None:
        low, high = binom.ppf(tails, trials, level) / trials
    else:
        rank = math.ceil((calibration + 1) * level - 1e-9)
        low, high = betabinom.ppf(tails, trials, rank, calibration + 1 - rank) / trials
    return float(low), float(high)


@dataclass(frozen=True)
class Rate:
    """A measured rate: ``count`` of ``total`` samples, with its Clopper-Pearson interval.

    Examples
    --------
    >>> rate = Rate.of(np.array([True, False, False, False]))
    >>> rate.value, [round(bound, 3) for bound in rate.interval]
    (0.25, [0.006, 0.806])
    """

    count: int
    total: int

    @classmethod
    def of(cls, hits: npt.ArrayLike) -> Rate:
        """The share of True in a boolean vector."""
        hits = np.asarray(hits, dtype=bool)
        return cls(int(hits.sum()), int(hits.size))

    @property
    def value(self) -> float:
        """``count / total``; NaN of nothing."""
        return self.count / self.total if self.total else float("nan")

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Clopper-Pearson interval (:func:`rate_interval`)."""
        return rate_interval(self.count, self.total)
