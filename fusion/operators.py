"""Fusion operators over the views of an opinion batch: BCF, CBF, BAF, GBAF and DBF.

Every operator takes an :class:`~fusion.Opinion` with belief ``(..., V, K)`` and uncertainty ``(..., V)``
and returns the fused opinion, belief ``(..., K)`` and uncertainty ``(...)``. Equation numbers refer to
Bezirganyan et al., AISTATS 2025: (3) pairwise belief averaging, (6) generalised belief averaging,
(11) discounting, (13)-(14) the discount factors, Algorithm 1 DBF; BCF and CBF follow Josang,
*Subjective Logic* (2016), 12.3-12.4.

Conventions shared by all operators:

* ``mask`` (bool, ``(..., V)``, True where present): a missing view is fused exactly as if it were absent,
  and whatever it holds is never read. A sample with no view present fuses to the vacuous opinion
  (belief 0, uncertainty 1).
* Dogmatic views (``u = 0``) follow Josang's limit: the dogmatic opinions are averaged, ``u = 0``.
* BCF and BAF are left folds in view order (BAF is order-dependent by definition, Proposition 1); CBF, GBAF
  and DBF are order-invariant.
"""

from __future__ import annotations

from typing import Literal, get_args

from fusion._array import Array, as_floating, namespace, sum_last
from fusion.conflict import checked_lambda, conflict_matrix, discount_factors
from fusion.opinion import FusedOpinion, Opinion, checked_mask, discount, vacuous_where_missing

# The registry of fusion methods: every other list of them (the manifest's schema, the service's request
# grammar and OpenAPI, the training command line) derives from this one. A new method adds its name here and
# its operator to _OPERATORS below (with its oracle in fusion.reference and its tests).
Method = Literal["bcf", "cbf", "baf", "gbaf", "dbf"]
METHODS: tuple[str, ...] = get_args(Method)


def fuse(
    opinion: Opinion, /, method: Method = "dbf", *, lam: float = 1.0, mask: Array | None = None, xp=None
) -> FusedOpinion:
    """Fuse the V views of each sample into one opinion, and report their conflict and discounts.

    Parameters
    ----------
    opinion : Opinion
        belief (..., V, K), uncertainty (..., V): one opinion per view.
    method : {"bcf", "cbf", "baf", "gbaf", "dbf"}
        Belief constraint (Dempster, TMC), cumulative, pairwise belief averaging (ECML), generalised belief
        averaging, or discounted belief fusion.
    lam : float
        DBF's strictness lambda > 0 (Eq. 14); larger forgives small conflicts. Checked, but unused, by the
        other methods.
    mask : bool array, shape (..., V), optional
        True where the view is present (see the module notes).
    xp : namespace, optional
        Array namespace; inferred from the opinion when omitted.

    Returns
    -------
    FusedOpinion
        belief (..., K), uncertainty (...), probability (..., K), conflict (..., V, V) (the degree-of-conflict
        matrix, 0 in rows/columns of missing views) and discount (..., V) (DBF's eta; ones for other methods
        and for missing views).

    Examples
    --------
    The paper's Table 2: two confident modalities that disagree.

    >>> import numpy as np
    >>> views = Opinion(np.array([[0.99, 0.0, 0.01], [0.0, 0.99, 0.01]]), np.array([0.0, 0.0]))
    >>> out = fuse(views, "dbf", lam=1.0)
    >>> out.belief.round(4).tolist(), round(float(out.uncertainty), 4), out.discount.round(4).tolist()
    ([0.005, 0.005, 0.0001], 0.99, [0.01, 0.01])
    >>> fuse(views, "cbf").belief.round(4).tolist()
    [0.495, 0.495, 0.01]

    Evidence from evidential heads, with the second view of the second sample missing:

    >>> from fusion import opinion_from_evidence
    >>> evidence = np.array([[[9.0, 0.0], [8.0, 1.0]], [[0.0, 5.0], [7.0, 7.0]]])  # (N=2, V=2, K=2)
    >>> out = fuse(opinion_from_evidence(evidence), mask=np.array([[True, True], [True, False]]))
    >>> out.probability.argmax(-1).tolist()
    [0, 1]
    """
    if method not in _OPERATORS:
        raise ValueError(f"unknown fusion method {method!r}; expected one of {', '.join(METHODS)}")
    lam = checked_lambda(lam)
    xp, opinion, mask = _check(opinion, mask, xp)
    opinion = vacuous_where_missing(opinion, mask, xp=xp)
    conflict = conflict_matrix(opinion, xp=xp)
    if method == "dbf":
        eta = discount_factors(conflict, lam=lam, xp=xp)
        fused = _average(discount(opinion, eta), mask, xp)
    else:
        eta = xp.ones_like(opinion.uncertainty)
        fused = _OPERATORS[method](opinion, mask, xp)
    return FusedOpinion(belief=fused.belief, uncertainty=fused.uncertainty, conflict=conflict, discount=eta)


