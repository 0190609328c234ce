"""What a fit measured (:class:`FitReport`): what the manifest records and the model card shows.

:func:`training.fit.fit` makes it; :mod:`training.card` reads it. Neither imports the other's module for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from manifest import Calibration, FusionDefaults, Manifest, Metrics, OutOfRange, ViewEntry
from training.architecture import HeadChoice, Outvoted
from training.baseline import Comparison
from training.calibrate import (
    FusedSplit,
    PostHoc,
    confidence_gap_low,
    confidence_noise,
    confidence_warnings,
)
from training.crossfit import CrossFitted
from training.data import MultiViewData
from training.evaluate import Evaluation
from training.export import provenance
from training.protocol import SQUEEZE, EvaluationSets, copies_in_test, duplicated_views, squeezed_features
from training.train import EarlyStopping, History, TrainConfig

__all__ = ["FitReport"]

VACUOUS = 1 - 1e-6
"""A view's uncertainty at or above which its head gave no evidence (below a millionth of its classes')."""

CERTAIN = 1e-9
"""A view's uncertainty at or below which its evidence is near the capped exponential's ceiling (1e13 a
class): certain whatever its input."""


@dataclass(frozen=True, eq=False)
class FitReport:
    """What a fit measured: everything the manifest and the model card say.

    Attributes
    ----------
    data : MultiViewData
        The data fitted (names, classes, labels; its features are the scaled ones after an in-place fit).
    sets : EvaluationSets
        The protocol's splits and conflictive copies.
    history : History
        The training's epochs, losses and times.
    test : FusedSplit
        The served model's output on the clean test samples and their conflictive copies, fused once, with
        each view's own opinion: what everything below is measured on.
    evaluation : Evaluation
        The paper's measures on the test split.
    comparison : Comparison
        The fused model against each view's head alone and against a plain all-views model.
    post_hoc : PostHoc
        The flag and the calibration section, and the samples they were fitted on.
    metrics : Metrics
        The manifest's measures.
    config, seed, early_stopping, time_limit
        How it was trained (``config.hidden``: the heads kept).
    seconds : dict of str to float
        Wall time of each phase.
    choice : HeadChoice or None
        The head architectures measured on the validation split, where ``fit`` chose between several.
    outvoted : Outvoted or None
        Where the fused model was outvoted by its best view on held-out evidence: the heads trained again.
    cross_fitted : CrossFitted or None
        The fold models' run, where the calibrations were cross-fitted.
    """

    data: MultiViewData
    sets: EvaluationSets
    history: History
    test: FusedSplit
    evaluation: Evaluation
    comparison: Comparison
    post_hoc: PostHoc
    metrics: Metrics
    config: TrainConfig
    seed: int
    early_stopping: EarlyStopping | None
    seconds: dict[str, float]
    time_limit: float | None = None
    choice: HeadChoice | None = None
    outvoted: Outvoted | None = None
    cross_fitted: CrossFitted | None = None

    @cached_property
    def warnings(self) -> list[str]:
        """What the user should know before serving the model: where it falls short of a simpler one, and
        what the data cannot support."""
        folds = [] if self.cross_fitted is None else self.cross_fitted.warnings()
        flag = self.post_hoc.flag_warnings(self.test)
        agreement = self.post_hoc.agreement_warnings(self.test, self.data.view_names)
        fused = self.comparison.warnings()
        return (
            self._still_improving()
            + fused
            + self._squeezed()
            + self.post_hoc.warnings()
            + flag
            + agreement
            + confidence_warnings(
                self.calibration,
                noise=self.confidence_noise,
                gap_low=confidence_gap_low(self.calibration, self.test),
            )
            + self._copies()
            + self._duplicated_views()
            + folds
            + self._broken_heads()
        )

    @cached_property
    def calibration(self) -> Calibration:
        """The manifest's calibration section, with its figures on the test split."""
        return self.post_hoc.calibration_section(self.test)

    @cached_property
    def confidence_noise(self) -> float:
        """The ECE a perfectly calibrated ``confidence`` exceeds one time in 20 on the clean test samples."""
        return confidence_noise(self.calibration, self.test)

    def _broken_heads(self) -> list[str]:
        """Views whose head gives no evidence on any test sample, or evidence at the capped exponential's
        ceiling on every one: its training broke down (as a view of many thousands of features makes it
        overshoot), where a view with nothing to learn still gives some evidence."""
        views, present = self.test.views, self.test.present
        if views is None:
            return []
        notes = []
        for v, (view, dim) in enumerate(zip(self.data.view_names, self.data.view_dims, strict=True)):
            uncertainty = views.uncertainty[:, v] if present is None else views.uncertainty[present[:, v], v]
            if not uncertainty.size:
                continue
            samples = f"{uncertainty.size} test samples that have it"
            if np.all(uncertainty >= VACUOUS):
                what = f"gives no evidence on any of the {samples} (uncertainty 1): it is ignored"
            elif np.all(uncertainty <= CERTAIN):
                what = f"is certain on every one of the {samples}, whatever its features"
            else:
                continue
            notes.append(
                f"`{view}` ({dim} features): its head {what}; its training broke down, as a view of many "
                "thousands of features makes it overshoot (each step moves its scores by about the learning "
                "rate times the sum of its scaled features): reduce its features (e.g. a PCA to a few "
                "thousand, or fewer) before fitting, and the same in every request"
            )
        return notes

    def _still_improving(self) -> list[str]:
        """A run that the epoch cap or the time limit ended while its validation loss still improved."""
        history = self.history
        if not history.still_improving:
            return []
        limit, option = ("time limit", "--max-minutes") if history.timed_out else ("epoch cap", "--epochs")
        said = (
            f"the {limit} ended training after {history.epochs} epochs while the validation loss was still "
            f"improving (best epoch {history.best_epoch})"
        )
        fused = self.comparison.fused
        if fused.total and fused.count == fused.total:
            # A loss still falling where every answer is right is evidence still growing, not underfitting.
            return [
                f"{said}; the fused model is right on every test sample, so more training would make its "
                f"opinions more certain rather than more accurate: raise `{option}` if its uncertainty "
                "matters"
            ]
        return [f"{said}: the model may be underfitted; raise `{option}`"]

    def _squeezed(self) -> list[str]:
        """Views whose features a few outliers stretch: scaled to [0, 1], the rest of each is a sliver."""
        return [
            f"`{view}`: in {squeezed} of its {features} features the middle 98% of the training values "
            f"spans less than {SQUEEZE:.0%} of their range, which a few outliers stretch; scaled to that "
            "range, the rest is squeezed into a sliver the heads can hardly tell apart: clip such features "
            "to their usual range (e.g. the 1st and 99th percentiles) or transform them (a logarithm, "
            "ranks) before fitting, and the same in every request"
            for view, (squeezed, features) in squeezed_features(self.sets).items()
        ]

    def _copies(self) -> list[str]:
        """Test samples that are copies of samples the model was fitted on: figures that flatter it where a
        sample was recorded twice. Where features take few values (categories, counts), distinct samples
        share them by chance, and the test figures are as sound as on any random split: the features alone
        cannot tell which, so the warning gives both readings."""
        copies, total = copies_in_test(self.sets), len(self.sets.test)
        if not copies:
            return []
        return [
            f"{copies} of the {total} test samples are exact copies of training or validation samples: where "
            "they are one sample recorded twice, every test figure here is optimistic, so drop duplicate "
            "samples before fitting; where distinct samples can share all their features (categories, "
            "counts, coarse rounding), such copies are expected and the figures hold"
        ]

    def _duplicated_views(self) -> list[str]:
        """Views given twice: fusion counts one view's evidence twice, and the two copies never conflict, so
        they outvote the other views and a failure of that modality raises no conflict."""
        return [
            f"`{first}` and `{second}` hold the same features in every training sample (one view given "
            "twice, or once more in other units): fusion counts its evidence twice and the copies never "
            "disagree, so they outvote the other views and hide a failure of that modality from the conflict "
            "flag; leave one out with `--views`"
            for first, second in duplicated_views(self.sets)
        ]

    def training(self) -> dict[str, object]:
        """The manifest's ``training`` record: settings, seed, epochs and split sizes."""
        config, hp = self.config, self.config.hyperparameters
        record: dict[str, object] = {
            "protocol": self.sets.protocol,
            "seed": self.seed,
            "method": config.method,
            "lambda": config.lam,
            "activation": config.activation,
            "hidden": list(config.hidden),
            "epochs": self.history.epochs,
            "batch_size": config.batch_size,
            "lr": hp.lr,
            "annealing_step": hp.annealing_step,
            "gamma": hp.gamma,
            "beta": config.beta,
            "class_weighting": config.class_weighting,
            "weight_decay": hp.weight_decay,
            "splits": {
                "train": len(self.sets.train),
                "validation": len(self.sets.validation),
                "test": len(self.sets.test),
            },
        }
        if self.early_stopping is not None:
            record["max_epochs"] = config.epochs
            record["patience"] = self.early_stopping.patience
            record["best_epoch"] = self.history.best_epoch
            record["still_improving"] = self.history.still_improving
        if self.time_limit is not None:
            record["time_limit_seconds"] = self.time_limit
            record["timed_out"] = self.history.timed_out
        if self.outvoted is not None:
            record["outvoted"] = {
                "best_view": self.outvoted.best_view,
                "beta": self.outvoted.beta,
                "held_out_accuracy": {
                    "fused": self.outvoted.fused.value,
                    "best_view": self.outvoted.best_view_accuracy.value,
                    "fused_trained_again": self.outvoted.again.value,
                },
                "kept": self.outvoted.kept,
            }
        if self.cross_fitted is not None:
            record["cross_fitting"] = {
                "epochs": self.cross_fitted.epochs,
                "timed_out": self.cross_fitted.timed_out,
            }
        return record

    def manifest(self, views: list[ViewEntry], *, name: str) -> Manifest:
        """The manifest of the model with the written ``views``."""
        return Manifest(
            name=name,
            dataset=self.data.name,
            classes=list(self.data.class_names),
            views=views,
            fusion=FusionDefaults(method=self.config.method, lam=self.config.lam),
            conflict_flag=self.post_hoc.conflict_flag(self.test),
            calibration=self.calibration,
            out_of_range=OutOfRange(),  # written out: the threshold is part of the model's contract
            view_agreement=self.post_hoc.view_agreement(self.test, self.data.view_names),
            metrics=self.metrics,
            training=self.training(),
            provenance=provenance(),
        )
