"""``python -m training fit``'s options in combination, as the card states them (black-box: a tiny fit, its
card and manifest), and what it says where its dependencies are not installed."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.training.test_fit import QUICK, dataset, fit, read_manifest, write_npy
from training.__main__ import TRAIN_EXTRA

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("method", "named"),
    [
        ("bcf", "Belief constraint fusion (BCF)"),
        ("gbaf", "Generalised belief averaging fusion (GBAF)"),
        ("dbf", "Discounted Belief Fusion (DBF, lambda 10)"),
    ],
)
def test_the_card_names_the_fusion_trained_with_and_a_lambda_only_where_it_is_used(tmp_path, method, named):
    """A probe's `--method bcf --lambda 10` card began "Discounted Belief Fusion (BCF, lambda 10)": BCF is
    not DBF, and lambda (DBF's strictness) changes nothing any other method fuses."""
    views, labels = dataset()
    out = tmp_path / "models" / "m"
    data = write_npy(tmp_path / "data", views, labels)
    assert (
        fit("--data", data, "--out", out, "--method", method, "--lambda", "10", "--hidden", "0", *QUICK) == 0
    )
    fusion = read_manifest(out).fusion
    assert (fusion.method, fusion.lam) == (method, 10.0)  # served by default as trained
    card = (out / "card.md").read_text()
    summary = card.split("## Summary\n\n")[1].splitlines()[0]
    assert summary.startswith(f"{named} over 3 views")
    training = card.split("## Training\n\n")[1]
    assert f"fused by {method.upper()}{' (lambda 10; ' if method == 'dbf' else ' ('}" in training
    if method != "dbf":
        assert "lambda" not in summary and "lambda 10" not in training


def test_a_flag_whose_scores_tie_says_what_it_flags_where_it_was_fitted(tmp_path):
    """A probe's `--lambda 0.01` fit discounted every view to vacuous: every sample's uncertainty was 1, the
    flag's threshold 1, and it raised 100% of the 168 clean samples it was fitted on. The card still called
    it "the threshold that flags 5.0% of the clean samples", and the warning blamed new data ("it does not
    carry over") for what the samples fitted on already showed."""
    views, labels = dataset()
    out = tmp_path / "models" / "m"
    data = write_npy(tmp_path / "data", views, labels)
    assert fit("--data", data, "--out", out, "--lambda", "0.01", "--hidden", "0", *QUICK) == 0
    flag = read_manifest(out).conflict_flag
    assert flag.validation.clean == 1.0  # every clean sample's score ties at the threshold
    card = (out / "card.md").read_text()
    assert "the threshold that flags 5.0% of the clean samples" not in card
    assert "set to flag 5.0% of the clean samples, flags 100.0% of them" in card
    assert "does not carry over" not in card
    assert "raised 100.0% of the 48 clean samples its threshold was fitted on" in card  # a warning


@pytest.mark.parametrize("absent", ["torch", "scipy", "matplotlib", "onnx"])
def test_fit_without_the_train_extra_says_how_to_install_it(absent, tmp_path):
    """`make serve` installs the service's dependencies alone; the README's next line, `python -m training
    fit`, then ended in a traceback (ModuleNotFoundError) instead of saying what to install. The module is
    made absent as an uninstalled one is: no finder finds it. matplotlib and onnx, imported once the heads
    were trained, are missed before training, not after."""
    data = write_npy(tmp_path / "data", *dataset())
    run = (
        "import runpy, sys\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {absent!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Absent())\n"
        f"sys.argv = ['training', 'fit', '--data', {str(data)!r}, '--out', {str(tmp_path / 'model')!r}]\n"
        "runpy.run_module('training', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: python -m training needs the `train` extra ({absent} is not ")
    assert "pip install -c constraints.txt -e '.[train]'" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "model").exists()


def test_the_train_extra_named_in_that_error_is_pyprojects():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert set(TRAIN_EXTRA) == {re.match(r"[A-Za-z0-9_.-]+", requirement)[0] for requirement in extra}
