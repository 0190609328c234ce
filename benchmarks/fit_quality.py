"""Fit quality: does ``python -m training fit`` with its defaults make models a team would ship?

For each data set of :mod:`benchmarks.fit_datasets` and each seed, the data set is written as a user brings
it (``<view>.npy``, ``labels.txt``, ``classes.txt``) with ``split.txt``: the seed's stratified train /
validation / test split (:func:`training.protocol.stratified_split`, the split fit draws itself for that
seed), so that the test samples are known. A child process runs ``python -m training fit --data DIR --out
OUT --seed S --split-column split --quiet`` with fit's defaults (and ``--fit-args``), single-threaded. Then,
on the test split:

fused
    The exported ONNX heads on the raw features, fused with the manifest's fusion (:func:`fusion.fuse`), as
    the service answers: a view far out of its training range (the manifest's ``out_of_range``) fused as
    missing, the label the fused belief's top class.
best head
    Each view's exported head alone, on the test samples that have the view in range: the best one's
    accuracy in each run, and the view best on average.
baseline, best view LR, views averaged LR
    scikit-learn's ``LogisticRegressionCV`` (C from 10 values by 5-fold cross-validated accuracy, refitted
    on train + validation; min-max scaled, a missing view imputed by its mean there): on all views
    concatenated, on each view alone (the best view's accuracy), and each view's alone with their class
    probabilities averaged over the views a sample has: late fusion by averaging, as DBF's is, of heads as
    well fitted as a logistic regression can be. Where it is well below the baseline, the views are each
    weak and no averaging fusion reaches the model that sees them all; where the fused model is well below
    it, the heads are.
AUROC, flag, coverage, set size, ECE
    The manifest's test figures: AUROC of "is conflictive" scored by fused uncertainty on the clean test
    samples and their conflictive copies; the share of each the high-conflict flag raises; the conformal
    sets' coverage and mean size at the default coverage (0.9); ECE of ``confidence``.
again
    In how many fits the heads were trained again because the fused model was outvoted by its best view
    (``training.outvoted`` in the manifest), and in how many of those the second heads were kept.
s/fit
    Wall time of the fit command, start-up included.

The table shows each figure's mean over the seeds with [min, max]. The flag's rates come with the 95%
Clopper-Pearson interval of the counts pooled over the seeds; the coverage with the 95% range that the mean
coverage of a correct split-conformal procedure, calibrated on the same numbers of samples, falls in.
Marked where the issue's targets are missed: ``view`` fused below the best head - 1 point; ``base`` fused
below the baseline - 3 points; ``flag`` the flag's clean rate outside [2%, 10%] (a 5% target) on a data set
of 300 samples or more; ``cov`` coverage outside its range. Every run goes to ``--out`` (JSON). Asserts
nothing.

    python -m benchmarks.fit_quality [--seeds 5] [--datasets a,b] [--jobs 1] [--out results.json]
        [--fit-args "--epochs 20"] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.fit_datasets import DATASETS, load, write_npy_directory
from calibration import conformal_rank
from fusion import fuse, opinion_from_evidence
from manifest import Manifest
from training.data import SPLIT_NAMES, MultiViewData
from training.export import exported_evidence, exported_range_excess
from training.metrics import accuracy
from training.protocol import stratified_split

ROOT = Path(__file__).resolve().parents[1]

VIEW_MARGIN = 0.01
"""Fused accuracy may be this far below the best view's head alone."""
BASELINE_MARGIN = 0.03
"""Fused accuracy may be this far below the all-views baseline."""
FLAG_CLEAN_RANGE = (0.02, 0.10)
"""Where the flag's clean test rate should lie for its 5% target ..."""
FLAG_MIN_SAMPLES = 300
"""... on a data set of at least this many samples."""
TEST = SPLIT_NAMES.index("test")

_SINGLE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


# -- one run -------------------------------------------------------------------------------------------------


