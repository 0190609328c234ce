"""``python -m training fit`` and ``export`` on input that must not harm the machine they run on: data
that would run code, files that are not the data's, output paths that are not a model's, and data that
passes the readers but cannot make a model. Each is refused with a clear message, before training, and
nothing outside the model's directory is written or lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.training.test_fit import QUICK, _snapshot, dataset, fit, read_manifest, write_npy, write_parquet
from training.readers import MAX_VIEWS


def refused(capsys, *args: object) -> str:
    """Run ``fit`` with ``args``, expect exit 1 with an error and no training; the error's text."""
    capsys.readouterr()  # what ran before
    assert fit(*args, *QUICK) == 1
    printed = capsys.readouterr()
    assert printed.err.startswith("error: ") and "Traceback" not in printed.err
    assert "epoch 1/" not in printed.err and "wrote" not in printed.out  # refused before training
    return printed.err


# -- 2: nothing in a data file is ever unpickled -------------------------------------------------------------


class _Payload:
    """Unpickles to a call that creates ``marker``: the proof that a data file's code would have run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return eval, (f"open({str(self.marker)!r}, 'w').close() or 'cat'",)


@pytest.mark.parametrize(("stem", "options"), [("labels", []), ("fold", ["--split-column", "fold"])])
def test_a_pickle_in_a_labels_or_split_file_is_never_loaded(stem, options, tmp_path, capsys):
    views, labels = dataset()
    directory = write_npy(tmp_path / "data", views, labels)
    marker = tmp_path / "code-ran"
    values = labels.astype(object) if stem == "labels" else np.full(labels.size, "train", dtype=object)
    values[0] = _Payload(marker)
    np.save(directory / f"{stem}.npy", values)  # np.save pickles an object array
    error = refused(capsys, "--data", directory, "--out", tmp_path / "model", *options)
    assert not marker.exists()
    assert f"{stem}.npy: Python objects" in error and "never loaded" in error
    assert "labels.txt" in error or f"{stem}.txt" in error  # what to save instead
    assert not (tmp_path / "model").exists()


# -- 12: only regular files inside the data directory are read -----------------------------------------------


SECRET = "root:$6$not-for-your-eyes"


def test_a_symbolic_link_out_of_the_data_directory_is_refused_unread(tmp_path, capsys):
    outside = tmp_path / "shadow"
    outside.write_text(SECRET + "\n" + SECRET + "\n")
    views, labels = dataset()
    for name in ("classes.txt", "image.npy", "labels.npy"):
        directory = write_npy(tmp_path / name, views, labels)
        (directory / name).unlink(missing_ok=True)
        (directory / name).symlink_to(outside)
        error = refused(capsys, "--data", directory, "--out", tmp_path / "model")
        assert f"{directory / name}: a symbolic link out of {directory}" in error
        assert "for-your-eyes" not in error


@pytest.mark.parametrize("target", ["absent.npy", "text.npy"])  # text.npy: itself, a loop
def test_a_symbolic_link_to_no_file_is_said_to_be(target, tmp_path, capsys):
    directory = write_npy(tmp_path / "data", *dataset())
    (directory / "text.npy").unlink()
    (directory / "text.npy").symlink_to(target)  # inside the directory: not "a link out of" it
    error = refused(capsys, "--data", directory, "--out", tmp_path / "model")
    assert error == (
        f"error: {directory / 'text.npy'}: a symbolic link that leads to no file (to one that is absent, or "
        "round a loop)\n"
    )


def test_a_symbolic_link_within_the_data_directory_is_read(tmp_path):
    views, labels = dataset()
    directory = write_npy(tmp_path / "data", views, labels)
    (directory / "names").mkdir()
    (directory / "names" / "order.txt").write_text("eel\ncat\ndog\n")
    (directory / "classes.txt").symlink_to(Path("names") / "order.txt")
    assert fit("--data", directory, "--out", tmp_path / "model", *QUICK) == 0
    assert read_manifest(tmp_path / "model").classes == ["eel", "cat", "dog"]


def test_a_text_file_named_npy_is_not_called_python_objects_nor_echoed(tmp_path, capsys):
    views, labels = dataset()
    directory = write_npy(tmp_path / "data", views, labels)
    (directory / "text.npy").write_text(SECRET)
    error = refused(capsys, "--data", directory, "--out", tmp_path / "model")
    assert f"{directory / 'text.npy'}: not a readable .npy file (no NumPy header" in error
    assert "objects" not in error and "for-your-eyes" not in error


def test_a_directory_where_a_file_is_expected_is_refused(tmp_path, capsys):
    views, labels = dataset()
    directory = write_npy(tmp_path / "data", views, labels)
    (directory / "text.npy").unlink()
    (directory / "text.npy").mkdir()
    error = refused(capsys, "--data", directory, "--out", tmp_path / "model")
    assert f"{directory / 'text.npy'}: a directory, not a regular file" in error


@pytest.mark.parametrize("name", ["image.npy", "labels.npy", "classes.txt", "data.parquet"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(name, tmp_path):
    views, labels = dataset()
    if name == "data.parquet":
        data = tmp_path / name
    else:
        data = write_npy(tmp_path / "data", views, labels)
        (data / name).unlink(missing_ok=True)
    fifo = data if name == "data.parquet" else data / name
    os.mkfifo(fifo)
    command = ["fit", "--data", str(data), "--out", str(tmp_path / "model"), *QUICK]
    # Nothing ever writes to the FIFO: an open for reading would wait forever, and the guard ends the test.
    done = subprocess.run(
        [sys.executable, "-m", "training", *command], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert f"{fifo}: a FIFO (named pipe), not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


# -- 8: data the split and the calibration cannot use is refused before training -----------------------------


def two_classes(directory: Path, per_class: tuple[int, int], **extra: np.ndarray) -> Path:
    views, labels = dataset(per_class=max(per_class))
    rows = [np.flatnonzero(labels == name)[:n] for name, n in zip(("cat", "dog"), per_class, strict=True)]
    keep = np.concatenate(rows)
    return write_npy(directory, {v: m[keep] for v, m in views.items()}, labels[keep], **extra)


@pytest.mark.parametrize("per_class", [10, 15, 25])
def test_too_few_samples_for_the_calibration_are_refused_before_training(per_class, tmp_path, capsys):
    data = two_classes(tmp_path / "data", (per_class, per_class))
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    validation = 2 * (per_class // 10)
    assert f"the validation split holds {validation} samples" in error
    assert "cross-validates on 5 folds" in error and "at least 5" in error
    assert "with 2 classes that takes at least 30 samples per class" in error and "--split-column" in error
    assert not (tmp_path / "model").exists()


def test_enough_samples_for_the_calibration_make_a_model(tmp_path):
    data = two_classes(tmp_path / "data", (20, 30))  # 2 + 3 validation samples
    assert fit("--data", data, "--out", tmp_path / "model", *QUICK) == 0
    assert read_manifest(tmp_path / "model").training["splits"]["validation"] == 5


def split_column(labels: np.ndarray, *, validation: int, test: int) -> np.ndarray:
    """``validation`` and ``test`` samples of each class there, the others to train."""
    fold = np.full(labels.size, "train", dtype="<U10")
    for name in np.unique(labels):
        rows = np.flatnonzero(labels == name)
        fold[rows[:validation]] = "validation"
        fold[rows[validation : validation + test]] = "test"
    return fold


def test_a_split_column_with_too_few_validation_samples_is_refused_before_training(tmp_path, capsys):
    views, labels = dataset()
    fold = split_column(labels, validation=1, test=4)
    data = write_npy(tmp_path / "data", views, labels, fold=fold)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model", "--split-column", "fold")
    assert "the validation split holds 3 samples" in error
    assert "put at least 5 samples in validation in the split column" in error


def test_no_validation_sample_to_make_conflictive_is_refused_before_training(tmp_path, capsys):
    views, labels = dataset()
    fold = split_column(labels, validation=3, test=4)
    validation = np.flatnonzero(fold == "validation")
    for v, matrix in enumerate(views.values()):  # each validation sample has one view
        matrix[validation[validation % 3 != v]] = np.nan
    data = write_npy(tmp_path / "data", views, labels, fold=fold)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model", "--split-column", "fold")
    assert "no validation sample has two views or more" in error


def test_a_view_with_no_sample_in_train_is_refused_naming_where_it_is(tmp_path, capsys):
    """Its error named neither the data nor the rows, nor said what to do."""
    views, labels = dataset()
    fold = split_column(labels, validation=2, test=4)
    views["image"][fold == "train"] = np.nan  # in the validation and test samples alone
    data = write_npy(tmp_path / "data", views, labels, fold=fold)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model", "--split-column", "fold")
    rows = ", ".join(map(str, np.flatnonzero(fold != "train")[:5]))
    assert (
        f"{data}: view 'image' is in 18 samples (rows {rows}, ...), and the split column puts none" in error
    )
    assert "put some of them in train, or leave the view out (--views)" in error


@pytest.mark.parametrize("kind", ["parquet", "npy"])
def test_more_views_than_fit_takes_are_refused_before_reading_them(kind, tmp_path, capsys):
    _, labels = dataset()
    rng = np.random.default_rng(0)
    columns = {f"f{i}": rng.normal(size=labels.size) for i in range(MAX_VIEWS + 1)}  # a column per feature
    if kind == "parquet":
        data = tmp_path / "wide.parquet"
        pq.write_table(pa.table({**columns, "label": pa.array(labels)}), data)
    else:
        data = write_npy(tmp_path / "wide", {name: value[:, None] for name, value in columns.items()}, labels)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert f"{MAX_VIEWS + 1} views" in error and f"fit takes at most {MAX_VIEWS}" in error
    assert "--views" in error


# -- 1: --out is replaced only where it is a model, and never where the data is -----------------------------


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_npy(tmp_path / "data", *dataset())


def test_out_a_folder_of_notes_is_refused_before_training(data, tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("keep me")
    before = _snapshot(tmp_path)
    error = refused(capsys, "--data", data, "--out", notes)
    assert f"{notes}: not a model directory" in error and "name a new directory" in error
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "notes"]


def test_out_the_data_inside_it_or_around_it_is_refused(data, tmp_path, capsys):
    before = _snapshot(tmp_path)
    assert "is the data" in refused(capsys, "--data", data, "--out", data)
    assert "inside the data directory" in refused(capsys, "--data", data, "--out", data / "model")
    assert "holds the data" in refused(capsys, "--data", data, "--out", tmp_path)
    parquet = write_parquet(tmp_path / "pets.parquet", *dataset())
    assert "is the data" in refused(capsys, "--data", parquet, "--out", parquet)
    before[parquet.name] = parquet.read_bytes()
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "pets.parquet"]


def test_a_model_that_holds_the_data_is_not_replaced(tmp_path, capsys):
    model = tmp_path / "pets"
    assert fit("--data", write_npy(tmp_path / "first", *dataset()), "--out", model, *QUICK) == 0
    data = write_npy(model / "data", *dataset(seed=1))
    before = _snapshot(tmp_path)
    assert f"{model}: holds the data" in refused(capsys, "--data", data, "--out", model)
    assert _snapshot(tmp_path) == before


def test_out_the_model_repository_is_refused(data, tmp_path, capsys):
    repository = tmp_path / "models"
    for name in ("cats", "dogs"):
        assert fit("--data", data, "--out", repository / name, *QUICK) == 0
    before = _snapshot(repository)
    error = refused(capsys, "--data", data, "--out", repository)
    assert f"{repository}: not a model directory" in error
    assert _snapshot(repository) == before


def test_out_a_file_or_under_a_file_is_refused(data, tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    assert f"{file}: a file, not a model directory" in refused(capsys, "--data", data, "--out", file)
    error = refused(capsys, "--data", data, "--out", file / "model")
    assert f"{file}: a file, so {file / 'model'} cannot be made" in error
    assert file.read_text() == "keep me"


def test_out_a_symbolic_link_is_refused(data, tmp_path, capsys):
    model = tmp_path / "models" / "pets"
    assert fit("--data", data, "--out", model, *QUICK) == 0
    link = tmp_path / "models" / "current"
    link.symlink_to("pets")
    before = _snapshot(tmp_path / "models")
    error = refused(capsys, "--data", data, "--out", link)
    assert f"{link}: a symbolic link" in error
    assert link.is_symlink() and _snapshot(tmp_path / "models") == before


def test_a_model_with_files_no_model_has_is_not_replaced(data, tmp_path, capsys):
    model = tmp_path / "pets"
    assert fit("--data", data, "--out", model, *QUICK) == 0
    (model / "notes.txt").write_text("keep me")
    before = _snapshot(model)
    error = refused(capsys, "--data", data, "--out", model)
    assert f"{model}: holds notes.txt, which a model directory does not" in error
    assert _snapshot(model) == before


def test_a_model_is_replaced_by_the_new_fit(data, tmp_path):
    model = tmp_path / "models" / "pets"
    assert fit("--data", data, "--out", model, *QUICK) == 0
    first = read_manifest(model)
    assert fit("--data", data, "--out", model, "--seed", "1", *QUICK) == 0
    assert read_manifest(model).training["seed"] == 1 and first.training["seed"] == 0
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["pets"]  # nothing retired left


def test_a_manifest_left_staged_by_a_killed_view_agreement_write_is_replaced_with_the_model(data, tmp_path):
    """``view-agreement --write`` stages the new manifest beside the old (``.manifest.json.*``); killed
    before its rename, it left a file that made the model's folder no model's for every later fit."""
    model = tmp_path / "models" / "pets"
    assert fit("--data", data, "--out", model, *QUICK) == 0
    (model / ".manifest.json.k7x2q9").write_text('{"half": ')
    assert fit("--data", data, "--out", model, "--seed", "1", *QUICK) == 0
    assert read_manifest(model).training["seed"] == 1
    assert not (model / ".manifest.json.k7x2q9").exists()


def test_a_folder_made_at_out_during_training_is_not_replaced(tmp_path):
    from training.data import synthetic
    from training.export import ModelDirError
    from training.fit import fit as fit_model
    from training.train import TrainConfig

    out = tmp_path / "models" / "pets"

    class NotesAppear:
        """Training's reporter: someone puts a folder of notes where the model is to go."""

        def epoch(self, epoch: int, train_loss: float, validation_loss: float | None) -> None:
            if epoch == 1:
                out.mkdir(parents=True, exist_ok=True)  # cross-fitting's models report too
                (out / "ideas.txt").write_text("keep me")

        def close(self, *, stopped_early: bool = False) -> None:
            pass

    config = TrainConfig(method="dbf", lam=1.0, epochs=2)
    with pytest.raises(ModelDirError, match="not a model directory"):
        fit_model(synthetic(90, seed=0), out, config=config, progress=NotesAppear())
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["pets"]  # no staging left
    assert (out / "ideas.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1


@pytest.mark.data
def test_export_refuses_a_folder_that_is_not_a_model(data_dir, tmp_path, capsys):
    from training.__main__ import main

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("keep me")
    command = ["export", "--dataset", "cub", "--data-dir", data_dir, "--out", notes, "--epochs", "1"]
    assert main([str(part) for part in command]) == 1
    assert f"{notes}: not a model directory" in capsys.readouterr().err
    assert [p.name for p in notes.iterdir()] == ["ideas.txt"]


def test_the_accuracy_over_every_sample_is_measured_a_chunk_at_a_time(tmp_path):
    # The card's accuracy "over every sample, training ones too" fused all N samples at once: (N, V, K)
    # beliefs in float64 and their intermediates, which grow with the classes, not the data. 15,000 samples
    # of 1,000 classes (2.9 MB of features) took the fit from 1.20 to 1.77 GB there.
    import tracemalloc

    from training.data import synthetic
    from training.fit import fit as fit_model
    from training.train import TrainConfig

    samples, classes, dims = 6000, 300, (2, 2)
    data = synthetic(samples, num_classes=classes, dims=dims, seed=0)
    config = TrainConfig(method="dbf", lam=1.0, epochs=1, hidden=())
    # a first fit imports what training and the card load lazily (tens of MB of modules)
    fit_model(synthetic(90, seed=0), tmp_path / "first", config=config, progress=False)
    tracemalloc.start()
    try:
        fit_model(data, tmp_path / "model", config=config, progress=False)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    every_belief = samples * len(dims) * classes * 8  # float64
    assert peak < every_belief, f"{peak / 2**20:.1f} MiB at the peak"
