"""The model card: ``card.md`` beside the manifest, with its figures as PNG.

A card is a sequence of sections; each is made by one function of :data:`SECTIONS` from what the fit measured
(:class:`training.fit.FitReport`) and the manifest, as markdown text and the figures it shows. A new section
(say, reliability before and after a confidence calibration, or the coverage of conformal sets) is one more
function in that tuple.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusion import fuse, opinion_from_evidence, projected_probability
from manifest import Manifest
from training.fit import FitReport
from training.metrics import reliability

__all__ = ["SECTIONS", "Figure", "Section", "write_card"]


@dataclass(frozen=True)
class Figure:
    """A PNG of the card: its file name, its caption, and how to draw it on a matplotlib figure."""

    file: str
    caption: str
    draw: Callable[[object], None]  # given a matplotlib Figure, draws on it
    size: tuple[float, float] = (5.0, 3.2)


@dataclass(frozen=True)
class Section:
    title: str
    text: str
    figures: tuple[Figure, ...] = ()


SectionMaker = Callable[[FitReport, Manifest], Section]


def write_card(
    directory: str | os.PathLike[str],
    report: FitReport,
    manifest: Manifest,
    *,
    sections: Sequence[SectionMaker] | None = None,
) -> list[Path]:
    """Write ``card.md`` and its figures into ``directory``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    directory = Path(directory)
    made = [make(report, manifest) for make in (SECTIONS if sections is None else sections)]
    parts = [f"# Model card: {manifest.name}\n"]
    written = []
    for section in made:
        parts.append(f"## {section.title}\n\n{section.text.strip()}\n")
        for figure in section.figures:
            canvas = plt.figure(figsize=figure.size)
            figure.draw(canvas)
            canvas.tight_layout()
            canvas.savefig(directory / figure.file, dpi=100, metadata={"Software": None})
            plt.close(canvas)
            written.append(directory / figure.file)
            parts.append(f"![{figure.caption}]({figure.file})\n\n*{figure.caption}*\n")
    (directory / "card.md").write_text("\n".join(parts))
    return [directory / "card.md", *written]


# -- the sections --------------------------------------------------------------------------------------------


def overview(report: FitReport, manifest: Manifest) -> Section:
    data, metrics, flag = report.data, manifest.metrics, manifest.conflict_flag
    views = ", ".join(f"`{view.name}` ({view.dim})" for view in manifest.views)
    text = (
        f"Discounted Belief Fusion ({manifest.fusion.method.upper()}, lambda {manifest.fusion.lam:g}) over "
        f"{len(manifest.views)} views: {views}; {len(manifest.classes)} classes. Trained on "
        f"`{data.source or data.name}` ({data.num_samples} samples).\n\n"
        f"On held-out test samples it is right {_percent(metrics.acc_normal)} of the time; when one view "
        f"of a sample is swapped for another class's, {_percent(metrics.acc_conflict)}. Fused uncertainty "
        f"tells such conflictive samples from clean ones with AUROC {metrics.auc:.3f}, and the "
        f"`high_conflict` flag raises on {_percent(flag.test.conflictive)} of them and "
        f"{_percent(flag.test.clean)} of clean ones.\n\n"
        "The service serves this directory from its model repository (`DBF_MODEL_DIR`, `models/` by "
        "default) once it reloads (`POST /v1/admin/reload`, or `DBF_RELOAD_POLL_SECONDS`), at "
        f"`/v1/models/{manifest.name}/predict`."
    )
    return Section("Summary", text)