def run(name: str, data: MultiViewData, seed: int, workdir: Path, fit_args: list[str]) -> dict:
    """Fit ``data`` with the command for ``seed`` and measure the model on its test split (module notes).

    A fit that fails is recorded with its error's last lines, not raised: the other runs go on.
    """
    split = np.empty(data.num_samples, dtype=np.int64)
    for code, rows in enumerate(stratified_split(data.labels, seed=seed)):
        split[rows] = code
    directory = write_npy_directory(data, workdir / f"seed-{seed}" / name, split=split)
    out = workdir / f"seed-{seed}" / f"{name}-model"
    command = [sys.executable, "-m", "training", "fit", "--data", str(directory), "--out", str(out)]
    command += ["--seed", str(seed), "--split-column", "split", "--quiet", *fit_args]
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **_SINGLE_THREAD}, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    record: dict = {"dataset": name, "seed": seed, "samples": data.num_samples, "seconds": seconds}
    if done.returncode != 0:
        return {**record, "error": "\n".join(done.stderr.strip().splitlines()[-5:])}
    manifest = Manifest.model_validate_json((out / "manifest.json").read_text())
    return {**record, **_exported_figures(data, split, out, manifest), **_manifest_figures(manifest)}


def _exported_figures(data: MultiViewData, split: np.ndarray, model: Path, manifest: Manifest) -> dict:
    """Fused and per-view accuracy of the exported heads, and the baselines', on the test split."""
    test = np.flatnonzero(split == TEST)
    labels = data.labels[test]
    order = [entry.name for entry in manifest.views]  # the model's view order: fit sorts the files' names
    present = data.present[test][:, [data.view_names.index(view) for view in order]]
    # a missing view's NaN row would make NaN evidence, which the mask would not hide: any finite row will do
    raw = {view: np.nan_to_num(data.views[view][test]) for view in order}
    present &= exported_range_excess(model, raw) <= manifest.out_of_range.threshold  # fused as missing
    opinion = opinion_from_evidence(exported_evidence(model, raw))
    fused = fuse(opinion, manifest.fusion.method, lam=manifest.fusion.lam, mask=present)
    heads = {
        view: accuracy(opinion.probability[present[:, v], v], labels[present[:, v]])
        for v, view in enumerate(order)
    }
    fitted = np.flatnonzero(split != TEST)
    alone = {view: _logistic_regression(data, [view], fitted, test) for view in data.view_names}
    view_baselines = {}
    for view, probability in alone.items():
        has_view = ~np.isnan(probability[:, 0])
        view_baselines[view] = accuracy(probability[has_view], labels[has_view])
    averaged = np.nanmean(np.stack(list(alone.values())), axis=0)  # over the views each sample has
    return {
        "fused": float(np.mean(fused.belief.argmax(-1) == labels)),  # the served label
        "heads": heads,
        "baseline": accuracy(_logistic_regression(data, list(data.view_names), fitted, test), labels),
        "view_baselines": view_baselines,
        "averaged_views_baseline": accuracy(averaged, labels),
        "test_samples": int(test.size),
        "conflictive_samples": int((present.sum(axis=1) >= 2).sum()),  # fit copies those with two views
        "missing": data.missing_rates(),
    }


def _logistic_regression(
    data: MultiViewData, views: list[str], fitted: np.ndarray, test: np.ndarray
) -> np.ndarray:
    """Class probabilities ``(test rows, K)`` of the baseline on ``views`` concatenated, trained on the
    ``fitted`` rows; a view alone is trained on the rows that have it, and its rows of test samples without
    it are NaN."""
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler

    features = np.concatenate([data.views[view] for view in views], axis=1)
    probability = np.full((test.size, data.num_classes), np.nan)
    tested = np.ones(test.size, dtype=bool)
    if len(views) == 1:
        has_view = ~np.isnan(features[:, 0])
        fitted, tested = fitted[has_view[fitted]], has_view[test]
    model = make_pipeline(
        SimpleImputer(strategy="mean"),
        MinMaxScaler(),
        LogisticRegressionCV(
            Cs=10, cv=5, l1_ratios=(0.0,), scoring="accuracy", max_iter=10_000, use_legacy_attributes=False
        ),
    )
    model.fit(features[fitted], data.labels[fitted])
    rows = np.flatnonzero(tested)
    probability[rows[:, None], model.classes_] = model.predict_proba(features[test[tested]])
    probability[rows] = np.nan_to_num(probability[rows])  # a class absent from the fitted rows: never
    return probability


def _manifest_figures(manifest: Manifest) -> dict:
    """What the fit measured on its test split and wrote into the manifest."""
    flag, calibration = manifest.conflict_flag, manifest.calibration
    return {
        "manifest_fused": manifest.metrics.acc_normal,
        "auroc": manifest.metrics.auc,
        "flag": {"score": flag.score, "clean": flag.test.clean, "conflictive": flag.test.conflictive},
        "coverage": calibration.test.coverage,
        "coverage_level": calibration.conformal.default_coverage,
        "calibration_samples": len(calibration.conformal.calibration_scores),
        "mean_set_size": calibration.test.mean_set_size,
        "ece": calibration.test.ece_confidence,
        "epochs": manifest.training.get("epochs"),
        "outvoted": manifest.training.get("outvoted"),
    }


