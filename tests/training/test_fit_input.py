"""What ``python -m training fit`` reads, at the readers' level where that suffices: values float32 cannot
hold, labels that would change on the way in (a uint64 beyond int64, ``01`` and ``1``, a byte order mark),
files that would be read in silence or not at all (a path for a file stem, ``lidar.NPY``, pandas' index, two
label files), options out of range, and messages that say what is wrong."""

from __future__ import annotations

import codecs
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from manifest import MAX_CLASS_NAME_LENGTH
from tests.training.test_fit import QUICK, dataset, fit, list_column, read_manifest, write_npy
from tests.training.test_fit_safety import refused
from training.data import DataError
from training.readers import load


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_npy(tmp_path / "data", *dataset())


def with_labels_txt(directory: Path, text: str | bytes) -> Path:
    (directory / "labels.npy").unlink()
    path = directory / "labels.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return directory


# -- 1: a view float32 cannot tell apart -------------------------------------------------------------------


def test_a_view_of_large_values_with_a_small_spread_is_refused_before_training(data, tmp_path, capsys):
    image = np.load(data / "image.npy").astype(np.float64)
    np.save(data / "image.npy", image + 1e9)  # float32 neighbours there are 64 apart: every row alike
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert f"{data / 'image.npy'} column 0: values around 1e+09 spread by only" in error
    assert "and 4 more columns alike" in error and "64 apart" in error
    assert "subtract an offset (e.g. the column's mean, 1e+09) before fitting" in error
    assert "every request" in error and error.count("\n") == 1
    assert not (tmp_path / "model").exists()


def test_the_rounding_is_measured_across_blocks_and_missing_rows(data, monkeypatch):
    import training.readers

    monkeypatch.setattr(training.readers, "_CHUNK_BYTES", 64)  # a few rows per block
    sensor = np.load(data / "sensor.npy").astype(np.float64)
    sensor[::3] = np.nan  # missing rows: passed over, not spread
    sensor[:, 2] += 2e7  # float32 steps of 2 there, for a spread of about 3
    np.save(data / "sensor.npy", sensor)
    with pytest.raises(DataError, match=r"sensor\.npy column 2: values around 2e\+07 spread by only \d"):
        load(data)
    sensor[:, 2] = sensor[:, 2] - 2e7 + 1e5  # steps of 1/128 there: kept
    np.save(data / "sensor.npy", sensor)
    assert load(data).views["sensor"][1, 2] == np.float32(sensor[1, 2])


def test_integers_float32_cannot_hold_are_refused(data):
    np.save(
        data / "text.npy", 10**12 + np.arange(60 * 3, dtype=np.int64).reshape(60, 3)
    )  # ids, steps of 65536
    with pytest.raises(DataError, match=r"text\.npy column 0: values around 1e\+12 .* 6\.55e\+04 apart"):
        load(data)


def test_constant_columns_and_ordinary_float64_views_are_read(data):
    image = np.load(data / "image.npy").astype(np.float64) + 1e3
    image[:, 0] = 1e9  # constant: nothing to lose
    image[:, 1] = np.where(np.arange(60) % 2, 0.3, 0.1 * 3)  # constant but for float64's own rounding
    np.save(data / "image.npy", image)
    read = load(data)
    np.testing.assert_array_equal(read.views["image"], image.astype(np.float32))


def test_a_parquet_column_float32_cannot_hold_is_refused(tmp_path):
    views, labels = dataset()
    columns = {name: list_column(matrix) for name, matrix in views.items()}
    offset = pa.array((np.arange(60) % 7 + 1e9).tolist(), type=pa.float64())  # a plain column: width 1
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({**columns, "stamp": offset, "label": pa.array(labels)}), path)
    with pytest.raises(DataError, match=r"data\.parquet column 'stamp' column 0: values around 1e\+09"):
        load(path)


@pytest.mark.parametrize(
    ("magnitude", "refusal"),
    [
        (3e38, "values from -3e+38 to 3e+38 are spread over 6e+38, more than float32's largest number"),
        (1e-40, "are spread by only 2e-40, less than float32's smallest normal (1.18e-38)"),
    ],
)
def test_a_column_whose_range_float32_cannot_scale_by_is_refused_before_training(
    magnitude, refusal, data, tmp_path, capsys
):
    """Finite float32 values all, but the served graph's scaling, ``(x - minimum) * (1 / span)`` in float32,
    made NaN of them: found by the export's parity check once everything was trained, as a traceback."""
    image = np.load(data / "image.npy")
    image[:, 1] = np.where(np.arange(60) % 2, magnitude, -magnitude).astype(np.float32)
    np.save(data / "image.npy", image)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert f"{data / 'image.npy'} column 1: " in error and refusal in error
    assert "by 1e" in error and "every request" in error and error.count("\n") == 1
    image[:, 1] *= np.float32(0.5 if magnitude > 1 else 2e3)  # a span of 3e38, or of 4e-37: scaled
    np.save(data / "image.npy", image)
    load(data)


