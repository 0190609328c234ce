"""Reading multi-view data: a directory of NumPy files, a Parquet file, or a benchmark ``.mat`` file.

Every reader ends in the same checks (:func:`assemble`) and produces the same :class:`MultiViewData`; a
problem is a :class:`DataError` naming the file, column or view, and the row (0-based; lines of a text file
count from 1), raised before anything is trained or written.

``DIR/`` (:func:`read_npy_directory`)
    ``<view>.npy`` per view, shape ``(N, d)``, any integer, floating or bool dtype (bool as 0 and 1); labels
    in ``labels.npy`` (``(N,)`` integers or strings) or ``labels.txt`` (one per line); optional
    ``classes.txt`` (class names in label order). Every other ``.npy`` file is a view, named by its file name;
    a file ending in ``.NPY`` (any other case) is refused rather than left out unseen, and so is a NumPy
    archive (``.npz``) unless ``views`` names the views. Each is a regular file
    (a symbolic link only to a file inside the directory), and a ``.npy`` file of Python objects is refused:
    loading it would unpickle it, which can run code. The label and split files are named by a plain file
    stem, never a path.
``FILE.parquet`` (:func:`read_parquet`)
    A label column (``label``) and one column per view holding a list or fixed-size list of numbers per row
    (a plain numeric column is a view of width 1); every other column is a view, except the index columns
    pandas writes (``__index_level_0__``, or the index's name).
a registry name (:func:`read_registered`)
    The benchmark dataset's ``.mat`` file in the data directory, as :mod:`training.registry` describes it.

A missing view is a row of NaN in the ``.npy`` file or a null in the Parquet column. Labels that are
strings become classes in sorted order (or in ``classes.txt`` / ``classes`` order); integer labels index the
given class names, or else become classes in sorted order. Lines of a text file are integers only where
every line is one as Python writes it (``7``, never ``07`` or ``+7``), else all are strings; a leading UTF-8
byte order mark and blank lines at the end are left out. Features are converted to float32 in chunks, so
reading keeps one float32 copy of the data and little else; a column that float32 cannot tell apart (large
values of a small spread, such as ``1e9 + x``) is refused. At most :data:`MAX_VIEWS` views are read.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import stat
import struct
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from manifest import MAX_CLASS_NAME_LENGTH, MAX_VIEW_DIM, NAME_PATTERN
from training.data import SPLIT_NAMES, DataError, MultiViewData
from training.download import DOWNLOAD_COMMAND
from training.registry import DATASETS, DatasetSpec, dataset_spec

__all__ = [
    "LABEL_BYTES_PER_ROW",
    "MAX_VIEWS",
    "MAX_VIEW_NAME",
    "Column",
    "assemble",
    "features",
    "load",
    "read_npy_directory",
    "read_parquet",
    "read_registered",
]

# float32 bytes converted and checked at a time. Small batches keep reading's transient memory small, for a
# little more time than bigger ones (the figures: docs/benchmarks.md, "Fitting").
_CHUNK_BYTES = 1 << 22


def _chunk_rows(width: int) -> int:
    return max(1, _CHUNK_BYTES // (4 * max(width, 1)))


def served_view_dim() -> int:
    """The widest view the service will serve: ``DBF_MAX_VIEW_DIM`` where set (the service's own setting),
    else its default (:data:`manifest.MAX_VIEW_DIM`)."""
    text = os.environ.get("DBF_MAX_VIEW_DIM", "").strip()
    if not text:
        return MAX_VIEW_DIM
    if not text.isdigit() or int(text) < 1:
        raise DataError(f"DBF_MAX_VIEW_DIM={text!r} is not a positive whole number of features")
    return int(text)


def _check_width(width: int, *, where: str) -> None:
    """A view wider than the service serves: refused before its matrix is made (a model of it would be
    refused at load, and one wide row could make the matrix of every row that wide)."""
    widest = served_view_dim()
    if width > widest:
        raise DataError(
            f"{where}: {width:,} features per sample; the service serves views of at most {widest:,} "
            "(DBF_MAX_VIEW_DIM, for fit as for the service): reduce the view (e.g. an embedding or PCA), or "
            "raise DBF_MAX_VIEW_DIM for both"
        )


def machine_memory() -> int | None:
    """This machine's physical memory in bytes; None where the system does not say (not POSIX)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory() -> int | None:
    """The memory this process can still take, in bytes: Linux's ``MemAvailable``, within the limit of its
    control group (a container's) where it has one; elsewhere the machine's memory; None where unknown."""
    known = []
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):  # cgroup v2; "max" where unlimited
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            known.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    return min(known) if known else machine_memory()


FIT_BYTES_PER_DATA_BYTE = 1.6
"""What a fit holds at its peak per byte of its data as float32: the data, and its splits and their
conflictive copies beside it (measured: 208 MB of data, 329 MB more than a fit of a few kilobytes; 404 MB,
609 MB more)."""


def _check_room(needed: int, *, where: str, what: str, instead: str) -> None:
    """A :class:`DataError` where ``needed`` bytes of data, held by a fit (:data:`FIT_BYTES_PER_DATA_BYTE`
    times), would take more than the memory available now; ``what`` says what makes them, ``instead`` what
    to do."""
    memory = available_memory()
    if memory is not None and needed * FIT_BYTES_PER_DATA_BYTE > memory:
        raise DataError(
            f"{where}: {what}, and a fit holds about {FIT_BYTES_PER_DATA_BYTE} times its data: more than the "
            f"{memory / 2**30:,.1f} GiB of memory available; {instead}"
        )


def _dense(rows: int, width: int, *, where: str) -> np.ndarray:
    """An uninitialised float32 ``(rows, width)`` matrix, or a :class:`DataError` where the fit it is read for
    could not hold it in the memory available now (rather than numpy's MemoryError, or pages the kernel kills
    the process for once written, and other processes with it: a sparse .npy of 20 GB was filled).
    Views are read one after another, each written in full before the next is made: the memory available
    then is what the views before it left."""
    needed = rows * width * 4
    _check_room(
        needed,
        where=where,
        what=f"{rows:,} samples of {width:,} features make {needed / 2**30:,.1f} GiB as float32",
        instead="fit a sample of the rows, or reduce the view (e.g. a PCA)",
    )
    try:
        return np.empty((rows, width), dtype=np.float32)
    except MemoryError:
        raise DataError(
            f"{where}: {rows:,} samples of {width:,} features make {needed / 2**30:,.1f} GiB as float32, "
            "more than this machine can allocate"
        ) from None


_SPLIT_ALIASES = {
    "train": 0,
    "training": 0,
    "validation": 1,
    "val": 1,
    "valid": 1,
    "test": 2,
    "testing": 2,
}
_INTEGER = re.compile(r"[+-]?\d+")
_INT64 = np.iinfo(np.int64)
_EXACT_FLOAT = 2**53  # every integer up to this is a float64; beyond it, every other one is not
# Text labels as numpy's variable-width strings: its fixed-width ones (dtype str) give every row the longest
# label's width, so one long line among 100,000 short ones made terabytes of a labels file of megabytes.
_TEXT = np.dtypes.StringDType()
# Parquet compresses inside the file; some name it for its codec after .parquet (pandas' df.parquet.gzip)
_PARQUET_CODEC_SUFFIXES = (".gzip", ".gz", ".snappy", ".zstd", ".zst", ".brotli", ".lz4")
_NPY_MAGIC = np.lib.format.MAGIC_PREFIX
_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}

MAX_VIEWS = 64
"""The most views fit takes: each adds a head, and every sample's conflict matrix grows as its square."""

MAX_VIEW_NAME = 250
"""The longest view name, in characters (ASCII alone): its model file, ``<view>.onnx``, is a file name of at
most 255 bytes."""

LABEL_BYTES_PER_ROW = 1024
"""What a Parquet label or split column may take per row, on average, decompressed: class names, not texts.
Checked from the file's metadata before the column is read, so that a few kilobytes of compressed repetition
cannot make gigabytes of labels."""


class Column(NamedTuple):
    """Values as read, and where they came from, for messages: ``DIR/pix.npy``, ``F.parquet column 'x'``."""

    values: object
    where: str

    def at(self, *rows: int) -> str:
        """Where samples ``rows`` are, as the docs count: ``F.txt line 3`` (an editor's lines, from 1) for a
        text file, ``F.npy row 2`` (from 0) for an array or a Parquet column; ``rows 2 and 5`` for two."""
        text = isinstance(self.values, list)
        unit = ("line" if text else "row") + ("s" if len(rows) > 1 else "")
        return f"{self.where} {unit} {' and '.join(str(row + text) for row in rows)}"


