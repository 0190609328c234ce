"""What DBF is for, measured: accuracy on clean and conflictive samples, and whether fused uncertainty
separates them (the paper's AUROC), plus the calibration measures users of uncertainty libraries expect."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusion import Method, fuse, opinion_from_evidence
from training.heads import EvidentialHeads
from training.metrics import (
    accuracy,
    auroc,
    brier_score,
    expected_calibration_error,
    negative_log_likelihood,
)
from training.train import predict_evidence


def evaluate(
    model: EvidentialHeads,
    clean: Sequence[np.ndarray],
    clean_labels: np.ndarray,
    conflictive: Sequence[np.ndarray],
    conflictive_labels: np.ndarray,
    *,
    method: Method,
    lam: float = 1.0,
) -> dict[str, object]:
    """Metrics of one trained model, fused with ``method`` exactly as the service fuses (numpy).

    Parameters
    ----------
    model : EvidentialHeads
    clean, conflictive : sequences of arrays, each (N, d_v) and (M, d_v)
        Scaled features per view of the clean and the conflictive test sets.
    clean_labels, conflictive_labels : int arrays (N,), (M,)

    Returns
    -------
    dict
        ``acc_normal``, ``acc_conflict`` (fractions), ``auc`` (AUROC of "is conflictive" scored by fused
        uncertainty), ``ece``, ``brier``, ``nll`` (of the clean projected probabilities),
        ``uncertainty_normal`` / ``uncertainty_conflict`` (mean fused uncertainty), ``view_uncertainty``
        (mean per-view uncertainty on clean samples) and the raw fused uncertainties under ``"_u_normal"`` /
        ``"_u_conflict"`` for plots.
    """
    clean_evidence = predict_evidence(model, clean)
    conflict_evidence = predict_evidence(model, conflictive)
    views = opinion_from_evidence(clean_evidence)
    normal = fuse(views, method, lam=lam)
    conflict = fuse(opinion_from_evidence(conflict_evidence), method, lam=lam)
    scores = np.concatenate([normal.uncertainty, conflict.uncertainty])
    positive = np.concatenate([np.zeros(len(clean_labels), bool), np.ones(len(conflictive_labels), bool)])
    probability = np.clip(normal.probability, 0.0, 1.0)  # float32 rounding can leave 1 + 6e-8
    return {
        "acc_normal": accuracy(normal.probability, clean_labels),
        "acc_conflict": accuracy(conflict.probability, conflictive_labels),
        "auc": auroc(scores, positive),
        "ece": expected_calibration_error(probability, clean_labels),
        "brier": brier_score(probability, clean_labels),
        "nll": negative_log_likelihood(probability, clean_labels),
        "uncertainty_normal": float(normal.uncertainty.mean()),
        "uncertainty_conflict": float(conflict.uncertainty.mean()),
        "view_uncertainty": [float(u) for u in views.uncertainty.mean(0)],
        "_u_normal": normal.uncertainty,
        "_u_conflict": conflict.uncertainty,
    }
