"""The cross-validation folds every choice in :mod:`calibration` is made on (and training's cross-fitting)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt


def cross_validation_folds(
    n: int, /, *, folds: int, seed: int, strata: npt.ArrayLike | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(fit, held_out)`` index pairs of a shuffled ``folds``-fold split of ``range(n)``.

    Every index is held out exactly once; the same ``n``, ``folds`` and ``seed`` give the same folds. With
    ``strata`` (n labels), each stratum's indices are shuffled and dealt to the folds in turn, one stratum
    after another: every fold gets a share of each stratum, and fold sizes differ by at most one.

    Examples
    --------
    >>> [(fit.tolist(), held.tolist()) for fit, held in cross_validation_folds(4, folds=2, seed=0)]
    [([1, 3], [0, 2]), ([0, 2], [1, 3])]
    >>> strata = [0, 0, 0, 0, 1, 1]
    >>> [held.tolist() for _, held in cross_validation_folds(6, folds=2, seed=0, strata=strata)]
    [[1, 2, 5], [0, 3, 4]]
    """
    if not 2 <= folds <= n:
        raise ValueError(f"cross-validation needs 2 <= folds <= n samples, got folds={folds}, n={n}")
    rng = np.random.default_rng(seed)
    if strata is None:
        parts = np.array_split(rng.permutation(n), folds)
    else:
        labels = np.asarray(strata)
        order = np.concatenate([rng.permutation(np.flatnonzero(labels == s)) for s in np.unique(labels)])
        parts = [order[k::folds] for k in range(folds)]
    everything = np.arange(n)
    for held_out in parts:
        yield np.setdiff1d(everything, held_out), np.sort(held_out)


__all__ = ["cross_validation_folds"]
