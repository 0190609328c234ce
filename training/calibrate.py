"""Everything fitted on the validation split once the heads are trained, for the manifest.

Today that is the high-conflict flag: which score (fused uncertainty or largest pairwise conflict) and which
threshold flag conflictive samples best while flagging a set share of clean ones. :func:`calibrate` is the
one place such post-hoc fits happen (a confidence calibrator and conformal scores belong beside the flag);
:mod:`training.fit` calls it for exports and fits alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusion import Method, fuse, opinion_from_evidence
from manifest import ConflictFlag, FlagRates
from training.metrics import auroc

__all__ = ["Calibration", "FlagScores", "calibrate", "calibrate_flag", "flag_scores"]

FlagScores = dict[str, np.ndarray]
"""A set's candidate flag scores: ``{"uncertainty": (N,), "max_conflict": (N,)}``."""


def flag_scores(
    evidence: np.ndarray, *, method: Method, lam: float, present: np.ndarray | None = None
) -> FlagScores:
    """The flag's two candidate scores: fused uncertainty and the largest pairwise conflict, each (N,).

    ``evidence`` (N, V, K); ``present`` (N, V) marks the views each sample has (None: all).
    """
    fused = fuse(opinion_from_evidence(evidence), method, lam=lam, mask=present)
    return {"uncertainty": fused.uncertainty, "max_conflict": fused.conflict.max(axis=(-1, -2))}


def calibrate_flag(
    clean: FlagScores,
    conflictive: FlagScores,
    *,
    target_false_positive_rate: float,
) -> tuple[str, float, dict[str, float]]:
    """Choose the flag's score and threshold on validation data.

    Parameters
    ----------
    clean, conflictive : FlagScores
        Scores of clean validation samples and of their conflictive copies.

    Returns
    -------
    (score, threshold, validation AUROC per score)
        The score that separates better; the threshold flags ``target_false_positive_rate`` of the clean
        samples (``score >= threshold``).
    """
    separation = {
        name: auroc(
            np.concatenate([clean[name], conflictive[name]]),
            np.concatenate([np.zeros(len(clean[name]), bool), np.ones(len(conflictive[name]), bool)]),
        )
        for name in ("uncertainty", "max_conflict")
    }
    score = max(separation, key=separation.get)
    # With score >= threshold, this flags the target share of clean samples (more only where scores tie).
    threshold = float(np.quantile(clean[score], 1 - target_false_positive_rate, method="higher"))
    return score, threshold, separation


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` fitted on the validation split, and the validation scores it fitted them on."""

    score: str
    threshold: float
    target_false_positive_rate: float
    validation_auroc: dict[str, float]
    validation: tuple[FlagScores, FlagScores]  # clean, conflictive

    def flag_rates(self, clean: FlagScores, conflictive: FlagScores) -> FlagRates:
        """The shares of ``clean`` and ``conflictive`` samples the flag raises."""
        return FlagRates(
            clean=float(np.mean(clean[self.score] >= self.threshold)),
            conflictive=float(np.mean(conflictive[self.score] >= self.threshold)),
        )

    def conflict_flag(self, test: tuple[FlagScores, FlagScores]) -> ConflictFlag:
        """The manifest's flag, with its rates on the validation split and on the test split ``test``."""
        return ConflictFlag(
            score=self.score,
            threshold=self.threshold,
            target_false_positive_rate=self.target_false_positive_rate,
            validation_auroc=self.validation_auroc,
            validation=self.flag_rates(*self.validation),
            test=self.flag_rates(*test),
        )


def calibrate(
    clean_evidence: np.ndarray,
    conflictive_evidence: np.ndarray,
    *,
    method: Method,
    lam: float,
    target_false_positive_rate: float,
    clean_present: np.ndarray | None = None,
    conflictive_present: np.ndarray | None = None,
) -> Calibration:
    """Fit everything post-hoc on the validation split.

    Parameters
    ----------
    clean_evidence, conflictive_evidence : ndarray, shape (N, V, K) and (M, V, K)
        The heads' evidence on the clean validation samples and on their conflictive copies.
    method, lam
        The fusion the model serves with.
    clean_present, conflictive_present : bool arrays (N, V), (M, V), optional
        Which views each sample has (None: all).
    """
    clean = flag_scores(clean_evidence, method=method, lam=lam, present=clean_present)
    conflictive = flag_scores(conflictive_evidence, method=method, lam=lam, present=conflictive_present)
    score, threshold, separation = calibrate_flag(
        clean, conflictive, target_false_positive_rate=target_false_positive_rate
    )
    return Calibration(
        score=score,
        threshold=threshold,
        target_false_positive_rate=target_false_positive_rate,
        validation_auroc=separation,
        validation=(clean, conflictive),
    )
