"""The DBF paper's multi-view benchmark datasets: registry, loading, download, splits, scaling, conflicts.

The datasets are those of Bezirganyan et al., AISTATS 2025, appendix "Details about the datasets"; the files,
their orientation, label keys and SHA-256 digests are described in ``shared/data/README.md``. A loaded dataset
is a :class:`MultiViewData`: one float32 ``(N, d_v)`` matrix per view, in the file's view order, and int64
labels ``0 .. K-1``.

The evaluation protocol of the paper (section 4) also needs a *conflictive* copy of the test set, where one
random view of each sample is replaced by that view of a sample of class ``(y + 1) mod K``:
:func:`make_conflictive`.

Examples
--------
>>> data = synthetic(60, num_classes=3, seed=0)
>>> train, val, test = stratified_split(data.labels, seed=0)
>>> scaler = MinMaxScaler.fit(data.take(train).views)
>>> scaled = scaler.transform(data.views)
>>> conflictive, replaced = make_conflictive(
...     {name: x[test] for name, x in scaled.items()}, data.labels[test], rng=np.random.default_rng(0)
... )
>>> len(train), len(val), len(test), replaced.shape
(42, 6, 12, (12,))
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np
import scipy.io
import scipy.sparse
from scipy.io.matlab import MatReadError

__all__ = [
    # the registry
    "DATASETS",
    "DatasetSpec",
    "dataset_spec",
    # loading and fetching
    "MultiViewData",
    "load",
    "synthetic",
    "ChecksumError",
    "DownloadError",
    "file_sha256",
    "verify",
    "download",
    # the evaluation protocol
    "stratified_split",
    "MinMaxScaler",
    "ConflictSource",
    "make_conflictive",
]

_log = logging.getLogger(__name__)

DOWNLOAD_COMMAND = "python -m training download --data-dir {data_dir}"

# ``HEAD`` is the repository's default branch on raw.githubusercontent.com, whatever it is called; the SHA-256
# check, not the branch, is what guarantees the bytes.
_DBF_REPOSITORY = "https://raw.githubusercontent.com/bezirganyan/DBF_uncertainty/HEAD/data/"
_PROIMP_REPOSITORY = "https://raw.githubusercontent.com/XLearning-SCU/2023-IJCAI-ProImp/HEAD/data/"


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """What is known about one multi-view dataset file, before reading it.

    Parameters
    ----------
    name : str
        Registry key, e.g. ``"handwritten"``.
    file_name : str or None
        The ``.mat`` file inside the data directory; None for generated data.
    label_key : str or None
        The variable of the ``.mat`` file holding the labels (``X`` holds the views); None for generated data.
    view_names : tuple of str
        Names of the views in file order.
    class_names : tuple of str
        Names of the classes in label order (index ``k`` names label ``k`` after the offset).
    stored_transposed : bool
        Whether the file stores views as ``dims x samples``. The loader detects the orientation from the
        number of labels; this only decides for a square view (``N == d``).
    label_offset : int
        Subtracted from the stored labels to make them 0-based (1 where labels start at 1).
    num_samples : int or None
        Expected N after loading (and after ``keep_first_classes``); None where unknown.
    view_dims : tuple of int, or None
        Expected ``d_v`` per view; None where unknown.
    keep_first_classes : int or None
        Keep only the samples of the first this many classes (after the offset), as the paper does for
        Caltech101; None keeps all.
    sha256 : str or None
        Hex SHA-256 of the file; None where no digest is known (the file is then never downloaded).
    url : str or None
        Public download URL; None where no public source is configured.
    licence : str
        The data's licence, as stated by the paper.
    """

    name: str
    file_name: str | None
    label_key: str | None
    view_names: tuple[str, ...]
    class_names: tuple[str, ...]
    stored_transposed: bool = False
    label_offset: int = 0
    num_samples: int | None = None
    view_dims: tuple[int, ...] | None = None
    keep_first_classes: int | None = None
    sha256: str | None = None
    url: str | None = None
    licence: str = "unknown"

    def __post_init__(self) -> None:
        if self.view_dims is not None and len(self.view_dims) != len(self.view_names):
            raise ValueError(f"{self.name}: {len(self.view_dims)} view dims for {len(self.view_names)} views")
        if self.keep_first_classes is not None and self.keep_first_classes != len(self.class_names):
            raise ValueError(
                f"{self.name}: keeps {self.keep_first_classes} classes but names {len(self.class_names)}"
            )

    @property
    def num_views(self) -> int:
        return len(self.view_names)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def downloadable(self) -> bool:
        """Whether :func:`download` can fetch the file unaided: a public URL and a digest to check it."""
        return self.url is not None and self.sha256 is not None


def _numbered(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}_{k:02d}" for k in range(1, count + 1))


_SPECS = (
    DatasetSpec(
        name="handwritten",
        file_name="handwritten.mat",
        label_key="Y",
        # UCI "Multiple Features": pixel averages, Fourier, profile correlations, Zernike, Karhunen-Loeve,
        # morphological.
        view_names=("pix", "fou", "fac", "zer", "kar", "mor"),
        class_names=tuple(str(digit) for digit in range(10)),
        num_samples=2000,
        view_dims=(240, 76, 216, 47, 64, 6),
        sha256="8a9ad81f11c05fd7f07f1369bcbbaefc3d391bad10d3aa32366bd47d608eb05d",
        url=_DBF_REPOSITORY + "handwritten.mat",
        licence="CC BY 4.0",
    ),
    DatasetSpec(
        name="scene15",
        file_name="scene15_mtv.mat",
        label_key="gt",
        view_names=("gist", "phog", "lbp"),
        # The conventional folder order of the 15-scene data set (Lazebnik et al., 2006): its folders sorted
        # byte-wise, so the prefixed CALsuburb, MIT* and PARoffice precede the lower-case folders. The
        # per-label sample counts of the file (241, 360, 328, ...) match these categories' image counts one to
        # one, and match no other order.
        class_names=(
            "suburb",
            "coast",
            "forest",
            "highway",
            "insidecity",
            "mountain",
            "opencountry",
            "street",
            "tallbuilding",
            "office",
            "bedroom",
            "industrial",
            "kitchen",
            "livingroom",
            "store",
        ),
        stored_transposed=True,
        label_offset=1,
        num_samples=4485,
        view_dims=(20, 59, 40),
        sha256="52a71c6c675d5b0c1e07189778716bc52b972b17b58d8156c01422bcce2e4442",
        url=_DBF_REPOSITORY + "scene15_mtv.mat",
        licence="CC BY 4.0",
    ),
    DatasetSpec(
        name="pie",
        file_name="PIE_face_10.mat",
        label_key="gt",
        view_names=("intensity", "lbp", "gabor"),
        class_names=_numbered("subject", 68),
        stored_transposed=True,
        label_offset=1,
        num_samples=680,
        view_dims=(484, 256, 279),
        sha256="7b7f5b73b140c9e00d6d9a4ed78e0292b298bd12fbcfb2c96125795c7f8150f8",
        url=_DBF_REPOSITORY + "PIE_face_10.mat",
        licence="non-commercial research only",
    ),
    DatasetSpec(
        name="cub",
        file_name="cub_googlenet_doc2vec_c10.mat",
        label_key="gt",
        # GoogLeNet image features and doc2vec features of the birds' text descriptions.
        view_names=("image", "text"),
        # The first 10 of CUB-200-2011's classes, in its class-id order.
        class_names=(
            "Black_footed_Albatross",
            "Laysan_Albatross",
            "Sooty_Albatross",
            "Groove_billed_Ani",
            "Crested_Auklet",
            "Least_Auklet",
            "Parakeet_Auklet",
            "Rhinoceros_Auklet",
            "Brewer_Blackbird",
            "Red_winged_Blackbird",
        ),
        label_offset=1,
        num_samples=600,
        view_dims=(1024, 300),
        sha256="3ab7dc9917c520e6931fa3338cb9c6e8b2f6a4050ca8a25c97360e87d7bbfc3a",
        url=_PROIMP_REPOSITORY + "cub_googlenet_doc2vec_c10.mat",
        licence="research data",
    ),
    DatasetSpec(
        name="caltech101",
        file_name="2view-caltech101-8677sample.mat",
        label_key="gt",
        view_names=("decaf", "vgg19"),
        # The paper (like the authors' code) keeps the first 10 of the file's 101 classes; their names are not
        # recorded with the features, hence generic ones.
        class_names=_numbered("class", 10),
        stored_transposed=True,
        label_offset=1,
        keep_first_classes=10,
        # Not shipped: too large. Neither the sample count after the class selection, the view dims, a digest
        # nor a public source is known, so those checks are skipped and download refuses it.
        licence="CC BY 4.0",
    ),
)

DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
"""The registry of benchmark datasets by name, in the paper's order of appearance."""