def load(
    source: str | os.PathLike[str] | DatasetSpec,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    views: Sequence[str] | None = None,
    label_column: str | None = None,
    classes: Sequence[str] | None = None,
    split_column: str | None = None,
) -> MultiViewData:
    """Read a dataset: a registry name or spec (from ``data_dir``), a directory of ``.npy`` files, or a
    Parquet file.

    A string that is a registry name means that benchmark dataset; anything else is a path (write
    ``./pie`` for a directory that happens to be called like one). The keyword options are those of the
    format readers; a benchmark dataset takes none of them.

    Raises
    ------
    FileNotFoundError
        A benchmark file or the path is absent; the message says how to fetch the file.
    DataError
        The data cannot make a model (see the module notes); the message names the file, column and row.

    Examples
    --------
    With the data in ``./data`` (``python -m training download``), ``load("handwritten", "data")`` has
    six views, 2000 samples and 10 classes.
    """
    if isinstance(source, DatasetSpec) or (isinstance(source, str) and source in DATASETS):
        options = {
            "views": views,
            "label_column": label_column,
            "classes": classes,
            "split_column": split_column,
        }
        given = [f"--{key.replace('_', '-')}" for key, value in options.items() if value is not None]
        if given:
            raise DataError(
                f"{dataset_spec(source).name} is a benchmark dataset: {', '.join(given)} do not apply"
            )
        return read_registered(
            source, os.environ.get("DBF_DATA_DIR", "data") if data_dir is None else data_dir
        )
    path = Path(source)
    if not path.exists():
        known = ", ".join(DATASETS)
        raise FileNotFoundError(f"{path}: no such file or directory, nor a benchmark dataset ({known})")
    if views is not None and not views:
        raise DataError(f"--views names no view (it takes comma-separated view names of {path})")
    common = {"views": views, "classes": classes, "split_column": split_column}
    if path.is_dir():
        return read_npy_directory(path, label_column=label_column or "labels", **common)
    suffixes = [suffix.lower() for suffix in path.suffixes[-2:]]
    # pandas' own example writes df.parquet.gzip: Parquet, compressed inside, named for its codec too
    if suffixes[-1:] in ([".parquet"], [".pq"]) or (
        suffixes[:1] in ([".parquet"], [".pq"]) and suffixes[-1] in _PARQUET_CODEC_SUFFIXES
    ):
        return read_parquet(path, label_column=label_column or "label", **common)
    registered = [spec for spec in DATASETS.values() if spec.file_name == path.name]
    if path.suffix.lower() == ".mat" and registered and label_column is None and views is None:
        return read_registered(registered[0], path.parent)
    kind = f"{path.suffix} files" if path.suffix else "files without an extension"
    raise DataError(
        f"{path}: fit does not read {kind}, only a directory of .npy files (one per view), a .parquet file, "
        "or a benchmark dataset's .mat file; write one of those from it (e.g. read it with pandas, then "
        "np.save each view's columns as <view>.npy and the labels as labels.npy: docs/data/formats.md)"
    )


# -- the NumPy directory -------------------------------------------------------------------------------------


def read_npy_directory(
    directory: str | os.PathLike[str],
    *,
    views: Sequence[str] | None = None,
    label_column: str = "labels",
    classes: Sequence[str] | None = None,
    split_column: str | None = None,
) -> MultiViewData:
    """Read ``directory``: one ``<view>.npy`` per view, labels, optional ``classes.txt`` (module notes).

    ``views`` picks views and their order (default: every other ``.npy`` file, sorted by name);
    ``label_column`` names the label file (``<name>.npy`` or ``<name>.txt``); ``split_column`` a file of
    ``train`` / ``validation`` / ``test`` per sample in the same way; ``classes`` overrides ``classes.txt``.
    """
    directory = Path(directory)
    _check_stem(label_column, directory, option="--label-column", example="labels")
    if split_column is not None:
        _check_stem(split_column, directory, option="--split-column", example="fold")
    miscased = sorted(
        p.name for p in directory.glob("*") if p.suffix.lower() == ".npy" and p.suffix != ".npy"
    )
    if miscased:  # a view the user meant, else left out without a word
        raise DataError(
            f"{directory / miscased[0]}: fit reads files ending in .npy, in lower case; rename it "
            f"{Path(miscased[0]).stem}.npy (or move it out of the directory)"
        )
    archives = sorted(p.name for p in directory.glob("*") if p.suffix.lower() == ".npz")
    if archives and views is None:  # np.savez's views, else left out without a word
        raise DataError(
            f"{directory / archives[0]}: a NumPy archive (np.savez), which fit does not read; save each of "
            "its arrays as <view>.npy (np.load it, then np.save each), or move it out of the directory, or "
            "name the views to fit with --views"
        )
    if not any(directory.glob("*.npy")) and _parquet_parts(directory):
        # A partitioned dataset (pandas' partition_cols, Spark, Dask): else "no labels.npy or labels.txt".
        raise DataError(
            f"{directory}: a directory of Parquet files (a partitioned dataset, as pandas' partition_cols, "
            "Spark or Dask write it); fit reads one Parquet file, or a directory of .npy files: write it as "
            "one file (e.g. pandas.read_parquet of the directory, then to_parquet to a file)"
        )
    reserved = {label_column, *([split_column] if split_column else [])}
    labels = _text_or_npy(directory, label_column, role="labels")
    if labels is None:
        raise _no_stem_file(directory, label_column, "--label-column", "the labels, one per sample")
    split = None
    if split_column is not None:
        split = _text_or_npy(directory, split_column, role="split")
        if split is None:
            raise _no_stem_file(directory, split_column, "--split-column", "the split column")
    else:
        _refuse_unnamed_split(directory, label_column=label_column)
    found = sorted(path.stem for path in directory.glob("*.npy") if path.stem not in reserved)
    names = list(views) if views is not None else found
    for name in names:
        if name not in found:
            raise DataError(f"{directory}: no view {name!r} ({name}.npy); views there: {', '.join(found)}")
    if not names:
        raise DataError(f"{directory}: no view files (<view>.npy, one (N, d) matrix per view)")
    _check_views(names, directory, where=lambda name: str(directory / f"{name}.npy"))
    if classes is None and os.path.lexists(directory / "classes.txt"):
        classes = _class_names(directory / "classes.txt", directory=directory)
    # Shapes first, from the headers: a row-count mismatch is reported before any conversion.
    arrays = {name: _open_npy(directory / f"{name}.npy", directory=directory) for name in names}
    _check_rows(
        {name: Column(array, str(directory / f"{name}.npy")) for name, array in arrays.items()}, labels
    )
    return assemble(
        {
            name: Column(
                features(array, where=str(directory / f"{name}.npy")), str(directory / f"{name}.npy")
            )
            for name, array in arrays.items()
        },
        labels,
        classes=classes,
        split=split,
        name=directory.resolve().name,
        source=str(directory),
    )


def _parquet_parts(directory: Path) -> bool:
    """Whether ``directory`` holds Parquet files, in it or in partitions' folders (``site=north/``)."""
    patterns = ("*.parquet", "*.pq", "*=*/**/*.parquet", "*=*/**/*.pq")
    return any(next(directory.glob(pattern), None) is not None for pattern in patterns)


def _check_stem(stem: str, directory: Path, *, option: str, example: str) -> None:
    """A label or split file's stem: a name in ``directory``, never a path that leads out of it."""
    if stem in ("", ".", "..") or "/" in stem or "\\" in stem:  # either separator, on every system
        raise DataError(
            f"{directory}: {option} {stem!r} is not a file name; it names a file in the data directory by "
            f"its stem alone ({example} for {directory / example}.npy or .txt)"
        )


def _no_stem_file(directory: Path, stem: str, option: str, role: str) -> DataError:
    """No ``stem.npy`` nor ``stem.txt``; given the file's name (``fold.npy``), as a user first types it, the
    option is told to take its stem (no ``fold.npy.npy`` is all it said)."""
    message = f"{directory}: no {stem}.npy or {stem}.txt ({role})"
    base, extension = os.path.splitext(stem)
    if base and extension.lower() in (".npy", ".txt"):
        message += f"; {option} takes the file's stem alone: {base}"
    return DataError(message)


def _open_npy(path: Path, *, directory: Path) -> np.ndarray:
    """A view's ``.npy`` file, memory-mapped (converted chunk by chunk later), its shape and type checked."""
    array = _load_npy(path, directory=directory, mmap=True, instead="a view holds numbers, shape (N, d)")
    # bool: flags, which the model reads, and the service takes, as 0 and 1
    if not (
        np.issubdtype(array.dtype, np.integer)
        or np.issubdtype(array.dtype, np.floating)
        or array.dtype == np.bool_
    ):
        raise DataError(
            f"{path}: dtype {array.dtype} is not numeric; a view holds numbers, shape (N, d) (every .npy "
            "file but the labels is a view: move it out of the directory, or name the views with --views)"
        )
    if array.ndim != 2:
        hint = ""
        if array.ndim == 1:
            hint = " (reshape a single feature to (N, 1))"
        elif array.ndim > 2:  # images, (N, H, W), and sequences: a head takes one vector per sample
            hint = " (flatten each sample's features: reshape to (N, -1))"
        raise DataError(f"{path}: shape {array.shape}; a view is a matrix (N, d){hint}")
    return array


