"""training.metrics as a specification: accuracy, AUROC, ECE, Brier score, NLL, uncertainty, intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusion import fuse, opinion_from_evidence
from training.calibrate import FusedSplit
from training.evaluate import measure
from training.metrics import (
    Rate,
    accuracy,
    auroc,
    brier_score,
    coverage_band,
    expected_calibration_error,
    negative_log_likelihood,
    rate_interval,
    uncertainty_summary,
)


def brute_force_auroc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The definition, O(N^2): P(score of a positive > score of a negative), ties counting 1/2."""
    pos, neg = scores[positive][:, None], scores[~positive][None, :]
    wins = np.sum(pos > neg) + 0.5 * np.sum(pos == neg)
    return float(wins) / (pos.size * neg.size)


# Scores from a few integer levels, so ties are frequent; the first two samples make both classes present.
scored_samples = st.integers(min_value=0, max_value=38).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(-5, 5), min_size=n + 2, max_size=n + 2),
        st.lists(st.booleans(), min_size=n, max_size=n).map(lambda b: [True, False, *b]),
    )
)


def _arrays(sample: tuple[list[int], list[bool]]) -> tuple[np.ndarray, np.ndarray]:
    scores, positive = sample
    return np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)


# ---------------------------------------------------------------------------------------------- accuracy


def test_accuracy_counts_argmax_matches() -> None:
    probability = np.array([[0.9, 0.1, 0.0], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    assert accuracy(probability, np.array([0, 1, 0, 1])) == 0.5
    assert accuracy(probability, np.array([0, 1, 2, 0])) == 1.0


def test_accuracy_ties_go_to_the_lowest_index() -> None:
    tied = np.array([[0.5, 0.5, 0.0], [0.2, 0.4, 0.4]])
    assert accuracy(tied, np.array([0, 1])) == 1.0
    assert accuracy(tied, np.array([1, 2])) == 0.0


# ------------------------------------------------------------------------------------------------- AUROC


@given(scored_samples)
def test_auroc_equals_the_pairwise_count(sample: tuple[list[int], list[bool]]) -> None:
    scores, positive = _arrays(sample)
    assert auroc(scores, positive) == pytest.approx(brute_force_auroc(scores, positive), abs=1e-12)


@given(scored_samples)
def test_auroc_is_invariant_to_increasing_transforms(sample: tuple[list[int], list[bool]]) -> None:
    scores, positive = _arrays(sample)
    expected = auroc(scores, positive)
    for transformed in (3.0 * scores + 7.0, scores**3 + scores, np.exp(scores / 2.0), np.arctan(scores)):
        assert auroc(transformed, positive) == pytest.approx(expected, abs=1e-12)
    # A decreasing transform swaps the roles: wins become losses, ties stay ties.
    assert auroc(-scores, positive) == pytest.approx(1.0 - expected, abs=1e-12)


def test_auroc_of_separated_scores_is_one_and_reversed_is_zero() -> None:
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.7])
    positive = np.array([True, False, True, False, True])
    assert auroc(scores, positive) == 1.0
    assert auroc(-scores, positive) == 0.0


def test_auroc_of_constant_scores_is_one_half() -> None:
    assert auroc(np.full(7, 0.3), np.array([True, False, False, True, False, False, False])) == 0.5


def test_auroc_accepts_float32_and_integer_scores() -> None:
    positive = np.array([False, True, False, True])
    assert auroc(np.array([0.1, 0.4, 0.5, 0.8], dtype=np.float32), positive) == 0.75
    assert auroc(np.array([1, 4, 5, 8]), positive) == 0.75


def test_auroc_scales_to_many_samples() -> None:
    # O(N log N): 300,000 samples take a fraction of a second; positives drawn higher give AUROC > 1/2.
    rng = np.random.default_rng(0)
    positive = rng.random(300_000) < 0.3
    scores = rng.normal(size=positive.size) + positive
    assert 0.7 < auroc(scores, positive) < 0.8  # Phi(1 / sqrt(2)) = 0.760


