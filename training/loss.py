"""The training loss of paper section 3.4: adapted cross-entropy with annealed KL, plus conflict consistency.

Equation numbers refer to Bezirganyan et al., AISTATS 2025: (15) adapted cross-entropy, (16) KL to the
uniform Dirichlet of the misleading evidence, (17) annealing, (18) consistency loss, (19) the total.
"""

from __future__ import annotations

import torch

from fusion import FusedOpinion, Method, evidence_from_opinion, fuse, opinion_from_evidence


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
    """``L_acc = L_ace + sigma_t L_KL`` per sample (Eq. 17)."""
    return adapted_cross_entropy(alpha, target) + annealing * kl_to_uniform(alpha, target)


def consistency_loss(conflict: torch.Tensor) -> torch.Tensor:
    """``L_con = 1/(V-1) sum_p sum_{q != p} DC(w^p, w^q)`` (Eq. 18) from a conflict matrix (..., V, V)."""
    v = conflict.shape[-1]
    return conflict.sum((-1, -2)) / max(v - 1, 1)


def annealing_coefficient(epoch: int, annealing_step: int) -> float:
    """``sigma_t = min(1, t / T)`` (Eq. 17), epochs counted from 1."""
    return min(1.0, epoch / annealing_step)


def total_loss(
    evidence: torch.Tensor,
    labels: torch.Tensor,
    *,
    method: Method,
    lam: float = 1.0,
    annealing: float,
    beta: float = 1.0,
    gamma: float,
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
    method : {"bcf", "cbf", "baf", "gbaf", "dbf"}
        The fusion whose opinion the fused term trains (:func:`fusion.fuse`).

    Returns
    -------
    loss : tensor, shape (..., N)
        Per sample; a batch's objective is its mean.
    fused : FusedOpinion
    """
    v, k = evidence.shape[-2:]
    target = torch.nn.functional.one_hot(labels, k).to(evidence.dtype)
    fused = fuse(opinion_from_evidence(evidence), method, lam=lam)
    fused_alpha = evidence_from_opinion(fused) + 1
    fused_term = evidential_loss(fused_alpha, target, annealing=annealing)
    view_terms = evidential_loss(evidence + 1, target[..., None, :], annealing=annealing).sum(-1)
    accuracy_terms = (fused_term + beta * view_terms) / (1 + beta * v)
    return accuracy_terms + gamma * consistency_loss(fused.conflict), fused