def data_summary(report: FitReport, manifest: Manifest) -> Section:
    data, sets = report.data, report.sets
    counts = np.bincount(data.labels, minlength=data.num_classes)
    present = np.ones((data.num_samples, len(data.views)), bool) if sets.present is None else sets.present
    rows = [
        f"| `{view.name}` | {view.dim} | {int(present[:, v].sum())} | {_percent(1 - present[:, v].mean())} |"
        for v, view in enumerate(manifest.views)
    ]
    views = "| view | features | samples with it | missing |\n|---|---|---|---|\n" + "\n".join(rows)
    classes = "| class | samples |\n|---|---|\n" + "\n".join(
        f"| {name} | {int(count)} |" for name, count in zip(data.class_names, counts, strict=True)
    )
    split = "as the data's split column says" if data.split is not None else "stratified (70/10/20%)"
    text = (
        f"{data.num_samples} samples from `{data.source or data.name}`, split {split}: "
        f"{len(sets.train)} for training, {len(sets.validation)} for validation (early stopping and the "
        f"flag's calibration), {len(sets.test)} for testing. Features are min-max scaled with the training "
        "split's ranges, inside each view's ONNX graph.\n\n"
        f"{views}\n\n{classes}\n"
    )
    if not data.complete:
        text += (
            "\nA sample lacking a view is fused from the views it has, in training as in serving; "
            "conflictive copies are made of samples with two views or more "
            f"({len(sets.conflictive['test'])} of the {len(sets.test)} test samples).\n"
        )
    return Section("Data", text)


def accuracy_table(report: FitReport, manifest: Manifest) -> Section:
    evidence, test = report.evidence["test"], report.sets.test
    opinions = opinion_from_evidence(evidence)
    predicted = np.argmax(projected_probability(opinions), axis=-1)  # (N, V)
    present = np.ones(predicted.shape, bool) if test.present is None else test.present
    rows = []
    for v, view in enumerate(manifest.views):
        has = present[:, v]
        correct = float(np.mean(predicted[has, v] == test.labels[has])) if has.any() else float("nan")
        rows.append(f"| `{view.name}` alone | {_percent(correct)} | {int(has.sum())} |")
    metrics = manifest.metrics
    rows += [
        f"| fused | **{_percent(metrics.acc_normal)}** | {len(test)} |",
        f"| fused, conflictive copies | {_percent(metrics.acc_conflict)} | "
        f"{len(report.sets.conflictive['test'])} |",
        f"| fused, every sample (incl. training) | {_percent(metrics.acc_all_samples)} | "
        f"{report.data.num_samples} |",
    ]
    text = (
        "Accuracy on the held-out test split: each view's head alone (on the samples that have it), then the "
        "fused prediction.\n\n| | accuracy | samples |\n|---|---|---|\n" + "\n".join(rows)
    )
    return Section("Accuracy", text)


def conflict_detection(report: FitReport, manifest: Manifest) -> Section:
    flag, metrics = manifest.conflict_flag, manifest.metrics
    separation = ", ".join(f"{score} {value:.3f}" for score, value in flag.validation_auroc.items())
    text = (
        "A conflictive copy of a test sample has one view replaced by that view of a sample of the next "
        "class (the paper's protocol). Fused uncertainty separates conflictive from clean test samples "
        f"with **AUROC {metrics.auc:.3f}** (0.5: not at all; 1: perfectly).\n\n"
        f"The `high_conflict` flag raises when `{flag.score}` >= {flag.threshold:.4f}: the score that "
        f"separated better on the validation split (AUROC {separation}), with the threshold that flags "
        f"{_percent(flag.target_false_positive_rate)} of clean validation samples.\n\n"
        "| split | clean samples flagged | conflictive samples flagged |\n|---|---|---|\n"
        f"| validation | {_percent(flag.validation.clean)} | {_percent(flag.validation.conflictive)} |\n"
        f"| test | {_percent(flag.test.clean)} | {_percent(flag.test.conflictive)} |\n"
    )
    return Section("Conflict detection", text)


