"""``python -m training fit``, black-box: tiny generated datasets in every format in, a model directory (or
a clear error and nothing written) out; and the served answers of a fitted model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fusion import fuse, opinion_from_evidence
from manifest import CalibrationSamples, Manifest
from tests.service.conftest import running_service
from training import export as exporting
from training.__main__ import main
from training.export import exported_evidence, exported_range_excess

CLASSES = ("cat", "dog", "eel")
DIMS = {"image": 5, "text": 3, "sensor": 4}
QUICK = ["--epochs", "4", "--quiet"]  # a few epochs: these tests check the path, not the accuracy


def dataset(
    *, per_class: int = 20, missing: float = 0.0, seed: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Views that each separate the classes (class means 3 apart, unit noise), string labels; with
    ``missing``, that share of samples lacks one view (a row of NaN)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.array(CLASSES), per_class))
    codes = np.searchsorted(CLASSES, labels)
    views = {}
    for name, dim in DIMS.items():
        means = 3 * rng.normal(size=(len(CLASSES), dim))
        views[name] = (means[codes] + rng.normal(size=(labels.size, dim))).astype(np.float32)
    if missing:
        lacking = rng.random(labels.size) < missing
        which = rng.integers(len(DIMS), size=labels.size)
        for v, matrix in enumerate(views.values()):
            matrix[lacking & (which == v)] = np.nan
    return views, labels


def write_npy(directory: Path, views: dict[str, np.ndarray], labels, **extra: np.ndarray) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, matrix in {**views, "labels": labels, **extra}.items():
        np.save(directory / f"{name}.npy", matrix)
    return directory


def list_column(matrix: np.ndarray, *, fixed: bool = True) -> pa.Array:
    """A view as a Parquet column: a (fixed-size) list of numbers per row, null where the row is NaN."""
    missing = np.isnan(matrix).all(axis=1)
    rows = [None if gone else row.tolist() for row, gone in zip(matrix, missing, strict=True)]
    kind = pa.list_(pa.float32(), matrix.shape[1]) if fixed else pa.list_(pa.float64())
    return pa.array(rows, type=kind)


def write_parquet(path: Path, views: dict[str, np.ndarray], labels, *, label: str = "label", **extra) -> Path:
    columns = {name: list_column(matrix, fixed=i % 2 == 0) for i, (name, matrix) in enumerate(views.items())}
    pq.write_table(pa.table({**columns, label: pa.array(labels), **extra}), path)
    return path


def fit(*args: str) -> int:
    return main(["fit", *map(str, args)])


def read_manifest(directory: Path) -> Manifest:
    return Manifest.model_validate_json((directory / "manifest.json").read_text())


def assert_complete_model(directory: Path, manifest: Manifest) -> None:
    figures = ("reliability.png", "coverage.png", "uncertainty.png", "training.png")
    expected = {"manifest.json", "card.md", *figures} | {view.file for view in manifest.views}
    assert {p.name for p in directory.iterdir()} == expected
    assert manifest.schema_version == 2 and manifest.calibration is not None  # confidence, prediction sets
    for figure in figures:
        assert (directory / figure).read_bytes().startswith(b"\x89PNG")
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".")]  # no staging left


# -- every format ------------------------------------------------------------------------------------------


def test_npy_directory_with_string_labels(tmp_path, capsys):
    views, labels = dataset()
    data = write_npy(tmp_path / "data", views, labels)
    out = tmp_path / "models" / "pets"
    assert fit("--data", data, "--out", out, *QUICK) == 0
    manifest = read_manifest(out)
    assert manifest.name == "pets" and manifest.dataset == "data"
    assert manifest.classes == ["cat", "dog", "eel"]  # sorted
    assert [(v.name, v.dim) for v in manifest.views] == [("image", 5), ("sensor", 4), ("text", 3)]  # by name
    assert manifest.training["splits"] == {"train": 42, "validation": 6, "test": 12}
    assert_complete_model(out, manifest)
    card = (out / "card.md").read_text()
    for section in ("## Data", "## Accuracy", "## Conflict detection", "## Calibration", "## Uncertainty"):
        assert section in card
    assert "| cat | 20 |" in card and "| `image` | 5 | 60 | 0.0% |" in card
    assert f"AUROC {manifest.metrics.auc:.3f}" in card
    printed = capsys.readouterr()
    assert "epoch 4/4: loss" in printed.err  # --quiet: lines, not a bar
    assert f"wrote {out}" in printed.out


def test_labels_txt_with_classes_txt_order_and_integer_labels(tmp_path):
    views, labels = dataset()
    text = write_npy(tmp_path / "text", views, labels)
    (text / "labels.npy").unlink()
    (text / "labels.txt").write_text("\n".join(labels) + "\n")
    (text / "classes.txt").write_text("eel\ncat\ndog\n")
    assert fit("--data", text, "--out", tmp_path / "models" / "a", *QUICK) == 0
    assert read_manifest(tmp_path / "models" / "a").classes == ["eel", "cat", "dog"]

    codes = np.searchsorted(CLASSES, labels)  # integers, named by --classes
    numbers = write_npy(tmp_path / "numbers", views, codes)
    assert fit("--data", numbers, "--out", tmp_path / "models" / "b", "--classes", "c0,c1,c2", *QUICK) == 0
    assert read_manifest(tmp_path / "models" / "b").classes == ["c0", "c1", "c2"]
    assert fit("--data", numbers, "--out", tmp_path / "models" / "c", *QUICK) == 0
    assert read_manifest(tmp_path / "models" / "c").classes == ["0", "1", "2"]


def test_parquet_with_chosen_views_and_label_column(tmp_path):
    views, labels = dataset()
    data = write_parquet(tmp_path / "pets.parquet", views, labels, label="species", note=pa.array(["x"] * 60))
    out = tmp_path / "models" / "pets"
    command = ["--data", data, "--out", out, "--label-column", "species", "--views", "text,image"]
    assert fit(*command, *QUICK) == 0
    manifest = read_manifest(out)
    assert [(v.name, v.dim) for v in manifest.views] == [("text", 3), ("image", 5)]
    assert manifest.classes == ["cat", "dog", "eel"] and manifest.dataset == "pets"
    assert_complete_model(out, manifest)


def test_split_column(tmp_path):
    views, labels = dataset()
    split = np.empty(labels.size, dtype=object)
    for name in CLASSES:  # per class: 14 to train, 2 to validate, 4 to test
        split[labels == name] = ["train"] * 14 + ["validation"] * 2 + ["test"] * 4
    data = write_parquet(tmp_path / "pets.parquet", views, labels, fold=pa.array(split.tolist()))
    assert fit("--data", data, "--out", tmp_path / "m", "--split-column", "fold", *QUICK) == 0
    assert read_manifest(tmp_path / "m").training["splits"] == {"train": 42, "validation": 6, "test": 12}
    assert "split as the data's split column says" in (tmp_path / "m" / "card.md").read_text()


@pytest.mark.data
def test_a_benchmark_dataset_by_name(data_dir, tmp_path):
    out = tmp_path / "cub"
    assert fit("--data", "cub", "--data-dir", data_dir, "--out", out, "--epochs", "2", "--quiet") == 0
    manifest = read_manifest(out)
    assert manifest.dataset == "cub" and manifest.classes[0] == "Black_footed_Albatross"
    assert manifest.training["annealing_step"] == 10  # the paper's hyperparameters for CUB


def test_missing_views(tmp_path):
    views, labels = dataset(missing=0.3)
    lacking = {name: float(np.isnan(matrix[:, 0]).mean()) for name, matrix in views.items()}
    assert all(0 < rate < 0.3 for rate in lacking.values())
    for source in (
        write_npy(tmp_path / "npy", views, labels),
        write_parquet(tmp_path / "p.parquet", views, labels),
    ):
        out = tmp_path / "models" / source.stem
        assert fit("--data", source, "--out", out, *QUICK) == 0
        manifest = read_manifest(out)
        assert 0 <= manifest.metrics.auc <= 1 and 0 <= manifest.metrics.acc_normal <= 1
        card = (out / "card.md").read_text()
        for name, rate in lacking.items():
            assert f"| `{name}` | {DIMS[name]} | {round(60 * (1 - rate))} | {100 * rate:.1f}% |" in card
        assert "fused from the views it has" in card


# -- what a fit says of its model: baselines, intervals, calibration, warnings ------------------------------

PERCENT_AND_INTERVAL = r"\d+\.\d% \[\d+\.\d, \d+\.\d\]"


def test_the_card_and_summary_compare_with_each_view_and_a_plain_model_with_intervals(tmp_path, capsys):
    views, labels = dataset()
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    card = (out / "card.md").read_text()
    for view in DIMS:
        assert re.search(rf"\| `{view}` alone \| {PERCENT_AND_INTERVAL} \| 12 \|", card)
    assert re.search(rf"\| fused \| \*\*{PERCENT_AND_INTERVAL}\*\* \| 12 \|", card)
    assert re.search(rf"\| logistic regression on all views \| {PERCENT_AND_INTERVAL} \| 12 \|", card)
    assert re.search(rf"\| test \| {PERCENT_AND_INTERVAL} of 12 \| {PERCENT_AND_INTERVAL} of 12 \|", card)
    assert re.search(r"\| 0\.9 \| \d+\.\d% \[\d+\.\d, \d+\.\d\] \|", card)  # coverage, with its band
    # The card's ECE is the manifest's (15 bins both; the card used 10), beside what noise alone gives.
    ece = read_manifest(out).calibration.test.ece_confidence
    assert f"has **ECE {ece:.3f}**, where a perfectly calibrated confidence would score up to 0." in card
    assert "on these 12 samples (19 times in 20" in card
    summary = capsys.readouterr().out
    assert re.search(r"\(best view alone \d\.\d{3}, \w+; all-views logistic regression \d\.\d{3}\)", summary)
    assert re.search(r"test: \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] clean", summary)


def test_the_summary_gives_the_accuracy_and_flag_rates_with_their_intervals_and_counts(tmp_path, capsys):
    # On 12 test samples an accuracy of 1.000 can be as low as 0.735: the summary line, what a user reads
    # first, says so, as the card's summary does.
    from scipy.stats import binomtest

    views, labels = dataset()
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    summary, manifest = capsys.readouterr().out, read_manifest(out)

    def shown(rate: float) -> str:
        right = round(rate * 12)
        interval = binomtest(right, 12).proportion_ci(method="exact")
        return f"{right / 12:.3f} [{interval.low:.3f}, {interval.high:.3f}]"

    assert f"accuracy {shown(manifest.metrics.acc_normal)} on 12 clean test samples (best view" in summary
    flag = manifest.conflict_flag.test
    assert f"(test: {shown(flag.clean)} clean, {shown(flag.conflictive)} conflictive, of 12 each)" in summary


def test_a_small_validation_split_is_cross_fitted_and_an_unsupported_target_is_said(tmp_path, capsys):
    views, labels = dataset()  # 60 samples: 6 to validate, 48 not to test
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    calibration = read_manifest(out).calibration
    assert calibration.fitted_on == CalibrationSamples(kind="cross-fitted", samples=48, folds=5)
    assert len(calibration.conformal.calibration_scores) == 48  # not the validation split's 6
    assert calibration.validation.samples == 48
    warning = "the flag's target, 5.0% of clean samples, rests on 48 clean calibration samples"
    assert f"warning: {warning}" in capsys.readouterr().err
    card = (out / "card.md").read_text()
    assert "## Warnings" in card and warning in card
    assert "out-of-fold evidence of all 48 non-test samples" in card and "Cross-conformal" in card


def test_a_cross_fitted_card_claims_no_guarantee_for_the_served_model_theory_gives_only_the_fold_models(
    tmp_path,
):
    """Cross-fitted, the card said "theory guarantees a coverage of at least 1 - 2 (1 - c)" for the served
    model's sets. CV+'s bound (Barber et al. 2021) is for sets made with the fold models' own scores of a
    new sample; the served model is another model (trained on the training split, not the fold models'
    data), held to their threshold: what backs its coverage is measurement (training/crossfit.py)."""
    views, labels = dataset()  # 60 samples: cross-fitted
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    card = " ".join((out / "card.md").read_text().split())
    assert "theory guarantees a coverage of at least 1 - 2 (1 - c)" not in card
    assert "theory guarantees the 5 fold models' own sets a coverage of at least 1 - 2 (1 - c)" in card
    assert "the served model is held to their threshold without a guarantee of its own" in card


def test_a_large_validation_split_calibrates_alone_with_split_conformal(tmp_path, capsys):
    views, labels = dataset(per_class=1000)  # 300 to validate: enough to calibrate on alone
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, "--epochs", "2") == 0
    calibration = read_manifest(out).calibration
    assert calibration.fitted_on == CalibrationSamples(kind="validation", samples=300)
    assert len(calibration.conformal.calibration_scores) == 300
    assert "flag's target" not in capsys.readouterr().err  # 15 expected flags: enough
    assert "Split conformal" in (out / "card.md").read_text()


@pytest.mark.slow
def test_a_weak_view_does_not_outvote_a_strong_one(tmp_path, capsys):
    # Iris as sepal and petal views: the sepal head alone is right about 7 times in 10, the petal head 9 in
    # 10.
    # Trained with each view's own term as heavy as the fused one (the paper's beta 1), the sepal head is
    # confident in its mistakes and the fusion falls below the petal head alone. fit's default sees that
    # out of fold (iris is cross-fitted) and trains the heads again with the fused term first. The cap
    # keeps the test short: both runs are still improving at it.
    from sklearn.datasets import load_iris

    iris = load_iris()
    views = {"sepal": iris.data[:, :2].astype(np.float32), "petal": iris.data[:, 2:].astype(np.float32)}
    data = write_npy(tmp_path / "data", views, np.asarray(iris.target_names)[iris.target])
    below = "below its best view alone (`petal`:"
    common = ["--data", data, "--hidden", "0", "--epochs", "3000", "--quiet"]
    assert fit(*common, "--out", tmp_path / "paper", "--beta", "1") == 0
    assert below in capsys.readouterr().err
    assert fit(*common, "--out", tmp_path / "default") == 0
    assert below not in capsys.readouterr().err
    training = read_manifest(tmp_path / "default").training
    assert training["beta"] == 0.1 and training["outvoted"]["kept"]
    card = (tmp_path / "default" / "card.md").read_text()
    assert "trained again with each view's own term weighted 0.1" in card
    assert "below its best view `petal` on every non-test sample, out of fold (5 models)" in card
    rate = r"\d+\.\d% \[\d+\.\d, \d+\.\d\] of \d+"  # each with its interval and count
    assert re.search(rf"out of fold \(5 models\) \({rate} against {rate}\): {rate}, kept", card)


def test_a_view_given_twice_is_warned_about_even_in_other_units(tmp_path, capsys):
    """An audit's data held one view twice: fused, its evidence counted twice and its copies never
    disagreed, and the card said nothing. A copy in other units (millimetres for metres) is the same view
    once scaled."""
    views, labels = dataset()
    views["sensor_mm"] = views["sensor"] * 1000
    out = tmp_path / "model"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    said = "`sensor` and `sensor_mm` hold the same features in every training sample"
    assert said in capsys.readouterr().err and said in (out / "card.md").read_text()
    assert "`image` and" not in (out / "card.md").read_text()


def test_a_useless_view_is_warned_about(tmp_path, capsys):
    # One view that tells the classes apart, three wide ones of pure noise the heads overfit to: DBF's fusion
    # of the four is below the good view alone (two narrow noise views no longer pull it down now that fit's
    # budget follows the data).
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.array(CLASSES), 60))
    means = 1.5 * rng.normal(size=(len(CLASSES), 4))
    views = {"signal": (means[np.searchsorted(CLASSES, labels)] + rng.normal(size=(labels.size, 4)))}
    views |= {name: rng.normal(size=(labels.size, 60)) for name in ("noise_a", "noise_b", "noise_c")}
    views = {name: matrix.astype(np.float32) for name, matrix in views.items()}
    out = tmp_path / "models" / "pets"
    # The paper's beta alone: fit's default would train the heads again where the validation split shows
    # the fused model outvoted, and the warning is for what that cannot mend.
    command = ["--data", write_npy(tmp_path / "data", views, labels), "--out", out, "--epochs", "300"]
    assert fit(*command, "--beta", "1", "--quiet") == 0
    error = capsys.readouterr().err
    assert "below its best view alone (`signal`:" in error and "try `--views` without it" in error
    assert "below its best view alone (`signal`:" in (out / "card.md").read_text()
    # Each noise view alone: no better than answering the commonest class, named; the signal view is not.
    for name in ("noise_a", "noise_b", "noise_c"):
        assert f"`{name}` alone is right on" in error and "no better than always answering" in error
    assert "`signal` alone is right on" not in error


def test_categories_shared_by_test_and_fitted_samples_are_not_called_optimistic_alone(tmp_path, capsys):
    """A probe's data of categories alone (three views of two 3-level codes, 600 samples: 410 distinct
    rows): 54 of its 119 test samples were exact copies of fitted ones, and the warning said every test
    figure was optimistic and to drop duplicates. Distinct samples drawn alike share their features there:
    on 20,000 new samples the model was right 82.9% of the time, inside the test's 87.4% [80.1, 92.8], and
    its copies no likelier right than the rest (88.9%, 86.2%); dropping them would skew the data. The
    warning says which reading is which."""
    rng = np.random.default_rng(0)
    views = {name: rng.integers(0, 3, (300, 2)) for name in ("household", "vehicle", "region")}
    score = sum(matrix[:, 0] for matrix in views.values()) + rng.normal(0, 0.7, 300)
    data = write_npy(tmp_path / "data", views, np.where(score > 3, "high", "low"))
    assert fit("--data", data, "--out", tmp_path / "models" / "households", *QUICK) == 0
    [warning] = [line for line in capsys.readouterr().err.splitlines() if "exact copies" in line]
    assert "where they are one sample recorded twice, every test figure here is optimistic" in warning
    assert "where distinct samples can share all their features" in warning
    assert "such copies are expected and the figures hold" in warning


def test_the_card_shows_class_names_as_written_and_runs_none_of_them(tmp_path):
    """Class names are the data's: a bar broke the card's class table, a line break started a heading, and
    a tag was written as HTML that renderers run (mkdocs among them). And a run its epoch cap ended while
    still improving is among the warnings, as the card's documentation says."""
    views, labels = dataset()
    names = {"cat": "a|b", "dog": "x\n## heading", "eel": "<img src=x onerror=alert(1)>"}
    labels = np.array([names[label] for label in labels])
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    card = (out / "card.md").read_text()
    table = card[card.index("| class | samples |") :].split("\n\n")[0].splitlines()
    assert [line.count("|") - line.count("\\|") for line in table] == [3] * 5
    assert "<img" not in card and "\n## heading" not in card
    assert r"a\|b" in card and r"x\\n\#\# heading" in card and "&lt;img src=x onerror=alert(1)&gt;" in card
    warnings = card[card.index("## Warnings") : card.index("## Data")]
    assert (
        "the epoch cap ended training after 4 epochs while the validation loss was still improving"
        in warnings
    )


