"""The cross-validation folds every choice in :mod:`calibration` is made on."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def cross_validation_folds(n: int, /, *, folds: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(fit, held_out)`` index pairs of a shuffled ``folds``-fold split of ``range(n)``.

    Every index is held out exactly once; the same ``n``, ``folds`` and ``seed`` give the same folds.

    Examples
    --------
    >>> [(fit.tolist(), held.tolist()) for fit, held in cross_validation_folds(4, folds=2, seed=0)]
    [([1, 3], [0, 2]), ([0, 2], [1, 3])]
    """
    if not 2 <= folds <= n:
        raise ValueError(f"cross-validation needs 2 <= folds <= n samples, got folds={folds}, n={n}")
    order = np.random.default_rng(seed).permutation(n)
    for held_out in np.array_split(order, folds):
        fit = np.setdiff1d(order, held_out)  # sorted
        yield fit, np.sort(held_out)


__all__ = ["cross_validation_folds"]
