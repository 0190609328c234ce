"""The evaluation protocol, made once (:func:`evaluation_sets`) for experiments, exports and fits: splits,
scaling, and conflictive copies.

The paper's protocol (section 4) evaluates on clean samples and on a *conflictive* copy of them, where one
random view of each sample is replaced by that view of a sample of class ``(y + 1) mod K``; the labels stay.

``heldout`` (experiments' default; exports and fits always)
    Stratified train / validation / test split from the seed (or the user's split column); min-max scaling
    fitted on the training split; each conflictive copy takes its donor views from its own split.
``paper``
    What the authors' code does: scaling fitted on all samples; a random 80/20 split for training and the
    clean test set; the conflictive set is a fresh, independent random 20% of the whole dataset (so about
    80% of it was trained on), each replacement view taken from a fixed prototype of class ``(y + 1) mod K``,
    the first sample of that class in file order.

Missing views: scaling is fitted on the rows that have the view; a missing row is 0 once scaled (finite for
the heads) and masked out everywhere after that (:attr:`Samples.present`). A conflictive copy is made only of
samples with two views or more (one view cannot conflict with anything), replacing one of their present
views with the same view of a donor that has it. On complete data these rules change nothing. Fits and
exports also count as missing a validation or test view far outside its training range
(``out_of_range_above``), as the service fuses it.

Examples
--------
>>> from training.data import synthetic
>>> sets = evaluation_sets(synthetic(60, num_classes=3, seed=0), seed=0)
>>> len(sets.train), len(sets.validation), len(sets.test), len(sets.conflictive["test"])
(42, 6, 12, 12)
>>> [x.shape for x in sets.conflictive["test"].features()]
[(12, 4), (12, 6), (12, 5)]
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np

from training.data import SPLIT_NAMES, DataError, MultiViewData

__all__ = [
    "SPLIT_FRACTIONS",
    "ConflictSource",
    "EvaluationSets",
    "MinMaxScaler",
    "ProtocolName",
    "Samples",
    "conflictive_copy",
    "copies_in_test",
    "squeezed_features",
    "draw_conflicts",
    "evaluation_sets",
    "make_conflictive",
    "stratified_split",
]

ProtocolName = Literal["heldout", "paper"]
ConflictSource = Literal["random", "prototype"]

SPLIT_FRACTIONS = (0.7, 0.1, 0.2)
"""Train, validation and test shares of the ``heldout`` split."""

_CHUNK_BYTES = 1 << 24  # float64 bytes scaled at a time: the temporaries stay small whatever the data


def _chunk_rows(width: int) -> int:
    return max(1, _CHUNK_BYTES // (8 * max(width, 1)))


def stratified_split(
    labels: np.ndarray, *, seed: int, fractions: tuple[float, float, float] = SPLIT_FRACTIONS
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
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        num_val = _share(val_fraction, members.size)
        num_test = _share(test_fraction, members.size)
        num_train = members.size - num_val - num_test
        parts[0].append(members[:num_train])
        parts[1].append(members[num_train : num_train + num_val])
        parts[2].append(members[num_train + num_val :])
    train, val, test = (np.sort(np.concatenate(part)).astype(np.int64) for part in parts)
    return train, val, test


def _share(fraction: float, size: int) -> int:
    # Tolerance so that e.g. 0.1 * 30 == 3.0000000000000004 and 0.7 * 10 == 7.000000000000001 floor as meant.
    return int(np.floor(fraction * size + 1e-9))


def smallest_splittable_class(fractions: tuple[float, float, float] = SPLIT_FRACTIONS) -> int:
    """The fewest samples a class needs for :func:`stratified_split` to put one in the validation and test
    splits (10 with the default fractions).

    >>> smallest_splittable_class()
    10
    """
    size = max(1, math.ceil(1 / min(fraction for fraction in fractions[1:] if fraction > 0)) - 1)
    while min(_share(fraction, size) for fraction in fractions[1:] if fraction > 0) < 1:
        size += 1
    return size


def smallest_class_for_validation(samples: int, num_classes: int) -> int:
    """The fewest samples per class for which :func:`stratified_split` puts ``samples`` in the validation
    split, over ``num_classes`` classes of that size (and one of every class in each split).

    >>> smallest_class_for_validation(5, 2)
    30
    """
    size = smallest_splittable_class()
    while num_classes * _share(SPLIT_FRACTIONS[1], size) < samples:
        size += 1
    return size


@dataclass(frozen=True, eq=False)
class MinMaxScaler:
    """Per-feature min-max scaling of every view to [0, 1], with ranges fitted on one split.

    The paper min-max scales every view; fitting on the training split only keeps the test data out of the
    preprocessing. Features constant on the fitted data carry no information and map to 0 (no division by
    zero); other features of new data may fall outside [0, 1] unless ``clip`` is asked for. Both fitting and
    scaling go a few megabytes at a time, so their float64 temporaries stay small whatever the data.

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
    def fit(
        cls,
        views: Mapping[str, np.ndarray],
        *,
        rows: np.ndarray | None = None,
        present: np.ndarray | None = None,
    ) -> MinMaxScaler:
        """Record each view's per-feature minimum and maximum over ``rows`` of ``views`` ((N, d_v)).

        ``rows`` (default all) are the fitted samples; ``present`` ((N, V) bool) leaves out each view's
        missing rows.
        """
        minimum, maximum = {}, {}
        for v, (name, matrix) in enumerate(views.items()):
            if matrix.ndim != 2:
                raise ValueError(f"view {name!r}: need a non-empty (N, d) matrix, got shape {matrix.shape}")
            picked = np.arange(matrix.shape[0]) if rows is None else np.asarray(rows)
            if present is not None:
                picked = picked[present[picked, v]]
            if picked.size == 0:
                if present is not None and matrix.shape[0]:
                    raise DataError(f"view {name!r} is missing in every training sample: nothing to scale by")
                raise ValueError(f"view {name!r}: need a non-empty (N, d) matrix, got shape {matrix.shape}")
            low = np.full(matrix.shape[1], np.inf)
            high = np.full(matrix.shape[1], -np.inf)
            contiguous = rows is None and present is None
            step = _chunk_rows(matrix.shape[1])
            for start in range(0, picked.size, step):
                stop = start + step
                block = matrix[start:stop] if contiguous else matrix[picked[start:stop]]
                block = np.asarray(block, dtype=np.float64)
                np.minimum(low, block.min(axis=0), out=low)
                np.maximum(high, block.max(axis=0), out=high)
            minimum[name], maximum[name] = low, high
        return cls(minimum=MappingProxyType(minimum), maximum=MappingProxyType(maximum))

    def transform(
        self, views: Mapping[str, np.ndarray], *, clip: bool = False, in_place: bool = False
    ) -> dict[str, np.ndarray]:
        """Scale each view of ``views`` ((M, d_v), the fitted views' names and dims) with the fitted ranges.

        Returns float32 ``(M, d_v)`` matrices in ``views``' order; ``clip`` clamps them to [0, 1].
        ``in_place`` writes them over the inputs (C-contiguous float32 matrices) instead of new arrays,
        for data too large to hold twice.
        """
        scaled = {}
        for name, matrix in views.items():
            low, high = self.minimum[name], self.maximum[name]
            if matrix.ndim != 2 or matrix.shape[1] != low.size:
                raise ValueError(f"view {name!r}: expected (M, {low.size}), got shape {matrix.shape}")
            if in_place and not (matrix.dtype == np.float32 and matrix.flags.c_contiguous):
                raise ValueError(f"view {name!r}: scaling in place needs a C-contiguous float32 matrix")
            out = matrix if in_place else np.empty(matrix.shape, dtype=np.float32)
            span = high - low
            constant = ~(span > 0)
            divisor = np.where(constant, 1.0, span)
            step = _chunk_rows(low.size)
            for start in range(0, matrix.shape[0], step):
                block = np.array(matrix[start : start + step], dtype=np.float64)  # one temporary, reused
                np.subtract(block, low, out=block)
                np.divide(block, divisor, out=block)
                block[:, constant] = 0.0
                if clip:
                    np.clip(block, 0.0, 1.0, out=block)
                out[start : start + step] = block
            scaled[name] = out
        return scaled