@pytest.mark.parametrize("separation", [3.0, 0.3])
def test_a_run_cut_while_improving_is_called_underfitted_only_where_it_answers_wrongly(tmp_path, separation):
    """A probe's run the epoch cap ended, right on every test sample: the card said "the model may be
    underfitted; raise `--epochs`". Where every answer is right, a falling loss is evidence still growing."""
    views, labels = dataset()
    rng = np.random.default_rng(1)
    codes = np.searchsorted(CLASSES, labels)
    views = {
        name: separation * rng.normal(size=(len(CLASSES), view.shape[1]))[codes] + rng.normal(size=view.shape)
        for name, view in views.items()
    }
    out = tmp_path / "model"
    data = write_npy(tmp_path / "data", views, labels)
    assert fit("--data", data, "--out", out, "--epochs", "40", "--quiet") == 0
    card = (out / "card.md").read_text()
    perfect = "| fused | **100.0% [" in card
    warnings = card[card.index("## Warnings") : card.index("## Data")]
    assert "the epoch cap ended training after 40 epochs while the validation loss was still" in warnings
    assert ("more certain rather than more accurate" in warnings) is perfect
    assert ("may be underfitted" in warnings) is not perfect
    assert perfect is (separation == 3.0)


# -- bad data: a clear error naming where, and nothing written ---------------------------------------------


