"""``python -m training fit``'s defaults, black-box: a training budget that follows the data, a run ended by
its cap while still improving says so, and the heads' architecture chosen on the validation split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.training.test_fit import dataset, fit, read_manifest, write_npy
from training.__main__ import main


def slow_to_learn(n: int = 280) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Two classes whose views each separate them by one feature, but 4% of rows lie far out on it: once
    min-max scaled, the classes are 1/17 of the range apart, which takes large weights, hence many Adam
    steps. 196 training samples are one batch: 1000 epochs are 1000 steps."""
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(n) % 2)
    views = {}
    for v in range(3):
        x = rng.normal(size=(n, 3)) * 0.2
        x[:, 0] += labels
        far = rng.random(n) < 0.04
        x[far, 0] += 8 * rng.choice([-1, 1], size=far.sum())
        views[f"view_{v}"] = x.astype(np.float32)
    return views, np.array(["no", "yes"])[labels]


def overfitted(n: int = 120) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Two classes that each view tells apart by one noisy feature among twenty of noise: the heads soon
    fit the training split's noise, and the validation loss rises."""
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(n) % 2)
    views = {}
    for v in range(3):
        x = rng.normal(size=(n, 21))
        x[:, 0] += 2 * labels
        views[f"view_{v}"] = x.astype(np.float32)
    return views, np.array(["no", "yes"])[labels]