# -- conflictive copies --------------------------------------------------------------------------------------


def draw_conflicts(
    labels: np.ndarray,
    *,
    num_views: int,
    rng: np.random.Generator,
    source: ConflictSource = "random",
    pool_indices: np.ndarray | None = None,
    num_classes: int | None = None,
    present: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Which view of each sample a conflictive copy replaces, and which row gives the replacement.

    For every sample ``i``, one view drawn uniformly is to be replaced by the same view of a sample of class
    ``(labels[i] + 1) mod K``, drawn from the candidates ``pool_indices`` (all rows when None). With
    ``present``, only a present view is replaced and only by a donor that has it (redrawn where the first
    draw was not; complete data draws exactly as without it). Where no candidate of that class has that
    view (a view missing for a whole class, or a class without candidates), another present view of the
    sample is replaced, and failing that the donor comes from the class after, and so on.

    Parameters
    ----------
    labels : ndarray of int, shape (N,)
    num_views : int
        V.
    rng : numpy.random.Generator
        Draws the replaced view (and, for ``"random"``, the donor) of every sample.
    source : {"random", "prototype"}
        ``"random"``: a uniformly drawn candidate of the target class. ``"prototype"``: the first candidate
        of the target class in row order, what the authors' code does.
    pool_indices : ndarray of int, optional
        Row indices of the donor candidates.
    num_classes : int, optional
        K; defaults to ``labels.max() + 1``, which is wrong for a subset lacking the last class.
    present : ndarray of bool, shape (N, V), optional
        Which views each row has; None: all.

    Returns
    -------
    replaced_view_index, donors : ndarray of int64, shape (N,)
        The position of the replaced view, and the row its replacement comes from.

    Raises
    ------
    ValueError
        For K < 2, an unknown source, or a sample that no candidate of another class shares a view with.
    """
    if source not in ("random", "prototype"):
        raise ValueError(f"source must be 'random' or 'prototype', got {source!r}")
    if num_views < 1:
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

    replaced = rng.integers(num_views, size=num_samples).astype(np.int64)
    if present is not None:
        for i in np.flatnonzero(~present[np.arange(num_samples), replaced]):
            replaced[i] = rng.choice(np.flatnonzero(present[i]))
    targets = (labels + 1) % k
    donors = np.full(num_samples, -1, dtype=np.int64)  # -1: none yet
    for target in np.unique(targets):
        candidates = pool[labels[pool] == target]
        if candidates.size == 0:
            continue  # drawn elsewhere below
        needing = np.flatnonzero(targets == target)
        if source == "prototype":
            donors[needing] = candidates[0]
        else:
            donors[needing] = candidates[rng.integers(candidates.size, size=needing.size)]
    unmatched = donors < 0
    if present is not None:
        unmatched |= ~present[donors, replaced]  # (a -1 reads the last row: unmatched already)
    for i in np.flatnonzero(unmatched):
        replaced[i], donors[i] = _another_donor(
            i, labels, replaced[i], pool, k, rng=rng, source=source, present=present
        )
    return replaced, donors


def _another_donor(
    i: int,
    labels: np.ndarray,
    replaced: int,
    pool: np.ndarray,
    k: int,
    *,
    rng: np.random.Generator,
    source: ConflictSource,
    present: np.ndarray | None,
) -> tuple[int, int]:
    """The view to replace and the donor of sample ``i`` where the next class has none with view
    ``replaced``: the next class with a candidate having it, trying first ``replaced`` then the sample's other
    present views, class after class."""
    views = [replaced] + [
        int(v)
        for v in (range(len(present[i])) if present is not None else ())
        if v != replaced and present[i, v]
    ]
    for step in range(1, k):
        target = (labels[i] + step) % k
        of_class = pool[labels[pool] == target]
        for view in views:
            candidates = of_class if present is None else of_class[present[of_class, view]]
            if candidates.size:
                return view, int(candidates[0] if source == "prototype" else rng.choice(candidates))
    raise ValueError(
        f"no sample of a class other than {int(labels[i])} shares a view with sample {i} among the "
        "candidates to take a conflicting view from"
    )


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

    :func:`draw_conflicts`, applied: for every sample ``i`` one view, drawn uniformly, is replaced by the
    same view of a sample of class ``(labels[i] + 1) mod K``; the labels stay as they are.

    Parameters
    ----------
    views : mapping of str to ndarray, shape (N, d_v)
        The samples to perturb (and the donors' rows). Not modified.
    labels, rng, source, pool_indices, num_classes
        As for :func:`draw_conflicts`.

    Returns
    -------
    views_conflict : dict of str to ndarray, shape (N, d_v)
        New arrays, in ``views``' order.
    replaced_view_index : ndarray of int64, shape (N,)
        Position (in ``views``' order) of the view replaced in each sample.

    Examples
    --------
    >>> views = {"a": np.array([[0.0], [1.0], [2.0]]), "b": np.array([[10.0], [11.0], [12.0]])}
    >>> conflict, replaced = make_conflictive(
    ...     views, np.array([0, 1, 1]), rng=np.random.default_rng(1), source="prototype"
    ... )
    >>> replaced.tolist(), conflict["a"].ravel().tolist(), conflict["b"].ravel().tolist()
    ([0, 1, 1], [1.0, 1.0, 2.0], [10.0, 10.0, 10.0])
    """
    replaced, donors = draw_conflicts(
        labels,
        num_views=len(views),
        rng=rng,
        source=source,
        pool_indices=pool_indices,
        num_classes=num_classes,
    )
    conflictive = {}
    for position, (name, matrix) in enumerate(views.items()):
        copy = np.array(matrix, copy=True)
        rows = np.flatnonzero(replaced == position)
        copy[rows] = matrix[donors[rows]]
        conflictive[name] = copy
    return conflictive, replaced


# -- the protocol's sets -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Samples:
    """Some rows of the scaled views, in order; in a conflictive copy, one view of each row is another's.

    Features are gathered on demand, a chunk at a time (:meth:`features`), so a split is never held twice.

    Parameters
    ----------
    views : mapping of str to ndarray
        Every sample's scaled features, ``(N, d_v)`` per view.
    rows : ndarray of int64, shape (M,)
        The samples, as rows of ``views``.
    labels : ndarray of int64, shape (M,)
    present : ndarray of bool, shape (M, V), or None
        Which views each sample has; None where all have every view.
    replaced, donors : ndarray of int64, shape (M,), optional
        A conflictive copy: sample ``i``'s view ``replaced[i]`` is row ``donors[i]``'s.
    """

    views: Mapping[str, np.ndarray] = field(repr=False)
    rows: np.ndarray
    labels: np.ndarray
    present: np.ndarray | None = None
    replaced: np.ndarray | None = None
    donors: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def features(self, start: int = 0, stop: int | None = None) -> list[np.ndarray]:
        """Samples ``start:stop``'s features, one new float32 ``(M', d_v)`` array per view."""
        rows = self.rows[start:stop]
        out = []
        for v, matrix in enumerate(self.views.values()):
            block = matrix[rows]
            if self.replaced is not None:
                swap = np.flatnonzero(self.replaced[start:stop] == v)
                block[swap] = matrix[self.donors[start:stop][swap]]
            out.append(block)
        return out


@dataclass(frozen=True, eq=False)
class EvaluationSets:
    """One protocol run's sets for one seed (see the module notes).

    Attributes
    ----------
    protocol : {"heldout", "paper"}
    seed : int
    scaler : MinMaxScaler
        Fitted on the training split (``heldout``) or on everything (``paper``).
    views : dict of str to ndarray
        Every sample's scaled features (0 where a view is missing).
    present : ndarray of bool, shape (N, V), or None
        Which views each sample has; None where the data is complete.
    train, test : Samples
        The training split and the clean test set.
    validation : Samples or None
        The validation split (``heldout`` only).
    conflictive : dict of str to Samples
        Conflictive copies by split name (``"validation"``, ``"test"``), of the splits asked for.
    everything : Samples
        Every sample, in file order.
    """

    protocol: ProtocolName
    seed: int
    scaler: MinMaxScaler
    views: dict[str, np.ndarray] = field(repr=False)
    present: np.ndarray | None
    train: Samples
    validation: Samples | None
    test: Samples
    conflictive: dict[str, Samples]
    everything: Samples


def evaluation_sets(
    data: MultiViewData,
    *,
    protocol: ProtocolName = "heldout",
    seed: int,
    conflictive: Sequence[str] = ("test",),
    in_place: bool = False,
    out_of_range_above: float | None = None,
) -> EvaluationSets:
    """The sets of ``protocol`` for ``seed`` (see the module notes): the one place splits, scaling and
    conflictive copies are made.

    Parameters
    ----------
    data : MultiViewData
    protocol : {"heldout", "paper"}
    seed : int
        Seeds the split, and one generator that draws the conflictive copies in the order of
        ``conflictive``: experiments ask for ``("test",)``, exports and fits for ``("validation", "test")``.
    conflictive : sequence of {"validation", "test"}
        The splits to make conflictive copies of (``paper``: ``("test",)`` only).
    in_place : bool
        Scale ``data``'s own matrices instead of copies (for data too large to hold twice; ``data`` holds
        the scaled features afterwards).
    out_of_range_above : float, optional
        ``heldout`` only: a view of a validation or test sample whose range excess is above this (computed
        by :func:`training.export.range_excess_session`, the exported head's own float32 arithmetic) is
        missing from there on, as the served model fuses it (the manifest's ``out_of_range``), so that what a
        fit measures is what the service answers. Its features stay as they are. None: every view the data
        has is present.

    Raises
    ------
    DataError
        A class too small to split, or, with the data's split column, a split lacking a class.
    """
    if protocol == "heldout":
        return _heldout_sets(
            data, seed=seed, conflictive=conflictive, in_place=in_place, out_of_range_above=out_of_range_above
        )
    if protocol == "paper":
        if data.split is not None:
            raise DataError("the paper's protocol draws its own split: leave out the split column")
        if tuple(conflictive) != ("test",):
            raise ValueError(f"protocol 'paper' makes a conflictive test set only, not {tuple(conflictive)}")
        if out_of_range_above is not None:
            raise ValueError(
                "out_of_range_above is for the 'heldout' protocol: the paper's scales on every sample"
            )
        return _paper_sets(data, seed=seed, in_place=in_place)
    raise ValueError(f"unknown protocol {protocol!r}; expected 'heldout' or 'paper'")


def _heldout_sets(
    data: MultiViewData,
    *,
    seed: int,
    conflictive: Sequence[str],
    in_place: bool,
    out_of_range_above: float | None,
) -> EvaluationSets:
    """``heldout``: the data's own split or a stratified one; scaled on the training split."""
    present = None if data.complete else data.present
    if data.split is not None:
        train, validation, test = _user_split(data)
    else:
        _check_class_sizes(data)
        train, validation, test = stratified_split(data.labels, seed=seed)
    if present is not None:
        _check_views_in_training(data, train)
    scaler = MinMaxScaler.fit(data.views, rows=train, present=present)
    beyond = None
    if out_of_range_above is not None:
        # On the raw features, before scaling (in place, it overwrites them), as the served heads see them.
        held_out = np.concatenate([validation, test])
        beyond = _beyond_range(data.views, scaler, rows=held_out, above=out_of_range_above)
    scaled = _scaled(data, scaler, present, in_place=in_place)
    if beyond is not None and any(picked.size for picked in beyond):
        present = (
            np.ones((data.num_samples, len(data.view_names)), bool) if present is None else present.copy()
        )
        for v, picked in enumerate(beyond):
            present[picked, v] = False
    samples = _Sampler(scaled, data.labels, present)
    rng = np.random.default_rng(seed)
    splits = {"validation": validation, "test": test}
    copies = {
        split: conflictive_copy(samples(splits[split]), rng=rng, num_classes=data.num_classes)
        for split in conflictive  # in this order: one generator draws them all
    }
    return _assembled("heldout", seed, scaler, samples, copies, train=train, validation=validation, test=test)


def _paper_sets(data: MultiViewData, *, seed: int, in_place: bool) -> EvaluationSets:
    """``paper``: scaled on every sample, an 80/20 split without validation, and a conflictive test set of
    prototype swaps drawn over the whole data, 20% of the samples (those with two views or more)."""
    present = None if data.complete else data.present
    scaler = MinMaxScaler.fit(data.views, present=present)
    samples = _Sampler(_scaled(data, scaler, present, in_place=in_place), data.labels, present)
    rng = np.random.default_rng(seed)
    n = data.num_samples
    order = rng.permutation(n)
    train, test = order[: int(0.8 * n)], order[int(0.8 * n) :]
    picked = rng.choice(n, size=int(0.2 * n), replace=False)
    if present is not None:
        picked = picked[present[picked].sum(axis=1) >= 2]
    replaced, donors = draw_conflicts(
        data.labels,
        num_views=len(data.view_names),
        rng=rng,
        source="prototype",
        num_classes=data.num_classes,
        present=present,
    )
    copies = {"test": samples(picked, replaced=replaced[picked], donors=donors[picked])}
    return _assembled("paper", seed, scaler, samples, copies, train=train, validation=None, test=test)


def _scaled(
    data: MultiViewData, scaler: MinMaxScaler, present: np.ndarray | None, *, in_place: bool
) -> dict[str, np.ndarray]:
    """``data``'s views scaled, each missing view's rows zero."""
    scaled = scaler.transform(data.views, in_place=in_place)
    if present is not None:
        for v, matrix in enumerate(scaled.values()):
            matrix[~present[:, v]] = 0.0
    return scaled


@dataclass(frozen=True)
class _Sampler:
    """Makes :class:`Samples` of rows of the scaled views, with their labels and views present."""

    views: dict[str, np.ndarray]
    labels: np.ndarray
    present: np.ndarray | None

    def __call__(self, rows: np.ndarray, **conflict: np.ndarray) -> Samples:
        mask = None if self.present is None else self.present[rows]
        return Samples(self.views, rows, self.labels[rows], mask, **conflict)


def _assembled(
    protocol: ProtocolName,
    seed: int,
    scaler: MinMaxScaler,
    samples: _Sampler,
    conflictive: dict[str, Samples],
    *,
    train: np.ndarray,
    validation: np.ndarray | None,
    test: np.ndarray,
) -> EvaluationSets:
    return EvaluationSets(
        protocol=protocol,
        seed=seed,
        scaler=scaler,
        views=samples.views,
        present=samples.present,
        train=samples(train),
        validation=None if validation is None else samples(validation),
        test=samples(test),
        conflictive=conflictive,
        everything=samples(np.arange(len(samples.labels))),
    )


def _beyond_range(
    views: Mapping[str, np.ndarray], scaler: MinMaxScaler, *, rows: np.ndarray, above: float
) -> list[np.ndarray]:
    """Per view, the ``rows`` whose raw features' range excess is above ``above`` or not a number: the
    service's rule, on the float32 ``range_excess`` of the view's exported head
    (:func:`training.export.range_excess_session`), so that a view at the threshold is missing in the fit
    exactly where the service leaves it out (float64 here disagreed within float32's rounding of it)."""
    from training.export import range_excess_session  # export builds on this module's scaler

    beyond = []
    for name, matrix in views.items():
        session = range_excess_session(scaler.minimum[name], scaler.maximum[name])
        step = _chunk_rows(matrix.shape[1])  # a chunk of rows at a time: the splits may be most of the data
        chunks = []
        for picked in np.array_split(rows, range(step, rows.size, step)):
            features = np.asarray(matrix[picked], np.float32)
            [excess] = session.run(["range_excess"], {"features": features})
            chunks.append(picked[~(excess <= above)])
        beyond.append(np.concatenate(chunks))
    return beyond


SQUEEZE = 0.01
"""A feature is squeezed when the middle 98% of its training values spans less than this share of its
min-max range: a few outliers stretch the range, and scaled to [0, 1] the rest is a sliver."""


def squeezed_features(sets: EvaluationSets, *, rows: int = 2000) -> dict[str, tuple[int, int]]:
    """Per view with any, how many of its features are squeezed by outliers (:data:`SQUEEZE`), and how
    many it has, on up to ``rows`` training samples (evenly spaced). A feature whose middle 98% is one
    value (sparse counts, a rare flag) is not squeezed: its bulk is a point, not a range to resolve.

    >>> spikes = np.linspace(0, 0.001, 1000)
    >>> spikes[::200] = 1.0  # 0.5% of the samples far out
    >>> sensor = np.stack([spikes, np.linspace(0, 1, 1000)], axis=1).astype(np.float32)
    >>> labels = np.arange(1000) % 2
    >>> data = MultiViewData(views={"sensor": sensor}, labels=labels, class_names=("a", "b"), name="toy")
    >>> squeezed_features(evaluation_sets(data, seed=0))
    {'sensor': (1, 2)}
    """
    train = sets.train
    picked = train.rows[np.linspace(0, len(train) - 1, min(rows, len(train))).astype(np.int64)]
    present = None if sets.present is None else sets.present[picked]
    found = {}
    for v, (name, matrix) in enumerate(sets.views.items()):
        block = np.asarray(matrix[picked if present is None else picked[present[:, v]]], dtype=np.float64)
        if block.shape[0] < 100:  # too few for a 1st and 99th percentile
            continue
        low, high = np.quantile(block, [0.01, 0.99], axis=0)
        middle = high - low
        squeezed = int(((middle > 0) & (middle < SQUEEZE)).sum())
        if squeezed:
            found[name] = (squeezed, block.shape[1])
    return found


def duplicated_views(sets: EvaluationSets) -> list[tuple[str, str]]:
    """The pairs of views holding the same scaled features in every training sample (a view given twice,
    or once more in other units: scaling makes the copies equal), in view order.

    >>> image = np.arange(40, dtype=np.float32).reshape(20, 2)
    >>> views = {"image": image, "pixels": image * 1000, "other": image[::-1].copy()}
    >>> data = MultiViewData(views=views, labels=np.arange(20) % 2, class_names=("a", "b"), name="toy")
    >>> duplicated_views(evaluation_sets(data, seed=0))
    [('image', 'pixels')]
    """
    rows = sets.train.rows
    names = list(sets.views)
    found = []
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a, b = sets.views[first], sets.views[second]
            if a.shape == b.shape and _equal_rows(a, b, rows):
                found.append((first, second))
    return found


def _equal_rows(a: np.ndarray, b: np.ndarray, rows: np.ndarray) -> bool:
    """Whether scaled ``a`` and ``b`` hold the same values in ``rows`` (NaN equal to NaN; within float32's
    rounding of scaling, for a copy in other units), a chunk at a time."""
    step = _chunk_rows(a.shape[1])
    return all(
        np.allclose(a[chunk], b[chunk], rtol=0.0, atol=1e-6, equal_nan=True)
        for chunk in (rows[start : start + step] for start in range(0, rows.size, step))
    )


def copies_in_test(sets: EvaluationSets) -> int:
    """How many clean test samples are exact copies (every view's features, missing ones too) of a training
    or validation sample: their test figures measure memory, not generalisation.

    Rows are compared by a 64-bit digest of each view's bytes, a chunk of rows at a time (no copy of the
    data is sorted); two different rows share one with a chance of about 2**-64.
    """

    def digests(rows: np.ndarray) -> np.ndarray:
        combined = np.zeros(rows.size, dtype=np.uint64)
        for v, matrix in enumerate(sets.views.values()):
            step = _chunk_rows(matrix.shape[1])
            for start in range(0, rows.size, step):
                block = np.ascontiguousarray(matrix[rows[start : start + step]])
                keys = [hashlib.blake2b(row.tobytes(), digest_size=8, person=b"view%d" % v) for row in block]
                combined[start : start + step] ^= np.array(
                    [int.from_bytes(key.digest(), "little") for key in keys], dtype=np.uint64
                )
        return combined

    fitted = sets.train.rows
    if sets.validation is not None:
        fitted = np.concatenate([fitted, sets.validation.rows])
    return int(np.isin(digests(sets.test.rows), digests(fitted)).sum())


def conflictive_copy(samples: Samples, *, rng: np.random.Generator, num_classes: int) -> Samples:
    """The ``heldout`` protocol's conflictive copy of clean ``samples``: of those with two views or more (one
    view has nothing to conflict with), each has one present view replaced by the same view of a sample of
    the next class among them that has it (:func:`draw_conflicts`)."""
    keep = np.arange(len(samples))
    if samples.present is not None:
        keep = keep[samples.present.sum(axis=1) >= 2]
    rows, present = samples.rows[keep], None if samples.present is None else samples.present[keep]
    replaced, donors = draw_conflicts(
        samples.labels[keep],
        num_views=len(samples.views),
        rng=rng,
        source="random",
        num_classes=num_classes,
        present=present,
    )
    return Samples(samples.views, rows, samples.labels[keep], present, replaced=replaced, donors=rows[donors])


def _check_class_sizes(data: MultiViewData) -> None:
    needed = smallest_splittable_class()
    counts = np.bincount(data.labels, minlength=data.num_classes)
    small = np.flatnonzero(counts < needed)
    if small.size:
        k = int(small[0])
        shares = ", ".join(
            f"{name} ({fraction:.0%})"
            for name, fraction in zip(SPLIT_NAMES[1:], SPLIT_FRACTIONS[1:], strict=True)
        )
        more = f" ({small.size - 1} other classes too)" if small.size > 1 else ""
        raise DataError(
            f"{data.source or data.name}: class {data.class_names[k]!r} has {int(counts[k])} samples{more}; "
            f"at least {needed} per class are needed to put one in each of the {shares} splits"
        )


def _check_views_in_training(data: MultiViewData, train: np.ndarray) -> None:
    """A :class:`DataError` for a view none of whose samples is in the training split: its head would learn
    nothing, and scaling it nothing to scale by (the scaler's own error named neither file nor rows)."""
    trained = data.present[train].any(axis=0)
    for name, has, present in zip(data.view_names, trained, data.present.T, strict=True):
        if has:
            continue
        rows = np.flatnonzero(present)
        shown = ", ".join(str(row) for row in rows[:5]) + (", ..." if rows.size > 5 else "")
        if data.split is not None:
            where, fix = "the split column puts", "put some of them in train"
        else:
            where, fix = "the random split put", "give the view more samples"
        raise DataError(
            f"{data.source or data.name}: view {name!r} is in {rows.size} samples (rows {shown}), and "
            f"{where} none of them in train: its head would have nothing to learn from; {fix}, or leave the "
            "view out (--views)"
        )


def _user_split(data: MultiViewData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = tuple(np.flatnonzero(data.split == code).astype(np.int64) for code in range(len(SPLIT_NAMES)))
    for name, rows in zip(SPLIT_NAMES, parts, strict=True):
        counts = np.bincount(data.labels[rows], minlength=data.num_classes)
        if (counts == 0).any():
            k = int(np.argmax(counts == 0))
            raise DataError(
                f"{data.source or data.name}: the split column puts no sample of class "
                f"{data.class_names[k]!r} in {name}; every class needs one in each of "
                f"{', '.join(SPLIT_NAMES)}"
            )
    return parts