@pytest.mark.parametrize("positive", [np.ones(4, dtype=bool), np.zeros(4, dtype=bool)])
def test_auroc_rejects_a_single_class(positive: np.ndarray) -> None:
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        auroc(np.arange(4.0), positive)


@pytest.mark.parametrize(
    ("scores", "positive", "match"),
    [
        (np.zeros((3, 1)), np.array([True, False, True]), r"scores must have shape \(N,\)"),
        (np.zeros(3), np.array([True, False]), r"positive must have shape \(N,\)"),
        (np.zeros(3), np.array([1, 0, 1]), "boolean"),
        (np.array([0.1, np.nan, 0.2]), np.array([True, False, True]), "finite"),
    ],
)
def test_auroc_validates_its_inputs(scores: np.ndarray, positive: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        auroc(scores, positive)


# ------------------------------------------------------------------------------------------------------- ECE


def _rows(confidence: float, num_classes: int) -> np.ndarray:
    """A probability row with top class 0 at ``confidence`` and the rest spread evenly."""
    row = np.full(num_classes, (1.0 - confidence) / (num_classes - 1))
    row[0] = confidence
    return row


def test_ece_is_zero_for_data_calibrated_bin_by_bin() -> None:
    # Ten bins; in each, 20 samples split between two confidences whose mean is the bin's accuracy.
    probability, labels = [], []
    for m in range(1, 10):  # bins (0.1, 0.2] .. (0.9, 1.0]; 10 classes, so confidences >= 0.15 are argmax
        centre = (m + 0.5) / 10
        correct = round(20 * centre)  # 3, 5, ..., 19 of 20
        for i in range(20):
            probability.append(_rows(centre + (0.02 if i % 2 else -0.02), 10))
            labels.append(0 if i < correct else 1 + i % 9)
    probability, labels = np.array(probability), np.array(labels)
    assert expected_calibration_error(probability, labels, bins=10) == pytest.approx(0.0, abs=1e-12)
    # The same data seen as one bin is calibrated too, and with 15 bins it no longer is.
    assert expected_calibration_error(probability, labels, bins=1) == pytest.approx(0.0, abs=1e-12)
    assert expected_calibration_error(probability, labels) > 0.01


@given(st.integers(0, 2**32 - 1))
def test_ece_with_one_bin_is_the_gap_between_accuracy_and_mean_confidence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    probability = rng.dirichlet(np.ones(4), size=int(rng.integers(1, 30)))
    labels = rng.integers(0, 4, size=probability.shape[0])
    expected = abs(accuracy(probability, labels) - probability.max(axis=1).mean())
    assert expected_calibration_error(probability, labels, bins=1) == pytest.approx(expected, abs=1e-12)


def test_ece_puts_confidence_one_into_the_last_bin() -> None:
    one_hot = np.eye(3)[[0, 1, 2, 0]]
    assert expected_calibration_error(one_hot, np.array([0, 1, 2, 0])) == 0.0
    assert expected_calibration_error(one_hot, np.array([1, 2, 0, 1])) == 1.0


def test_ece_bins_are_closed_on_the_right() -> None:
    # bins=2: confidence 0.5 lies in (0, 0.5], with 1.0 alone in (0.5, 1]: 0.5 * 1/2 + 1 * 1/2.
    # Were 0.5 in the upper bin, both would share it: |1/2 - 3/4| = 0.25.
    probability = np.array([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    assert expected_calibration_error(probability, np.array([0, 1]), bins=2) == pytest.approx(0.75)


def test_ece_computes_float32_input_in_float64() -> None:
    rng = np.random.default_rng(1)
    probability = rng.dirichlet(np.ones(5), size=200).astype(np.float32)
    labels = rng.integers(0, 5, size=200)
    assert expected_calibration_error(probability, labels) == pytest.approx(
        expected_calibration_error(probability.astype(np.float64), labels), abs=1e-15
    )


@pytest.mark.parametrize("bins", [0, -3, 2.5, True])
def test_ece_rejects_bad_bin_counts(bins: object) -> None:
    with pytest.raises(ValueError, match="bins must be a positive integer"):
        expected_calibration_error(np.eye(2), np.array([0, 1]), bins=bins)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- Brier, NLL


def test_brier_is_zero_for_one_hot_correct_and_two_for_confident_wrong() -> None:
    one_hot = np.eye(4)[[0, 3, 1, 2]]
    assert brier_score(one_hot, np.array([0, 3, 1, 2])) == 0.0
    assert brier_score(one_hot, np.array([1, 0, 2, 3])) == 2.0


def test_brier_matches_a_hand_computation() -> None:
    # (0.7 - 1)^2 + 0.2^2 + 0.1^2 = 0.14; 0.25^2 * 3 + (0.25 - 1)^2 = 0.75.
    probability = np.array([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]])
    assert brier_score(probability, np.array([0, 3])) == pytest.approx((0.14 + 0.75) / 2)


def test_nll_matches_minus_log_p_of_the_label() -> None:
    probability = np.array([[0.7, 0.2, 0.1], [0.25, 0.5, 0.25]])
    expected = -(math.log(0.1) + math.log(0.5)) / 2
    assert negative_log_likelihood(probability, np.array([2, 1])) == pytest.approx(expected)


def test_nll_is_finite_for_a_zero_probability() -> None:
    probability = np.array([[1.0, 0.0], [0.5, 0.5]])
    nll = negative_log_likelihood(probability, np.array([1, 0]))
    assert math.isfinite(nll)
    assert nll == pytest.approx((-math.log(1e-12) - math.log(0.5)) / 2)
    assert negative_log_likelihood(probability, np.array([1, 0]), eps=1e-6) == pytest.approx(
        (-math.log(1e-6) - math.log(0.5)) / 2
    )


@pytest.mark.parametrize("eps", [0.0, -1e-3, float("nan")])
def test_nll_rejects_a_non_positive_eps(eps: float) -> None:
    with pytest.raises(ValueError, match="eps"):
        negative_log_likelihood(np.eye(2), np.array([0, 1]), eps=eps)


# ------------------------------------------------------------------------------------ shared validation


@pytest.mark.parametrize(
    "metric", [accuracy, expected_calibration_error, brier_score, negative_log_likelihood]
)
@pytest.mark.parametrize(
    ("probability", "labels", "match"),
    [
        (np.array([0.2, 0.8]), np.array([1]), r"probability must have shape \(N, K\)"),
        (np.zeros((0, 3)), np.zeros(0, dtype=int), r"probability must have shape \(N, K\)"),
        (np.eye(3), np.array([0, 1]), r"labels must have shape \(N,\) = \(3,\)"),
        (np.eye(3), np.array([[0], [1], [2]]), r"labels must have shape \(N,\)"),
        (np.eye(3), np.array([0.0, 1.0, 2.0]), "labels must be an integer array"),
        (np.eye(3, dtype=int), np.array([0, 1, 2]), "probability must be a float array"),
        (np.eye(3), np.array([0, 1, 3]), r"labels must lie in 0 \.\. K-1 = 0 \.\. 2"),
        (np.eye(3), np.array([-1, 1, 2]), "labels must lie in"),
        (np.eye(3) * 1.5, np.array([0, 1, 2]), r"finite and in \[0, 1\]"),
        (np.full((1, 2), np.nan), np.array([0]), r"finite and in \[0, 1\]"),
    ],
)
def test_probability_metrics_validate_shapes_and_values(
    metric: object, probability: np.ndarray, labels: np.ndarray, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        metric(probability, labels)  # type: ignore[operator]


def test_fused_near_dogmatic_views_are_measured_despite_float32_rounding() -> None:
    """Evidence that breast cancer's views reached after 10,000 optimizer steps (float32, as the heads give
    it): GBAF and DBF fuse it to a probability of 1 + 1.2e-7, which ended a long fit with an error."""
    evidence = np.array(
        [[[9.1615273e10, 2.0842896e-12], [1.0000009e13, 8.2657758e-26], [2.7687243e11, 5.3883464e-11]]],
        dtype=np.float32,
    )
    evidence = np.concatenate([evidence, evidence[:, :, ::-1]])  # one sample of each class
    for method in ("gbaf", "dbf"):
        probability = fuse(opinion_from_evidence(evidence), method).probability
        assert probability.max() > 1.0  # what float32 leaves
        split = FusedSplit.of_evidence(
            evidence, np.array([0, 1]), method=method, lam=1.0, conflictive=(evidence, np.array([1, 0]), None)
        )
        evaluation = measure(split)
        assert (evaluation.acc_normal, evaluation.acc_conflict) == (1.0, 0.0)
        assert 0.0 <= evaluation.ece <= 1e-6 and 0.0 <= evaluation.brier <= 1e-6
        assert accuracy(probability, np.array([0, 1])) == 1.0


# ------------------------------------------------------------------------------------ uncertainty summary


def test_uncertainty_summary_of_a_vector_gives_scalars() -> None:
    summary = uncertainty_summary(np.array([0.1, 0.3, 0.2], dtype=np.float32))
    assert set(summary) == {"mean", "std"}
    assert isinstance(summary["mean"], float) and isinstance(summary["std"], float)
    assert summary["mean"] == pytest.approx(0.2)
    assert summary["std"] == pytest.approx(np.std([0.1, 0.3, 0.2]))


def test_uncertainty_summary_of_a_matrix_goes_column_by_column() -> None:
    summary = uncertainty_summary(np.array([[0.0, 0.5, 1.0], [1.0, 0.5, 1.0]]))
    assert summary == {"mean": [0.5, 0.5, 1.0], "std": [0.5, 0.0, 0.0]}


@pytest.mark.parametrize("uncertainty", [np.zeros(0), np.zeros((0, 2)), np.zeros((2, 2, 2)), np.float64(0.3)])
def test_uncertainty_summary_validates_its_shape(uncertainty: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"uncertainty must have shape \(N,\) or \(N, V\)"):
        uncertainty_summary(uncertainty)


# ------------------------------------------------------------------------------------------------ intervals


@given(st.integers(0, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_rate_interval_is_clopper_pearson_as_scipy_computes_it(sample) -> None:
    from scipy.stats import binomtest

    successes, trials = sample
    if trials == 0:
        assert rate_interval(0, 0) == (0.0, 1.0)
        return
    expected = binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="exact")
    low, high = rate_interval(successes, trials)
    assert low == pytest.approx(expected.low, abs=1e-12)
    assert high == pytest.approx(expected.high, abs=1e-12)
    assert low <= successes / trials <= high
    assert Rate(successes, trials).interval == (low, high)


def test_rate_interval_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        rate_interval(5, 4)


@pytest.mark.parametrize(("trials", "level"), [(36, 0.9), (114, 0.9), (400, 0.95), (893, 0.8)])
def test_coverage_band_is_the_central_95_percent_of_the_binomial(trials, level) -> None:
    from scipy.stats import binom

    low, high = coverage_band(trials, level)
    low_count, high_count = round(low * trials), round(high * trials)
    assert binom.cdf(high_count, trials, level) >= 0.975 > binom.cdf(high_count - 1, trials, level)
    assert binom.cdf(low_count - 1, trials, level) < 0.025 <= binom.cdf(low_count, trials, level)


def test_coverage_band_of_split_conformal_holds_its_share_of_simulated_calibrations() -> None:
    # Continuous scores, exchangeable: calibrate on 40, measure on 100, 4000 times; the band holds 95%.
    rng = np.random.default_rng(0)
    calibration, trials, level, draws = 40, 100, 0.9, 4000
    rank = math.ceil((calibration + 1) * level)
    low, high = coverage_band(trials, level, calibration=calibration)
    assert (low, high) != coverage_band(trials, level)  # wider: the threshold is random too
    scores = rng.random((draws, calibration + trials))
    threshold = np.sort(scores[:, :calibration], axis=1)[:, rank - 1]
    covered = (scores[:, calibration:] <= threshold[:, None]).mean(axis=1)
    inside = np.mean((covered >= low - 1e-12) & (covered <= high + 1e-12))
    assert 0.94 <= inside <= 0.99  # at least 95%, up to simulation noise and the tails' rounding