def calibration(report: FitReport, manifest: Manifest) -> Section:
    evaluation = report.evaluation
    fused = fuse(
        opinion_from_evidence(report.evidence["test"]),
        manifest.fusion.method,
        lam=manifest.fusion.lam,
        mask=report.sets.test.present,
    )
    probability = np.clip(fused.probability, 0.0, 1.0)
    confidence, accuracy, count = reliability(probability, report.sets.test.labels, bins=10)

    def draw(canvas) -> None:
        axis = canvas.add_subplot()
        filled = count > 0
        centres = (np.arange(10) + 0.5) / 10
        axis.bar(centres[filled], accuracy[filled], width=0.09, alpha=0.7, label="accuracy in the bin")
        axis.plot(centres[filled], confidence[filled], "o", color="C1", label="mean confidence in the bin")
        axis.plot([0, 1], [0, 1], "k--", linewidth=1, label="calibrated")
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_xlabel("confidence (largest projected probability)")
        axis.set_ylabel("accuracy")
        axis.legend(fontsize=8, loc="upper left")

    text = (
        "How far the fused probabilities can be taken at their word, on the clean test split: expected "
        f"calibration error **ECE {evaluation.ece:.3f}** (15 bins), Brier score {evaluation.brier:.3f}, "
        f"negative log-likelihood {evaluation.nll:.3f}."
    )
    figure = Figure("reliability.png", "Reliability diagram, clean test samples (10 confidence bins)", draw)
    return Section("Calibration", text, (figure,))


def uncertainty(report: FitReport, manifest: Manifest) -> Section:
    evaluation = report.evaluation

    def draw(canvas) -> None:
        axis = canvas.add_subplot()
        bins = np.linspace(0, 1, 41)
        axis.hist(evaluation.u_normal, bins=bins, alpha=0.6, density=True, label="clean")
        axis.hist(evaluation.u_conflict, bins=bins, alpha=0.6, density=True, label="conflictive")
        axis.set_xlim(0, 1)
        axis.set_xlabel("fused uncertainty")
        axis.set_ylabel("density")
        axis.legend(fontsize=8)

    views = ", ".join(
        f"`{view.name}` {u:.3f}" for view, u in zip(manifest.views, evaluation.view_uncertainty, strict=True)
    )
    text = (
        f"Mean fused uncertainty: {evaluation.uncertainty_normal:.3f} on clean test samples, "
        f"{evaluation.uncertainty_conflict:.3f} on their conflictive copies. Mean uncertainty of each view "
        f"alone on clean samples: {views}."
    )
    figure = Figure("uncertainty.png", "Fused uncertainty, clean vs conflictive test samples", draw)
    return Section("Uncertainty", text, (figure,))


def training(report: FitReport, manifest: Manifest) -> Section:
    history, config = report.history, report.config
    hp = config.hyperparameters

    def draw(canvas) -> None:
        axis = canvas.add_subplot()
        epochs = np.arange(1, history.epochs + 1)
        axis.plot(epochs, history.train_loss, label="training")
        if history.validation_loss:
            axis.plot(epochs, history.validation_loss, label="validation (KL fully annealed)")
            axis.axvline(history.best_epoch, color="k", linestyle=":", linewidth=1, label="kept")
        axis.set_xlabel("epoch")
        axis.set_ylabel("loss")
        axis.legend(fontsize=8)

    if report.early_stopping is None:
        stopping = f"{history.epochs} epochs"
    else:
        ending = "stopped early" if history.stopped_early else "reached the maximum"
        stopping = (
            f"{history.epochs} of at most {config.epochs} epochs ({ending}; patience "
            f"{report.early_stopping.patience}), keeping epoch {history.best_epoch}'s heads, the best on the "
            "validation loss"
        )
    total = sum(report.seconds.values())
    text = (
        f"One {'linear head' if not config.hidden else 'network'} per view with the "
        f"{'capped exponential' if config.activation == 'exp' else 'softplus'} evidence activation, trained "
        f"with the paper's loss fused by {config.method.upper()} (lambda {config.lam:g}): learning rate "
        f"{hp.lr:g}, KL annealing over {hp.annealing_step} epochs, gamma {hp.gamma:g}, weight decay "
        f"{hp.weight_decay:g}, batch {config.batch_size}, seeds {report.seed} (split) and {config.seed} "
        f"(weights). {stopping}. {total:.0f} s in all "
        f"({', '.join(f'{phase} {value:.1f} s' for phase, value in report.seconds.items())})."
    )
    figure = Figure("training.png", "Loss per epoch", draw)
    return Section("Training", text, (figure,))


SECTIONS: tuple[SectionMaker, ...] = (
    overview,
    data_summary,
    accuracy_table,
    conflict_detection,
    calibration,
    uncertainty,
    training,
)
"""The card's sections, in order."""


def _percent(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{100 * value:.1f}%"
