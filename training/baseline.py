"""What a fused model is compared with, on its own test split: each view's head alone, and a plain model
that sees all views at once.

* Each view's head alone is free: the fused model's own heads, each judged on the test samples that have its
  view (:func:`compare`).
* The plain model (:func:`fit_baseline`) is a multinomial logistic regression on the views' scaled features
  side by side, a missing view 0 (the training minimum, as the heads see it), L2-regularised with whichever
  strength of :data:`REGULARISATION` gives the lowest log loss on the validation split, fitted by L-BFGS on at
  most :data:`BASELINE_ROWS` training samples (a seeded draw beyond that, so that time and memory stay bounded
  whatever the data). It is what a team would try first and what the issue's comparison used; the same
  evidential training on concatenated features would cost about as much as the heads' own, where this takes
  a few seconds (docs/benchmarks.md).

:meth:`Comparison.warnings` says when the fused model is below its best view by more than
:data:`BEST_VIEW_MARGIN`, or below the plain model by more than :data:`BASELINE_MARGIN`, and what to try.

Examples
--------
>>> from training.data import synthetic
>>> from training.protocol import evaluation_sets
>>> sets = evaluation_sets(synthetic(300, num_classes=3, seed=0), seed=0)
>>> baseline = fit_baseline(sets, num_classes=3, seed=0)
>>> baseline.accuracy.value, baseline.accuracy.total, baseline.training_rows
(1.0, 60, 210)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fusion import projected_probability
from training.calibrate import FusedSplit
from training.metrics import Rate
from training.protocol import EvaluationSets, Samples

__all__ = [
    "BASELINE_MARGIN",
    "BASELINE_ROWS",
    "BEST_VIEW_MARGIN",
    "REGULARISATION",
    "Baseline",
    "Comparison",
    "accuracies",
    "compare",
    "fit_baseline",
]

REGULARISATION = (1e-1, 1e-2, 1e-3, 1e-4)
"""L2 strengths tried (per sample: the loss is the mean log loss plus ``l2 / 2 * |W|^2``), strongest first,
each fit starting from the previous one's weights."""

BASELINE_ROWS = 10_000
"""The most training (and validation) samples the plain model is fitted on."""

BEST_VIEW_MARGIN = 0.01
BASELINE_MARGIN = 0.03
"""How far below its best view alone, and below the plain model, the fused model's test accuracy may be
before a fit warns."""

FLAWLESS_VIEW_SAMPLES = 50
"""The fewest test samples on which a view's head alone right on every one makes a fit ask whether the view
leaks the label (on fewer, an easy view often is: iris' petals on 30)."""

_CHUNK_ROWS = 4096  # test samples scored at a time: their features side by side stay small


@dataclass(frozen=True)
class Baseline:
    """The plain model's accuracy on the test split, and how it was fitted."""

    accuracy: Rate
    regularisation: float
    training_rows: int