def test_a_view_of_flags_is_read_as_0_and_1(data, tmp_path):
    """bool features (one-hot codes, yes/no answers) were refused as "not numeric", in both formats."""
    flags = np.load(data / "text.npy") > 0
    np.save(data / "text.npy", flags)
    np.testing.assert_array_equal(load(data).views["text"], flags.astype(np.float32))
    views, labels = dataset()
    rows = [None if i == 3 else row.tolist() for i, row in enumerate(flags)]
    path = tmp_path / "flags.parquet"
    pq.write_table(
        pa.table(
            {
                "image": list_column(views["image"]),
                "flags": pa.array(rows, pa.list_(pa.bool_())),
                "flag": pa.array([None, *flags[1:, 0].tolist()]),  # a plain column: width 1
                "label": pa.array(labels),
            }
        ),
        path,
    )
    read = load(path)
    np.testing.assert_array_equal(read.views["flags"][4:], flags[4:].astype(np.float32))
    assert np.isnan(read.views["flags"][3]).all() and np.isnan(read.views["flag"][0, 0])
    assert read.views["flag"][1:, 0].tolist() == flags[1:, 0].astype(float).tolist()


# -- 2-5: labels as they were written ----------------------------------------------------------------------


def test_uint64_labels_beyond_int64_keep_their_values(data):
    labels = np.repeat(np.array([2**64 - 1, 5, 2**63], dtype=np.uint64), 20)
    np.save(data / "labels.npy", labels)
    read = load(data)
    assert read.class_names == ("5", "9223372036854775808", "18446744073709551615")
    assert np.bincount(read.labels).tolist() == [20, 20, 20]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_whole_float_labels_of_any_width_are_read_without_a_warning(dtype, data):
    """float16 labels were read right, but fit printed "RuntimeWarning: overflow encountered in cast":
    2**53, the bound of exact integers, cast to float16 to compare."""
    np.save(data / "labels.npy", np.repeat([1.0, 2.0, 3.0], 20).astype(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(data).class_names == ("1", "2", "3")


def test_float_labels_are_refused_where_not_exact_integers_and_quoted_plainly(data):
    np.save(data / "labels.npy", np.repeat([1e20, 1.0, 2.0], 20))
    with pytest.raises(DataError, match=r"labels\.npy row 0: label 1e\+20 is too large to be an exact"):
        load(data)
    np.save(data / "labels.npy", np.repeat([2.0, 1.0, 2.5], 20))
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value).endswith(
        "labels.npy row 40: label 2.5 is not a class (labels are integers or strings)"
    )


@pytest.mark.parametrize(
    ("lines", "classes"),
    [
        (["1", "01", "+1"], ("+1", "01", "1")),  # three labels, not one
        (["007", "8", "9"], ("007", "8", "9")),  # a name, its zeros kept
        (["-0", "1", "2"], ("-0", "1", "2")),
        (["10", "9", "-1"], ("-1", "9", "10")),  # integers: by value
    ],
)
def test_labels_txt_is_read_as_integers_only_where_every_line_is_one_as_written(data, lines, classes):
    read = load(with_labels_txt(data, "\n".join(lines * 20) + "\n"))
    assert read.class_names == classes
    assert np.bincount(read.labels).tolist() == [20, 20, 20]


@pytest.mark.parametrize("as_text", [False, True])
def test_integer_labels_whose_own_values_classes_txt_lists_in_another_order_keep_their_names(
    as_text, data, tmp_path
):
    """Labels 0, 1, 2 with classes.txt listing "2", "0", "1": the names are the labels' own values, so each
    label is its class by name. Indexing classes.txt by them named every sample of class 0 "2", of 1 "0" and
    of 2 "1": a model answering every class as another, with no error (a probe of the served answers)."""
    codes = np.searchsorted(("cat", "dog", "eel"), np.load(data / "labels.npy"))
    if as_text:
        with_labels_txt(data, "\n".join(map(str, codes)) + "\n")
    else:
        np.save(data / "labels.npy", codes)
    (data / "classes.txt").write_text("2\n0\n1\n")
    read = load(data)
    assert read.class_names == ("2", "0", "1")  # classes.txt's order
    assert np.array(read.class_names)[read.labels].tolist() == [str(code) for code in codes]
    if as_text:
        return
    (data / "classes.txt").unlink()  # --classes alike, through the whole fit to the card's rows
    assert fit("--data", data, "--out", tmp_path / "model", "--classes", "1,2,0", *QUICK) == 0
    assert read_manifest(tmp_path / "model").classes == ["1", "2", "0"]
    card = (tmp_path / "model" / "card.md").read_text()
    for k in range(3):
        assert f"| {k} | {int(np.sum(codes == k))} |" in card
    # Names that are not the labels' values are still indexed by them.
    assert load(data, classes=["x", "y", "z"]).labels.tolist() == codes.tolist()


def test_a_byte_order_mark_is_not_part_of_the_first_label_nor_class(data):
    labels = np.load(data / "labels.npy")
    with_labels_txt(data, b"\xef\xbb\xbf" + "\r\n".join(labels).encode() + b"\r\n")  # Windows' Notepad
    (data / "classes.txt").write_bytes(b"\xef\xbb\xbfeel\r\ncat\r\ndog\r\n")
    read = load(data)
    assert read.class_names == ("eel", "cat", "dog")
    assert read.class_names[read.labels[0]] == labels[0]


def test_blank_lines_at_the_end_of_labels_txt_are_left_out_and_between_refused(data):
    labels = np.load(data / "labels.npy")
    assert load(with_labels_txt(data, "\n".join(labels) + "\n\n  \n")).num_samples == 60
    text = data / "labels.txt"
    text.write_text("\n".join([*labels[:2], "", *labels[2:]]) + "\n\n")
    with pytest.raises(DataError, match=r"labels\.txt line 3: empty"):
        load(data)


@pytest.mark.parametrize("separator", ["\u2028", "\x0c", "\x1c", "\x85"])
def test_labels_txt_is_split_at_line_ends_alone(separator, data):
    # str.splitlines also breaks at these: a label holding one was two, and each line after it one more
    labels = np.load(data / "labels.npy").tolist()
    labels[1] = f"dog{separator}x"
    with_labels_txt(data, "\r\n".join([*labels[:8], "", *labels[8:]]))
    with pytest.raises(DataError, match=r"labels\.txt line 9: empty"):
        load(data)


def test_byte_string_labels_are_read_as_utf8_text(data):
    labels = np.load(data / "labels.npy")
    np.save(data / "labels.npy", np.char.encode(np.char.replace(labels, "eel", "éel"), "utf-8"))  # dtype S
    assert load(data).class_names == ("cat", "dog", "éel")


def test_big_endian_labels_and_views_read_as_their_native_twins(data):
    """What np.save writes on a big-endian machine (or for an array of dtype '>U'): string labels ended
    in a traceback, "TypeError: Invalid unicode code point found", numpy's cast of them to variable-width
    text reading their bytes swapped."""
    native = load(data)
    for name in ("labels", "image"):
        array = np.load(data / f"{name}.npy")
        np.save(data / f"{name}.npy", array.astype(array.dtype.newbyteorder(">")))
    swapped = load(data)
    assert swapped.class_names == native.class_names == ("cat", "dog", "eel")
    np.testing.assert_array_equal(swapped.labels, native.labels)
    np.testing.assert_array_equal(swapped.views["image"], native.views["image"])


def test_byte_string_labels_that_are_not_utf8_are_refused_naming_the_row(data, tmp_path, capsys):
    labels = np.char.encode(np.load(data / "labels.npy"), "utf-8").astype("S8")
    labels[5] = b"caf\xe9"  # Latin-1: numpy's own conversion ended in a UnicodeDecodeError's traceback
    np.save(data / "labels.npy", labels)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert error == f"error: {data / 'labels.npy'} row 5: byte 3 is not UTF-8; save text as UTF-8\n"


def test_one_long_label_costs_its_own_length_not_every_rows(tmp_path):
    # As fixed-width text, every row took the longest label's width: from a labels.txt of 3.5 MB, 1.2 TB.
    # Such a label is no class name (at most 1,024 characters): refused, once read at its own length.
    rows, long = 100_000, "x" * 3_000_000
    rng = np.random.default_rng(0)
    views = {name: rng.normal(size=(rows, 2)).astype(np.float32) for name in ("image", "text")}
    labels = np.where(np.arange(rows) % 2, "cat", "dog").tolist()
    labels[7] = long
    directory = write_npy(tmp_path / "data", views, np.array(["cat"]))
    with pytest.raises(DataError, match=r"labels\.txt: class 'x{40}'\.\.\. is 3,000,000 characters long"):
        load(with_labels_txt(directory, "\n".join(labels)))
    labels[7] = longest = "x" * MAX_CLASS_NAME_LENGTH
    (directory / "labels.txt").write_text("\n".join(labels))
    read = load(directory)
    assert read.class_names == ("cat", "dog", longest)
    assert read.labels[7] == 2 and np.bincount(read.labels).tolist() == [49_999, 50_000, 1]


# -- 7: the largest seed -----------------------------------------------------------------------------------


def test_the_largest_seed_fits(data, tmp_path):
    assert fit("--data", data, "--out", tmp_path / "model", "--seed", str(2**32 - 1), *QUICK) == 0
    assert read_manifest(tmp_path / "model").training["seed"] == 2**32 - 1


# -- 8-9: which files are read -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "stem"),
    [("--split-column", "../other/fold"), ("--label-column", "../other/labels"), ("--split-column", "..")],
)
def test_a_label_or_split_file_is_named_by_a_plain_stem(option, stem, data, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    np.save(other / "fold.npy", np.full(60, "train"))
    np.save(other / "labels.npy", np.load(data / "labels.npy"))
    (data / "labels.npy").rename(data / "kind.npy")
    options = {"split_column": stem} if option == "--split-column" else {"label_column": stem}
    with pytest.raises(DataError) as caught:
        load(data, **({"label_column": "kind"} | options))
    assert str(caught.value).startswith(f"{data}: {option} {stem!r} is not a file name")


@pytest.mark.parametrize(("option", "name"), [("split_column", "fold.npy"), ("label_column", "kind.txt")])
def test_a_label_or_split_file_named_with_its_extension_is_told_its_stem(option, name, data):
    """The docs name these files by their stem alone; given the file's name, as a user first types it, the
    error said only that no fold.npy.npy was there."""
    np.save(data / "fold.npy", np.full(60, "train"))
    (data / "labels.npy").rename(data / "kind.npy")
    with pytest.raises(DataError) as caught:
        load(data, **({"label_column": "kind"} | {option: name}))
    stem = name.split(".")[0]
    assert str(caught.value).endswith(f"--{option.replace('_', '-')} takes the file's stem alone: {stem}")


def test_a_csv_file_is_refused_saying_what_fit_reads_and_how_to_get_there(tmp_path):
    """A new user's first try is a CSV: the error read "not a format dataset files come in", and said
    nothing of how to turn one into what fit reads."""
    path = tmp_path / "data.csv"
    path.write_text("label,a,b\ncat,1,2\n")
    with pytest.raises(DataError) as caught:
        load(path)
    assert str(caught.value) == (
        f"{path}: fit does not read .csv files, only a directory of .npy files (one per view), a .parquet "
        "file, or a benchmark dataset's .mat file; write one of those from it (e.g. read it with pandas, "
        "then np.save each view's columns as <view>.npy and the labels as labels.npy: docs/data/formats.md)"
    )


def test_a_view_file_in_another_case_is_refused_naming_it(data):
    (data / "lidar.NPY").write_bytes((data / "text.npy").read_bytes())
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == (
        f"{data / 'lidar.NPY'}: fit reads files ending in .npy, in lower case; rename it lidar.npy (or move "
        "it out of the directory)"
    )


def test_a_numpy_archive_beside_the_views_is_refused_naming_it(data):
    # Left out, the fit went on without it: three views of four, or "found 1" with no word of the archive.
    np.savez(data / "lidar.npz", lidar=np.load(data / "text.npy"))
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == (
        f"{data / 'lidar.npz'}: a NumPy archive (np.savez), which fit does not read; save each of its arrays "
        "as <view>.npy (np.load it, then np.save each), or move it out of the directory, or name the views "
        "to fit with --views"
    )
    assert load(data, views=["image", "text"]).view_names == ("image", "text")


@pytest.mark.parametrize("index_name", [None, "sample"])
def test_the_index_pandas_writes_is_not_a_view(index_name, tmp_path):
    views, labels = dataset()
    frame = pd.DataFrame(
        {"label": labels, "image": list(views["image"]), "text": list(views["text"])}, index=np.arange(60) * 3
    )
    frame.index.name = index_name
    frame.to_parquet(tmp_path / "data.parquet")
    assert load(tmp_path / "data.parquet").view_names == ("image", "text")


def test_labels_in_two_files_are_refused_naming_both(data):
    text = data / "labels.txt"
    text.write_text("\n".join(np.load(data / "labels.npy")) + "\n")
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value).startswith(f"{data / 'labels.npy'} and {text}: both hold the labels")