def xor_views(n: int = 200) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Two views of two features each; the class is whether the features lie on the same side of 0.5 (an
    XOR): no linear head separates it."""
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(n) % 2)
    views = {}
    for v in range(2):
        x = rng.random((n, 2))
        wrong = ((x[:, 0] > 0.5) ^ (x[:, 1] > 0.5)).astype(int) != labels
        x[wrong, 0] = 1 - x[wrong, 0]
        views[f"view_{v}"] = x.astype(np.float32)
    return views, np.array(["same", "different"])[labels]


CUT_SHORT = "stopped by the epoch cap while the validation loss still improved (raise --epochs)"


@pytest.mark.slow  # 10,000 optimizer steps, twice (the heads, then the cross-fitting)
def test_the_default_budget_fits_small_data_that_a_fixed_1000_epochs_underfit(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *slow_to_learn())
    old = tmp_path / "old"
    assert fit("--data", data, "--out", old, "--epochs", "1000", "--patience", "30", "--hidden", "0") == 0
    assert CUT_SHORT in capsys.readouterr().out
    assert read_manifest(old).metrics.acc_normal < 0.8

    new = tmp_path / "new"
    assert fit("--data", data, "--out", new, "--hidden", "linear", "--quiet") == 0
    manifest = read_manifest(new)
    # 10,000 optimizer steps of one batch each, and a patience of 1,000 of them
    assert (manifest.training["max_epochs"], manifest.training["patience"]) == (10_000, 1_000)
    assert manifest.metrics.acc_normal >= 0.9


def test_a_run_ended_by_the_cap_while_improving_says_so(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *slow_to_learn())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "60", "--hidden", "linear", "--quiet") == 0
    assert f"60 epochs, best 60, {CUT_SHORT}" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest.training["still_improving"] is True and manifest.training["timed_out"] is False
    card = (out / "card.md").read_text()
    assert "**The epoch cap ended training while the validation loss was still improving**" in card


def test_the_time_limit_ends_a_run_and_says_so(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *slow_to_learn())
    out = tmp_path / "model"
    # a limit shorter than any epoch: the first one ends the run
    assert fit("--data", data, "--out", out, "--max-minutes", "1e-9", "--hidden", "0", "--quiet") == 0
    printed = capsys.readouterr().out
    expected = "1 epochs, best 1, stopped by the time limit while the validation loss still improved"
    assert f"{expected} (raise --max-minutes)" in printed
    manifest = read_manifest(out)
    assert manifest.training["timed_out"] is True and manifest.training["epochs"] == 1
    card = (out / "card.md").read_text()
    assert "reached the time limit" in card and "**The time limit ended training while" in card


def test_each_training_run_of_a_fit_is_named_in_its_progress_lines(tmp_path, capsys):
    # A fit trains several times, each run counting its epochs from 1 with its own time left: unnamed, the
    # lines of a 30-view fit read as one run starting over three times, each "at most 3 minutes left".
    data = write_npy(tmp_path / "data", *dataset())
    assert fit("--data", data, "--out", tmp_path / "model", "--epochs", "4", "--quiet") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if re.search(r"epoch \d+/\d+: loss", line)]
    runs = list(dict.fromkeys(line.split(": epoch ")[0] for line in lines))
    assert not [line for line in lines if line.startswith("epoch")]
    assert runs[:2] == ["linear heads (1 of 2)", "heads with hidden layers 64 (2 of 2)"]
    assert "cross-fitting 5 models" in runs  # 60 samples: too few validation ones, so cross-fitted


def test_a_view_whose_head_broke_down_in_training_is_named_with_what_to_do(tmp_path, capsys):
    # 20,000 features scaled to [0, 1]: one Adam step moves a linear head's scores by about 0.003 x 10,000,
    # and its evidence went to the cap or to nothing; the card blamed the data ("may carry nothing its head
    # can use") for a view a logistic regression is right on every time with.
    views, labels = dataset(per_class=100)
    rng = np.random.default_rng(1)
    codes = np.searchsorted(np.unique(labels), labels)
    wide = rng.normal(size=(3, 20_000))[codes] + rng.normal(size=(labels.size, 20_000))
    data = write_npy(tmp_path / "data", {"wide": wide.astype(np.float32), "text": views["text"]}, labels)
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "20", "--hidden", "0", "--quiet") == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "training broke down" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: `wide` (20000 features): its head ")
    assert "reduce its features" in warnings[0]
    assert "`wide` (20000 features): its head" in (out / "card.md").read_text()


def test_a_run_stopped_early_does_not_say_it_was_cut_short(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *overfitted())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "3000", "--patience", "30", "--hidden", "0") == 0
    printed = capsys.readouterr().out
    assert "stopped early" in printed and "stopped by" not in printed
    assert read_manifest(out).training["still_improving"] is False
    assert "ended training while" not in (out / "card.md").read_text()


def test_the_hidden_layer_is_chosen_where_a_linear_head_cannot_separate_the_classes(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *xor_views())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "300", "--patience", "0", "--quiet") == 0
    manifest = read_manifest(out)
    assert manifest.training["hidden"] == [64]
    assert manifest.metrics.acc_normal >= 0.9
    card = (out / "card.md").read_text()
    assert "One head per view (a hidden layer of 64 units; chosen for its fused validation accuracy, " in card
    assert ") with linear; a hidden layer is kept only where more accurate)" in card


def test_the_linear_head_is_kept_on_linearly_separable_data(tmp_path):
    data = write_npy(tmp_path / "data", *dataset())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "300", "--patience", "0", "--quiet") == 0
    assert read_manifest(out).training["hidden"] == []
    card = (out / "card.md").read_text()
    # every rate with its interval and the validation samples it rests on, as everywhere in the card
    validation = read_manifest(out).training["splits"]["validation"]
    measured = rf"100\.0% \[\d+\.\d, 100\.0\] of {validation} \(conflict AUROC \d\.\d\d\)"
    assert re.search(
        rf"One head per view \(linear; chosen for its fused validation accuracy, {measured}", card
    )
    assert re.search(rf"against {measured} with a hidden layer", card)


def test_hidden_layers_as_asked_are_trained_exported_and_described(tmp_path):
    data = write_npy(tmp_path / "data", *dataset())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--hidden", "16,8", "--epochs", "4", "--quiet") == 0
    manifest = read_manifest(out)
    assert manifest.training["hidden"] == [16, 8]
    assert "One head per view (hidden layers of 16, 8 units) with" in (out / "card.md").read_text()


@pytest.mark.parametrize(
    ("option", "recorded", "clause"),
    [
        ((), "none", "every sample alike"),  # classes equally common: auto weighs none
        (
            ("--class-weighting", "sqrt"),
            "sqrt",
            "each sample by the inverse square root of its class's share",
        ),
    ],
)
def test_the_class_weighting_is_recorded_and_described(option, recorded, clause, tmp_path):
    data = write_npy(tmp_path / "data", *dataset())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, *option, "--hidden", "0", "--epochs", "4", "--quiet") == 0
    assert read_manifest(out).training["class_weighting"] == recorded
    assert clause in (out / "card.md").read_text()


@pytest.mark.data
def test_export_trains_the_hidden_layers_asked_for(data_dir, tmp_path):
    out = tmp_path / "cub"
    command = ["export", "--dataset", "cub", "--data-dir", str(data_dir), "--out", str(out), "--epochs", "2"]
    assert main([*command, "--hidden", "32"]) == 0
    assert json.loads((out / "manifest.json").read_text())["training"]["hidden"] == [32]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--hidden", "wide", "argument --hidden: expected comma-separated positive layer widths"),
        ("--hidden", "64,0", "argument --hidden: expected comma-separated positive layer widths"),
        ("--hidden", "-8", "argument --hidden: expected"),
        ("--max-minutes", "0", "argument --max-minutes: expected a positive number of minutes, got '0'"),
        ("--max-minutes", "nan", "argument --max-minutes: expected a positive number of minutes"),
        ("--epochs", "0", "argument --epochs: expected an integer >= 1, got '0'"),  # an untrained model
        ("--epochs", "-1", "argument --epochs: expected an integer >= 1, got '-1'"),
        ("--patience", "-1", "argument --patience: expected an integer >= 0, got '-1'"),
        ("--seed", "-1", "argument --seed: expected an integer from 0 to 4,294,967,295, got '-1'"),
        ("--seed", "99999999999999999999999", "argument --seed: expected an integer from 0 to 4,294,967,295"),
        ("--seed", "seven", "argument --seed: expected an integer"),
    ],
)
def test_bad_training_options_are_refused_before_reading_the_data(option, value, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m"), option, value])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not Path(tmp_path / "m").exists()


@pytest.mark.parametrize("total", [1429, 1400, 7])
def test_progress_lines_write_each_epoch_once(total):
    """Every 1/20th of the epochs and the last, once each (the last was written twice where the total is not
    a multiple of the step); a run stopped early adds its note on a line of its own."""
    import io

    from training.progress import ProgressLines

    stream = io.StringIO()
    lines = ProgressLines(total, stream=stream)
    for epoch in range(1, total + 1):
        lines.epoch(epoch, 0.5, 0.6)
    lines.close()
    epochs = [line.split(":")[0] for line in stream.getvalue().splitlines()]
    assert len(epochs) == len(set(epochs)) and epochs[-1] == f"epoch {total}/{total}"
    stream = io.StringIO()
    lines = ProgressLines(total, stream=stream)
    lines.epoch(1, 0.5, 0.6)
    lines.close(stopped_early=True)
    assert stream.getvalue().splitlines()[-1].endswith("stopped early: no better validation loss for a while")
