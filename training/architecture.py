"""Which heads ``fit`` trains when not told: one linear layer per view, or one small hidden layer.

The rule: both are trained alike (the same data, seed and budget) and measured on the validation split,
fused as the service fuses; the hidden layer is kept only where its fused validation accuracy is higher
than the linear heads'. A tie keeps the linear heads: fewer parameters, and the paper's authors' choice.
A hidden layer wins where a view's classes are not linearly separable (an XOR of two features, say).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fusion import Method
from training.evaluate import evaluate
from training.train import SampleSet, Trained

__all__ = ["CANDIDATES", "SMALL_HIDDEN", "Candidate", "HeadChoice", "choose_heads"]

SMALL_HIDDEN: tuple[int, ...] = (64,)
"""The hidden layer the linear heads compete with: one of 64 units, each view."""

CANDIDATES: tuple[tuple[int, ...], ...] = ((), SMALL_HIDDEN)
"""``fit``'s default candidates, linear first: the first of the most accurate is kept."""


@dataclass(frozen=True)
class Candidate:
    """One candidate's heads measured on the validation split (and its conflictive copy)."""

    hidden: tuple[int, ...]
    accuracy: float
    auroc: float


@dataclass(frozen=True)
class HeadChoice:
    """The candidates as measured, and the one kept."""

    candidates: tuple[Candidate, ...]
    chosen: Candidate


def choose_heads(
    train: Callable[[tuple[int, ...]], Trained],
    candidates: Sequence[tuple[int, ...]],
    validation: SampleSet,
    conflictive: SampleSet,
    *,
    method: Method,
    lam: float,
) -> tuple[Trained, HeadChoice | None]:
    """Train each of ``candidates`` (hidden widths; ``()``: linear) with ``train`` and keep the first of
    those with the highest fused validation accuracy.

    Parameters
    ----------
    train : callable
        Trains heads of the given hidden widths.
    candidates : sequence of tuple of int
        In order of preference: ties go to the earlier.
    validation, conflictive : SampleSet
        The validation split and its conflictive copy (the conflict AUROC is reported, not used).
    method, lam
        The fusion the accuracy is measured with.

    Returns
    -------
    (Trained, HeadChoice or None)
        The kept heads, and what was measured (None for a single candidate, which is not measured).
    """
    if len(candidates) == 1:
        return train(tuple(candidates[0])), None
    trained, measured = [], []
    for hidden in candidates:
        trained.append(train(tuple(hidden)))
        evaluation = evaluate(trained[-1].heads, validation, conflictive, method=method, lam=lam)
        measured.append(Candidate(tuple(hidden), evaluation.acc_normal, evaluation.auc))
    best = max(range(len(measured)), key=lambda i: (measured[i].accuracy, -i))
    return trained[best], HeadChoice(tuple(measured), measured[best])