# -- 10: messages that say what is wrong -------------------------------------------------------------------


def test_a_view_named_twice_is_said_to_be(data, tmp_path):
    with pytest.raises(DataError, match=r"--views names 'image' twice; name each view once"):
        load(data, views=["image", "image"])
    path = tmp_path / "data.parquet"
    views, labels = dataset()
    pq.write_table(pa.table({"image": list_column(views["image"]), "label": pa.array(labels)}), path)
    with pytest.raises(DataError, match=r"--views names 'image' twice"):
        load(path, views=["image", "image"])


def test_two_parquet_columns_of_one_name_are_refused(tmp_path):
    views, labels = dataset()
    columns = [list_column(views["image"]), list_column(views["text"]), pa.array(labels)]
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table(columns, names=["image", "image", "label"]), path)
    with pytest.raises(DataError, match=r"data\.parquet: 2 columns named 'image'; give each its own name"):
        load(path)


def test_a_class_named_twice_is_refused_naming_where(data):
    (data / "classes.txt").write_text("cat\ndog\n\ncat\n")
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == (
        f"{data / 'classes.txt'} line 4: class 'cat' again (line 1); class names are distinct"
    )
    (data / "classes.txt").unlink()
    with pytest.raises(DataError, match=r"^--classes names 'cat' twice; class names are distinct$"):
        load(data, classes=["cat", "dog", "cat"])


