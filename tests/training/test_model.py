"""Heads, loss and training loop: the paper's formulas, gradients, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import digamma, gammaln

from fusion import METHODS, fuse, opinion_from_evidence
from training.data import synthetic
from training.heads import EVIDENCE_CAP, EvidentialHeads, ViewHead, capped_exp
from training.loss import (
    SERIES_FROM,
    adapted_cross_entropy,
    annealing_coefficient,
    asymptotic_digamma_trigamma,
    consistency_loss,
    digamma_trigamma,
    evidential_loss,
    kl_to_uniform,
    total_loss,
)
from training.protocol import Samples
from training.train import (
    EarlyStopping,
    TrainConfig,
    _BatchedLinear,
    class_weights,
    predict_evidence,
    train,
    train_members,
)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vectorised_digamma_and_trigamma_agree_with_torch_from_1_to_the_cap(dtype):
    x = torch.logspace(0, 13, 4000, dtype=torch.float64).to(dtype)
    psi, dpsi = asymptotic_digamma_trigamma(x)
    tolerance = 1e-8 if dtype == torch.float64 else 5e-6
    torch.testing.assert_close(psi, torch.digamma(x), rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(dpsi, torch.polygamma(1, x), rtol=tolerance, atol=0.0)


def test_small_tensors_get_torchs_digamma_and_trigamma_and_large_ones_the_series():
    """A small batch's loss is computed by torch's kernels, to the bit; from SERIES_FROM elements on, by the
    series (which agrees with them to float32 rounding: the test above)."""
    x = torch.logspace(0, 13, SERIES_FROM, dtype=torch.float64).to(torch.float32)
    small = x[: SERIES_FROM - 1]
    psi, dpsi = digamma_trigamma(small)
    assert torch.equal(psi, torch.digamma(small)) and torch.equal(dpsi, torch.polygamma(1, small))
    series = asymptotic_digamma_trigamma(x)
    assert all(torch.equal(got, expected) for got, expected in zip(digamma_trigamma(x), series, strict=True))
    assert not torch.equal(series[0], torch.digamma(x))


def test_evidential_loss_equals_its_definition_in_value_and_gradient():
    """The closed-form gradient is the gradient of Eq. 15 + sigma Eq. 16 (autograd through the definition)."""
    torch.manual_seed(0)
    logits = torch.randn(4, 9, 3, 6, dtype=torch.float64) * 4  # evidence from ~e^-12 to ~e^12
    target = torch.nn.functional.one_hot(torch.randint(0, 6, (4, 9)), 6).to(torch.float64)[..., None, :]
    reference_input = logits.clone().requires_grad_()
    alpha = torch.exp(reference_input) + 1
    reference = adapted_cross_entropy(alpha, target) + 0.3 * kl_to_uniform(alpha, target)
    reference.sum().backward()
    fast_input = logits.clone().requires_grad_()
    fast = evidential_loss(torch.exp(fast_input) + 1, target, annealing=0.3)
    fast.sum().backward()
    torch.testing.assert_close(fast, reference, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(fast_input.grad, reference_input.grad, rtol=1e-6, atol=1e-9)
    assert torch.autograd.gradcheck(
        lambda a: evidential_loss(a, target[:, :3], annealing=0.7),
        (torch.exp(logits[:, :3]) / 10 + 1).requires_grad_(),
    )


def test_total_loss_with_one_method_per_model_equals_each_model_alone():
    torch.manual_seed(1)
    evidence = torch.rand(5, 8, 3, 4, dtype=torch.float64) * 20
    labels = torch.randint(0, 4, (5, 8))
    methods = ["bcf", "bcf", "dbf", "gbaf", "gbaf"]
    together, fused = total_loss(evidence, labels, method=methods, annealing=0.4, gamma=0.5, lam=0.7)
    for m, method in enumerate(methods):
        alone, alone_fused = total_loss(
            evidence[m], labels[m], method=method, annealing=0.4, gamma=0.5, lam=0.7
        )
        torch.testing.assert_close(together[m], alone)
        torch.testing.assert_close(fused.discount[m], alone_fused.discount)
    with pytest.raises(ValueError, match="3 methods for 5 models"):
        total_loss(evidence, labels, method=methods[:3], annealing=0.4, gamma=0.5)


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
    views = [data.views[name] for name in data.view_names]
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


def _train_validated(epochs: int, patience: int, *, time_limit: float | None = None, shuffled: bool = False):
    """One model trained on the synthetic split's training part, validated on its test part (with its
    labels shuffled: a validation loss that soon rises)."""
    train_views, train_labels, test_views, test_labels = _synthetic_split()
    if shuffled:
        test_labels = np.random.default_rng(0).permutation(test_labels)
    validation = Samples(
        views={str(v): x for v, x in enumerate(test_views)},
        rows=np.arange(len(test_labels)),
        labels=test_labels,
    )
    (trained,) = train_members(
        [train_views],
        [train_labels],
        num_classes=3,
        config=TrainConfig(method="dbf", epochs=epochs, batch_size=60, seed=3),
        seeds=[3],
        validation=[validation],
        early_stopping=EarlyStopping(patience=patience),
        time_limit=time_limit,
        progress=False,
    )
    return trained.history


def test_the_validation_loss_is_evaluated_every_hundredth_of_the_patience_and_at_the_last_epoch():
    # A validation pass every epoch was a quarter of small data's training time, where an epoch is one
    # step and the patience a thousand: a hundredth of the patience apart, the best epoch is as good.
    assert [EarlyStopping(patience=p).every for p in (1, 30, 199, 200, 1000)] == [1, 1, 1, 2, 10]
    history = _train_validated(epochs=11, patience=200)
    assert history.validation_epochs == [2, 4, 6, 8, 10, 11]
    assert len(history.validation_loss) == 6 and len(history.train_loss) == 11
    assert history.best_epoch in history.validation_epochs


def test_a_run_ending_between_evaluations_evaluates_its_last_epoch():
    timed_out = _train_validated(epochs=100, patience=200, time_limit=0)  # the first epoch ends it
    assert (timed_out.epochs, timed_out.timed_out, timed_out.validation_epochs) == (1, True, [1])
    # checked every 2 epochs, a best epoch is even: a patience of 201 runs out on an odd epoch
    stopped = _train_validated(epochs=2000, patience=201, shuffled=True)
    assert stopped.stopped_early and stopped.best_epoch % 2 == 0
    assert stopped.epochs == stopped.best_epoch + 201 == stopped.validation_epochs[-1]


@pytest.mark.parametrize("seed", range(5))
def test_class_weights_follow_the_rule_and_average_one(seed):
    rng = np.random.default_rng(seed)
    labels = rng.choice(4, size=200, p=[0.7, 0.2, 0.09, 0.01])
    counts = np.bincount(labels, minlength=4)
    balanced = class_weights(labels, num_classes=4, weighting="balanced")
    sqrt = class_weights(labels, num_classes=4, weighting="sqrt")
    np.testing.assert_array_equal(class_weights(labels, num_classes=4, weighting="none"), np.ones(4))
    for weights in (balanced, sqrt):
        assert weights[labels].mean() == pytest.approx(1.0)
    present = counts > 0
    per_class = balanced[present] * counts[present]  # each class's samples weigh as much in all
    np.testing.assert_allclose(per_class, per_class[0])
    np.testing.assert_allclose(sqrt[present] ** 2 / balanced[present], sqrt[0] ** 2 / balanced[0])


def test_weighted_classes_keep_a_rare_class_that_unweighted_training_drowns():
    """5% of the samples in class 1, which one view separates by 6 standard deviations: unweighted, the
    evidence for the common class grows without bound and the fused model answers it nearly everywhere."""
    rng = np.random.default_rng(0)

    def views(labels):
        strong = rng.normal(size=(len(labels), 4)) + 3.0 * labels[:, None]
        weak = rng.normal(size=(len(labels), 4)) + 0.5 * labels[:, None]
        return [strong.astype(np.float32), weak.astype(np.float32)]

    labels = np.repeat([0, 1], [475, 25])
    train_views = views(labels)
    test_labels = np.repeat([0, 1], 500)
    test_views = views(test_labels)
    recall = {}
    for weighting in ("none", "sqrt"):
        config = TrainConfig(epochs=150, class_weighting=weighting)
        heads = train(train_views, labels, num_classes=2, config=config, progress=False)
        fused = fuse(opinion_from_evidence(torch.as_tensor(predict_evidence(heads, test_views))), "dbf")
        predicted = fused.belief.argmax(-1).numpy()
        recall[weighting] = [(predicted[test_labels == c] == c).mean() for c in (0, 1)]
    assert recall["none"][1] < 0.2
    assert min(recall["sqrt"]) > 0.9


def test_stacked_linear_layers_have_the_gradient_of_separate_ones():
    """The stacked layers' hand-written backward (weights (M, out, in)) against autograd's."""

    torch.manual_seed(2)
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, 1, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_BatchedLinear.apply, (x, weight, bias))
    expected = torch.stack([torch.nn.functional.linear(x[m], weight[m], bias[m, 0]) for m in range(3)])
    torch.testing.assert_close(_BatchedLinear.apply(x, weight, bias), expected)
