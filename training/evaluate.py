"""What DBF is for, measured: accuracy on clean and conflictive samples, and whether fused uncertainty
separates them (the paper's AUROC), plus the calibration measures users of uncertainty libraries expect."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusion import Method
from training.calibrate import FusedSplit
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
    (:class:`training.protocol.Samples`), fused with ``method``."""
    split = FusedSplit.of_evidence(
        predict_evidence(model, clean),
        clean.labels,
        method=method,
        lam=lam,
        present=clean.present,
        conflictive=(predict_evidence(model, conflictive), conflictive.labels, conflictive.present),
    )
    return measure(split)


def measure(split: FusedSplit) -> Evaluation:
    """The paper's measures of a split fused as the service fuses (:meth:`FusedSplit.of_evidence`: with its
    conflictive copies and the views' own opinions; missing views fused as absent)."""
    normal, conflict, labels = split.clean, split.conflictive, split.labels
    conflictive_labels = labels if split.conflictive_labels is None else split.conflictive_labels
    scores = np.concatenate([normal.uncertainty, conflict.uncertainty])
    positive = np.concatenate([np.zeros(len(labels), bool), np.ones(len(conflictive_labels), bool)])
    probability = np.clip(normal.probability, 0.0, 1.0)  # float32 rounding can leave 1 + 6e-8
    views, present = split.views.uncertainty, split.present
    if present is None:
        view_uncertainty = views.mean(0)
    else:
        view_uncertainty = (views * present).sum(0) / np.maximum(present.sum(0), 1)
    return Evaluation(
        acc_normal=accuracy(normal.probability, labels),
        acc_conflict=accuracy(conflict.probability, conflictive_labels),
        auc=auroc(scores, positive),
        ece=expected_calibration_error(probability, labels),
        brier=brier_score(probability, labels),
        nll=negative_log_likelihood(probability, labels),
        uncertainty_normal=float(normal.uncertainty.mean()),
        uncertainty_conflict=float(conflict.uncertainty.mean()),
        view_uncertainty=[float(u) for u in view_uncertainty],
        u_normal=normal.uncertainty,
        u_conflict=conflict.uncertainty,
    )
