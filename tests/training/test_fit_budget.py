"""``python -m training fit``'s defaults, black-box: a training budget that follows the data, and a run ended
by its cap while still improving says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.training.test_fit import fit, read_manifest, write_npy
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


CUT_SHORT = "stopped by the epoch cap while the validation loss still improved (raise --epochs)"


def test_the_default_budget_fits_small_data_that_a_fixed_1000_epochs_underfit(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *slow_to_learn())
    old = tmp_path / "old"
    assert fit("--data", data, "--out", old, "--epochs", "1000", "--patience", "30") == 0
    assert CUT_SHORT in capsys.readouterr().out
    assert read_manifest(old).metrics.acc_normal < 0.8

    new = tmp_path / "new"
    assert fit("--data", data, "--out", new, "--quiet") == 0
    manifest = read_manifest(new)
    # 10,000 optimizer steps of one batch each, and a patience of 1,000 of them
    assert (manifest.training["max_epochs"], manifest.training["patience"]) == (10_000, 1_000)
    assert manifest.metrics.acc_normal >= 0.9


def test_a_run_ended_by_the_cap_while_improving_says_so(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *slow_to_learn())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "60", "--quiet") == 0
    assert f"60 epochs, best 60, {CUT_SHORT}" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest.training["still_improving"] is True and manifest.training["timed_out"] is False
    card = (out / "card.md").read_text()
    assert "**The epoch cap ended training while the validation loss was still improving**" in card


def test_a_run_stopped_early_does_not_say_it_was_cut_short(tmp_path, capsys):
    data = write_npy(tmp_path / "data", *overfitted())
    out = tmp_path / "model"
    assert fit("--data", data, "--out", out, "--epochs", "3000", "--patience", "30") == 0
    printed = capsys.readouterr().out
    assert "stopped early" in printed and "stopped by" not in printed
    assert read_manifest(out).training["still_improving"] is False
    assert "ended training while" not in (out / "card.md").read_text()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-minutes", "0", "argument --max-minutes: expected a positive number of minutes, got '0'"),
        ("--max-minutes", "nan", "argument --max-minutes: expected a positive number of minutes"),
    ],
)
def test_bad_training_options_are_refused_before_reading_the_data(option, value, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m"), option, value])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not Path(tmp_path / "m").exists()
