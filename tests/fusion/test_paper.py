"""Golden values and statements from the paper (shared/paper/dbf_aistats2025.tex), on numpy and torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

from fusion import Opinion, evidence_from_opinion, fuse, gbaf, opinion_from_evidence
from tests.fusion.strategies import opinions

BACKENDS = [
    pytest.param(np.asarray, id="numpy"),
    pytest.param(torch.as_tensor, id="torch"),
]
DTYPES = ["float32", "float64"]


def to_numpy(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def table2_views(backend, dtype):
    """Table 2's two modalities (Zadeh's example): dogmatic and almost fully disagreeing."""
    belief = np.array([[0.99, 0.00, 0.01], [0.00, 0.99, 0.01]], dtype=dtype)
    return Opinion(backend(belief), backend(np.zeros(2, dtype=dtype)))


# Table 2, rows "BCF" .. "DBF lambda = 3": (method, lambda, b1, b2, b3, u), printed to 4 decimals.
TABLE2 = [
    ("bcf", 1.0, 0.0000, 0.0000, 1.0000, 0.0),
    ("cbf", 1.0, 0.4950, 0.4950, 0.0100, 0.0),
    ("baf", 1.0, 0.4950, 0.4950, 0.0100, 0.0),
    ("dbf", 1.0, 0.0050, 0.0050, 0.0001, 0.9900),
    ("dbf", 3.0, 0.1533, 0.1533, 0.0031, 0.6903),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("method", "lam", "b1", "b2", "b3", "u"), TABLE2)
def test_table2_row(backend, dtype, method, lam, b1, b2, b3, u):
    out = fuse(table2_views(backend, dtype), method, lam=lam)
    # Equal to the printed digits: within half a unit of the 4th decimal, plus the dtype's rounding (0.00495,
    # printed 0.0050, is 0.0049499953 in float32).
    tolerance = 0.5e-4 + 10 * np.finfo(dtype).eps
    np.testing.assert_allclose(to_numpy(out.belief), [b1, b2, b3], rtol=0, atol=tolerance)
    np.testing.assert_allclose(float(out.uncertainty), u, rtol=0, atol=tolerance)


@pytest.mark.parametrize("backend", BACKENDS)
def test_table2_conflict_and_discount(backend):
    """DC = PD x CC = 0.99 x 1; lambda = 1 agreement 0.01 discounts both modalities alike."""
    out = fuse(table2_views(backend, "float64"), "dbf", lam=1.0)
    np.testing.assert_allclose(to_numpy(out.conflict), [[0.0, 0.99], [0.99, 0.0]], atol=1e-12)
    np.testing.assert_allclose(to_numpy(out.discount), [0.01, 0.01], atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_proposition1_baf_depends_on_order(backend):
    """Evidence 3, 5, 10 fuses to 7 in that order and to 5.25 in the reverse one."""
    evidence = np.array([[3.0, 0.0], [5.0, 0.0], [10.0, 0.0]])
    forward = fuse(opinion_from_evidence(backend(evidence)), "baf")
    backward = fuse(opinion_from_evidence(backend(evidence[::-1].copy())), "baf")
    np.testing.assert_allclose(to_numpy(evidence_from_opinion(forward)), [7.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(to_numpy(evidence_from_opinion(backward)), [5.25, 0.0], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eq7_gbaf_averages_evidence(backend):
    """Eq. 7: in evidence terms GBAF is the plain mean, whatever the order (6 for 3, 5, 10)."""
    evidence = np.array([[3.0, 0.0], [5.0, 0.0], [10.0, 0.0]])
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        out = fuse(opinion_from_evidence(backend(evidence[order])), "gbaf")
        np.testing.assert_allclose(to_numpy(evidence_from_opinion(out)), [6.0, 0.0], rtol=1e-12)


@given(opinions(views=__import__("hypothesis").strategies.integers(1, 6)))
def test_proposition2_gbaf_uncertainty_is_harmonic_mean(op):
    u = op.uncertainty
    expected = u.shape[-1] / np.sum(1 / u, axis=-1)
    np.testing.assert_allclose(gbaf(op).uncertainty, expected, rtol=1e-9)


def test_dbf_discounts_the_view_that_conflicts_with_most():
    """Figure 3's point: with four views, the one opposing the other three is discounted most."""
    evidence = np.array([[[30.0, 1, 1], [28, 2, 1], [25, 1, 3], [1, 1, 30]]])
    out = fuse(opinion_from_evidence(evidence), "dbf")
    eta = out.discount[0]
    assert np.argmin(eta) == 3
    assert eta[3] < eta[:3].min() / 5
    assert int(np.argmax(out.probability[0])) == 0
