"""The benchmark datasets: registry (training.registry), reading the .mat files (training.readers), checksums
and download (training.download), splits, scaling and conflicts (training.protocol), synthetic data."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from training.data import MultiViewData, synthetic
from training.download import ChecksumError, DownloadError, download, file_sha256, verify
from training.protocol import MinMaxScaler, make_conflictive, stratified_split
from training.readers import load
from training.registry import DATASETS, DatasetSpec, dataset_spec

needs_data = pytest.mark.data

SHIPPED = ("handwritten", "scene15", "pie", "cub")

# What shared/data/README.md states about each shipped file: samples, view names and dims, classes.
README = {
    "handwritten": (2000, ("pix", "fou", "fac", "zer", "kar", "mor"), (240, 76, 216, 47, 64, 6), 10),
    "scene15": (4485, ("gist", "phog", "lbp"), (20, 59, 40), 15),
    "pie": (680, ("intensity", "lbp", "gabor"), (484, 256, 279), 68),
    "cub": (600, ("image", "text"), (1024, 300), 10),
}

# Images per category of the 15-scene data set (Lazebnik et al., 2006): the evidence for the class order.
SCENE15_IMAGES_PER_CATEGORY = {
    "suburb": 241,
    "coast": 360,
    "forest": 328,
    "highway": 260,
    "insidecity": 308,
    "mountain": 374,
    "opencountry": 410,
    "street": 292,
    "tallbuilding": 356,
    "office": 215,
    "bedroom": 216,
    "industrial": 311,
    "kitchen": 210,
    "livingroom": 289,
    "store": 315,
}


@pytest.fixture(scope="module")
def loaded(data_dir: Path) -> dict[str, MultiViewData]:
    return {name: load(name, data_dir) for name in SHIPPED}


# -- registry ------------------------------------------------------------------------------------------------


def test_registry_names_views_and_sources():
    assert tuple(DATASETS) == ("handwritten", "scene15", "pie", "cub", "caltech101")
    for name, (_, views, dims, num_classes) in README.items():
        spec = DATASETS[name]
        assert (spec.view_names, spec.view_dims, spec.num_classes) == (views, dims, num_classes)
        assert spec.downloadable
        assert spec.url is not None
        assert spec.url.startswith("https://raw.githubusercontent.com/")
        assert spec.url.endswith("/data/" + spec.file_name)
    caltech = DATASETS["caltech101"]
    assert caltech.view_names == ("decaf", "vgg19")
    assert caltech.num_classes == 10
    assert not caltech.downloadable
    assert DATASETS["handwritten"].class_names == tuple("0123456789")
    assert DATASETS["cub"].class_names[0] == "Black_footed_Albatross"
    assert DATASETS["pie"].class_names[-1] == "subject_68"


def test_unknown_dataset_lists_known_names():
    with pytest.raises(KeyError, match="handwritten"):
        dataset_spec("mnist")


# -- checksums and loading of the shipped files --------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_file_checksum_verifies(data_dir: Path, name: str):
    spec = DATASETS[name]
    verify(data_dir / spec.file_name, spec.sha256)


def test_verify_names_file_and_both_digests(tmp_path: Path):
    path = tmp_path / "some.mat"
    path.write_bytes(b"not the data")
    expected = "0" * 64
    with pytest.raises(ChecksumError) as caught:
        verify(path, expected)
    message = str(caught.value)
    assert str(path) in message
    assert expected in message
    assert hashlib.sha256(b"not the data").hexdigest() in message
    assert isinstance(caught.value, ValueError)


@needs_data
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_dataset_loads_with_readme_shapes(loaded: dict[str, MultiViewData], name: str):
    data = loaded[name]
    num_samples, views, dims, num_classes = README[name]
    assert tuple(data.views) == views
    assert data.view_dims == dims
    for matrix, d in zip(data.views.values(), dims, strict=True):
        assert matrix.shape == (num_samples, d)
        assert matrix.dtype == np.float32
        assert np.isfinite(matrix).all()
    assert data.labels.shape == (num_samples,)
    assert data.labels.dtype == np.int64
    assert set(np.unique(data.labels).tolist()) == set(range(num_classes))
    assert data.num_classes == num_classes


@needs_data
def test_scene15_class_names_follow_the_category_sizes(loaded: dict[str, MultiViewData]):
    data = loaded["scene15"]
    counts = np.bincount(data.labels)
    assert dict(zip(data.spec.class_names, counts.tolist(), strict=True)) == SCENE15_IMAGES_PER_CATEGORY


def test_missing_file_names_path_and_download_command(tmp_path: Path):
    with pytest.raises(FileNotFoundError) as caught:
        load("pie", tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "PIE_face_10.mat") in message
    assert f"python -m training download --data-dir {tmp_path}" in message


def test_missing_caltech_says_it_has_no_public_source(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no public source"):
        load("caltech101", tmp_path)


def _write_views(path: Path, views: list[np.ndarray], labels: np.ndarray, label_key: str = "gt") -> None:
    stored = np.empty((1, len(views)), dtype=object)
    for position, matrix in enumerate(views):
        stored[0, position] = matrix
    scipy.io.savemat(path, {"X": stored, label_key: labels.reshape(-1, 1)})


def test_caltech_layout_keeps_the_first_ten_classes(tmp_path: Path):
    # A small stand-in for the unshipped file: 12 classes stored as dims x samples, labels from 1.
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(1, 13), 3)
    decaf, vgg = rng.normal(size=(7, labels.size)), rng.normal(size=(5, labels.size))
    _write_views(tmp_path / "2view-caltech101-8677sample.mat", [decaf, vgg], labels)
    data = load("caltech101", tmp_path)
    kept = labels <= 10
    assert data.view_dims == (7, 5)
    np.testing.assert_array_equal(data.labels, labels[kept] - 1)
    np.testing.assert_allclose(data.views["decaf"], decaf.T[kept].astype(np.float32))
    np.testing.assert_allclose(data.views["vgg19"], vgg.T[kept].astype(np.float32))


def test_orientation_follows_the_label_count_not_the_flag(tmp_path: Path):
    spec = DatasetSpec(
        name="toy",
        file_name="toy.mat",
        label_key="Y",
        view_names=("a", "b"),
        class_names=("x", "y"),
        stored_transposed=True,  # wrong for view "a": detection must win
        num_samples=6,
        view_dims=(3, 6),
    )
    labels = np.array([0, 1, 0, 1, 0, 1])
    a = np.arange(18.0).reshape(6, 3)  # samples x dims
    b = np.arange(36.0).reshape(6, 6)  # square: the flag decides, dims x samples
    _write_views(tmp_path / "toy.mat", [a, b], labels, label_key="Y")
    data = load(spec, tmp_path)
    np.testing.assert_array_equal(data.views["a"], a)
    np.testing.assert_array_equal(data.views["b"], b.T)


def test_shape_mismatch_names_the_file(tmp_path: Path):
    spec = dataclasses.replace(DATASETS["cub"], view_dims=(1024, 301), num_samples=10)
    rng = np.random.default_rng(0)
    labels = np.arange(1, 11)
    _write_views(tmp_path / spec.file_name, [rng.normal(size=(10, 1024)), rng.normal(size=(10, 300))], labels)
    with pytest.raises(
        ValueError, match=r"cub_googlenet_doc2vec_c10\.mat: view 'text' has shape \(10, 300\)"
    ):
        load(spec, tmp_path)


def test_wrong_label_key_names_the_file(tmp_path: Path):
    _write_views(tmp_path / "PIE_face_10.mat", [np.zeros((2, 2))] * 3, np.array([1, 2]), label_key="Y")
    with pytest.raises(ValueError, match=r"PIE_face_10\.mat lacks variable\(s\) \['gt'\]"):
        load("pie", tmp_path)


# -- download ------------------------------------------------------------------------------------------------


class _FileServer(http.server.ThreadingHTTPServer):
    """Serves ``root`` on loopback, recording requested paths; ``truncate_to`` cuts bodies short."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.truncate_to: int | None = None
        super().__init__(("127.0.0.1", 0), _FileHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _FileHandler(http.server.SimpleHTTPRequestHandler):
    server: _FileServer

    def translate_path(self, path: str) -> str:
        return str(self.server.root / path.lstrip("/").split("?")[0])

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        target = Path(self.translate_path(self.path))
        if self.server.truncate_to is None or not target.is_file():
            super().do_GET()
            return
        body = target.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))  # promises more than is sent
        self.end_headers()
        self.wfile.write(body[: self.server.truncate_to])

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean


