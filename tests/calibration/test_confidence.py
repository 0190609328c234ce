"""Calibrated confidence: the laws of temperature scaling of the fused evidence, isotonic binning, and fits
that find what they should."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy.optimize import isotonic_regression

from calibration import (
    IsotonicBinning,
    TemperatureScaling,
    confidence_calibrator,
    expected_calibration_error,
    fit_confidence,
    fit_isotonic,
    fit_temperature,
    scaled_probability,
    top_probability,
)
from fusion import Opinion, evidence_from_opinion, opinion_from_evidence, projected_probability
from tests.calibration.strategies import fused_opinions, temperatures


@given(fused_opinions())
def test_temperature_one_is_dbf_projected_probability(opinion):
    belief, uncertainty = opinion
    expected = projected_probability(Opinion(belief, uncertainty))
    np.testing.assert_allclose(scaled_probability(belief, uncertainty, temperature=1.0), expected, atol=1e-12)


@given(fused_opinions(), temperatures)
def test_temperature_divides_the_fused_evidence(opinion, temperature):
    # P^T is the projected probability (Dirichlet mean) of the opinion whose evidence is e / T (Eq. 2).
    belief, uncertainty = opinion
    assume(np.all(uncertainty > 1e-9))  # finite evidence
    evidence = evidence_from_opinion(Opinion(belief, uncertainty))
    expected = opinion_from_evidence(evidence / temperature).probability
    np.testing.assert_allclose(
        scaled_probability(belief, uncertainty, temperature=temperature), expected, rtol=1e-6, atol=1e-9
    )


@given(fused_opinions(), temperatures)
def test_scaled_probability_is_a_distribution_whose_top_is_the_label(opinion, temperature):
    belief, uncertainty = opinion
    p = scaled_probability(belief, uncertainty, temperature=temperature)
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    label = belief.argmax(axis=1)  # what the service answers: the argmax of the projected probability
    top = top_probability(belief, uncertainty, temperature=temperature)
    np.testing.assert_allclose(top, p[np.arange(len(label)), label], atol=1e-12)
    np.testing.assert_allclose(top, p.max(axis=1), atol=1e-12)


@given(fused_opinions(), temperatures, temperatures)
def test_top_probability_never_increases_with_temperature(opinion, t1, t2):
    belief, uncertainty = opinion
    low, high = min(t1, t2), max(t1, t2)
    sharper = top_probability(belief, uncertainty, temperature=low)
    softer = top_probability(belief, uncertainty, temperature=high)
    # Up to rounding: with u near 1 and T near 0, 1 - u + uT cancels to ~1e-6 and keeps ~10 digits.
    assert np.all(sharper >= softer * (1 - 1e-9) - 1e-12)


def test_temperature_limits_are_the_renormalised_belief_and_uniform():
    belief, uncertainty = (
        np.array([[0.5, 0.2, 0.0], [0.0, 0.0, 0.0], [0.7, 0.3, 0.0]]),
        np.array([0.3, 1.0, 0.0]),
    )
    sharp = scaled_probability(belief, uncertainty, temperature=1e-12)
    np.testing.assert_allclose(sharp[0], belief[0] / 0.7, atol=1e-9)  # b / (1 - u)
    np.testing.assert_allclose(sharp[1], 1 / 3)  # vacuous: uniform at any temperature
    np.testing.assert_allclose(sharp[2], belief[2])  # dogmatic: the belief at any temperature
    flat = scaled_probability(belief, uncertainty, temperature=1e12)
    np.testing.assert_allclose(flat[:2], 1 / 3, atol=1e-9)
    np.testing.assert_allclose(flat[2], belief[2])


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf"), "1"])
def test_temperature_must_be_positive_and_finite(temperature):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        TemperatureScaling(temperature)


def _drawn_at(temperature, n, *, classes=4, seed=0):
    """Opinions whose labels are drawn from their own P^T: calibrated exactly by ``temperature``."""
    rng = np.random.default_rng(seed)
    uncertainty = rng.uniform(0.2, 0.95, size=n)
    belief = rng.dirichlet(np.full(classes, 0.4), size=n) * (1 - uncertainty)[:, None]
    truth = scaled_probability(belief, uncertainty, temperature=temperature)
    labels = (rng.random(n)[:, None] > truth.cumsum(axis=1)).sum(axis=1)
    return belief, uncertainty, np.minimum(labels, classes - 1)


@pytest.mark.parametrize("temperature", [0.05, 0.3, 1.0, 4.0])
def test_fit_temperature_finds_the_temperature_labels_were_drawn_at(temperature):
    belief, uncertainty, labels = _drawn_at(temperature, 4000)
    fitted = fit_temperature(belief, uncertainty, labels).temperature
    assert temperature / 1.5 < fitted < temperature * 1.5


def test_fit_confidence_keeps_the_temperature_when_it_is_the_truth_and_beats_dbf_on_held_out_data():
    belief, uncertainty, labels = _drawn_at(0.1, 600)
    fit = fit_confidence(belief, uncertainty, labels)
    assert fit.calibrator.kind == "temperature"
    assert fit.brier["temperature"] < fit.brier["projected"]
    held_b, held_u, held_y = _drawn_at(0.1, 20000, seed=1)
    correct = held_b.argmax(axis=1) == held_y
    calibrated = expected_calibration_error(fit.calibrator.confidence(held_b, held_u), correct)
    projected = expected_calibration_error(top_probability(held_b, held_u), correct)
    assert calibrated < 0.03 < 0.1 < projected


def test_fit_confidence_takes_isotonic_binning_where_no_temperature_fits():
    # Correctness jumps from 30% to 99% at top-class probability 0.5: no temperature follows a step.
    rng = np.random.default_rng(3)
    n = 3000
    uncertainty = rng.uniform(0.05, 0.9, size=n)
    belief = rng.dirichlet(np.full(5, 0.5), size=n) * (1 - uncertainty)[:, None]
    top = top_probability(belief, uncertainty)
    correct = rng.random(n) < np.where(top < 0.5, 0.3, 0.99)
    labels = np.where(correct, belief.argmax(axis=1), (belief.argmax(axis=1) + 1) % 5)
    fit = fit_confidence(belief[:1000], uncertainty[:1000], labels[:1000])
    assert fit.calibrator.kind == "isotonic"
    assert fit.brier["isotonic"] < fit.brier["temperature"]
    confidence = fit.calibrator.confidence(belief[1000:], uncertainty[1000:])
    assert expected_calibration_error(confidence, correct[1000:]) < 0.03


@given(st.integers(0, 2**32 - 1), st.integers(2, 80))
def test_isotonic_fit_is_the_pool_adjacent_violators_regression(seed, n):
    rng = np.random.default_rng(seed)
    uncertainty = rng.uniform(0, 1, size=n)
    belief = rng.dirichlet(np.ones(3), size=n) * (1 - uncertainty)[:, None]
    labels = rng.integers(3, size=n)
    binning = fit_isotonic(belief, uncertainty, labels, temperature=0.5)
    score = top_probability(belief, uncertainty, temperature=0.5)
    _, inverse, count = np.unique(score, return_inverse=True, return_counts=True)
    right = np.bincount(inverse.ravel(), weights=belief.argmax(axis=1) == labels) / count
    expected = np.clip(isotonic_regression(right, weights=count).x, 1 / (n + 1), n / (n + 1))
    np.testing.assert_allclose(binning.confidence(belief, uncertainty), expected[inverse.ravel()], atol=1e-9)
    grid = np.linspace(0, 1, 101)
    assert np.all(np.diff(np.interp(grid, binning.thresholds, binning.values)) >= 0)  # monotone


@pytest.mark.parametrize(
    "calibrator",
    [TemperatureScaling(0.25), IsotonicBinning(temperature=0.5, thresholds=(0.2, 0.7), values=(0.1, 0.95))],
)
def test_calibrators_are_rebuilt_from_their_parameters(calibrator):
    assert confidence_calibrator(calibrator.parameters()) == calibrator


@pytest.mark.parametrize(
    ("thresholds", "values", "match"),
    [
        ((0.5, 0.5), (0.1, 0.2), "increase strictly"),
        ((0.2, 0.5), (0.3, 0.2), "must not decrease"),
        ((0.2, 0.5), (0.3, 1.2), r"in \[0, 1\]"),
        ((0.2,), (0.3, 0.4), "as many thresholds as values"),
    ],
)
def test_isotonic_knots_are_checked(thresholds, values, match):
    with pytest.raises(ValueError, match=match):
        IsotonicBinning(temperature=1.0, thresholds=thresholds, values=values)


def test_unknown_calibrator_and_bad_labels_are_refused():
    with pytest.raises(ValueError, match="unknown confidence calibrator 'platt'"):
        confidence_calibrator({"kind": "platt"})
    with pytest.raises(ValueError, match=r"labels must be integers in 0 \.\. 1"):
        fit_temperature(np.array([[0.5, 0.0]]), np.array([0.5]), np.array([2]))
