"""Our conformal quantile and prediction sets against MAPIE's SplitConformalClassifier (MAPIE 1.x), given the
same fused probabilities through a prefit estimator.

Conventions, and where they differ:

* Quantile: both take the ceil((n + 1) c)-th smallest calibration score. MAPIE computes (n + 1) c in
  floating point and takes its ceiling, so where the product is an integer only up to rounding (n = 89,
  c = 0.7 gives 63.00000000000001) it takes the next score; we count it as the integer it is. The levels
  below avoid those products.
* LAC: the same score and the same sets, {k : 1 - p_k <= q}, empty sets included.
* APS: MAPIE always randomises the calibration scores (``score - U * p_y``, U uniform), even when the sets
  are built deterministically; ours are not randomised, so the service answers a request the same way
  twice. Plugging our deterministic score into MAPIE as a conformity score (a subclass of its APS score
  that skips the randomisation) gives our quantile and, with ``include_last_label=False`` (the label
  always in the set), our sets. MAPIE's own randomised scores are never larger than ours, so its
  threshold is never higher: ours is the conservative side of the same rule.
* Ties between class probabilities: MAPIE orders them by a reversed argsort, we by class index (as
  ``argmax``); the probabilities below have no ties (nor do the committed models' fused outputs).
"""

from __future__ import annotations

import numpy as np
import pytest
from mapie.classification import SplitConformalClassifier
from mapie.conformity_scores import APSConformityScore
from sklearn.base import BaseEstimator, ClassifierMixin

from calibration import APS, LAC, calibration_scores, conformal_quantile, prediction_set
from fusion import fuse, opinion_from_evidence

COVERAGES = (0.8, 0.9, 0.95)


class FixedProbabilities(ClassifierMixin, BaseEstimator):
    """A prefit classifier whose input is a row index into fixed class probabilities (N, K)."""

    def __init__(self, probability=None):
        self.probability = probability

    def fit(self, X, y=None):
        return self

    def predict_proba(self, X):
        return self.probability[np.asarray(X)[:, 0].astype(int)]

    def predict(self, X):
        return self.predict_proba(X).argmax(axis=1)

    def __sklearn_is_fitted__(self):
        return True


class DeterministicAPS(APSConformityScore):
    """MAPIE's APS score without its randomisation: the mass of the classes ranked up to the true one."""

    def get_conformity_scores(self, y, y_pred, y_enc=None, **kwargs):
        scores, self.cutoff = self.get_true_label_cumsum_proba(y, y_pred, self.classes)
        return scores


def mapie_sets(probability, labels, *, calibration, coverage, conformity_score, **params):
    """MAPIE's (quantile, sets) for the rows not in ``calibration``, calibrated on those that are."""
    estimator = FixedProbabilities(probability)
    estimator.classes_ = np.arange(probability.shape[1])
    rows = np.arange(len(labels))[:, None]
    mapie = SplitConformalClassifier(
        estimator, confidence_level=coverage, conformity_score=conformity_score, prefit=True
    )
    mapie.conformalize(rows[calibration], labels[calibration])
    _, sets = mapie.predict_set(rows[~calibration], conformity_score_params=params or None)
    # MAPIE 1.x keeps the quantile on its internal v0 classifier; there is no public accessor.
    quantile = float(mapie._mapie_classifier.conformity_score_function_.quantiles_[0])
    return quantile, sets[:, :, 0], np.sort(np.asarray(mapie.conformity_scores).ravel())


def dbf_fused_probabilities(n=600, *, classes=6, views=3, seed=0):
    """DBF's projected probability over synthetic evidence, and labels the views mostly agree on."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(classes, size=n)
    evidence = rng.gamma(0.5, 2.0, size=(n, views, classes))
    evidence[np.arange(n), :, labels] += rng.gamma(2.0, 5.0, size=(n, views))
    fused = fuse(opinion_from_evidence(evidence), "dbf")
    return fused.probability, labels


def dirichlet_probabilities(n=500, *, classes=8, seed=1):
    rng = np.random.default_rng(seed)
    probability = rng.dirichlet(np.full(classes, 0.4), size=n)
    return probability, np.array([rng.choice(classes, p=row) for row in probability])


SOURCES = {"dbf": dbf_fused_probabilities, "dirichlet": dirichlet_probabilities}


def _split(labels, seed=5):
    calibration = np.zeros(len(labels), bool)
    calibration[np.random.default_rng(seed).permutation(len(labels))[: len(labels) // 3]] = True
    return calibration


@pytest.mark.parametrize("coverage", COVERAGES)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_lac_quantile_and_sets_equal_mapie(source, coverage):
    probability, labels = SOURCES[source]()
    calibration = _split(labels)
    quantile, sets, scores = mapie_sets(
        probability, labels, calibration=calibration, coverage=coverage, conformity_score="lac"
    )
    ours = calibration_scores(probability[calibration], labels[calibration], score=LAC)
    np.testing.assert_allclose(ours, scores, atol=1e-12)
    assert conformal_quantile(ours, coverage=coverage) == pytest.approx(quantile, abs=1e-12)
    members = prediction_set(probability[~calibration], ours, coverage=coverage, score=LAC)
    assert np.array_equal(members, sets)
    assert 0 < members.sum(axis=1).mean() < probability.shape[1]  # a comparison of real sets, not all/none


@pytest.mark.parametrize("coverage", COVERAGES)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_deterministic_aps_quantile_and_sets_equal_mapie_with_the_label_kept(source, coverage):
    probability, labels = SOURCES[source]()
    calibration = _split(labels)
    quantile, sets, scores = mapie_sets(
        probability,
        labels,
        calibration=calibration,
        coverage=coverage,
        conformity_score=DeterministicAPS(),
        include_last_label=False,
    )
    ours = calibration_scores(probability[calibration], labels[calibration], score=APS)
    np.testing.assert_allclose(ours, scores, atol=1e-12)
    assert conformal_quantile(ours, coverage=coverage) == pytest.approx(quantile, abs=1e-12)
    members = prediction_set(probability[~calibration], ours, coverage=coverage, score=APS)
    assert np.array_equal(members, sets)
    assert 1 < members.sum(axis=1).mean() < probability.shape[1]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_mapie_randomised_aps_threshold_is_never_above_ours(source):
    probability, labels = SOURCES[source]()
    calibration = _split(labels)
    ours = calibration_scores(probability[calibration], labels[calibration], score=APS)
    for coverage in COVERAGES:
        quantile, _, randomised = mapie_sets(
            probability, labels, calibration=calibration, coverage=coverage, conformity_score="aps"
        )
        assert np.all(randomised <= ours + 1e-12)  # order statistics of elementwise smaller scores
        assert quantile <= conformal_quantile(ours, coverage=coverage) + 1e-12
