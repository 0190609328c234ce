"""Extreme inputs: evidence up to 1e13 in float32, dogmatic views, total conflict, large batches."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fusion import (
    METHODS,
    Opinion,
    conflict_matrix,
    degree_of_conflict,
    evidence_from_opinion,
    fuse,
    opinion_from_evidence,
    projected_distance,
)
from fusion._array import pairwise_l1, sum_last

BACKENDS = [pytest.param(np.asarray, id="numpy"), pytest.param(torch.as_tensor, id="torch")]


def to_numpy(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lam", [0.5, 1.0, 3.0])
def test_capped_exponential_range_stays_finite_and_additive(backend, dtype, method, lam):
    """Evidence from 0 to the capped exponential's 1e13, agreeing and conflicting, every view mix."""
    rng = np.random.default_rng(0)
    magnitude = 10.0 ** rng.integers(-3, 14, size=(512, 4, 10))
    evidence = np.where(rng.random((512, 4, 10)) < 0.3, 0.0, magnitude * rng.random((512, 4, 10)))
    evidence[:8] = 0.0
    evidence[8:16] = 1e13
    evidence[16:24, :, 1:] = 0.0  # confident agreement
    evidence[24:32] = np.eye(4, 10) * 1e13  # confident total disagreement
    out = fuse(opinion_from_evidence(backend(evidence.astype(dtype))), method, lam=lam)
    belief, uncertainty = to_numpy(out.belief), to_numpy(out.uncertainty)
    for x in (belief, uncertainty, to_numpy(out.conflict), to_numpy(out.discount), to_numpy(out.probability)):
        assert np.isfinite(x).all()
    tolerance = 1e-3 if dtype == "float32" else 1e-9
    np.testing.assert_allclose(belief.sum(-1) + uncertainty, 1.0, atol=tolerance)
    assert (belief >= 0).all() and (uncertainty >= 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("lam", "limit"), [(1e308, 1e30), (5e-324, 1e-30), (1e-300, 1e-30)])
