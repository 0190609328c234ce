"""Backend plumbing: which array namespace an input lives in, and the one kernel that differs by backend.

Everything else in :mod:`fusion` is written once against the Python array API standard; this module is
the only place that knows numpy from torch.
"""

from __future__ import annotations

import functools
from typing import Any

import array_api_compat
import array_api_compat.numpy as _compat_numpy
import numpy as _numpy

Array = Any
"""An array-API array: :class:`numpy.ndarray`, :class:`torch.Tensor`, anything array-api-compat knows."""

# Above this many pairwise elements (batch x V x V x K) numpy's broadcast, which runs its innermost loop over
# the short class axis, loses to a class-major loop over view pairs with long contiguous rows (measured at
# V=6, K=10 float32: the crossover lies between batches of 64 and 128; timings in docs/benchmarks.md).
_NUMPY_BROADCAST_LIMIT = 1 << 15
_NUMPY_IS_ARRAY_API = _numpy.lib.NumpyVersion(_numpy.__version__) >= "2.1.0"


def namespace(*arrays: Array, xp: Any = None) -> Any:
    """The array namespace of ``arrays``, or ``xp`` when given.

    numpy >= 2.1 implements the array API in its own namespace: it is used as is, since array-api-compat's
    pure-Python wrappers cost more than the arithmetic on small batches. Other libraries (torch) get
    array-api-compat's wrapper.
    """
    if xp is not None:
        return xp
    xp = array_api_compat.array_namespace(*arrays)
    if xp is _compat_numpy and _NUMPY_IS_ARRAY_API:
        return _numpy
    return xp


def as_floating(x: Array, xp: Any) -> Array:
    """``x`` unchanged if it is real floating, else cast to the namespace's default float."""
    if xp.isdtype(x.dtype, "real floating"):
        return x
    return xp.astype(x, xp.float64 if xp is _numpy or array_api_compat.is_numpy_namespace(xp) else xp.float32)


def sum_last(x: Array, xp: Any) -> Array:
    """Sum over the last axis, ``(..., K) -> (...)``; with numpy, a float row's terms added in order
    (:func:`_numpy_sum_in_order`; integers sum exactly in any order); other backends use their own ``sum``."""
    if xp is _numpy and x.dtype.kind == "f" and x.ndim >= 1 and x.size:
        return _numpy_sum_in_order(x)
    return xp.sum(x, axis=-1)


def _numpy_sum_in_order(x: Any) -> Any:
    """``x[..., 0] + x[..., 1] + ...`` in that order, whatever the batch: a sample's answer must not
    depend on what it was batched with (the service micro-batches requests). A BLAS matrix-vector
    product, quicker, sums a row in an order that depends on its place in the batch and the batch's size
    (OpenBLAS's kernels take rows four at a time), and numpy's own reduction over a contiguous row is
    pairwise. Reduced over its first axis, a classes-by-rows copy adds the classes one after another for
    every row at once, as the class-major pairwise kernel does; a lone row, whose reduction numpy would
    take pairwise again, is summed cumulatively (sequential by definition)."""
    k = x.shape[-1]
    rows = _numpy.reshape(x, (-1, k))
    if rows.shape[0] == 1:
        return _numpy.cumsum(x, axis=-1)[..., -1]
    return _numpy.add.reduce(_numpy.ascontiguousarray(rows.T), axis=0).reshape(x.shape[:-1])