def test_a_label_of_labels_txt_is_named_by_its_line_as_an_editor_counts(data):
    """The docs count the lines of a text file from 1, as an editor does: a message saying "row 1" sent a
    user to the first line, one above the label at fault."""
    labels = list(np.load(data / "labels.npy"))
    labels[1] = "fox"
    with_labels_txt(data, "\n".join(labels) + "\n")
    with pytest.raises(
        DataError, match=r"labels\.txt line 2: label 'fox' is not among the class names given"
    ):
        load(data, classes=sorted(set(labels) - {"fox"}))
    (data / "labels.txt").write_text("0\n3\n" + "1\n" * 58)
    with pytest.raises(DataError, match=r"labels\.txt line 2: label 3, but 3 class names are given"):
        load(data, classes=["a", "b", "c"])
    labels[1], labels[3] = "cafe\u0301", "caf\u00e9"  # decomposed and composed: they print alike
    (data / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"labels\.txt lines 2 and 4: labels 'cafe\\u0301' and 'caf\\xe9'"):
        load(data)


def test_no_class_name_given_is_said_to_be(data):
    """`--classes ,` (or an empty classes.txt) named no class, and integer labels were refused as indexing
    "0 class names (0 .. -1)"; as `--views ,` is, it is refused saying that it names none."""
    np.save(data / "labels.npy", np.searchsorted(["cat", "dog", "eel"], np.load(data / "labels.npy")))
    with pytest.raises(DataError, match=r"^--classes names no class \(it takes comma-separated class names"):
        load(data, classes=[])
    (data / "classes.txt").write_text("\n\n")
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == f"{data / 'classes.txt'}: no class name (one a line, in label order)"


