"""Subjective-logic opinions over K classes with a uniform base rate, and their Dirichlet evidence.

Equation numbers refer to Bezirganyan et al., "Discounted Belief Fusion", AISTATS 2025 (``shared/paper``):
(2) is the opinion <-> Dirichlet mapping, (11) Shafer's discounting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusion._array import Array, as_floating, namespace, sum_last


@dataclass(frozen=True, slots=True)
class Opinion:
    """A batch of multinomial opinions ``(b, u)`` with uniform base rate ``1/K``.

    Parameters
    ----------
    belief : array, shape (..., K)
        Belief mass per class, ``b_k >= 0``.
    uncertainty : array, shape (...)
        Uncertainty mass, ``u >= 0``; additivity: ``sum_k b_k + u = 1``.

    Examples
    --------
    A dogmatic opinion (``u = 0``), which no finite evidence can express, built directly:

    >>> import numpy as np
    >>> op = Opinion(belief=np.array([0.99, 0.0, 0.01]), uncertainty=np.array(0.0))
    >>> op.probability.tolist()
    [0.99, 0.0, 0.01]
    """

    belief: Array
    uncertainty: Array

    @property
    def num_classes(self) -> int:
        return self.belief.shape[-1]

    @property
    def probability(self) -> Array:
        """Projected probability, shape (..., K); see :func:`projected_probability`."""
        return projected_probability(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class FusedOpinion(Opinion):
    """The result of :func:`fusion.fuse`: a fused opinion plus what explains it.

    Parameters
    ----------
    belief : array, shape (..., K)
    uncertainty : array, shape (...)
    conflict : array, shape (..., V, V)
        Degree-of-conflict matrix of the input views (:func:`fusion.conflict_matrix`).
    discount : array, shape (..., V)
        DBF's discount factor ``eta`` per view; ones for the other methods and for missing views.
    """

    conflict: Array
    discount: Array


def opinion_from_evidence(evidence: Array, /, *, xp=None) -> Opinion:
    """Opinion of a Dirichlet with parameters ``alpha = evidence + 1`` (Eq. 2).

    Parameters
    ----------
    evidence : array, shape (..., K)
        Non-negative, finite evidence per class (e.g. ``(N, V, K)`` for N samples of V views).
    xp : namespace, optional
        Array namespace; inferred from ``evidence`` when omitted.

    Returns
    -------
    Opinion
        ``belief = e / S`` (..., K) and ``uncertainty = K / S`` (...), with ``S = sum_k e_k + K``.

    Examples
    --------
    >>> import numpy as np
    >>> op = opinion_from_evidence(np.array([[3.0, 1.0], [0.0, 0.0]]))
    >>> op.belief.tolist(), op.uncertainty.tolist()
    ([[0.5, 0.16666666666666666], [0.0, 0.0]], [0.3333333333333333, 1.0])
    """
    xp = namespace(evidence, xp=xp)
    evidence = as_floating(evidence, xp)
    k = evidence.shape[-1]
    inverse_strength = 1 / (sum_last(evidence, xp) + k)  # 1 / S, S = sum_k (e_k + 1)   (Eq. 2)
    return Opinion(
        belief=evidence * inverse_strength[..., None],  # b_k = e_k / S                (Eq. 2)
        uncertainty=k * inverse_strength,  # u = K / S                                  (Eq. 2)
    )


def evidence_from_opinion(opinion: Opinion, /, *, xp=None) -> Array:
    """Evidence ``e_k = K b_k / u`` of an opinion, the inverse of :func:`opinion_from_evidence` (Eq. 2).

    Dogmatic opinions (``u = 0``) map to infinite evidence for their believed classes (``inf``; ``0`` where
    ``b_k = 0``).

    Examples
    --------
    >>> import numpy as np
    >>> evidence_from_opinion(Opinion(np.array([0.5, 0.25]), np.array(0.25))).tolist()
    [4.0, 2.0]
    """
    b, u = opinion.belief, opinion.uncertainty
    xp = namespace(b, u, xp=xp)
    k = b.shape[-1]
    u = u[..., None]
    positive = u > 0
    finite = k * b / xp.where(positive, u, xp.ones_like(u))
    return xp.where(positive, finite, xp.where(b > 0, xp.asarray(float("inf"), dtype=b.dtype), 0 * b))


def projected_probability(opinion: Opinion, /, *, xp=None) -> Array:
    """Projected probability ``P_k = b_k + a_k u`` with the uniform base rate ``a_k = 1/K`` (section 3.1).

    Returns
    -------
    array, shape (..., K)
        Sums to 1 over the last axis.
    """
    b, u = opinion.belief, opinion.uncertainty
    return b + (u / b.shape[-1])[..., None]


def top_class_agreement(views: Opinion, fused: Opinion, /, *, xp=None) -> Array:
    """Whether each view's top class is the fused opinion's: the argmax of its projected probability
    ``b + u/K`` (section 3.1), which is that of its belief, ``u/K`` being added to every class alike.

    A label-free sign of a failing view: on clean data each view agrees with the fused answer at a rate its
    model measures (the manifest's ``view_agreement``); a view broken within its range agrees far less.
    Ties go to the lowest class, for the views and the fused opinion alike.

    Parameters
    ----------
    views : Opinion
        Each view's opinion, belief (..., V, K).
    fused : Opinion
        The fused opinion, belief (..., K).

    Returns
    -------
    array of bool, shape (..., V)

    Examples
    --------
    >>> import numpy as np
    >>> views = Opinion(np.array([[[0.6, 0.1], [0.1, 0.5]]]), np.array([[0.3, 0.4]]))
    >>> top_class_agreement(views, Opinion(np.array([[0.5, 0.2]]), np.array([0.3]))).tolist()
    [[True, False]]
    """
    xp = namespace(views.belief, fused.belief, xp=xp)
    return xp.argmax(views.belief, axis=-1) == xp.argmax(fused.belief, axis=-1)[..., None]


def discount(opinion: Opinion, eta: Array, /) -> Opinion:
    """Shafer's discounting by reliability ``eta``: ``b' = eta b``, ``u' = 1 - eta + eta u`` (Eq. 11).

    Parameters
    ----------
    opinion : Opinion
        belief (..., K), uncertainty (...).
    eta : array, shape (...)
        ``1`` keeps the opinion, ``0`` makes it vacuous.

    Examples
    --------
    >>> import numpy as np
    >>> op = discount(Opinion(np.array([0.8, 0.0]), np.array(0.2)), np.array(0.5))
    >>> op.belief.tolist(), op.uncertainty.tolist()
    ([0.4, 0.0], 0.6)
    """
    return Opinion(
        belief=eta[..., None] * opinion.belief,
        uncertainty=(1 - eta) + eta * opinion.uncertainty,
    )


def checked_mask(mask: Array | None, uncertainty: Array, /, *, xp=None) -> Array | None:
    """``mask`` as a boolean array of the opinion's namespace, device and shape ``(..., V)`` (broadcast).

    Raises TypeError for a non-boolean mask and ValueError for one that does not broadcast to ``(..., V)``.
    """
    if mask is None:
        return None
    xp = namespace(uncertainty, xp=xp)
    if not hasattr(mask, "dtype") or namespace(mask) is not xp:  # a list, or another library's (CPU) array
        mask = xp.asarray(np.asarray(mask), device=getattr(uncertainty, "device", None))
    if mask.dtype != xp.bool:
        raise TypeError(f"mask must be boolean (True where the view is present), got {mask.dtype}")
    try:
        return xp.broadcast_to(mask, uncertainty.shape)
    except (ValueError, RuntimeError) as error:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not fit views {tuple(uncertainty.shape)}"
        ) from error


def vacuous_where_missing(opinion: Opinion, mask: Array | None, /, *, xp=None) -> Opinion:
    """Replace the opinions of missing views (``mask`` False) by the vacuous opinion (``b = 0``, ``u = 1``).

    Whatever a missing view holds (zeros, NaN, stale values) is then never read. A vacuous view has zero
    conjunctive certainty, hence zero conflict with every view, which is how missing views enter the
    conflict matrix.
    """
    if mask is None:
        return opinion
    b, u = opinion.belief, opinion.uncertainty
    xp = namespace(b, u, xp=xp)
    return Opinion(
        belief=xp.where(mask[..., None], b, xp.zeros_like(b)),
        uncertainty=xp.where(mask, u, xp.ones_like(u)),
    )
