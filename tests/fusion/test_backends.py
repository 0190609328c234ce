"""numpy and torch run the same code: same numbers, and torch gets exact, finite gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fusion import (
    METHODS,
    Opinion,
    agreement,
    agrees_with_the_others,
    conflict_matrix,
    discount_factors,
    fuse,
    opinion_from_evidence,
    top_class_of_the_others,
)
from tests.fusion.strategies import evidence, masks


def rounding_reach(views: np.ndarray, fused, lam: float) -> float:
    """How far, relatively, DBF's answers on ``views`` can move when the two backends round an intermediate
    differently (numpy and torch sum, raise to powers and multiply in their own orders: an ulp or a few).
    Two steps amplify such a rounding, where views are confident:

    - the agreement ``A = (1 - C^lambda)^(1/lambda)`` as C nears 1 (views in near-total conflict, lambda > 1):
      a relative rounding of C moves A by ``C^lambda (1 - C^lambda)^(1/lambda - 1)`` times it;
    - the discounted uncertainty ``1 - eta (1 - u)`` as the discount eta nears 1 and u nears 0 (confident
      views in near agreement): an ulp of eta moves it, and the averaging weights ``u_min / u``, by that ulp
      over its value (an eta within an ulp of 1 is 1 in both).

    Elsewhere both are below the tolerance's floor."""
    eps, tiny = np.finfo(np.float64).eps, np.finfo(np.float64).tiny
    c = np.clip(fused.conflict, 0.0, 1.0)
    rest = np.maximum(1 - c**lam, tiny)
    agreement = (c**lam * rest ** (1 / lam - 1)) / np.maximum(rest ** (1 / lam), tiny)
    discounted = 1 - fused.discount * (1 - opinion_from_evidence(views).uncertainty)
    rounded = np.where(1 - fused.discount > eps / 4, 1 / np.maximum(discounted, tiny), 0.0)
    views_count = views.shape[-2]
    amplified = agreement.max(initial=0.0) + rounded.max(initial=0.0)
    return float(16 * views_count * eps * amplified)


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=40)
@given(views=evidence(views=st.integers(1, 5), batch=st.integers(1, 4)), lam=st.sampled_from([0.5, 1.0, 3.0]))
@example(  # evidence 1e13 for two classes, each view its own: 1 - C ~ 1e-13, and a slope of ~1e8 at lam 3
    views=np.array([[[1e13, 52.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1e13, 0.0, 0.0], [0.0] * 5]]), lam=3.0
)
def test_torch_matches_numpy(method, views, lam):
    expected = fuse(opinion_from_evidence(views), method, lam=lam)
    out = fuse(opinion_from_evidence(torch.from_numpy(views)), method, lam=lam)
    assert isinstance(out.belief, torch.Tensor) and out.belief.dtype == torch.float64
    np.testing.assert_allclose(out.conflict.numpy(), expected.conflict, rtol=1e-9, atol=1e-12)
    reach = rounding_reach(views, expected, lam) if method == "dbf" else 0.0
    for name in ("belief", "uncertainty", "probability", "discount"):
        np.testing.assert_allclose(
            getattr(out, name).numpy(), getattr(expected, name), rtol=1e-9 + reach, atol=1e-12, err_msg=name
        )


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=20)
@given(views=evidence(views=st.integers(1, 4), batch=st.just(2)), data=st.data())
def test_torch_matches_numpy_with_mask(method, views, data):
    mask = data.draw(masks(views.shape[:-1]))
    expected = fuse(opinion_from_evidence(views), method, mask=mask)
    out = fuse(opinion_from_evidence(torch.from_numpy(views)), method, mask=torch.from_numpy(mask))
    np.testing.assert_allclose(out.conflict.numpy(), expected.conflict, rtol=1e-9, atol=1e-12)
    reach = rounding_reach(views, expected, 1.0) if method == "dbf" else 0.0
    for name in ("belief", "uncertainty", "discount"):
        np.testing.assert_allclose(
            getattr(out, name).numpy(), getattr(expected, name), rtol=1e-9 + reach, atol=1e-12, err_msg=name
        )


@settings(max_examples=40)
@given(views=evidence(views=st.integers(1, 5), batch=st.integers(1, 4)), data=st.data())
def test_torch_matches_numpy_on_each_views_agreement_with_the_others(views, data):
    mask = data.draw(st.none() | masks(views.shape[:-1]))
    expected = agrees_with_the_others(opinion_from_evidence(views), mask=mask)
    opinions = opinion_from_evidence(torch.from_numpy(views))
    torch_mask = None if mask is None else torch.from_numpy(mask)
    agrees, compared = agrees_with_the_others(opinions, mask=torch_mask)
    assert agrees.dtype == compared.dtype == torch.bool
    np.testing.assert_array_equal(agrees.numpy(), expected[0])
    np.testing.assert_array_equal(compared.numpy(), expected[1])
    np.testing.assert_array_equal(
        top_class_of_the_others(opinions, mask=torch_mask).numpy(),
        top_class_of_the_others(opinion_from_evidence(views), mask=mask),
    )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lam", [0.5, 1.0, 3.0])