@dataclass(frozen=True)
class Comparison:
    """On the same test samples: the fused model, each view's head alone, and the plain model."""

    fused: Rate
    views: dict[str, Rate]  # on the test samples that have the view
    baseline: Baseline
    commonest: dict[str, float]  # per view: the share of the commonest class among the samples that have it
    classes: dict[str, Rate]  # per class: how often the fused model is right on its test samples (recall)
    # The fused model on the test samples some view is fused for (None: all of them): what its views are
    # compared with (a sample whose every view is out of range is fused from none, whatever the heads).
    fused_from_views: Rate | None = None
    # How the training weighed each class's samples (``TrainConfig.class_weighting``): advice names only
    # weightings not already used.
    class_weighting: str = "none"

    @property
    def best_view(self) -> str:
        """The view whose head alone is right most often, among those with test samples (the first view
        where none has any)."""
        tested = [view for view in self.views if self.views[view].total] or list(self.views)
        return max(tested, key=lambda view: np.nan_to_num(self.views[view].value, nan=-1.0))

    @property
    def commonest_share(self) -> float:
        """The share of the commonest class among all test samples: always answering it is right so often."""
        largest = max((rate.total for rate in self.classes.values()), default=0)
        return largest / max(self.fused.total, 1)

    def warnings(self) -> list[str]:
        """Where the fused model falls short of a simpler one, with what to try."""
        fused, best, notes = self.fused.value, self.views[self.best_view].value, []
        from_views = fused if self.fused_from_views is None else self.fused_from_views.value
        low, high = self.fused.interval
        if self.fused.total and low <= self.commonest_share:
            notes.append(
                f"the fused model is right on {fused:.1%} [{low:.1%}, {high:.1%}] of test samples, "
                f"{_no_better(fused, self.commonest_share)} always answering the commonest class "
                f"({self.commonest_share:.1%}): check `--views`, the labels, and that each class has enough "
                "samples"
            )
        notes += self._neglected_classes()
        if from_views < best - BEST_VIEW_MARGIN:
            notes.append(
                f"the fused model is right on {from_views:.1%} of test samples{self._from_some_view()}, "
                f"below its best view alone (`{self.best_view}`: {best:.1%}): another view may be useless or "
                "misleading; try `--views` without it, `--beta 0.1` (the fused answer first), `--hidden` for "
                "heads that fit more, or more data"
            )
        plain = self.baseline.accuracy.value
        if fused < plain - BASELINE_MARGIN:
            notes.append(self._below_baseline(fused, plain))
        return notes + self._views_like_the_commonest_class() + self._flawless_views()

    def _from_some_view(self) -> str:
        """What the fused accuracy compared with the views is measured on, where not every test sample."""
        if self.fused_from_views is None or self.fused_from_views.total == self.fused.total:
            return ""
        return f" that some view is fused for ({self.fused_from_views.total} of {self.fused.total})"

    def _flawless_views(self) -> list[str]:
        """The views whose head alone is right on every one of at least :data:`FLAWLESS_VIEW_SAMPLES` test
        samples: real features seldom are, and a feature written from the label (a class's code, a field
        filled in after the outcome) is, until it is served on data where it is not there to read."""
        flawless = [
            f"`{view}` ({rate.total} of {rate.total})"
            for view, rate in self.views.items()
            if rate.total >= FLAWLESS_VIEW_SAMPLES and rate.count == rate.total
        ]
        if not flawless:
            return []
        return [
            f"{', '.join(flawless)} alone is right on every test sample that has it: check that no "
            "feature of it is written from the label or after the outcome (an identifier per class, a field "
            "a later step fills in), which the served model would not find in new data; if the task is this "
            "easy, ignore this"
        ]

    def _views_like_the_commonest_class(self) -> list[str]:
        """The views whose head alone is not shown better than always answering the commonest class of the
        test samples that have it. Where even a head right on every one of them would not be (few samples,
        nearly all of one class: a probe's 55, 96.4% of one), the comparison says nothing of the view: one
        note says so, rather than one per view suggesting to leave it out (that probe's best view, right on
        all 55 and on both of the rare class, was told it may carry nothing)."""
        notes, unjudged = [], []
        for view, rate in self.views.items():
            low, high = rate.interval
            if not rate.total or low > self.commonest[view]:
                continue
            if Rate(rate.total, rate.total).interval[0] <= self.commonest[view]:
                unjudged.append(f"`{view}` ({rate.value:.1%} of {rate.total})")
                continue
            notes.append(
                f"`{view}` alone is right on {rate.value:.1%} [{low:.1%}, {high:.1%}] of the test samples "
                f"that have it, {_no_better(rate.value, self.commonest[view])} always answering their "
                f"commonest class ({self.commonest[view]:.1%}): it may carry nothing its head can use (an "
                "identifier, a constant, noise, or too little data); if so, leave it out with `--views`"
            )
        if unjudged:
            notes.append(
                f"the test split cannot tell {', '.join(unjudged)} alone from always answering the commonest "
                "class: so few of its samples are of the other classes that even a head right on every one "
                "would not be shown better (the 95% interval of its accuracy would reach that class's "
                "share); judge the views on more data"
            )
        return notes

    def _below_baseline(self, fused: float, plain: float) -> str:
        """The warning for a fused model well below the plain model. Where every view's head is as far below
        it, the views are weak alone and strong together: fusing per-view opinions adds up their evidence,
        where a model of all features adds up their log-odds, and neither DBF nor averaging per-view logistic
        regressions came near it on such data (docs/data/defaults.md); joining the views is what helps."""
        said = (
            f"the fused model is right on {fused:.1%} of test samples, well below a logistic regression on "
            f"all views ({plain:.1%})"
        )
        best = self.views[self.best_view].value
        if best < plain - BASELINE_MARGIN:
            return (
                f"{said}, and so is each view's head alone (the best, `{self.best_view}`, {best:.1%}): the "
                "views are weak alone and strong together, which fusing per-view opinions does not match; "
                "where some views are parts of one modality (an image's regions, one sensor's channels), "
                "join their features into one view; else try `--hidden` for heads that fit more, or more data"
            )
        return (
            f"{said}: try `--hidden` for heads that fit more, `--views` to leave out a useless view, or more "
            "data"
        )

    def _neglected_classes(self) -> list[str]:
        """The classes the fused model gets right far less often than the others, beyond chance: on
        imbalanced data a model can answer the commonest classes alone, and its accuracy hide it."""
        overall = self.fused.interval[0]
        neglected = [
            (name, rate) for name, rate in self.classes.items() if rate.total and rate.interval[1] < overall
        ]
        if not neglected:
            return []
        shown = "; ".join(
            f"`{name}` {rate.value:.1%} [{rate.interval[0]:.1%}, {rate.interval[1]:.1%}] of {rate.total}"
            for name, rate in neglected[:_NEGLECTED_SHOWN]
        )
        more = f" and {len(neglected) - _NEGLECTED_SHOWN} more" if len(neglected) > _NEGLECTED_SHOWN else ""
        sizes = [rate.total for rate in self.classes.values() if rate.total]
        rarer = np.mean([rate.total for _, rate in neglected]) < np.mean(sizes)
        weighting = (
            "more samples of these, or `--hidden` for heads that fit more, may help (each class's samples "
            "already weigh as much in all)"
            if self.class_weighting == "balanced"
            else "more samples of these, `--class-weighting balanced` to weigh each class's samples as much "
            "in all, or `--hidden` for heads that fit more, may help"
        )
        why = (
            f"it favours the commonest classes; {weighting}"
            if rarer
            else "they are no rarer than the others, but harder to tell apart with these views: more samples "
            "of them, or `--hidden` for heads that fit more, may help"
        )
        return [
            f"the fused model is right on {self.fused.value:.1%} of test samples, but far less often on "
            f"{len(neglected)} of the {len(self.classes)} classes ({shown}{more}): {why}"
        ]