def sum_of_the_others(x: Array, xp: Any) -> Array:
    """For each row of the second-to-last axis, the sum of the other rows: ``(..., V, K) -> (..., V, K)``.

    The rows before it plus the rows after it, never the total minus the row: one row can be orders of
    magnitude above the others, and the difference of two large sums would lose theirs. numpy gets the
    fewest calls (these batches are small, and its calls' fixed cost dominates); other backends the
    array API's cumulative sums.
    """
    v = x.shape[-2]
    if xp is _numpy and v >= 2:
        before = _numpy.cumsum(x, axis=-2)  # inclusive: row i holds rows 0..i
        after = _numpy.cumsum(x[..., ::-1, :], axis=-2)[..., ::-1, :]  # row i holds rows i..V-1
        out = _numpy.empty_like(x)
        out[..., 0, :] = after[..., 1, :]
        out[..., -1, :] = before[..., -2, :]
        _numpy.add(before[..., :-2, :], after[..., 2:, :], out=out[..., 1:-1, :])
        return out
    before = xp.cumulative_sum(x, axis=-2, include_initial=True)[..., :-1, :]
    reversed_sums = xp.cumulative_sum(xp.flip(x, axis=-2), axis=-2, include_initial=True)
    return before + xp.flip(reversed_sums[..., :-1, :], axis=-2)


def pairwise_l1(x: Array, xp: Any) -> Array:
    """Pairwise L1 distances between the rows of ``x``: ``(..., V, K) -> (..., V, V)``.

    Uses the backend's native kernel where it has one: ``torch.cdist`` for float32/float64 (a training step is
    faster with it than with the broadcast; it has first-order gradients only, so no
    double backward or forward-mode AD through the conflict matrix). numpy has none, so it gets the faster
    of two vectorised forms for the size at hand; everything else gets the broadcast.
    """
    if array_api_compat.is_torch_namespace(xp):
        import torch  # only reached when the input already is a torch tensor

        if x.dtype in (torch.float32, torch.float64):
            if not x.requires_grad:
                return torch.cdist(x, x, p=1.0)
            # cdist(x, x) takes its backward pass twice, once per argument. The matrix is symmetric, so one
            # pass with the gradient's symmetric part does: d + d^T - d is d to the bit, and carries G + G^T
            # into the first argument's backward alone.
            distance = torch.cdist(x, x.detach(), p=1.0)
            return distance + distance.transpose(-1, -2) - distance.detach()
    if xp is _numpy or array_api_compat.is_numpy_namespace(xp):
        x = _numpy.asarray(x)
        v = x.shape[-2]
        if x.size * v > _NUMPY_BROADCAST_LIMIT and v > 1:
            return _numpy_pairwise_l1_class_major(x)
        # Only the upper triangle: the matrix is symmetric with a zero diagonal (15 of 36 pairs for V = 6).
        upper, lower = _upper_triangle(v)
        diff = x[..., upper, :] - x[..., lower, :]
        _numpy.abs(diff, out=diff)
        distance = sum_last(diff, _numpy)
        out = _numpy.zeros((*x.shape[:-1], v), dtype=x.dtype)
        out[..., upper, lower] = distance
        out[..., lower, upper] = distance
        return out
    return xp.sum(xp.abs(x[..., :, None, :] - x[..., None, :, :]), axis=-1)


@functools.cache
def _upper_triangle(v: int) -> tuple[Any, Any]:
    return _numpy.triu_indices(v, 1)


def _numpy_pairwise_l1_class_major(x: Any) -> Any:
    np = _numpy
    v, k = x.shape[-2], x.shape[-1]
    rows = x.reshape(-1, v, k)
    # (V, K, N): every view's class row is then a long contiguous vector.
    rows = np.ascontiguousarray(np.moveaxis(rows, 0, -1))
    out = np.zeros((rows.shape[-1], v, v), dtype=x.dtype)  # written in the caller's layout: stays contiguous
    diff = np.empty(rows.shape[1:], dtype=x.dtype)
    distance = np.empty(rows.shape[-1], dtype=x.dtype)  # reducing straight into a strided slice is slower
    for i in range(v):
        for j in range(i + 1, v):  # the matrix is symmetric with a zero diagonal
            np.subtract(rows[i], rows[j], out=diff)
            np.abs(diff, out=diff)
            np.add.reduce(diff, axis=0, out=distance)
            out[:, i, j] = distance
            out[:, j, i] = distance
    return out.reshape((*x.shape[:-1], v))