# -- a view that carries nothing -------------------------------------------------------------------------


def test_a_constant_view_is_refused_before_training(data, tmp_path, capsys):
    """A view of one value in every sample (missing rows aside) gave its head nothing to learn and made the
    flag raise half of the clean test samples against its 5% target: refused, naming the file."""
    sensor = np.load(data / "sensor.npy").astype(np.float32)
    constant = np.ones_like(sensor)
    constant[::4] = np.nan  # missing for some samples: the others are still all alike
    np.save(data / "sensor.npy", constant)
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert f"{data / 'sensor.npy'}: every feature has one value in every sample (a constant view)" in error
    assert "--views" in error and not (tmp_path / "model").exists()
    one_column_varies = constant.copy()
    one_column_varies[1, 0] = 2.0
    np.save(data / "sensor.npy", one_column_varies)
    load(data)  # one feature that varies: read


def test_a_constant_parquet_column_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 20)
    table = pa.table(
        {
            "label": labels,
            "camera": list_column(rng.normal(labels[:, None], 1.0, (40, 3))),
            "sensor": list_column(np.zeros((40, 2))),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"column 'sensor'.*a constant view"):
        load(tmp_path / "d.parquet")


@pytest.mark.parametrize("empty_rows", [[0], [0, 7], [5]])
def test_an_empty_list_in_a_parquet_view_is_refused_naming_its_row(empty_rows, tmp_path):
    """An empty list in the first row was named as the row after it (row 1 for row 0), and the error did not
    say that a missing view is a null, what pandas users writing ``[]`` for one meant."""
    views, labels = dataset()
    rows = [[] if row in empty_rows else values.tolist() for row, values in enumerate(views["text"])]
    table = pa.table({"label": labels, "image": list_column(views["image"]), "text": pa.array(rows)})
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError) as caught:
        load(tmp_path / "d.parquet")
    assert str(caught.value) == (
        f"{tmp_path / 'd.parquet'} column 'text' row {empty_rows[0]}: an empty list; a view needs a feature "
        "per row, and a missing view is a null (None in pandas), not an empty list"
    )


