"""Split conformal prediction sets: the scores, the finite-sample quantile rule and its refusals, the laws
of the sets, and the coverage guarantee measured over many random calibration/test splits."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calibration import (
    APS,
    LAC,
    CoverageError,
    ModelCalibration,
    NonconformityScore,
    calibration_scores,
    choose_score,
    conformal_quantile,
    conformal_rank,
    label_ranks,
    max_coverage,
    min_calibration_samples,
    prediction_set,
    scaled_probability,
)
from tests.calibration.strategies import coverages, probabilities, sorted_scores

RAPS = NonconformityScore("raps", penalty=0.2, free_rank=1)
SCORES = [LAC, APS, RAPS]


@given(probabilities())
def test_lac_and_aps_scores_lie_in_the_unit_interval_and_raps_adds_its_rank_penalty(p):
    for score in (LAC, APS):
        s = score.class_scores(p)
        assert np.all((s >= -1e-12) & (s <= 1 + 1e-12))
    rank = np.stack([label_ranks(p, np.full(len(p), k)) for k in range(p.shape[1])], axis=1)
    np.testing.assert_allclose(
        RAPS.class_scores(p) - APS.class_scores(p), 0.2 * np.maximum(0, rank - 1), atol=1e-12
    )


@given(probabilities())
def test_aps_score_is_the_mass_of_the_classes_ranked_up_to_the_label(p):
    k = p.shape[1]
    for label in range(k):
        rank = label_ranks(p, np.full(len(p), label))
        for i in range(len(p)):
            # brute force: classes more probable, or as probable with a lower index, come first
            ahead = [j for j in range(k) if p[i, j] > p[i, label] or (p[i, j] == p[i, label] and j < label)]
            assert rank[i] == len(ahead) + 1
            assert APS.class_scores(p)[i, label] == pytest.approx(p[i, ahead].sum() + p[i, label], abs=1e-12)


@given(st.integers(1, 3000), st.integers(1, 999))
def test_the_threshold_is_the_ceil_n_plus_1_times_c_th_score_or_refused(n, permille):
    coverage = permille / 1000
    exact = math.ceil((n + 1) * Fraction(permille, 1000))  # exact arithmetic: no float rounding
    if exact <= n:
        assert conformal_rank(n, coverage=coverage) == exact
        assert n >= min_calibration_samples(coverage)
    else:
        with pytest.raises(
            CoverageError, match=f"needs at least {min_calibration_samples(coverage)} calibration"
        ):
            conformal_rank(n, coverage=coverage)
        assert n < min_calibration_samples(coverage)


@given(st.integers(1, 5000))
def test_n_samples_support_coverage_up_to_n_over_n_plus_1_and_no_more(n):
    assert conformal_rank(n, coverage=max_coverage(n)) == n
    assert min_calibration_samples(max_coverage(n)) == n
    above = max_coverage(n) + 1e-6
    if above < 1:
        with pytest.raises(CoverageError):
            conformal_rank(n, coverage=above)


def test_the_refusal_names_the_minimum_samples_and_the_maximum_coverage():
    scores = np.linspace(0, 1, 68)  # PIE's validation split
    with pytest.raises(CoverageError) as refused:
        prediction_set(np.full((1, 3), 1 / 3), scores, coverage=0.99)
    message = str(refused.value)
    assert "coverage 0.99 needs at least 99 calibration samples" in message
    assert "calibrated on 68" in message and "up to n / (n + 1) = 0.985507" in message
    assert (refused.value.coverage, refused.value.samples) == (0.99, 68)
    assert prediction_set(np.full((1, 3), 1 / 3), scores, coverage=68 / 69).shape == (1, 3)


@pytest.mark.parametrize("coverage", [0.0, 1.0, -0.5, 1.5, float("nan"), "0.9", None])
def test_coverage_must_lie_strictly_between_0_and_1(coverage):
    with pytest.raises(CoverageError, match=r"coverage must be a number in \(0, 1\)"):
        conformal_rank(100, coverage=coverage)


@given(sorted_scores(), coverages)
def test_the_quantile_is_a_calibration_score_that_enough_scores_do_not_exceed(scores, coverage):
    if coverage > max_coverage(scores.size):
        return
    q = conformal_quantile(scores, coverage=coverage)
    assert q in scores
    needed = conformal_rank(scores.size, coverage=coverage)
    assert np.sum(scores <= q) >= needed > np.sum(scores < q)  # the needed-th smallest, ties included


@given(probabilities(), sorted_scores(high=1.5), coverages, coverages, st.sampled_from(SCORES))
def test_sets_grow_with_the_coverage_asked_for(p, scores, c1, c2, score):
    low, high = sorted((c1, c2))
    if high > max_coverage(scores.size):
        return
    smaller = prediction_set(p, scores, coverage=low, score=score)
    assert np.all(smaller <= prediction_set(p, scores, coverage=high, score=score))


@given(probabilities(), sorted_scores(high=1.5), coverages, st.sampled_from(SCORES))
def test_sets_hold_the_label_and_every_class_as_probable_as_a_member(p, scores, coverage, score):
    if coverage > max_coverage(scores.size):
        return
    members = prediction_set(p, scores, coverage=coverage, score=score)
    label = p.argmax(axis=1)
    rows = np.arange(len(p))
    if score.kind == "lac":  # LAC: {k : p_k >= 1 - q}, possibly empty, else holding the label
        assert np.all(members[rows, label] | ~members.any(axis=1))
    else:  # APS and RAPS: never empty, always the label
        assert np.all(members[rows, label])
    for i, j, k in np.argwhere(p[:, :, None] >= p[:, None, :]):  # p_ij >= p_ik
        assert members[i, j] or not members[i, k]


@pytest.mark.parametrize("score", [APS, RAPS])
def test_classes_equally_probable_are_all_in_a_set_or_all_out(score):
    """APS and RAPS rank tied classes by index: a flat opinion (a sample fused from no view: uncertainty 1,
    every class 1/K) got its first classes by number as its set, [0, 1] of ten equally probable ones, and a
    sample torn between two classes got the one of the lower index. A set holds all of them, or none."""
    scores = np.linspace(0.05, 0.95, 99)  # q = 0.5 at coverage 0.5
    flat, torn = np.full((1, 10), 0.1), np.array([[0.05, 0.4, 0.4, 0.15]])
    assert prediction_set(flat, scores, coverage=0.5, score=score).tolist() == [[True] * 10]
    assert prediction_set(torn, scores, coverage=0.5, score=score).tolist() == [[False, True, True, False]]


@given(probabilities(), st.data(), sorted_scores(high=1.5), coverages, st.sampled_from(SCORES))
def test_a_class_whose_score_is_within_the_threshold_is_in_the_set(p, data, scores, coverage, score):
    # The event the guarantee is about: s(x, y) <= q implies y in the set (iff, for LAC).
    if coverage > max_coverage(scores.size):
        return
    labels = np.array(data.draw(st.lists(st.integers(0, p.shape[1] - 1), min_size=len(p), max_size=len(p))))
    within = score.label_scores(p, labels) <= conformal_quantile(scores, coverage=coverage)
    member = prediction_set(p, scores, coverage=coverage, score=score)[np.arange(len(p)), labels]
    assert np.all(member >= within)
    if score.kind == "lac":
        assert np.array_equal(member, within)


def _synthetic(rng, n, *, classes=5):
    """Projected-probability-like rows and labels drawn from a sharper distribution: miscalibrated
    probabilities, which the guarantee does not care about."""
    uncertainty = rng.uniform(0.1, 0.9, size=n)
    belief = rng.dirichlet(np.full(classes, 0.5), size=n) * (1 - uncertainty)[:, None]
    truth = scaled_probability(belief, uncertainty, temperature=0.2)
    labels = np.minimum((rng.random(n)[:, None] > truth.cumsum(axis=1)).sum(axis=1), classes - 1)
    return scaled_probability(belief, uncertainty, temperature=1.0), labels


def empirical_coverage(probability, labels, *, calibration_size, coverage, score, splits, seed=0):
    """Coverage of sets calibrated on random subsets of ``calibration_size``, on the rest, per split."""
    rng = np.random.default_rng(seed)
    covered = []
    for _ in range(splits):
        order = rng.permutation(len(labels))
        calibrate, test = order[:calibration_size], order[calibration_size:]
        scores = calibration_scores(probability[calibrate], labels[calibrate], score=score)
        members = prediction_set(probability[test], scores, coverage=coverage, score=score)
        covered.append(members[np.arange(test.size), labels[test]].mean())
    return np.asarray(covered)


def assert_guaranteed(covered, *, calibration_size, coverage, exact):
    """The mean coverage over splits is at least ceil((n + 1) c) / (n + 1) >= c, less 4 standard errors
    of that mean; for continuous scores it is exactly that (Angelopoulos & Bates 2021, Theorem D.1), which
    pins the order statistic down: using the next or the previous one moves it by 1 / (n + 1)."""
    expected = math.ceil((calibration_size + 1) * Fraction(str(coverage))) / (calibration_size + 1)
    slack = 4 * covered.std(ddof=1) / np.sqrt(covered.size)
    assert covered.mean() >= expected - slack >= coverage - slack
    if exact:
        assert slack < 0.7 / (
            calibration_size + 1
        )  # enough splits to tell neighbouring order statistics apart
        assert covered.mean() <= expected + slack


def splits_to_pin(calibration_size, test_size, coverage):
    """Random splits enough for :func:`assert_guaranteed` to tell neighbouring order statistics apart:
    the coverage of one split varies by the calibration set's Beta law and the test set's binomial."""
    variance = coverage * (1 - coverage) * (1 / (calibration_size + 2) + 1 / test_size)
    return math.ceil((4 * math.sqrt(variance) / (0.6 / (calibration_size + 1))) ** 2)


@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95])
@pytest.mark.parametrize("score", SCORES, ids=["lac", "aps", "raps"])
def test_coverage_guarantee_holds_over_random_calibration_test_splits(coverage, score):
    probability, labels = _synthetic(np.random.default_rng(1), 700)
    splits = splits_to_pin(100, 600, coverage) if score.kind == "lac" else 200
    covered = empirical_coverage(
        probability, labels, calibration_size=100, coverage=coverage, score=score, splits=splits
    )
    # LAC's scores are continuous here, so its coverage is exact; APS and RAPS add the label: at least.
    assert_guaranteed(covered, calibration_size=100, coverage=coverage, exact=score.kind == "lac")


def _accurate_but_flat(rng, n, *, classes=10):
    """Like DBF on HandWritten: right 97% of the time, with a top-class probability of only 0.15-0.6."""
    top = rng.uniform(0.15, 0.6, size=n)
    p = np.tile(((1 - top) / (classes - 1))[:, None], (1, classes))
    winner = rng.integers(classes, size=n)
    p[np.arange(n), winner] = top
    labels = np.where(
        rng.random(n) < 0.97, winner, (winner + 1 + rng.integers(classes - 1, size=n)) % classes
    )
    return p, labels


def test_choose_score_prefers_lac_where_its_sets_are_smallest():
    # Calibrated, fairly confident probabilities: LAC's sets are the smallest (Sadinle et al. 2019).
    rng = np.random.default_rng(2)
    probability = rng.dirichlet(np.full(5, 0.3), size=500)
    labels = np.array([rng.choice(5, p=row) for row in probability])
    choice = choose_score(probability, labels, coverage=0.9)
    assert choice.name == "lac" and choice.score == LAC
    assert choice.mean_candidates["lac"] == min(choice.mean_candidates.values())


def test_choose_score_does_not_reward_empty_sets():
    # LAC's plain mean set size is the smallest here only because it answers "nothing" for the least
    # confident 7%; RAPS answers the label for them, so fewer classes are left to choose from.
    probability, labels = _accurate_but_flat(np.random.default_rng(3), 400)
    choice = choose_score(probability, labels, coverage=0.9)
    assert choice.mean_set_size["lac"] < 1 < choice.mean_candidates["lac"]
    assert choice.score.kind == "raps" and choice.name.startswith("raps")
    assert choice.mean_candidates[choice.name] < choice.mean_candidates["lac"]
    assert choice.score.free_rank == 1  # the label's rank at 90% of calibration samples
    assert all(c >= 0.85 for c in choice.coverage.values())


def test_model_calibration_checks_what_it_is_built_from():
    build = dict(confidence={"kind": "temperature", "temperature": 1.0}, score={"kind": "lac"})
    with pytest.raises(ValueError, match="ascending"):
        ModelCalibration.from_parameters(**build, calibration_scores=[0.3, 0.1], default_coverage=0.5)
    with pytest.raises(CoverageError, match="needs at least 9 calibration samples"):
        ModelCalibration.from_parameters(**build, calibration_scores=[0.1, 0.3], default_coverage=0.9)
    with pytest.raises(ValueError, match="lac takes no penalty"):
        NonconformityScore("lac", penalty=0.1)
    with pytest.raises(ValueError, match="unknown nonconformity score 'thr'"):
        NonconformityScore("thr")
