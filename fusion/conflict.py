"""Conflict between opinions and the discount factors DBF derives from it.

Equation numbers refer to Bezirganyan et al., AISTATS 2025: (12) degree of conflict, (13) conflict matrix and
discount factor, (14) agreement with lambda. Missing views enter as vacuous opinions: zero conflict with
every view (their rows and columns are 0) and discount 1.
"""

from __future__ import annotations

import array_api_compat

from fusion._array import Array, as_floating, namespace, pairwise_l1
from fusion.opinion import Opinion, checked_mask, projected_probability, vacuous_where_missing


def projected_distance(a: Opinion, b: Opinion, /, *, xp=None) -> Array:
    """``PD = sum_k |P^a_k - P^b_k| / 2`` in [0, 1] (Eq. 12); broadcasts over leading axes, shape (...)."""
    pa, pb = projected_probability(a), projected_probability(b)
    xp = namespace(pa, pb, xp=xp)
    # Projected probabilities sum to 1 only up to rounding: without the clip, an ulp above 1 in float32.
    return xp.clip(xp.sum(xp.abs(pa - pb), axis=-1) / 2, 0, 1)


def conjunctive_certainty(a: Opinion, b: Opinion, /) -> Array:
    """``CC = (1 - u^a)(1 - u^b)`` in [0, 1] (Eq. 12), shape (...)."""
    return (1 - a.uncertainty) * (1 - b.uncertainty)


def degree_of_conflict(a: Opinion, b: Opinion, /, *, xp=None) -> Array:
    """``DC = PD x CC`` between two (batches of) opinions (Eq. 12).

    High only when both opinions are confident and their projected probabilities differ.

    Examples
    --------
    The paper's Table 2 modalities: two dogmatic opinions that disagree on nearly everything.

    >>> import numpy as np
    >>> a = Opinion(np.array([0.99, 0.0, 0.01]), np.array(0.0))
    >>> b = Opinion(np.array([0.0, 0.99, 0.01]), np.array(0.0))
    >>> round(float(degree_of_conflict(a, b)), 6)
    0.99
    """
    return projected_distance(a, b, xp=xp) * conjunctive_certainty(a, b)


def conflict_matrix(opinion: Opinion, /, *, mask: Array | None = None, xp=None) -> Array:
    """Degree of conflict between every pair of views, ``C_ij = DC(w^i, w^j)`` (Eq. 13).

    Parameters
    ----------
    opinion : Opinion
        belief (..., V, K), uncertainty (..., V).
    mask : bool array, shape (..., V), optional
        True where the view is present; rows and columns of missing views are 0.

    Returns
    -------
    array, shape (..., V, V)
        Symmetric, zero diagonal, values in [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> views = Opinion(np.array([[0.9, 0.0], [0.0, 0.9], [0.9, 0.0]]), np.array([0.1, 0.1, 0.1]))
    >>> conflict_matrix(views).round(4).tolist()
    [[0.0, 0.729, 0.0], [0.729, 0.0, 0.729], [0.0, 0.729, 0.0]]
    """
    opinion = vacuous_where_missing(opinion, checked_mask(mask, opinion.uncertainty, xp=xp), xp=xp)
    p = projected_probability(opinion)
    xp = namespace(p, xp=xp)
    certainty = 1 - as_floating(opinion.uncertainty, xp)  # torch's matmul takes no integer-float mix
    # CC for every pair as an outer product (a matmul: no slow broadcast over the short V axis), with PD's
    # 1/2 folded in: C_ij = (sum_k |p^i_k - p^j_k|) x (1 - u^i)(1 - u^j) / 2   (Eq. 12)
    half_certainty = certainty[..., :, None] @ (certainty / 2)[..., None, :]
    conflict = pairwise_l1(p, xp) * half_certainty
    # Projected probabilities sum to 1 only up to rounding: keep C in [0, 1] so that C^lambda stays real.
    return xp.clip(conflict, 0, 1)


def agreement(conflict: Array, /, *, lam: float = 1.0, xp=None) -> Array:
    """Agreement ``A = (1 - C^lambda)^(1/lambda)`` (Eq. 14); ``lambda = 1`` gives Eq. 13's ``A = 1 - C``.

    Larger ``lambda`` forgives small conflicts (agreement grows with lambda for every C in [0, 1]).
    The gradient is finite everywhere: at ``C = 0`` (where ``C^lambda`` has an infinite slope for
    ``lambda < 1``) and at ``C^lambda = 1`` it is taken as 0.

    Examples
    --------
    >>> import numpy as np
    >>> agreement(np.array([0.0, 0.5, 0.99]), lam=3.0).round(4).tolist()
    [1.0, 0.9565, 0.3097]
    """
    lam = checked_lambda(lam)
    xp = namespace(conflict, xp=xp)
    if lam == 1.0:
        return 1 - conflict
    # An exponent beyond the dtype's range acts as infinity does (x ** e is 0 for x below 1): taken at the
    # dtype's largest, it is not cast to infinity, which numpy warns of. (lambda or 1 / lambda.)
    largest = float(xp.finfo(conflict.dtype).max)
    power, root = min(lam, largest), min(1 / lam, largest)
    one = xp.ones_like(conflict)
    positive = conflict > 0
    powered = xp.where(positive, xp.where(positive, conflict, one) ** power, 0 * conflict)
    rest = 1 - powered
    alive = rest > 0
    return xp.where(alive, xp.where(alive, rest, one) ** root, 0 * rest)


def checked_lambda(lam: float) -> float:
    """``lam`` as a Python float (a numpy scalar would change the result's dtype); must be in (0, inf)."""
    lam = float(lam)
    if not 0 < lam < float("inf"):
        raise ValueError(f"lambda must be a positive finite number, got {lam!r}")
    return lam


def discount_factors(conflict: Array, /, *, lam: float = 1.0, xp=None) -> Array:
    """DBF's reliability per view, ``eta^v = prod_i A_vi`` (Eq. 13 with Eq. 14's agreement).

    Parameters
    ----------
    conflict : array, shape (..., V, V)
        A conflict matrix (:func:`conflict_matrix`).
    lam : float
        Strictness; lower discounts more.

    Returns
    -------
    array, shape (..., V)
        In [0, 1]; 1 for a view that conflicts with none.
    """
    a = agreement(conflict, lam=lam, xp=xp)
    if a.shape[-1] > 2 and array_api_compat.is_torch_array(a):
        # Under autograd each column picked below would take back a gradient the size of the whole matrix:
        # cubic in the views. The product's own gradient is quadratic.
        return a.prod(dim=-1)
    eta = a[..., 0]
    for i in range(1, a.shape[-1]):  # unrolled over the few views: faster than numpy's prod(axis=-1)
        eta = eta * a[..., i]
    return eta
