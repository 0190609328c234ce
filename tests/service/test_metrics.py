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


@given(
    values=st.lists(
        st.one_of(st.floats(0, 1.5, allow_nan=False), st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0, 2.0])),
        max_size=50,
    )
)
def test_observe_many_equals_observe_one_by_one(values):
    registry = CollectorRegistry()
    one = Histogram("one", "d", ["model"], buckets=BUCKETS, registry=registry).labels("m")
    bulk = Histogram("bulk", "d", ["model"], buckets=BUCKETS, registry=registry).labels("m")
    values32 = np.asarray(values, dtype=np.float32)  # as the service observes them
    for value in values32.tolist():
        one.observe(value)
    observe_many(bulk, values32)
    got = {(name.replace("bulk", "one"), labels): v for (name, labels), v in samples(bulk).items()}
    expected = samples(one)
    assert got.keys() == expected.keys()
    for key, value in expected.items():  # bucket counts exactly; the sum up to its order of addition
        assert got[key] == (pytest.approx(value, abs=1e-9) if key[0].endswith("_sum") else value), key