_NEGLECTED_SHOWN = 5


def _no_better(accuracy: float, commonest: float) -> str:
    """How an accuracy whose 95% interval reaches the commonest class's share compares with it: "no better
    than" where it is measured at or below it; above it, the test split cannot tell them apart, and saying
    "no better" would contradict the figure beside it."""
    return "no better than" if accuracy <= commonest else "not clearly better than"


def compare(
    test: FusedSplit,
    view_names: Sequence[str],
    baseline: Baseline,
    *,
    class_names: Sequence[str],
    class_weighting: str = "none",
) -> Comparison:
    """The fused model and each of its views' heads alone on the test split ``test`` (fused by
    :meth:`FusedSplit.of_evidence`, which keeps the views' opinions), against ``baseline``; and how often
    the fused model is right on each class. ``class_weighting``: how the heads' training weighed each
    class's samples."""
    fused, views = accuracies(test, view_names)
    present = np.ones((test.labels.size, len(view_names)), bool) if test.present is None else test.present
    from_views, _ = accuracies(test, view_names, from_views=True)
    commonest = {
        name: float(np.bincount(test.labels[present[:, v]], minlength=1).max() / max(present[:, v].sum(), 1))
        for v, name in enumerate(view_names)
    }
    right = np.argmax(projected_probability(test.clean), axis=-1) == test.labels
    classes = {name: Rate.of(right[test.labels == c]) for c, name in enumerate(class_names)}
    return Comparison(
        fused=fused,
        views=views,
        baseline=baseline,
        commonest=commonest,
        classes=classes,
        fused_from_views=from_views,
        class_weighting=class_weighting,
    )