@contextmanager
def _serve(root: Path) -> Iterator[_FileServer]:
    server = _FileServer(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[_FileServer]:
    root = tmp_path / "served"
    root.mkdir()
    with _serve(root) as server:
        yield server


def _publish(server: _FileServer, content: bytes) -> DatasetSpec:
    """Serve ``content`` as the PIE file, and return a PIE spec whose digest is that content's."""
    spec = DATASETS["pie"]
    (server.root / spec.file_name).write_bytes(content)
    return dataclasses.replace(spec, sha256=hashlib.sha256(content).hexdigest(), size_bytes=len(content))


def test_download_lands_a_verified_file(file_server: _FileServer, tmp_path: Path):
    spec = _publish(file_server, b"good bytes" * 1000)
    data_dir = tmp_path / "data"
    [path] = download([spec], data_dir, base_urls=file_server.url)
    assert path == data_dir / spec.file_name
    verify(path, spec.sha256)
    assert sorted(p.name for p in data_dir.iterdir()) == [spec.file_name]
    assert file_server.requests == ["/" + spec.file_name]


def test_corrupt_download_raises_naming_the_file_and_leaves_nothing(file_server: _FileServer, tmp_path: Path):
    spec = dataclasses.replace(_publish(file_server, b"corrupt"), sha256=hashlib.sha256(b"good").hexdigest())
    data_dir = tmp_path / "data"
    with pytest.raises(ChecksumError, match=r"PIE_face_10\.mat"):
        download([spec], data_dir, base_urls={"pie": file_server.url})
    assert list(data_dir.iterdir()) == []


def test_truncated_download_raises_naming_the_file_and_leaves_nothing(
    file_server: _FileServer, tmp_path: Path
):
    spec = _publish(file_server, b"x" * 100_000)
    file_server.truncate_to = 1000
    data_dir = tmp_path / "data"
    with pytest.raises(DownloadError, match=r"incomplete download of .*PIE_face_10\.mat.*1000 of 100000"):
        download([spec], data_dir, base_urls=file_server.url)
    assert list(data_dir.iterdir()) == []


def test_http_error_raises_naming_the_file(file_server: _FileServer, tmp_path: Path):
    spec = dataclasses.replace(DATASETS["pie"], sha256="0" * 64)  # nothing published: 404
    data_dir = tmp_path / "data"
    with pytest.raises(DownloadError, match=r"PIE_face_10\.mat"):
        download([spec], data_dir, base_urls=file_server.url)
    assert list(data_dir.iterdir()) == []


def test_present_good_file_is_not_refetched(file_server: _FileServer, tmp_path: Path):
    spec = _publish(file_server, b"good")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / spec.file_name).write_bytes(b"good")
    assert download([spec], data_dir, base_urls=file_server.url) == [data_dir / spec.file_name]
    assert file_server.requests == []


