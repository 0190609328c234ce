"""Exported models' views against the other views fused: the manifest's ``view_agreement`` measured afresh,
and how a broken view shows in it (the table of ``docs/operations/alerts.md``).

``python -m training view-agreement models/handwritten ... --data-dir DIR`` rebuilds each model's validation
and test splits exactly as its export made them (:func:`training.protocol.evaluation_sets` for the
manifest's seed), runs the exported ONNX heads on the raw features, and fuses as the service does: a view
out of its training range (the manifest's ``out_of_range``) is fused as missing. ``--write`` puts the
measured section into each manifest (the heads, and every other figure, untouched); ``--failures`` prints,
for each view broken in turn on the test split (shuffled between samples; all zeros, or the view's training
mean where zeros are out of range; Gaussian noise of each feature's training mean and spread), each view's
agreement with the others, whether it falls below the alert's threshold (halfway from the low end of its
clean rate's interval to its chance level: ``ViewAgreement.alert_below``), the share of samples out of
range, and the accuracy.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from manifest import Manifest
from training.calibrate import FusedSplit, agreeing_views, view_agreement
from training.export import (
    STAGED_MANIFEST_PREFIX,
    benchmark_model,
    exported_evidence,
    exported_range_excess,
)
from training.protocol import EvaluationSets, Samples, evaluation_sets
from training.readers import read_registered

__all__ = ["failure_table", "measured_agreement", "write_agreement"]


def measured_agreement(directory: str | os.PathLike[str], data_dir: str | os.PathLike[str]) -> Manifest:
    """The model's manifest with its ``view_agreement`` measured on its validation and test splits.

    Raises
    ------
    ValueError
        Where the calibration was cross-fitted: its out-of-fold evidence came from fold models that were not
        kept, so the clean rate cannot be measured afresh on the samples it was calibrated on.
    """
    directory = Path(directory)
    manifest, _, _ = benchmark_model(directory)
    fitted_on = manifest.calibration.fitted_on if manifest.calibration is not None else None
    if fitted_on is not None and fitted_on.kind != "validation":
        raise ValueError(f"{directory}: calibrated on cross-fitted evidence; fit the model again instead")
    model = _Exported(directory, data_dir)
    validation, test = model.fused(model.sets.validation), model.fused(model.sets.test)
    names = [view.name for view in manifest.views]
    return manifest.model_copy(update={"view_agreement": view_agreement(validation, names, test=test)})


def write_agreement(directory: str | os.PathLike[str], data_dir: str | os.PathLike[str]) -> Manifest:
    """:func:`measured_agreement`, written into the model's ``manifest.json``."""
    manifest = measured_agreement(directory, data_dir)
    _replace_manifest(Path(directory) / "manifest.json", manifest.json_text().encode())
    return manifest


