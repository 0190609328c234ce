"""From a dataset to a served model's directory: split and scale, train, calibrate, measure, write.

:func:`fit` is the one path: a user's data (``python -m training fit``: early stopping on the validation loss
and a model card) and the benchmark datasets (:func:`export`, ``python -m training export``: the paper's
hyperparameters and a fixed number of epochs, what ``models/`` is made with) both go through it.

1. the ``heldout`` protocol (:func:`training.protocol.evaluation_sets`): stratified train / validation / test
   split (or the data's split column), scaling fitted on the training split, conflictive copies of the
   validation and test splits;
2. one evidential head per view, trained with the paper's loss and the model's fusion
   (:func:`training.train.train_members`), on the rows that have each view;
3. everything post-hoc fitted on the validation split (:func:`training.calibrate.calibrate`);
4. the measures on the test split and over every sample, for the manifest;
5. the ONNX graphs, the manifest and the card, written all at once (:func:`training.export.write_model`).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fusion import fuse, opinion_from_evidence
from manifest import NAME_PATTERN, FusionDefaults, Manifest, Metrics, ViewEntry
from training.calibrate import FlagScores, FusedSplit, PostHoc, calibrate, flag_scores
from training.data import MultiViewData
from training.evaluate import Evaluation, measure
from training.export import provenance, write_model
from training.metrics import accuracy
from training.progress import Progress
from training.protocol import EvaluationSets, evaluation_sets
from training.readers import read_registered
from training.registry import dataset_spec
from training.train import EarlyStopping, History, TrainConfig, predict_evidence, train_members

__all__ = ["FitReport", "export", "fit"]

PARITY_ROWS = 4096
"""Rows per view each ONNX graph is checked on against its torch head (every row of a smaller dataset)."""


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
    evidence : dict of str to ndarray
        The heads' evidence (N, V, K) on ``"validation"``, ``"validation_conflictive"``, ``"test"``,
        ``"test_conflictive"`` and ``"everything"``, rows as in the matching :class:`Samples` of ``sets``.
    calibration : PostHoc
        What was fitted on the validation split: the flag, confidence and prediction sets.
    test_scores : (FlagScores, FlagScores)
        The flag's scores on the clean and conflictive test samples.
    test : FusedSplit
        The fused output on the clean and conflictive test samples (what the calibration is measured on).
    evaluation : Evaluation
        The paper's measures on the clean and conflictive test samples.
    metrics : Metrics
        The manifest's measures.
    config, seed, early_stopping
        How it was trained.
    seconds : dict of str to float
        Wall time of each phase.
    """

    data: MultiViewData
    sets: EvaluationSets
    history: History
    evidence: dict[str, np.ndarray] = field(repr=False)
    calibration: PostHoc
    test_scores: tuple[FlagScores, FlagScores] = field(repr=False)
    test: FusedSplit = field(repr=False)
    evaluation: Evaluation
    metrics: Metrics
    config: TrainConfig
    seed: int
    early_stopping: EarlyStopping | None
    seconds: dict[str, float]

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
        return record

    def manifest(self, views: list[ViewEntry], *, name: str) -> Manifest:
        """The manifest of the model with the written ``views``."""
        return Manifest(
            name=name,
            dataset=self.data.name,
            classes=list(self.data.class_names),
            views=views,
            fusion=FusionDefaults(method=self.config.method, lam=self.config.lam),
            conflict_flag=self.calibration.conflict_flag(self.test_scores),
            calibration=self.calibration.calibration(self.test),
            metrics=self.metrics,
            training=self.training(),
            provenance=provenance(),
        )


