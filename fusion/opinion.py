"""Subjective-logic opinions over K classes with a uniform base rate, and their Dirichlet evidence.

Equation numbers refer to Bezirganyan et al., "Discounted Belief Fusion", AISTATS 2025 (``shared/paper``):
(2) is the opinion <-> Dirichlet mapping, (11) Shafer's discounting.
"""

from __future__ import annotations

from dataclasses import dataclass

import array_api_compat
import numpy as np

from fusion._array import Array, as_floating, namespace, sum_last, sum_of_the_others


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
    if evidence.ndim == 0 or evidence.shape[-1] == 0:
        shape = tuple(evidence.shape)
        raise ValueError(f"evidence must have shape (..., K) with K >= 1 classes, got {shape}")
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
    if xp is np and u.all():  # no dogmatic opinion (none comes from finite evidence): the plain ratio
        return k * b / u
    dogmatic = u == 0  # not 'u <= 0' or '~(u > 0)': a NaN uncertainty gives NaN evidence, never infinite
    finite = k * b / xp.where(dogmatic, xp.ones_like(u), u)
    return xp.where(dogmatic, xp.where(b > 0, xp.asarray(float("inf"), dtype=b.dtype), 0 * b), finite)


def projected_probability(opinion: Opinion, /, *, xp=None) -> Array:
    """Projected probability ``P_k = b_k + a_k u`` with the uniform base rate ``a_k = 1/K`` (section 3.1).

    Returns
    -------
    array, shape (..., K)
        Sums to 1 over the last axis.
    """
    b, u = opinion.belief, opinion.uncertainty
    return b + (u / b.shape[-1])[..., None]


def top_class_of_the_others(views: Opinion, /, *, mask: Array | None = None, xp=None) -> Array:
    """For each view, the top class of the other views fused cumulatively: the argmax of their evidence
    summed (BCF's fused evidence, section 3.3), the views outside ``mask`` left out. Ties, and views with no
    other, go to the lowest class.

    The sums exclude the view by adding the views before it to those after it, never by subtracting it
    from the total: one view's evidence can be orders of magnitude above the others', and a difference of
    two large float32 sums would lose theirs.

    Parameters
    ----------
    views : Opinion
        Each view's opinion, belief (..., V, K) and uncertainty (..., V).
    mask : array of bool, shape (..., V), optional
        The views fused (default: all); broadcast to the views' shape. TypeError if not boolean.

    Returns
    -------
    array of int, shape (..., V)

    Examples
    --------
    >>> import numpy as np
    >>> from fusion import opinion_from_evidence
    >>> views = opinion_from_evidence(np.array([[[9.0, 1.0], [2.0, 3.0], [1.0, 4.0]]]))
    >>> top_class_of_the_others(views).tolist()  # view 0 against [3, 7]; view 1 against [10, 5]
    [[1, 0, 0]]
    """
    b = views.belief
    xp = namespace(b, views.uncertainty, xp=xp)
    mask = checked_mask(mask, views.uncertainty, xp=xp)
    evidence = evidence_from_opinion(views, xp=xp)
    if mask is not None:
        evidence = xp.where(mask[..., None], evidence, xp.zeros_like(evidence))
    return xp.argmax(sum_of_the_others(evidence, xp), axis=-1)


def agrees_with_the_others(views: Opinion, /, *, mask: Array | None = None, xp=None) -> tuple[Array, Array]:
    """Whether each view's top class is that of the other views fused cumulatively
    (:func:`top_class_of_the_others`), and where that is measured: the view fused beside another.

    A label-free sign of a failing view, whichever view the fused answer follows: a view shuffled between
    samples, stuck, or turned to noise agrees with the others at the chance level of two unrelated answers;
    sound views at a rate a model measures on clean data (the manifest's ``view_agreement``). With two views
    the two agree or disagree together: which one failed cannot be told.

    Parameters
    ----------
    views : Opinion
        Each view's opinion, belief (..., V, K) and uncertainty (..., V).
    mask : array of bool, shape (..., V), optional
        The views fused (default: all); broadcast to the views' shape. TypeError if not boolean.

    Returns
    -------
    agrees : array of bool, shape (..., V)
        The view's top class (that of its belief, as of its projected probability) is the others'; False
        where it is not compared.
    compared : array of bool, shape (..., V)
        The view is fused, and at least one other is.

    Examples
    --------
    >>> import numpy as np
    >>> from fusion import opinion_from_evidence
    >>> views = opinion_from_evidence(np.array([[[9.0, 1.0], [2.0, 3.0], [1.0, 4.0]]]))
    >>> agrees, compared = agrees_with_the_others(views, mask=np.array([[True, True, False]]))
    >>> agrees.tolist(), compared.tolist()  # views 0 and 1 against each other alone
    ([[False, False, False]], [[True, True, False]])
    """
    b = views.belief
    xp = namespace(b, views.uncertainty, xp=xp)
    mask = checked_mask(mask, views.uncertainty, xp=xp)  # boolean, the views' shape: 'compared' is too
    if mask is None:  # every view fused: each beside the others, if there are others
        compared = xp.full(b.shape[:-1], b.shape[-2] > 1, dtype=xp.bool, device=array_api_compat.device(b))
    else:
        fused = xp.astype(mask, xp.int32)
        compared = mask & (xp.sum(fused, axis=-1, keepdims=True) - fused > 0)
    agrees = (xp.argmax(b, axis=-1) == top_class_of_the_others(views, mask=mask, xp=xp)) & compared
    return agrees, compared


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