def _load_npy(path: Path, *, directory: Path, mmap: bool, instead: str) -> np.ndarray:
    """The array of ``directory``'s file ``path`` (memory-mapped with ``mmap``, else read), never unpickled.

    A file of Python objects is refused, saying ``instead``: what to store. Messages say what is wrong with
    the file, never what it holds (numpy's own quote its first bytes).
    """
    _regular_file(path, directory=directory)
    try:
        with path.open("rb") as stream:
            is_npy = stream.read(len(_NPY_MAGIC)) == _NPY_MAGIC
        if is_npy:
            # Memory-mapped either way: numpy then checks the header's shape against the file's size, where
            # reading would first allocate whatever the header claims (terabytes: a MemoryError).
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)
            if mmap:
                return mapped
            _check_room(
                mapped.nbytes,  # a sparse file of a valid header: 20 GB of zeros that take no room on disk
                where=str(path),
                what=f"{mapped.size:,} values make {mapped.nbytes / 2**30:,.1f} GiB",
                instead="check the file's shape",
            )
            return np.array(mapped)
    except DataError:  # a ValueError, but the room's, not numpy's
        raise
    except (OverflowError, MemoryError):  # a shape whose size overflows, or no memory for one that fits
        raise DataError(f"{path}: not a readable .npy file (its header or size is not NumPy's)") from None
    except ValueError as error:
        if "object" in str(error).lower():
            raise DataError(
                f"{path}: Python objects, stored as a pickle, which is never loaded (unpickling a file can "
                f"run code); {instead}"
            ) from None
        raise DataError(f"{path}: not a readable .npy file (its header or size is not NumPy's)") from None
    except (OSError, EOFError) as error:
        raise DataError(f"{path}: not a readable .npy file ({_reason(error)})") from None
    raise DataError(f"{path}: not a readable .npy file (no NumPy header: np.save writes one)")


def _split_like(values: Iterable[object]) -> bool:
    """Whether every one of ``values`` names a split (train, validation, test or an alias of one): a split
    the user meant fit to follow. Read lazily, up to the first value that does not."""
    seen = False
    for value in values:
        if not isinstance(value, str) or value.strip().lower() not in _SPLIT_ALIASES:
            return False
        seen = True
    return seen


def _refuse_unnamed_split(directory: Path, *, label_column: str) -> None:
    """A file of split names (``.txt``, one per line, or a ``.npy`` of strings) in an ``.npy`` directory
    while no ``--split-column`` names it: fit would split the samples its own way and leave the user's split
    unread, without a word (beside views named with --views), or refuse it as a view that is no number."""
    for path in sorted([*directory.glob("*.txt"), *directory.glob("*.npy")]):
        if path.stem in (label_column, "classes") or not path.is_file():
            continue
        if _split_like(_split_candidate(path, directory=directory)):
            raise DataError(
                f"{path}: a train/validation/test split, which fit follows only when named: pass "
                f"--split-column {path.stem} (or move it out of the directory to split the samples "
                "stratified)"
            )


def _split_candidate(path: Path, *, directory: Path) -> Iterable[object]:
    """The values of a file that may hold a split, read only as far as it can: a text file whose first
    line names a split, a ``.npy`` array of strings, one per sample; nothing for any other."""
    try:
        _regular_file(path, directory=directory)  # no link out of the directory, no device, read or not
        if path.suffix == ".txt":
            with path.open("rb") as file:
                first = file.read(64).split(b"\n", 1)[0].decode("utf-8-sig", "replace")
            return _lines(path, directory=directory, role="split") if _split_like([first]) else ()
        values = _load_npy(path, directory=directory, mmap=True, instead="")
    except (OSError, DataError):  # unreadable or malformed: said where the file is read as what it is
        return ()
    one_per_sample = values.ndim in (1, 2) and values.size == values.shape[0]
    return values.reshape(-1) if values.dtype.kind == "U" and one_per_sample else ()


def _text_or_npy(directory: Path, stem: str, *, role: str) -> Column | None:
    """``stem.npy`` (1-D) or ``stem.txt`` (a value per line) in ``directory``; None when neither exists."""
    npy, txt = directory / f"{stem}.npy", directory / f"{stem}.txt"
    if os.path.lexists(npy) and os.path.lexists(txt):
        raise DataError(f"{npy} and {txt}: both hold the {role}; keep one, so that it is clear which is read")
    if os.path.lexists(npy):
        instead = (
            f"save the {role} as strings, np.save(path, np.asarray({role}, dtype=str)), or one per line "
            f"in {stem}.txt"
        )
        values = _load_npy(npy, directory=directory, mmap=False, instead=instead)
        if values.ndim != 1 and not (values.ndim == 2 and values.shape[1] == 1):
            one_hot = ""
            if role == "labels":  # Keras' to_categorical
                one_hot = " (one-hot rows? save their argmax: np.argmax(labels, axis=1))"
            raise DataError(
                f"{npy}: shape {values.shape}; {role} are one value per sample, shape (N,){one_hot}"
            )
        values = values.reshape(-1)
        return Column(_decoded(values, where=str(npy)) if values.dtype.kind == "S" else values, str(npy))
    if os.path.lexists(txt):
        lines = _lines(txt, directory=directory, role=role, keep_blank=True)
        if "" in lines:  # before the rows are counted: a line left blank, not a label too many
            one = "a label" if role == "labels" else f"a {role} value"
            raise DataError(f"{txt} line {lines.index('') + 1}: empty; every sample needs {one}")
        return Column(lines, str(txt))
    return None


def _decoded(values: np.ndarray, *, where: str) -> np.ndarray:
    """Byte strings (dtype ``S``: what ``np.save`` writes for ``bytes``) as text, read as UTF-8; a row that is
    not UTF-8 is an error naming it (numpy's own conversion reads ASCII alone, and names no row)."""
    try:
        return np.strings.decode(values, "utf-8").astype(_TEXT)
    except UnicodeDecodeError:
        for row, value in enumerate(values.tolist()):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(f"{where} row {row}: {_reason(error)}; save text as UTF-8") from None
        raise


TEXT_BYTES_PER_FILE_BYTE = 20
"""What a text file's lines take in memory per byte of the file, as Python strings (measured: 40 MB of
``cat`` and ``dog`` lines, 804 MB): a labels.txt of 1 GB would take all of a machine of 23.5 GB."""


def _lines(path: Path, *, directory: Path, role: str, keep_blank: bool = False) -> list[str]:
    """The stripped lines of a text file, but for blank ones at its end; blank ones between are kept with
    ``keep_blank`` (a missing label is an error naming its line)."""
    _regular_file(path, directory=directory)
    size = path.stat().st_size
    _check_room(
        size * TEXT_BYTES_PER_FILE_BYTE,
        where=str(path),
        what=f"{size / 2**20:,.1f} MB of text make about {TEXT_BYTES_PER_FILE_BYTE} times as much in memory",
        instead=f"save the {role} as a .npy file of integers or strings",
    )
    try:
        raw = path.read_bytes()
        if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # else "byte 0 is not UTF-8"
            raise DataError(
                f"{path}: UTF-16 text (what Windows PowerShell's > and Notepad's 'Unicode' write); fit reads "
                f"UTF-8: save the {role} as UTF-8 (PowerShell: Out-File -Encoding utf8)"
            )
        text = raw.decode("utf-8-sig")  # Windows' editors begin a file with a byte order mark
    except UnicodeDecodeError as error:  # where utf-8-sig counts from: after a byte order mark
        start = error.start + (len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0)
        line = len(re.split(rb"\r\n|\r|\n", raw[:start]))
        raise DataError(
            f"{path} line {line}: not UTF-8 text (Latin-1, or Windows-1252 as Excel saves text?); fit reads "
            f"UTF-8: save the {role} as UTF-8"
        ) from None
    except OSError as error:
        raise DataError(f"{path}: not a readable text file of {role} ({_reason(error)})") from None
    # At line ends alone (\n, \r\n, \r), where an editor ends them: str.splitlines also splits at a form
    # feed, U+2028 and others, and a label holding one became two, moving every label after it a row on.
    lines = [line.strip() for line in re.split(r"\r\n|\r|\n", text)]
    while lines and not lines[-1]:  # an editor's blank lines at the end
        lines.pop()
    nul = next((number for number, line in enumerate(lines, start=1) if "\x00" in line), None)
    if nul is not None:  # before its lines are counted: UTF-16's last NUL is a line of its own
        raise DataError(
            f"{path} line {nul}: a NUL character (text saved as UTF-16?); fit reads UTF-8: save the {role} "
            "as UTF-8"
        )
    if not keep_blank:
        lines = [line for line in lines if line]
    return lines


def _class_names(path: Path, *, directory: Path) -> list[str]:
    """``classes.txt``: a distinct name per line (blank lines left out)."""
    lines = _lines(path, directory=directory, role="classes", keep_blank=True)
    first: dict[str, int] = {}
    for number, name in enumerate(lines, start=1):
        if name and name in first:
            raise DataError(
                f"{path} line {number}: class {name!r} again (line {first[name]}); class names are distinct"
            )
        first.setdefault(name, number)
    names = [name for name in lines if name]
    if not names:
        raise DataError(f"{path}: no class name (one a line, in label order)")
    return names


# -- Parquet -------------------------------------------------------------------------------------------------


