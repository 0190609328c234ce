"""The training loss of paper section 3.4: adapted cross-entropy with annealed KL, plus conflict consistency.

Equation numbers refer to Bezirganyan et al., AISTATS 2025: (15) adapted cross-entropy, (16) KL to the
uniform Dirichlet of the misleading evidence, (17) annealing, (18) consistency loss, (19) the total.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from fusion import FusedOpinion, Method, Opinion, evidence_from_opinion, fuse, opinion_from_evidence


def adapted_cross_entropy(alpha: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``sum_j y_j (psi(S) - psi(alpha_j))`` (Eq. 15). alpha (..., K), one-hot target (..., K) -> (...).

    For a one-hot target this is ``psi(S) - psi(alpha_y)``: one digamma per sample instead of K (digamma
    was a quarter of a training step).
    """
    return torch.digamma(alpha.sum(-1)) - torch.digamma((target * alpha).sum(-1))


def kl_to_uniform(alpha: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``KL[Dir(alpha~) || Dir(1)]``, ``alpha~ = y + (1 - y) alpha``: misleading evidence only (Eq. 16)."""
    alpha = target + (1 - target) * alpha
    k = alpha.shape[-1]
    strength = alpha.sum(-1)
    log_normaliser = torch.lgamma(strength) - torch.lgamma(alpha).sum(-1) - torch.lgamma(alpha.new_tensor(k))
    digamma_terms = ((alpha - 1) * (torch.digamma(alpha) - torch.digamma(strength)[..., None])).sum(-1)
    return log_normaliser + digamma_terms


def evidential_loss(alpha: torch.Tensor, target: torch.Tensor, *, annealing: float) -> torch.Tensor:
    """``L_acc = L_ace + sigma_t L_KL`` per sample (Eq. 17): alpha (..., K) >= 1, one-hot target (..., K).

    Equals ``adapted_cross_entropy(alpha, target) + annealing * kl_to_uniform(alpha, target)``, value and
    gradient, but with the gradient in closed form (:class:`_EvidentialLoss`): autograd through those two
    evaluates four special functions over every (sample, view, class) element, this one three, two of them
    vectorised, so the loss's forward and backward pass take less time (docs/benchmarks.md).
    """
    return _EvidentialLoss.apply(alpha, target, float(annealing))


class _EvidentialLoss(torch.autograd.Function):
    """Eq. 17 with its gradient in closed form. With ``S = sum alpha``, ``alpha~ = y + (1 - y) alpha`` and
    ``S~ = sum alpha~`` (Eq. 15, 16):

    ``d L_ace / d alpha_j = psi'(S) - y_j psi'(alpha_y)``;
    ``d L_KL / d alpha_j = (1 - y_j) ((alpha~_j - 1) psi'(alpha~_j) - (S~ - K) psi'(S~))``.
    """

    @staticmethod
    def forward(ctx, alpha: torch.Tensor, target: torch.Tensor, annealing: float) -> torch.Tensor:
        k = alpha.shape[-1]
        strength = alpha.sum(-1)
        alpha_y = (target * alpha).sum(-1)
        psi_ace, dpsi_ace = digamma_trigamma(torch.stack((strength, alpha_y)))
        tilde = target + (1 - target) * alpha
        misleading = tilde - 1  # the evidence on wrong classes: (1 - y) (alpha - 1)
        tilde_strength = tilde.sum(-1)
        psi, dpsi = digamma_trigamma(tilde)
        psi_s, dpsi_s = digamma_trigamma(tilde_strength)
        kl = (
            torch.lgamma(tilde_strength)
            - torch.lgamma(tilde).sum(-1)
            - math.lgamma(k)
            + (misleading * (psi - psi_s[..., None])).sum(-1)
        )
        ctx.annealing = annealing
        ctx.save_for_backward(target, misleading, dpsi, tilde_strength, dpsi_s, dpsi_ace)
        return psi_ace[0] - psi_ace[1] + annealing * kl

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        target, misleading, dpsi, tilde_strength, dpsi_s, dpsi_ace = ctx.saved_tensors
        k = misleading.shape[-1]
        ace = dpsi_ace[0][..., None] - target * dpsi_ace[1][..., None]
        kl = (1 - target) * (misleading * dpsi - ((tilde_strength - k) * dpsi_s)[..., None])
        return grad[..., None] * (ace + ctx.annealing * kl), None, None


# Recurrence steps before the asymptotic series: from x + 6 >= 7 on, the series below is accurate to ~1e-9.
_SHIFT = 6
# Tensors with fewer elements get torch's own kernels: the series' thirty-odd operations each cost torch's
# per-call overhead, which outweighs its per-element saving on small data's batches (docs/benchmarks.md).
SERIES_FROM = 10_000


def digamma_trigamma(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``psi(x)`` and ``psi'(x)`` for ``x >= 1``: torch's ``digamma`` and ``polygamma(1, .)`` for a tensor of
    fewer than :data:`SERIES_FROM` elements, else :func:`asymptotic_digamma_trigamma`."""
    if x.numel() < SERIES_FROM:
        return torch.digamma(x), torch.polygamma(1, x)
    return asymptotic_digamma_trigamma(x)


def asymptotic_digamma_trigamma(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``psi(x)`` and ``psi'(x)`` for ``x >= 1``, from elementwise arithmetic and one log.

    ``psi(x) = psi(x + n) - sum_{i<n} 1/(x + i)`` and ``psi'(x) = psi'(x + n) + sum_{i<n} 1/(x + i)^2``, then
    the asymptotic (Bernoulli) series at ``z = x + n``. torch's CPU kernels evaluate these functions one
    element at a time (digamma ~28 ns per float32 element, this ~5 ns); the results agree to float32
    rounding (tested against them from 1 to 1e13).
    """
    shifted = x.clone()
    inverse = torch.reciprocal(shifted)
    sum_inverse = inverse.clone()
    sum_square = inverse * inverse
    for _ in range(_SHIFT - 1):
        shifted += 1
        torch.reciprocal(shifted, out=inverse)
        sum_inverse += inverse
        sum_square.addcmul_(inverse, inverse)
    shifted += 1
    r = torch.reciprocal(shifted)
    w = r * r
    digamma = torch.log(shifted) - 0.5 * r - w * (1 / 12 - w * (1 / 120 - w / 252)) - sum_inverse
    trigamma = r + 0.5 * w + r * w * (1 / 6 - w * (1 / 30 - w * (1 / 42 - w / 30))) + sum_square
    return digamma, trigamma


def consistency_loss(conflict: torch.Tensor, *, views_present: torch.Tensor | None = None) -> torch.Tensor:
    """``L_con = 1/(V-1) sum_p sum_{q != p} DC(w^p, w^q)`` (Eq. 18) from a conflict matrix (..., V, V).

    ``views_present`` (...) counts each sample's views where some are missing (their rows and columns of
    the conflict matrix are 0): V is then that count.
    """
    if views_present is None:
        v = conflict.shape[-1]
        return conflict.sum((-1, -2)) / max(v - 1, 1)
    return conflict.sum((-1, -2)) / (views_present - 1).clamp(min=1)


def annealing_coefficient(epoch: int, annealing_step: int) -> float:
    """``sigma_t = min(1, t / T)`` (Eq. 17), epochs counted from 1."""
    return min(1.0, epoch / annealing_step)


def total_loss(
    evidence: torch.Tensor,
    labels: torch.Tensor,
    *,
    method: Method | Sequence[Method],
    lam: float = 1.0,
    annealing: float,
    beta: float = 1.0,
    gamma: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, FusedOpinion]:
    """The training objective per sample (Eq. 19), and the fused opinion it was computed from.

    ``(L_acc(fused) + beta sum_v L_acc(view v)) / (1 + beta V) + gamma L_con``, averaged over the batch.
    Dividing the accuracy terms by ``1 + beta V`` is what the authors' code does (with ``beta = 1``); it is
    Eq. 19 with ``gamma`` rescaled by ``1 + beta V``, and keeps ``gamma`` comparable across view counts.

    Parameters
    ----------
    evidence : tensor, shape (..., N, V, K)
        The heads' evidence (leading axes: e.g. several models trained at once).
    labels : int tensor, shape (..., N)
    method : {"bcf", "cbf", "baf", "gbaf", "dbf"}, or a sequence of them
        The fusion whose opinion the fused term trains (:func:`fusion.fuse`). A sequence gives one method
        per model along the first axis of ``evidence`` (M, N, V, K): models fused differently, trained at
        once. Each run of equal neighbours is fused in one call, so keep a method's models together.

    mask : bool tensor, shape (..., N, V), optional
        Which views each sample has (None: all). A missing view is fused as absent (``fusion.fuse``'s
        mask), adds no term of its own, and V counts the present views only.

    Returns
    -------
    loss : tensor, shape (..., N)
        Per sample; a batch's objective is its mean.
    fused : FusedOpinion

    Examples
    --------
    >>> evidence = torch.rand(4, 8, 3, 5) * 10  # 4 models, 8 samples, 3 views, 5 classes
    >>> labels = torch.randint(0, 5, (4, 8))
    >>> methods = ["dbf", "dbf", "gbaf", "gbaf"]
    >>> loss, fused = total_loss(evidence, labels, method=methods, annealing=1, gamma=0.5)
    >>> tuple(loss.shape), tuple(fused.conflict.shape)
    ((4, 8), (4, 8, 3, 3))
    """
    v, k = evidence.shape[-2:]
    target = torch.nn.functional.one_hot(labels, k).to(evidence.dtype)
    fused = _fuse_per_model(opinion_from_evidence(evidence), method, lam=lam, mask=mask)
    fused_alpha = evidence_from_opinion(fused) + 1
    fused_term = evidential_loss(fused_alpha, target, annealing=annealing)
    view_terms = evidential_loss(evidence + 1, target[..., None, :], annealing=annealing)
    if mask is None:
        accuracy_terms = (fused_term + beta * view_terms.sum(-1)) / (1 + beta * v)
        return accuracy_terms + gamma * consistency_loss(fused.conflict), fused
    present = mask.sum(-1).to(evidence.dtype)
    view_terms = torch.where(mask, view_terms, torch.zeros_like(view_terms)).sum(-1)
    accuracy_terms = (fused_term + beta * view_terms) / (1 + beta * present)
    return accuracy_terms + gamma * consistency_loss(fused.conflict, views_present=present), fused


def _fuse_per_model(
    opinion: Opinion, method: Method | Sequence[Method], *, lam: float, mask: torch.Tensor | None
) -> FusedOpinion:
    if isinstance(method, str):
        return fuse(opinion, method, lam=lam, mask=mask)
    if len(method) != opinion.belief.shape[0]:
        raise ValueError(f"{len(method)} methods for {opinion.belief.shape[0]} models")
    parts = []
    start = 0
    for name, run in itertools.groupby(method):
        stop = start + len(list(run))
        part = Opinion(belief=opinion.belief[start:stop], uncertainty=opinion.uncertainty[start:stop])
        parts.append(fuse(part, name, lam=lam, mask=None if mask is None else mask[start:stop]))
        start = stop
    if len(parts) == 1:
        return parts[0]
    return FusedOpinion(
        **{field: torch.cat([getattr(part, field) for part in parts]) for field in _FUSED_FIELDS}
    )


_FUSED_FIELDS = ("belief", "uncertainty", "conflict", "discount")
