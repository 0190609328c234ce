"""Hypothesis strategies for fused opinions and probability matrices, as numpy float64 arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fusion import fuse, opinion_from_evidence
from tests.fusion.strategies import evidence

temperatures = st.floats(1e-6, 1e3, allow_nan=False, allow_infinity=False)
coverages = st.floats(0.01, 0.99, allow_nan=False)


@st.composite
def fused_opinions(draw, *, classes=st.integers(2, 6), batch=st.integers(1, 8)):
    """DBF's fused opinion of random evidence: belief (N, K), uncertainty (N,)."""
    fused = fuse(opinion_from_evidence(draw(evidence(classes=classes, batch=batch))), "dbf")
    return fused.belief, fused.uncertainty


@st.composite
def probabilities(draw, *, classes=st.integers(2, 6), batch=st.integers(1, 12)):
    """Rows on the probability simplex, (N, K), ties and zeros included."""
    shape = (draw(batch), draw(classes))
    weights = draw(
        hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0, 1))
    )
    weights[:, 0] += weights.sum(axis=1) == 0  # no all-zero row
    return weights / weights.sum(axis=1, keepdims=True)


@st.composite
def sorted_scores(draw, *, low=0.0, high=1.0, size=st.integers(1, 60)):
    """Ascending calibration scores, (n,)."""
    values = draw(hnp.arrays(np.float64, draw(size), elements=st.floats(low, high)))
    return np.sort(values)