@pytest.mark.parametrize("partition", ["label", "site"])
def test_a_partitioned_parquet_directory_is_refused_saying_to_write_one_file(partition, tmp_path, capsys):
    """pandas' ``to_parquet(path, partition_cols=...)`` (Spark and Dask alike) writes a directory of Parquet
    files, which fit took for a directory of .npy files: "no labels.npy or labels.txt"."""
    views, labels = dataset()
    frame = pd.DataFrame(
        {"label": labels, "site": np.where(np.arange(60) % 2, "north", "south")}
        | {name: list(matrix) for name, matrix in views.items()}
    )
    frame.to_parquet(tmp_path / "data.parquet", partition_cols=[partition])
    error = refused(capsys, "--data", tmp_path / "data.parquet", "--out", tmp_path / "model")
    assert error == (
        f"error: {tmp_path / 'data.parquet'}: a directory of Parquet files (a partitioned dataset, as "
        "pandas' partition_cols, Spark or Dask write it); fit reads one Parquet file, or a directory of .npy "
        "files: write it as one file (e.g. pandas.read_parquet of the directory, then to_parquet to a file)\n"
    )
    merged = tmp_path / "merged.parquet"
    pd.read_parquet(tmp_path / "data.parquet").to_parquet(merged)  # what the error says to do
    assert load(merged, views=list(views)).class_names == tuple(sorted(set(labels)))


def test_utf16_labels_txt_is_refused_saying_to_save_it_as_utf8(data, tmp_path, capsys):
    """What Windows PowerShell's ``>`` writes: "byte 0 is not UTF-8" said nothing of UTF-16 or what to do."""
    labels = np.load(data / "labels.npy").tolist()
    with_labels_txt(data, "\n".join(labels).encode("utf-16"))
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert error == (
        f"error: {data / 'labels.txt'}: UTF-16 text (what Windows PowerShell's > and Notepad's 'Unicode' "
        "write); fit reads UTF-8: save the labels as UTF-8 (PowerShell: Out-File -Encoding utf8)\n"
    )


def test_utf16_labels_without_a_byte_order_mark_are_refused_not_merged(data):
    """Read as UTF-8, UTF-16 text has a NUL beside every letter, and numpy's variable-width text compares
    strings holding one as equal: '\\0c\\0a\\0t\\0' and '\\0d\\0o\\0g\\0' were one class, in silence (two
    classes of three, every cat a dog or every dog a cat)."""
    labels = np.load(data / "labels.npy").tolist()
    with_labels_txt(data, "\n".join(labels).encode("utf-16-le"))
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == (
        f"{data / 'labels.txt'} line 1: a NUL character (text saved as UTF-16?); fit reads UTF-8: save the "
        "labels as UTF-8"
    )
    (data / "labels.txt").unlink()
    np.save(data / "labels.npy", np.array([chr(0) + label for label in labels]))  # a NUL first, as UTF-16 BE
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == (
        f"{data / 'labels.npy'} row 0: label {chr(0) + labels[0]!a} holds a NUL character (text saved as "
        "UTF-16?); labels are text without NULs: save them as UTF-8"
    )


def test_a_header_line_in_labels_txt_is_suggested_as_why_it_has_a_label_too_many(data, tmp_path, capsys):
    """pandas' ``labels.to_csv("labels.txt", index=False)`` writes the column's name first: the error said
    only that labels.txt had 61 labels for 60 rows, not which line was one too many."""
    pd.Series(np.load(data / "labels.npy"), name="species").to_csv(data / "labels.txt", index=False)
    (data / "labels.npy").unlink()
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert error == (
        f"error: {data / 'image.npy'} has 60 rows but {data / 'labels.txt'} has 61 labels; is its line 1 "
        "('species') a header? it holds the labels alone, one a line (pandas: to_csv(path, index=False, "
        "header=False))\n"
    )