def read_parquet(
    path: str | os.PathLike[str],
    *,
    views: Sequence[str] | None = None,
    label_column: str = "label",
    classes: Sequence[str] | None = None,
    split_column: str | None = None,
) -> MultiViewData:
    """Read a Parquet file: a label column and a list-of-numbers column per view (module notes).

    Each view column is read in record batches straight into its float32 matrix, so peak memory is the
    float32 data plus one batch.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _regular_file(Path(path))
    try:
        # Streamed, one buffer at a time, rather than a whole column chunk buffered ahead: with the batch
        # conversion below, reading costs the float32 data plus a few batches, however large the file.
        file = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        # The label and split columns as dictionaries, as they are stored: their size is checked before they
        # are decoded (_parquet_scalars). Columns of scalars alone: pyarrow's KeyError for any other.
        leaves = {file.schema.column(i).path for i in range(len(file.schema))}
        scalars = [column for column in (label_column, split_column) if column in leaves]
        if scalars:
            file = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20, read_dictionary=scalars)
    except (OSError, pa.ArrowException) as error:
        raise DataError(f"{path}: not a readable Parquet file: {error}") from error
    columns = list(file.schema_arrow.names)
    for role, column in (("label", label_column), ("split", split_column)):
        if column is not None and column not in columns:
            option = "--label-column" if role == "label" else "--split-column"
            raise DataError(
                f"{path}: no {role} column {column!r} (columns: {', '.join(columns)}); name it with {option}"
            )
    reserved = {label_column, split_column, *_pandas_index(file.schema_arrow)}
    if split_column is None:
        others = [c for c in columns if c not in reserved and (views is None or c not in views)]
        _refuse_unnamed_split_column(path, file, others)
    names = list(views) if views is not None else [c for c in columns if c not in reserved]
    counts = Counter(columns)
    for name in (*names, label_column, split_column):
        if counts[name] > 1:  # which of them is meant? pyarrow takes neither
            raise DataError(f"{path}: {counts[name]} columns named {name!r}; give each its own name")
    for name in names:
        if name not in columns or name in (label_column, split_column):
            raise DataError(f"{path}: no view column {name!r} (columns: {', '.join(columns)})")
    if not names:
        raise DataError(f"{path}: no view columns beside the label column {label_column!r}")
    _check_views(names, path, where=lambda name: f"{path} column {name!r}")
    for name in names:
        _check_stored_view(file, name, where=f"{path} column {name!r}")
    for column in (label_column, split_column):
        if column is not None:
            _check_stored_labels(file, column, where=f"{path} column {column!r}")
    num_rows = file.metadata.num_rows
    grouped = sum(file.metadata.row_group(group).num_rows for group in range(file.metadata.num_row_groups))
    if grouped != num_rows:  # before a matrix is made for either
        _rows_unlike_metadata(str(path), f"row groups of {grouped:,}", num_rows)
    # glibc's allocator hands a freed batch back to the system at once; arrow's default pool (mimalloc)
    # keeps it for reuse, which raised the peak of reading a 1024-wide column by half the data's size.
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        matrices = {
            name: _parquet_view(file, name, num_rows, where=f"{path} column {name!r}") for name in names
        }
        where = f"{path} column {label_column!r}"
        labels = Column(_parquet_scalars(file, label_column, where=where), where)
        split = None
        if split_column is not None:
            where = f"{path} column {split_column!r}"
            split = Column(_parquet_scalars(file, split_column, where=where), where)
    except (OSError, pa.ArrowException) as error:
        raise DataError(f"{path}: not a readable Parquet file: {error}") from error
    finally:
        pa.set_memory_pool(pool)
    return assemble(
        {name: Column(matrix, f"{path} column {name!r}") for name, matrix in matrices.items()},
        labels,
        classes=classes,
        split=split,
        name=path.stem,
        source=str(path),
    )


def _pandas_index(schema) -> list[str]:
    """The columns pandas stored its index in (``__index_level_0__``, or the index's name): not views."""
    import json

    try:
        pandas = json.loads((schema.metadata or {}).get(b"pandas", b"{}"))
        stored = pandas.get("index_columns", [])
    except (ValueError, AttributeError):  # metadata of another writer's making: no index known
        return []
    # A RangeIndex is stored as a description, not a column.
    return [name for name in stored if isinstance(name, str)] if isinstance(stored, list) else []


def _parquet_view(file, column: str, num_rows: int, *, where: str) -> np.ndarray:
    """One view column as a float32 ``(N, d)`` matrix with NaN rows for nulls, read batch by batch."""
    import pyarrow as pa

    kind = file.schema_arrow.field(column).type
    fixed = pa.types.is_fixed_size_list(kind)
    is_list = fixed or pa.types.is_list(kind) or pa.types.is_large_list(kind)
    item = kind.value_type if is_list else kind
    flags = pa.types.is_boolean(item)
    if flags:  # read as 0 and 1, which the service takes; a null among them is a missing number's NaN
        item = pa.float32()
    if not (pa.types.is_integer(item) or pa.types.is_floating(item)):
        if _nested_numbers(kind):  # an image or a sequence per row (pyarrow's tensors too): numbers, not flat
            raise DataError(
                f"{where}: type {kind} nests its numbers (an image or a sequence per row?); a view holds one "
                "flat list of numbers per row: write each row's numbers as one list (a .npy view's reshape "
                "to (N, -1)), or name the views to fit with --views to leave it out"
            )
        raise DataError(
            f"{where}: type {kind} is not numeric; a view holds a list of numbers per row (every column but "
            "the label and split columns is a view: name the views with --views to leave it out)"
        )
    width = kind.list_size if fixed else (None if is_list else 1)
    if width == 0:
        raise DataError(f"{where}: width 0 (every sample needs at least one feature)")
    if num_rows == 0:
        raise DataError(f"{where}: no rows (the file has no samples)")
    if width is not None:
        _check_width(width, where=where)
    per_row = max((-(-values // max(rows, 1)) for rows, values, _ in _stored_sizes(file, column)), default=1)
    out: np.ndarray | None = None
    rounding = None if np.can_cast(item.to_pandas_dtype(), np.float32) else _Rounding()
    start = width_row = 0
    # Batches of a few megabytes: of the width, or for lists of any length the most per row a row group holds.
    batches = file.iter_batches(batch_size=_chunk_rows(width or per_row), columns=[column], use_threads=False)
    for batch in batches:
        array = batch.column(0)
        n = len(array)
        valid = ~array.is_null().to_numpy(zero_copy_only=False)
        numbers = array.flatten() if is_list else array
        values = (numbers.cast(item) if flags else numbers).to_numpy(zero_copy_only=False)
        if not is_list:
            values = values.reshape(-1, 1)[valid]
        else:
            if not fixed:  # every row's length: the first non-null row's
                lengths = np.diff(array.offsets.to_numpy())[valid]
                if width is None and lengths.size:
                    width, width_row = int(lengths[0]), start + int(np.flatnonzero(valid)[0])
                    _check_width(width, where=f"{where} row {width_row}")
                # An empty list where the width is set too: the first such row, not the first row unlike it.
                wrong = np.flatnonzero((lengths != width) | (lengths == 0)) if lengths.size else lengths
                if wrong.size:
                    at = int(wrong[0])
                    row = start + int(np.flatnonzero(valid)[at])
                    if lengths[at] == 0:  # what a missing view is often written as: say what it is instead
                        raise DataError(
                            f"{where} row {row}: an empty list; a view needs a feature per row, and a "
                            "missing view is a null (None in pandas), not an empty list"
                        )
                    # Both rows named: the odd one may be the first, which set the width ("earlier rows").
                    raise DataError(
                        f"{where} row {row}: {int(lengths[at])} numbers, where row {width_row}, the first "
                        f"that has the view, has {width}"
                    )
            values = values.reshape(-1, width) if width else values.reshape(0, 0)
        if out is None and width is not None:
            out = _dense(num_rows, width, where=where)
            out[:start] = np.nan  # rows before the first non-null one: all missing
        if out is not None:
            block = out[start : start + n]
            block[~valid] = np.nan
            with np.errstate(over="ignore", invalid="ignore"):
                block[valid] = values
            _check_block(block, where=where, offset=start)
            if rounding is not None:
                rounding.add(values, block[valid])
        start += n
    if start != num_rows:  # fewer: the matrix's last rows were never written
        _rows_unlike_metadata(where, f"{start:,}", num_rows)
    if out is None:  # every row null (or no rows): the width is unknowable
        raise DataError(f"{where}: every row is null, so the view has no features to learn from")
    if rounding is not None:
        rounding.check(where)
    _check_varies(out, where=where)
    return out


def _nested_numbers(kind) -> bool:
    """Whether an Arrow type is numbers in lists of lists, or in an extension type (a tensor per row)."""
    import pyarrow as pa

    depth = 0
    while True:
        if isinstance(kind, pa.BaseExtensionType):  # pyarrow's own tensors are not pa.ExtensionType
            kind, depth = kind.storage_type, depth + 1
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            kind, depth = kind.value_type, depth + 1
        else:
            break
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    return numeric and depth >= 2


def _rows_unlike_metadata(where: str, rows: str, declared: int) -> None:
    """A column that holds another number of rows than its file's metadata declares: its footer was damaged
    or forged, and which is right cannot be told."""
    raise DataError(
        f"{where}: {rows} rows, where the file's metadata declares {declared:,}: the file is damaged; "
        "write it again"
    )


def _parquet_scalars(file, column: str, *, where: str) -> np.ndarray:
    """A label or split column as numpy: integers, floats (NaN for nulls) or objects (None for nulls).

    Text is read as a dictionary and refused where decoded it would be more than :data:`LABEL_BYTES_PER_ROW`
    a row: a dictionary of one string of a megabyte, run-length encoded across 20,000 rows, is a few
    kilobytes stored (what :func:`_check_stored_labels` measures) and 20 GB decoded."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = file.read(columns=[column]).column(0)
    if pa.types.is_dictionary(array.type):
        decoded = sum(
            pc.sum(pc.take(pc.binary_length(chunk.dictionary), chunk.indices)).as_py() or 0
            for chunk in array.chunks
        )
        if decoded > len(array) * LABEL_BYTES_PER_ROW + _PARQUET_HEADROOM:
            raise DataError(
                f"{where}: {decoded / 1e6:,.1f} MB for {len(array):,} rows decoded, more than "
                f"{LABEL_BYTES_PER_ROW:,} bytes per row: labels are class names, not texts"
            )
        return array.combine_chunks().dictionary_decode().to_numpy(zero_copy_only=False)
    return array.combine_chunks().to_numpy(zero_copy_only=False)


# A column chunk's own bytes beside its values (page headers, a dictionary's), allowed whatever its rows.
_PARQUET_HEADROOM = 1 << 16


def _check_stored_view(file, column: str, *, where: str) -> None:
    """Refuse, from the metadata, a view column with a row wider than the service serves: a few kilobytes of
    compressed zeros can hold billions of them, all decoded before a row's width is seen."""
    widest = served_view_dim()
    for group, (rows, values, _) in enumerate(_stored_sizes(file, column)):
        if values > rows * widest:  # a null or empty row holds a place too: at most `widest` per row
            raise DataError(
                f"{where} row group {group}: {values:,} numbers for {rows:,} rows, so some row holds more "
                f"than {widest:,}, the widest view the service serves (DBF_MAX_VIEW_DIM, for fit as for the "
                "service)"
            )


def _check_stored_labels(file, column: str, *, where: str) -> None:
    """Refuse, from the metadata, a label or split column of more than :data:`LABEL_BYTES_PER_ROW` a row."""
    for group, (rows, _, size) in enumerate(_stored_sizes(file, column)):
        if size > rows * LABEL_BYTES_PER_ROW + _PARQUET_HEADROOM:
            raise DataError(
                f"{where} row group {group}: {size / 1e6:,.1f} MB for {rows:,} rows decompressed, more than "
                f"{LABEL_BYTES_PER_ROW:,} bytes per row: labels are class names, not texts"
            )


def _refuse_unnamed_split_column(path: Path, file, columns: Sequence[str]) -> None:
    """A text column of split names among ``columns`` (those not named as label, split or view) while no
    ``--split-column`` names it: as a view it could not be read, and beside named views it went unread."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = file.schema_arrow
    for column in dict.fromkeys(columns):
        if len(schema.get_all_field_indices(column)) != 1:  # two of one name: which is meant is asked later
            continue
        kind = schema.field(column).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            continue
        try:  # read as labels are, within their bounds (a dictionary's size checked before it is decoded)
            _check_stored_labels(file, column, where=column)
            as_dictionary = pq.ParquetFile(path, pre_buffer=False, read_dictionary=[column])
            values = _parquet_scalars(as_dictionary, column, where=column)
        except (DataError, OSError, pa.ArrowException):
            continue
        if _split_like(values):
            raise DataError(
                f"{path} column {column!r}: a train/validation/test split, which fit follows only when "
                f"named: pass --split-column {column} (or leave it out of the file to split the samples "
                "stratified)"
            )


def _stored_sizes(file, column: str) -> list[tuple[int, int, int]]:
    """Per row group, from the file's metadata (nothing decoded): its rows, and the values and decompressed
    bytes ``column`` stores there (over its leaves: a list column's numbers, a struct's fields).

    Empty where the metadata's columns cannot be matched to the schema's (not so in any file pyarrow writes).
    """
    schema, metadata = file.schema_arrow, file.metadata
    first = 0
    for field in schema:
        count = _leaf_count(field.type)
        if field.name == column:
            break
        first += count
    else:
        return []
    leaves = range(first, first + count)
    paths = [file.schema.column(i).path for i in leaves if i < metadata.num_columns]
    if len(paths) != count or not all(path.split(".")[0] == column.split(".")[0] for path in paths):
        return []
    sizes = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        chunks = [row_group.column(i) for i in leaves]
        values = max(chunk.num_values for chunk in chunks)
        sizes.append((row_group.num_rows, values, sum(chunk.total_uncompressed_size for chunk in chunks)))
    return sizes


def _leaf_count(kind) -> int:
    """How many Parquet columns an Arrow type is stored in: one per leaf of its nesting."""
    import pyarrow as pa

    if isinstance(kind, pa.ExtensionType):
        kind = kind.storage_type
    if pa.types.is_dictionary(kind):
        return 1
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if hasattr(kind, "value_type"):  # a list of any kind
        return _leaf_count(kind.value_type)
    return 1


# -- the benchmark .mat files --------------------------------------------------------------------------------


def read_registered(name: str | DatasetSpec, data_dir: str | os.PathLike[str]) -> MultiViewData:
    """Read a benchmark dataset's ``.mat`` file from ``data_dir``, checking it against its spec.

    Views come back as float32 ``(N, d_v)`` matrices, whatever orientation the file stores (the axis whose
    length is the number of labels is the sample axis), and labels as 0-based int64. The file's checksum is
    not checked here (:func:`training.download.verify`); its shapes and labels are, then the checks every
    format gets.

    Raises
    ------
    FileNotFoundError
        If the file is absent; the message names it and says how to fetch it.
    ValueError
        If the file is unreadable, lacks ``X`` or the label variable, or its view count, shapes or labels
        differ from the spec; the message names the file.
    """
    import scipy.io
    from scipy.io.matlab import MatReadError

    spec = dataset_spec(name)
    data_dir = Path(data_dir)
    if spec.file_name is None:
        raise ValueError(f"{spec.name} is generated, not read from a file")
    path = data_dir / spec.file_name
    if not path.is_file():
        raise FileNotFoundError(f"{spec.name} data not found at {path}: {_fetch_hint(spec, data_dir)}")
    _check_mat_room(path)
    try:
        contents = scipy.io.loadmat(str(path))
    except NotImplementedError:  # scipy reads MATLAB's formats up to 7; 7.3 is HDF5
        raise DataError(
            f"{path}: a MATLAB 7.3 (HDF5) file, which is not read; save it as version 7 (MATLAB: "
            "save(..., '-v7')), or fetch the benchmark's file again"
        ) from None
    except (MatReadError, ValueError, TypeError, MemoryError) as error:
        raise DataError(f"{path} is not a readable MATLAB file: {error}") from error
    missing = {"X", spec.label_key} - contents.keys()
    if missing:
        present = sorted(key for key in contents if not key.startswith("__"))
        raise DataError(f"{path} lacks variable(s) {sorted(missing)}; it has {present}")

    labels = _integer_labels(contents[spec.label_key], path) - spec.label_offset
    stored_views = contents["X"].reshape(-1)
    if stored_views.size != spec.num_views:
        raise DataError(
            f"{path} holds {stored_views.size} views, expected {spec.num_views} {spec.view_names}"
        )
    views = {
        view: _samples_by_features(matrix, labels.size, spec, path, view)
        for view, matrix in zip(spec.view_names, stored_views, strict=True)
    }
    if spec.keep_first_classes is not None:
        kept = labels < spec.keep_first_classes
        labels = labels[kept]
        views = {view: np.ascontiguousarray(matrix[kept]) for view, matrix in views.items()}

    if spec.num_samples is not None and labels.size != spec.num_samples:
        raise DataError(f"{path} has {labels.size} samples, expected {spec.num_samples}")
    if spec.view_dims is not None:
        for (view, matrix), dims in zip(views.items(), spec.view_dims, strict=True):
            if matrix.shape != (labels.size, dims):
                raise DataError(
                    f"{path}: view {view!r} has shape {matrix.shape}, expected ({labels.size}, {dims})"
                )
    classes = np.unique(labels)
    if not np.array_equal(classes, np.arange(spec.num_classes)):
        raise DataError(
            f"{path}: labels (after subtracting {spec.label_offset}) are {classes.tolist()[:5]}..., "
            f"expected 0..{spec.num_classes - 1} for {spec.num_classes} classes"
        )
    for view in views:
        _check_view_name(view, where=f"{path} view {view!r}")
    return assemble(
        {
            view: Column(features(matrix, where=f"{path} view {view!r}"), f"{path} view {view!r}")
            for view, matrix in views.items()
        },
        Column(labels, f"{path} variable {spec.label_key!r}"),
        classes=spec.class_names,
        name=spec.name,
        source=str(path),
        spec=spec,
    )


_MAT5_COMPRESSED = 15
"""MATLAB 5's ``miCOMPRESSED`` data type: an element that is a zlib stream of another."""


def _mat_expanded_bytes(path: Path, *, limit: int) -> int:
    """What a MATLAB 5 file's elements take once decompressed, counted up to a little past ``limit``.

    scipy's reader decompresses an element into memory whole, so a file of megabytes of compressed zeros
    holds gigabytes (1.6 GB from 1.5 MB): each stream is inflated here a few megabytes at a time and
    thrown away. A file that is not MATLAB 5 (version 4 has no compression) counts its size on disk.
    """
    with path.open("rb") as stream:
        header = stream.read(128)
        if len(header) < 128 or header[126:128] not in (b"IM", b"MI"):
            return path.stat().st_size
        byte_order = "<" if header[126:128] == b"IM" else ">"
        total = 0
        while total <= limit and len(tag := stream.read(8)) == 8:
            data_type, size = struct.unpack(byte_order + "II", tag)
            if data_type >> 16:  # a small element: type, size and up to four bytes of data in 8 bytes
                total += 8
            elif data_type == _MAT5_COMPRESSED:
                total += _inflated_bytes(stream, size, limit=limit - total)
            else:
                total += size
                stream.seek(size + -size % 8, os.SEEK_CUR)
        return total


def _inflated_bytes(stream, size: int, *, limit: int) -> int:
    """The bytes the next ``size`` bytes of ``stream``, a zlib stream, inflate to: counted up to a little
    past ``limit``, holding a few megabytes at a time."""
    inflater = zlib.decompressobj()
    inflated = 0
    while size > 0 and inflated <= limit:
        compressed = stream.read(min(size, _CHUNK_BYTES))
        if not compressed:
            break
        size -= len(compressed)
        while compressed and inflated <= limit:
            try:
                inflated += len(inflater.decompress(compressed, _CHUNK_BYTES))
            except zlib.error:  # scipy's reader words what is wrong with the stream
                return inflated
            compressed = inflater.unconsumed_tail
    return inflated


def _check_mat_room(path: Path) -> None:
    """A :class:`DataError` where the ``.mat`` file at ``path`` decompresses to more than a fit of it
    could hold, before scipy's reader holds it all."""
    memory = available_memory()
    if memory is None:
        return
    limit = int(memory / FIT_BYTES_PER_DATA_BYTE)
    expanded = _mat_expanded_bytes(path, limit=limit)
    if expanded > limit:
        _check_room(
            expanded,
            where=str(path),
            what=f"its variables decompress to more than {limit / 2**30:,.1f} GiB",
            instead="fetch the benchmark's file again, or check where this one came from",
        )


def _fetch_hint(spec: DatasetSpec, data_dir: Path) -> str:
    if spec.downloadable:
        return "fetch it with `" + DOWNLOAD_COMMAND.format(data_dir=data_dir) + "`"
    return "it has no public source configured: obtain the file yourself and place it there"


def _samples_by_features(
    matrix: object, num_labels: int, spec: DatasetSpec, path: Path, view: str
) -> np.ndarray:
    """One stored view as a float32 ``(N, d)`` matrix, transposing a ``d x N`` one."""
    import scipy.sparse

    # Some multi-view .mat collections store sparse views; densify them rather than reject the file, where
    # the dense matrix fits: a sparse matrix of a few kilobytes can declare terabytes.
    if scipy.sparse.issparse(matrix):
        rows, columns = matrix.shape
        dense = rows * columns * 8
        _check_room(
            dense,
            where=f"{path} view {view!r}",
            what=f"a sparse matrix of {rows:,} x {columns:,} makes {dense / 2**30:,.1f} GiB dense",
            instead="fetch the benchmark's file again, or check where this one came from",
        )
    array = matrix.toarray() if scipy.sparse.issparse(matrix) else np.asarray(matrix)
    if array.ndim != 2:
        raise DataError(f"{path}: view {view!r} is not a matrix (shape {array.shape})")
    rows_are_samples = array.shape[0] == num_labels
    columns_are_samples = array.shape[1] == num_labels
    if rows_are_samples and columns_are_samples:
        transpose = spec.stored_transposed
    elif rows_are_samples or columns_are_samples:
        transpose = columns_are_samples
    else:
        raise DataError(
            f"{path}: view {view!r} has shape {array.shape}; neither axis matches the {num_labels} labels"
        )
    return np.ascontiguousarray(array.T if transpose else array, dtype=np.float32)


def _integer_labels(stored: np.ndarray, path: Path) -> np.ndarray:
    labels = np.asarray(stored).reshape(-1)
    as_int = labels.astype(np.int64)
    if not np.array_equal(as_int, labels):
        raise DataError(f"{path}: labels are not integers")
    return as_int


# -- the checks every format goes through --------------------------------------------------------------------


def features(values: np.ndarray, *, where: str) -> np.ndarray:
    """A view's ``(N, d)`` numbers as a checked float32 matrix, converted a few megabytes at a time.

    An array that is float32 and in memory already is checked in place, not copied.

    Raises
    ------
    DataError
        Width 0, an infinite value (or one beyond float32's range), or a row partly NaN, naming ``where``,
        the row and the column; a column that float32 rounding would flatten (:class:`_Rounding`).
    """
    if values.ndim != 2:
        raise DataError(f"{where}: shape {values.shape}; a view is a matrix (N, d)")
    n, d = values.shape
    if d == 0:
        raise DataError(f"{where}: width 0 (every sample needs at least one feature)")
    if n == 0:
        raise DataError(f"{where}: no rows (a view needs its samples)")
    _check_width(d, where=where)
    in_memory = isinstance(values, np.ndarray) and not isinstance(values, np.memmap)
    if in_memory and values.dtype == np.float32 and values.flags.c_contiguous:
        out = values
    else:
        out = _dense(n, d, where=where)
    # float16, and integers of up to 16 bits, are float32 numbers already.
    rounding = None if np.can_cast(values.dtype, np.float32) else _Rounding()
    step = _chunk_rows(d)
    for start in range(0, n, step):
        block = out[start : start + step]
        if out is not values:
            with np.errstate(over="ignore", invalid="ignore"):  # beyond float32's range: inf, reported below
                block[...] = values[start : start + step]
        _check_block(block, where=where, offset=start)
        if rounding is not None:  # a memory map's pages just read: the second reading is in memory
            rounding.add(values[start : start + step], block)
    if rounding is not None:
        rounding.check(where)
    _check_varies(out, where=where)
    return out


def _check_varies(view: np.ndarray, *, where: str) -> None:
    """A :class:`DataError` for a view whose every feature is the same in every sample that has it: its head
    could learn nothing, and its one opinion, differing between the fold models and the served one, would
    move every sample's conflict at once (the flag raised half of the clean test samples, against 5%).

    And for a column whose range float32 cannot scale by (:func:`_check_spans`)."""
    with np.errstate(invalid="ignore"):
        highest, lowest = np.fmax.reduce(view, axis=0), np.fmin.reduce(view, axis=0)
    if view.shape[0] and (highest == lowest).all():
        raise DataError(
            f"{where}: every feature has one value in every sample (a constant view): there is nothing to "
            "learn from it; leave it out (--views) or check how the file was written"
        )
    _check_spans(lowest, highest, where=where)


_FLOAT32 = np.finfo(np.float32)


def _check_spans(lowest: np.ndarray, highest: np.ndarray, *, where: str) -> None:
    """A :class:`DataError` for a column whose range the served graph cannot scale by.

    The graph scales in float32, ``(x - minimum) * (1 / span)``: a span beyond float32's largest number
    (``-3e38`` to ``3e38``) is infinite there, and one below its smallest normal number (values of ``1e-40``)
    has an infinite reciprocal. Either made NaN evidence, which fit found only once everything was trained,
    comparing the graph with its head. Measured on every sample: the training split's range is no wider."""
    span = highest.astype(np.float64) - lowest
    wide, narrow = span > _FLOAT32.max, (span > 0) & (span < _FLOAT32.tiny)
    if not (wide | narrow).any():
        return
    column = int(np.argmax(wide | narrow))
    low, high, by = float(lowest[column]), float(highest[column]), float(span[column])
    if wide[column]:
        what = f"spread over {by:.3g}, more than float32's largest number ({float(_FLOAT32.max):.3g})"
    else:
        what = f"spread by only {by:.3g}, less than float32's smallest normal ({float(_FLOAT32.tiny):.3g})"
    scale = f"{'divide' if wide[column] else 'multiply'} it by 1e{abs(int(np.floor(np.log10(by))))}"
    raise DataError(
        f"{where} column {column}: values from {low:.3g} to {high:.3g} are {what}, the type the model scales "
        f"features in: {scale} (in float64) before fitting, and the same column of every request"
    )


class _Rounding:
    """What float32, the model's and the service's type, makes of a view's columns, gathered block by block.

    ``1e9 + x`` for a signal ``x`` of about 3 is 1e9 in float32, whose neighbouring numbers there are 64
    apart: the column turns constant and its head learns nothing from it. A column is refused where the
    rounding (``x - float32(x)``) varies by more than a tenth of the column's standard deviation. Both are
    summed in float64, ``x`` shifted by its first row, so that the spread is kept beside the magnitude.
    """

    # A spread this small beside the magnitude is float64's own rounding noise (0.1 * 3 against 0.3), not a
    # feature: the column is constant.
    _CONSTANT = 1e-12
    # float64 values summed at a time: a few passes over a piece this size stay in the processor's cache,
    # where over a whole block (8 MB) they took twice as long.
    _PIECE = 1 << 15

    def __init__(self) -> None:
        self.count = 0
        self.shift: np.ndarray | None = None
        self.sums: np.ndarray | None = None  # per column: x, x^2 (shifted), rounding, rounding^2

    def add(self, values: np.ndarray, converted: np.ndarray) -> None:
        """``(rows, d)`` values as read (any numeric dtype) and as float32; rows of NaN (a missing view) are
        passed over."""
        present = ~np.isnan(converted[:, 0])
        if not present.all():
            values, converted = values[present], converted[present]
        if not len(values):
            return
        if self.shift is None:
            self.shift = np.asarray(values[0], dtype=np.float64)
            self.sums = np.zeros((4, values.shape[1]))
        rows = max(1, self._PIECE // values.shape[1])
        for start in range(0, len(values), rows):
            x = np.asarray(values[start : start + rows], dtype=np.float64)
            for k, part in ((0, x - self.shift), (2, x - converted[start : start + rows])):
                self.sums[k] += part.sum(axis=0)
                self.sums[k + 1] += np.square(part, out=part).sum(axis=0)
        self.count += len(values)

    def check(self, where: str) -> None:
        """Raise :class:`DataError` naming the first column float32 flattens, and how to keep it."""
        if not self.count:
            return
        mean = self.sums[[0, 2]] / self.count
        spread, rounding = np.sqrt(np.maximum(self.sums[[1, 3]] / self.count - mean**2, 0.0))
        center = self.shift + mean[0]
        flattened = (rounding > 0.1 * spread) & (spread > self._CONSTANT * np.abs(center))
        if not flattened.any():
            return
        columns = np.flatnonzero(flattened)
        column = int(columns[0])
        around, by = center[column], spread[column]
        gap = float(np.spacing(np.float32(abs(around))))
        more = f"; and {columns.size - 1} more columns alike" if columns.size > 1 else ""
        raise DataError(
            f"{where} column {column}: values around {around:.6g} spread by only {by:.3g} (standard "
            f"deviation{more}); float32, which the model computes in and the service takes, cannot hold that "
            f"(its neighbouring values there are {gap:.3g} apart): subtract an offset (e.g. the column's "
            f"mean, {around:.6g}) before fitting, and the same from every request"
        )


def _check_block(block: np.ndarray, *, where: str, offset: int) -> None:
    if np.isfinite(block).all():
        return
    nan = np.isnan(block)
    per_row = nan.sum(axis=1)
    partial = (per_row > 0) & (per_row < block.shape[1])
    if partial.any():
        row = int(np.argmax(partial))
        column = int(np.argmax(nan[row]))
        raise DataError(
            f"{where} row {offset + row}: NaN in column {column} among numbers; a missing view is a row "
            "of NaN (or a null), not a partial one: fill in the missing numbers (e.g. each column's mean "
            "over the training samples), or blank the whole row"
        )
    infinite = np.isinf(block)
    if infinite.any():
        row, column = (int(i) for i in np.argwhere(infinite)[0])
        raise DataError(
            f"{where} row {offset + row}, column {column}: infinite value (or one beyond float32's range)"
        )


def _check_views(names: Sequence[str], source: Path, *, where: Callable[[str], str]) -> None:
    """At most :data:`MAX_VIEWS` views, each once and named as the API takes it; ``where(name)`` says where
    it is."""
    if len(names) > MAX_VIEWS:
        shown = ", ".join(names[:5])
        raise DataError(
            f"{source}: {len(names)} views ({shown}, ...); fit takes at most {MAX_VIEWS}: pick some with "
            "--views, or keep each view's features together (one (N, d) .npy matrix, or one Parquet column "
            "of lists of numbers, per view: a plain numeric column is a view of one feature)"
        )
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # a file's views are named once each: the names are --views'
        raise DataError(f"{source}: --views names {twice!r} twice; name each view once")
    for name in names:
        _check_view_name(name, where=where(name))
    first: dict[str, str] = {}
    for name in names:
        other = first.setdefault(name.casefold(), name)
        if other != name:  # <view>.onnx: one file where case does not count (macOS, Windows)
            raise DataError(
                f"{source}: views {other!r} and {name!r} differ only in case, and their model files would "
                "be one on file systems that ignore case (macOS, Windows); rename one, or leave one out "
                "(--views)"
            )


def _check_view_name(name: str, *, where: str) -> None:
    if not re.fullmatch(NAME_PATTERN.strip("^$"), name):
        raise DataError(
            f"{where}: {name!r} is not a valid view name for the API (letters, digits, '_', '.' and '-', "
            "starting with a letter or digit); rename the file or column"
        )
    if len(name) > MAX_VIEW_NAME:  # found out once the model is written, it would cost the training
        raise DataError(
            f"{where}: {name!r} is too long for a view name ({len(name)} characters): the model's file for "
            f"it is <view>.onnx, so a view name is at most {MAX_VIEW_NAME} characters; rename the file or "
            "column"
        )


def _regular_file(path: Path, *, directory: Path | None = None) -> Path:
    """``path`` if it is a regular file, checked before anything opens it (opening a FIFO waits for a writer).

    With ``directory`` (the data directory holding ``path``), a symbolic link must stay inside it: a link out
    would read, and quote in messages, a file that is not the data's.

    Raises
    ------
    DataError
        Naming the file and what it is (a link out, a FIFO, a device, a directory), never what it holds.
    """
    if directory is not None and path.is_symlink():
        try:
            inside = path.resolve(strict=True).is_relative_to(directory.resolve(strict=True))
        except (OSError, RuntimeError):  # a dangling link, or a loop: not "out of" the directory
            raise DataError(
                f"{path}: a symbolic link that leads to no file (to one that is absent, or round a loop)"
            ) from None
        if not inside:
            raise DataError(
                f"{path}: a symbolic link out of {directory}; fit reads only the data directory's own files "
                "(copy the file in)"
            )
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({_reason(error)})") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"{path}: {_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')}, not a regular file")
    return path


def _reason(error: BaseException) -> str:
    """Why reading a file failed, in words that quote nothing of what it holds."""
    if isinstance(error, UnicodeDecodeError):
        return f"byte {error.start} is not UTF-8"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return "it ends too early"


def _check_rows(views: dict[str, Column], labels: Column) -> None:
    count = len(labels.values)
    for column in views.values():
        rows = column.values.shape[0]
        if rows != count:
            header = ""
            if isinstance(labels.values, list) and count == rows + 1:  # pandas' to_csv writes a header
                header = (
                    f"; is its line 1 ({labels.values[0][:40]!r}) a header? it holds the labels alone, one a "
                    "line (pandas: to_csv(path, index=False, header=False))"
                )
            raise DataError(f"{column.where} has {rows} rows but {labels.where} has {count} labels{header}")


def assemble(
    views: dict[str, Column],
    labels: Column,
    *,
    classes: Sequence[str] | None,
    name: str,
    source: str,
    split: Column | None = None,
    spec: DatasetSpec | None = None,
) -> MultiViewData:
    """The checks every reader ends with, and the :class:`MultiViewData` they make.

    Parameters
    ----------
    views : dict of str to Column
        Per view (in order), its float32 ``(N, d)`` matrix from :func:`features`, and where it came from.
    labels : Column
        Raw labels: integers, integral floats or strings; NaN or None where missing.
    classes : sequence of str, optional
        Class names in label order: integer labels index them, string labels must be among them.
    split : Column, optional
        ``train`` / ``validation`` / ``test`` per sample.

    Raises
    ------
    DataError
        Fewer than two views, row counts that differ, a sample without any view, a view missing everywhere,
        missing or mixed labels, a single class, unknown split values: naming file, view and row.
    """
    if len(views) < 2:
        raise DataError(
            f"{source}: DBF fuses two or more views; found {len(views)} ({', '.join(views) or 'none'})"
        )
    _check_rows(views, labels)
    if split is not None and len(split.values) != len(labels.values):
        raise DataError(
            f"{split.where} has {len(split.values)} rows but {labels.where} has {len(labels.values)} labels"
        )
    matrices = {view: column.values for view, column in views.items()}
    present = np.stack([~np.isnan(matrix[:, 0]) for matrix in matrices.values()], axis=1)
    if present.size and not present.any(axis=1).all():
        empty = np.flatnonzero(~present.any(axis=1))
        more = f" (and {empty.size - 1} more)" if empty.size > 1 else ""
        raise DataError(f"{source} row {int(empty[0])}{more}: no view at all (every view is missing)")
    for (view, column), has in zip(views.items(), present.T, strict=True):
        if not has.any():
            raise DataError(f"{column.where}: view {view!r} is missing in every sample")
    codes, class_names = _class_labels(labels, classes)
    return MultiViewData(
        views=matrices,
        labels=codes,
        class_names=class_names,
        name=name,
        spec=spec,
        split=None if split is None else _split_codes(split),
        source=source,
    )


def _class_labels(labels: Column, classes: Sequence[str] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Labels as class indices ``0 .. K-1`` and the class names (module notes)."""
    values = _typed(labels)
    if values.dtype == _TEXT:
        # UTF-16 text read as UTF-8 (no byte order mark) has a NUL beside every letter, and numpy's text
        # compares strings that hold one as equal: '\0c\0a\0t' and '\0d\0o\0g' made one class.
        nul = next((row for row, value in enumerate(values.tolist()) if "\x00" in value), None)
        if nul is not None:
            raise DataError(
                f"{labels.at(nul)}: label {str(values[nul])[:40]!a} holds a NUL character (text saved as "
                "UTF-16?); labels are text without NULs: save them as UTF-8"
            )
    if values.dtype == _TEXT:  # what pandas and spreadsheets write for a missing label, not a class
        blank = np.strings.strip(values) == ""
        if blank.any():
            row = int(np.argmax(blank))
            raise DataError(
                f"{labels.at(row)}: label missing ({str(values[row])!r}, a blank string); every "
                "sample needs a label: fill it in, or leave the sample out"
            )
    if classes is not None:
        classes = tuple(str(c) for c in classes)
        if not classes:  # `--classes ,`: else "0 class names" for labels to index, or to be among
            raise DataError("--classes names no class (it takes comma-separated class names in label order)")
        if len(set(classes)) != len(classes):  # classes.txt is checked as it is read, naming its lines
            duplicate = next(c for c in classes if classes.count(c) > 1)
            raise DataError(f"--classes names {duplicate!r} twice; class names are distinct")
    if values.dtype.kind in "iu":
        unique, inverse = np.unique(values, return_inverse=True)
        written = [str(value) for value in unique.tolist()]
        if classes is None:
            codes, classes = inverse, tuple(written)
        elif set(written) <= set(classes):
            # The names are the labels' own values (0, 1, 2 listed as 2, 0, 1): each label is its class by
            # name. Indexing would name a sample labelled 0 "2", a model answering every class as another.
            index = {name: k for k, name in enumerate(classes)}
            codes = np.array([index[name] for name in written], dtype=np.int64)[inverse]
        else:
            outside = (values < 0) | (values >= len(classes))
            if outside.any():
                row = int(np.argmax(outside))
                raise DataError(
                    f"{labels.at(row)}: label {int(values[row])}, but {len(classes)} class names are "
                    f"given (integer labels index them: 0 .. {len(classes) - 1})"
                )
            codes = values.astype(np.int64)
    else:
        if classes is None:
            unique, codes = np.unique(values, return_inverse=True)
            classes = tuple(unique.tolist())
            _check_written_once(classes, values, labels=labels)
        else:
            index = {name: k for k, name in enumerate(classes)}
            codes = np.empty(values.size, dtype=np.int64)
            for row, value in enumerate(values.tolist()):
                if value not in index:
                    raise DataError(
                        f"{labels.at(row)}: label {value!r} is not among the class names given "
                        f"({', '.join(classes[:10])}{', ...' if len(classes) > 10 else ''})"
                    )
                codes[row] = index[value]
    longest = max(classes, key=len)
    # Found out when the model is written (its manifest refuses it), it would cost the training.
    if len(longest) > MAX_CLASS_NAME_LENGTH:
        raise DataError(
            f"{labels.where}: class {longest[:40]!r}... is {len(longest):,} characters long; a class name is "
            f"at most {MAX_CLASS_NAME_LENGTH:,} (every answer carries it): labels are class names, not texts"
        )
    unused = np.flatnonzero(np.bincount(codes, minlength=len(classes)) == 0)
    if unused.size:  # else refused later as a class of 0 samples, not naming the list that holds it
        more = f" (and {unused.size - 1} more)" if unused.size > 1 else ""
        raise DataError(
            f"{labels.where}: no sample of class {classes[int(unused[0])]!r}{more}, which the class names "
            "given (classes.txt or --classes) list: a model cannot learn a class from no samples; leave it "
            "out of them"
        )
    if len(np.unique(codes)) < 2:
        only = classes[int(codes[0])] if codes.size else "none"
        raise DataError(f"{labels.where}: a single class ({only!r}); a classifier needs two or more")
    return np.asarray(codes, dtype=np.int64).reshape(-1), tuple(classes)


def _check_written_once(classes: Sequence[str], values: np.ndarray, *, labels: Column) -> None:
    """A :class:`DataError` for two labels that differ only in surrounding whitespace or in Unicode form
    (``café`` composed and decomposed print alike): one class written two ways would be split in two."""
    seen: dict[str, str] = {}
    for name in classes:
        key = unicodedata.normalize("NFC", name).strip()
        if key in seen:
            first = seen[key]
            rows = [int(np.argmax(values == label)) for label in (first, name)]
            raise DataError(
                f"{labels.at(*rows)}: labels {first!a} and {name!a} differ only in "
                "surrounding whitespace or Unicode form, and would be two classes; write each class one "
                "way (strip the labels, and normalise them to NFC)"
            )
        seen[key] = name


def _typed(labels: Column) -> np.ndarray:
    """Raw labels as one int64 (uint64 beyond it) or text (:data:`_TEXT`) array; missing, mixed or fractional
    labels are errors naming a row."""
    where = labels.where
    values = labels.values
    if isinstance(values, list):  # text lines: integers if every line is one, written as Python writes it
        # '7' and '07', '1' and '+1' are two labels, '007' a name: as integers they would merge or change.
        numbers = [int(line) for line in values if len(line) <= 20 and _INTEGER.fullmatch(line)]
        if len(numbers) == len(values) and all(
            str(number) == line and _INT64.min <= number <= _INT64.max
            for number, line in zip(numbers, values, strict=True)
        ):
            return np.array(numbers, dtype=np.int64)
        return np.array(values, dtype=_TEXT)
    values = np.asarray(values).reshape(-1)
    kind = values.dtype.kind
    if kind == "u" and values.size and values.max() > _INT64.max:
        return values  # uint64 beyond int64: kept, so that 2**64 - 1 stays its own class, not -1
    if kind in "iu":
        return values.astype(np.int64)
    if kind == "b":
        return values.astype(_TEXT)
    if kind == "f":
        missing = np.isnan(values)
        if missing.any():
            raise DataError(f"{where} row {int(np.argmax(missing))}: label missing (NaN or null)")
        fractional = values != np.round(values)
        if fractional.any():
            row = int(np.argmax(fractional))
            raise DataError(
                f"{where} row {row}: label {values[row].item()!r} is not a class (labels are integers or "
                "strings)"
            )
        # float64's bound, not the labels' type's: float16's overflows (a RuntimeWarning on fit's stderr).
        inexact = np.abs(values) > np.float64(_EXACT_FLOAT)
        if inexact.any():  # beyond 2**53 neighbouring floats differ by 2 or more: not the integers meant
            row = int(np.argmax(inexact))
            raise DataError(
                f"{where} row {row}: label {values[row].item()!r} is too large to be an exact integer in "
                "floating point; save the labels as integers or strings"
            )
        return values.astype(np.int64)
    if kind in "UT":  # T: StringDType, the labels of a .npy file of bytes, decoded
        if kind == "U":  # numpy casts big-endian text ('>U', a big-endian machine's np.save) as code points
            values = values.astype(values.dtype.newbyteorder("="))  # byte-swapped, refused as invalid
        return values.astype(_TEXT)
    if kind != "O":
        raise DataError(f"{where}: labels of dtype {values.dtype}; labels are integers or strings")
    kinds: dict[str, int] = {}
    for row, value in enumerate(values.tolist()):
        if value is None or (isinstance(value, float) and np.isnan(value)):
            raise DataError(f"{where} row {row}: label missing (None, NaN or null)")
        if isinstance(value, str):
            kinds.setdefault("string", row)
        elif isinstance(value, bytes):  # a Parquet binary column, what pandas writes for labels of bytes
            kinds.setdefault("bytes", row)
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            kinds.setdefault("integer", row)
        else:
            # A list or array per row: Keras' to_categorical, or several labels a sample
            one_hot = " (one-hot rows? save their argmax)" if isinstance(value, (list, np.ndarray)) else ""
            raise DataError(
                f"{where} row {row}: label {value!r} of type {type(value).__name__}; "
                f"labels are integers or strings{one_hot}"
            )
    if len(kinds) > 1:
        rows = ", ".join(f"row {row} is {kind}" for kind, row in kinds.items())
        raise DataError(f"{where}: labels of mixed types ({rows}); use integers or strings throughout")
    if "integer" in kinds:
        beyond = [row for row, value in enumerate(values.tolist()) if not _INT64.min <= value <= _INT64.max]
        if beyond:
            raise DataError(
                f"{where} row {beyond[0]}: label {values[beyond[0]]} is beyond 64-bit integers; save the "
                "labels as strings"
            )
        return values.astype(np.int64)
    if "bytes" in kinds:  # as a .npy file's byte strings are: UTF-8 text
        text = []
        for row, value in enumerate(values.tolist()):
            try:
                text.append(value.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise DataError(f"{where} row {row}: {_reason(error)}; save text as UTF-8") from None
        return np.array(text, dtype=_TEXT)
    return values.astype(_TEXT)


def _split_codes(split: Column) -> np.ndarray:
    values = split.values if isinstance(split.values, list) else np.asarray(split.values).reshape(-1).tolist()
    codes = np.empty(len(values), dtype=np.int8)
    for row, value in enumerate(values):
        code = _SPLIT_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
        if code is None:
            raise DataError(f"{split.at(row)}: split {value!r}; expected one of {', '.join(SPLIT_NAMES)}")
        codes[row] = code
    return codes
