"""The fit-quality benchmark runs end to end on one small data set (a smoke test of its table and JSON: the
figures must be figures, whatever the fit's quality), and its intervals are the right ones."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fit_datasets import load
from benchmarks.fit_quality import clopper_pearson, coverage_range
from training.metrics import coverage_band
from training.protocol import stratified_split

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"\d+\.\d+"
RANGE = rf"\[{NUMBER}, {NUMBER}\]"
SPREAD = rf"{NUMBER} {RANGE}"


def test_one_data_set_one_seed_gives_a_row_per_table_and_every_run_in_json(tmp_path):
    out = tmp_path / "results.json"
    command = [sys.executable, "-m", "benchmarks.fit_quality", "--seeds", "1", "--datasets", "wine"]
    command += ["--fit-args", "--epochs 20", "--out", str(out)]
    printed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    ).stdout

    assert re.search(
        rf"^wine\s+178\s+2\s+{SPREAD}\s+{SPREAD} \((chemistry|colour)\)\s+{SPREAD}\s+{SPREAD}\s+{SPREAD}"
        rf"\s+[01]/[01]\s+{NUMBER}$",
        printed,
        re.M,
    ), printed
    percent = rf"\s*{NUMBER}% \[\s*{NUMBER},\s*{NUMBER}\]"
    assert re.search(
        rf"^wine\s+{SPREAD}\s+{percent}\s+{percent}\s+{SPREAD}\s+{NUMBER}\s+{SPREAD}\s+\S+",
        printed,
        re.M,
    ), printed
    results = json.loads(out.read_text())
    (run,) = results["runs"]
    assert run["dataset"] == "wine" and run["seed"] == 0 and "error" not in run
    assert run["outvoted"] is None or set(run["outvoted"]) >= {"best_view", "kept", "held_out_accuracy"}
    assert set(run["heads"]) == set(run["view_baselines"]) == {"chemistry", "colour"}
    fractions = [
        run["fused"],
        run["baseline"],
        run["averaged_views_baseline"],
        run["auroc"],
        run["coverage"],
        run["ece"],
        *run["heads"].values(),
        *run["view_baselines"].values(),
        run["flag"]["clean"],
        run["flag"]["conflictive"],
    ]
    assert all(0 <= f <= 1 for f in fractions), run
    assert run["fused"] == pytest.approx(run["manifest_fused"])  # the exported model is the fitted one
    train, validation, test = stratified_split(load("wine").labels, seed=0)  # what fit splits for seed 0
    assert run["test_samples"] == run["conflictive_samples"] == test.size
    # the manifest's conformal scores: wine's validation split is small, so every non-test sample's,
    # cross-fitted
    assert run["calibration_samples"] == train.size + validation.size
    assert run["epochs"] == 20 and run["seconds"] > 0 and 1 <= run["mean_set_size"] <= 3
    (summary,) = results["summaries"]
    low, high = summary["coverage_range"]
    assert 0 <= low < run["coverage_level"] < high <= 1
    assert summary["flag_clean_interval"][0] <= run["flag"]["clean"] <= summary["flag_clean_interval"][1]
    assert set(summary["missed"]) <= {"view", "base", "flag", "cov"}


def test_one_run_coverage_range_is_the_beta_binomial_one():
    run = {"calibration_samples": 33, "test_samples": 67, "coverage_level": 0.9}
    assert coverage_range([run]) == pytest.approx(coverage_band(67, 0.9, calibration=33))


def test_coverage_range_narrows_over_seeds_around_the_level():
    run = {"calibration_samples": 60, "test_samples": 120, "coverage_level": 0.9}
    one, five = coverage_range([run]), coverage_range([run] * 5)
    assert one[0] < five[0] < 0.9 < five[1] < one[1]


def test_clopper_pearson_holds_the_rate_and_reaches_zero_at_no_successes():
    low, high = clopper_pearson(5, 100)
    assert low < 0.05 < high
    assert clopper_pearson(0, 30)[0] == 0.0