def _replace_manifest(path: Path, content: bytes) -> None:
    """Make ``content`` the manifest ``path``, whole or not at all: written beside it under a hidden name
    (which the service's watcher does not read, and a fit replaces with the model), then renamed over it.
    Written in place, a write that failed half-way (a full disk, a kill) left a truncated manifest: a served
    model that no longer loaded."""
    path = path.resolve()  # a linked manifest: its target rewritten, as written in place it was
    handle, staged = tempfile.mkstemp(prefix=STAGED_MANIFEST_PREFIX, dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(staged, stat.S_IMODE(path.stat().st_mode))  # mkstemp's 0600 would hide it from the service
        os.replace(staged, path)
    except BaseException as error:
        Path(staged).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OSError(error.errno, f"{path}: not written ({error.strerror}); it is as it was") from error
        raise


FAILURES = ("shuffled", "constant", "noise")


def failure_table(
    model_dirs: Sequence[str | os.PathLike[str]], data_dir: str | os.PathLike[str], *, seed: int = 0
) -> str:
    """The markdown table: per model, per view broken in turn, per failure (:data:`FAILURES`), the accuracy,
    the broken view's agreement on the test split against clean and its threshold, its share of samples out
    of range, and the views the alert names (or, where none, the view nearest its threshold). Each model's
    manifest must have its ``view_agreement``."""
    rows = []
    for directory in map(Path, model_dirs):
        manifest, _, _ = benchmark_model(directory)
        if manifest.view_agreement is None:
            raise ValueError(f"{directory}: the manifest has no view_agreement section")
        model = _Exported(directory, data_dir)
        clean = model.measure(model.raw_test())
        for v, view in enumerate(manifest.views):
            for failure in FAILURES:
                features, what = model.broken(view.name, failure, np.random.default_rng(seed))
                rows.append(_row(manifest, v, what, clean, model.measure(features)))
    return (
        "| model | view broken | how | accuracy: clean → broken | the view's agreement: clean → broken "
        "(alert below) | out of range | DBFViewDisagreement names |\n|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


@dataclasses.dataclass(frozen=True)
class _Measured:
    accuracy: float
    out_of_range: np.ndarray  # (V,) share of samples
    agreement: np.ndarray  # (V,) share of compared samples; NaN where never compared


def _row(manifest: Manifest, v: int, how: str, clean: _Measured, broken: _Measured) -> str:
    names = [view.name for view in manifest.views]
    thresholds = {
        u: manifest.view_agreement[name].alert_below
        for u, name in enumerate(names)
        if name in manifest.view_agreement
    }
    below = [u for u, threshold in thresholds.items() if broken.agreement[u] < threshold]  # NaN: never
    named = ", ".join(f"{names[u]} ({_share(broken.agreement[u])})" for u in below)
    if not below:
        nearest = min(thresholds, key=lambda u: broken.agreement[u] / thresholds[u])
        named = (
            f"none (nearest: {names[nearest]} {_share(broken.agreement[nearest])}, alert below "
            f"{_share(thresholds[nearest])})"
        )
    return (
        f"| {manifest.name} | {names[v]} | {how} | {_share(clean.accuracy)} → {_share(broken.accuracy)} | "
        f"{_share(clean.agreement[v])} → {_share(broken.agreement[v])} ({_share(thresholds[v])}) | "
        f"{_share(broken.out_of_range[v])} | {named} |"
    )


def _share(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{100 * value:.1f}%"


class _Exported:
    """An exported model with its dataset's splits, as its export made them, and the service's fusion."""

    def __init__(self, directory: Path, data_dir: str | os.PathLike[str]) -> None:
        self.directory = directory
        self.manifest, spec, split_seed = benchmark_model(directory)
        data = read_registered(spec, data_dir)
        self.raw = dict(data.views)  # the ONNX heads scale inside: they take the raw features
        self.sets: EvaluationSets = evaluation_sets(data, seed=split_seed, conflictive=("validation", "test"))

    def raw_features(self, samples: Samples) -> dict[str, np.ndarray]:
        features = dataclasses.replace(samples, views=self.raw).features()
        return dict(zip(self.raw, features, strict=True))

    def raw_test(self) -> dict[str, np.ndarray]:
        return self.raw_features(self.sets.test)

    def fused(self, samples: Samples) -> FusedSplit:
        """``samples`` fused as the service fuses them (a view out of range as missing)."""
        return self._fused(self.raw_features(samples), samples.labels, samples.present)

    def _fused(self, features: dict[str, np.ndarray], labels: np.ndarray, present) -> FusedSplit:
        evidence = exported_evidence(self.directory, features)
        excess = exported_range_excess(self.directory, features)
        fused_views = ~(excess > self.manifest.out_of_range.threshold) & ~np.isnan(excess)
        if present is not None:
            fused_views &= present
        evidence[~fused_views] = 0.0
        fusion = self.manifest.fusion
        split = FusedSplit.of_evidence(
            evidence, labels, method=fusion.method, lam=fusion.lam, present=fused_views
        )
        return dataclasses.replace(split, present=fused_views)

    def measure(self, features: dict[str, np.ndarray]) -> _Measured:
        test = self.sets.test
        split = self._fused(features, test.labels, test.present)
        agreed, compared = agreeing_views(split)
        with np.errstate(invalid="ignore"):
            agreement = agreed.sum(0) / compared.sum(0)
        present = np.ones_like(split.present) if test.present is None else test.present
        out_of_range = (present & ~split.present).sum(0) / present.sum(0)
        accuracy = float(np.mean(split.clean.belief.argmax(-1) == test.labels))
        return _Measured(accuracy, out_of_range, np.where(compared.sum(0) > 0, agreement, np.nan))

    def broken(self, view: str, failure: str, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], str]:
        """The test split's raw features with ``view`` broken by ``failure``, and what was done."""
        features = self.raw_test()
        clean = features[view]
        training = self.raw_features(self.sets.train)[view]
        make: dict[str, Callable[[], np.ndarray]] = {
            "shuffled": lambda: clean[rng.permutation(len(clean))],
            "noise": lambda: rng.normal(training.mean(0), training.std(0), size=clean.shape),
        }
        what = failure
        if failure == "constant":
            zeros = np.zeros_like(clean)
            out = exported_range_excess(self.directory, {**features, view: zeros})
            column = [v.name for v in self.manifest.views].index(view)
            in_range = np.mean(out[:, column] <= self.manifest.out_of_range.threshold) > 0.5
            make["constant"] = (
                (lambda: zeros) if in_range else (lambda: np.tile(training.mean(0), (len(clean), 1)))
            )
            what = "zeros" if in_range else "training mean (zeros: out of range)"
        return {**features, view: make[failure]().astype(np.float32)}, what
