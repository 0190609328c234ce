"""The public contract: names, shapes, errors."""

from __future__ import annotations

import numpy as np
import pytest

import fusion
from fusion import METHODS, FusedOpinion, Opinion, fuse, opinion_from_evidence


def test_public_api():
    for name in (
        "Opinion",
        "opinion_from_evidence",
        "fuse",
        "projected_probability",
        "conflict_matrix",
        "degree_of_conflict",
        "agreement",
        "discount",
        "discount_factors",
        "evidence_from_opinion",
        "top_class_of_the_others",
        "agrees_with_the_others",
    ):
        assert name in fusion.__all__
    assert METHODS == ("bcf", "cbf", "baf", "gbaf", "dbf")


def test_fuse_result_shapes():
    op = opinion_from_evidence(np.random.default_rng(0).random((7, 3, 4)))
    assert op.belief.shape == (7, 3, 4) and op.uncertainty.shape == (7, 3)
    out = fuse(op, method="dbf", lam=1.0, mask=None)
    assert isinstance(out, FusedOpinion) and isinstance(out, Opinion)
    assert out.belief.shape == (7, 4) and out.uncertainty.shape == (7,) and out.probability.shape == (7, 4)
    assert out.conflict.shape == (7, 3, 3) and out.discount.shape == (7, 3)
    np.testing.assert_array_equal(fuse(op, "gbaf").discount, 1.0)


def test_opinion_is_immutable():
    op = Opinion(belief=np.array([0.5, 0.5]), uncertainty=np.array(0.0))
    with pytest.raises(AttributeError):
        op.belief = np.zeros(2)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"method": "dempster"}, ValueError, "unknown fusion method 'dempster'; expected one of bcf, cbf"),
        ({"lam": 0.0}, ValueError, "lambda must be a positive finite number"),
        ({"lam": -1.0}, ValueError, "lambda must be a positive finite number"),
        ({"lam": float("nan")}, ValueError, "lambda must be a positive finite number"),
        ({"mask": np.array([[1, 0, 1]])}, TypeError, "mask must be boolean"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    op = opinion_from_evidence(np.ones((1, 3, 2)))
    with pytest.raises(error, match=message):
        fuse(op, **kwargs)


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"belief must have shape \(\.\.\., V, K\)"):
        fuse(Opinion(np.array([0.5, 0.5]), np.array(0.0)))
    with pytest.raises(ValueError, match="uncertainty must have shape"):
        fuse(Opinion(np.ones((2, 3, 4)) / 8, np.ones((2, 4)) / 2))


@pytest.mark.parametrize("method", METHODS)
def test_no_classes_is_refused(method):
    """K = 0 has no opinion (``u = K / S`` is 0 / 0): a clear ValueError, not NaN uncertainty beside a
    RuntimeWarning (and u = 1 from BCF alone)."""
    with pytest.raises(ValueError, match="K >= 1 classes"):
        fuse(Opinion(np.zeros((2, 3, 0)), np.ones((2, 3))), method)
    with pytest.raises(ValueError, match="K >= 1 classes"):
        opinion_from_evidence(np.zeros((2, 3, 0)))


def test_evidence_without_a_class_axis_is_refused():
    with pytest.raises(ValueError, match=r"evidence must have shape \(\.\.\., K\)"):
        opinion_from_evidence(np.array(3.0))