def test_lambdas_beyond_the_dtypes_range_give_the_limit_without_warnings(backend, dtype, lam, limit):
    """Any positive finite lambda is taken (a request may send 1e308): one whose power or root is beyond
    float32's range gives what lambda -> infinity (or -> 0) gives, and numpy warns of no cast."""
    from fusion.conflict import agreement

    conflict = backend(np.array([0.0, 1e-6, 0.3, 0.99, 1.0], dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = to_numpy(agreement(conflict, lam=lam))
    np.testing.assert_array_equal(got, to_numpy(agreement(conflict, lam=limit)))
    assert got.tolist() == ([1.0, 1.0, 1.0, 1.0, 0.0] if lam > 1 else [1.0, 0.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["cbf", "gbaf", "baf", "dbf"])
def test_dogmatic_views_are_averaged(backend, method):
    """Josang's limit: with some u = 0, the dogmatic opinions are averaged and u = 0 (DBF discounts first)."""
    views = Opinion(
        backend(np.array([[0.6, 0.4, 0.0], [0.2, 0.2, 0.2], [0.8, 0.2, 0.0]])),
        backend(np.array([0.0, 0.4, 0.0])),
    )
    out = fuse(views, method)
    if method == "dbf":  # the two dogmatic views conflict (PD = 0.2): both are discounted
        assert 0 < float(out.uncertainty) < 1
    else:
        # The non-dogmatic middle view carries no weight; (0.6 + 0.8) / 2 = 0.7. BAF's fold gets there too:
        # view 1 absorbs view 2, then averages with view 3.
        np.testing.assert_allclose(to_numpy(out.belief), [0.7, 0.3, 0.0], atol=1e-12)
        assert float(out.uncertainty) == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_dbf_averages_agreeing_dogmatic_views(backend):
    """Dogmatic views that agree (PD = 0), beside a vacuous one (CC = 0), are not discounted: DBF gives their
    average with u = 0, as GBAF does. (A confident middle view would conflict with them and be discounted.)"""
    views = Opinion(
        backend(np.array([[0.6, 0.4, 0.0], [0.0, 0.0, 0.0], [0.6, 0.4, 0.0]])),
        backend(np.array([0.0, 1.0, 0.0])),
    )
    out = fuse(views, "dbf")
    np.testing.assert_allclose(to_numpy(out.belief), [0.6, 0.4, 0.0], atol=1e-12)
    assert float(out.uncertainty) == 0.0
    np.testing.assert_array_equal(to_numpy(out.discount), 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bcf_total_conflict_is_vacuous(backend):
    """Dempster's rule is undefined at 1 - C = 0; we return the vacuous opinion, never NaN."""
    views = Opinion(backend(np.array([[1.0, 0.0], [0.0, 1.0]])), backend(np.array([0.0, 0.0])))
    out = fuse(views, "bcf")
    np.testing.assert_array_equal(to_numpy(out.belief), [0.0, 0.0])
    assert float(out.uncertainty) == 1.0
    # The fold goes on from the vacuous opinion: a third view then decides alone.
    third = Opinion(
        backend(np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.0]])), backend(np.array([0.0, 0.0, 0.5]))
    )
    np.testing.assert_allclose(to_numpy(fuse(third, "bcf").belief), [0.5, 0.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_large_batch_kernel_matches_broadcast(dtype):
    """Past a size threshold numpy switches to a class-major pair loop; both give the same distances."""
    rng = np.random.default_rng(1)
    x = rng.random((6000, 6, 10)).astype(dtype)
    expected = np.abs(x[..., :, None, :] - x[..., None, :, :]).sum(-1)
    np.testing.assert_allclose(pairwise_l1(x, np), expected, rtol=1e-5 if dtype == np.float32 else 1e-12)
    extra_batch = x.reshape(2, 3000, 6, 10)
    np.testing.assert_allclose(pairwise_l1(extra_batch, np), expected.reshape(2, 3000, 6, 6), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_leading_batch_shape(backend):
    evidence = np.random.default_rng(2).random((2, 3, 4, 5)) * 10
    out = fuse(opinion_from_evidence(backend(evidence)), "dbf", mask=backend(np.ones((2, 3, 4), dtype=bool)))
    assert tuple(out.belief.shape) == (2, 3, 5) and tuple(out.uncertainty.shape) == (2, 3)
    assert tuple(out.conflict.shape) == (2, 3, 4, 4) and tuple(out.discount.shape) == (2, 3, 4)
    flat = fuse(opinion_from_evidence(backend(evidence.reshape(6, 4, 5))), "dbf")
    np.testing.assert_allclose(to_numpy(out.belief).reshape(6, 5), to_numpy(flat.belief), rtol=1e-12)


def test_integer_evidence_is_promoted():
    out = fuse(opinion_from_evidence(np.array([[3, 0], [5, 0]])), "gbaf")
    assert out.belief.dtype == np.float64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_integer_opinions_are_promoted(backend, method):
    """Dogmatic one-hot opinions as integers (``torch.nn.functional.one_hot`` gives int64) fuse as their
    float values do, on both backends (torch's matmul takes no integer-float mix), in the dtype integer
    evidence takes."""
    one_hot, dogmatic = np.array([[[1, 0, 0], [1, 0, 0]]]), np.zeros((1, 2), dtype=np.int64)
    out = fuse(Opinion(backend(one_hot), backend(dogmatic)), method)
    expected = fuse(Opinion(one_hot.astype(float), dogmatic.astype(float)), method)
    promoted = opinion_from_evidence(backend(one_hot)).belief.dtype  # as integer evidence is
    assert out.belief.dtype == out.uncertainty.dtype == promoted
    np.testing.assert_array_equal(to_numpy(out.belief), expected.belief)
    np.testing.assert_array_equal(to_numpy(out.uncertainty), expected.uncertainty)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conflict_matrix_of_integer_opinions(backend):
    """Two dogmatic one-hot opinions on different classes, as integers: total conflict, on both backends."""
    views = Opinion(backend(np.array([[[1, 0], [0, 1]]])), backend(np.zeros((1, 2), dtype=np.int64)))
    assert to_numpy(conflict_matrix(views)).tolist() == [[[0.0, 1.0], [1.0, 0.0]]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("with_mask", [False, True], ids=["no-mask", "mask"])
def test_nan_in_a_present_view_propagates(backend, method, with_mask):
    """A NaN in a view that is fused is an error upstream: every operator must pass it on as NaN, not read
    it as total conflict (Dempster's undefined case) or as 'no view present' and answer vacuous."""
    evidence = np.array([[[np.nan, 1.0, 0.0], [3.0, 1.0, 0.0], [1.0, 1.0, 1.0]]])
    mask = backend(np.array([[True, True, False]])) if with_mask else None
    out = fuse(opinion_from_evidence(backend(evidence)), method, mask=mask)
    assert np.isnan(to_numpy(out.uncertainty)).all()
    assert np.isnan(to_numpy(out.belief)).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("other_u", [0.3, 0.0], ids=["no-dogmatic", "a-dogmatic-row"])
def test_nan_uncertainty_gives_nan_evidence_not_infinite(backend, other_u):
    """Only ``u = 0`` is dogmatic (infinite evidence): a NaN uncertainty is no number, and its evidence NaN,
    on both backends and whether or not another row is dogmatic (numpy's fast path is taken only if not)."""
    opinion = Opinion(backend(np.array([[0.5, 0.2], [0.7, 0.0]])), backend(np.array([np.nan, other_u])))
    evidence = to_numpy(evidence_from_opinion(opinion))
    assert np.isnan(evidence[0]).all()
    assert np.isfinite(evidence[1, 1]) and (evidence[1, 0] == np.inf) == (other_u == 0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pairwise_conflict_stays_in_its_range_in_float32(backend):
    """Dogmatic float32 opinions whose probabilities sum to 1 only up to rounding: PD and DC are in [0, 1]
    as documented (unclipped, 28 of these 100000 pairs came out at 1.0000001), as conflict_matrix's are."""
    p = np.random.default_rng(0).dirichlet(np.full(7, 0.05), size=(100_000, 2)).astype(np.float32)
    a, b = (Opinion(backend(p[:, i]), backend(np.zeros(len(p), dtype=np.float32))) for i in (0, 1))
    for measure in (projected_distance(a, b), degree_of_conflict(a, b)):
        measure = to_numpy(measure)
        assert measure.min() >= 0 and measure.max() <= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_sums_over_the_classes_add_them_in_order_whatever_the_rows(dtype):
    """What batch invariance rests on (below): a row's sum over its classes is the sequential sum, for one
    row and for many, whatever the number of classes (numpy's own reduction of a row is pairwise from 8)."""
    rng = np.random.default_rng(5)
    for rows in (1, 2, 3, 15, 16, 17, 100, 1000):
        for classes in (1, 2, 7, 8, 9, 10, 68, 129, 1000):
            x = (rng.random((rows, classes)) * 10.0 ** rng.uniform(-3, 3, (rows, classes))).astype(dtype)
            in_order = x[:, 0].copy()
            for k in range(1, classes):
                in_order += x[:, k]
            assert sum_last(x, np).tobytes() == in_order.tobytes(), (rows, classes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("classes", [3, 10, 68])
def test_a_sample_fuses_to_the_bit_the_same_in_any_batch(dtype, method, classes):
    """The service micro-batches concurrent requests: a sample's answer must not depend on the batch it ran
    in. Sums over the classes as a BLAS matrix-vector product rounded each row by its place in the batch
    and the batch's size (belief and uncertainty moved by up to 2.4e-7, a calibrated confidence by 8e-6,
    against the sample alone). Batch sizes on both sides of the class-major pairwise kernel's threshold."""
    rng = np.random.default_rng(classes)
    n, v = 400, 6
    evidence = (rng.random((n, v, classes)) * 10.0 ** rng.uniform(-3, 3, (n, v, 1))).astype(dtype)
    mask = rng.random((n, v)) < 0.8
    for size in (n, 90, 17, 5, 2):
        batch = fuse(opinion_from_evidence(evidence[:size]), method, lam=0.5, mask=mask[:size])
        for i in rng.choice(size, min(size, 3), replace=False):
            one = fuse(opinion_from_evidence(evidence[i : i + 1]), method, lam=0.5, mask=mask[i : i + 1])
            for name in ("belief", "uncertainty", "conflict", "discount"):
                assert getattr(batch, name)[i].tobytes() == getattr(one, name)[0].tobytes(), (size, i, name)