def fit(
    data: MultiViewData,
    out_dir: str | os.PathLike[str],
    *,
    config: TrainConfig,
    seed: int = 0,
    target_false_positive_rate: float = 0.05,
    early_stopping: EarlyStopping | None = None,
    name: str | None = None,
    card: bool = False,
    progress: bool | Progress | None = None,
    in_place: bool = False,
) -> tuple[Manifest, FitReport]:
    """Train, calibrate, measure and write ``data``'s model to ``out_dir`` (see the module notes).

    Parameters
    ----------
    data : MultiViewData
    out_dir : path
        The model's directory (``models/NAME``): replaced only once everything is written and verified;
        on any failure it is left as it was.
    config : TrainConfig
        Training settings; its method and lambda are also the model's default fusion. ``config.epochs`` is
        the maximum with ``early_stopping``.
    seed : int
        Seeds the split and the conflictive copies (``config.seed`` the heads' initialisation).
    target_false_positive_rate : float
        The share of clean validation samples the high-conflict flag raises.
    early_stopping : EarlyStopping, optional
        Stop on the validation loss; None trains ``config.epochs`` epochs.
    name : str, optional
        The model's name (default: ``out_dir``'s).
    card : bool
        Write the model card (:mod:`training.card`) beside the manifest.
    progress : bool or Progress, optional
        How training reports its epochs (:func:`training.train.train_members`).
    in_place : bool
        Scale ``data``'s features in place: for data too large to hold twice. ``data`` is spent afterwards.

    Returns
    -------
    (Manifest, FitReport)
    """
    out = Path(out_dir)
    name = name or out.name
    if not re.fullmatch(NAME_PATTERN.strip("^$"), name):
        raise ValueError(
            f"{out}: {name!r} is not a valid model name (letters, digits, '_', '.' and '-', starting with a "
            "letter or digit): it is the model's name in the API"
        )
    if not 0 < target_false_positive_rate < 1:
        raise ValueError(
            f"the target false-positive rate must lie in (0, 1), got {target_false_positive_rate}"
        )
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    raw = _parity_rows(data)  # before scaling: in place, the raw features are gone afterwards
    sets = evaluation_sets(data, seed=seed, conflictive=("validation", "test"), in_place=in_place)
    seconds["scaling"] = time.perf_counter() - started

    started = time.perf_counter()
    torch.set_num_threads(1)  # deterministic float summation order, hence the same weights and bytes
    trained = train_members(
        [list(sets.views.values())],
        [data.labels],
        num_classes=data.num_classes,
        config=config,
        seeds=[config.seed],
        rows=[sets.train.rows],
        present=[sets.present],
        validation=[sets.validation],
        early_stopping=early_stopping,
        progress=progress,
    )[0]
    seconds["training"] = time.perf_counter() - started

    started = time.perf_counter()
    heads, method, lam = trained.heads, config.method, config.lam
    named = {
        "validation": sets.validation,
        "validation_conflictive": sets.conflictive["validation"],
        "test": sets.test,
        "test_conflictive": sets.conflictive["test"],
        "everything": sets.everything,
    }
    evidence = {key: predict_evidence(heads, samples) for key, samples in named.items()}
    calibration = calibrate(
        evidence["validation"],
        evidence["validation_conflictive"],
        labels=sets.validation.labels,
        conflictive_labels=sets.conflictive["validation"].labels,
        method=method,
        lam=lam,
        target_false_positive_rate=target_false_positive_rate,
        clean_present=sets.validation.present,
        conflictive_present=sets.conflictive["validation"].present,
        seed=seed,
    )
    test = FusedSplit.of_evidence(
        evidence["test"],
        sets.test.labels,
        method=method,
        lam=lam,
        present=sets.test.present,
        conflictive=(
            evidence["test_conflictive"],
            sets.conflictive["test"].labels,
            sets.conflictive["test"].present,
        ),
    )
    test_scores = tuple(
        flag_scores(evidence[key], method=method, lam=lam, present=named[key].present)
        for key in ("test", "test_conflictive")
    )
    evaluation = measure(
        evidence["test"],
        sets.test.labels,
        evidence["test_conflictive"],
        sets.conflictive["test"].labels,
        method=method,
        lam=lam,
        clean_present=sets.test.present,
        conflictive_present=sets.conflictive["test"].present,
    )
    everything = fuse(opinion_from_evidence(evidence["everything"]), method, lam=lam, mask=sets.present)
    metrics = Metrics(
        acc_normal=evaluation.acc_normal,
        acc_conflict=evaluation.acc_conflict,
        auc=evaluation.auc,
        acc_all_samples=accuracy(everything.probability, data.labels),
    )
    seconds["evaluation"] = time.perf_counter() - started
    report = FitReport(
        data=data,
        sets=sets,
        history=trained.history,
        evidence=evidence,
        calibration=calibration,
        test_scores=test_scores,
        test=test,
        evaluation=evaluation,
        metrics=metrics,
        config=config,
        seed=seed,
        early_stopping=early_stopping,
        seconds=seconds,
    )

    def write_card(directory: Path, manifest: Manifest) -> None:
        from training.card import write_card

        write_card(directory, report, manifest)

    started = time.perf_counter()
    manifest = write_model(
        out,
        heads=heads,
        scaler=sets.scaler,
        parity={v: (raw[v][1], sets.views[v][raw[v][0]]) for v in data.view_names},
        manifest=lambda views: report.manifest(views, name=name),
        extras=write_card if card else None,
    )
    seconds["export"] = time.perf_counter() - started
    return manifest, report


def _parity_rows(data: MultiViewData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per view, up to :data:`PARITY_ROWS` rows that have it, and copies of their raw features."""
    rows = {}
    for v, (name, matrix) in enumerate(data.views.items()):
        picked = np.flatnonzero(data.present[:, v])[:PARITY_ROWS]
        rows[name] = (picked, matrix[picked].copy())
    return rows


def export(
    dataset_name: str,
    out_dir: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str],
    method: str = "dbf",
    lam: float = 1.0,
    config: TrainConfig | None = None,
    seed: int = 0,
    target_false_positive_rate: float = 0.05,
    name: str | None = None,
) -> Manifest:
    """Fit a benchmark dataset as ``models/`` holds it: the paper's hyperparameters, ``config.epochs``
    epochs without early stopping, no card.

    ``config`` defaults to ``method``, ``lam``, the dataset's hyperparameters and ``seed``; the model's
    default fusion is the config's. ``out_dir`` is replaced only once everything is written and verified.
    """
    spec = dataset_spec(dataset_name)
    config = config or TrainConfig(method=method, lam=lam, hyperparameters=spec.hyperparameters, seed=seed)
    data = read_registered(spec, data_dir)
    manifest, _ = fit(
        data,
        out_dir,
        config=config,
        seed=seed,
        target_false_positive_rate=target_false_positive_rate,
        name=name or dataset_name,
    )
    return manifest