def dataset_spec(name: str | DatasetSpec) -> DatasetSpec:
    """The registered spec called ``name`` (a spec is returned as is).

    Raises
    ------
    KeyError
        For an unknown name; the message lists the known ones.
    """
    if isinstance(name, DatasetSpec):
        return name
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None


@dataclass(frozen=True, eq=False)
class MultiViewData:
    """A multi-view dataset in memory: aligned per-view feature matrices and class labels.

    Parameters
    ----------
    views : dict of str to ndarray
        One ``(N, d_v)`` matrix per view, keyed and ordered as ``spec.view_names``; row ``i`` of every view
        describes sample ``i``.
    labels : ndarray of int64, shape (N,)
        Class indices ``0 .. K-1``.
    spec : DatasetSpec
        What the data is.
    """

    views: dict[str, np.ndarray]
    labels: np.ndarray
    spec: DatasetSpec = field(repr=False)

    def __post_init__(self) -> None:
        if tuple(self.views) != self.spec.view_names:
            raise ValueError(f"{self.spec.name}: views {tuple(self.views)} != spec's {self.spec.view_names}")
        if self.labels.ndim != 1:
            raise ValueError(f"{self.spec.name}: labels must be 1-D, got shape {self.labels.shape}")
        for name, matrix in self.views.items():
            if matrix.ndim != 2 or matrix.shape[0] != self.labels.shape[0]:
                raise ValueError(
                    f"{self.spec.name}: view {name!r} has shape {matrix.shape}, expected "
                    f"({self.labels.shape[0]}, d) to match the labels"
                )

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    @property
    def view_dims(self) -> tuple[int, ...]:
        return tuple(int(matrix.shape[1]) for matrix in self.views.values())

    def take(self, indices: np.ndarray) -> MultiViewData:
        """The samples at ``indices`` (shape (M,)), in that order, as a new dataset with the same spec."""
        return MultiViewData(
            views={name: matrix[indices] for name, matrix in self.views.items()},
            labels=self.labels[indices],
            spec=self.spec,
        )


