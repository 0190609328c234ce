"""Prometheus metrics. Labels are bounded: models and views come from the manifests, methods from a fixed
list, reasons from the error types; nothing per request."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import anyio
import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

# No ``*_created`` gauge beside each counter and histogram (250 series with the committed models): the
# metrics reference lists none, rules and dashboard read none, and --workers N exposes none.
disable_created_metrics()

_UNIT = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 0.05 .. 1.0

PREDICTIONS = Counter("dbf_predictions", "Fused samples served.", ["model", "method"])
HIGH_CONFLICT = Counter("dbf_high_conflict", "Samples flagged high_conflict.", ["model", "method"])
FLAGGED_BY_VIEW = Counter(
    "dbf_flagged_by_view",
    "Flagged samples by the view most to blame, to name a failing modality.",
    ["model", "view"],
)
# Whatever the fusion method: dbf_view_discount counts DBF's requests only, so a view's samples sent with
# another method looked not sent (DBFViewMissing fired for every view of clean bcf traffic).
VIEW_FUSED = Counter(
    "dbf_view_fused",
    "Samples in which the view was fused (sent and within its training range), whatever the fusion method.",
    ["model", "view"],
)
OUT_OF_RANGE = Counter(
    "dbf_out_of_range",
    "Views sent too far outside their training range, fused as if missing: data unlike the training data.",
    ["model", "view"],
)
# A view's top class against that of the other views fused, where every view is fused: a view
# failing within its training range agrees far less than on clean data, even one the fused prediction
# follows. Counted only for models whose manifest measured the clean rate (``view_agreement``).
VIEW_AGREED = Counter(
    "dbf_view_agreed",
    "Samples in which the view's top class is that of the other views fused (of those in dbf_view_compared).",
    ["model", "view"],
)
VIEW_COMPARED = Counter(
    "dbf_view_compared",
    "Samples in which every view of the model is fused, of a share of the traffic (one batch per "
    "DBF_AGREEMENT_INTERVAL_SECONDS at most, up to 16 of its samples): where the view's agreement is "
    "measured, as its clean rate was.",
    ["model", "view"],
)
UNCERTAINTY = Histogram(
    "dbf_fused_uncertainty", "Fused uncertainty per sample.", ["model", "method"], buckets=_UNIT
)
MAX_CONFLICT = Histogram(
    "dbf_max_conflict", "Largest pairwise degree of conflict per sample.", ["model", "method"], buckets=_UNIT
)
VIEW_DISCOUNT = Histogram(
    "dbf_view_discount",
    "DBF discount factor per present view and sample, of requests fused with DBF.",
    ["model", "view"],
    buckets=_UNIT,
)
CONFIDENCE = Histogram(
    "dbf_confidence",
    "Calibrated confidence per sample (the probability that its label is right).",
    ["model"],
    buckets=_UNIT,
)
SET_SIZE = Histogram(
    "dbf_prediction_set_size",
    "Classes in each sample's conformal prediction set (1: decided; more, or 0: the model cannot decide).",
    ["model"],
    buckets=(0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 100),
)
BATCH_SIZE = Histogram(
    "dbf_batch_size",
    "Samples per predict request.",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
MICRO_BATCH = Histogram(
    "dbf_micro_batch_requests",
    "Requests answered together by one run of the heads (micro-batching: DBF_BATCH_*, DBF_GRPC_BATCH_*).",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
# By the protocol the request came in: "rest" (v1 and v2 over HTTP) or "grpc" (service/grpc_codec.py).
PROTOCOLS = ("rest", "grpc")
# From a quarter of a millisecond: a one-sample predict takes about 1 ms, and prometheus-client's default
# buckets (from 5 ms) held 97% of such requests in their first, so every quantile below it read as a guess
# (p50 2.6 ms for a mean of 1.3 ms). 2.5 s stays a bound: DBFHighLatency compares with it exactly.
_LATENCY = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
REQUEST_SECONDS = Histogram(
    "dbf_request_duration_seconds",
    "Predict request latency, from the body read and the model found to the answer or refusal.",
    ["model", "protocol"],
    buckets=_LATENCY,
)
ERRORS = Counter("dbf_errors", "Error responses by reason.", ["reason"])
RELOADS = Counter("dbf_model_reloads", "Model repository reloads, by outcome.", ["outcome"])
# Connection level (service/server.py).
OPEN_CONNECTIONS = Gauge("dbf_open_connections", "Open HTTP connections.", multiprocess_mode="livesum")
CONNECTIONS_SHED = Counter(
    "dbf_connections_shed",
    "Connections closed to stay within DBF_MAX_CONNECTIONS, by what they were doing: waiting for a request, "
    "receiving its body, or new (refused: every other connection was being answered); and unread: dropped "
    "because its client did not take its answer in time, or the answers held passed DBF_BODY_MEMORY_BYTES.",
    ["state"],
)
# Gauges say how worker processes combine (PROMETHEUS_MULTIPROC_DIR, set by `python -m service --workers N`):
# all "live" ones, so that a worker that has ended is no longer counted (forget_processes).
MODEL_INFO = Gauge(
    "dbf_model_info",
    "Loaded model heads (1) and the execution provider running each.",
    ["model", "view", "provider"],
    multiprocess_mode="livemax",
)
PLACEMENT_INFO = Gauge(
    "dbf_placement_info",
    "Where each model's batches run (1): the execution provider and the batch sizes it takes (DBF_DEVICE; "
    "auto: the fastest at load).",
    ["model", "provider", "samples"],
    multiprocess_mode="livemax",
)
FLAG_CLEAN_RATE = Gauge(
    "dbf_flag_clean_rate",
    "Share of clean samples the calibrated high-conflict flag raises (the manifest's target false-positive "
    "rate): the baseline that alert thresholds are multiples of.",
    ["model"],
    multiprocess_mode="livemax",
)
VIEW_AGREEMENT_CLEAN_LOW = Gauge(
    "dbf_view_agreement_clean_low",
    "Share of clean samples in which the view's top class is that of the other views fused, at the low end "
    "of its 95% interval (the manifest's view_agreement clean_low): the baseline of the agreement alert.",
    ["model", "view"],
    multiprocess_mode="livemax",
)
VIEW_AGREEMENT_CHANCE_RATE = Gauge(
    "dbf_view_agreement_chance_rate",
    "The agreement of a view whose top class is independent of the other views' (the manifest's "
    "view_agreement chance level): what a view shuffled between samples tends to.",
    ["model", "view"],
    multiprocess_mode="livemax",
)
BUILD = Gauge("dbf_build_info", "dbf-serve build information (1).", ["version"], multiprocess_mode="livemax")


def initialise(
    models: dict[str, list[str]],
    methods: tuple[str, ...],
    reasons: tuple[str, ...],
    agreeing: dict[str, list[str]] | None = None,
) -> None:
    """Create every series at zero, so rates and alerts see 0 rather than nothing before the first event.

    ``models`` maps each model to its view names; ``agreeing`` each model with a measured view agreement to
    the views it has a clean rate for.
    """
    for model, views in (agreeing or {}).items():
        for view in views:
            VIEW_AGREED.labels(model, view)
            VIEW_COMPARED.labels(model, view)
    for model, views in models.items():
        BATCH_SIZE.labels(model)
        MICRO_BATCH.labels(model)
        for protocol in PROTOCOLS:
            REQUEST_SECONDS.labels(model, protocol)
        CONFIDENCE.labels(model)
        SET_SIZE.labels(model)
        for method in methods:
            for family in (PREDICTIONS, HIGH_CONFLICT, UNCERTAINTY, MAX_CONFLICT):
                family.labels(model, method)
        for view in views:
            FLAGGED_BY_VIEW.labels(model, view)
            VIEW_DISCOUNT.labels(model, view)
            VIEW_FUSED.labels(model, view)
            OUT_OF_RANGE.labels(model, view)
    for reason in reasons:
        ERRORS.labels(reason=reason)
    for outcome in ("success", "failure"):
        RELOADS.labels(outcome)
    for state in ("waiting", "receiving", "new", "unread"):
        CONNECTIONS_SHED.labels(state)


_PUBLISHED: dict[Gauge, set[tuple[str, ...]]] = {}  # this process's series of each gauge of the models now


def describe_models(heads: Iterable[tuple[str, str, str]]) -> None:
    """``dbf_model_info`` 1 for each (model, view, provider) loaded now."""
    _publish(MODEL_INFO, dict.fromkeys(heads, 1.0))


def describe_placements(batches: Iterable[tuple[str, str, str]]) -> None:
    """``dbf_placement_info`` 1 for each (model, provider, batch sizes such as ``1-16`` or ``17+``) now."""
    _publish(PLACEMENT_INFO, dict.fromkeys(batches, 1.0))


def describe_flag_clean_rates(rates: dict[str, float]) -> None:
    """``dbf_flag_clean_rate`` of each model loaded now: its flag's calibrated false-positive rate."""
    _publish(FLAG_CLEAN_RATE, {(model,): rate for model, rate in rates.items()})


