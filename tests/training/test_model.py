"""Heads, loss and training loop: the paper's formulas, gradients, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import digamma, gammaln

from fusion import METHODS
from training.data import synthetic
from training.heads import EVIDENCE_CAP, EvidentialHeads, ViewHead, capped_exp
from training.loss import (
    adapted_cross_entropy,
    annealing_coefficient,
    consistency_loss,
    kl_to_uniform,
    total_loss,
)
from training.train import TrainConfig, predict_evidence, train


def test_capped_exp_is_exponential_then_flat_and_never_overflows():
    x = torch.tensor([-20.0, 0.0, 5.0, 25.0, 40.0, 1e4, 1e30], dtype=torch.float64)
    y = capped_exp(x)
    expected = EVIDENCE_CAP / (1 + EVIDENCE_CAP * np.exp(-np.clip(x.numpy(), None, 700)))
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-10)  # log-space round trip: ~1e-11 relative
    np.testing.assert_allclose(capped_exp(torch.tensor([0.0, 3.0])).numpy(), np.exp([0.0, 3.0]), rtol=1e-6)
    big = torch.tensor([1e38, 1e4], requires_grad=True)  # float32: e^x alone would overflow to inf
    out = capped_exp(big)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(big.grad).all()


@pytest.mark.parametrize("hidden", [(), (32,)])
@pytest.mark.parametrize("activation", ["exp", "softplus"])
def test_heads_give_non_negative_evidence_per_view(hidden, activation):
    heads = EvidentialHeads([5, 3], 4, hidden=hidden, activation=activation)
    evidence = heads([torch.randn(7, 5), torch.randn(7, 3)])
    assert evidence.shape == (7, 2, 4) and (evidence >= 0).all()
    assert len(ViewHead(5, 4, hidden=hidden).net) == 1 + 2 * len(hidden)


def test_adapted_cross_entropy_and_kl_match_their_closed_forms():
    alpha = np.array([[2.0, 5.0, 1.5], [1.0, 1.0, 9.0]])
    y = np.eye(3)[[1, 0]]
    ace = (y * (digamma(alpha.sum(-1, keepdims=True)) - digamma(alpha))).sum(-1)
    np.testing.assert_allclose(adapted_cross_entropy(torch.tensor(alpha), torch.tensor(y)).numpy(), ace)
    tilde = y + (1 - y) * alpha
    s = tilde.sum(-1)
    kl = (
        gammaln(s)
        - gammaln(tilde).sum(-1)
        - gammaln(3)
        + ((tilde - 1) * (digamma(tilde) - digamma(s)[:, None])).sum(-1)
    )
    np.testing.assert_allclose(kl_to_uniform(torch.tensor(alpha), torch.tensor(y)).numpy(), kl)
    # No misleading evidence: alpha~ is uniform, KL is 0.
    assert (
        kl_to_uniform(torch.tensor([[7.0, 1.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0]])).abs().item() < 1e-12
    )


def test_annealing_and_consistency():
    assert [annealing_coefficient(t, 50) for t in (1, 25, 50, 80)] == [0.02, 0.5, 1.0, 1.0]
    conflict = torch.tensor([[0.0, 0.2, 0.4], [0.2, 0.0, 0.1], [0.4, 0.1, 0.0]])
    assert consistency_loss(conflict).item() == pytest.approx((0.2 + 0.4 + 0.1) * 2 / 2)


@pytest.mark.parametrize("method", METHODS)
def test_total_loss_has_finite_gradients_for_every_method(method):
    torch.manual_seed(0)
    heads = EvidentialHeads([6, 4, 5], 3)
    views = [torch.randn(16, d) * 5 for d in (6, 4, 5)]  # large logits: evidence near the cap
    loss, fused = total_loss(
        heads(views), torch.randint(0, 3, (16,)), method=method, annealing=0.5, gamma=0.7
    )
    assert loss.shape == (16,)
    loss.mean().backward()
    assert torch.isfinite(loss).all()
    assert all(torch.isfinite(p.grad).all() for p in heads.parameters())
    assert fused.belief.shape == (16, 3)


def _synthetic_split():
    data = synthetic(240, num_classes=3, noise=0.3, seed=1)
    views = [data.views[name] for name in data.spec.view_names]
    return [v[:180] for v in views], data.labels[:180], [v[180:] for v in views], data.labels[180:]


def test_training_learns_and_is_deterministic():
    train_views, train_labels, test_views, test_labels = _synthetic_split()
    config = TrainConfig(method="dbf", epochs=30, batch_size=60, seed=3)
    first = train(train_views, train_labels, num_classes=3, config=config, progress=False)
    again = train(train_views, train_labels, num_classes=3, config=config, progress=False)
    evidence = predict_evidence(first, test_views)
    np.testing.assert_array_equal(evidence, predict_evidence(again, test_views))
    fused_accuracy = (evidence.sum(1).argmax(-1) == test_labels).mean()
    assert fused_accuracy > 0.9
    other = train(
        train_views, train_labels, num_classes=3, config=TrainConfig(epochs=30, batch_size=60, seed=4)
    )
    assert not np.array_equal(evidence, predict_evidence(other, test_views))
