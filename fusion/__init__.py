"""Subjective-logic fusion of per-view evidential opinions, as in Discounted Belief Fusion (AISTATS 2025).

Pure functions over numpy arrays and torch tensors alike (any array-API namespace); no I/O, no state.

>>> import numpy as np
>>> from fusion import fuse, opinion_from_evidence
>>> # (N=1, V=2, K=3): two confident views that disagree
>>> evidence = np.array([[[40.0, 0.0, 0.0], [0.0, 40.0, 0.0]]])
>>> out = fuse(opinion_from_evidence(evidence), "dbf")
>>> float(out.uncertainty[0]) > 0.5, out.conflict.shape, out.discount.shape
(True, (1, 2, 2), (1, 2))
"""

from fusion.conflict import (
    agreement,
    conflict_matrix,
    conjunctive_certainty,
    degree_of_conflict,
    discount_factors,
    projected_distance,
)
from fusion.operators import METHODS, Method, baf, bcf, cbf, dbf, fuse, gbaf
from fusion.opinion import (
    FusedOpinion,
    Opinion,
    agrees_with_the_others,
    discount,
    evidence_from_opinion,
    opinion_from_evidence,
    projected_probability,
    top_class_of_the_others,
    vacuous_where_missing,
)

__all__ = [
    "METHODS",
    "FusedOpinion",
    "Method",
    "Opinion",
    "agreement",
    "agrees_with_the_others",
    "baf",
    "bcf",
    "cbf",
    "conflict_matrix",
    "conjunctive_certainty",
    "dbf",
    "degree_of_conflict",
    "discount",
    "discount_factors",
    "evidence_from_opinion",
    "fuse",
    "gbaf",
    "opinion_from_evidence",
    "projected_distance",
    "projected_probability",
    "top_class_of_the_others",
    "vacuous_where_missing",
]
