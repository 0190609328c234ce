"""The training command line against input made to hurt it, or written carelessly: files whose headers or
metadata promise far more than they hold (memory), names too long for a file or that collide on another
file system, interrupts and a full disk while a model is written, and option values the commands took
without a word. Each ends in a clear error (or the model), never a traceback, nothing left behind, and
an older model at ``--out`` as it was."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.io
import scipy.sparse
import torch

from manifest import Manifest
from tests.training.test_fit import QUICK, _snapshot, dataset, fit, list_column, read_manifest, write_npy
from tests.training.test_fit_safety import refused
from training import export as exporting
from training import readers
from training.__main__ import main
from training.data import DataError
from training.heads import EvidentialHeads
from training.protocol import MinMaxScaler
from training.readers import load, machine_memory

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_npy(tmp_path / "data", *dataset())


# -- a .npy header that claims more than its file holds ------------------------------------------------------


def lying_npy(path: Path, dtype: str, shape: tuple[int, ...]) -> None:
    """A ``.npy`` file whose header says ``shape`` and whose data is 64 bytes."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    with path.open("wb") as stream:
        np.lib.format.write_array_header_1_0(stream, header)
        stream.write(bytes(64))


@pytest.mark.parametrize(
    ("name", "shape"), [("labels", (10**12,)), ("labels", (60, 10**10)), ("image", (60, 10**12))]
)
def test_a_npy_header_claiming_more_than_the_file_holds_is_refused(name, shape, data, tmp_path, capsys):
    lying_npy(data / f"{name}.npy", "<i8", shape)  # terabytes: allocated, a MemoryError
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert f"{data / f'{name}.npy'}: not a readable .npy file" in error


def sparse_npy(path: Path, shape: tuple[int, int]) -> None:
    """A float32 ``.npy`` file of ``shape``, all zeros, that takes no room on disk (a sparse file)."""
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    with path.open("wb") as stream:
        np.lib.format.write_array_header_1_0(stream, header)
        stream.truncate(stream.tell() + shape[0] * shape[1] * 4)


