"""Literal transcriptions of the paper's formulas, loops and all: the oracle and the yardstick.

Written the way the paper writes them (Algorithm 1 over every view pair, Eq. 6 with its explicit products),
batched over samples with numpy and nothing clever. The operators in :mod:`fusion` are tested against these
and benchmarked against :func:`dbf_from_evidence` (``benchmarks/fusion.py``). Not for production: the raw
products are undefined for more than one dogmatic view and underflow for many confident ones.

Shapes: belief ``(B, V, K)``, uncertainty ``(B, V)``, evidence ``(B, V, K)``.
"""

from __future__ import annotations

import numpy as np


def opinion_from_evidence(evidence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2: ``b = e / S``, ``u = K / S``, ``S = sum_k (e_k + 1)``."""
    k = evidence.shape[-1]
    strength = np.sum(evidence + 1, axis=-1)
    return evidence / strength[..., None], k / strength


def conflict_matrix(belief: np.ndarray, uncertainty: np.ndarray) -> np.ndarray:
    """Algorithm 1, lines 2-7: ``C_ij = PD(i, j) x CC(i, j)`` for every ordered pair."""
    n, v, k = belief.shape
    p = belief + uncertainty[..., None] / k
    conflict = np.zeros((n, v, v), dtype=belief.dtype)
    for i in range(v):
        for j in range(v):
            pd = np.sum(np.abs(p[:, i, :] - p[:, j, :]), axis=-1) / 2
            cc = (1 - uncertainty[:, i]) * (1 - uncertainty[:, j])
            conflict[:, i, j] = pd * cc
    return conflict


def gbaf(belief: np.ndarray, uncertainty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 6 with its products: ``b = sum_v b^v prod_{i!=v} u^i / sum_v prod_{i!=v} u^i``, likewise ``u``."""
    n, v, k = belief.shape
    numerator = np.zeros((n, k), dtype=belief.dtype)
    denominator = np.zeros(n, dtype=belief.dtype)
    for j in range(v):
        others = np.ones(n, dtype=belief.dtype)
        for i in range(v):
            if i != j:
                others = others * uncertainty[:, i]
        numerator = numerator + belief[:, j, :] * others[:, None]
        denominator = denominator + others
    product = np.ones(n, dtype=belief.dtype)
    for j in range(v):
        product = product * uncertainty[:, j]
    return numerator / denominator[:, None], v * product / denominator


def cbf(belief: np.ndarray, uncertainty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Josang's cumulative fusion for V sources, with its products (no dogmatic views)."""
    n, v, k = belief.shape
    numerator = np.zeros((n, k), dtype=belief.dtype)
    others_sum = np.zeros(n, dtype=belief.dtype)
    for j in range(v):
        others = np.ones(n, dtype=belief.dtype)
        for i in range(v):
            if i != j:
                others = others * uncertainty[:, i]
        numerator = numerator + belief[:, j, :] * others[:, None]
        others_sum = others_sum + others
    product = np.prod(uncertainty, axis=-1)
    denominator = others_sum - (v - 1) * product
    return numerator / denominator[:, None], product / denominator


def bcf(belief: np.ndarray, uncertainty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dempster's rule as TMC writes it, folded left: ``C = sum_{i!=j} b1_i b2_j``, divide by ``1 - C``."""
    b, u = belief[:, 0, :], uncertainty[:, 0]
    k = belief.shape[-1]
    for v in range(1, belief.shape[1]):
        b2, u2 = belief[:, v, :], uncertainty[:, v]
        c = np.zeros_like(u)
        for i in range(k):
            for j in range(k):
                if i != j:
                    c = c + b[:, i] * b2[:, j]
        b, u = (b * b2 + b * u2[:, None] + b2 * u[:, None]) / (1 - c)[:, None], u * u2 / (1 - c)
    return b, u


def baf(belief: np.ndarray, uncertainty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 3 folded left: ``b = (b1 u2 + b2 u1) / (u1 + u2)``, ``u = 2 u1 u2 / (u1 + u2)``."""
    b, u = belief[:, 0, :], uncertainty[:, 0]
    for v in range(1, belief.shape[1]):
        b2, u2 = belief[:, v, :], uncertainty[:, v]
        b, u = (b * u2[:, None] + b2 * u[:, None]) / (u + u2)[:, None], 2 * u * u2 / (u + u2)
    return b, u


def dbf(
    belief: np.ndarray, uncertainty: np.ndarray, lam: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 1. Returns ``(belief (B, K), uncertainty (B,), conflict (B, V, V), eta (B, V))``."""
    n, v, _ = belief.shape
    conflict = conflict_matrix(belief, uncertainty)
    agreement = np.zeros_like(conflict)
    for i in range(v):
        for j in range(v):
            agreement[:, i, j] = (1 - conflict[:, i, j] ** lam) ** (1 / lam)
    eta = np.ones((n, v), dtype=belief.dtype)
    discounted_b = np.empty_like(belief)
    discounted_u = np.empty_like(uncertainty)
    for j in range(v):
        for i in range(v):
            eta[:, j] = eta[:, j] * agreement[:, j, i]
        discounted_b[:, j, :] = eta[:, j, None] * belief[:, j, :]
        discounted_u[:, j] = 1 - eta[:, j] + eta[:, j] * uncertainty[:, j]
    fused_b, fused_u = gbaf(discounted_b, discounted_u)
    return fused_b, fused_u, conflict, eta


def dbf_from_evidence(evidence: np.ndarray, lam: float = 1.0) -> tuple[np.ndarray, ...]:
    """Evidence ``(B, V, K)`` to DBF's fused opinion, conflict and discounts: the benchmark's yardstick."""
    return dbf(*opinion_from_evidence(evidence), lam=lam)
