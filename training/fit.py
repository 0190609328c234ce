"""From a dataset to a served model's directory: split and scale, train, calibrate, measure, write.

:func:`fit` is the one path: a user's data (``python -m training fit``: a budget of optimizer steps with early
stopping on the validation loss, the heads' architecture chosen on it, and a model card) and the benchmark
datasets (:func:`export`, ``python -m training export``: the paper's hyperparameters and a fixed number of
epochs, what ``models/`` is made with) both go through it.

1. the ``heldout`` protocol (:func:`training.protocol.assemble`): stratified train / validation / test split
   (or the data's split column), scaling fitted on the training split, conflictive copies of the
   validation and test splits;
2. one evidential head per view, trained with the paper's loss and the model's fusion
   (:func:`training.train.train_members`), on the rows that have each view; with several candidate
   architectures, each is trained and the one kept that :func:`training.architecture.choose_heads` picks;
3. everything post-hoc fitted on the validation split (:func:`training.calibrate.calibrate`);
4. the measures on the test split and over every sample, for the manifest;
5. the ONNX graphs, the manifest and the card, written all at once (:func:`training.export.write_model`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from fusion import fuse, opinion_from_evidence
from manifest import NAME_PATTERN, FusionDefaults, Manifest, Metrics, OutOfRange, ViewEntry
from training.architecture import HeadChoice, choose_heads
from training.calibrate import (
    FlagScores,
    FusedSplit,
    PostHoc,
    calibrate,
    check_calibration_splits,
    flag_scores,
)
from training.data import MultiViewData
from training.evaluate import Evaluation, measure
from training.export import check_model_dir, provenance, write_model
from training.metrics import accuracy
from training.progress import Progress
from training.protocol import EvaluationSets, assemble
from training.readers import read_registered
from training.registry import dataset_spec
from training.train import (
    Budget,
    EarlyStopping,
    History,
    TrainConfig,
    Trained,
    predict_evidence,
    train_members,
)

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
    config, seed, early_stopping, time_limit
        How it was trained (``config.hidden``: the heads kept).
    choice : HeadChoice or None
        The head architectures measured on the validation split, where ``fit`` chose between several.
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
    time_limit: float | None = None
    choice: HeadChoice | None = None

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
            record["still_improving"] = self.history.still_improving
        if self.time_limit is not None:
            record["time_limit_seconds"] = self.time_limit
            record["timed_out"] = self.history.timed_out
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
            out_of_range=OutOfRange(),  # written out: the threshold is part of the model's contract
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
    budget: Budget | None = None,
    hidden: Sequence[tuple[int, ...]] | None = None,
    name: str | None = None,
    card: bool = False,
    progress: bool | Progress | Callable[[int], Progress] | None = None,
    in_place: bool = False,
) -> tuple[Manifest, FitReport]:
    """Train, calibrate, measure and write ``data``'s model to ``out_dir`` (see the module notes).

    Parameters
    ----------
    data : MultiViewData
    out_dir : path
        The model's directory (``models/NAME``): absent, or a model directory, replaced only once everything
        is written and verified; on any failure it is left as it was. Anything else (a folder that is not a
        model's, the data) is refused before training (:func:`training.export.check_model_dir`).
    config : TrainConfig
        Training settings; its method and lambda are also the model's default fusion. ``config.epochs`` is
        the maximum with ``early_stopping``.
    seed : int
        Seeds the split and the conflictive copies (``config.seed`` the heads' initialisation).
    target_false_positive_rate : float
        The share of clean validation samples the high-conflict flag raises.
    early_stopping : EarlyStopping, optional
        Stop on the validation loss; None trains ``config.epochs`` epochs.
    budget : Budget, optional
        Instead of ``config.epochs`` and ``early_stopping``: the epoch cap and the early stopping from the
        training split's size, and a time limit (``python -m training fit``'s default).
    hidden : sequence of tuple of int, optional
        Hidden widths of the heads to choose between on the validation split
        (:func:`training.architecture.choose_heads`; each gets an equal share of the time limit);
        default: ``config.hidden`` alone.
    name : str, optional
        The model's name (default: ``out_dir``'s).
    card : bool
        Write the model card (:mod:`training.card`) beside the manifest.
    progress : bool, Progress or callable, optional
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
    if budget is not None and early_stopping is not None:
        raise ValueError("give a budget or early stopping, not both")
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    raw = _parity_rows(data)  # before scaling: in place, the raw features are gone afterwards
    sets = assemble(data, seed=seed, conflictive=("validation", "test"), in_place=in_place)
    seconds["scaling"] = time.perf_counter() - started
    check_calibration_splits(data, sets)
    check_model_dir(out, data=_data_path(data))  # and again where it is replaced, once trained
    time_limit = None
    if budget is not None:
        config = replace(config, epochs=budget.max_epochs(len(sets.train), config))
        early_stopping, time_limit = budget.early_stopping(len(sets.train), config), budget.seconds

    candidates = [config.hidden] if hidden is None else [tuple(widths) for widths in hidden]
    if time_limit is not None:
        time_limit /= len(candidates)

    def train_heads(widths: tuple[int, ...]) -> Trained:
        return train_members(
            [list(sets.views.values())],
            [data.labels],
            num_classes=data.num_classes,
            config=replace(config, hidden=widths),
            seeds=[config.seed],
            rows=[sets.train.rows],
            present=[sets.present],
            validation=[sets.validation],
            early_stopping=early_stopping,
            time_limit=time_limit,
            progress=progress,
        )[0]

    started = time.perf_counter()
    torch.set_num_threads(1)  # deterministic float summation order, hence the same weights and bytes
    # Saturated heads' gradients turn subnormal, which x86 computes many times slower: flushed, they are 0.
    torch.set_flush_denormal(True)
    trained, choice = choose_heads(
        train_heads,
        candidates,
        sets.validation,
        sets.conflictive["validation"],
        method=config.method,
        lam=config.lam,
    )
    config = replace(config, hidden=candidates[0] if choice is None else choice.chosen.hidden)
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
        time_limit=time_limit,
        choice=choice,
    )

    def write_card(directory: Path, manifest: Manifest) -> None:
        from training.card import write_card

        write_card(directory, report, manifest)

    started = time.perf_counter()
    manifest = write_model(
        out,
        data=_data_path(data),
        heads=heads,
        scaler=sets.scaler,
        parity={v: (raw[v][1], sets.views[v][raw[v][0]]) for v in data.view_names},
        manifest=lambda views: report.manifest(views, name=name),
        extras=write_card if card else None,
    )
    seconds["export"] = time.perf_counter() - started
    return manifest, report


def _data_path(data: MultiViewData) -> Path | None:
    """Where ``data`` was read from, if it names a file or directory: no model is written into or over it."""
    return Path(data.source) if data.source and os.path.lexists(data.source) else None


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