def _npy(mutate: Callable[[dict, np.ndarray, Path], None]) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        views, labels = dataset()
        directory = write_npy(root / "data", views, labels)
        mutate(views, labels, directory)
        return directory

    return make


def _parquet(build: Callable[[dict, np.ndarray], dict]) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        views, labels = dataset()
        path = root / "data.parquet"
        pq.write_table(pa.table(build(views, labels)), path)
        return path

    return make


def _columns(views: dict, labels, **replaced) -> dict:
    columns = {name: list_column(matrix) for name, matrix in views.items()}
    return {**columns, "label": pa.array(labels), **replaced}


def _save(name: str, value) -> Callable[[dict, np.ndarray, Path], None]:
    return lambda views, labels, directory: np.save(directory / f"{name}.npy", value(views, labels))


def _with(views: dict, name: str, row: int, column: int, value: float) -> np.ndarray:
    matrix = views[name].astype(np.float64)
    matrix[row, column] = value
    return matrix


def _rename(old: str, new: str) -> Callable[[dict, np.ndarray, Path], None]:
    return lambda views, labels, directory: (directory / old).rename(directory / new)


def _labels_txt(text: str) -> Callable[[dict, np.ndarray, Path], None]:
    def mutate(views, labels, directory):
        (directory / "labels.npy").unlink()
        (directory / "labels.txt").write_text(text(labels))

    return mutate


def _few_eels(views, labels, directory):
    keep = np.flatnonzero(labels != "eel")[:40].tolist() + np.flatnonzero(labels == "eel")[:7].tolist()
    for name, matrix in views.items():
        np.save(directory / f"{name}.npy", matrix[keep])
    np.save(directory / "labels.npy", labels[keep])


def _unreadable(views, labels, directory):
    (directory / "text.npy").write_bytes(b"\x93NUMPY but not really")


def _one_view(views, labels, directory):
    for name in ("text", "sensor"):
        (directory / f"{name}.npy").unlink()


def _no_view_at_all(views, labels, directory):
    for name, matrix in views.items():
        matrix[4] = np.nan
        np.save(directory / f"{name}.npy", matrix)


