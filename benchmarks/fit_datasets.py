"""The fit-quality benchmark's data sets: small public data that ships inside Python packages (nothing is
downloaded), each split into views by what its features mean, and two synthetic sets.

================  =======  ===========================  =================================================
name              samples  classes                      views (features)
================  =======  ===========================  =================================================
breast_cancer     569      2: malignant, benign         ``mean``, ``se``, ``worst`` (10 each): radius,
                                                        texture, perimeter, area, smoothness,
                                                        compactness, concavity, concave points,
                                                        symmetry and fractal dimension of an image's
                                                        cell nuclei, as their mean, standard error and
                                                        mean of the three largest
wine              178      3 cultivars                  ``chemistry`` (10): alcohol, malic acid, ash, its
                                                        alkalinity, magnesium, total phenols,
                                                        flavanoids, non-flavanoid phenols,
                                                        proanthocyanins, proline; ``colour`` (3): colour
                                                        intensity, hue, OD280/OD315 of diluted wine
iris              150      3 species                    ``sepal``, ``petal`` (length and width each)
digits            1797     10 digits                    8x8 images of handwritten digits in four 4x4
                                                        quadrants, 16 pixels each: ``top_left``,
                                                        ``top_right``, ``bottom_left``, ``bottom_right``
penguins          342      3 species: Adelie,           ``bill`` (length, depth), ``body`` (flipper
                           Chinstrap, Gentoo            length, body mass), ``isotopes`` (blood δ15N and
                                                        δ13C; missing for 12 birds)
diabetes          442      3: one-year disease          ``patient`` (age, sex, BMI, mean blood
                           progression in tertiles:     pressure), ``serum`` (6 blood serum
                           low, medium, high            measurements: total cholesterol, LDL, HDL,
                                                        total / HDL, log triglycerides, glucose)
noise_view        600      4                            ``signal_a``, ``signal_b``: 8 features each, the
                                                        class's mean plus Gaussian noise
                                                        (:func:`training.data.synthetic`, noisy enough
                                                        that no view alone classifies well);
                                                        ``noise``: 8 features of pure noise, useless
missing_view      600      4                            ``a``, ``b``, ``c``, made as ``signal_a``; ``c``
                                                        missing for 30% of the samples, drawn at random
================  =======  ===========================  =================================================

Sources: scikit-learn's bundled copies (``load_breast_cancer``, ``load_wine``, ``load_iris``,
``load_digits``, ``load_diabetes(scaled=False)``) and ``palmerpenguins``' ``penguins-raw.csv`` (the two
birds measured not at all are left out; the isotopes view is missing where either ratio is). Each loader
returns a :class:`training.data.MultiViewData` with raw features (NaN rows where a view is missing);
:func:`write_npy_directory` writes one as a user brings data to ``python -m training fit``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from training.data import SPLIT_NAMES, MultiViewData, synthetic

__all__ = ["DATASETS", "load", "write_npy_directory"]

SYNTHETIC_NOISE = 1.5
"""The synthetic views' noise: enough that views alone classify poorly and together well."""


def _dataset(
    name: str, views: dict[str, np.ndarray], labels: np.ndarray, class_names: list[str]
) -> MultiViewData:
    return MultiViewData(
        views={view: np.ascontiguousarray(matrix, dtype=np.float32) for view, matrix in views.items()},
        labels=np.asarray(labels, dtype=np.int64),
        class_names=tuple(class_names),
        name=name,
        source="bundled",
    )


def breast_cancer() -> MultiViewData:
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    # 30 features: the 10 measurements' means, then their standard errors, then their worst values
    views = dict(zip(("mean", "se", "worst"), np.split(bunch.data, 3, axis=1), strict=True))
    return _dataset("breast_cancer", views, bunch.target, list(bunch.target_names))


def wine() -> MultiViewData:
    from sklearn.datasets import load_wine

    bunch = load_wine()
    colour = [
        list(bunch.feature_names).index(f) for f in ("color_intensity", "hue", "od280/od315_of_diluted_wines")
    ]
    chemistry = [i for i in range(bunch.data.shape[1]) if i not in colour]
    views = {"chemistry": bunch.data[:, chemistry], "colour": bunch.data[:, colour]}
    return _dataset("wine", views, bunch.target, [f"cultivar_{k + 1}" for k in range(3)])