@pytest.mark.parametrize("nesting", ["lists of lists", "tensors"])
def test_a_parquet_view_of_nested_numbers_is_told_to_flatten_them(nesting, tmp_path):
    """An image per row, as lists of lists or pyarrow's tensor type: "is not numeric", of numbers, where a
    3-D .npy view is told to reshape to (N, -1)."""
    views, labels = dataset()
    images = views["image"][:, :4].reshape(-1, 2, 2)
    if nesting == "tensors":
        column = pa.FixedShapeTensorArray.from_numpy_ndarray(images)
    else:
        column = pa.array(images.tolist())
    table = pa.table({"label": labels, "image": column, "text": list_column(views["text"])})
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError) as caught:
        load(tmp_path / "d.parquet")
    stored = pq.read_schema(tmp_path / "d.parquet").field("image").type
    assert str(caught.value) == (
        f"{tmp_path / 'd.parquet'} column 'image': type {stored} nests its numbers "
        "(an image or a sequence per row?); a view holds one flat list of numbers per row: write each row's "
        "numbers as one list (a .npy view's reshape to (N, -1)), or name the views to fit with --views to "
        "leave it out"
    )


def test_byte_string_labels_of_a_parquet_file_are_read_as_utf8_text_as_a_npy_files_are(tmp_path):
    """Labels of bytes (as h5py reads strings) that pandas wrote to Parquet, a binary column, were refused,
    "label b'cat' of type bytes; labels are integers or strings", where a .npy file of them is read."""
    views, labels = dataset()
    encoded = [label.replace("eel", "éel").encode() for label in labels]
    frame = pd.DataFrame({"label": encoded} | {name: list(matrix) for name, matrix in views.items()})
    frame.to_parquet(tmp_path / "d.parquet")
    read = load(tmp_path / "d.parquet")
    assert read.class_names == ("cat", "dog", "éel")
    assert [read.class_names[code] for code in read.labels] == [label.decode() for label in encoded]
    frame.loc[5, "label"] = b"caf\xe9"  # Latin-1
    frame.to_parquet(tmp_path / "d.parquet")
    with pytest.raises(DataError) as caught:
        load(tmp_path / "d.parquet")
    assert (
        str(caught.value)
        == f"{tmp_path / 'd.parquet'} column 'label' row 5: byte 3 is not UTF-8; save text as UTF-8"
    )


def test_one_hot_labels_are_refused_saying_to_save_their_argmax(data, tmp_path):
    """Keras' ``to_categorical`` rows, saved as labels.npy of shape (N, K) or a Parquet column of lists: the
    errors said labels are one value per sample, not how to get there from one-hot rows."""
    views, labels = dataset()
    one_hot = np.eye(3)[np.searchsorted(("cat", "dog", "eel"), labels)]
    np.save(data / "labels.npy", one_hot)
    with pytest.raises(DataError) as caught:
        load(data)
    assert str(caught.value) == (
        f"{data / 'labels.npy'}: shape (60, 3); labels are one value per sample, shape (N,) (one-hot rows? "
        "save their argmax: np.argmax(labels, axis=1))"
    )
    frame = pd.DataFrame({"label": list(one_hot)} | {name: list(matrix) for name, matrix in views.items()})
    frame.to_parquet(tmp_path / "d.parquet")
    with pytest.raises(DataError) as caught:
        load(tmp_path / "d.parquet")
    assert str(caught.value).startswith(f"{tmp_path / 'd.parquet'} column 'label' row 0: label array(")
    assert str(caught.value).endswith("labels are integers or strings (one-hot rows? save their argmax)")


@pytest.mark.parametrize("name", ["df.parquet.gzip", "data.parquet.snappy", "data.PQ"])
def test_a_parquet_file_named_for_its_codec_is_read_as_parquet(name, tmp_path):
    """pandas' documentation writes ``df.to_parquet('df.parquet.gzip', compression='gzip')``: fit said it
    did not read .gzip files, and told the user to convert the file to .npy files."""
    views, labels = dataset()
    frame = pd.DataFrame({"label": labels} | {view: list(matrix) for view, matrix in views.items()})
    frame.to_parquet(tmp_path / name, compression="gzip")
    read = load(tmp_path / name)
    assert read.view_names == tuple(views) and read.class_names == ("cat", "dog", "eel")