def test_float32_tracks_float64(method, lam):
    """Heads' evidence in float32 (up to 1e6 here) gives the float64 answer to 1e-4, on numpy and torch.

    Known limit: for confident views in near-total conflict (C within ~1e-7 of 1, e.g. evidence 1e9 for
    disjoint classes) float32 rounds C to 1, and with lambda > 1 the agreement (1 - C^lambda)^(1/lambda)
    then loses up to ~3e-3 (u = 1.0 instead of 0.997)."""
    rng = np.random.default_rng(5)
    evidence = 10.0 ** rng.uniform(-3, 6, size=(2000, 4, 6)) * (rng.random((2000, 4, 6)) < 0.6)
    expected = fuse(opinion_from_evidence(evidence), method, lam=lam)
    for backend in (np.asarray, torch.as_tensor):
        out = fuse(opinion_from_evidence(backend(evidence.astype(np.float32))), method, lam=lam)
        for name in ("belief", "uncertainty", "conflict", "discount"):
            value = np.asarray(getattr(out, name), dtype=np.float64)
            np.testing.assert_allclose(value, getattr(expected, name), rtol=0, atol=1e-4, err_msg=name)


def _evidence(seed: int, shape=(3, 4, 5)) -> torch.Tensor:
    """Smooth, strictly positive evidence (no kinks of |.| or min at ties) for finite differences."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=generator, dtype=torch.float64) * 20 + 0.1).requires_grad_()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lam", [0.5, 1.0, 3.0])
def test_gradcheck_fuse(method, lam):
    def fused(e):
        out = fuse(opinion_from_evidence(e), method, lam=lam)
        return out.belief, out.uncertainty, out.conflict, out.discount

    assert torch.autograd.gradcheck(fused, (_evidence(0),))


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_fuse_with_mask(method):
    mask = torch.tensor([[True, False, True, True], [False, False, True, False], [True, True, True, True]])

    def fused(e):
        out = fuse(opinion_from_evidence(e), method, mask=mask)
        return out.belief, out.uncertainty

    assert torch.autograd.gradcheck(fused, (_evidence(1),))


@pytest.mark.parametrize("lam", [0.3, 1.0, 2.5])
def test_gradcheck_pieces(lam):
    e = _evidence(2)
    assert torch.autograd.gradcheck(lambda x: conflict_matrix(opinion_from_evidence(x)), (e,))
    c = (torch.rand(3, 4, 4, dtype=torch.float64) * 0.9 + 0.05).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: agreement(x, lam=lam), (c,))
    assert torch.autograd.gradcheck(lambda x: discount_factors(x, lam=lam), (c,))


def _grads(views: Opinion, method: str, lam: float, mask=None):
    b = views.belief.clone().requires_grad_()
    u = views.uncertainty.clone().requires_grad_()
    out = fuse(Opinion(b, u), method, lam=lam, mask=mask)
    (out.belief.sum() + out.uncertainty.sum() + out.conflict.sum() + out.discount.sum()).backward()
    return b.grad, u.grad


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lam", [0.1, 0.5, 1.0, 3.0])
def test_gradients_are_finite_at_the_edges(method, lam):
    """Zero conflict (C^lambda has an infinite slope there for lambda < 1), total conflict, dogmatic views."""
    agreeing = opinion_from_evidence(torch.tensor([[[4.0, 1.0, 0.0], [4.0, 1.0, 0.0]]], dtype=torch.float64))
    dogmatic_disjoint = Opinion(
        torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], dtype=torch.float64),
        torch.zeros(1, 2, dtype=torch.float64),
    )
    dogmatic_and_not = Opinion(
        torch.tensor([[[0.7, 0.3, 0.0], [0.1, 0.1, 0.1]]], dtype=torch.float64),
        torch.tensor([[0.0, 0.7]], dtype=torch.float64),
    )
    for views in (agreeing, dogmatic_disjoint, dogmatic_and_not):
        for grad in _grads(views, method, lam):
            assert torch.isfinite(grad).all(), (views, grad)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_ignore_missing_views_holding_nan(method):
    views = opinion_from_evidence(
        torch.tensor([[[4.0, 1.0], [float("nan"), 2.0], [0.0, 3.0]]], dtype=torch.float64)
    )
    b_grad, u_grad = _grads(views, method, 1.0, mask=torch.tensor([[True, False, True]]))
    assert torch.isfinite(b_grad).all() and torch.isfinite(u_grad).all()
    assert (b_grad[0, 1] == 0).all() and u_grad[0, 1] == 0


def test_torch_keeps_the_autograd_graph_and_device():
    e = _evidence(3)
    out = fuse(opinion_from_evidence(e), "dbf")
    assert out.belief.requires_grad and out.belief.device == e.device
    out.uncertainty.sum().backward()
    assert e.grad is not None and torch.isfinite(e.grad).all()


@pytest.mark.parametrize("views", [2, 3, 6, 30])
def test_discount_gradient_is_the_product_of_the_other_agreements(views):
    """``d eta^v / d A_vi = prod_{j != i} A_vj``, also where another agreement is 0 (total conflict) and
    for many views (torch takes a product over the whole row there, numpy multiplies column by column)."""
    rng = np.random.default_rng(views)
    c = rng.uniform(0.05, 0.95, size=(2, views, views))
    c[0, 0, 1] = 1.0  # view 0 in total conflict with view 1: A_01 = 0
    conflict = torch.tensor(c, requires_grad=True)
    discount_factors(conflict).sum().backward()
    a = 1 - c
    others = np.stack([np.prod(np.delete(a, i, axis=-1), axis=-1) for i in range(views)], axis=-1)
    np.testing.assert_allclose(conflict.grad.numpy(), -others, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(discount_factors(conflict).detach().numpy(), discount_factors(c), rtol=1e-13)