def bcf(opinion: Opinion, /, *, mask: Array | None = None, xp=None) -> Opinion:
    """Belief constraint fusion (Dempster's rule, as in TMC), a left fold over the views.

    Two opinions combine as ``b_k = (b1_k b2_k + b1_k u2 + b2_k u1) / (1 - C)``, ``u = u1 u2 / (1 - C)``, with
    ``C`` the mass on disjoint class pairs. ``1 - C`` is computed as the sum of the non-negative numerators
    rather than by subtraction, so near-total conflict keeps ``sum b + u = 1``.

    At total conflict (``1 - C = 0``, e.g. two dogmatic opinions on disjoint classes) Dempster's rule is
    undefined; the pair then fuses to the vacuous opinion (belief 0, uncertainty 1): no usable information.
    """
    xp, opinion, mask = _check(opinion, mask, xp)
    return _bcf(vacuous_where_missing(opinion, mask, xp=xp), mask, xp)


def cbf(opinion: Opinion, /, *, mask: Array | None = None, xp=None) -> Opinion:
    """Cumulative belief fusion (as in TMDOA): evidence adds up, ``e = sum_v e^v``; order-invariant.

    ``b = sum_v b^v prod_{i!=v} u^i / D``, ``u = prod_v u^v / D`` with
    ``D = sum_v prod_{i!=v} u^i - (V - 1) prod_v u^v``; dogmatic views are averaged.
    """
    xp, opinion, mask = _check(opinion, mask, xp)
    return _cbf(vacuous_where_missing(opinion, mask, xp=xp), mask, xp)


def baf(opinion: Opinion, /, *, mask: Array | None = None, xp=None) -> Opinion:
    """Belief averaging fusion (as in ECML): Eq. 3 applied pairwise, left to right.

    Order-dependent (Proposition 1): in evidence terms each new view gets weight 1/2 and everything fused
    before it is halved, so evidence 3, 5, 10 fuses to 7, and 10, 5, 3 to 5.25.
    """
    xp, opinion, mask = _check(opinion, mask, xp)
    return _baf(vacuous_where_missing(opinion, mask, xp=xp), mask, xp)


def gbaf(opinion: Opinion, /, *, mask: Array | None = None, xp=None) -> Opinion:
    """Generalised belief averaging fusion (Eq. 6): all views at once, evidence ``e = mean_v e^v``.

    The fused uncertainty is the harmonic mean of the views' (Proposition 2).
    """
    xp, opinion, mask = _check(opinion, mask, xp)
    return _average(vacuous_where_missing(opinion, mask, xp=xp), mask, xp)


def dbf(opinion: Opinion, /, *, lam: float = 1.0, mask: Array | None = None, xp=None) -> Opinion:
    """Discounted belief fusion (Algorithm 1): discount each view by its agreement with the others, then GBAF.

    See :func:`fuse` for the conflict matrix and discount factors that go with the result.
    """
    out = fuse(opinion, "dbf", lam=lam, mask=mask, xp=xp)
    return Opinion(belief=out.belief, uncertainty=out.uncertainty)


# --- the arithmetic; inputs are checked and missing views already vacuous ----------------------------------


def _averaging_weights(u: Array, mask: Array | None, xp) -> tuple[Array, Array]:
    """Eq. 6's weights ``prod_{i!=v} u^i``, rescaled to ``w_v = u_min / u_v`` in [0, 1].

    The factor ``u_min / prod_i u^i`` cancels in every averaging and cumulative formula; it keeps the weights
    of order one (the raw products underflow for several confident views) and gives Josang's dogmatic limit
    exactly: ``w = 1`` for views with ``u = 0`` and ``0`` for the others.
    Returns ``(w (..., V), u_min (...))``.
    """
    u_min = xp.min(u, axis=-1, keepdims=True)  # missing views hold u = 1 >= any u: they never set the minimum
    positive = u > 0
    w = xp.where(positive, u_min / xp.where(positive, u, xp.ones_like(u)), xp.ones_like(u))
    if mask is not None:
        w = xp.where(mask, w, xp.zeros_like(w))
    return w, u_min[..., 0]


def _average(opinion: Opinion, mask: Array | None, xp) -> Opinion:
    # Eq. 6 with w_v = u_min / u_v: b = sum_v w_v b^v / sum_v w_v,  u = n u_min / sum_v w_v  (n views present)
    b, u = opinion.belief, opinion.uncertainty
    w, u_min = _averaging_weights(u, mask, xp)
    total = sum_last(w, xp)  # >= 1 where any view is present: the least uncertain one has w = 1
    if mask is None:
        inverse = 1 / total
        return Opinion(
            belief=_weighted_views(w * inverse[..., None], b), uncertainty=u.shape[-1] * u_min * inverse
        )
    some = total != 0  # not 'total > 0': a NaN view must give NaN, not the vacuous no-view answer
    inverse = 1 / xp.where(some, total, xp.ones_like(total))
    count = sum_last(xp.astype(mask, u.dtype), xp)
    return Opinion(
        belief=_weighted_views(w * inverse[..., None], b),  # all-zero weights where no view is present
        uncertainty=xp.where(some, count * u_min * inverse, xp.ones_like(total)),
    )


