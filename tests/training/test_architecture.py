"""The heads trained again where the fused model is outvoted by its best view on held-out evidence
(:func:`training.architecture.unless_outvoted`): the rule, on evidence made to order."""

from __future__ import annotations

import numpy as np

from training.architecture import OUTVOTED_BETA, unless_outvoted
from training.calibrate import FusedSplit
from training.metrics import Rate

LABELS = np.repeat(np.arange(2), 50)


def split(right: dict[str, int], confident: str = "strong") -> FusedSplit:
    """Two views' evidence on 100 samples: each view right on its first ``right[view]`` samples (and wrong
    on the rest), the ``confident`` view's evidence ten times the other's."""
    evidence = np.zeros((LABELS.size, 2, 2), np.float32)
    for v, view in enumerate(("strong", "weak")):
        said = LABELS.copy()
        said[right[view] :] = 1 - said[right[view] :]
        evidence[np.arange(LABELS.size), v, said] = 50.0 if view == confident else 5.0
    return FusedSplit.of_evidence(evidence, LABELS, method="dbf", lam=1.0)


def test_outvoted_heads_are_trained_again_and_kept_where_more_accurate():
    first, again = object(), object()
    splits = {
        id(first): split({"strong": 95, "weak": 60}, confident="weak"),
        id(again): split({"strong": 95, "weak": 60}),
    }
    asked = []

    def train(beta):
        asked.append(beta)
        return again

    kept, outvoted = unless_outvoted(first, train, lambda t: splits[id(t)], ["strong", "weak"])
    assert kept is again and asked == [OUTVOTED_BETA]
    assert (outvoted.best_view, outvoted.best_view_accuracy, outvoted.kept) == ("strong", Rate(95, 100), True)
    assert outvoted.fused.value < 0.94 and outvoted.again == Rate(95, 100)


def test_heads_not_outvoted_are_not_trained_again():
    first = object()

    def train(beta):
        raise AssertionError("trained again")

    kept, outvoted = unless_outvoted(
        first, train, lambda t: split({"strong": 95, "weak": 60}), ["strong", "weak"]
    )
    assert kept is first and outvoted is None


def test_heads_trained_again_are_kept_only_where_more_accurate():
    first, again = object(), object()
    outvoted_split = split({"strong": 95, "weak": 60}, confident="weak")
    kept, outvoted = unless_outvoted(
        first, lambda beta: again, lambda t: outvoted_split, ["strong", "weak"], beta=0.3
    )
    assert kept is first and not outvoted.kept and outvoted.beta == 0.3 and outvoted.again == outvoted.fused


def test_any_shortfall_below_the_best_view_trains_again():
    """One sample in 100 below the best view (within the warning's margin) is enough to try again."""
    first, again = object(), object()
    splits = {
        id(first): split({"strong": 95, "weak": 94}, confident="weak"),
        id(again): split({"strong": 95, "weak": 94}),
    }
    kept, outvoted = unless_outvoted(first, lambda beta: again, lambda t: splits[id(t)], ["strong", "weak"])
    assert (outvoted.fused, outvoted.best_view_accuracy, outvoted.again) == (
        Rate(94, 100),
        Rate(95, 100),
        Rate(95, 100),
    )
    assert kept is again and outvoted.kept