def test_present_bad_file_is_replaced(file_server: _FileServer, tmp_path: Path):
    spec = _publish(file_server, b"good")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / spec.file_name).write_bytes(b"half")
    download([spec], data_dir, base_urls=file_server.url)
    assert (data_dir / spec.file_name).read_bytes() == b"good"


def test_caltech_has_no_public_source(tmp_path: Path):
    with pytest.raises(DownloadError, match="no public source configured"):
        download(["caltech101"], tmp_path)


class _HostileServer(http.server.ThreadingHTTPServer):
    """Answers every request on loopback as ``mode`` says: ``endless`` (a body without end, no length),
    ``huge`` (10 GiB announced, and sent), ``drip`` (``size`` bytes announced, one every 50 ms)."""

    daemon_threads = True

    def __init__(self, mode: str, size: int) -> None:
        self.mode, self.size = mode, size
        super().__init__(("127.0.0.1", 0), _HostileHandler)


class _HostileHandler(http.server.BaseHTTPRequestHandler):
    server: _HostileServer

    def do_GET(self) -> None:
        drip = self.server.mode == "drip"
        self.send_response(200)
        if self.server.mode != "endless":
            self.send_header("Content-Length", str(self.server.size if drip else 10 << 30))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b"x" if drip else b"x" * 65536)
                self.wfile.flush()
                if drip:
                    time.sleep(0.05)
        except OSError:  # the client hung up
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("endless", "sends more than the 10000 bytes"),
        ("huge", "announces 10737418240 bytes"),
        ("drip", "too slow"),
    ],
)
def test_download_stops_at_the_files_size_and_time(tmp_path: Path, mode: str, said: str):
    """A mirror that sends without end, announces 10 GiB, or drips a byte at a time is given up on, at the
    file's size or the time it takes at the slowest rate accepted, and nothing is kept."""
    spec = dataclasses.replace(DATASETS["pie"], sha256="0" * 64, size_bytes=10_000)
    server = _HostileServer(mode, spec.size_bytes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    data_dir = tmp_path / "data"
    try:
        with pytest.raises(DownloadError, match=r"PIE_face_10\.mat") as refused:
            download([spec], data_dir, base_urls=f"http://127.0.0.1:{server.server_address[1]}/", timeout=1)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert said in str(refused.value)  # stopped by its own guard (a drip would end in a checksum error)
    assert list(data_dir.iterdir()) == []


@needs_data
def test_download_of_the_real_files_from_a_mirror(data_dir: Path, tmp_path: Path):
    # The shared data directory served as a mirror: the registry's digests accept the published bytes.
    with _serve(data_dir) as server:
        paths = download(["pie", "cub"], tmp_path, base_urls=server.url)
        assert [file_sha256(path) for path in paths] == [DATASETS["pie"].sha256, DATASETS["cub"].sha256]
    assert load("cub", tmp_path).num_samples == 600


@needs_data
def test_download_command(data_dir: Path, tmp_path: Path):
    """``python -m training download`` as users run it: a verified file, then a corrupt mirror refused."""
    command = [
        sys.executable,
        "-m",
        "training",
        "download",
        "--data-dir",
        str(tmp_path / "ok"),
        "--dataset",
        "cub",
    ]
    with _serve(data_dir) as server:
        done = subprocess.run([*command, "--mirror", server.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ok" / DATASETS["cub"].file_name).is_file()

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / DATASETS["cub"].file_name).write_bytes(b"not the dataset")
    command[5] = str(tmp_path / "fresh")
    with _serve(bad) as server:
        refused = subprocess.run(
            [*command, "--mirror", server.url], capture_output=True, text=True, timeout=120
        )
    assert refused.returncode == 1
    assert "cub_googlenet_doc2vec_c10.mat" in refused.stderr
    assert not (tmp_path / "fresh" / DATASETS["cub"].file_name).exists()


# -- splits --------------------------------------------------------------------------------------------------


def _uneven_labels() -> np.ndarray:
    return np.repeat(np.arange(5), [1, 3, 10, 31, 60])


def test_split_is_deterministic_for_a_seed():
    labels = _uneven_labels()
    first, again = stratified_split(labels, seed=3), stratified_split(labels, seed=3)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = stratified_split(labels, seed=4)
    assert not np.array_equal(first[0], other[0])


def test_split_is_disjoint_covering_and_sorted():
    labels = _uneven_labels()
    train, val, test = stratified_split(labels, seed=0)
    everything = np.concatenate([train, val, test])
    assert np.array_equal(np.sort(everything), np.arange(labels.size))
    for part in (train, val, test):
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)


def test_split_is_stratified_and_every_class_trains():
    labels = _uneven_labels()
    train, val, test = stratified_split(labels, seed=0, fractions=(0.7, 0.1, 0.2))
    assert np.bincount(labels[train], minlength=5).tolist() == [1, 3, 7, 22, 42]
    assert np.bincount(labels[val], minlength=5).tolist() == [0, 0, 1, 3, 6]
    assert np.bincount(labels[test], minlength=5).tolist() == [0, 0, 2, 6, 12]


@needs_data
def test_split_of_pie_has_every_subject_in_every_part(loaded: dict[str, MultiViewData]):
    labels = loaded["pie"].labels
    for part, per_class in zip(stratified_split(labels, seed=0), (7, 1, 2), strict=True):
        assert np.bincount(labels[part]).tolist() == [per_class] * 68


@pytest.mark.parametrize("fractions", [(0.5, 0.5, 0.5), (0.0, 0.5, 0.5), (1.2, -0.1, -0.1)])
def test_split_rejects_bad_fractions(fractions: tuple[float, float, float]):
    with pytest.raises(ValueError, match="fractions"):
        stratified_split(np.zeros(10, dtype=int), seed=0, fractions=fractions)


# -- scaling -------------------------------------------------------------------------------------------------


def test_scaler_fitted_on_train_maps_train_into_unit_interval():
    data = synthetic(90, dims=(4, 3), seed=1)
    views = dict(data.views)
    views["view_1"] = views["view_1"].copy()
    views["view_1"][:, 1] = 2.5  # a constant feature
    train, _, test = stratified_split(data.labels, seed=0)
    scaler = MinMaxScaler.fit({name: matrix[train] for name, matrix in views.items()})
    with np.errstate(all="raise"):  # no division by zero anywhere
        scaled_train = scaler.transform({name: matrix[train] for name, matrix in views.items()})
        scaled_test = scaler.transform({name: matrix[test] for name, matrix in views.items()})
    for name, matrix in scaled_train.items():
        assert matrix.dtype == np.float32
        assert matrix.min() >= 0.0
        assert matrix.max() <= 1.0
        varying = np.ptp(views[name][train], axis=0) > 0
        np.testing.assert_array_equal(matrix.min(axis=0)[varying], 0.0)
        np.testing.assert_array_equal(matrix.max(axis=0)[varying], 1.0)
    assert not scaled_train["view_1"][:, 1].any()
    assert not scaled_test["view_1"][:, 1].any()
    # The ranges are the training split's, not the whole data's.
    np.testing.assert_array_equal(scaler.minimum["view_0"], views["view_0"][train].min(axis=0))


def test_scaler_leaves_unseen_values_outside_unless_clipped():
    scaler = MinMaxScaler.fit({"a": np.array([[0.0], [1.0]])})
    beyond = {"a": np.array([[-1.0], [3.0]])}
    assert scaler.transform(beyond)["a"].ravel().tolist() == [-1.0, 3.0]
    assert scaler.transform(beyond, clip=True)["a"].ravel().tolist() == [0.0, 1.0]


def test_scaler_constant_feature_of_new_data_is_zero():
    scaler = MinMaxScaler.fit({"a": np.array([[7.0, 0.0], [7.0, 2.0]])})
    assert scaler.transform({"a": np.array([[9.0, 1.0]])})["a"].tolist() == [[0.0, 0.5]]


# -- conflictive copies --------------------------------------------------------------------------------------


def _changed_views(original: dict[str, np.ndarray], conflict: dict[str, np.ndarray]) -> np.ndarray:
    """(N, V) bool: which views of each sample differ."""
    return np.stack([np.any(original[name] != conflict[name], axis=1) for name in original], axis=1)


def _donor_rows(matrix: np.ndarray, row: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.all(matrix == row, axis=1))


def test_random_conflict_replaces_one_view_from_the_next_class_in_the_pool():
    data = synthetic(120, num_classes=4, seed=2)
    k = data.num_classes
    _, _, test = stratified_split(data.labels, seed=0)
    views_before = {name: matrix.copy() for name, matrix in data.views.items()}
    conflict, replaced = make_conflictive(
        data.views, data.labels, rng=np.random.default_rng(0), source="random", pool_indices=test
    )
    for name in data.views:  # the input is untouched
        np.testing.assert_array_equal(data.views[name], views_before[name])
    changed = _changed_views(data.views, conflict)
    assert changed.sum(axis=1).tolist() == [1] * data.num_samples
    np.testing.assert_array_equal(np.argmax(changed, axis=1), replaced)
    names = list(data.views)
    donors = []
    for i, position in enumerate(replaced):
        matrix = data.views[names[position]]
        [donor] = _donor_rows(matrix, conflict[names[position]][i])
        assert donor in test
        assert data.labels[donor] == (data.labels[i] + 1) % k
        donors.append(donor)
    assert len(set(donors)) > k  # drawn at random, not one per class
    assert set(replaced.tolist()) == set(range(len(names)))


def test_prototype_conflict_takes_the_first_sample_of_the_next_class():
    data = synthetic(60, num_classes=3, seed=5)
    first_of_class = [int(np.flatnonzero(data.labels == c)[0]) for c in range(3)]
    conflict, replaced = make_conflictive(
        data.views, data.labels, rng=np.random.default_rng(1), source="prototype"
    )
    names = list(data.views)
    for i, position in enumerate(replaced):
        donor = first_of_class[(data.labels[i] + 1) % 3]
        np.testing.assert_array_equal(conflict[names[position]][i], data.views[names[position]][donor])
    assert _changed_views(data.views, conflict).sum(axis=1).tolist() == [1] * data.num_samples


def test_prototype_within_a_pool_is_its_first_row():
    labels = np.array([0, 1, 0, 1])
    views = {"a": np.arange(4.0).reshape(4, 1)}
    conflict, _ = make_conflictive(
        views, labels, rng=np.random.default_rng(0), source="prototype", pool_indices=np.array([3, 2])
    )
    assert conflict["a"].ravel().tolist() == [3.0, 2.0, 3.0, 2.0]


def test_a_class_missing_from_the_pool_gives_its_place_to_the_class_after():
    """Donors come from the next class; where the pool has none of it (class 2 here), from the class after
    (class 0 for class 1's sample): every copy still conflicts."""
    labels = np.array([0, 1, 2])
    views = {"a": np.arange(3.0)[:, None]}
    pool = np.array([0, 1])
    conflicted, *_ = make_conflictive(views, labels, rng=np.random.default_rng(0), pool_indices=pool)
    assert conflicted["a"].ravel().tolist() == [1.0, 0.0, 0.0]  # the donors' rows: classes 1, 0, 0
    with pytest.raises(ValueError, match="K >= 2"):
        make_conflictive(views, np.zeros(3, dtype=int), rng=np.random.default_rng(0))


def test_conflict_is_reproducible_for_a_seed():
    data = synthetic(40, seed=0)
    first = make_conflictive(data.views, data.labels, rng=np.random.default_rng(7))
    again = make_conflictive(data.views, data.labels, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(first[1], again[1])
    for name in data.views:
        np.testing.assert_array_equal(first[0][name], again[0][name])


@needs_data
def test_heldout_conflict_on_pie_changes_one_view_per_test_sample(loaded: dict[str, MultiViewData]):
    test = stratified_split(loaded["pie"].labels, seed=0)[2]
    data = loaded["pie"].take(test)
    conflict, replaced = make_conflictive(
        data.views, data.labels, rng=np.random.default_rng(0), num_classes=68
    )
    changed = _changed_views(data.views, conflict)
    assert changed.sum(axis=1).tolist() == [1] * data.num_samples
    np.testing.assert_array_equal(np.argmax(changed, axis=1), replaced)


# -- synthetic data ------------------------------------------------------------------------------------------


def test_synthetic_shapes_and_determinism():
    data = synthetic(50, num_classes=5, dims=(3, 7), noise=0.2, seed=4)
    assert data.spec.name == "synthetic"
    assert data.view_dims == (3, 7)
    assert np.bincount(data.labels).tolist() == [10] * 5
    assert all(matrix.dtype == np.float32 for matrix in data.views.values())
    again = synthetic(50, num_classes=5, dims=(3, 7), noise=0.2, seed=4)
    for name in data.views:
        np.testing.assert_array_equal(data.views[name], again.views[name])
    assert not np.array_equal(synthetic(50, seed=5).views["view_0"], synthetic(50, seed=4).views["view_0"])


def test_synthetic_views_each_separate_the_classes():
    data = synthetic(300, seed=0)
    train, _, test = stratified_split(data.labels, seed=0)
    for matrix in data.views.values():
        means = np.stack([matrix[train][data.labels[train] == c].mean(axis=0) for c in range(3)])
        distances = np.linalg.norm(matrix[test][:, None, :] - means[None], axis=2)
        accuracy = np.mean(np.argmin(distances, axis=1) == data.labels[test])
        assert accuracy > 0.95
        gaps = [np.linalg.norm(means[a] - means[b]) for a in range(3) for b in range(a + 1, 3)]
        assert min(gaps) > 5 * 0.1  # well beyond the noise scale


def test_synthetic_noise_controls_the_spread():
    tight, loose = synthetic(300, noise=0.01, seed=0), synthetic(300, noise=1.0, seed=0)
    spread = [np.std(d.views["view_0"][d.labels == 0], axis=0).mean() for d in (tight, loose)]
    assert spread[0] < 0.05 < 0.5 < spread[1]
