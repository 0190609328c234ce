"""Bulk histogram observation gives exactly what one ``observe`` per value gives; scrapes share renderings
of the metrics text, never one from before they asked; what a scrape gets is what the reference lists."""

from __future__ import annotations

import asyncio
import itertools
import re
import time

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from docs import generate
from service import metrics
from service.metrics import observe_many
from tests.service.conftest import MODELS, serving

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


def test_a_flood_of_scrapes_shares_renderings_none_from_before_it_asked(monkeypatch):
    """Rendering the text holds the GIL (13 ms for the committed models' series): the attack probe's 77
    scrapes a second, each rendered, took /health's p99 from 7 to 280 ms. 50 scrapes at once share at most
    two renderings (the first may begin before the others ask); a scrape after them gets a new one;
    renderings are at least the interval apart."""
    began: list[float] = []

    def render() -> bytes:
        began.append(time.monotonic())
        return str(len(began)).encode()

    async def inline(function):  # rendered at once, not after a thread's start: began is when it was decided
        return function()

    monkeypatch.setattr(metrics, "exposition", render)
    monkeypatch.setattr(metrics.anyio.to_thread, "run_sync", inline)

    async def scrapes() -> tuple[list[bytes], bytes]:
        exposition = metrics.Exposition(min_interval=0.1)
        flood = await asyncio.gather(*(exposition.text() for _ in range(50)))
        return flood, await exposition.text()

    flood, later = asyncio.run(scrapes())
    renderings = [int(text) for text in flood]
    assert renderings == sorted(renderings) and set(renderings) <= {1, 2}  # in turn, at most two for 50
    assert int(later) == len(began) == max(renderings) + 1  # asked after them all: a rendering of its own
    assert all(b - a >= 0.1 for a, b in itertools.pairwise(began))


def test_every_series_a_scrape_gets_is_in_the_metrics_reference():
    """docs/operations/metrics.md lists each series by name (generated from the registry): prometheus-client
    also exposed a ``*_created`` gauge beside every counter and histogram child, 250 series with the
    committed models that no list named and that --workers N did not expose."""
    with serving(MODELS) as url:
        text = httpx.get(url + "/metrics").text
    exposed = {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line.startswith("dbf_")
    }
    documented = set(re.findall(r"`(dbf_[a-z_]+)`", generate.metrics_table()))
    assert "dbf_predictions_total" in exposed and exposed <= documented, sorted(exposed - documented)
