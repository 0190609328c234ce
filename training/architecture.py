"""Which heads ``fit`` trains when not told: one linear layer per view, or one small hidden layer.

The rule: both are trained alike (the same data, seed and budget) and measured on the validation split,
fused as the service fuses; the hidden layer is kept only where its fused validation accuracy is higher
than the linear heads'. A tie keeps the linear heads: fewer parameters, and the paper's authors' choice.
A hidden layer wins where a view's classes are not linearly separable (an XOR of two features, say).

Then, where the fused model is outvoted (its accuracy below its best view's head alone, on evidence of samples
the heads did not train on), the kept heads are trained again with each view's own term weighted
:data:`OUTVOTED_BETA` beside the fused one, and those kept only where their fused accuracy there is higher
(:func:`unless_outvoted`). ``fit`` measures on the evidence its calibrations are fitted on: out of fold on
every non-test sample where the validation split is small (:mod:`training.crossfit`), else the validation
split. Not on the training samples: there a weak view's head is right more often than on new data, so its
confident mistakes hide (the first version of this rule measured there, and did not fire on breast cancer,
whose fused model stayed 2.3 points below its best view on the test split). Any shortfall counts, not only one
past the warning's :data:`~training.baseline.BEST_VIEW_MARGIN`: training again costs time, never accuracy on
the samples measured (the second heads are kept only if better there). With the paper's weight, 1, each head
is trained to be accurate alone, which conflict detection needs (a view's belief must be confident to
conflict); but a weak view's head then grows confident in its mistakes and outvotes better views in the
fusion. With the fused term first, the weak view leaves the decision to the others, and conflicts grow rarer:
on HandWritten (not outvoted) weight 0.1 detects them far less well at the same accuracy
(``docs/data/defaults.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fusion import Method
from training.baseline import accuracies
from training.calibrate import FusedSplit
from training.evaluate import evaluate
from training.metrics import Rate
from training.train import SampleSet, Trained

__all__ = [
    "CANDIDATES",
    "OUTVOTED_BETA",
    "SMALL_HIDDEN",
    "Candidate",
    "HeadChoice",
    "Outvoted",
    "choose_heads",
    "unless_outvoted",
]

T = TypeVar("T")

SMALL_HIDDEN: tuple[int, ...] = (64,)
"""The hidden layer the linear heads compete with: one of 64 units, each view."""

CANDIDATES: tuple[tuple[int, ...], ...] = ((), SMALL_HIDDEN)
"""``fit``'s default candidates, linear first: the first of the most accurate is kept."""


OUTVOTED_BETA = 0.1
"""The weight of each view's own term (Eq. 19's beta) the heads are trained again with where the fused model
is outvoted by its best view."""


@dataclass(frozen=True)
class Candidate:
    """One candidate's heads measured on the validation split (and its conflictive copy)."""

    hidden: tuple[int, ...]
    accuracy: Rate  # fused, on the validation split
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
        right = Rate(round(evaluation.acc_normal * len(validation)), len(validation))
        measured.append(Candidate(tuple(hidden), right, evaluation.auc))
    best = max(range(len(measured)), key=lambda i: (measured[i].accuracy.value, -i))
    return trained[best], HeadChoice(tuple(measured), measured[best])


@dataclass(frozen=True)
class Outvoted:
    """The fused model outvoted by its best view, and what training again with ``beta`` gave (accuracies on
    the samples measured on)."""

    fused: Rate  # of the heads first trained
    best_view: str
    best_view_accuracy: Rate  # its head alone, on the samples that have its view
    beta: float
    again: Rate  # fused, of the heads trained again
    kept: bool  # whether those replaced the first (more accurate)


def unless_outvoted(
    trained: T,
    train: Callable[[float], T],
    fused: Callable[[T], FusedSplit],
    view_names: Sequence[str],
    *,
    beta: float = OUTVOTED_BETA,
) -> tuple[T, Outvoted | None]:
    """``trained``, or where its fused model is outvoted by its best view on the samples ``fused`` gives, the
    heads ``train(beta)`` trains if their fused accuracy there is higher.

    Parameters
    ----------
    trained
        The heads chosen (``fit``: with their held-out evidence).
    train : callable
        Trains the same heads with each view's own term weighted by its argument.
    fused : callable
        Heads -> the samples measured on (``fit``: held out, see the module notes), fused as the service
        fuses (with each view's opinion).
    view_names : sequence of str
    beta : float

    Returns
    -------
    (heads, Outvoted or None)
        The heads kept, and what was measured where the first were outvoted.
    """
    # On the samples some view is fused for: one fused from none is answered alike whatever the heads.
    first, views = accuracies(fused(trained), view_names, from_views=True)
    best = max(views, key=lambda view: views[view].value)
    if first.value >= views[best].value:
        return trained, None
    again = train(beta)
    second, _ = accuracies(fused(again), view_names, from_views=True)
    kept = second.value > first.value
    outvoted = Outvoted(first, best, views[best], beta, second, kept)
    return (again if kept else trained), outvoted