def accuracies(
    split: FusedSplit, view_names: Sequence[str], *, from_views: bool = False
) -> tuple[Rate, dict[str, Rate]]:
    """How often the fused model, and each view's head alone (on the samples that have its view), is right
    on ``split`` (fused by :meth:`FusedSplit.of_evidence`, which keeps the views' opinions). ``from_views``:
    the fused model on the samples some view is fused for only, as the views are compared with it (one
    whose every view is out of range is answered from none: no head can be right or wrong there)."""
    right = np.argmax(projected_probability(split.views), axis=-1) == split.labels[:, None]  # (N, V)
    present = np.ones(right.shape, bool) if split.present is None else split.present
    fused_right = np.argmax(projected_probability(split.clean), axis=-1) == split.labels
    fused = Rate.of(fused_right[present.any(axis=1)] if from_views else fused_right)
    return fused, {name: Rate.of(right[present[:, v], v]) for v, name in enumerate(view_names)}


def fit_baseline(sets: EvaluationSets, *, num_classes: int, seed: int) -> Baseline:
    """Fit the plain model on ``sets``' training split, choose its regularisation on the validation split,
    and measure it on the test split."""
    rng = np.random.default_rng(seed)
    train, validation = (_drawn(samples, rng) for samples in (sets.train, sets.validation))
    x, y = _side_by_side(train), torch.from_numpy(train.labels)
    x_validation, y_validation = _side_by_side(validation), torch.from_numpy(validation.labels)
    layer = nn.Linear(x.shape[1], num_classes)
    nn.init.zeros_(layer.weight)  # the objective is convex: start where every class is as likely
    nn.init.zeros_(layer.bias)
    chosen, best, fitted = REGULARISATION[0], np.inf, layer
    for l2 in REGULARISATION:
        layer = _fit_softmax(x, y, l2=l2, start=layer)
        loss = _log_loss(layer, x_validation, y_validation)
        if loss < best:
            chosen, best, fitted = l2, loss, layer
    with torch.no_grad():
        predicted = [
            fitted(_side_by_side(sets.test, start, start + _CHUNK_ROWS)).argmax(dim=1).numpy()
            for start in range(0, len(sets.test), _CHUNK_ROWS)
        ]
    right = np.concatenate(predicted) == sets.test.labels
    return Baseline(accuracy=Rate.of(right), regularisation=chosen, training_rows=len(train))


def _drawn(samples: Samples, rng: np.random.Generator) -> Samples:
    """``samples``, or a seeded draw of :data:`BASELINE_ROWS` of them."""
    if len(samples) <= BASELINE_ROWS:
        return samples
    keep = np.sort(rng.choice(len(samples), BASELINE_ROWS, replace=False))
    present = None if samples.present is None else samples.present[keep]
    return Samples(samples.views, samples.rows[keep], samples.labels[keep], present)


def _side_by_side(samples: Samples, start: int = 0, stop: int | None = None) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(samples.features(start, stop), axis=1))


def _fit_softmax(x: torch.Tensor, y: torch.Tensor, *, l2: float, start: nn.Linear) -> nn.Linear:
    """A linear layer whose softmax minimises the mean log loss plus ``l2 / 2`` times the squared weights
    (not the bias), by L-BFGS from ``start``'s weights. In torch, on fit's one thread: numpy's BLAS threads
    on a busy machine made a small fit's baseline take most of the fit's time."""
    layer = nn.Linear(*start.weight.shape[::-1])
    layer.load_state_dict(start.state_dict())
    optimizer = torch.optim.LBFGS(layer.parameters(), max_iter=500, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(layer(x), y) + l2 / 2 * layer.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(objective)
    return layer


def _log_loss(layer: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.cross_entropy(layer(x), y))
