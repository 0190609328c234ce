"""Algebraic laws of the operators, as hypothesis properties (numpy, float64)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fusion import (
    METHODS,
    Opinion,
    conflict_matrix,
    discount_factors,
    evidence_from_opinion,
    fuse,
    opinion_from_evidence,
    reference,
)
from tests.fusion.strategies import evidence, masks, opinions, take_views

ORDER_INVARIANT = ["cbf", "gbaf", "dbf"]


@pytest.mark.parametrize("method", METHODS)
@given(op=opinions(), lam=st.sampled_from([0.25, 1.0, 3.0]))
def test_additivity_and_ranges(method, op, lam):
    out = fuse(op, method, lam=lam)
    np.testing.assert_allclose(out.belief.sum(-1) + out.uncertainty, 1.0, atol=1e-9)
    assert np.all(out.belief >= 0) and np.all((out.uncertainty >= 0) & (out.uncertainty <= 1 + 1e-12))
    np.testing.assert_allclose(out.probability.sum(-1), 1.0, atol=1e-9)
    assert np.all((out.conflict >= 0) & (out.conflict <= 1)) and np.all(
        out.conflict == out.conflict.swapaxes(-1, -2)
    )
    assert np.all((out.discount >= 0) & (out.discount <= 1))


@pytest.mark.parametrize("method", ORDER_INVARIANT)
@given(op=opinions(views=st.integers(2, 5)), data=st.data())
def test_order_invariance(method, op, data):
    v = op.uncertainty.shape[-1]
    perm = np.array(data.draw(st.permutations(range(v))))
    out, shuffled = fuse(op, method), fuse(take_views(op, perm), method)
    np.testing.assert_allclose(shuffled.belief, out.belief, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(shuffled.uncertainty, out.uncertainty, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(shuffled.conflict, out.conflict[..., perm, :][..., :, perm], atol=1e-12)
    np.testing.assert_allclose(shuffled.discount, out.discount[..., perm], rtol=1e-9, atol=1e-12)


@given(op=opinions(views=st.integers(2, 5)), data=st.data())
def test_bcf_is_order_invariant_away_from_total_conflict(op, data):
    """Dempster's rule is commutative and associative: its left fold does not depend on the order."""
    assume(np.all(_dempster_normaliser(op) > 1e-3))
    perm = np.array(data.draw(st.permutations(range(op.uncertainty.shape[-1]))))
    out, shuffled = fuse(op, "bcf"), fuse(take_views(op, perm), "bcf")
    np.testing.assert_allclose(shuffled.belief, out.belief, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(shuffled.uncertainty, out.uncertainty, rtol=1e-9, atol=1e-12)


@given(views=evidence(views=st.integers(2, 5)))
def test_cbf_adds_and_gbaf_averages_evidence(views):
    assume(np.all(views < 1e12))  # evidence is recovered as K b / u: keep u well away from 0 in float64
    op = opinion_from_evidence(views)
    np.testing.assert_allclose(evidence_from_opinion(fuse(op, "cbf")), views.sum(-2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(evidence_from_opinion(fuse(op, "gbaf")), views.mean(-2), rtol=1e-6, atol=1e-6)


@given(views=evidence(views=st.integers(2, 4)))
def test_baf_is_pairwise_evidence_averaging(views):
    assume(np.all(views < 1e12))
    expected = views[..., 0, :]
    for v in range(1, views.shape[-2]):
        expected = (expected + views[..., v, :]) / 2
    out = fuse(opinion_from_evidence(views), "baf")
    np.testing.assert_allclose(evidence_from_opinion(out), expected, rtol=1e-6, atol=1e-6)


@given(views=evidence())
def test_opinion_evidence_round_trip(views):
    assume(np.all(views < 1e12))
    np.testing.assert_allclose(
        evidence_from_opinion(opinion_from_evidence(views)), views, rtol=1e-9, atol=1e-9
    )


@given(op=opinions(views=st.integers(1, 5)), copies=st.integers(2, 4))
def test_dbf_equals_gbaf_when_views_agree(op, copies):
    """Identical views have zero projected distance, so nothing is discounted."""
    same = take_views(op, np.zeros(copies, dtype=int))
    dbf, gbaf = fuse(same, "dbf"), fuse(same, "gbaf")
    assert np.all(dbf.conflict == 0) and np.all(dbf.discount == 1)
    np.testing.assert_allclose(dbf.belief, gbaf.belief, rtol=1e-12)
    np.testing.assert_allclose(dbf.uncertainty, gbaf.uncertainty, rtol=1e-12)


@given(op=opinions(views=st.integers(1, 1)), vacuous=st.integers(1, 4), lam=st.sampled_from([0.5, 1.0, 2.0]))
def test_dbf_equals_gbaf_when_only_one_view_is_certain(op, vacuous, lam):
    """A vacuous view has zero conjunctive certainty with every view: no conflict, no discount."""
    n, _, k = op.belief.shape
    views = Opinion(
        np.concatenate([op.belief, np.zeros((n, vacuous, k))], axis=-2),
        np.concatenate([op.uncertainty, np.ones((n, vacuous))], axis=-1),
    )
    dbf, gbaf = fuse(views, "dbf", lam=lam), fuse(views, "gbaf")
    np.testing.assert_array_equal(dbf.discount, 1.0)
    np.testing.assert_allclose(dbf.belief, gbaf.belief, rtol=1e-12)
    np.testing.assert_allclose(dbf.uncertainty, gbaf.uncertainty, rtol=1e-12)


@given(op=opinions(views=st.integers(2, 5)), lams=st.lists(st.floats(0.05, 20), min_size=2, max_size=2))
def test_discount_is_monotone_in_lambda(op, lams):
    """Higher lambda forgives more (Figure 4): eta never decreases, so fused uncertainty never increases."""
    low, high = sorted(lams)
    c = conflict_matrix(op)
    assert np.all(discount_factors(c, lam=low) <= discount_factors(c, lam=high) + 1e-12)
    assert np.all(fuse(op, "dbf", lam=low).uncertainty >= fuse(op, "dbf", lam=high).uncertainty - 1e-12)


@pytest.mark.parametrize("method", METHODS)
@given(op=opinions(views=st.integers(1, 5), batch=st.integers(1, 4)), data=st.data())
def test_mask_is_dropping_the_view_in_every_sample(method, op, data):
    n, v = op.uncertainty.shape
    mask = data.draw(masks((n, v)))
    masked = fuse(
        Opinion(np.where(mask[..., None], op.belief, np.nan), np.where(mask, op.uncertainty, np.nan)),
        method,
        mask=mask,
    )
    for i in range(n):  # each sample against its own views alone
        keep = np.flatnonzero(mask[i])
        if keep.size == 0:
            np.testing.assert_array_equal(masked.uncertainty[i], 1.0)
            continue
        alone = fuse(take_views(Opinion(op.belief[i : i + 1], op.uncertainty[i : i + 1]), keep), method)
        np.testing.assert_allclose(masked.belief[i], alone.belief[0], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(masked.uncertainty[i], alone.uncertainty[0], rtol=1e-12, atol=1e-15)
        # (An agreement 1 - C keeps absolute precision only: near total conflict an ulp of C is a relative
        # 1e-11 of a discount of 1e-5, whichever order the masked and the alone paths sum in.)
        np.testing.assert_allclose(masked.discount[i, keep], alone.discount[0], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method", METHODS)
@given(op=opinions(views=st.integers(1, 5), batch=st.just(1)), data=st.data())
def test_mask_is_dropping_the_view(method, op, data):
    v = op.uncertainty.shape[-1]
    mask = data.draw(masks((1, v)))
    assume(mask.any())
    keep = np.flatnonzero(mask[0])
    # Whatever a missing view holds is never read: fill it with NaN.
    garbage = Opinion(np.where(mask[..., None], op.belief, np.nan), np.where(mask, op.uncertainty, np.nan))
    masked, dropped = fuse(garbage, method, mask=mask), fuse(take_views(op, keep), method)
    np.testing.assert_allclose(masked.belief, dropped.belief, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(masked.uncertainty, dropped.uncertainty, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(masked.conflict[..., keep, :][..., :, keep], dropped.conflict, atol=1e-15)
    missing = ~mask
    assert np.all(masked.conflict[missing] == 0) and np.all(masked.conflict.swapaxes(-1, -2)[missing] == 0)
    np.testing.assert_array_equal(masked.discount[missing], 1.0)
    # (To 1e-15 absolute as well: an agreement 1 - C near total conflict keeps absolute precision only.)
    np.testing.assert_allclose(masked.discount[..., keep], dropped.discount, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method", METHODS)
def test_no_view_present_is_vacuous(method):
    op = opinion_from_evidence(np.array([[[5.0, 1.0], [0.0, 9.0]]]))
    out = fuse(op, method, mask=np.array([[False, False]]))
    np.testing.assert_array_equal(out.belief, 0.0)
    np.testing.assert_array_equal(out.uncertainty, 1.0)
    np.testing.assert_array_equal(out.conflict, 0.0)
    np.testing.assert_array_equal(out.discount, 1.0)


@given(op=opinions(views=st.integers(1, 5)), lam=st.sampled_from([0.5, 1.0, 3.0]))
def test_dbf_matches_algorithm1(op, lam):
    """The vectorised operator against the loop-for-loop transcription of Algorithm 1."""
    b, u, c, eta = reference.dbf(op.belief, op.uncertainty, lam=lam)
    out = fuse(op, "dbf", lam=lam)
    np.testing.assert_allclose(out.conflict, c, atol=1e-12)
    # Absolute tolerances: near total conflict (C = 1 - 4e-13, say) 1 - C^lambda cancels, and a 1-ulp
    # difference in C moves eta by ~1e-9 in both implementations alike; no formulation does better from C.
    np.testing.assert_allclose(out.discount, eta, rtol=1e-9, atol=1e-7)
    np.testing.assert_allclose(out.belief, b, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(out.uncertainty, u, rtol=1e-7, atol=1e-7)


def _dempster_normaliser(op: Opinion) -> np.ndarray:
    """The smallest ``1 - C`` met while folding Dempster's rule over the views (the textbook's divisor)."""
    b, u = op.belief[..., 0, :], op.uncertainty[..., 0]
    smallest = np.ones_like(u)
    for v in range(1, op.uncertainty.shape[-1]):
        b2, u2 = op.belief[..., v, :], op.uncertainty[..., v]
        total = (b * b2).sum(-1) + b.sum(-1) * u2 + b2.sum(-1) * u + u * u2
        b, u = (b * b2 + b * u2[..., None] + b2 * u[..., None]) / total[..., None], u * u2 / total
        smallest = np.minimum(smallest, total)
    return smallest


@pytest.mark.parametrize("method", ["bcf", "cbf", "baf", "gbaf"])
@given(op=opinions(views=st.integers(1, 4)))
def test_operators_match_the_textbook_formulas(method, op):
    # The textbook forms lose precision where ours does not: their products near dogmatic views, and
    # Dempster's 1 - C near total conflict (test_bcf_near_total_conflict_is_exact covers that regime).
    assume(np.all(op.uncertainty > 1e-6))
    assume(method != "bcf" or np.all(_dempster_normaliser(op) > 1e-3))
    b, u = getattr(reference, method)(op.belief, op.uncertainty)
    out = fuse(op, method)
    np.testing.assert_allclose(out.belief, b, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(out.uncertainty, u, rtol=1e-6, atol=1e-12)


def test_bcf_near_total_conflict_is_exact():
    """Three confident views on different classes: 1 - C ~ 1e-5. Normalising by the actual total keeps
    every digit (the textbook 1 - C is off by ~2e-6 here); checked against exact rational arithmetic."""
    belief = np.zeros((1, 4, 5))
    belief[0, 0, 0], belief[0, 1, 1], belief[0, 2, 2], belief[0, 3, 0] = 0.375, 0.999995, 0.999995, 0.999995
    uncertainty = 1 - belief.sum(-1)
    exact_b = [Fraction(x) for x in belief[0, 0]]
    exact_u = Fraction(uncertainty[0, 0])
    for v in range(1, 4):
        b2, u2 = [Fraction(x) for x in belief[0, v]], Fraction(uncertainty[0, v])
        num = [exact_b[k] * b2[k] + exact_b[k] * u2 + b2[k] * exact_u for k in range(5)]
        total = sum(num) + exact_u * u2
        exact_b, exact_u = [x / total for x in num], exact_u * u2 / total
    out = fuse(Opinion(belief, uncertainty), "bcf")
    np.testing.assert_allclose(out.belief[0], [float(x) for x in exact_b], rtol=1e-12)
    np.testing.assert_allclose(out.uncertainty[0], float(exact_u), rtol=1e-12)