def iris() -> MultiViewData:
    from sklearn.datasets import load_iris

    bunch = load_iris()
    views = {"sepal": bunch.data[:, :2], "petal": bunch.data[:, 2:]}
    return _dataset("iris", views, bunch.target, list(bunch.target_names))


def digits() -> MultiViewData:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images
    views = {
        f"{row}_{column}": images[:, rows, columns].reshape(len(images), -1)
        for row, rows in (("top", slice(0, 4)), ("bottom", slice(4, 8)))
        for column, columns in (("left", slice(0, 4)), ("right", slice(4, 8)))
    }
    return _dataset("digits", views, bunch.target, [str(k) for k in range(10)])


_PENGUIN_VIEWS = {
    "bill": ("Culmen Length (mm)", "Culmen Depth (mm)"),
    "body": ("Flipper Length (mm)", "Body Mass (g)"),
    "isotopes": ("Delta 15 N (o/oo)", "Delta 13 C (o/oo)"),
}


def penguins() -> MultiViewData:
    try:
        text = resources.files("palmerpenguins").joinpath("data/penguins-raw.csv").read_text("utf-8")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "the penguins data set is palmerpenguins' CSV: pip install palmerpenguins (a dev dependency)"
        ) from error
    rows = [row for row in csv.DictReader(io.StringIO(text)) if row["Culmen Length (mm)"] != "NA"]
    views = {}
    for view, columns in _PENGUIN_VIEWS.items():
        matrix = np.array([[np.nan if row[c] == "NA" else float(row[c]) for c in columns] for row in rows])
        matrix[np.isnan(matrix).any(axis=1)] = np.nan  # a view is missing whole, never in part
        views[view] = matrix
    species = [row["Species"].split()[0] for row in rows]  # "Adelie Penguin (Pygoscelis adeliae)"
    class_names = sorted(set(species))
    return _dataset("penguins", views, [class_names.index(s) for s in species], class_names)


def diabetes() -> MultiViewData:
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    labels = np.searchsorted(np.quantile(bunch.target, [1 / 3, 2 / 3]), bunch.target, side="right")
    views = {"patient": bunch.data[:, :4], "serum": bunch.data[:, 4:]}
    return _dataset("diabetes", views, labels, ["low", "medium", "high"])


def noise_view() -> MultiViewData:
    signal = synthetic(600, num_classes=4, dims=(8, 8), noise=SYNTHETIC_NOISE, seed=0)
    noise = np.random.default_rng(1).normal(size=(600, 8))
    views = {"signal_a": signal.views["view_0"], "signal_b": signal.views["view_1"], "noise": noise}
    return _dataset("noise_view", views, signal.labels, list(signal.class_names))


def missing_view() -> MultiViewData:
    signal = synthetic(600, num_classes=4, dims=(8, 8, 8), noise=SYNTHETIC_NOISE, seed=0)
    views = dict(zip(("a", "b", "c"), signal.views.values(), strict=True))
    missing = np.random.default_rng(1).permutation(600)[:180]
    views["c"] = views["c"].copy()
    views["c"][missing] = np.nan
    return _dataset("missing_view", views, signal.labels, list(signal.class_names))


DATASETS: dict[str, Callable[[], MultiViewData]] = {
    "breast_cancer": breast_cancer,
    "wine": wine,
    "iris": iris,
    "digits": digits,
    "penguins": penguins,
    "diabetes": diabetes,
    "noise_view": noise_view,
    "missing_view": missing_view,
}


def load(name: str) -> MultiViewData:
    """The data set ``name`` (a key of :data:`DATASETS`), raw features, NaN rows where a view is missing."""
    return DATASETS[name]()


def write_npy_directory(data: MultiViewData, directory: Path, *, split: np.ndarray) -> Path:
    """Write ``data`` as a user brings it to ``python -m training fit``: ``<view>.npy`` per view,
    ``labels.txt`` (class names), ``classes.txt`` (their order) and ``split.txt`` (``split``'s codes into
    :data:`training.data.SPLIT_NAMES`, one per sample, for ``--split-column split``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for view, matrix in data.views.items():
        np.save(directory / f"{view}.npy", matrix)
    names = np.asarray(data.class_names)
    (directory / "labels.txt").write_text("\n".join(names[data.labels]) + "\n")
    (directory / "classes.txt").write_text("\n".join(data.class_names) + "\n")
    (directory / "split.txt").write_text("\n".join(np.asarray(SPLIT_NAMES)[split]) + "\n")
    return directory