def _fetch_hint(spec: DatasetSpec, data_dir: Path) -> str:
    if spec.downloadable:
        return "fetch it with `" + DOWNLOAD_COMMAND.format(data_dir=data_dir) + "`"
    return "it has no public source configured: obtain the file yourself and place it there"


def _samples_by_features(
    matrix: object, num_labels: int, spec: DatasetSpec, path: Path, view: str
) -> np.ndarray:
    """One stored view as a float32 ``(N, d)`` matrix, transposing a ``d x N`` one."""
    # Some multi-view .mat collections store sparse views; densify them rather than reject the file.
    array = matrix.toarray() if scipy.sparse.issparse(matrix) else np.asarray(matrix)
    if array.ndim != 2:
        raise ValueError(f"{path}: view {view!r} is not a matrix (shape {array.shape})")
    rows_are_samples = array.shape[0] == num_labels
    columns_are_samples = array.shape[1] == num_labels
    if rows_are_samples and columns_are_samples:
        transpose = spec.stored_transposed
    elif rows_are_samples or columns_are_samples:
        transpose = columns_are_samples
    else:
        raise ValueError(
            f"{path}: view {view!r} has shape {array.shape}; neither axis matches the {num_labels} labels"
        )
    return np.ascontiguousarray(array.T if transpose else array, dtype=np.float32)