def test_a_view_larger_than_a_fit_could_hold_is_refused_before_its_matrix_is_made(tmp_path, capsys):
    # Three quarters of this machine's memory as float32: within it, so it was made and filled (20 GB of
    # zeros on a machine of 23.5), where the fit holding it needs more than there is.
    rows = int(0.75 * machine_memory()) // (4 * 1000)
    data = tmp_path / "data"
    data.mkdir()
    sparse_npy(data / "image.npy", (rows, 1000))
    sparse_npy(data / "text.npy", (rows, 1))
    np.save(data / "labels.npy", np.arange(rows, dtype=np.int64) % 2)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert error.startswith(f"error: {data / 'image.npy'}: {rows:,} samples of 1,000 features make ")
    assert "a fit holds about 1.6 times its data: more than the " in error
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("name", ["labels.npy", "labels.txt"])
def test_a_labels_file_larger_than_a_fit_could_hold_is_refused_before_it_is_read(name, tmp_path, capsys):
    # Sparse: a valid header (or none, as text), and gigabytes of zeros that take no room on disk; read in
    # full, as labels are, before the row counts were compared.
    data = write_npy(tmp_path / "data", *dataset())
    (data / "labels.npy").unlink()
    if name == "labels.npy":
        sparse_npy(data / name, (int(0.75 * machine_memory()) // 4, 1))
    else:
        with (data / name).open("wb") as stream:
            stream.truncate(machine_memory() // 20)  # its lines as Python strings: 20 times the file
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert error.startswith(f"error: {data / name}: ")
    assert "a fit holds about 1.6 times its data: more than the " in error


# -- a benchmark .mat file that decompresses to far more than it is ----------------------------------------


def _mat5_element(data_type: int, payload: bytes) -> bytes:
    return struct.pack("<II", data_type, len(payload)) + payload + bytes(-len(payload) % 8)


def mat_of_zeros(path: Path, rows: int, columns: int) -> Path:
    """A MATLAB 5 file whose cell ``X`` holds one ``rows x columns`` double matrix of zeros, compressed: the
    file is about a thousandth of the matrix."""
    matrix_head = b"".join(
        (
            _mat5_element(6, struct.pack("<II", 6, 0)),  # miUINT32 array flags: mxDOUBLE_CLASS
            _mat5_element(5, struct.pack("<ii", rows, columns)),  # miINT32 dimensions
            _mat5_element(1, b""),  # miINT8 name: none inside a cell
        )
    )
    data_bytes = rows * columns * 8
    matrix_bytes = len(matrix_head) + 8 + data_bytes
    cell_head = b"".join(
        (
            _mat5_element(6, struct.pack("<II", 1, 0)),  # mxCELL_CLASS
            _mat5_element(5, struct.pack("<ii", 1, 1)),
            _mat5_element(1, b"X"),
        )
    )
    deflater = zlib.compressobj(9)
    stream = [deflater.compress(struct.pack("<II", 14, len(cell_head) + 8 + matrix_bytes) + cell_head)]
    stream.append(deflater.compress(struct.pack("<II", 14, matrix_bytes) + matrix_head))
    stream.append(deflater.compress(struct.pack("<II", 9, data_bytes)))  # miDOUBLE
    zeros = bytes(1 << 20)
    for start in range(0, data_bytes, len(zeros)):
        stream.append(deflater.compress(zeros[: data_bytes - start]))
    stream.append(deflater.flush())
    body = b"".join(stream)
    header = b"MATLAB 5.0 MAT-file".ljust(116) + bytes(8) + struct.pack("<H", 0x0100) + b"IM"
    path.write_bytes(header + struct.pack("<II", 15, len(body)) + body)  # miCOMPRESSED
    return path


def test_a_mat_file_decompressing_beyond_memory_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    # 256 MB of zeros in a file of 250 KB; scipy's reader inflates a variable whole (1.6 GB from 1.5 MB
    # held 1.9 GB), so what a fit could not hold is refused from a count of its inflated bytes.
    path = mat_of_zeros(tmp_path / "handwritten.mat", 2000, 16_000)
    assert path.stat().st_size < 300_000
    monkeypatch.setattr(readers, "available_memory", lambda: 200 * 2**20)

    def read(*args, **kwargs):
        raise AssertionError("scipy read the file")

    monkeypatch.setattr(scipy.io, "loadmat", read)
    error = refused(capsys, "--data", path, "--out", tmp_path / "model")
    assert error.startswith(f"error: {path}: its variables decompress to more than 0.1 GiB")


def test_a_mat_file_within_memory_is_read_after_its_count(tmp_path):
    mat_of_zeros(tmp_path / "handwritten.mat", 2000, 10)
    with pytest.raises(DataError, match=r"handwritten\.mat lacks variable\(s\) \['Y'\]; it has \['X'\]"):
        load("handwritten", tmp_path)


def test_a_sparse_view_declaring_more_than_memory_is_refused_before_it_is_made_dense(tmp_path, capsys):
    # Kilobytes on disk (a sparse matrix stores its non-zeros), 960 GB dense: toarray() was a MemoryError.
    labels = np.arange(1, 61) % 10 + 1
    views = np.empty((1, 2), dtype=object)
    views[0, 0] = scipy.sparse.csc_matrix(([1.0], ([0], [0])), shape=(2 * 10**9, labels.size))
    views[0, 1] = np.ones((labels.size, 3))
    path = tmp_path / "cub_googlenet_doc2vec_c10.mat"
    scipy.io.savemat(path, {"X": views, "gt": labels.reshape(-1, 1)})
    error = refused(capsys, "--data", path, "--out", tmp_path / "model")
    assert error.startswith(f"error: {path} view 'image': a sparse matrix of 2,000,000,000 x 60 makes ")


# -- Parquet that decompresses to far more than it is --------------------------------------------------------


def parquet_of(path: Path, **replaced: pa.Array) -> Path:
    views, labels = dataset()
    columns = {name: list_column(matrix, fixed=False) for name, matrix in views.items()}
    table = pa.table({**columns, "label": pa.array(labels), **replaced})
    pq.write_table(table, path, compression="zstd", row_group_size=len(labels))
    return path


@pytest.fixture
def never_decoded(monkeypatch):
    """Reading a Parquet column's values fails the test: what is refused must be refused from the metadata."""

    def decoded(*args, **kwargs):
        raise AssertionError("a column was decoded")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", decoded)
    monkeypatch.setattr(pq.ParquetFile, "read", decoded)


def test_a_parquet_row_wider_than_any_view_is_refused_before_it_is_decompressed(
    tmp_path, never_decoded, monkeypatch
):
    monkeypatch.setenv("DBF_MAX_VIEW_DIM", "1000")
    wide = 10**5  # zeros: a few kilobytes compressed; 10**9 of them, the same few kilobytes, are 8 GB decoded
    bomb = pa.array([np.zeros(wide)] + [[1.0, 2.0]] * 59, type=pa.list_(pa.float64()))
    path = parquet_of(tmp_path / "bomb.parquet", image=bomb)
    assert path.stat().st_size < 100_000
    with pytest.raises(
        DataError, match=r"column 'image' row group 0: 100,118 numbers for 60 rows, so some row"
    ):
        load(path)


def test_a_parquet_label_column_of_huge_strings_is_refused_before_it_is_decompressed(tmp_path, never_decoded):
    _, labels = dataset()
    bomb = pa.array(["cat" * 10**6, *labels[1:]])
    path = parquet_of(tmp_path / "bomb.parquet", label=bomb)
    assert path.stat().st_size < 100_000
    with pytest.raises(DataError, match=r"column 'label' row group 0: 3\.0 MB for 60 rows"):
        load(path)


def test_a_parquet_label_column_of_long_strings_stored_once_is_refused_by_its_decoded_size(tmp_path):
    # A dictionary stores each string once and the rows as run-length encoded indices: 120 KB stored here,
    # 3.6 MB decoded; a string of a megabyte over 20,000 rows, 223 KB stored, had fit allocate 20 GB.
    _, labels = dataset()
    names = pa.array(["cat" * 20_000, "dog" * 20_000])
    label = pa.DictionaryArray.from_arrays(pa.array(np.arange(labels.size) % 2, pa.int32()), names)
    path = parquet_of(tmp_path / "bomb.parquet", label=label)
    assert path.stat().st_size < 100_000
    with pytest.raises(
        DataError, match=r"column 'label': 3\.6 MB for 60 rows decoded, more than 1,024 bytes per row"
    ):
        load(path)


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ("nosuch", r"no label column 'nosuch' \(columns: image, text, sensor, label\)"),
        ("image", r"column 'label': type string is not numeric"),  # a list column: now a view of labels
    ],
)
def test_a_parquet_label_column_that_is_absent_or_of_lists_is_refused_naming_it(column, message, tmp_path):
    path = parquet_of(tmp_path / "data.parquet")  # read as a dictionary: named, pyarrow took only scalars
    with pytest.raises(DataError, match=message):
        load(path, label_column=column)


def with_declared_rows(path: Path, rows: int, *, everywhere: bool = False) -> Path:
    """``path``, a Parquet file of one row group, with its footer declaring ``rows`` rows in all; with
    ``everywhere``, its row group and each column's count of values too, so that the metadata agree."""
    held = pq.ParquetFile(path).metadata.num_rows
    data, footer = path.read_bytes(), b""
    size = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - size : -8]

    def field_3_i64(value: int) -> bytes:  # Thrift's compact protocol: FileMetaData.num_rows after schema
        value, encoded = (value << 1) ^ (value >> 63), b""
        while value > 0x7F:
            encoded, value = encoded + bytes([value & 0x7F | 0x80]), value >> 7
        return b"\x16" + encoded + bytes([value])

    footer = footer.replace(field_3_i64(held), field_3_i64(rows), -1 if everywhere else 1)
    path.write_bytes(data[: -8 - size] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert pq.ParquetFile(path).metadata.num_rows == rows
    return path


@pytest.mark.parametrize("rows", [59, 10**12])
def test_a_parquet_file_declaring_rows_it_does_not_hold_is_refused(rows, tmp_path, capsys):
    # 59 of 60: an IndexError's traceback; 10**12: a matrix of that many rows asked for
    path = with_declared_rows(parquet_of(tmp_path / "data.parquet"), rows)
    error = refused(capsys, "--data", path, "--out", tmp_path / "model")
    assert error == (
        f"error: {path}: row groups of 60 rows, where the file's metadata declares {rows:,}: the file is "
        "damaged; write it again\n"
    )


def test_a_parquet_file_whose_metadata_all_declare_rows_it_does_not_hold_is_refused(tmp_path, capsys):
    # pyarrow reads the 60 rows there are: the matrix made for 1,000 was left uninitialised below them
    path = with_declared_rows(parquet_of(tmp_path / "data.parquet"), 1000, everywhere=True)
    error = refused(capsys, "--data", path, "--out", tmp_path / "model")
    assert error == (
        f"error: {path} column 'image': 60 rows, where the file's metadata declares 1,000: the file is "
        "damaged; write it again\n"
    )


def test_a_variable_width_parquet_view_is_read_in_batches_of_its_own_width(tmp_path, monkeypatch):
    import training.readers

    sizes = []
    iter_batches = pq.ParquetFile.iter_batches

    def recorded(self, *args, batch_size, **kwargs):
        sizes.append(batch_size)
        return iter_batches(self, *args, batch_size=batch_size, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recorded)
    monkeypatch.setattr(training.readers, "_CHUNK_BYTES", 4 * 1000 * 10)  # 10 rows of 1,000 features
    wide = np.random.default_rng(0).normal(size=(60, 1000))
    path = parquet_of(tmp_path / "wide.parquet", image=list_column(wide, fixed=False))
    assert load(path).views["image"].shape == (60, 1000)
    assert sizes[0] == 10  # not 10 rows of 256 features' worth: 39 rows of 1,000


# -- view names too long for a file, or that collide where case does not count -------------------------------


def test_a_view_name_too_long_for_its_onnx_file_is_refused_before_training(data, tmp_path, capsys):
    long = "v" * 251  # <view>.onnx: 256 characters, one more than a file name holds
    (data / "text.npy").rename(data / f"{long}.npy")
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert f"{long!r} is too long for a view name" in error and "at most 250 characters" in error


def test_views_whose_names_differ_only_in_case_are_refused(tmp_path, capsys):
    views, _ = dataset()
    path = parquet_of(tmp_path / "cased.parquet", Image=list_column(views["image"] + 1, fixed=False))
    error = refused(capsys, "--data", path, "--out", tmp_path / "model")
    assert "views 'image' and 'Image' differ only in case" in error


# -- benchmark files -----------------------------------------------------------------------------------------


def test_a_matlab_73_file_is_refused_naming_it(tmp_path, capsys):
    directory = tmp_path / "mat"
    directory.mkdir()
    text = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 ."
    header = text.ljust(116) + bytes(8) + b"\x00\x02IM"  # version 2.0: an HDF5 file
    (directory / "handwritten.mat").write_bytes(header + bytes(512))
    error = refused(capsys, "--data", directory / "handwritten.mat", "--out", tmp_path / "model")
    assert f"{directory / 'handwritten.mat'}: a MATLAB 7.3 (HDF5) file" in error


# -- where a model is written: a full disk, an interrupt, a folder that only looks like a model -------------


def test_a_model_name_too_long_for_a_file_is_refused_before_training(data, tmp_path, capsys):
    out = tmp_path / ("m" * 256)
    error = refused(capsys, "--data", data, "--out", out)
    assert "too long for a directory name" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_long_model_name_is_written(data, tmp_path):
    out = tmp_path / ("m" * 250)  # its staging directory's name must not be longer than a file name holds
    assert fit("--data", data, "--out", out, *QUICK) == 0
    assert read_manifest(out).name == out.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", out.name]


@pytest.fixture
def tiny_model(tmp_path):
    """``write_model``'s arguments for a two-view model of small random heads, and its manifest."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    raw = {"a": rng.normal(size=(8, 3)).astype(np.float32), "b": rng.normal(size=(8, 2)).astype(np.float32)}
    scaler = MinMaxScaler.fit(raw)
    scaled = scaler.transform(raw)
    template = Manifest.model_validate_json((REPOSITORY / "models" / "cub" / "manifest.json").read_text())
    return {
        "heads": EvidentialHeads([3, 2], len(template.classes)),
        "scaler": scaler,
        "parity": {v: (raw[v], scaled[v]) for v in raw},
        # CUB's view_agreement names its own views, not these
        "manifest": lambda views: template.model_copy(
            update={"name": "pets", "views": views, "view_agreement": None}
        ),
    }


def write_old_model(out: Path, tiny_model) -> dict[str, bytes]:
    exporting.write_model(out, **tiny_model)
    return _snapshot(out)


def test_a_full_disk_while_writing_is_a_clear_error_and_the_old_model_stays(tmp_path, tiny_model):
    out = tmp_path / "models" / "pets"
    before = write_old_model(out, tiny_model)

    def full(directory: Path, manifest: Manifest) -> None:
        (directory / "card.md").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    written = r"pets: the model could not be written \(No space left on device\); .* is as it was"
    with pytest.raises(exporting.ModelDirError, match=written):
        exporting.write_model(out, **tiny_model, extras=full)
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["pets"]  # nothing staged left


def test_an_interrupt_between_the_renames_puts_the_old_model_back(tmp_path, tiny_model, monkeypatch):
    out = tmp_path / "models" / "pets"
    before = write_old_model(out, tiny_model)
    monkeypatch.setattr(exporting, "_exchange", lambda first, second: False)  # where no atomic swap exists
    renames = []
    rename = Path.rename

    def interrupted(self, target):
        renames.append(self)
        if len(renames) == 2:  # the old model is out of the way, the new one not yet in place
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        exporting.write_model(out, **tiny_model)
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["pets"]


def test_a_model_reaches_the_disk_before_it_is_swapped_in(tmp_path, tiny_model, monkeypatch):
    """A rename reaches the disk apart from the files it names: swapped in before them, a power loss could
    leave a served model of empty files."""
    out = tmp_path / "models" / "pets"
    write_old_model(out, tiny_model)
    events: list[tuple[str, str]] = []
    fsync, swap_in = os.fsync, exporting._swap_in

    def recorded_fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        fsync(descriptor)

    def recorded_swap_in(staging: Path, target: Path) -> None:
        events.append(("swap", str(staging)))
        swap_in(staging, target)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(exporting, "_swap_in", recorded_swap_in)
    exporting.write_model(out, **tiny_model)
    [swap] = [i for i, (event, _) in enumerate(events) if event == "swap"]
    staging = events[swap][1]
    before = {path for _, path in events[:swap]}
    assert {f"{staging}/{name}" for name in ("manifest.json", "a.onnx", "b.onnx")} | {staging} <= before
    assert ("fsync", str(out.parent)) in events[swap:]


def test_a_model_is_swapped_in_whole(tmp_path, tiny_model):
    out = tmp_path / "models" / "pets"
    write_old_model(out, tiny_model)
    older = tiny_model["manifest"]
    newer = {**tiny_model, "manifest": lambda views: older(views).model_copy(update={"dataset": "new"})}
    exporting.write_model(out, **newer)
    assert read_manifest(out).dataset == "new"
    assert sorted(p.name for p in out.parent.iterdir()) == ["pets"]


def test_a_folder_of_pictures_with_a_planted_manifest_is_not_replaced(data, tmp_path, capsys):
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    shutil.copy(REPOSITORY / "models" / "cub" / "manifest.json", pictures)
    (pictures / "holiday.png").write_bytes(b"\x89PNG keep me")
    error = refused(capsys, "--data", data, "--out", pictures)
    assert "holds holiday.png, which a model directory does not" in error
    assert (pictures / "holiday.png").read_bytes() == b"\x89PNG keep me"


SIGNALLED_WHILE_WRITING = """
    import os, signal, sys
    import training.fit
    from training.__main__ import main

    write_card = training.fit.write_card

    def signalled(directory, report, manifest):
        write_card(directory, report, manifest)
        os.kill(os.getpid(), signal.{signal})  # handled before this function returns

    training.fit.write_card = signalled
    # Ctrl-C as in a terminal: a process started in the background without job control inherits SIGINT
    # ignored (a CI runner's, `cmd &` in a script), and Python then installs no handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("signal_name", "returncode"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_while_the_model_is_written_leaves_nothing_and_no_traceback(
    signal_name, returncode, data, tmp_path
):
    out = tmp_path / "models" / "pets"
    script = textwrap.dedent(SIGNALLED_WHILE_WRITING).replace("{signal}", signal_name)
    command = ["fit", "--data", str(data), "--out", str(out), "--epochs", "2", "--quiet", "--hidden", "0"]
    done = subprocess.run(
        [sys.executable, "-c", script, *command], capture_output=True, text=True, timeout=120, cwd=REPOSITORY
    )
    assert done.returncode == returncode, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"{out} is as it was" in done.stderr
    assert not out.parent.exists() or not list(out.parent.iterdir())  # no model, nothing staged