# -- over seeds ----------------------------------------------------------------------------------------------


def clopper_pearson(successes: int, trials: int) -> tuple[float, float]:
    """The exact 95% interval of a binomial proportion (:func:`training.metrics.rate_interval`)."""
    from training.metrics import rate_interval

    return rate_interval(successes, trials)


def coverage_range(runs: list[dict]) -> tuple[float, float]:
    """The 95% range of the mean coverage that correct split-conformal sets would have over ``runs``.

    In one run, with n calibration and m test samples, the share of test samples covered at level c is
    Beta-binomial(m, k, n + 1 - k) / m with k = ceil((n + 1) c) (exact for continuous scores); the runs
    are independent, so the covered counts' sum has the convolution of their distributions.
    """
    from scipy.stats import betabinom

    distribution = np.ones(1)
    for r in runs:
        n, m = r["calibration_samples"], r["test_samples"]
        k = conformal_rank(n, coverage=r["coverage_level"])
        distribution = np.convolve(distribution, betabinom.pmf(np.arange(m + 1), m, k, n + 1 - k))
    cumulative, total = np.cumsum(distribution), len(distribution) - 1
    low, high = np.searchsorted(cumulative, [0.025, 0.975])
    return float(low / total), float(high / total)


def summarise(name: str, runs: list[dict]) -> dict:
    """One data set's figures over its successful ``runs``: means, ranges, intervals and missed targets."""
    done = [r for r in runs if "error" not in r]
    summary: dict = {"dataset": name, "runs": len(done), "failed": len(runs) - len(done)}
    if not done:
        return summary

    def spread(values: list[float]) -> list[float]:
        return [float(np.mean(values)), float(np.min(values)), float(np.max(values))]

    best_head = [max(r["heads"].values()) for r in done]
    summary.update(
        samples=done[0]["samples"],
        views=len(done[0]["heads"]),
        fused=spread([r["fused"] for r in done]),
        best_head=spread(best_head),
        best_head_view=max(done[0]["heads"], key=lambda v: np.mean([r["heads"][v] for r in done])),
        best_view_baseline=spread([max(r["view_baselines"].values()) for r in done]),
        averaged_views_baseline=spread([r["averaged_views_baseline"] for r in done]),
        baseline=spread([r["baseline"] for r in done]),
        auroc=spread([r["auroc"] for r in done]),
        coverage=spread([r["coverage"] for r in done]),
        coverage_range=coverage_range(done),
        coverage_level=sorted({r["coverage_level"] for r in done}),
        mean_set_size=spread([r["mean_set_size"] for r in done]),
        ece=spread([r["ece"] for r in done]),
        seconds=spread([r["seconds"] for r in done]),
        trained_again=sum(1 for r in done if r.get("outvoted")),
        kept_again=sum(1 for r in done if (r.get("outvoted") or {}).get("kept")),
    )
    for rate, size in (("clean", "test_samples"), ("conflictive", "conflictive_samples")):
        counts = sum(round(r["flag"][rate] * r[size]) for r in done)
        summary[f"flag_{rate}"] = spread([r["flag"][rate] for r in done])
        summary[f"flag_{rate}_interval"] = clopper_pearson(counts, sum(r[size] for r in done))
    summary["missed"] = missed_targets(summary)
    return summary


def missed_targets(summary: dict) -> list[str]:
    """The issue's targets the data set's means miss (module notes)."""
    fused = summary["fused"][0]
    missed = []
    if fused < summary["best_head"][0] - VIEW_MARGIN:
        missed.append("view")
    if fused < summary["baseline"][0] - BASELINE_MARGIN:
        missed.append("base")
    low, high = FLAG_CLEAN_RANGE
    if summary["samples"] >= FLAG_MIN_SAMPLES and not low <= summary["flag_clean"][0] <= high:
        missed.append("flag")
    coverage_low, coverage_high = summary["coverage_range"]
    if not coverage_low <= summary["coverage"][0] <= coverage_high:
        missed.append("cov")
    return missed


# -- the table -----------------------------------------------------------------------------------------------