def describe_view_agreement(rates: dict[tuple[str, str], tuple[float, float]]) -> None:
    """``dbf_view_agreement_clean_low`` and ``..._chance_rate`` of each (model, view) measured, of the
    models loaded now: (the low end of the clean rate's interval, chance level)."""
    _publish(VIEW_AGREEMENT_CLEAN_LOW, {labels: clean for labels, (clean, _) in rates.items()})
    _publish(VIEW_AGREEMENT_CHANCE_RATE, {labels: chance for labels, (_, chance) in rates.items()})


def _publish(gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
    """``gauge`` at ``values`` (by label values); a series set before but not now loses its series, or, in
    multiprocess mode, where series live on in the worker's file, reads 0."""
    published = _PUBLISHED.setdefault(gauge, set())
    for gone in published - values.keys():
        if _multiprocess():
            gauge.labels(*gone).set(0)
        else:
            gauge.remove(*gone)
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    published.clear()
    published.update(values)


@dataclass(frozen=True)
class ViewChildren:
    discount: Histogram
    fused: Counter
    flagged: Counter
    out_of_range: Counter


@dataclass(frozen=True)
class ModelChildren:
    """The labelled series one prediction updates (looking labels up costs more than the update)."""

    predictions: Counter
    high_conflict: Counter
    uncertainty: Histogram
    max_conflict: Histogram
    confidence: Histogram
    set_size: Histogram
    views: tuple[ViewChildren, ...]


@lru_cache(maxsize=256)  # bounded like the labels: models x methods
def _children(model: str, method: str, views: tuple[str, ...]) -> ModelChildren:
    return ModelChildren(
        PREDICTIONS.labels(model, method),
        HIGH_CONFLICT.labels(model, method),
        UNCERTAINTY.labels(model, method),
        MAX_CONFLICT.labels(model, method),
        CONFIDENCE.labels(model),
        SET_SIZE.labels(model),
        tuple(
            ViewChildren(
                VIEW_DISCOUNT.labels(model, v),
                VIEW_FUSED.labels(model, v),
                FLAGGED_BY_VIEW.labels(model, v),
                OUT_OF_RANGE.labels(model, v),
            )
            for v in views
        ),
    )


def children(model: str, method: str, views: list[str]) -> ModelChildren:
    return _children(model, method, tuple(views))


class AgreementSampler:
    """Which batches of a model have their views' agreement counted, and which of their samples: at most
    one batch every ``interval`` seconds, on up to :data:`AGREEMENT_ROWS` samples evenly spaced; with an
    interval of 0, every sample. Chosen by time, not by content, the samples counted are a fair share of
    the traffic, and the cost is bounded whatever the traffic.

    Examples
    --------
    >>> sampler = AgreementSampler(60.0)
    >>> sampler.rows(256), sampler.rows(256)  # the second batch within the minute: not counted
    (slice(None, None, 16), None)
    >>> AgreementSampler(0.0).rows(256)
    slice(None, None, None)
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._due = -math.inf

    def rows(self, samples: int) -> slice | None:
        """The rows of a batch of ``samples`` to count, or None: not this batch. Threads may race here:
        at worst two batches are counted where one would be, which no rate notices."""
        if not self.interval:
            return slice(None)
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + self.interval
        return slice(None, None, -(-samples // AGREEMENT_ROWS))


AGREEMENT_ROWS = 16
"""The most samples of a batch whose views' agreement is counted (:class:`AgreementSampler`)."""


@dataclass(frozen=True)
class AgreementChildren:
    """One view's agreement counters: the samples it agreed in, of those it was compared in."""

    agreed: Counter
    compared: Counter


@lru_cache(maxsize=256)  # bounded like the labels: models
def agreement_children(model: str, views: tuple[str, ...]) -> tuple[AgreementChildren, ...]:
    """The agreement counters of ``views`` of ``model`` (those its manifest has a clean rate for)."""
    return tuple(
        AgreementChildren(VIEW_AGREED.labels(model, v), VIEW_COMPARED.labels(model, v)) for v in views
    )


def observe_many(histograms: Sequence[Histogram], values: Sequence[np.ndarray]) -> None:
    """``histogram.observe(x)`` for every x of its ``values`` (a 1-D array), for each histogram, in one
    numpy pass: one update per bucket that gains any, and one of each sum. The histograms share their
    buckets.

    prometheus-client has no bulk observe; this does what ``Histogram.observe`` does (non-cumulative bucket
    counts, cumulated at exposition, and the sum; NaN counts in no bucket) through the same value objects,
    so it works in multiprocess mode too. tests/service/test_metrics.py checks it against ``observe``. Those
    objects (``_upper_bounds``, ``_buckets``, ``_sum``) are not public API: pyproject.toml bounds
    prometheus-client to the releases whose histograms tests/service/test_dependency_contracts.py checks. (A
    prediction's ten histograms in one pass cost about half of a pass each at the batch sizes the service
    forms under load, 10-20 samples; a one-sample batch costs a little more than ``observe`` one by one,
    and ``observe`` falls further behind as batches grow.)
    """
    bounds = np.asarray(histograms[0]._upper_bounds)
    width = bounds.size + 1  # the last: NaN, which observe() counts in no bucket
    sizes = [v.size for v in values]
    flat = np.concatenate(values, dtype=np.float64)
    owner = np.repeat(np.arange(len(histograms)), sizes)
    slots = np.bincount(
        np.searchsorted(bounds, flat, side="left") + owner * width, minlength=len(histograms) * width
    )
    sums = np.bincount(owner, weights=flat, minlength=len(histograms)).tolist()
    for histogram, size, total in zip(histograms, sizes, sums, strict=True):
        if size:
            histogram._sum.inc(total)
    filled = np.flatnonzero(slots)
    for slot, count in zip(filled.tolist(), slots[filled].tolist(), strict=True):
        h, bucket = divmod(slot, width)
        if bucket < len(bounds):
            histograms[h]._buckets[bucket].inc(count)


def forget_processes(pids: Iterable[int]) -> None:
    """Drop the live gauges of worker processes that have ended (prometheus-client's ``mark_process_dead``):
    their files outlive them, and a killed worker's open connections would otherwise be counted for ever."""
    if _multiprocess():
        for pid in pids:
            multiprocess.mark_process_dead(pid)


def forget_gone_processes() -> None:
    """:func:`forget_processes` for each process that left live gauges and no longer exists: a worker killed
    before its supervisor noticed, or in an earlier run sharing the directory."""
    if not _multiprocess():
        return
    shared = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    left = {name.stem.rpartition("_")[2] for name in shared.glob("gauge_live*_*.db")}  # gauge_livesum_<pid>
    forget_processes(int(pid) for pid in left if pid.isdigit() and not _exists(int(pid)))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing sent, only whether the process is there
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's
        pass
    return True


RENDER_INTERVAL = 0.1
"""Seconds between two renderings of the metrics text, at least: a tenth of a core at most for scrapes,
a tenth of a second at most added to one (Prometheus scrapes every few seconds)."""


class Exposition:
    """The metrics text for scrapes: rendered at most every ``min_interval`` seconds, yet every caller gets
    a rendering begun after it asked (never figures from before its request). Rendering holds the GIL
    (every series, in Python): scrapes in a flood wait their turn, costing no thread, and share renders,
    rather than each stall the event loop that serves predictions and probes."""

    def __init__(self, *, min_interval: float) -> None:
        self.min_interval = min_interval
        self._lock = asyncio.Lock()
        self._started = -math.inf
        self._text = b""

    async def text(self) -> bytes:
        asked = time.monotonic()
        async with self._lock:
            if self._started >= asked:  # a rendering begun since this scrape asked, done while it waited
                return self._text
            due = self._started + self.min_interval
            while (wait := due - time.monotonic()) > 0:  # the loop's clock may wake a sleep a little early
                await asyncio.sleep(wait)
            self._started = time.monotonic()
            self._text = await anyio.to_thread.run_sync(exposition)
            return self._text


def exposition() -> bytes:
    """The metrics text: this process's, or every worker's together in multiprocess mode."""
    if _multiprocess():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest()


def _multiprocess() -> bool:
    """Whether worker processes share their metrics through files (``python -m service --workers N``)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