@pytest.mark.parametrize("bom", [b"", codecs.BOM_UTF8])
def test_a_labels_txt_not_in_utf8_is_refused_naming_its_line(bom, data, tmp_path, capsys):
    """Latin-1 or Windows-1252, as Excel's "Text" saves: the error named a byte offset, counted after any
    byte order mark, not the line, nor what to save the file as."""
    labels = np.load(data / "labels.npy").tolist()
    labels[3] = "café"
    with_labels_txt(data, bom + "\r\n".join(labels).encode("cp1252"))
    error = refused(capsys, "--data", data, "--out", tmp_path / "model")
    assert error == (
        f"error: {data / 'labels.txt'} line 4: not UTF-8 text (Latin-1, or Windows-1252 as Excel saves "
        "text?); fit reads UTF-8: save the labels as UTF-8\n"
    )


def test_class_and_view_names_listed_with_spaces_after_the_commas_are_read_without_them(data, tmp_path):
    """``--classes "cat, dog, eel"``, as written in prose: "label 'dog' is not among the class names given
    (cat,  dog,  eel)", and ``--views "image, text"``: "no view ' text'"."""
    out = tmp_path / "model"
    options = ["--classes", "eel, cat , dog", "--views", "text, image"]
    assert fit("--data", data, "--out", out, *options, *QUICK) == 0
    manifest = read_manifest(out)
    assert manifest.classes == ["eel", "cat", "dog"]
    assert [view.name for view in manifest.views] == ["text", "image"]


def _split_of(labels: np.ndarray) -> list[str]:
    """Per sample, train, validation or test: the first two thirds train, then one of each by turns."""
    cut = 2 * labels.size // 3
    return (
        ["train"] * cut
        + ["validation", "test"] * ((labels.size - cut) // 2)
        + ["test"] * ((labels.size - cut) % 2)
    )


@pytest.mark.parametrize("saved_as", ["txt", "npy"])
def test_a_split_file_beside_the_views_is_refused_until_named(saved_as, data):
    # Left unnamed, split.txt went unread without a word: the fit split the samples its own way, and the
    # test samples the user had set aside were trained on; split.npy too beside views named with --views.
    split = _split_of(np.load(data / "labels.npy"))
    if saved_as == "txt":
        (data / "split.txt").write_text("\n".join(split) + "\n")
    else:
        np.save(data / "split.npy", np.asarray(split))
    said = (
        f"{data / f'split.{saved_as}'}: a train/validation/test split, which fit follows only when named: "
        "pass --split-column split (or move it out of the directory to split the samples stratified)"
    )
    for views in (None, ["image", "text"]):
        with pytest.raises(DataError) as caught:
            load(data, views=views)
        assert str(caught.value) == said
    assert load(data, split_column="split").split is not None
    (data / "notes.txt").write_text("train\nthe heads on the camera first\n")  # text, not a split
    np.save(data / "names.npy", np.asarray(["train", "kept"] * (len(split) // 2)))  # no split either
    assert load(data, views=["image", "text"], split_column="split").view_names == ("image", "text")
    (data / f"split.{saved_as}").rename(data / f"fold.{saved_as}")
    with pytest.raises(DataError, match=rf"fold\.{saved_as}: a train/validation/test split"):
        load(data, views=["image", "text"])


def test_a_split_column_beside_the_views_is_refused_until_named(data, tmp_path):
    # Beside views named with --views, the column went unread without a word; unnamed, it was refused as a
    # view that is not numeric.
    labels = np.load(data / "labels.npy")
    views = {name: np.load(data / f"{name}.npy") for name in ("image", "text")}
    columns = {name: list_column(matrix) for name, matrix in views.items()}
    table = pa.table({**columns, "label": labels, "fold": pa.array(_split_of(labels)).dictionary_encode()})
    pq.write_table(table, tmp_path / "data.parquet")
    said = (
        f"{tmp_path / 'data.parquet'} column 'fold': a train/validation/test split, which fit follows only "
        "when named: pass --split-column fold (or leave it out of the file to split the samples stratified)"
    )
    for views_named in (None, ["image", "text"]):
        with pytest.raises(DataError) as caught:
            load(tmp_path / "data.parquet", views=views_named)
        assert str(caught.value) == said
    assert load(tmp_path / "data.parquet", split_column="fold").split is not None
    kept = table.set_column(3, "fold", pa.array(["train", "kept"] * (labels.size // 2)))  # no split's name
    pq.write_table(kept, tmp_path / "kept.parquet")
    assert load(tmp_path / "kept.parquet", views=["image", "text"]).view_names == ("image", "text")
    with pytest.raises(DataError, match="column 'fold': type string is not numeric"):
        load(tmp_path / "kept.parquet")
