"""How exported models' calibration does on their test split: the tables of ``results/calibration.md``.

``python -m training calibration models/handwritten models/pie ... --data-dir DIR`` rebuilds each model's
test split exactly as its export made it (its dataset from the registry, the protocol's split and
conflictive copies for the manifest's seed), runs the exported ONNX heads on the raw features as the
service does, fuses with the model's fusion, and measures the manifest's calibration: ECE of the
projected probability and of ``confidence``; the prediction sets' coverage and size at each level, on
clean samples, on their conflictive copies, and on clean samples with one view left out (where nothing is
guaranteed: the calibration samples were complete). A coverage is printed with the 95% range that a
correct split-conformal calibration of that size gives on that many test samples (for a cross-fitted one,
that of a coverage of exactly the level), and with its mean over random re-splits of the same samples into
calibration and test sets of the same sizes (one split is one draw: a correct method lands outside its 95%
range one time in 20).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from manifest import Manifest
from training.calibrate import REPORT_COVERAGES, FusedSplit, confidence_noise, evaluate_calibration
from training.export import benchmark_model, exported_evidence
from training.metrics import coverage_band
from training.protocol import Samples, evaluation_sets
from training.readers import read_registered
from training.registry import DatasetSpec

LEVELS = (0.9, 0.95)


def calibration_tables(
    model_dirs: Sequence[str | os.PathLike[str]], data_dir: str | os.PathLike[str], *, seed: int = 1
) -> str:
    """The markdown tables for the models in ``model_dirs`` (``seed`` picks the view each sample of the
    missing-view measurement loses)."""
    summary, sets = [], []
    for directory in map(Path, model_dirs):
        manifest, spec, split_seed = benchmark_model(directory)
        if manifest.calibration is None:
            raise ValueError(f"{directory}: the manifest has no calibration section (schema version 1)")
        validation, test, missing = _splits(directory, manifest, spec, split_seed, data_dir, seed=seed)
        section = manifest.calibration
        report = evaluate_calibration(section, test, coverages=REPORT_COVERAGES)
        without = evaluate_calibration(section, missing, coverages=LEVELS)
        n, m = len(section.conformal.calibration_scores), report.samples
        noise = confidence_noise(section, test)
        summary.append(
            f"| {manifest.name} | {n} / {m} | {section.confidence.kind} | {section.conformal.score.kind} | "
            f"{report.ece_projected:.3f} | **{report.ece_confidence:.3f}** | {noise:.3f} |"
        )
        split_conformal = section.fitted_on is None or section.fitted_on.kind == "validation"
        for level in LEVELS:
            clean, conflictive = report.clean[level], report.conflictive[level]
            low, high = coverage_band(m, level, calibration=n if split_conformal else None)
            resplit = _resplit_coverage(section, validation, test, level)
            sets.append(
                f"| {manifest.name} | {level:g} | **{clean.coverage:.3f}** [{low:.3f}, {high:.3f}] | "
                f"{resplit:.3f} | {clean.mean_set_size:.2f} | {clean.singleton:.2f} | "
                f"{conflictive.coverage:.3f} | {conflictive.mean_set_size:.2f} | "
                f"{conflictive.singleton:.2f} | "
                f"{without.clean[level].coverage:.3f} | {without.clean[level].mean_set_size:.2f} |"
            )
    return (
        "| model | calibration / test samples | confidence | set score | ECE projected probability | "
        "ECE confidence | ECE noise (p95) |\n|---|---|---|---|---|---|---|\n"
        + "\n".join(summary)
        + "\n\n| model | coverage asked | clean: covered [95% range] | re-split: mean covered | clean: mean "
        "size | clean: one class | conflictive: covered | conflictive: mean size | conflictive: one class | "
        "one view missing: covered | one view missing: mean size |\n"
        + "|---" * 11
        + "|\n"
        + "\n".join(sets)
        + "\n"
    )


def _resplit_coverage(
    section, validation: FusedSplit, test: FusedSplit, level: float, draws: int = 200
) -> float:
    """The mean coverage at ``level`` over random re-splits of the validation and test samples into
    calibration and test sets of their sizes, with the model's nonconformity score."""
    from calibration import calibration_scores, prediction_set

    score = section.applied().score
    probability = np.concatenate([_projected(validation), _projected(test)])
    labels = np.concatenate([validation.labels, test.labels])
    n, rng, covered = len(validation.labels), np.random.default_rng(0), []
    for _ in range(draws):
        order = rng.permutation(len(labels))
        calibration, held_out = order[:n], order[n:]
        scores = calibration_scores(probability[calibration], labels[calibration], score=score)
        members = prediction_set(probability[held_out], scores, coverage=level, score=score)
        covered.append(members[np.arange(held_out.size), labels[held_out]].mean())
    return float(np.mean(covered))


def _projected(split: FusedSplit) -> np.ndarray:
    from calibration import scaled_probability

    return scaled_probability(split.clean.belief, split.clean.uncertainty, temperature=1.0)


def _splits(
    directory: Path,
    manifest: Manifest,
    spec: DatasetSpec,
    split_seed: int,
    data_dir: str | os.PathLike[str],
    *,
    seed: int,
) -> tuple[FusedSplit, FusedSplit, FusedSplit]:
    """The model's validation split and its test split (made by ``split_seed``) fused as served (clean and
    conflictive), and the test split's clean samples with one view (drawn by ``seed``) left out."""
    data = read_registered(spec, data_dir)
    raw = dict(data.views)  # the ONNX heads scale inside: they take the raw features
    sets = evaluation_sets(
        data,
        seed=split_seed,
        conflictive=("validation", "test"),
        out_of_range_above=manifest.out_of_range.threshold,
    )
    method, lam = manifest.fusion.method, manifest.fusion.lam

    def evidence(samples: Samples) -> np.ndarray:
        features = dataclasses.replace(samples, views=raw).features()
        return exported_evidence(directory, dict(zip(raw, features, strict=True)))

    clean, copies = sets.test, sets.conflictive["test"]
    test_evidence = evidence(clean)
    test = FusedSplit.of_evidence(
        test_evidence,
        clean.labels,
        method=method,
        lam=lam,
        present=clean.present,
        conflictive=(evidence(copies), copies.labels, copies.present),
    )
    present = np.ones(test_evidence.shape[:2], dtype=bool) if clean.present is None else clean.present.copy()
    several = np.flatnonzero(present.sum(axis=1) >= 2)
    rng = np.random.default_rng(seed)
    for i in several:
        present[i, rng.choice(np.flatnonzero(present[i]))] = False
    missing = FusedSplit.of_evidence(
        test_evidence[several], clean.labels[several], method=method, lam=lam, present=present[several]
    )
    checked = sets.validation
    validation = FusedSplit.of_evidence(
        evidence(checked), checked.labels, method=method, lam=lam, present=checked.present
    )
    return validation, test, missing