# -- download -----------------------------------------------------------------------------------------------


def test_download_into_a_file_or_over_a_directory_is_a_clear_error(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    mirror = f"file://{tmp_path / 'nowhere'}"
    assert main(["download", "--data-dir", str(file), "--dataset", "pie", "--mirror", mirror]) == 1
    printed = capsys.readouterr().err
    assert printed.startswith(f"error: {file}: not a directory") and "Traceback" not in printed
    assert file.read_text() == "keep me"
    target = tmp_path / "data" / "PIE_face_10.mat"
    target.mkdir(parents=True)
    assert main(["download", "--data-dir", str(target.parent), "--dataset", "pie", "--mirror", mirror]) == 1
    assert capsys.readouterr().err.startswith(f"error: {target}: a directory, not the data file")


# -- experiment ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--methods", "dbf,bogus", "unknown method 'bogus'"),
        ("--activation", "cubic", "unknown activation 'cubic'"),
        ("--lambda", "1,nan", "expected positive numbers"),
        ("--seeds", "-1", "expected an integer from 0 to"),
        ("--seeds", str(2**64), "expected an integer from 0 to"),
        ("--workers", "0", "expected an integer >= 1"),
    ],
)
def test_experiment_options_out_of_range_are_refused_before_any_run(option, value, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["experiment", "--dataset", "synthetic", "--out", str(tmp_path / "out"), option, value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_experiment_out_a_file_is_refused_before_any_run(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    command = ["experiment", "--dataset", "synthetic", "--epochs", "1", "--workers", "1", "--out", str(file)]
    assert main(command) == 1
    printed = capsys.readouterr()
    assert printed.err.startswith(f"error: {file}: a file") and "runs in" not in printed.out
    assert file.read_text() == "keep me"


def test_experiment_does_not_write_through_a_link_nor_over_files_not_its_own(tmp_path, capsys):
    outside = tmp_path / "bashrc"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").symlink_to(outside)
    command = ["experiment", "--dataset", "synthetic", "--epochs", "1", "--workers", "1", "--out", str(out)]
    assert main(command) == 1
    assert f"{out / 'results.md'}: a symbolic link" in capsys.readouterr().err
    (out / "results.md").unlink()
    (out / "results.md").write_text("my notes")
    assert main(command) == 1
    assert f"{out}: holds results.md but no results.json of an experiment" in capsys.readouterr().err
    assert outside.read_text() == "keep me" and (out / "results.md").read_text() == "my notes"


def test_experiment_starts_no_more_processes_than_it_has_runs(monkeypatch):
    import training.experiment

    class Started(Exception):
        """The pool's size, recorded where it would start its processes."""

    def pool(max_workers, **kwargs):
        raise Started(max_workers)

    monkeypatch.setattr(training.experiment, "ProcessPoolExecutor", pool)
    specs = [training.experiment.RunSpec(dataset="synthetic", seed=seed, epochs=1) for seed in (0, 1)]
    with pytest.raises(Started) as started:
        training.experiment.run_grid(specs, None, workers=64)
    assert started.value.args == (2,)  # a process per run, not 64 copies of this one


def test_experiment_without_its_data_says_how_to_fetch_it(tmp_path, capsys):
    command = ["experiment", "--dataset", "pie", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    assert main(command) == 1
    printed = capsys.readouterr().err
    assert printed.startswith(f"error: pie data not found at {tmp_path / 'PIE_face_10.mat'}")
    assert "python -m training download" in printed and "Traceback" not in printed


def test_a_class_name_longer_than_a_manifest_takes_is_refused_before_training(tmp_path, capsys):
    """A label of 2,000 characters: the manifest refuses class names over 1,024 (every answer carries one per
    sample), so fit, finding out only as it wrote the model, lost the training."""
    views, labels = dataset()
    long = "x" * 2000
    data = write_npy(tmp_path / "data", views, np.where(labels == labels[0], long, labels))
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert "is 2,000 characters long; a class name is at most 1,024" in error