def _integer_labels(stored: np.ndarray, path: Path) -> np.ndarray:
    labels = np.asarray(stored).reshape(-1)
    as_int = labels.astype(np.int64)
    if not np.array_equal(as_int, labels):
        raise ValueError(f"{path}: labels are not integers")
    return as_int


def load(name: str | DatasetSpec, data_dir: str | os.PathLike[str]) -> MultiViewData:
    """Read a benchmark dataset from ``data_dir``, checking it against its spec.

    Views come back as float32 ``(N, d_v)`` matrices, whatever orientation the file stores (the axis whose
    length is the number of labels is the sample axis), and labels as 0-based int64. The file's checksum is
    not checked here (see :func:`verify`); its shapes and labels are.

    Parameters
    ----------
    name : str or DatasetSpec
        A key of :data:`DATASETS`, or a spec for a file of the same layout.
    data_dir : path
        Directory holding the ``.mat`` file.

    Returns
    -------
    MultiViewData

    Raises
    ------
    FileNotFoundError
        If the file is absent; the message names it and says how to fetch it.
    ValueError
        If the file is unreadable, lacks ``X`` or the label variable, or its view count, shapes or labels
        differ from the spec; the message names the file.

    Examples
    --------
    With the data in ``./data`` (``python -m training download``), ``load("handwritten", "data")`` has
    ``view_dims == (240, 76, 216, 47, 64, 6)`` and ``num_classes == 10``.
    """
    spec = dataset_spec(name)
    if spec.file_name is None or spec.label_key is None:
        raise ValueError(f"{spec.name} is generated, not stored in a file")
    data_dir = Path(data_dir)
    path = data_dir / spec.file_name
    if not path.is_file():
        raise FileNotFoundError(f"{spec.name} data not found at {path}: {_fetch_hint(spec, data_dir)}")
    try:
        contents = scipy.io.loadmat(str(path))
    except (MatReadError, ValueError, TypeError) as error:
        raise ValueError(f"{path} is not a readable MATLAB file: {error}") from error
    missing = {"X", spec.label_key} - contents.keys()
    if missing:
        present = sorted(key for key in contents if not key.startswith("__"))
        raise ValueError(f"{path} lacks variable(s) {sorted(missing)}; it has {present}")

    labels = _integer_labels(contents[spec.label_key], path) - spec.label_offset
    stored_views = contents["X"].reshape(-1)
    if stored_views.size != spec.num_views:
        raise ValueError(
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
        raise ValueError(f"{path} has {labels.size} samples, expected {spec.num_samples}")
    if spec.view_dims is not None:
        for (view, matrix), dims in zip(views.items(), spec.view_dims, strict=True):
            if matrix.shape != (labels.size, dims):
                raise ValueError(
                    f"{path}: view {view!r} has shape {matrix.shape}, expected ({labels.size}, {dims})"
                )
    classes = np.unique(labels)
    if not np.array_equal(classes, np.arange(spec.num_classes)):
        raise ValueError(
            f"{path}: labels (after subtracting {spec.label_offset}) are {classes.tolist()[:5]}..., "
            f"expected 0..{spec.num_classes - 1} for {spec.num_classes} classes"
        )
    return MultiViewData(views=views, labels=labels, spec=spec)


def synthetic(
    n: int, *, num_classes: int = 3, dims: tuple[int, ...] = (4, 6, 5), noise: float = 0.1, seed: int = 0
) -> MultiViewData:
    """A small multi-view dataset whose views agree, for fast tests.

    Every view of a sample of class ``k`` is that view's class mean plus isotropic Gaussian noise; the class
    means are standard-normal draws, so with the default ``noise`` every view alone separates the classes.

    Parameters
    ----------
    n : int
        Number of samples; classes are balanced (sizes differ by at most one) and shuffled.
    num_classes : int
        K >= 2.
    dims : tuple of int
        ``d_v`` per view; views are named ``view_0``, ``view_1``, ...
    noise : float
        Standard deviation of the noise, >= 0.
    seed : int
        Seed of the generator; the same arguments give the same data.

    Returns
    -------
    MultiViewData
        float32 views, int64 labels, and a spec named ``"synthetic"``.

    Examples
    --------
    >>> data = synthetic(30, num_classes=3, dims=(2, 3))
    >>> data.view_dims, np.bincount(data.labels).tolist()
    ((2, 3), [10, 10, 10])
    """
    if n < 1 or num_classes < 2 or not dims or min(dims) < 1 or noise < 0:
        raise ValueError(
            f"need n >= 1, num_classes >= 2, dims >= 1, noise >= 0; got {n}, {num_classes}, {dims}, {noise}"
        )
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n, dtype=np.int64) % num_classes)
    views = {}
    for view, d in enumerate(dims):
        means = rng.normal(size=(num_classes, d))
        views[f"view_{view}"] = (means[labels] + noise * rng.normal(size=(n, d))).astype(np.float32)
    spec = DatasetSpec(
        name="synthetic",
        file_name=None,
        label_key=None,
        view_names=tuple(views),
        class_names=tuple(f"class_{k}" for k in range(num_classes)),
        num_samples=n,
        view_dims=tuple(dims),
        licence="generated",
    )
    return MultiViewData(views=views, labels=labels, spec=spec)


