"""Cross-fitting: evidence on every non-test sample from models that did not train on it, for the
calibrations a small validation split cannot support.

The flag's threshold, the confidence calibrator and the conformal scores are fitted on clean samples the
model did not train on. On small data the validation split has few (wine's: 18; a 5% flag rate is then
about one sample). Below :data:`CROSS_FIT_BELOW` clean validation samples they are fitted on every non-test
sample instead (training and validation splits, 80% of the data): :data:`FOLDS` models are trained like the
served one, same settings and as many epochs as it kept (its best epoch; no early stopping), each on the
non-test samples outside one fold (stratified by class), in one stacked run; each model's evidence on its
own fold, and on conflictive copies of that fold's samples (donors from the same fold, as the test split's
come from the test split), is fused as the served model fuses. The served model stays the one trained on
the training split. At or above :data:`CROSS_FIT_BELOW`, the validation split alone is enough: split
calibration there keeps split conformal's exact guarantee and costs nothing more.

Guarantees of the prediction sets (``calibration.fitted_on`` in the manifest): on the validation split,
split conformal's: a set holds the true class with probability at least the coverage asked for, c.
Cross-fitted, the threshold is a quantile of out-of-fold scores, as in cross-conformal prediction and CV+
(Vovk 2015; Barber, Candes, Ramdas & Tibshirani 2021, "Predictive inference with the jackknife+"): for the
fold models' own sets theory guarantees at least ``1 - 2 (1 - c)``, and in practice they cover close to c;
the served model, trained like them on a little more data, is held to the same threshold. Measured over
200 synthetic data sets of 300 samples, with stand-in heads in place of trained ones
(``tests/training/test_crossfit.py``): coverage 0.899 on average at
0.9, at least 0.82, with a spread (standard deviation 0.020) less than half that of split conformal on the
28 validation samples (0.048); the flag's clean rate 5.5% at 5% (standard deviation 1.6% against 5.2%).
On breast cancer, diabetes, digits, two synthetic sets (fit's defaults) and PIE, CUB and HandWritten
(exported), 5 seeds each: the flag's clean test rate 3.5% to 5.9% on average, coverage at 0.9 0.89 to 0.92,
and the confidence's test ECE lower than fitted on the validation split alone on every one. The card
measures each model on its test split, with the range a correct method lands in.

Examples
--------
>>> from training.data import synthetic
>>> from training.protocol import evaluation_sets
>>> data = synthetic(150, num_classes=3, seed=0)
>>> sets = evaluation_sets(data, seed=0, conflictive=("validation", "test"))
>>> plan = plan_cross_fitting(sets, num_classes=3, seed=0)
>>> len(plan.training), [len(rows) for rows in plan.training], sum(len(fold) for fold in plan.held_out)
(5, [96, 96, 96, 96, 96], 120)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from calibration import cross_validation_folds
from fusion import Method
from training.calibrate import FusedSplit
from training.progress import Progress
from training.protocol import EvaluationSets, Samples, conflictive_copy
from training.train import TrainConfig, predict_evidence, train_members

__all__ = [
    "CROSS_FIT_BELOW",
    "FOLDS",
    "CrossFitted",
    "CrossFitting",
    "fused_out_of_fold",
    "out_of_fold",
    "plan_cross_fitting",
]

CROSS_FIT_BELOW = 300
"""Clean validation samples below which the calibrations are cross-fitted. From 300 up, a threshold for a 5%
flag rests on 15 expected flags and flags 2.8% to 7.7% of new clean samples 19 times in 20 (the Beta law of
a quantile's rate). Cross-fitting costs more than the served model's training (5 models stacked), yet at
this threshold a fit stays shorter than one of a larger data set that needs none (docs/benchmarks.md)."""

FOLDS = 5
"""Fold models: each trains on 4/5 of the non-test samples (64% of the data; the served model on 70%)."""


@dataclass(frozen=True, eq=False)
class CrossFitting:
    """Which samples each fold model trains on, its held-out fold, and the fold's conflictive copies.

    The training rows have the same count for every model (the members of one stacked run need it): a
    model whose fold is one sample smaller leaves one more out, drawn by the seed.
    """

    training: list[np.ndarray]
    held_out: list[Samples]
    conflictive: list[Samples]

    @property
    def folds(self) -> int:
        return len(self.training)


@dataclass(frozen=True)
class CrossFitted:
    """The out-of-fold evidence of every non-test sample, fused (:func:`out_of_fold`), and how long the fold
    models trained: ``epochs`` of the ``asked``, fewer where the time limit ended their run."""

    split: FusedSplit
    epochs: int
    asked: int
    folds: int

    @property
    def timed_out(self) -> bool:
        return self.epochs < self.asked

    def warnings(self) -> list[str]:
        """Whether the fold models trained less than the served model (the time limit ended them)."""
        if not self.timed_out:
            return []
        return [
            f"cross-fitting stopped at the time limit after {self.epochs} of {self.asked} epochs: the fold "
            "models the flag, the confidence and the prediction sets are calibrated on trained less than the "
            "served model, so their rates on new data may differ; raise --max-minutes"
        ]


def plan_cross_fitting(sets: EvaluationSets, *, num_classes: int, seed: int) -> CrossFitting | None:
    """The folds to cross-fit ``sets``' calibrations on, or None where the validation split is enough (at
    least :data:`CROSS_FIT_BELOW` samples) or cross-fitting is not possible (a class with fewer non-test
    samples than two folds need, a fold without a donor for a conflictive copy)."""
    if len(sets.validation) >= CROSS_FIT_BELOW:
        return None
    rows = np.sort(np.concatenate([sets.train.rows, sets.validation.rows]))
    labels = sets.everything.labels[rows]
    folds = min(FOLDS, int(np.bincount(labels, minlength=num_classes).min()))
    if folds < 2:
        return None
    rng = np.random.default_rng([seed, 1])  # its own stream: the protocol's sets stay as they were
    split = list(cross_validation_folds(rows.size, folds=folds, seed=seed, strata=labels))
    count = min(fit.size for fit, _ in split)
    training = [np.sort(rng.choice(rows[fit], count, replace=False)) for fit, _ in split]
    present = sets.present
    held_out = [
        Samples(sets.views, rows[held], labels[held], None if present is None else present[rows[held]])
        for _, held in split
    ]
    try:
        conflictive = [conflictive_copy(fold, rng=rng, num_classes=num_classes) for fold in held_out]
    except ValueError:  # a view missing in every donor of some class in a fold: the validation split will do
        return None
    return CrossFitting(training=training, held_out=held_out, conflictive=conflictive)


def out_of_fold(
    plan: CrossFitting,
    sets: EvaluationSets,
    *,
    num_classes: int,
    config: TrainConfig,
    epochs: int,
    time_limit: float | None = None,
    progress: bool | Progress | None = None,
) -> CrossFitted:
    """Train the fold models of ``plan`` for ``epochs`` epochs each (or until ``time_limit`` seconds have
    passed) and fuse each one's evidence on its own fold and on that fold's conflictive copies, as
    ``config``'s fusion fuses: one split of every non-test sample (in fold order), for
    :func:`training.calibrate.calibrate`."""
    k = plan.folds
    models = train_members(
        [list(sets.views.values())] * k,
        [sets.everything.labels] * k,
        num_classes=num_classes,
        config=dataclasses.replace(config, epochs=epochs),
        seeds=[config.seed] * k,  # the served model's initial weights: the models differ in their data only
        rows=plan.training,
        present=[sets.present] * k,
        time_limit=time_limit,
        progress=progress,
    )
    split = fused_out_of_fold(
        plan,
        lambda k, samples: predict_evidence(models[k].heads, samples),
        method=config.method,
        lam=config.lam,
    )
    return CrossFitted(split=split, epochs=models[0].history.epochs, asked=epochs, folds=k)


def fused_out_of_fold(
    plan: CrossFitting, evidence: Callable[[int, Samples], np.ndarray], *, method: Method, lam: float
) -> FusedSplit:
    """Each fold model's evidence (``evidence(k, samples)``: model k's, (N, V, K)) on its own fold and on
    the fold's conflictive copies, fused once: one split of every non-test sample, in fold order."""
    folds = range(plan.folds)
    clean = np.concatenate([evidence(k, plan.held_out[k]) for k in folds])
    copies = np.concatenate([evidence(k, plan.conflictive[k]) for k in folds])

    def joined(parts: list[Samples], attribute: str) -> np.ndarray | None:
        values = [getattr(part, attribute) for part in parts]
        return None if values[0] is None else np.concatenate(values)

    return FusedSplit.of_evidence(
        clean,
        joined(plan.held_out, "labels"),
        method=method,
        lam=lam,
        present=joined(plan.held_out, "present"),
        conflictive=(copies, joined(plan.conflictive, "labels"), joined(plan.conflictive, "present")),
    )
