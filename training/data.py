"""A multi-view dataset in memory: what every reader (:mod:`training.readers`) produces and everything after
reading (:mod:`training.protocol`, training, export, the model card) consumes.

One float32 ``(N, d_v)`` matrix per view and int64 labels ``0 .. K-1`` with their class names. A view missing
for a sample is a row of NaN in that view's matrix (the readers guarantee a row is either all NaN or all
finite, and that every sample has at least one view); :attr:`MultiViewData.present` is the ``(N, V)`` mask.

Examples
--------
>>> data = synthetic(60, num_classes=3, seed=0)
>>> data.view_names, data.view_dims, data.class_names
(('view_0', 'view_1', 'view_2'), (4, 6, 5), ('class_0', 'class_1', 'class_2'))
>>> bool(data.present.all()), data.missing_rates()
(True, {'view_0': 0.0, 'view_1': 0.0, 'view_2': 0.0})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from training.registry import DEFAULT_HYPERPARAMETERS, DatasetSpec

__all__ = ["SPLIT_NAMES", "DataError", "MultiViewData", "synthetic"]

SPLIT_NAMES = ("train", "validation", "test")
"""The splits a user's split column may assign, by code (0, 1, 2)."""


class DataError(ValueError):
    """Input data that cannot make a model; the message names the file, column or view, and row."""


@dataclass(frozen=True, eq=False)
class MultiViewData:
    """A multi-view dataset: aligned per-view feature matrices, class labels and class names.

    Parameters
    ----------
    views : dict of str to ndarray
        One float32 ``(N, d_v)`` matrix per view, in the dataset's view order; row ``i`` of every view
        describes sample ``i``, and is all NaN where the sample lacks that view.
    labels : ndarray of int64, shape (N,)
        Class indices ``0 .. K-1``.
    class_names : tuple of str
        Names of the classes in label order.
    name : str
        What the data is called (a registry name, or the file or directory it was read from).
    spec : DatasetSpec, optional
        The registry's spec where the data is a benchmark dataset (its hyperparameters, sources).
    split : ndarray of int8, shape (N,), optional
        A user-assigned split per sample, as codes into :data:`SPLIT_NAMES`; None: split by the protocol.
    source : str
        Where the data was read from, for messages and the model card.
    """

    views: dict[str, np.ndarray]
    labels: np.ndarray
    class_names: tuple[str, ...]
    name: str
    spec: DatasetSpec | None = field(default=None, repr=False)
    split: np.ndarray | None = field(default=None, repr=False)
    source: str = ""

    def __post_init__(self) -> None:
        if self.labels.ndim != 1:
            raise ValueError(f"{self.name}: labels must be 1-D, got shape {self.labels.shape}")
        for name, matrix in self.views.items():
            if matrix.ndim != 2 or matrix.shape[0] != self.labels.shape[0]:
                raise ValueError(
                    f"{self.name}: view {name!r} has shape {matrix.shape}, expected "
                    f"({self.labels.shape[0]}, d) to match the labels"
                )
        if self.split is not None and self.split.shape != self.labels.shape:
            raise ValueError(f"{self.name}: split of shape {self.split.shape} for {self.labels.size} labels")

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def view_names(self) -> tuple[str, ...]:
        return tuple(self.views)

    @property
    def view_dims(self) -> tuple[int, ...]:
        return tuple(int(matrix.shape[1]) for matrix in self.views.values())

    @cached_property
    def present(self) -> np.ndarray:
        """``(N, V)`` bool: whether sample ``i`` has view ``v`` (its row is not NaN)."""
        if not self.views:
            return np.ones((self.num_samples, 0), dtype=bool)
        return np.stack([~np.isnan(matrix[:, 0]) for matrix in self.views.values()], axis=1)

    @property
    def complete(self) -> bool:
        """Whether every sample has every view."""
        return bool(self.present.all())

    def missing_rates(self) -> dict[str, float]:
        """Per view, the share of samples lacking it."""
        missing = 1.0 - self.present.mean(axis=0) if self.num_samples else np.zeros(len(self.views))
        return {name: float(rate) for name, rate in zip(self.views, missing, strict=True)}

    def take(self, indices: np.ndarray) -> MultiViewData:
        """The samples at ``indices`` (shape (M,)), in that order, as a new dataset of the same classes."""
        return MultiViewData(
            views={name: matrix[indices] for name, matrix in self.views.items()},
            labels=self.labels[indices],
            class_names=self.class_names,
            name=self.name,
            spec=self.spec,
            split=None if self.split is None else self.split[indices],
            source=self.source,
        )


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
        float32 views, int64 labels, named ``"synthetic"``, with a spec carrying the default hyperparameters.

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
    class_names = tuple(f"class_{k}" for k in range(num_classes))
    spec = DatasetSpec(
        name="synthetic",
        file_name=None,
        label_key=None,
        view_names=tuple(views),
        class_names=class_names,
        num_samples=n,
        view_dims=tuple(dims),
        licence="generated",
        hyperparameters=DEFAULT_HYPERPARAMETERS,
    )
    return MultiViewData(
        views=views, labels=labels, class_names=class_names, name="synthetic", spec=spec, source="generated"
    )