class ChecksumError(ValueError):
    """A file's SHA-256 is not the expected one.

    Attributes
    ----------
    path : Path
        The file checked.
    expected, actual : str
        Hex digests.
    """

    def __init__(self, path: str | os.PathLike[str], expected: str, actual: str, *, detail: str = "") -> None:
        self.path = Path(path)
        self.expected = expected
        self.actual = actual
        super().__init__(f"{self.path}: SHA-256 is {actual}, expected {expected}{detail}")


class DownloadError(RuntimeError):
    """A dataset file could not be fetched (no source, or a network or HTTP failure)."""


_CHUNK_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: str | os.PathLike[str], sha256: str) -> None:
    """Check that the file at ``path`` has the SHA-256 ``sha256`` (hex, any case).

    Raises
    ------
    ChecksumError
        If it has another; the message names the file and both digests.
    FileNotFoundError
        If there is no file.
    """
    actual = file_sha256(path)
    if actual != sha256.lower():
        raise ChecksumError(path, sha256.lower(), actual)


def _source_url(spec: DatasetSpec, base_urls: str | Mapping[str, str] | None) -> str | None:
    if base_urls is None:
        return spec.url
    base = base_urls if isinstance(base_urls, str) else base_urls.get(spec.name)
    if base is None:
        return spec.url
    return base.rstrip("/") + "/" + spec.file_name