def _spread(figures: list[float]) -> str:
    mean, low, high = figures
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _interval(figures: list[float], interval: tuple[float, float]) -> str:
    return f"{100 * figures[0]:4.1f}% [{100 * interval[0]:4.1f}, {100 * interval[1]:4.1f}]"


def table(summaries: list[dict], seeds: int) -> str:
    """Two tables, one row per data set: accuracy and time; conflict and calibration, with missed targets."""
    accuracy_rows = [
        f"{'data set':<14} {'n':>5} {'V':>2}  {'fused':<20}  {'best head':<20} {'(view)':<14} "
        f"{'best view LR':<20}  {'views averaged LR':<20}  {'baseline LR':<20}  {'again':>5}  {'s/fit':>6}"
    ]
    conflict_rows = [
        f"{'data set':<14} {'AUROC':<20}  {'flag clean [95%]':<19}  {'flag conflictive':<19}  "
        f"{'coverage [range]':<20}  {'set size':>8}  {'ECE':<20}  missed"
    ]
    for s in summaries:
        if not s["runs"]:
            accuracy_rows.append(f"{s['dataset']:<14} every fit failed (see the JSON)")
            continue
        failed = f"  ({s['failed']} of {s['failed'] + s['runs']} fits failed)" if s["failed"] else ""
        accuracy_rows.append(
            f"{s['dataset']:<14} {s['samples']:>5} {s['views']:>2}  {_spread(s['fused'])}  "
            f"{_spread(s['best_head'])} {'(' + s['best_head_view'] + ')':<14} "
            f"{_spread(s['best_view_baseline'])}  {_spread(s['averaged_views_baseline'])}  "
            f"{_spread(s['baseline'])}  "
            f"{s['kept_again']:>2}/{s['trained_again']:<2}  {s['seconds'][0]:6.1f}{failed}"
        )
        low, high = s["coverage_range"]
        level = "" if s["coverage_level"] == [0.9] else f" (coverage at {s['coverage_level']})"
        conflict_rows.append(
            f"{s['dataset']:<14} {_spread(s['auroc'])}  "
            f"{_interval(s['flag_clean'], s['flag_clean_interval']):<19}  "
            f"{_interval(s['flag_conflictive'], s['flag_conflictive_interval']):<19}  "
            f"{s['coverage'][0]:.3f} [{low:.3f}, {high:.3f}]  {s['mean_set_size'][0]:8.2f}  "
            f"{_spread(s['ece'])}  {' '.join(s['missed']) or '-'}{level}"
        )
    return (
        f"# test split, mean [min, max] over {seeds} seeds\n"
        + "\n".join(accuracy_rows)
        + "\n\n"
        + "\n".join(conflict_rows)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fit_quality",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 per data set")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated names")
    parser.add_argument("--jobs", type=int, default=1, help="fits at a time (each single-threaded)")
    parser.add_argument("--out", type=Path, default=Path("fit_quality.json"), help="every run, as JSON")
    parser.add_argument("--fit-args", default="", help='more options for the fit command, e.g. "--epochs 20"')
    parser.add_argument(
        "--workdir", type=Path, help="keep the written data and models here (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    names = [name for name in args.datasets.split(",") if name]
    unknown = [name for name in names if name not in DATASETS]
    if unknown or args.seeds < 1 or args.jobs < 1:
        parser.error(
            f"unknown data set {unknown[0]!r}; known: {', '.join(DATASETS)}"
            if unknown
            else "--seeds and --jobs must be at least 1"
        )

    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # the baselines, single-threaded as the fits are
    try:
        data = {name: load(name) for name in names}
    except ModuleNotFoundError as error:
        parser.error(str(error))
    with tempfile.TemporaryDirectory(prefix="dbf-fit-quality-") as scratch:
        workdir = args.workdir or Path(scratch)
        tasks = [(name, seed) for name in names for seed in range(args.seeds)]
        fit_args = shlex.split(args.fit_args)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(lambda task: run(task[0], data[task[0]], task[1], workdir, fit_args), tasks))
        wall = time.perf_counter() - started
    summaries = [summarise(name, [r for r in runs if r["dataset"] == name]) for name in names]
    sys.stdout.write(table(summaries, args.seeds))
    print(
        f"# {len(runs)} fits in {wall / 60:.1f} min, {args.jobs} at a time; "
        f"fit options: {args.fit_args or 'defaults'}"
    )
    args.out.write_text(
        json.dumps({"fit_args": args.fit_args, "summaries": summaries, "runs": runs}, indent=1)
    )
    print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