def _weighted_views(weights: Array, belief: Array) -> Array:
    """``sum_v weights_v belief^v``: ``(..., V), (..., V, K) -> (..., K)``, as a matmul (BLAS, autograd)."""
    return (weights[..., None, :] @ belief)[..., 0, :]


def _cbf(opinion: Opinion, mask: Array | None, xp) -> Opinion:
    # b = sum_v w_v b^v / D,  u = u_min / D, with D = sum_v w_v - (n - 1) u_min computed as the sum of the
    # non-negative numerators (no cancellation). No view present: w = 0, u_min = 1, so D = 1 and the result
    # is vacuous without a special case.
    b, u = opinion.belief, opinion.uncertainty
    w, u_min = _averaging_weights(u, mask, xp)
    numerator = _weighted_views(w, b)
    inverse = 1 / (sum_last(numerator, xp) + u_min)
    return Opinion(belief=numerator * inverse[..., None], uncertainty=u_min * inverse)


def _dempster_pair(b1: Array, u1: Array, b2: Array, u2: Array, xp) -> tuple[Array, Array]:
    belief = b1 * b2 + b1 * u2[..., None] + b2 * u1[..., None]
    uncertainty = u1 * u2
    total = xp.sum(belief, axis=-1) + uncertainty  # = 1 - C
    defined = total != 0  # not 'total > 0': a NaN view must give NaN, not the vacuous total-conflict answer
    safe = xp.where(defined, total, xp.ones_like(total))
    return (
        xp.where(defined[..., None], belief / safe[..., None], xp.zeros_like(belief)),
        xp.where(defined, uncertainty / safe, xp.ones_like(total)),
    )


def _averaging_pair(b1: Array, u1: Array, b2: Array, u2: Array, xp) -> tuple[Array, Array]:
    pair = Opinion(belief=xp.stack((b1, b2), axis=-2), uncertainty=xp.stack((u1, u2), axis=-1))
    fused = _average(pair, None, xp)  # Eq. 3 is Eq. 6 with V = 2
    return fused.belief, fused.uncertainty


def _fold(opinion: Opinion, mask: Array | None, pair, xp) -> Opinion:
    b, u = opinion.belief, opinion.uncertainty
    acc_b, acc_u = b[..., 0, :], u[..., 0]
    if mask is None:
        for v in range(1, u.shape[-1]):
            acc_b, acc_u = pair(acc_b, acc_u, b[..., v, :], u[..., v], xp)
        return Opinion(belief=acc_b, uncertainty=acc_u)
    # Skip missing views; the fold starts at each sample's first present view (acc is vacuous until then).
    started = mask[..., 0]
    for v in range(1, u.shape[-1]):
        vb, vu = b[..., v, :], u[..., v]
        pb, pu = pair(acc_b, acc_u, vb, vu, xp)
        nb = xp.where(started[..., None], pb, vb)
        nu = xp.where(started, pu, vu)
        present = mask[..., v]
        acc_b = xp.where(present[..., None], nb, acc_b)
        acc_u = xp.where(present, nu, acc_u)
        started = started | present
    return Opinion(belief=acc_b, uncertainty=acc_u)


def _bcf(opinion: Opinion, mask: Array | None, xp) -> Opinion:
    return _fold(opinion, mask, _dempster_pair, xp)


def _baf(opinion: Opinion, mask: Array | None, xp) -> Opinion:
    return _fold(opinion, mask, _averaging_pair, xp)


_OPERATORS = {"bcf": _bcf, "cbf": _cbf, "baf": _baf, "gbaf": _average, "dbf": None}  # dbf: fuse() itself
assert tuple(_OPERATORS) == METHODS, "every method of the registry has its operator, in the same order"


def _check(opinion: Opinion, mask: Array | None, xp):
    """The namespace, the opinion in floating point (integer one-hot opinions are promoted as integer
    evidence is), and the checked mask; ValueError for shapes that are not (..., V, K) and (..., V)."""
    b, u = opinion.belief, opinion.uncertainty
    xp = namespace(b, u, xp=xp)
    if b.ndim < 2 or b.shape[-2] == 0 or b.shape[-1] == 0:
        raise ValueError(
            f"belief must have shape (..., V, K) with V >= 1 views and K >= 1 classes, got {tuple(b.shape)}"
        )
    if tuple(u.shape) != tuple(b.shape[:-1]):
        raise ValueError(
            f"uncertainty must have shape {tuple(b.shape[:-1])} (belief's without K), got {tuple(u.shape)}"
        )
    if not (xp.isdtype(b.dtype, "real floating") and xp.isdtype(u.dtype, "real floating")):
        opinion = Opinion(belief=as_floating(b, xp), uncertainty=as_floating(u, xp))
    return xp, opinion, checked_mask(mask, u, xp=xp)