BAD_DATA = {
    "row counts differ": (
        _npy(_save("text", lambda views, labels: views["text"][:-1])),
        [],
        ["text.npy has 59 rows", "labels.npy has 60 labels"],
    ),
    "infinite value": (
        _npy(_save("image", lambda views, labels: _with(views, "image", 7, 1, np.inf))),
        [],
        ["image.npy row 7, column 1: infinite"],
    ),
    "beyond float32": (
        _npy(_save("image", lambda views, labels: _with(views, "image", 3, 2, 1e300))),
        [],
        ["image.npy row 3, column 2: infinite value (or one beyond float32's range)"],
    ),
    "partly NaN row": (
        _npy(_save("sensor", lambda views, labels: _with(views, "sensor", 11, 2, np.nan))),
        [],
        ["sensor.npy row 11: NaN in column 2 among numbers", "fill in the missing numbers"],
    ),
    "partly null row in Parquet": (
        _parquet(
            lambda views, labels: _columns(
                views, labels, text=pa.array([[1.0, None, 2.0]] + [[0.0, 1.0, 2.0]] * 59)
            )
        ),
        [],
        ["data.parquet column 'text' row 0: NaN in column 1"],
    ),
    "rows of different lengths in Parquet": (
        _parquet(
            lambda views, labels: _columns(
                views, labels, text=pa.array([[1.0, 2.0, 3.0]] * 5 + [[1.0, 2.0]] + [[0.0, 1.0, 2.0]] * 54)
            )
        ),
        [],
        ["data.parquet column 'text' row 5: 2 numbers, where row 0, the first that has the view, has 3"],
    ),
    # The odd row the first that has the view: "row 3: 3 numbers, where earlier rows have 4", of rows 0 to 2,
    # two of them null, sent the user to row 3, like 56 others.
    "the first row of a Parquet view of another length": (
        _parquet(
            lambda views, labels: _columns(
                views, labels, text=pa.array([None] * 2 + [[1.0, 2.0, 3.0, 4.0]] + [[0.0, 1.0, 2.0]] * 57)
            )
        ),
        [],
        ["data.parquet column 'text' row 3: 3 numbers, where row 2, the first that has the view, has 4"],
    ),
    "non-numeric view": (
        _npy(_save("text", lambda views, labels: np.full((60, 3), "word"))),
        [],
        [
            "text.npy: dtype <U4 is not numeric",
            "move it out of the directory, or name the views with --views",
        ],
    ),
    "a view of images": (
        _npy(_save("image", lambda views, labels: np.ones((60, 4, 4), np.uint8))),
        [],
        ["image.npy: shape (60, 4, 4); a view is a matrix (N, d)", "reshape to (N, -1)"],
    ),
    "non-numeric Parquet column": (
        _parquet(lambda views, labels: _columns(views, labels, text=pa.array(["word"] * 60))),
        [],
        [
            "data.parquet column 'text': type string is not numeric",
            "name the views with --views to leave it out",
        ],
    ),
    "view of width 0": (
        _npy(_save("text", lambda views, labels: np.zeros((60, 0), np.float32))),
        [],
        ["text.npy: width 0"],
    ),
    "a single class": (
        _npy(_save("labels", lambda views, labels: np.full(60, "cat"))),
        [],
        ["labels.npy: a single class ('cat')"],
    ),
    "a class too small to split": (
        _npy(_few_eels),
        [],
        ["class 'eel' has 7 samples", "at least 10 per class are needed", "validation (10%), test (20%)"],
    ),
    "no labels": (
        _npy(lambda views, labels, directory: (directory / "labels.npy").unlink()),
        [],
        ["no labels.npy or labels.txt"],
    ),
    "a label missing": (
        _npy(_save("labels", lambda views, labels: np.where(np.arange(60) == 5, np.nan, labels == "cat"))),
        [],
        ["labels.npy row 5: label missing"],
    ),
    "a label missing in Parquet": (
        _parquet(
            lambda views, labels: _columns(views, labels, label=pa.array([*labels[:9], None, *labels[10:]]))
        ),
        [],
        ["data.parquet column 'label' row 9: label missing"],
    ),
    "a blank label": (  # a class named '' in answers, where labels.txt's blank line was refused
        _npy(_save("labels", lambda views, labels: np.where(np.arange(60) == 8, "", labels))),
        [],
        ["labels.npy row 8: label missing ('', a blank string); every sample needs a label"],
    ),
    "a blank label in Parquet": (
        _parquet(
            lambda views, labels: _columns(views, labels, label=pa.array([*labels[:9], " ", *labels[10:]]))
        ),
        [],
        ["data.parquet column 'label' row 9: label missing (' ', a blank string)"],
    ),
    "an empty line of labels.txt": (
        _npy(_labels_txt(lambda labels: "\n".join([*labels[:2], "", *labels[3:]]) + "\n")),
        [],
        ["labels.txt line 3: empty"],
    ),
    "no label column in Parquet": (
        _parquet(lambda views, labels: {name: list_column(m) for name, m in views.items()}),
        [],
        ["data.parquet: no label column 'label'", "--label-column"],
    ),
    "labels of mixed types": (  # an object array: a pickle, refused unread whatever it holds
        _npy(_save("labels", lambda views, labels: np.array([1, *labels[1:]], dtype=object))),
        [],
        ["labels.npy: Python objects, stored as a pickle, which is never loaded", "labels.txt"],
    ),
    "fractional labels": (
        _npy(_save("labels", lambda views, labels: np.linspace(0, 2, 60))),
        [],
        ["labels.npy row 1: label", "is not a class"],
    ),
    "a view name the API cannot take": (
        _npy(_rename("text.npy", "free text.npy")),
        [],
        ["free text.npy: 'free text' is not a valid view name for the API"],
    ),
    "a Parquet view name the API cannot take": (
        _parquet(lambda views, labels: _columns(views, labels, **{"$text": list_column(views["text"])})),
        [],
        ["data.parquet column '$text': '$text' is not a valid view name"],
    ),
    "an unreadable .npy file": (_npy(_unreadable), [], ["text.npy: not a readable .npy file"]),
    "an unreadable Parquet file": (
        lambda root: (root / "data.parquet").write_bytes(b"PAR1 garbage") and root / "data.parquet",
        [],
        ["data.parquet: not a readable Parquet file"],
    ),
    "a sample without any view": (_npy(_no_view_at_all), [], ["row 4: no view at all"]),
    "a single view": (_npy(_one_view), [], ["DBF fuses two or more views; found 1 (image)"]),
    "an unknown view asked for": (
        _npy(lambda views, labels, directory: None),
        ["--views", "image,audio"],
        ["no view 'audio' (audio.npy); views there: image, sensor, text"],
    ),
    "a label outside the given classes": (
        _npy(lambda views, labels, directory: None),
        ["--classes", "cat,dog"],
        ["labels.npy row", "label 'eel' is not among the class names given (cat, dog)"],
    ),
    "a class given that no label has": (  # it was a class of "0 samples", not said where it was listed
        _npy(lambda views, labels, directory: (directory / "classes.txt").write_text("cat\ndog\neel\nfox\n")),
        [],
        ["labels.npy: no sample of class 'fox', which the class names given (classes.txt or --classes) list"],
    ),
    "an unknown split": (
        _npy(_save("fold", lambda views, labels: np.array(["train"] * 59 + ["dev"]))),
        ["--split-column", "fold"],
        ["fold.npy row 59: split 'dev'; expected one of train, validation, test"],
    ),
    "a split without a class": (
        _npy(_save("fold", lambda views, labels: np.where(labels == "eel", "train", "test"))),
        ["--split-column", "fold"],
        ["the split column puts no sample of class 'cat' in train"],
    ),
    "missing data": (lambda root: root / "nowhere", [], ["nowhere: no such file or directory"]),
    "no rows": (
        _npy(
            lambda views, labels, directory: (
                [np.save(directory / f"{name}.npy", matrix[:0]) for name, matrix in views.items()]
                + [np.save(directory / "labels.npy", labels[:0])]
            )
        ),
        [],
        ["image.npy: no rows"],
    ),
    "no rows in Parquet": (
        _parquet(
            lambda views, labels: (
                {name: list_column(m)[:0] for name, m in views.items()} | {"label": pa.array(labels[:0])}
            )
        ),
        [],
        ["data.parquet column 'image': no rows"],
    ),
    "a view wider than the service serves": (
        _npy(_save("text", lambda views, labels: np.zeros((60, 65537), np.float16))),
        [],
        ["text.npy: 65,537 features per sample; the service serves views of at most 65,536"],
    ),
    # One wide row, then nulls: its width would have made the matrix of every row that wide (6.4 GB for
    # a 179 KB file, a probe found) before a narrower row was seen.
    "one row wider than the service serves in Parquet": (
        _parquet(
            lambda views, labels: _columns(
                views, labels, text=pa.array([[0.0] * 300_000] + [None] * 29 + [[0.0, 1.0, 2.0]] * 30)
            )
        ),
        [],
        ["data.parquet column 'text' row 0: 300,000 features per sample"],
    ),
    "hidden layers too wide to export": (
        _npy(lambda views, labels, directory: None),
        ["--hidden", "100000000"],
        ["900,000,003 weights in one head, over the 2 GiB an ONNX file holds"],
    ),
    "a class written two ways": (
        _npy(
            _save(
                "labels",
                lambda views, labels: np.where(np.arange(60) % 7 == 3, np.char.add(labels, " "), labels),
            )
        ),
        [],
        ["labels.npy rows", "differ only in surrounding whitespace or Unicode form"],
    ),
    "no view asked for": (
        _npy(lambda views, labels, directory: None),
        ["--views", ","],
        ["--views names no view"],
    ),
}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_data_is_refused_naming_where_and_nothing_is_written(case, tmp_path, capsys):
    make, options, expected = BAD_DATA[case]
    source = make(tmp_path)
    models = tmp_path / "models"
    (models / "pets").mkdir(parents=True)
    (models / "pets" / "manifest.json").write_text("the model served until now")
    before = _snapshot(models)
    assert fit("--data", source, "--out", models / "pets", *options, *QUICK) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "Traceback" not in error
    for fragment in expected:
        assert fragment in error
    assert _snapshot(models) == before
    assert sorted(p.name for p in models.iterdir()) == ["pets"]


def test_rows_of_other_lengths_are_found_in_any_batch(tmp_path, capsys, monkeypatch):
    import training.readers

    monkeypatch.setattr(training.readers, "_CHUNK_BYTES", 1)  # one row per batch
    test_bad_data_is_refused_naming_where_and_nothing_is_written(
        "rows of different lengths in Parquet", tmp_path, capsys
    )


