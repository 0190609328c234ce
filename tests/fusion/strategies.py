"""Hypothesis strategies for opinions and evidence, as numpy float64 arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fusion import Opinion, opinion_from_evidence

# Evidence the heads can produce: zero, ordinary, and up to the capped exponential's 1e13.
evidence_values = st.one_of(
    st.floats(0, 1e3, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1e-6, 1e6, 1e13]),
)


@st.composite
def evidence(draw, *, views=st.integers(1, 5), classes=st.integers(2, 5), batch=st.integers(1, 3)):
    """Evidence of shape (B, V, K)."""
    shape = (draw(batch), draw(views), draw(classes))
    return draw(hnp.arrays(np.float64, shape, elements=evidence_values))


@st.composite
def opinions(draw, **kwargs):
    """Opinions from finite evidence, so never dogmatic: (B, V, K) / (B, V)."""
    return opinion_from_evidence(draw(evidence(**kwargs)))


@st.composite
def masks(draw, shape):
    return draw(hnp.arrays(np.bool_, shape))


def take_views(op: Opinion, keep: np.ndarray) -> Opinion:
    """The sub-opinion of the views in ``keep`` (an index array over V)."""
    return Opinion(op.belief[..., keep, :], op.uncertainty[..., keep])
