"""The model card: ``card.md`` beside the manifest, with its figures as PNG.

A card is a sequence of sections; each is made by one function of :data:`SECTIONS` from what the fit measured
(:class:`training.report.FitReport`) and the manifest, as markdown text and the figures it shows. A new
section is one more function in that tuple. Every rate is given with its 95% interval (Clopper-Pearson), every
coverage with the range a correct method lands in.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from manifest import CalibrationSamples, Manifest
from training.architecture import Candidate, HeadChoice
from training.calibrate import REPORT_COVERAGES, CalibrationReport, class_coverage, evaluate_calibration
from training.data import MultiViewData
from training.export import CARD_FIGURES
from training.metrics import Rate, coverage_band
from training.protocol import EvaluationSets
from training.report import FitReport

__all__ = ["SECTIONS", "Figure", "Section", "write_card"]


@dataclass(frozen=True)
class Figure:
    """A PNG of the card: its file name, its caption, and how to draw it on a matplotlib figure."""

    file: str
    caption: str
    draw: Callable[[object], None]  # given a matplotlib Figure, draws on it
    size: tuple[float, float] = (5.0, 3.2)

    def __post_init__(self) -> None:
        # A model directory is told from a folder of pictures by its figures' names: name a new one there.
        if self.file not in CARD_FIGURES:
            raise ValueError(
                f"{self.file}: not among training.export.CARD_FIGURES, {', '.join(CARD_FIGURES)}"
            )


@dataclass(frozen=True)
class Section:
    title: str
    text: str
    figures: tuple[Figure, ...] = ()


SectionMaker = Callable[[FitReport, Manifest], Section | None]


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
    made = [section for section in made if section is not None]
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


FUSION_NAMES = {
    "bcf": "Belief constraint fusion",
    "cbf": "Cumulative belief fusion",
    "baf": "Belief averaging fusion",
    "gbaf": "Generalised belief averaging fusion",
    "dbf": "Discounted Belief Fusion",
}
"""Each fusion method's name (:data:`fusion.METHODS`)."""


def _fusion(method: str, lam: float) -> str:
    """``DBF, lambda 1``, or ``BCF``: lambda is DBF's alone, every other method fuses without it."""
    return method.upper() + (f", lambda {lam:g}" if method == "dbf" else "")


def _lambda(method: str, lam: float) -> str:
    """``lambda 1; `` for DBF, nothing for the methods that do not use it."""
    return f"lambda {lam:g}; " if method == "dbf" else ""


# -- the sections --------------------------------------------------------------------------------------------


def overview(report: FitReport, manifest: Manifest) -> Section:
    data, metrics, flag, comparison = report.data, manifest.metrics, manifest.conflict_flag, report.comparison
    views = ", ".join(f"`{view.name}` ({view.dim})" for view in manifest.views)
    flagged_clean, flagged_conflictive = report.post_hoc.raised(report.test)
    best, fusion = comparison.best_view, manifest.fusion
    text = (
        f"{FUSION_NAMES[fusion.method]} ({_fusion(fusion.method, fusion.lam)}) over "
        f"{len(manifest.views)} views: {views}; {len(manifest.classes)} classes. Trained on "
        f"`{data.source or data.name}` ({data.num_samples} samples).\n\n"
        f"On held-out test samples it is right {_rate(comparison.fused)} of the time (its best view alone, "
        f"`{best}`, {_percent(comparison.views[best].value)}; a logistic regression on all views "
        f"{_percent(comparison.baseline.accuracy.value)}); when one view of a sample is swapped for another "
        f"class's, {_percent(metrics.acc_conflict)}. Fused uncertainty tells such conflictive samples from "
        f"clean ones with AUROC {metrics.auc:.3f}, and the `high_conflict` flag raises on "
        f"{_rate(flagged_conflictive)} of them and {_rate(flagged_clean)} of clean ones "
        f"(target {_percent(flag.target_false_positive_rate)}). Brackets: 95% intervals.\n\n"
        "The service serves this directory from its model repository (`DBF_MODEL_DIR`, `models/` by "
        "default) once it reloads (`POST /v1/admin/reload`, or `DBF_RELOAD_POLL_SECONDS`), at "
        f"`/v1/models/{manifest.name}/predict`."
    )
    return Section("Summary", text)