def test_a_bad_model_name_is_refused_before_training(tmp_path, capsys):
    views, labels = dataset()
    data = write_npy(tmp_path / "data", views, labels)
    assert fit("--data", data, "--out", tmp_path / "models" / "my model", *QUICK) == 1
    assert "'my model' is not a valid model name" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_a_failed_export_leaves_the_served_model_untouched(tmp_path, monkeypatch):
    views, labels = dataset()
    data = write_npy(tmp_path / "data", views, labels)
    out = tmp_path / "models" / "pets"
    assert fit("--data", data, "--out", out, *QUICK) == 0
    before = _snapshot(tmp_path / "models")

    def broken(*args, view, **kwargs):
        raise exporting.ParityError(f"view {view}: ONNX evidence differs from torch")

    monkeypatch.setattr(exporting, "check_parity", broken)
    with pytest.raises(exporting.ParityError, match="view image"):
        fit("--data", data, "--out", out, "--seed", "1", *QUICK)
    assert _snapshot(tmp_path / "models") == before


# -- data -> fit -> served: the service answers as the exported heads and fusion do in-process -------------


def test_a_fitted_model_is_served_after_a_reload_as_its_heads_and_fusion_answer(tmp_path):
    views, labels = dataset(missing=0.2, seed=3)
    repository = tmp_path / "models"
    first = write_npy(tmp_path / "first", *dataset(seed=4))
    assert fit("--data", first, "--out", repository / "first", *QUICK) == 0
    source = write_parquet(tmp_path / "pets.parquet", views, labels)
    with running_service("--model-dir", str(repository)) as url:
        assert [m["name"] for m in httpx.get(url + "/v1/models").json()["models"]] == ["first"]
        # The command as users run it, into the served repository.
        command = ["fit", "--data", str(source), "--out", str(repository / "pets"), *QUICK]
        done = subprocess.run(
            [sys.executable, "-m", "training", *command], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        reloaded = httpx.post(url + "/v1/admin/reload", timeout=60)
        assert reloaded.status_code == 200 and reloaded.json()["models"] == ["first", "pets"]

        picked = np.arange(0, 60, 3)
        present = ~np.isnan(np.stack([views[name][picked, 0] for name in DIMS], axis=1))
        assert (~present).any() and present.any(axis=1).all()
        samples = [
            {"views": {name: views[name][i].tolist() for name in DIMS if not np.isnan(views[name][i, 0])}}
            for i in picked
        ]
        answer = httpx.post(url + "/v1/models/pets/predict", json={"samples": samples}, timeout=30)
        assert answer.status_code == 200, answer.text
        served = answer.json()

    manifest = read_manifest(repository / "pets")
    order = [view.name for view in manifest.views]
    mask = np.stack([present[:, list(DIMS).index(name)] for name in order], axis=1)
    features = {name: np.nan_to_num(views[name][picked]) for name in order}  # placeholders where missing
    fused = fuse(opinion_from_evidence(exported_evidence(repository / "pets", features)), "dbf", mask=mask)
    assert served["views"] == order
    predictions = served["predictions"]
    np.testing.assert_allclose(
        [p["probability"] for p in predictions], fused.probability, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        [p["uncertainty"] for p in predictions], fused.uncertainty, rtol=1e-5, atol=1e-6
    )
    assert [p["class_name"] for p in predictions] == [CLASSES[k] for k in fused.probability.argmax(-1)]
    for p, conflict, discount, has in zip(predictions, fused.conflict, fused.discount, mask, strict=True):
        for a in range(len(order)):
            for b in range(len(order)):
                value = p["conflict"][a][b] if p["conflict"][a] is not None else None
                if has[a] and has[b]:
                    assert value == pytest.approx(float(conflict[a, b]), rel=1e-5, abs=1e-6)
                else:
                    assert value is None
        assert p["discount"] == pytest.approx(
            {name: float(discount[v]) for v, name in enumerate(order) if has[v]}, rel=1e-5, abs=1e-6
        )
    assert json.loads((repository / "pets" / "manifest.json").read_text())["classes"] == list(CLASSES)


def _far_out_of_range(directory: Path, *, every: int) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """Two classes, two views that each separate them, a split column; view ``image`` of every ``every``-th
    test sample far out of its training range, along the other class's side: alone, that view would say the
    wrong class, and loudly. The data's directory, its views, and the test rows."""
    rng = np.random.default_rng(5)
    labels = np.repeat([0, 1], 60)
    means = {"image": 3 * rng.normal(size=(2, 4)), "text": 3 * rng.normal(size=(2, 3))}
    views = {n: (m[labels] + rng.normal(size=(120, m.shape[1]))).astype(np.float32) for n, m in means.items()}
    split = np.array((["train"] * 44 + ["validation"] * 6 + ["test"] * 10) * 2)
    test = np.flatnonzero(split == "test")
    far, image = test[::every], means["image"]
    views["image"][far] = image[1 - labels[far]] + 30 * (image[1 - labels[far]] - image[labels[far]])
    return write_npy(directory, views, np.array(["cat", "dog"])[labels], fold=split), views, test


def test_the_card_measures_test_views_far_out_of_range_as_the_service_fuses_them(tmp_path):
    """A view far outside its training range is fused as missing by the service; the card's accuracy is
    the served model's, not that of a model fusing what the service leaves out."""
    data, views, test = _far_out_of_range(tmp_path / "far", every=2)
    out = tmp_path / "m"
    assert fit("--data", data, "--out", out, "--split-column", "fold", *QUICK) == 0

    features = {name: views[name][test] for name in ("image", "text")}
    evidence, labels = exported_evidence(out, features), np.repeat([0, 1], 10)
    in_range = exported_range_excess(out, features) <= read_manifest(out).out_of_range.threshold
    assert in_range[:, 0].tolist() == [False, True] * 10 and in_range[:, 1].all()
    served = fuse(opinion_from_evidence(evidence), "dbf", mask=in_range).belief.argmax(-1) == labels
    fusing_all = fuse(opinion_from_evidence(evidence), "dbf").belief.argmax(-1) == labels
    assert served.mean() != fusing_all.mean()  # the two rules tell apart on this data
    assert read_manifest(out).metrics.acc_normal == pytest.approx(served.mean())
    card = " ".join((out / "card.md").read_text().split())
    assert "10 views of validation and test samples lie far outside their training range" in card
    assert "(range excess above 0.2: `image` 10)" in card


def test_a_test_split_whose_views_are_all_far_out_of_range_is_refused_saying_so(tmp_path, capsys):
    data, _, _ = _far_out_of_range(tmp_path / "far", every=1)
    assert fit("--data", data, "--out", tmp_path / "m", "--split-column", "fold", *QUICK) == 1
    error = " ".join(capsys.readouterr().err.split())
    assert "no test sample has two views or more" in error
    assert "20 of its 20 samples have a view far outside the training split's range" in error
    assert not (tmp_path / "m").exists()


class _Scored:
    """A split's flag scores alone: what :meth:`PostHoc.flag_warnings` reads of it (conflictive copies all
    flagged unless given)."""

    def __init__(self, clean: np.ndarray, conflictive: np.ndarray | None = None) -> None:
        conflictive = np.ones_like(clean) if conflictive is None else conflictive
        self.clean = {"max_conflict": clean, "uncertainty": clean}
        self.conflictive = {"max_conflict": conflictive, "uncertainty": conflictive}

    def flag_scores(self):
        return self.clean, self.conflictive


def _post_hoc():
    """A flag at 0.5 for 5% of clean samples, fitted on samples it flags 5% of."""
    from training.calibrate import PostHoc

    return PostHoc(
        score="max_conflict",
        threshold=0.5,
        target_false_positive_rate=0.05,
        separation={},
        fitted=_Scored(np.where(np.arange(200) < 10, 0.9, 0.1)),
        fitted_on=None,
        section=None,
    )


@pytest.mark.parametrize(
    ("confidence", "projected", "gap_low", "warned"),
    [
        (0.173, 0.098, 0.02, True),
        (0.130, 0.098, 0.02, False),
        (0.173, 0.200, -0.05, False),
        (0.234, 0.156, -0.12, False),
    ],
    ids=["worse than both", "within noise", "better than projected", "gap within chance"],
)
def test_a_confidence_calibrated_worse_than_the_raw_probability_beyond_noise_is_warned_about(
    confidence, projected, gap_low, warned
):
    """An audit's fit served a `confidence` of ECE 0.173 on its test samples, where the projected
    probability it was fitted to improve had 0.098 and noise explains up to 0.144: the card gave the three
    figures and said nothing. Worse than both, by a gap beyond chance, is warned about; within noise,
    better than the probability, or worse by a gap the test samples cannot tell from chance, is not."""
    from training.calibrate import confidence_warnings

    section = Manifest.model_validate_json(
        (Path(__file__).resolve().parents[2] / "models" / "handwritten" / "manifest.json").read_text()
    ).calibration
    figures = section.test.model_copy(update={"ece_confidence": confidence, "ece_projected": projected})
    notes = confidence_warnings(section.model_copy(update={"test": figures}), noise=0.144, gap_low=gap_low)
    said = (
        f"the served `confidence` (isotonic) has ECE {confidence:.3f} on the {figures.samples} clean test "
        f"samples, above the projected probability's {projected:.3f} (by at least {gap_low:.3f}, 19 times in "
        "20) and above what sampling noise explains there (0.144): its calibrator did not carry over"
    )
    assert [said in note for note in notes] == ([True] if warned else [])


def test_a_confidence_gap_the_test_samples_cannot_tell_from_chance_is_not_called_worse():
    """A probe's fit (150 samples, 4 classes, three weak views) warned that its `confidence` had ECE 0.234
    on its 29 test samples against the projected probability's 0.156, beyond noise (0.219), and told the
    user to read `probability` instead; on 20,000 new samples of the same distribution, `confidence` had
    ECE 0.127 and the probability 0.281. These are its test samples, as served: a paired bootstrap finds
    the gap within chance."""
    from calibration import ece_gap_low, ece_noise, expected_calibration_error

    confidence = [0.8889, 0.7333, 0.7333, 0.7333, 0.3462, 0.2222, 0.3, 0.7333, 0.7333, 0.8889, 0.7333, 0.3]
    confidence += [0.3801, 0.3, 0.9918, 0.9918, 0.3462, 0.7333, 0.9091, 0.0082, 0.3462, 0.3462, 0.7333]
    confidence += [0.7333, 0.0082, 0.4486, 0.0082, 0.8249, 0.3]
    projected = [0.3369, 0.3145, 0.2973, 0.3002, 0.2828, 0.2713, 0.2729, 0.3091, 0.3223, 0.3291, 0.3046]
    projected += [0.2739, 0.2942, 0.2766, 0.4837, 0.536, 0.284, 0.3285, 0.3579, 0.2641, 0.3014, 0.2776]
    projected += [0.3123, 0.3311, 0.2635, 0.2889, 0.2648, 0.3157, 0.275]
    correct = np.array(
        [1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 1, 1], bool
    )
    ece_confidence = expected_calibration_error(confidence, correct)
    assert ece_confidence > max(expected_calibration_error(projected, correct), ece_noise(confidence))
    assert ece_gap_low(confidence, projected, correct) <= 0


def test_a_tiny_flag_threshold_is_shown_as_it_is_not_as_zero():
    """A probe with a view constant but for 3 of 300 samples: its head gave no evidence, the fused
    conflict stayed near 0, and the flag's threshold, 2.47e-05, was shown as "`max_conflict` >= 0.0000",
    which reads as raising on every sample, beside a clean test rate of 0.0%."""
    from dataclasses import replace
    from types import SimpleNamespace

    from training.card import conflict_detection

    post_hoc = replace(
        _post_hoc(),
        threshold=2.4716e-05,
        separation={"max_conflict": 0.5},
        fitted=_Scored(np.zeros(200)),
        fitted_on=CalibrationSamples(kind="validation", samples=200),
    )
    flag = SimpleNamespace(
        score="max_conflict",
        threshold=post_hoc.threshold,
        target_false_positive_rate=0.05,
        validation_auroc=post_hoc.separation,
    )
    manifest = SimpleNamespace(conflict_flag=flag, metrics=SimpleNamespace(auc=0.5))
    report = SimpleNamespace(post_hoc=post_hoc, test=_Scored(np.zeros(60)))
    text = conflict_detection(report, manifest).text
    assert "`max_conflict` >= 2.472e-05" in text and ">= 0.0000" not in text


@pytest.mark.parametrize(
    ("raised", "warned"),
    [(0, True), (3, True), (6, False), (10, False), (20, False), (45, True), (100, True)],
)
def test_a_flag_far_from_its_target_on_the_test_split_is_warned_about(raised, warned):
    """At a 5% target, 200 clean test samples: a rate whose 95% interval excludes 5% and that is below half
    or above twice the target is warned about (a constant view's head made it 50.8%); nearby rates are
    not (an interval alone misses 5% in one fit of twenty)."""
    scores = np.where(np.arange(200) < raised, 0.9, 0.1)
    notes = _post_hoc().flag_warnings(_Scored(scores))
    assert bool(notes) == warned, notes
    if warned:
        assert f"raised {raised / 200:.1%}" in notes[0] and "target 5.0%" in notes[0]


@pytest.mark.parametrize(
    ("conflictive", "warned"), [(0, True), (10, True), (19, True), (20, False), (60, False), (200, False)]
)
def test_a_flag_blind_to_conflict_is_warned_about(conflictive, warned):
    """10 of 200 clean test samples flagged (its 5% target): a flag that raises on fewer than twice as many
    conflictive copies (the twenty-class probe: 5.5% against 4.0%) cannot tell conflict from chance, and
    the conflict alerts, at twice the clean rate, cannot see with it."""
    clean = np.where(np.arange(200) < 10, 0.9, 0.1)
    copies = np.where(np.arange(200) < conflictive, 0.9, 0.1)
    notes = _post_hoc().flag_warnings(_Scored(clean, copies))
    assert bool(notes) == warned, notes
    if warned:
        assert notes[0].startswith("the flag hardly tells conflictive test samples from clean ones")
        assert f"raised {conflictive / 200:.1%} of conflictive and 5.0% of clean" in notes[0]


def test_a_flag_that_raises_on_nothing_is_warned_about():
    """A flag that raised on none of the clean and none of the conflictive test samples (a probe's 60-sample
    fit: 0 of 12 each) catches nothing: 0 is not less than twice 0, and no warning said so."""
    notes = _post_hoc().flag_warnings(_Scored(np.full(200, 0.1), np.full(200, 0.1)))
    assert any(note.startswith("the flag hardly tells conflictive test samples") for note in notes), notes


def _comparison(fused: tuple[int, int], classes: dict[str, tuple[int, int]], views=None, baseline=None):
    from training.baseline import Baseline, Comparison
    from training.metrics import Rate

    views = views or {"a": Rate(*fused), "b": Rate(*fused)}
    baseline = Baseline(accuracy=Rate(*(baseline or fused)), regularisation=1.0, training_rows=100)
    return Comparison(
        fused=Rate(*fused),
        views=views,
        baseline=baseline,
        commonest={view: 0.5 for view in views},
        classes={name: Rate(*counts) for name, counts in classes.items()},
    )


def test_a_model_answering_the_commonest_class_is_warned_about():
    """99:1 data (a probe's: 1,980 and 20 samples): the default fit answered the commonest class for every
    sample, and its card said 99.0% with no warning. Now it says that is no better than always answering
    the commonest class, and names the class it never gets right."""
    notes = _comparison((396, 400), {"common": (396, 396), "rare": (0, 4)}).warnings()
    assert any("no better than always answering the commonest class (99.0%)" in note for note in notes), notes
    assert any(
        "far less often on 1 of the 2 classes (`rare` 0.0% [0.0%, 60.2%] of 4): it favours the commonest"
        in note
        for note in notes
    )


def test_classes_neglected_under_balanced_weighting_are_not_told_to_use_it():
    """A probe's 10:1:1 data (1,000 samples, two views) fitted with `--class-weighting balanced`: the fused
    model was right on 31.2% of the 16 test samples of its rarest class, and the warning told the user to
    try `--class-weighting balanced`, the weighting the fit had used. Other weightings are still told."""
    from dataclasses import replace

    comparison = _comparison((396, 400), {"common": (390, 390), "rare": (6, 10)})
    [balanced] = [
        note
        for note in replace(comparison, class_weighting="balanced").warnings()
        if "far less often" in note
    ]
    assert "it favours the commonest classes" in balanced
    assert "--class-weighting balanced" not in balanced
    assert "already weigh as much in all" in balanced
    for weighting in ("none", "sqrt"):
        [note] = [
            note for note in replace(comparison, class_weighting=weighting).warnings() if "far less" in note
        ]
        assert "`--class-weighting balanced` to weigh each class's samples as much in all" in note


def test_a_rate_measured_above_the_commonest_class_is_not_called_no_better_than_it():
    """A 60-sample probe (two-moons coordinates as views, 12 test samples, 6 per class): the x-coordinate
    alone was right on 9 of 12, and the warning said "75.0% [42.8%, 94.5%] ..., no better than always
    answering their commonest class (50.0%)", contradicting the figure beside it. An interval reaching the
    commonest share says the test split cannot tell them apart, not that the view is no better; a rate at
    or below it is still called no better."""
    from training.metrics import Rate

    views = {"horizontal": Rate(9, 12), "noise": Rate(5, 12), "vertical": Rate(11, 12)}
    notes = _comparison((12, 12), {"0": (6, 6), "1": (6, 6)}, views=views).warnings()
    [above] = [note for note in notes if "`horizontal` alone" in note]
    assert "75.0% [42.8%, 94.5%] of the test samples that have it, not clearly better than always" in above
    assert "no better" not in above
    [below] = [note for note in notes if "`noise` alone" in note]
    assert "no better than always answering their commonest class (50.0%)" in below
    [fused] = _comparison((7, 12), {"0": (4, 6), "1": (3, 6)}).warnings()[:1]
    assert "right on 58.3% [27.7%, 84.8%] of test samples, not clearly better than always answering" in fused


def test_a_view_the_test_split_cannot_judge_is_not_told_to_be_left_out():
    """A probe's 280 samples, 14 of the rare class: 55 test samples, 2 rare. The `camera` head alone was
    right on all 55, above the fused model (96.4%), and was told it "may carry nothing its head can use
    ...; if so, leave it out": on 55 samples 96.4% of one class, even a perfect head's interval [93.5,
    100] reaches 96.4%. Such views get one note saying the split cannot judge them; a view the split
    could have shown better, and did not, is still told what it is told."""
    from training.baseline import Baseline, Comparison
    from training.metrics import Rate

    comparison = Comparison(
        fused=Rate(53, 55),
        views={"camera": Rate(55, 55), "radar": Rate(41, 43), "noise": Rate(60, 100)},
        baseline=Baseline(accuracy=Rate(54, 55), regularisation=1.0, training_rows=198),
        commonest={"camera": 53 / 55, "radar": 41 / 43, "noise": 0.6},
        classes={"defect": Rate(0, 2), "normal": Rate(53, 53)},
    )
    notes = comparison.warnings()
    assert not [note for note in notes if "`camera` alone is right on" in note or "`radar` alone" in note]
    [unjudged] = [note for note in notes if note.startswith("the test split cannot tell")]
    named = "cannot tell `camera` (100.0% of 55), `radar` (95.3% of 43) alone from always answering"
    assert named in unjudged
    assert "leave it out" not in unjudged
    [noise] = [note for note in notes if "`noise` alone is right on 60.0%" in note]
    assert "no better than always answering their commonest class (60.0%)" in noise
    assert "leave it out" in noise


def test_classes_got_wrong_though_as_common_as_the_others_are_not_blamed_on_their_share():
    """A probe's 100 classes of 100 samples each: the warning said the model 'favours the commonest
    classes' of classes no rarer than the rest. It says they are harder to tell apart instead."""
    classes = {"hard": (5, 20), **{f"easy{i}": (19, 20) for i in range(9)}}
    notes = _comparison((176, 200), classes).warnings()
    [note] = [note for note in notes if "far less often on 1 of the 10 classes" in note]
    assert "no rarer than the others, but harder to tell apart with these views" in note
    assert "favours the commonest" not in note


def test_features_that_outliers_squeeze_are_warned_about(tmp_path, capsys):
    """A shapes probe's sensor statistics, outliers at 1e6 beside values of order 1: min-max scaled, the
    bulk of each feature was a sliver of [0, 1] (float32 kept 10 to 40 of its 5,000 levels), the fused
    model 11 points below gradient boosting, and the card said nothing. A view without outliers is not
    named."""
    views, labels = dataset(per_class=60)
    views["sensor"][0, :2] = 1e6  # one sample far out in two of its four features
    out = tmp_path / "model"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    err = capsys.readouterr().err
    said = "`sensor`: in 2 of its 4 features the middle 98% of the training values spans less than 1% of"
    assert said in err and said in (out / "card.md").read_text()
    assert "`image`: in" not in err and "`text`: in" not in err


def test_a_model_right_on_every_class_alike_is_not_warned_about():
    notes = _comparison((360, 400), {"a": (180, 200), "b": (180, 200)}).warnings()
    assert notes == []


def test_views_weak_alone_and_strong_together_are_warned_about_with_what_helps():
    """digits as its four quadrants (fit-quality benchmark): every head alone about 70%, the fused model
    90%, a logistic regression on all 64 pixels 96%. No head is useless, so leaving one out (what the
    warning said) cannot help; joining views that are parts of one modality can."""
    from training.metrics import Rate

    views = {f"quadrant_{i}": Rate(70 - i, 100) for i in range(4)}
    classes = {str(k): (18, 20) for k in range(5)}
    notes = _comparison((90, 100), classes, views=views, baseline=(96, 100)).warnings()
    [note] = [note for note in notes if "well below a logistic regression on all views (96.0%)" in note]
    assert "and so is each view's head alone (the best, `quadrant_0`, 70.0%)" in note
    assert "join their features into one view" in note and "leave out" not in note


def test_a_fused_model_below_the_logistic_regression_with_a_strong_view_is_told_to_leave_out_useless_ones():
    from training.metrics import Rate

    views = {"strong": Rate(95, 100), "noise": Rate(20, 100)}
    classes = {str(k): (18, 20) for k in range(5)}
    notes = _comparison((90, 100), classes, views=views, baseline=(96, 100)).warnings()
    [note] = [note for note in notes if "well below a logistic regression on all views (96.0%)" in note]
    assert "`--views` to leave out a useless view" in note and "join their features" not in note


@pytest.mark.parametrize(
    ("leak", "warned"), [((60, 60), True), ((59, 60), False), ((49, 49), False)], ids=str
)
def test_a_view_right_on_every_one_of_many_test_samples_is_asked_about_leaking_the_label(leak, warned):
    """A probe's view holding a code per class (a label leak): its head alone was right on every test
    sample, the fused model too, and the card said 100% without a word. A view flawless on 50 test samples
    or more is now asked about; one wrong answer, or fewer samples (an easy view often is flawless on a few
    dozen), and nothing is said."""
    from training.metrics import Rate

    views = {"code": Rate(*leak), "sensor": Rate(45, 60)}
    notes = _comparison((58, 60), {"0": (29, 30), "1": (29, 30)}, views=views).warnings()
    said = f"`code` ({leak[1]} of {leak[1]}) alone is right on every test sample that has it: check that no"
    assert any(said in note for note in notes) is warned, notes


def test_a_view_without_test_samples_is_not_the_best_view():
    """A view present in training samples only has no accuracy (NaN): it was taken for the best view, and
    the warning that the fused model is below its best view (`v1`, 6.6 points above it) was lost."""
    from training.metrics import Rate

    views = {"c": Rate(0, 0), "v1": Rate(37, 100), "v0": Rate(20, 100)}
    comparison = _comparison((30, 100), {"x": (10, 34), "y": (10, 33), "z": (10, 33)}, views=views)
    assert comparison.best_view == "v1"
    assert any("below its best view alone (`v1`: 37.0%)" in note for note in comparison.warnings())


@pytest.mark.parametrize(
    ("empty", "accuracy", "cause"),
    [(0.0, 0.97, "floor"), (0.02, 0.97, "larger"), (0.0, 0.80, "larger")],
    ids=["never-empty-and-accurate", "sets-may-be-empty", "accuracy-below-the-range"],
)
def test_the_card_explains_coverage_above_its_range(empty, accuracy, cause):
    """97.5% coverage of 400 test samples at 0.8 and 0.9, above both ranges. Where the model is right on
    97% and no set is empty, sets that always hold the predicted class cover at least that: the card says
    so. Where sets may be empty (LAC), or the accuracy (80%) lies below the ranges, that is no explanation
    (the card said it was, at a fit probe's 86% at 0.9): the sets are larger than the test samples
    needed."""
    from training.calibrate import CalibrationReport, SetFigures
    from training.card import _over_covered
    from training.metrics import coverage_band

    report = CalibrationReport(
        samples=400,
        accuracy=accuracy,
        ece_projected=0.0,
        ece_confidence=0.0,
        reliability_projected=None,
        reliability_confidence=None,
        clean={c: SetFigures(0.975, 2.4, empty, 1.0 - empty) for c in (0.8, 0.9)},
    )
    note = _over_covered(report, {c: coverage_band(400, c) for c in (0.8, 0.9)})
    assert "At 0.8, 0.9 the sets cover more than the range" in note
    assert ("price of never answering an empty set" in note) == (cause == "floor")
    assert ("called for larger sets than the test samples needed" in note) == (cause == "larger")
    if cause == "floor":
        assert f"({accuracy:.1%} here, above the range)" in note
    else:
        assert "(mean size 2.40 at 0.8, 2.40 at 0.9)" in note


def test_the_card_says_where_coverage_is_below_its_range():
    """A rates probe's split-conformal model (3,300 samples) covered 71.0% at 0.8 on its test split,
    below [74.5, 85.1], and the card claimed 'at least the coverage asked for' and said nothing more."""
    from training.calibrate import CalibrationReport, SetFigures
    from training.card import _under_covered
    from training.metrics import coverage_band

    report = CalibrationReport(
        samples=660,
        accuracy=0.8,
        ece_projected=0.0,
        ece_confidence=0.0,
        reliability_projected=None,
        reliability_confidence=None,
        clean={0.8: SetFigures(0.71, 1.1, 0.05, 0.9), 0.9: SetFigures(0.9, 1.5, 0.0, 0.6)},
    )
    bands = {c: coverage_band(660, c, calibration=660) for c in (0.8, 0.9)}
    note = _under_covered(report, bands)
    assert "less often than asked, below the range: at 0.8, 71.0% (range [" in note
    assert "at 0.9" not in note
    assert _under_covered(report, {0.8: (0.70, 0.9), 0.9: bands[0.9]}) == ""


def test_the_card_names_the_classes_the_sets_cover_less_often():
    """Marginal coverage hides a class the model gets wrong: class `rare` (a tenth of the samples, always
    taken for `a` with confidence) is the tenth the sets leave out, and the card names it."""
    from types import SimpleNamespace

    from fusion import Opinion
    from training.calibrate import FusedSplit, fit_confidence_and_sets
    from training.card import _under_covered_classes

    rng = np.random.default_rng(0)

    def split(n: int) -> FusedSplit:
        labels = rng.choice(3, size=n, p=[0.45, 0.45, 0.1])
        belief = np.full((n, 3), 0.05)
        belief[np.arange(n), np.where(labels == 2, 0, labels)] = 0.8  # `rare` looks like `a`
        belief += rng.uniform(0, 0.01, size=belief.shape)
        return FusedSplit(Opinion(belief / belief.sum(1, keepdims=True) * 0.9, np.full(n, 0.1)), labels)

    section = fit_confidence_and_sets(split(600), default_coverage=0.9)
    note = _under_covered_classes(
        SimpleNamespace(test=split(1000)), SimpleNamespace(classes=["a", "b", "rare"], calibration=section)
    )
    assert note.startswith("\nThe coverage is over all samples, not per class: at 0.9 the sets held")
    assert "for rare (" in note and "a (" not in note and "b (" not in note


def test_the_card_gives_each_views_agreement_with_the_others_as_the_manifest_has_it(tmp_path):
    views, labels = dataset()
    out = tmp_path / "models" / "pets"
    assert fit("--data", write_npy(tmp_path / "data", views, labels), "--out", out, *QUICK) == 0
    card, manifest = (out / "card.md").read_text(), read_manifest(out)
    assert set(manifest.view_agreement) == set(DIMS)
    for view, rates in manifest.view_agreement.items():
        # Cross-fitted here (60 samples): every non-test sample, out of fold; then the 12 test samples.
        assert (rates.samples, rates.test_samples) == (48, 12)
        # The alert's threshold starts from the low end of the clean rate's interval, which the card shows.
        row = (
            rf"\| `{view}` \| {100 * rates.clean:.1f}% \[{100 * rates.clean_low:.1f}, \d+\.\d\] of 48 \| "
            rf"{100 * rates.test:.1f}% \[\d+\.\d, \d+\.\d\] of 12 \| {100 * rates.chance:.1f}% \| "
            rf"{50 * (rates.clean_low + rates.chance):.1f}% \|"
        )
        assert re.search(row, card), row


def test_a_view_agreement_far_below_its_alert_threshold_on_the_test_split_is_warned_about():
    """The agreement alert's threshold comes from the samples fitted on (out-of-fold evidence of the fold
    models, or the validation split); where the served heads agree far less on the clean test split, the
    alert fires on clean traffic. A probe (a view of noise, 100 epochs, cross-fitted) measured 82.9% of 321
    fitted on (alert below 79.5%) and 58.2% [46.6, 69.2] of 79 on test, with no warning."""
    from fusion import Opinion
    from training.calibrate import FusedSplit, agreement_warnings

    def split(agreeing: int, total: int) -> FusedSplit:
        first = np.tile([0.9, 0.0], (total, 1))
        second = np.array([[0.9, 0.0] if i < agreeing else [0.0, 0.9] for i in range(total)])
        belief = np.stack([first, second], axis=1)
        fused = Opinion(belief.mean(axis=1), 1 - belief.mean(axis=1).sum(-1))
        return FusedSplit(fused, np.zeros(total, dtype=int), views=Opinion(belief, 1 - belief.sum(-1)))

    fitted = split(266, 321)  # 82.9%, chance 82.9%: alert below about 80.6%
    notes = agreement_warnings(fitted, split(46, 79), ["good", "noise"])
    assert len(notes) == 1 and "`good` and `noise`" in notes[0]
    assert "58.2% [46.6%, 69.2%] of the 79 clean test samples" in notes[0]
    assert "DBFViewDisagreement" in notes[0]
    assert agreement_warnings(fitted, split(64, 79), ["good", "noise"]) == []  # 81.0%: as fitted


def test_samples_no_view_is_fused_for_do_not_make_the_fused_model_look_below_its_best_view(tmp_path, capsys):
    """Every view of a few test samples far out of range: the service fuses them from no view (uncertainty 1,
    the first class), and the card's fused accuracy counts them as it answers them. A probe's fit warned
    the fused model was "below its best view alone" (90.0% against 100.0%) and to leave a view out, where it
    was right on every sample some view was fused for: no head answers the others, and no view is to blame."""
    data, views, test = _far_out_of_range(tmp_path / "far", every=21)  # of 20 test samples: the first
    far = test[::5]  # 2 of each class: every view far out of range
    for name, matrix in views.items():
        matrix[far] += 100
        np.save(data / f"{name}.npy", matrix)
    out = tmp_path / "m"
    assert fit("--data", data, "--out", out, "--split-column", "fold", "--epochs", "40", "--quiet") == 0
    manifest = read_manifest(out)
    features = {name: views[name][test] for name in ("image", "text")}
    in_range = exported_range_excess(out, features) <= manifest.out_of_range.threshold
    assert (~in_range.any(axis=1)).sum() == 4  # fused from no view
    card = " ".join((out / "card.md").read_text().split())
    assert manifest.metrics.acc_normal < 1.0  # the served answers of those 4: the first class
    assert "below its best view alone" not in card and "below its best view" not in capsys.readouterr().err


def test_a_single_view_far_out_of_range_is_named_in_the_singular(tmp_path):
    data, _, _ = _far_out_of_range(tmp_path / "far", every=21)  # of 20 test samples: the first
    out = tmp_path / "m"
    assert fit("--data", data, "--out", out, "--split-column", "fold", *QUICK) == 0
    card = " ".join((out / "card.md").read_text().split())
    assert "1 view of validation and test samples lies far outside its training range" in card
