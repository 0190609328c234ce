"""What DBF is for, measured: accuracy on clean and conflictive samples, and whether fused uncertainty
separates them (the paper's AUROC), plus the calibration measures users of uncertainty libraries expect."""

from __future__ import annotations

from dataclasses import dataclass, field

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
from training.train import SampleSet, predict_evidence

__all__ = ["Evaluation", "evaluate", "measure"]


@dataclass(frozen=True)
class Evaluation:
    """One trained model on a clean test set and its conflictive copy, fused as the service fuses.

    Attributes
    ----------
    acc_normal, acc_conflict : float
        Accuracy on the clean and on the conflictive samples.
    auc : float
        AUROC of "is conflictive" scored by fused uncertainty.
    ece, brier, nll : float
        Calibration of the clean projected probabilities.
    uncertainty_normal, uncertainty_conflict : float
        Mean fused uncertainty.
    view_uncertainty : list of float
        Mean per-view uncertainty on the clean samples that have the view.
    u_normal, u_conflict : ndarray
        The fused uncertainties themselves, (N,) and (M,), for plots.
    """

    acc_normal: float
    acc_conflict: float
    auc: float
    ece: float
    brier: float
    nll: float
    uncertainty_normal: float
    uncertainty_conflict: float
    view_uncertainty: list[float]
    u_normal: np.ndarray = field(repr=False)
    u_conflict: np.ndarray = field(repr=False)

    def metrics(self) -> dict[str, float | list[float]]:
        """The measures without the raw uncertainties, in the order ``results.json`` lists them."""
        return {
            "acc_normal": self.acc_normal,
            "acc_conflict": self.acc_conflict,
            "auc": self.auc,
            "ece": self.ece,
            "brier": self.brier,
            "nll": self.nll,
            "uncertainty_normal": self.uncertainty_normal,
            "uncertainty_conflict": self.uncertainty_conflict,
            "view_uncertainty": self.view_uncertainty,
        }


def evaluate(
    model: EvidentialHeads, clean: SampleSet, conflictive: SampleSet, *, method: Method, lam: float = 1.0
) -> Evaluation:
    """:func:`measure` of ``model``'s evidence on the samples ``clean`` and ``conflictive``
    (:class:`training.protocol.Samples`)."""
    return measure(
        predict_evidence(model, clean),
        clean.labels,
        predict_evidence(model, conflictive),
        conflictive.labels,
        method=method,
        lam=lam,
        clean_present=clean.present,
        conflictive_present=conflictive.present,
    )


def measure(
    clean_evidence: np.ndarray,
    clean_labels: np.ndarray,
    conflictive_evidence: np.ndarray,
    conflictive_labels: np.ndarray,
    *,
    method: Method,
    lam: float = 1.0,
    clean_present: np.ndarray | None = None,
    conflictive_present: np.ndarray | None = None,
) -> Evaluation:
    """The paper's measures from the heads' evidence, fused with ``method`` exactly as the service fuses.

    Parameters
    ----------
    clean_evidence, conflictive_evidence : ndarray, shape (N, V, K) and (M, V, K)
    clean_labels, conflictive_labels : int arrays (N,), (M,)
    clean_present, conflictive_present : bool arrays (N, V), (M, V), optional
        Which views each sample has (None: all); missing ones are fused as absent.
    """
    views = opinion_from_evidence(clean_evidence)
    normal = fuse(views, method, lam=lam, mask=clean_present)
    conflict = fuse(opinion_from_evidence(conflictive_evidence), method, lam=lam, mask=conflictive_present)
    scores = np.concatenate([normal.uncertainty, conflict.uncertainty])
    positive = np.concatenate([np.zeros(len(clean_labels), bool), np.ones(len(conflictive_labels), bool)])
    if clean_present is None:
        view_uncertainty = views.uncertainty.mean(0)
    else:
        view_uncertainty = (views.uncertainty * clean_present).sum(0) / np.maximum(clean_present.sum(0), 1)
    return Evaluation(
        acc_normal=accuracy(normal.probability, clean_labels),
        acc_conflict=accuracy(conflict.probability, conflictive_labels),
        auc=auroc(scores, positive),
        ece=expected_calibration_error(normal.probability, clean_labels),
        brier=brier_score(normal.probability, clean_labels),
        nll=negative_log_likelihood(normal.probability, clean_labels),
        uncertainty_normal=float(normal.uncertainty.mean()),
        uncertainty_conflict=float(conflict.uncertainty.mean()),
        view_uncertainty=[float(u) for u in view_uncertainty],
        u_normal=normal.uncertainty,
        u_conflict=conflict.uncertainty,
    )