def warnings(report: FitReport, manifest: Manifest) -> Section | None:
    """What to know before serving the model (:attr:`FitReport.warnings`); no section when all is well."""
    if not report.warnings:
        return None
    return Section("Warnings", "\n".join(f"- {_one_line(warning)}" for warning in report.warnings))


_MARKDOWN_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\`*_[]|#"})


def markdown_text(text: str) -> str:
    """``text`` (a class name: whatever the data held) as it reads in Markdown prose or a table cell:
    control characters as Python writes them (a line break would end the row or start a heading), the
    characters Markdown and HTML read escaped (a name could carry a table's bar, or a tag a renderer runs).

    >>> print(markdown_text("a|b"), markdown_text("x\\n# y"), markdown_text("<img src=x>"))
    a\\|b x\\\\n\\# y &lt;img src=x&gt;
    """
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return html.escape(shown.translate(_MARKDOWN_SPECIAL), quote=False)


def _one_line(text: str) -> str:
    """A warning as one list item: its line breaks as spaces, and no HTML a renderer would run (a class
    name in it is the data's)."""
    return html.escape(" ".join(text.splitlines()), quote=False)


def data_summary(report: FitReport, manifest: Manifest) -> Section:
    data, sets = report.data, report.sets
    counts = np.bincount(data.labels, minlength=data.num_classes)
    present = data.present
    rows = [
        f"| `{view.name}` | {view.dim} | {int(present[:, v].sum())} | {_percent(1 - present[:, v].mean())} |"
        for v, view in enumerate(manifest.views)
    ]
    views = "| view | features | samples with it | missing |\n|---|---|---|---|\n" + "\n".join(rows)
    classes = "| class | samples |\n|---|---|\n" + "\n".join(
        f"| {markdown_text(name)} | {int(count)} |"
        for name, count in zip(data.class_names, counts, strict=True)
    )
    split = "as the data's split column says" if data.split is not None else "stratified (70/10/20%)"
    text = (
        f"{data.num_samples} samples from `{data.source or data.name}`, split {split}: "
        f"{len(sets.train)} for training, {len(sets.validation)} for validation ({_validation_use(report)}), "
        f"{len(sets.test)} for testing. Features are min-max scaled with the training split's ranges, inside "
        "each view's ONNX graph.\n\n"
        f"{views}\n\n{classes}\n"
    )
    if not data.complete:
        text += (
            "\nA sample lacking a view is fused from the views it has, in training as in serving; "
            "conflictive copies are made of samples with two views or more "
            f"({len(sets.conflictive['test'])} of the {len(sets.test)} test samples).\n"
        )
    return Section("Data", text + _out_of_range(data, sets, manifest))


def _out_of_range(data: MultiViewData, sets: EvaluationSets, manifest: Manifest) -> str:
    """The validation and test views left out as far outside their training range, if any."""
    left_out = data.present & ~(data.present if sets.present is None else sets.present)
    if not left_out.any():
        return ""
    per_view = zip(manifest.views, left_out.sum(axis=0).tolist(), strict=True)
    counts = ", ".join(f"`{view.name}` {count}" for view, count in per_view if count)
    total = int(left_out.sum())
    views, lie, their = ("view", "lies", "its") if total == 1 else ("views", "lie", "their")
    return (
        f"\n{total} {views} of validation and test samples {lie} far outside {their} training range "
        f"(range excess above {manifest.out_of_range.threshold:g}: {counts}). As the service does, the fused "
        "model and each view's head are measured without them below (the logistic regression sees them).\n"
    )


def accuracy_table(report: FitReport, manifest: Manifest) -> Section:
    comparison, metrics, baseline = report.comparison, manifest.metrics, report.comparison.baseline
    rows = [f"| `{view}` alone | {_rate(rate)} | {rate.total} |" for view, rate in comparison.views.items()]
    conflictive = len(report.sets.conflictive["test"])
    rows += [
        f"| fused | **{_rate(comparison.fused)}** | {comparison.fused.total} |",
        f"| logistic regression on all views | {_rate(baseline.accuracy)} | {baseline.accuracy.total} |",
        f"| fused, conflictive copies | {_rate(_counted(metrics.acc_conflict, conflictive))} | "
        f"{conflictive} |",
        f"| fused, every sample (incl. training) | {_percent(metrics.acc_all_samples)} | "
        f"{report.data.num_samples} |",
    ]
    text = (
        "Accuracy on the held-out test split, with 95% intervals: each view's head alone (on the samples "
        "that have it), the fused prediction, and a plain model that sees all views at once: a multinomial "
        "logistic regression on the scaled views side by side (a missing view as 0), L2 strength "
        f"{baseline.regularisation:g} chosen on the validation split, fitted on {baseline.training_rows} "
        "training samples. A fit warns when the fused model is more than 1 point below its best view or 3 "
        "below the logistic regression.\n\n| | accuracy | samples |\n|---|---|---|\n" + "\n".join(rows)
    )
    return Section("Accuracy", text)


def conflict_detection(report: FitReport, manifest: Manifest) -> Section:
    flag, metrics, post_hoc = manifest.conflict_flag, manifest.metrics, report.post_hoc
    separation = ", ".join(f"{score} {value:.3f}" for score, value in flag.validation_auroc.items())
    fitted, fitted_on = post_hoc.raised(post_hoc.fitted), post_hoc.fitted_on
    test = post_hoc.raised(report.test)
    text = (
        "A conflictive copy of a test sample has one view replaced by that view of a sample of the next "
        "class (the paper's protocol). Fused uncertainty separates conflictive from clean test samples "
        f"with **AUROC {metrics.auc:.3f}** (0.5: not at all; 1: perfectly).\n\n"
        f"The `high_conflict` flag raises when `{flag.score}` >= {flag.threshold:.4g}: the threshold "
        f"{_flags(flag.target_false_positive_rate, fitted[0].value)}, on the score that flags "
        f"more conflictive ones there (AUROC {separation}), on {_samples(fitted_on)}. The test split "
        "measures the rates on new samples:\n\n"
        "| samples | clean samples flagged | conflictive samples flagged |\n|---|---|---|\n"
        f"| fitted on ({fitted_on.kind}) | {_rate(fitted[0])} of {fitted[0].total} | {_rate(fitted[1])} of "
        f"{fitted[1].total} |\n"
        f"| test | {_rate(test[0])} of {test[0].total} | {_rate(test[1])} of {test[1].total} |\n"
    )
    return Section("Conflict detection", text)


def _flags(target: float, fitted: float) -> str:
    """``that flags 5.0% of the clean samples``; where the samples fitted on cannot give the target (their
    scores tie at the threshold, or they are too few for it), what it flags there instead."""
    if _percent(target) == _percent(fitted):
        return f"that flags {_percent(target)} of the clean samples"
    return (
        f"set to flag {_percent(target)} of the clean samples, flags {_percent(fitted)} of them (their "
        "scores tie at it, or they are too few for the target)"
    )


def view_agreement(report: FitReport, manifest: Manifest) -> Section | None:
    """How often each view's top class is that of the other views fused, fitted on and on the test split: the
    baseline of the agreement alert, and where it fires."""
    rates = manifest.view_agreement
    if not rates:
        return None
    rows = []
    for view in manifest.views:
        if view.name not in rates:
            continue
        measured = rates[view.name]
        on_fitted = _counted(measured.clean, measured.samples)
        on_test = _counted(measured.test or 0.0, measured.test_samples or 0)
        rows.append(
            f"| `{view.name}` | {_rate_of(on_fitted)} | {_rate_of(on_test)} | {_percent(measured.chance)} | "
            f"{_percent(measured.alert_below)} |"
        )
    text = (
        "How often each view's own top class is that of the other views fused (their evidence summed), on "
        f"samples that have every view, on {_samples(report.post_hoc.fitted_on)} and on "
        "the test split, with 95% intervals; and the agreement of a view whose top class is independent of "
        "the others' (chance: what a view shuffled between samples tends to). No label is needed to count "
        "it, so the service does, per view (`dbf_view_agreed_total`, `dbf_view_compared_total`): a view "
        "failing within its training range (shuffled, stuck, turned to noise) agrees far less, even one the "
        "fused prediction follows, and the `DBFViewDisagreement` alert fires when a view's agreement falls "
        "below halfway from the low end of its clean rate's interval to chance (the last column). A view "
        "that dominates the others' consensus drags the views it is compared with down beside it; with two "
        "views the two agree or disagree together, and which one failed cannot be told.\n\n"
        "| view | agreement with the others, fitted on | agreement with the others, test | chance | "
        "alert below |\n|---|---|---|---|---|\n" + "\n".join(rows)
    )
    return Section("View agreement", text)


def _under_covered(measured: CalibrationReport, bands: dict[float, tuple[float, float]]) -> str:
    """Levels whose coverage lies below its range: a correct method lands there one time in 20, so the
    guarantee stated above did not show on this test split."""
    below = [c for c in sorted(measured.clean) if measured.clean[c].coverage < bands[c][0]]
    if not below:
        return ""
    shown = "; ".join(
        f"at {c:g}, {_percent(measured.clean[c].coverage)} (range [{100 * bands[c][0]:.1f}, "
        f"{100 * bands[c][1]:.1f}])"
        for c in below
    )
    return (
        f"\n**The sets held the true class less often than asked, below the range: {shown}.** A correct "
        "method lands there one time in 20; more often, the test samples differ from those the sets were "
        "calibrated on (a drift between the splits, or too few samples): check the coverage on your own "
        "data before relying on the level asked.\n"
    )


def _over_covered(measured: CalibrationReport, bands: dict[float, tuple[float, float]]) -> str:
    """Why coverage lies above its range, where it does: sets that never leave out the predicted class
    cover at least as often as the model is right, which may lie above the range; else the sets are larger
    than the test samples needed."""
    above = [c for c in sorted(measured.clean) if measured.clean[c].coverage > bands[c][1]]
    never_empty = not any(measured.clean[c].empty > 0 for c in above)
    floor = [c for c in above if never_empty and measured.accuracy > bands[c][1]]
    larger = [c for c in above if c not in floor]
    text = ""
    if floor:
        text += (
            f"\nAt {', '.join(f'{c:g}' for c in floor)} the sets cover more than the range: they always hold "
            "the predicted class (none is empty), so they hold the true class at least as often as the model "
            f"is right ({_percent(measured.accuracy)} here, above the range), whatever coverage is asked. "
            "That is the price of never answering an empty set, not a fault of the calibration.\n"
        )
    if larger:
        sizes = ", ".join(f"{measured.clean[c].mean_set_size:.2f} at {c:g}" for c in larger)
        text += (
            f"\nAt {', '.join(f'{c:g}' for c in larger)} the sets cover more than the range (mean size "
            f"{sizes}), more than the model's accuracy ({_percent(measured.accuracy)}) explains: the "
            "calibration samples called for larger sets than the test samples needed. The coverage asked "
            "for holds; the sets are less informative than they could be. Few calibration samples per "
            "class, or calibration samples unlike the test ones, do this; more data is the remedy.\n"
        )
    return text


def _under_covered_classes(report: FitReport, manifest: Manifest) -> str:
    """The classes the sets hold less often than the default coverage on the test split, beyond doubt (the
    95% interval below it): the guarantee is over all samples, not per class."""
    coverage = manifest.calibration.conformal.default_coverage
    rates = class_coverage(manifest.calibration, report.test, coverage=coverage)
    short = [
        f"{markdown_text(name)} ({_percent(rate.value)} of {rate.total} [{100 * rate.interval[0]:.1f}, "
        f"{100 * rate.interval[1]:.1f}])"
        for name, rate in zip(manifest.classes, rates, strict=True)
        if rate.total and rate.interval[1] < coverage
    ]
    if not short:
        return ""
    return (
        f"\nThe coverage is over all samples, not per class: at {coverage:g} the sets held the true class "
        f"less often, beyond chance, for {', '.join(short)}. Classes with few training samples are where "
        "this happens; more of their samples is the remedy.\n"
    )


def confidence_and_sets(report: FitReport, manifest: Manifest) -> Section:
    """Reliability of the projected probability and of the calibrated ``confidence``; the prediction sets'
    coverage against the level asked for (with the range a correct method lands in), and their size, clean
    and conflictive."""
    evaluation, section, fitted_on = report.evaluation, manifest.calibration, report.post_hoc.fitted_on
    measured = evaluate_calibration(section, report.test, coverages=REPORT_COVERAGES)  # the manifest's bins
    noise = report.confidence_noise
    before, after = measured.reliability_projected, measured.reliability_confidence

    def reliability_draw(canvas) -> None:
        axis = canvas.add_subplot()
        centres = (before.edges[:-1] + before.edges[1:]) / 2
        for diagram, label, colour in ((before, "projected probability", "C1"), (after, "confidence", "C0")):
            filled = diagram.count > 0
            axis.plot(
                diagram.mean_confidence[filled], diagram.accuracy[filled], "o-", color=colour, label=label
            )
        axis.plot([0, 1], [0, 1], "k--", linewidth=1, label="calibrated")
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_xticks(centres[::2].round(2))
        axis.set_xlabel("mean confidence in the bin")
        axis.set_ylabel("accuracy in the bin")
        axis.legend(fontsize=8, loc="upper left")

    levels = sorted(measured.clean)
    calibrated_on = fitted_on.samples if fitted_on.kind == "validation" else None  # split conformal's law
    bands = {c: coverage_band(measured.samples, c, calibration=calibrated_on) for c in levels}

    def coverage_draw(canvas) -> None:
        axis = canvas.add_subplot()
        axis.fill_between(
            levels, [bands[c][0] for c in levels], [bands[c][1] for c in levels], color="0.85", label="range"
        )
        axis.plot(levels, [measured.clean[c].coverage for c in levels], "o-", label="clean")
        if measured.conflictive is not None:
            axis.plot(levels, [measured.conflictive[c].coverage for c in levels], "o-", label="conflictive")
        axis.plot([min(levels), max(levels)], [min(levels), max(levels)], "k--", linewidth=1, label="asked")
        axis.set_xlabel("coverage asked for")
        axis.set_ylabel("share of sets holding the true class")
        axis.legend(fontsize=8)

    rows = "".join(
        f"| {c:g} | {_percent(measured.clean[c].coverage)} [{100 * bands[c][0]:.1f}, "
        f"{100 * bands[c][1]:.1f}] | {measured.clean[c].mean_set_size:.2f} | "
        + (
            f"{_percent(measured.conflictive[c].coverage)} | {measured.conflictive[c].mean_set_size:.2f} |\n"
            if measured.conflictive is not None
            else "n/a | n/a |\n"
        )
        for c in levels
    )
    text = (
        "How far the answers can be taken at their word, on the clean test split. The projected probability "
        f"of the predicted class has **ECE {measured.ece_projected:.3f}** (15 bins; Brier score "
        f"{evaluation.brier:.3f}, negative log-likelihood {evaluation.nll:.3f} over all classes); the "
        f"served `confidence` ({section.confidence.kind}) has **ECE {measured.ece_confidence:.3f}**, where a "
        f"perfectly calibrated confidence would score up to {noise:.3f} on these {measured.samples} samples "
        "(19 times in 20: an ECE below that cannot be told from sampling noise). The "
        f"prediction sets use the {section.conformal.score.kind.upper()} score (coverage "
        f"{section.conformal.default_coverage:g} unless a request asks for another). Both were fitted on "
        f"{_samples(fitted_on)}. {_guarantee(fitted_on)} On conflictive samples nothing is guaranteed: "
        "their coverage is measured only. In brackets, the range in which a correct method's coverage lands "
        f"on {measured.samples} test samples, 19 times in 20:\n\n"
        "| coverage asked | clean: covered | clean: mean set size | conflictive: covered | "
        "conflictive: mean set size |\n|---|---|---|---|---|\n"
        + rows
        + _over_covered(measured, bands)
        + _under_covered(measured, bands)
        + _under_covered_classes(report, manifest)
    )
    figures = (
        Figure(
            "reliability.png",
            "Reliability, clean test samples, before and after calibration",
            reliability_draw,
        ),
        Figure(
            "coverage.png",
            "Prediction sets: coverage against the level asked for, test samples",
            coverage_draw,
        ),
    )
    return Section("Calibration: confidence and prediction sets", text, figures)


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
            axis.plot(
                history.validation_epochs, history.validation_loss, label="validation (KL fully annealed)"
            )
            axis.axvline(history.best_epoch, color="k", linestyle=":", linewidth=1, label="kept")
        axis.set_xlabel("epoch")
        axis.set_ylabel("loss")
        axis.legend(fontsize=8)

    if report.early_stopping is None:
        stopping = f"{history.epochs} epochs"
    else:
        ending = "stopped early" if history.stopped_early else "reached the maximum"
        ending = "reached the time limit" if history.timed_out else ending
        stopping = (
            f"{history.epochs} of at most {config.epochs} epochs ({ending}; patience "
            f"{report.early_stopping.patience}), keeping epoch {history.best_epoch}'s heads, the best on the "
            "validation loss"
        )
    if history.still_improving:
        limit = "time limit" if history.timed_out else "epoch cap"
        stopping += (
            f". **The {limit} ended training while the validation loss was still improving** (best epoch "
            "within the last patience): more epochs or time may fit better"
        )
    total = sum(report.seconds.values())
    activation = "capped exponential" if config.activation == "exp" else "softplus"
    strictness = _lambda(config.method, config.lam)
    text = (
        f"One head per view ({_architecture(config.hidden)}{_choice(report.choice)}{_outvoted(report)}) with "
        f"the {activation} evidence activation, trained "
        f"with the paper's loss fused by {config.method.upper()} ({strictness}each view's own "
        f"term weighted {config.beta:g}{_class_weighting(config.class_weighting)}): learning rate "
        f"{hp.lr:g}, KL annealing over {hp.annealing_step} epochs, gamma {hp.gamma:g}, weight decay "
        f"{hp.weight_decay:g}, batch {config.batch_size}, seeds {report.seed} (split) and {config.seed} "
        f"(weights). {stopping}. {total:.0f} s in all "
        f"({', '.join(f'{phase} {value:.1f} s' for phase, value in report.seconds.items())})."
    )
    figure = Figure("training.png", "Loss per epoch", draw)
    return Section("Training", text, (figure,))


def _class_weighting(weighting: str) -> str:
    """How the training loss weighed the classes, as a clause of the Training section."""
    return {
        "none": "; every sample alike",
        "sqrt": "; each sample by the inverse square root of its class's share",
        "balanced": "; each sample by the inverse of its class's share",
    }[weighting]


SECTIONS: tuple[SectionMaker, ...] = (
    overview,
    warnings,
    data_summary,
    accuracy_table,
    conflict_detection,
    view_agreement,
    confidence_and_sets,
    uncertainty,
    training,
)
"""The card's sections, in order; a maker may return None where it has nothing to say."""


def _architecture(hidden: tuple[int, ...]) -> str:
    if not hidden:
        return "linear"
    layers = "a hidden layer" if len(hidden) == 1 else "hidden layers"
    return f"{layers} of {', '.join(map(str, hidden))} units"


def _choice(choice: HeadChoice | None) -> str:
    """How the heads were chosen, where ``fit`` chose."""
    if choice is None:
        return ""
    others = ", ".join(
        f"{_measured(c)} with {_architecture(c.hidden)}" for c in choice.candidates if c is not choice.chosen
    )
    return (
        f"; chosen for its fused validation accuracy, {_measured(choice.chosen)}, against {others}; a hidden "
        "layer is kept only where more accurate"
    )


def _outvoted(report: FitReport) -> str:
    """Whether the heads were trained again because the fused model was outvoted by its best view."""
    o = report.outvoted
    if o is None:
        return ""
    outcome = "kept" if o.kept else "not kept: no more accurate"
    return (
        f"; trained again with each view's own term weighted {o.beta:g}, as the fused model was below its "
        f"best view `{o.best_view}` on {_held_out(report)} ({_rate_of(o.fused)} against "
        f"{_rate_of(o.best_view_accuracy)}): {_rate_of(o.again)}, {outcome}"
    )


def _held_out(report: FitReport) -> str:
    """The samples the outvoted check measured on: those the calibrations are fitted on."""
    if report.cross_fitted is None:
        return "the validation split"
    return f"every non-test sample, out of fold ({report.cross_fitted.folds} models)"


def _measured(candidate: Candidate) -> str:
    return f"{_rate_of(candidate.accuracy)} (conflict AUROC {candidate.auroc:.2f})"


def _percent(value: float) -> str:
    """``4.3%``; a rate under 0.1% with two significant digits (a target of 0.01% is not 0.0%)."""
    if np.isnan(value):
        return "n/a"
    return f"{100 * value:.2g}%" if 0 < value < 0.001 else f"{100 * value:.1f}%"


def _rate(rate: Rate) -> str:
    """``97.3% [95.5, 98.5]``: the rate and its 95% Clopper-Pearson interval, in percent."""
    if not rate.total:
        return "n/a"
    low, high = rate.interval
    return f"{_percent(rate.value)} [{100 * low:.1f}, {100 * high:.1f}]"


def _rate_of(rate: Rate) -> str:
    """``44.0% [24.4, 65.1] of 25``: :func:`_rate` and the samples it rests on, for a rate in running text."""
    return f"{_rate(rate)} of {rate.total}"


def _counted(value: float, total: int) -> Rate:
    """The rate ``value`` of ``total`` samples, as counts."""
    return Rate(round(value * total), total)


def _samples(fitted_on: CalibrationSamples) -> str:
    if fitted_on.kind == "validation":
        return f"the {fitted_on.samples} clean validation samples"
    return (
        f"the out-of-fold evidence of all {fitted_on.samples} non-test samples (cross-fitted, the validation "
        f"split being small: {fitted_on.folds} models trained like this one, each without its fold)"
    )


def _guarantee(fitted_on: CalibrationSamples) -> str:
    if fitted_on.kind == "validation":
        return (
            "Split conformal: for samples like the clean ones, a set holds the true class with probability "
            "at least the coverage asked for."
        )
    # CV+'s bound is for sets made with the fold models' own scores of a new sample; the served model is
    # another one, held to their threshold: measurement backs it, not the theory (training/crossfit.py).
    return (
        "Cross-conformal (Barber et al. 2021, CV+): for samples like the clean ones, theory guarantees the "
        f"{fitted_on.folds} fold models' own sets a coverage of at least 1 - 2 (1 - c) for a level c (0.8 "
        "for 0.9), and in practice they cover close to c; the served model is held to their threshold "
        "without a guarantee of its own, trained like them on other samples: its coverage on the test "
        "split, below, is what backs it."
    )


def _validation_use(report: FitReport) -> str:
    if report.post_hoc.fitted_on.kind == "validation":
        return "early stopping and the calibration"
    return "early stopping; the calibration is cross-fitted on the training and validation samples"
