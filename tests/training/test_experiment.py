"""Experiment protocols and the command that runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from training.__main__ import main
from training.data import synthetic
from training.experiment import (
    SUMMARY_SECTIONS,
    RunSpec,
    make_splits,
    run,
    run_grid,
    summary_table,
    write_results,
)
from training.readers import load
from training.registry import DATASETS


@pytest.mark.parametrize("protocol", ["heldout", "paper"])
def test_splits_shapes_and_disjointness(protocol):
    data = synthetic(300, num_classes=3, seed=0)
    splits = make_splits(data, protocol=protocol, seed=0)
    train, clean, conflictive = (
        s.features() for s in (splits.train, splits.test, splits.conflictive["test"])
    )
    assert len(train) == len(clean) == len(conflictive) == 3
    assert len(splits.train.labels) + len(splits.test.labels) <= 300
    if protocol == "paper":
        assert len(splits.train.labels) == 240 and len(splits.test.labels) == 60
        assert len(splits.conflictive["test"].labels) == 60
    else:  # conflictive copies of exactly the clean test samples
        np.testing.assert_array_equal(splits.conflictive["test"].labels, splits.test.labels)
        changed = np.stack([np.any(a != b, axis=1) for a, b in zip(clean, conflictive, strict=True)])
        assert (changed.sum(0) == 1).all()


@pytest.mark.data
def test_heldout_scaling_is_fitted_on_the_training_split(data_dir):
    data = load("handwritten", data_dir)
    splits = make_splits(data, protocol="heldout", seed=0)
    for view in splits.train.features():
        assert view.min() >= 0 and view.max() <= 1
    # unseen extremes stay unclipped
    assert any(view.max() > 1 or view.min() < 0 for view in splits.test.features())


def test_run_reports_the_metrics():
    result = run(RunSpec(dataset="synthetic", method="gbaf", epochs=5)).record()
    for key in ("acc_normal", "acc_conflict", "auc", "ece", "brier", "nll", "seconds", "lambda"):
        assert key in result
    assert 0 <= result["acc_normal"] <= 1 and 0 <= result["auc"] <= 1


def test_summary_table_layout():
    results = [
        {"dataset": "pie", "method": "dbf", "auc": 0.7},
        {"dataset": "pie", "method": "dbf", "auc": 0.9},
        {"dataset": "cub", "method": "gbaf", "auc": 0.5},
    ]
    table = summary_table(results, metric="auc").splitlines()
    assert table[0] == "| | pie | cub |"
    assert table[2] == "| DBF | 0.80 ± 0.10 |  |"
    assert table[3] == "| GBAF |  | 0.50 ± 0.00 |"


@pytest.mark.data
def test_experiment_command_writes_results(data_dir, tmp_path):
    command = [
        sys.executable, "-m", "training", "experiment", "--dataset", "cub", "--methods", "dbf,gbaf",
        "--seeds", "0", "--epochs", "3", "--data-dir", str(data_dir), "--out", str(tmp_path),
        "--workers", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [(r["dataset"], r["method"], r["seed"]) for r in results] == [
        ("cub", "dbf", 0),
        ("cub", "gbaf", 0),
    ]
    for r in results:
        assert {"dataset", "method", "seed", "acc_normal", "acc_conflict", "auc", "seconds"} <= r.keys()
        assert 0 <= r["acc_normal"] <= 1
    assert "| DBF |" in (tmp_path / "results.md").read_text()
    for figure in ("uncertainty_distributions.png", "view_uncertainty.png"):
        assert (tmp_path / figure).read_bytes().startswith(b"\x89PNG")


def test_grid_trains_seeds_together_and_draws_the_lambda_sweep(tmp_path):
    specs = [
        RunSpec(dataset="synthetic", lam=lam, seed=seed, epochs=3) for lam in (0.5, 2.0) for seed in (0, 1)
    ]
    grid = run_grid(specs, None, workers=1)
    results = [r.record() for r in grid]
    assert [(r["lambda"], r["seed"]) for r in results] == [(0.5, 0), (0.5, 1), (2.0, 0), (2.0, 1)]
    assert all(r["trained_together"] == 2 for r in results)
    assert results[0]["acc_normal"] == run(specs[0]).record()["acc_normal"]  # trains as it would alone
    write_results(grid, tmp_path)
    assert (tmp_path / "lambda_sweep.png").read_bytes().startswith(b"\x89PNG")


def test_methods_train_together_as_each_would_alone():
    specs = [
        RunSpec(dataset="synthetic", method=method, seed=seed, epochs=3)
        for method in ("gbaf", "bcf")
        for seed in (0, 1)
    ]
    results = [r.record() for r in run_grid(specs, None, workers=1)]
    assert [(r["method"], r["seed"]) for r in results] == [("gbaf", 0), ("gbaf", 1), ("bcf", 0), ("bcf", 1)]
    assert all(r["trained_together"] == 4 for r in results)
    for spec, result in zip(specs, results, strict=True):
        alone = run(spec).record()
        assert (result["acc_normal"], result["auc"]) == (alone["acc_normal"], alone["auc"])


def test_summarise_labels_rows_by_setting_where_it_varies(tmp_path, capsys):
    for activation in ("exp", "softplus"):
        specs = [RunSpec(dataset="synthetic", activation=activation, seed=seed, epochs=2) for seed in (0, 1)]
        write_results(run_grid(specs, None, workers=1), tmp_path / activation)
    assert main(["summarise", str(tmp_path / "exp"), str(tmp_path / "softplus")]) == 0
    tables = capsys.readouterr().out
    assert tables.count("| DBF (exp) | ") == tables.count("| DBF (softplus) | ") == len(SUMMARY_SECTIONS)
    assert main(["summarise", str(tmp_path / "exp")]) == 0
    assert "| DBF | " in capsys.readouterr().out  # one setting: plain method names, as the paper
    assert main(["summarise", str(tmp_path / "missing")]) == 1


def test_experiment_command_sweeps_lambda(tmp_path, capsys):
    argv = ["experiment", "--dataset", "synthetic", "--lambda", "0.5,2", "--epochs", "2", "--workers", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert [r["lambda"] for r in document["results"]] == [0.5, 2.0]
    assert document["wall_seconds"] > 0
    assert (tmp_path / "lambda_sweep.png").read_bytes().startswith(b"\x89PNG")
    assert "2 runs in" in capsys.readouterr().out


def test_the_summary_counts_the_worker_processes_that_ran_not_those_asked(tmp_path, capsys):
    """One run with --workers 4 ran in one process ('at most one per run', as --help says), and the summary
    said '1 runs in 0.0 min with 4 workers'."""
    argv = ["experiment", "--dataset", "synthetic", "--epochs", "1", "--workers", "4"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert "1 runs in" in (out := capsys.readouterr().out) and "with 1 workers" in out, out


def test_activation_paper_is_the_papers_table_3_setup(tmp_path):
    argv = ["experiment", "--dataset", "synthetic", "--methods", "dbf,gbaf,bcf", "--activation", "paper"]
    assert main([*argv, "--epochs", "2", "--workers", "1", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert {r["method"]: r["activation"] for r in results} == {
        "dbf": "exp",
        "gbaf": "softplus",
        "bcf": "softplus",
    }


def test_grid_halves_groups_until_every_worker_has_one():
    specs = [RunSpec(dataset="synthetic", method=method, seed=0, epochs=2) for method in ("dbf", "gbaf")]
    results = [r.record() for r in run_grid(specs, None, workers=2)]
    assert [(r["method"], r["trained_together"]) for r in results] == [("dbf", 1), ("gbaf", 1)]
    assert results[1]["auc"] == run(specs[1]).record()["auc"]


def test_an_unknown_dataset_is_refused_not_trained_with_another_ones_settings(tmp_path, capsys):
    with pytest.raises(KeyError, match="unknown dataset 'mnist'; known: handwritten"):
        run(RunSpec(dataset="mnist", epochs=1))
    assert main(["experiment", "--dataset", "mnist", "--epochs", "1", "--out", str(tmp_path)]) == 1
    assert (
        "unknown dataset 'mnist'; known: handwritten, scene15, pie, cub, caltech101"
        in capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.data
def test_a_run_trains_with_its_datasets_hyperparameters(data_dir, monkeypatch):
    import training.experiment as experiment

    configs = []
    train_members = experiment.train_members

    def recording(*args, config, **kwargs):
        configs.append(config)
        return train_members(*args, config=config, **kwargs)

    monkeypatch.setattr(experiment, "train_members", recording)
    run(RunSpec(dataset="cub", epochs=1), data_dir)
    assert (
        configs[0].hyperparameters
        == DATASETS["cub"].hyperparameters
        != DATASETS["handwritten"].hyperparameters
    )


def _results_dir(tmp_path, name: str, text: str):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "results.json").write_text(text)
    return directory


_RECORD = {"dataset": "pie", "method": "dbf", "auc": 0.7, "acc_normal": 0.9, "acc_conflict": 0.5, "ece": 0.1}


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",  # not an object
        '{"results": {"dataset": "pie"}}',  # not a list
        '{"results": ["pie"]}',  # a record that is no object
        '{"results": [{"dataset": "pie"}]}',  # no method, no measures
        json.dumps({"results": [{**_RECORD, "auc": "high"}]}),
        json.dumps({"results": [{**_RECORD, "auc": True}]}),
        json.dumps({"results": [{**_RECORD, "hidden": 5}]}),
        json.dumps({"results": [{**_RECORD, "method": None}]}),
        "[" * 100_000 + "]" * 100_000,  # deeper than the parser's recursion
    ],
    ids=["list", "results-object", "record-string", "no-keys", "text", "bool", "hidden-int", "null", "deep"],
)
def test_summarise_names_a_malformed_results_file_without_a_traceback(tmp_path, capsys, text):
    directory = _results_dir(tmp_path, "bad", text)
    assert main(["summarise", str(directory)]) == 1
    err = capsys.readouterr().err
    assert f"error: {directory / 'results.json'}: " in err and "Traceback" not in err


def test_summarise_keeps_each_name_in_its_own_cell(tmp_path, capsys):
    """A dataset or method name holding a pipe, a line break or a last backslash (which would escape the
    pipe after it) cannot add cells, rows or headings."""
    record = {**_RECORD, "dataset": "a|b\n## injected", "method": "dbf|x"}
    other = {**_RECORD, "dataset": "c\\", "method": "dbf|x"}
    directory = _results_dir(tmp_path, "odd", json.dumps({"results": [record, other]}))
    assert main(["summarise", str(directory)]) == 0
    tables = capsys.readouterr().out
    assert "\n## injected" not in tables
    assert "| | a\\|b ## injected | c\\\\ |" in tables and "| DBF\\|X | 0.70 ± 0.00 | 0.70 ± 0.00 |" in tables


def _grid(lambdas=(1.0,)):
    return run_grid([RunSpec(dataset="synthetic", lam=lam, epochs=2) for lam in lambdas], None, workers=1)


def test_results_written_again_leave_no_figure_of_the_earlier_ones(tmp_path):
    write_results(_grid((0.5, 2.0)), tmp_path)
    assert (tmp_path / "lambda_sweep.png").is_file()
    write_results(_grid(), tmp_path)  # one lambda: no sweep to draw
    assert not (tmp_path / "lambda_sweep.png").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [
            "results.json",
            "results.md",
            "uncertainties.npz",
            "uncertainty_distributions.png",
            "view_uncertainty.png",
        ]
    )


def test_interrupted_results_leave_the_earlier_ones_whole(tmp_path, monkeypatch):
    """Ctrl-C while the figures are drawn: the earlier results, tables and uncertainties stay together."""
    import training.experiment as experiment

    write_results(_grid((0.5, 2.0)), tmp_path)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}

    def interrupted(out_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "write_plots", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_results(_grid(), tmp_path)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


@pytest.mark.parametrize("option", ["--dataset", "--methods", "--seeds", "--lambda", "--activation"])
def test_an_empty_list_in_the_grid_is_refused_naming_the_option(tmp_path, capsys, option):
    """``--seeds ,`` made a grid of no runs, which ended in max()'s ValueError traceback."""
    argv = ["experiment", "--dataset", "synthetic", "--epochs", "1", "--workers", "1", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit:
        main([*argv, option, ","])
    assert exit.value.code == 2
    assert f"{option}: expected at least one" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