def _fetch_verified(url: str, target: Path, sha256: str, timeout: float) -> None:
    """Stream ``url`` into a temporary file beside ``target``, check it, then rename it into place.

    The rename is atomic, so ``target`` is either absent, the old file, or the complete verified download;
    the temporary file never outlives this call.
    """
    handle, temporary_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    temporary = Path(temporary_name)
    try:
        digest = hashlib.sha256()
        received = 0
        try:
            with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                announced = response.headers.get("Content-Length")
                while chunk := response.read(_CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
        except (urllib.error.URLError, HTTPException, OSError) as error:
            raise DownloadError(f"could not fetch {target} from {url}: {error}") from error
        # http.client may end a body cut short without an error; the announced length tells it apart from a
        # corrupt one, which only the digest can.
        if announced is not None and announced.isdigit() and received != int(announced):
            raise DownloadError(
                f"incomplete download of {target} from {url}: {received} of {announced} bytes, discarded"
            )
        actual = digest.hexdigest()
        if actual != sha256.lower():
            raise ChecksumError(
                target,
                sha256.lower(),
                actual,
                detail=f" (downloaded from {url}: corrupt or incomplete, discarded)",
            )
        # mkstemp creates the file private to its owner; data files are world-readable like any download.
        temporary.chmod(0o644)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def download(
    names: Iterable[str | DatasetSpec],
    data_dir: str | os.PathLike[str],
    *,
    base_urls: str | Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> list[Path]:
    """Fetch dataset files into ``data_dir`` from their public sources, verifying each SHA-256.

    A file already present with the right digest is not fetched again; one with a wrong digest is replaced.
    Each download goes to a temporary file in ``data_dir`` and is renamed into place only once verified, so
    an interrupted or corrupt download never leaves a file under the dataset's name. Failures are raised at
    once, never retried.

    Parameters
    ----------
    names : iterable of str or DatasetSpec
        Datasets to fetch (keys of :data:`DATASETS`, or specs); all are resolved before any is fetched.
    data_dir : path
        Destination directory, created if needed.
    base_urls : str or mapping of str to str, optional
        Where to fetch from instead of the specs' URLs: one base URL for every dataset, or a base URL per
        dataset name (others keep their spec's URL). The file name is appended to the base.
    timeout : float
        Seconds to wait on the network before giving up on a file.

    Returns
    -------
    list of Path
        The verified files, in the order of ``names``.

    Raises
    ------
    ChecksumError
        A download does not have the expected digest (the message names the file); nothing is kept.
    DownloadError
        A dataset has no known source or digest, or the fetch failed.
    """
    specs = [dataset_spec(name) for name in names]
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    fetched = []
    for spec in specs:
        if spec.file_name is None:
            raise DownloadError(f"{spec.name} is generated, there is nothing to download")
        target = data_dir / spec.file_name
        url = _source_url(spec, base_urls)
        if url is None:
            raise DownloadError(
                f"{spec.name} ({spec.file_name}) has no public source configured: put the file in {data_dir}"
            )
        if spec.sha256 is None:
            # Without a digest a truncated or substituted file could not be told from the real one.
            raise DownloadError(
                f"{spec.name} ({spec.file_name}) has no known SHA-256: refusing an unverified download"
            )
        if target.is_file():
            try:
                verify(target, spec.sha256)
            except ChecksumError:
                _log.warning("%s has the wrong SHA-256; fetching it again", target)
            else:
                _log.info("%s is present and verified", target)
                fetched.append(target)
                continue
        _log.info("fetching %s from %s", target, url)
        _fetch_verified(url, target, spec.sha256, timeout)
        fetched.append(target)
    return fetched


def stratified_split(
    labels: np.ndarray, *, seed: int, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split sample indices into train, validation and test sets with the class proportions of ``labels``.

    Within each class, the samples are shuffled; the validation and test sets get ``floor(fraction * n_c)``
    of them and the training set the rest, so every class with at least one sample is in the training set,
    and a class too small for ``fraction * n_c >= 1`` is absent from that split.

    Parameters
    ----------
    labels : ndarray of int, shape (N,)
    seed : int
        The same seed and labels give the same split.
    fractions : (float, float, float)
        Train, validation and test fractions: non-negative, summing to 1, train > 0.

    Returns
    -------
    train, val, test : ndarray of int64
        Disjoint, sorted indices into ``labels`` covering ``0 .. N-1``.

    Examples
    --------
    >>> labels = np.repeat([0, 1], 10)
    >>> train, val, test = stratified_split(labels, seed=0)
    >>> [np.bincount(labels[part]).tolist() for part in (train, val, test)]
    [[7, 7], [1, 1], [2, 2]]
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    train_fraction, val_fraction, test_fraction = fractions
    if min(fractions) < 0 or train_fraction <= 0 or not np.isclose(sum(fractions), 1.0):
        raise ValueError(f"fractions must be non-negative, sum to 1, with train > 0; got {fractions}")
    rng = np.random.default_rng(seed)
    parts: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
    # Tolerance so that e.g. 0.1 * 30 == 3.0000000000000004 and 0.7 * 10 == 7.000000000000001 floor as meant.
    tolerance = 1e-9
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        num_val = int(np.floor(val_fraction * members.size + tolerance))
        num_test = int(np.floor(test_fraction * members.size + tolerance))
        num_train = members.size - num_val - num_test
        parts[0].append(members[:num_train])
        parts[1].append(members[num_train : num_train + num_val])
        parts[2].append(members[num_train + num_val :])
    train, val, test = (np.sort(np.concatenate(part)).astype(np.int64) for part in parts)
    return train, val, test


@dataclass(frozen=True, eq=False)
class MinMaxScaler:
    """Per-feature min-max scaling of every view to [0, 1], with ranges fitted on one split.

    The paper min-max scales every view; fitting on the training split only keeps the test data out of the
    preprocessing. Features constant on the fitted data carry no information and map to 0 (no division by
    zero); other features of new data may fall outside [0, 1] unless ``clip`` is asked for.

    Parameters
    ----------
    minimum, maximum : mapping of str to ndarray, shape (d_v,)
        Per-view, per-feature range of the fitted data.

    Examples
    --------
    >>> scaler = MinMaxScaler.fit({"a": np.array([[0.0, 5.0], [2.0, 5.0]])})
    >>> scaler.transform({"a": np.array([[1.0, 5.0], [4.0, 7.0]])})["a"].tolist()
    [[0.5, 0.0], [2.0, 0.0]]
    """

    minimum: Mapping[str, np.ndarray]
    maximum: Mapping[str, np.ndarray]

    @classmethod
    def fit(cls, views: Mapping[str, np.ndarray]) -> MinMaxScaler:
        """Record each view's per-feature minimum and maximum over the rows of ``views`` ((N >= 1, d_v))."""
        minimum, maximum = {}, {}
        for name, matrix in views.items():
            matrix = np.asarray(matrix, dtype=np.float64)
            if matrix.ndim != 2 or matrix.shape[0] == 0:
                raise ValueError(f"view {name!r}: need a non-empty (N, d) matrix, got shape {matrix.shape}")
            minimum[name] = matrix.min(axis=0)
            maximum[name] = matrix.max(axis=0)
        return cls(minimum=MappingProxyType(minimum), maximum=MappingProxyType(maximum))

    def transform(self, views: Mapping[str, np.ndarray], *, clip: bool = False) -> dict[str, np.ndarray]:
        """Scale each view of ``views`` ((M, d_v), the fitted views' names and dims) with the fitted ranges.

        Returns float32 ``(M, d_v)`` matrices in ``views``' order; ``clip`` clamps them to [0, 1].
        """
        scaled = {}
        for name, matrix in views.items():
            low, high = self.minimum[name], self.maximum[name]
            matrix = np.asarray(matrix, dtype=np.float64)
            if matrix.ndim != 2 or matrix.shape[1] != low.size:
                raise ValueError(f"view {name!r}: expected (M, {low.size}), got shape {matrix.shape}")
            span = high - low
            varies = span > 0
            out = np.where(varies, (matrix - low) / np.where(varies, span, 1.0), 0.0)
            if clip:
                out = np.clip(out, 0.0, 1.0)
            scaled[name] = out.astype(np.float32)
        return scaled


ConflictSource = Literal["random", "prototype"]


def make_conflictive(
    views: Mapping[str, np.ndarray],
    labels: np.ndarray,
    *,
    rng: np.random.Generator,
    source: ConflictSource = "random",
    pool_indices: np.ndarray | None = None,
    num_classes: int | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A conflictive copy of a multi-view set: one random view per sample taken from another class.

    As in the paper (section 4), for every sample ``i`` one view, drawn uniformly, is replaced by the same
    view of a sample of class ``(labels[i] + 1) mod K``; the labels stay as they are. The donor sample is
    drawn from the candidates: the rows ``pool_indices`` (all rows when None).

    Parameters
    ----------
    views : mapping of str to ndarray, shape (N, d_v)
        The samples to perturb (and the donors' rows). Not modified.
    labels : ndarray of int, shape (N,)
    rng : numpy.random.Generator
        Draws the replaced view (and, for ``"random"``, the donor) of every sample.
    source : {"random", "prototype"}
        ``"random"``: a uniformly drawn candidate of the target class (protocol ``heldout``, with the test
        split as the pool). ``"prototype"``: the first candidate of the target class in row order, what the
        authors' code does (protocol ``paper``; pass the whole dataset, in file order, to reproduce it).
    pool_indices : ndarray of int, optional
        Row indices of the donor candidates.
    num_classes : int, optional
        K; defaults to ``labels.max() + 1``, which is wrong for a subset lacking the last class.

    Returns
    -------
    views_conflict : dict of str to ndarray, shape (N, d_v)
        New arrays, in ``views``' order.
    replaced_view_index : ndarray of int64, shape (N,)
        Position (in ``views``' order) of the view replaced in each sample.

    Raises
    ------
    ValueError
        For K < 2, an unknown source, or a target class without candidates in the pool.

    Examples
    --------
    >>> views = {"a": np.array([[0.0], [1.0], [2.0]]), "b": np.array([[10.0], [11.0], [12.0]])}
    >>> conflict, replaced = make_conflictive(
    ...     views, np.array([0, 1, 1]), rng=np.random.default_rng(1), source="prototype"
    ... )
    >>> replaced.tolist(), conflict["a"].ravel().tolist(), conflict["b"].ravel().tolist()
    ([0, 1, 1], [1.0, 1.0, 2.0], [10.0, 10.0, 10.0])
    """
    if source not in ("random", "prototype"):
        raise ValueError(f"source must be 'random' or 'prototype', got {source!r}")
    names = list(views)
    if not names:
        raise ValueError("no views to perturb")
    labels = np.asarray(labels)
    num_samples = labels.shape[0]
    k = int(labels.max()) + 1 if num_classes is None else num_classes
    if k < 2:
        raise ValueError(f"a conflicting class needs K >= 2 classes, got K = {k}")
    # np.unique sorts: "first" then means first in row order, whatever order the pool was given in.
    pool = (
        np.arange(num_samples)
        if pool_indices is None
        else np.unique(np.asarray(pool_indices, dtype=np.int64))
    )
    if pool.size and (pool[0] < 0 or pool[-1] >= num_samples):
        raise ValueError(f"pool_indices must lie in 0..{num_samples - 1}")

    replaced = rng.integers(len(names), size=num_samples).astype(np.int64)
    targets = (labels + 1) % k
    donors = np.empty(num_samples, dtype=np.int64)
    for target in np.unique(targets):
        candidates = pool[labels[pool] == target]
        if candidates.size == 0:
            raise ValueError(
                f"no sample of class {target} among the candidates to take a conflicting view from"
            )
        needing = np.flatnonzero(targets == target)
        if source == "prototype":
            donors[needing] = candidates[0]
        else:
            donors[needing] = candidates[rng.integers(candidates.size, size=needing.size)]

    conflictive = {}
    for position, name in enumerate(names):
        matrix = np.array(views[name], copy=True)
        rows = np.flatnonzero(replaced == position)
        matrix[rows] = views[name][donors[rows]]
        conflictive[name] = matrix
    return conflictive, replaced
