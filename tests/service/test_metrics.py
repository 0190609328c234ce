"""Bulk histogram observation gives exactly what one ``observe`` per value gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from service.metrics import observe_many

BUCKETS = (0.05, 0.1, 0.5, 1.0)


def samples(histogram: Histogram) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in histogram.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


VALUES = st.lists(
    st.one_of(
        st.floats(0, 1.5, allow_nan=False),
        st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0, 2.0, float("nan")]),  # bounds, beyond, and NaN
    ),
    max_size=50,
)


@given(per_histogram=st.lists(VALUES, min_size=1, max_size=5))
def test_observe_many_equals_observe_one_by_one(per_histogram):
    """Several histograms at once (some with no values), each as if each value were observed alone."""
    registry = CollectorRegistry()
    one = Histogram("one", "d", ["model", "h"], buckets=BUCKETS, registry=registry)
    bulk = Histogram("bulk", "d", ["model", "h"], buckets=BUCKETS, registry=registry)
    arrays = [np.asarray(values, dtype=np.float32) for values in per_histogram]  # as the service has them
    for h, values in enumerate(arrays):
        child = one.labels("m", str(h))
        for value in values.tolist():
            child.observe(value)
    observe_many([bulk.labels("m", str(h)) for h in range(len(arrays))], arrays)
    got = {(name.replace("bulk", "one"), labels): v for (name, labels), v in samples(bulk).items()}
    expected = samples(one)
    assert got.keys() == expected.keys()
    for key, value in expected.items():  # bucket counts exactly; the sum up to its order of addition
        if key[0].endswith("_sum"):
            assert got[key] == pytest.approx(value, abs=1e-9, nan_ok=True), key
        else:
            assert got[key] == value, key
