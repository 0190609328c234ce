"""From a dataset to a served model's directory, in named steps (:func:`fit`).

1. read and check: the caller's (:mod:`training.readers`); here, the model's name and the flag's target;
2. split and scale (:func:`training.protocol.evaluation_sets`, the ``heldout`` protocol): stratified train /
   validation / test split (or the data's split column), scaling fitted on the training split, conflictive
   copies of the validation and test splits; a validation or test view far outside the training range is
   missing from there on, as the service fuses it;
3. train one evidential head per view with the paper's loss and the model's fusion
   (:func:`training.train.train_members`), on the rows that have each view; with several candidate
   architectures, each is trained and the one kept that :func:`training.architecture.choose_heads` picks;
4. held-out evidence: the clean validation split's, or, where it is small, every non-test sample's out of
   fold (:mod:`training.crossfit`); where it shows the fused model outvoted by its best view, the heads
   trained again with the fused term first and kept if more accurate there
   (:func:`training.architecture.unless_outvoted`);
5. calibrate the flag, the confidence and the prediction sets on that evidence
   (:func:`training.calibrate.calibrate`);
6. evaluate on the test split, fused once: the paper's measures (:func:`training.evaluate.measure`), and
   against each view's head alone and a plain model of all views (:mod:`training.baseline`);
7. export the ONNX graphs, the manifest and the card (:mod:`training.card`), written all at once
   (:func:`training.export.write_model`).

:func:`fit` is the one path: a user's data (``python -m training fit``: a budget of optimizer steps with early
stopping on the validation loss, the heads' architecture chosen on it, and a model card) and the benchmark
datasets (:func:`export`, ``python -m training export``: the paper's hyperparameters and a fixed number of
epochs, what ``models/`` is made with) both go through it. What it measured is a
:class:`training.report.FitReport`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from fusion import fuse, opinion_from_evidence
from manifest import NAME_PATTERN, Manifest, Metrics, OutOfRange
from training.architecture import HeadChoice, Outvoted, choose_heads, unless_outvoted
from training.baseline import Comparison, compare, fit_baseline
from training.calibrate import FusedSplit, PostHoc, calibrate, check_calibration_splits
from training.card import write_card
from training.crossfit import CrossFitted, out_of_fold, plan_cross_fitting
from training.data import DataError, MultiViewData
from training.evaluate import Evaluation, measure
from training.export import check_model_dir, write_model
from training.heads import EvidentialHeads, head_weights
from training.metrics import accuracy
from training.progress import Progress, ProgressBar, ProgressLines, Reporters, progress_for
from training.protocol import EvaluationSets, Samples, evaluation_sets
from training.readers import machine_memory, read_registered
from training.registry import dataset_spec
from training.report import FitReport
from training.train import Budget, EarlyStopping, TrainConfig, Trained, predict_evidence, train_members

__all__ = ["export", "fit"]

PARITY_ROWS = 4096
"""Rows per view each ONNX graph is checked on against its torch head (every row of a smaller dataset)."""


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
    outvoted_beta: float | None = None,
    name: str | None = None,
    card: bool = False,
    progress: bool | Progress | Callable[[int], Progress] | None = None,
    in_place: bool = False,
) -> tuple[Manifest, FitReport]:
    """Train, evaluate, calibrate and write ``data``'s model to ``out_dir`` (see the module notes).

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
        Seeds the split, the conflictive copies, the baseline's and the cross-fitting's draws
        (``config.seed`` the heads' initialisation).
    target_false_positive_rate : float
        The share of clean calibration samples the high-conflict flag raises.
    early_stopping : EarlyStopping, optional
        Stop on the validation loss; None trains ``config.epochs`` epochs.
    budget : Budget, optional
        Instead of ``config.epochs`` and ``early_stopping``: the epoch cap and the early stopping from the
        training split's size, and a time limit (``python -m training fit``'s default).
    hidden : sequence of tuple of int, optional
        Hidden widths of the heads to choose between on the validation split
        (:func:`training.architecture.choose_heads`; each gets an equal share of the time limit);
        default: ``config.hidden`` alone.
    outvoted_beta : float, optional
        Where the fused model is outvoted by its best view on held-out evidence (the calibrations': out of
        fold, or the validation split's), train the heads again with this weight of each view's own term
        (:func:`training.architecture.unless_outvoted`; the retraining, and its own cross-fitting, get
        the whole time limit each). None: never.
    name : str, optional
        The model's name (default: ``out_dir``'s).
    card : bool
        Write the model card (:mod:`training.card`) beside the manifest.
    progress : bool, Progress or callable, optional
        How training reports its epochs (:func:`training.train.train_members`); cross-fitting's models
        report alike.
    in_place : bool
        Scale ``data``'s features in place: for data too large to hold twice. ``data`` is spent afterwards.

    Returns
    -------
    (Manifest, FitReport)
    """
    out = Path(out_dir)
    name = name or out.name
    _check_arguments(out, name, target_false_positive_rate, budget=budget, early_stopping=early_stopping)
    _check_heads(data, [config.hidden] if hidden is None else [tuple(widths) for widths in hidden])
    torch.set_num_threads(1)  # deterministic float summation order, hence the same weights and bytes
    seconds: dict[str, float] = {}
    with _timed(seconds, "scaling"):
        raw = _parity_rows(data)  # before scaling: in place, the raw features are gone afterwards
        sets = evaluation_sets(
            data,
            seed=seed,
            conflictive=("validation", "test"),
            in_place=in_place,
            out_of_range_above=OutOfRange().threshold,  # the manifest's: measured as it is served
        )
    check_calibration_splits(data, sets)
    check_model_dir(out, data=_data_path(data))  # and again where it is replaced, once trained
    schedule = _Schedule.of(config, early_stopping=early_stopping, budget=budget, train_size=len(sets.train))
    with _timed(seconds, "training"), _subnormals_flushed():
        trained, choice, config = _train(sets, data, schedule=schedule, hidden=hidden, progress=progress)
    with _timed(seconds, "calibration"), _subnormals_flushed():
        calibrated = _calibrate(
            trained,
            _HeldOut(sets, num_classes=data.num_classes, config=config, seed=seed, progress=progress),
            view_names=data.view_names,
            schedule=schedule,
            outvoted_beta=outvoted_beta,
            target_false_positive_rate=target_false_positive_rate,
        )
    with _timed(seconds, "evaluation"):
        evaluated = _evaluate(calibrated.trained.heads, sets, data, config=calibrated.config, seed=seed)
    report = FitReport(
        data=data,
        sets=sets,
        history=calibrated.trained.history,
        test=evaluated.test,
        evaluation=evaluated.evaluation,
        comparison=evaluated.comparison,
        post_hoc=calibrated.post_hoc,
        metrics=evaluated.metrics,
        config=calibrated.config,
        seed=seed,
        early_stopping=schedule.early_stopping,
        seconds=seconds,
        time_limit=schedule.time_limit,
        choice=choice,
        outvoted=calibrated.outvoted,
        cross_fitted=calibrated.cross_fitted,
    )
    with _timed(seconds, "export"):
        manifest = _write(out, calibrated.trained.heads, sets, raw, report, name=name, card=card)
    return manifest, report


# -- the steps -------------------------------------------------------------------------------------------


def _check_arguments(
    out: Path,
    name: str,
    target_false_positive_rate: float,
    *,
    budget: Budget | None,
    early_stopping: EarlyStopping | None,
) -> None:
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


ONNX_FILE_BYTES = 2**31
"""What one ONNX file holds at most (protobuf's limit): each head is one file."""

TRAINING_BYTES_PER_WEIGHT = 16
"""A weight's bytes while training: itself, its gradient and Adam's two moments, float32 each."""


def _check_heads(data: MultiViewData, candidates: Sequence[tuple[int, ...]]) -> None:
    """Refuse, before training, heads that could not be exported (one over an ONNX file's limit) or
    trained here (all of them over half this machine's memory): found out after the training, or as numpy's
    MemoryError, they cost the whole run."""
    memory = machine_memory()
    for hidden in candidates:
        weights = [head_weights(dim, data.num_classes, hidden=hidden) for dim in data.view_dims]
        shape = ",".join(map(str, hidden)) or "linear"
        if max(weights) * 4 > ONNX_FILE_BYTES:
            raise DataError(
                f"heads of hidden layers {shape}: {max(weights):,} weights in one head, over the 2 GiB an "
                "ONNX file holds; use narrower layers (--hidden)"
            )
        needed = sum(weights) * TRAINING_BYTES_PER_WEIGHT
        if memory is not None and needed > memory / 2:
            raise DataError(
                f"heads of hidden layers {shape}: {sum(weights):,} weights, {needed / 2**30:,.1f} GiB while "
                f"training, over half this machine's {memory / 2**30:,.1f} GiB; use narrower layers "
                "(--hidden)"
            )


@contextmanager
def _timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    seconds[phase] = time.perf_counter() - started


@contextmanager
def _subnormals_flushed() -> Iterator[None]:
    """Saturated heads' gradients turn subnormal late in long fits, which x86 computes many times slower:
    flushed to 0 while training. The flag is the process's: restored afterwards (numpy, hypothesis and the
    caller's own code expect IEEE arithmetic)."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@dataclass(frozen=True)
class _Schedule:
    """How long the heads train: ``config.epochs`` at most, ``early_stopping`` on the validation loss, and
    ``time_limit`` seconds (None: none)."""

    config: TrainConfig
    early_stopping: EarlyStopping | None
    time_limit: float | None

    @classmethod
    def of(
        cls,
        config: TrainConfig,
        *,
        early_stopping: EarlyStopping | None,
        budget: Budget | None,
        train_size: int,
    ) -> _Schedule:
        """``config``'s epochs and ``early_stopping`` as given, or for a ``budget`` its epoch cap, early
        stopping and time limit for a training split of ``train_size`` samples."""
        if budget is None:
            return cls(config, early_stopping, None)
        config = replace(config, epochs=budget.max_epochs(train_size, config))
        return cls(config, budget.early_stopping(train_size, config), budget.seconds)


def _train(
    sets: EvaluationSets,
    data: MultiViewData,
    *,
    schedule: _Schedule,
    hidden: Sequence[tuple[int, ...]] | None,
    progress: bool | Progress | Callable[[int], Progress] | None,
) -> tuple[Trained, HeadChoice | None, TrainConfig]:
    """The served model: one head per view on the training split, stopped on the validation loss; with
    several candidate architectures (``hidden``; each with an equal share of the time limit), the one
    :func:`training.architecture.choose_heads` picks on the validation split. And the configuration it was
    trained with."""
    config = schedule.config
    candidates = [config.hidden] if hidden is None else [tuple(widths) for widths in hidden]
    share = None if schedule.time_limit is None else schedule.time_limit / len(candidates)
    trained, choice = choose_heads(
        lambda widths: _train_heads(
            sets,
            data.num_classes,
            replace(config, hidden=widths),
            schedule.early_stopping,
            share,
            _named(progress, _heads_label(widths, candidates)),
        ),
        candidates,
        sets.validation,
        sets.conflictive["validation"],
        method=config.method,
        lam=config.lam,
    )
    return trained, choice, replace(config, hidden=candidates[0] if choice is None else choice.chosen.hidden)


def _train_heads(
    sets: EvaluationSets,
    num_classes: int,
    config: TrainConfig,
    early_stopping: EarlyStopping | None,
    time_limit: float | None,
    progress: bool | Progress | Callable[[int], Progress] | None,
) -> Trained:
    """One head per view, as ``config`` says, on the training split, stopped on the validation loss."""
    return train_members(
        [list(sets.views.values())],
        [sets.everything.labels],
        num_classes=num_classes,
        config=config,
        seeds=[config.seed],
        rows=[sets.train.rows],
        present=[sets.present],
        validation=[sets.validation],
        early_stopping=early_stopping,
        time_limit=time_limit,
        progress=progress,
    )[0]


HeldOutEvidence = tuple[FusedSplit, CrossFitted | None]
"""Evidence of samples the served heads did not train on, fused as they serve (what the calibrations are
fitted on and the outvoted check measures), and the cross-fitting that made it, if any."""


@dataclass(frozen=True)
class _HeldOut:
    """How a model's held-out evidence is made: the clean validation split's, or where it is small every
    non-test sample's out of fold (:mod:`training.crossfit`; the fold models get a time limit of their own,
    as long as the served model's)."""

    sets: EvaluationSets
    num_classes: int
    config: TrainConfig
    seed: int
    progress: bool | Progress | Callable[[int], Progress] | None

    def __call__(self, trained: Trained, *, beta: float, time_limit: float | None) -> HeldOutEvidence:
        sets, config = self.sets, replace(self.config, beta=beta)
        plan = plan_cross_fitting(sets, num_classes=self.num_classes, seed=self.seed)
        if plan is None:
            return _fused(trained.heads, sets.validation, sets.conflictive["validation"], config=config), None
        epochs = trained.history.best_epoch
        cross_fitted = out_of_fold(
            plan,
            sets,
            num_classes=self.num_classes,
            config=config,
            epochs=epochs,
            time_limit=time_limit,
            progress=_labelled(self.progress, epochs, label=f"cross-fitting {plan.folds} models"),
        )
        return cross_fitted.split, cross_fitted


@dataclass(frozen=True)
class _Calibrated:
    """The heads kept (those trained, or trained again where outvoted), what they were trained with, and the
    calibrations fitted on their held-out evidence."""

    trained: Trained
    config: TrainConfig
    post_hoc: PostHoc
    outvoted: Outvoted | None
    cross_fitted: CrossFitted | None


def _calibrate(
    trained: Trained,
    held_out: _HeldOut,
    *,
    view_names: Sequence[str],
    schedule: _Schedule,
    outvoted_beta: float | None,
    target_false_positive_rate: float,
) -> _Calibrated:
    """The flag, the confidence and the prediction sets fitted on the held-out evidence of the heads kept:
    ``trained``, or where that evidence shows the fused model outvoted by its best view, the heads trained
    again with ``outvoted_beta`` if more accurate there (:func:`training.architecture.unless_outvoted`;
    None: never)."""
    config = held_out.config
    first = trained, held_out(trained, beta=config.beta, time_limit=schedule.time_limit)
    outvoted = None
    if outvoted_beta is not None:

        def train_again(beta: float) -> tuple[Trained, HeldOutEvidence]:
            again = _train_heads(
                held_out.sets,
                held_out.num_classes,
                replace(config, beta=beta),
                schedule.early_stopping,
                schedule.time_limit,
                _named(held_out.progress, f"training again with beta {beta:g}"),
            )
            return again, held_out(again, beta=beta, time_limit=schedule.time_limit)

        first, outvoted = unless_outvoted(
            first, train_again, lambda pair: pair[1][0], view_names, beta=outvoted_beta
        )
        if outvoted is not None and outvoted.kept:
            config = replace(config, beta=outvoted.beta)
    kept, (split, cross_fitted) = first
    post_hoc = calibrate(
        split,
        target_false_positive_rate=target_false_positive_rate,
        folds=None if cross_fitted is None else cross_fitted.folds,
        seed=held_out.seed,
    )
    return _Calibrated(kept, config, post_hoc, outvoted, cross_fitted)


@dataclass(frozen=True)
class _Evaluated:
    """The test split fused once, and what was measured on it."""

    test: FusedSplit
    evaluation: Evaluation
    comparison: Comparison
    metrics: Metrics


def _evaluate(
    heads: EvidentialHeads, sets: EvaluationSets, data: MultiViewData, *, config: TrainConfig, seed: int
) -> _Evaluated:
    """The paper's measures on the test split and its conflictive copies, and the comparison with each
    view's head alone and with a plain model of all views (:mod:`training.baseline`)."""
    test = _fused(heads, sets.test, sets.conflictive["test"], config=config)
    baseline = fit_baseline(sets, num_classes=data.num_classes, seed=seed)
    comparison = compare(
        test,
        data.view_names,
        baseline,
        class_names=data.class_names,
        class_weighting=config.class_weighting,
    )
    evaluation = measure(test)
    metrics = Metrics(
        acc_normal=evaluation.acc_normal,
        acc_conflict=evaluation.acc_conflict,
        auc=evaluation.auc,
        acc_all_samples=_accuracy_over_everything(heads, sets, num_classes=data.num_classes, config=config),
    )
    return _Evaluated(test, evaluation, comparison, metrics)


def _write(
    out: Path,
    heads: EvidentialHeads,
    sets: EvaluationSets,
    raw: dict[str, tuple[np.ndarray, np.ndarray]],
    report: FitReport,
    *,
    name: str,
    card: bool,
) -> Manifest:
    """The ONNX graphs (each checked against its head on the ``raw`` rows), the manifest and the card."""
    data = report.data
    return write_model(
        out,
        heads=heads,
        scaler=sets.scaler,
        parity={v: (raw[v][1], sets.views[v][raw[v][0]]) for v in data.view_names},
        manifest=lambda views: report.manifest(views, name=name),
        data=_data_path(data),
        extras=(lambda directory, written: write_card(directory, report, written)) if card else None,
    )


def _fused(
    heads: EvidentialHeads, clean: Samples, conflictive: Samples, *, config: TrainConfig
) -> FusedSplit:
    """A split and its conflictive copies, fused once as the model serves."""
    return FusedSplit.of_evidence(
        predict_evidence(heads, clean),
        clean.labels,
        method=config.method,
        lam=config.lam,
        present=clean.present,
        conflictive=(predict_evidence(heads, conflictive), conflictive.labels, conflictive.present),
    )


ACCURACY_VALUES = 2**18
"""Evidence values (samples x views x classes) fused at a time for the accuracy over every sample: fusing
them costs about 18 bytes each, and with many classes all samples at once outgrew the data many times
over."""


def _accuracy_over_everything(
    heads: EvidentialHeads, sets: EvaluationSets, *, num_classes: int, config: TrainConfig
) -> float:
    """The fused accuracy over every sample, training ones included (the manifest's ``acc_all_samples``),
    fused :data:`ACCURACY_VALUES` evidence values at a time."""
    everything, right = sets.everything, 0
    rows = max(1, ACCURACY_VALUES // (len(heads.heads) * num_classes))
    for start in range(0, len(everything), rows):
        stop = min(start + rows, len(everything))
        evidence = predict_evidence(heads, everything.features(start, stop))
        mask = None if sets.present is None else sets.present[start:stop]
        fused = fuse(opinion_from_evidence(evidence), config.method, lam=config.lam, mask=mask)
        right += round(accuracy(fused.probability, everything.labels[start:stop]) * (stop - start))
    return right / len(everything)


def _labelled(
    progress: bool | Progress | Callable[[int], Progress] | None, total: int, *, label: str
) -> bool | Progress | Callable[[int], Progress] | None:
    """A reporter like ``progress`` (a bar, lines, or reporters made per run) for another run of ``total``
    epochs, named ``label``."""
    if isinstance(progress, ProgressBar | ProgressLines):
        return progress_for(total, bar=isinstance(progress, ProgressBar), label=label)
    return _named(progress, label)


def _named(
    progress: bool | Progress | Callable[[int], Progress] | None, label: str
) -> bool | Progress | Callable[[int], Progress] | None:
    """``progress`` naming its runs ``label``, where it makes a reporter per run (:class:`Reporters`)."""
    return progress.labelled(label) if isinstance(progress, Reporters) else progress


def _heads_label(hidden: tuple[int, ...], candidates: Sequence[tuple[int, ...]]) -> str:
    """What a training run of heads of ``hidden`` widths is called, among ``candidates``."""
    kind = f"heads with hidden layers {','.join(map(str, hidden))}" if hidden else "linear heads"
    if len(candidates) == 1:
        return kind
    position = [tuple(widths) for widths in candidates].index(tuple(hidden)) + 1
    return f"{kind} ({position} of {len(candidates)})"


def _parity_rows(data: MultiViewData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per view, up to :data:`PARITY_ROWS` rows that have it, and copies of their raw features."""
    rows = {}
    for v, (name, matrix) in enumerate(data.views.items()):
        picked = np.flatnonzero(data.present[:, v])[:PARITY_ROWS]
        rows[name] = (picked, matrix[picked].copy())
    return rows


def _data_path(data: MultiViewData) -> Path | None:
    """Where ``data`` was read from, if it names a file or directory: no model is written into or over it."""
    return Path(data.source) if data.source and os.path.lexists(data.source) else None


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
) -> tuple[Manifest, FitReport]:
    """Fit a benchmark dataset as ``models/`` holds it: the paper's hyperparameters, ``config.epochs``
    epochs without early stopping, no card.

    ``config`` defaults to ``method``, ``lam``, the dataset's hyperparameters and ``seed``; the model's
    default fusion is the config's. ``out_dir`` is replaced only once everything is written and verified.
    """
    spec = dataset_spec(dataset_name)
    config = config or TrainConfig(method=method, lam=lam, hyperparameters=spec.hyperparameters, seed=seed)
    data = read_registered(spec, data_dir)
    return fit(
        data,
        out_dir,
        config=config,
        seed=seed,
        target_false_positive_rate=target_false_positive_rate,
        name=name or dataset_name,
    )
