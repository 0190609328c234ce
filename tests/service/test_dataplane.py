"""The core that knows no protocol, in process: which model a request gets, admission (load shedding and the
body memory budget), and micro-batching that answers each request as if it ran alone."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import anyio
import numpy as np
import pytest

from service import batching, runtime
from service.batching import BatchWait, MicroBatcher
from service.dataplane import INLINE_PREDICT_FEATURES, BodyBudget, DataPlane
from service.errors import InvalidInput, ModelNotFound, NotReady, Overloaded, PayloadTooLarge
from service.inference import InferenceRequest
from service.placement import CPU, CUDA, Placement, fixed
from service.repository import load_repository
from service.settings import Settings
from tests.service.conftest import MODELS

REPOSITORY = load_repository(Settings(model_dir=MODELS))


def plane(**settings: object) -> DataPlane:
    dataplane = DataPlane(Settings(model_dir=MODELS, **settings))
    dataplane.repository = REPOSITORY
    return dataplane


def request(
    n: int, seed: int = 0, *, method: str = "dbf", lam: float = 1.0, scale: float = 1.0
) -> InferenceRequest:
    model = REPOSITORY.get("handwritten")
    rng = np.random.default_rng(seed)
    present = rng.random((n, len(model.signature.views))) < 0.8
    present[:, 0] = True
    features = {  # the rows of the samples that have the view
        v.name: (scale * rng.random((int(present[:, i].sum()), v.dim))).astype(np.float32)
        for i, v in enumerate(model.signature.views)
    }
    return InferenceRequest(features, present, method, lam)


def test_models_by_name_and_version():
    dataplane = plane()
    assert dataplane.model(None).name == "handwritten"  # the default
    assert dataplane.model("cub", "1").name == "cub"
    with pytest.raises(ModelNotFound, match="no model named 'nope'"):
        dataplane.model("nope")
    with pytest.raises(ModelNotFound, match="model 'cub' has no version '2'; it serves version '1'"):
        dataplane.model("cub", "2")


def test_a_request_before_the_models_are_loaded_is_told_when_to_retry():
    """A client's retry loop (service.client's) waits on a 503's Retry-After: not_ready had none, so a
    request during the start was raised at once, where a retry a second later would have been served."""
    dataplane = plane(retry_after_seconds=3)
    dataplane.repository = None
    with pytest.raises(NotReady, match="models are not loaded") as refused:
        dataplane.model(None)
    assert refused.value.headers == {"Retry-After": "3"}


def test_requests_past_the_in_flight_limit_are_shed_with_retry_after():
    dataplane = plane(max_in_flight=2, retry_after_seconds=4)
    model = dataplane.model(None)

    async def three() -> None:
        with dataplane.admitted(model), dataplane.admitted(model):
            with pytest.raises(Overloaded) as shed, dataplane.admitted(model):
                pass
            assert shed.value.headers == {"Retry-After": "4"}
        assert dataplane.in_flight == 0
        with dataplane.admitted(model):  # every slot came back
            pass

    asyncio.run(three())


def test_the_body_budget_sheds_past_its_limit_and_gives_back():
    budget = BodyBudget(100, retry_after=1)
    budget.reserve(60, body=60)
    with pytest.raises(Overloaded, match="DBF_BODY_MEMORY_BYTES"):
        budget.reserve(41, body=41)
    budget.reserve(40, body=40)
    budget.release(100)
    budget.reserve(100, body=100)
    assert budget.used == 100


def test_a_body_larger_than_the_whole_budget_is_too_large_not_overloaded():
    """A body the budget cannot hold even with nothing else held: no retry can help, so 413 rather than
    503 with Retry-After (the shapes probe's 512-sample request to a 20,000-wide model got the 503 on an
    idle service, every retry)."""
    budget = BodyBudget(100, retry_after=1)
    budget.reserve(60, body=60)
    with pytest.raises(PayloadTooLarge, match="more than the 100 that this service holds at once"):
        budget.reserve(41, body=101)  # a body read in pieces: its total so far decides
    assert budget.used == 60


@pytest.mark.parametrize("batching", [True, False])
def test_each_request_gets_its_own_answer_batched_or_not(batching):
    """Concurrent requests of different sizes and fusions: each answer equals the request run alone, and a
    request whose features overflow a head fails alone, its error saying which sample and view."""
    dataplane = plane(batching=batching, inference_threads=1)
    model = dataplane.model(None)
    requests = [request(n, seed=n) for n in (1, 3, 1, 2)] + [request(2, seed=9, method="gbaf", lam=2.0)]
    poisoned = request(3, seed=5, scale=3e38)

    async def together():
        return await asyncio.gather(
            *(dataplane.infer(model, r) for r in [*requests, poisoned]), return_exceptions=True
        )

    answers = asyncio.run(together())
    for alone, got in zip(requests, answers, strict=False):
        expected = asyncio.run(plane(batching=False).infer(model, alone))
        assert got.label.tolist() == expected.label.tolist() and got.method == alone.method
        for name in ("probability", "belief", "uncertainty", "conflict", "discount", "confidence"):
            assert getattr(got, name).tobytes() == getattr(expected, name).tobytes(), name  # to the bit
        assert got.present.tolist() == alone.present.tolist()
    error = answers[-1]
    assert isinstance(error, InvalidInput) and error.sample == 0 and error.view is not None


@pytest.mark.parametrize("batching", [True, False])
def test_small_cpu_batches_run_on_the_event_loop_others_on_inference_threads(batching, monkeypatch):
    """A small batch's heads and fusion hold the GIL nearly throughout, so they run on the event loop (a
    thread would only add the GIL's hand-offs); a bigger one, or one whose heads run on a GPU (their runs
    release the GIL), on an inference thread. Where its heads run is the batch's own placement: with
    ``DBF_DEVICE=auto`` small batches may run on the CPU and big ones on the GPU (seen on an H200: one-sample
    requests 6-22% slower under ``auto`` than ``cpu`` while every one went to a thread)."""
    on_event_loop = []

    def spied(model, request):
        on_event_loop.append(threading.current_thread() is threading.main_thread())
        return predict(model, request)

    predict = runtime.predict
    monkeypatch.setattr(runtime, "predict", spied)
    dataplane = plane(batching=batching)
    model = dataplane.model(None)
    heads = model.heads[CPU]  # the CPU's sessions stand in for CUDA's: this machine has no GPU
    on_gpu = dataclasses.replace(model, heads={CUDA: heads}, placement=fixed(CUDA, "a stand-in"))
    split = dataclasses.replace(
        model, heads={CPU: heads, CUDA: heads}, placement=Placement(((16, CPU), (None, CUDA)), "a stand-in")
    )
    largest_inline = INLINE_PREDICT_FEATURES // model.features_per_sample
    cases = [(model, 1), (model, largest_inline), (model, largest_inline + 1), (on_gpu, 1), (split, 16)]
    cases.append((split, 17))
    for served, n in cases:
        assert len(asyncio.run(dataplane.infer(served, request(n)))) == n
    assert on_event_loop == [True, True, False, False, True, False]


class Arrivals:
    """A script of arrivals for a micro-batcher's waits: each wait it takes (the batching module's sleep)
    brings the next number of one-sample requests, deterministically, and the waits are recorded."""

    def __init__(self, batcher: MicroBatcher, model, script: list[int], wait: BatchWait | None) -> None:
        self.batcher, self.model, self.script, self.wait = batcher, model, list(script), wait
        self.waits: list[float] = []
        self.calls: list[asyncio.Task] = []

    def submit(self) -> None:
        call = self.batcher.submit(self.model, request(1, seed=len(self.calls)), self.wait)
        self.calls.append(asyncio.ensure_future(call))

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        for _ in range(self.script.pop(0) if self.script else 0):
            self.submit()
        await asyncio.sleep(0)  # the new calls reach the queue
        await asyncio.sleep(0)


def batches_of(script: list[int], wait: BatchWait | None, *, max_delay: float = 0.0, before: int = 0):
    """The batch sizes and waits of one request followed by ``script``'s arrivals (after ``before``
    requests batched together a moment earlier)."""
    dataplane = plane()
    model = dataplane.model(None)
    sizes = []

    async def run(served, batch):
        sizes.append(len(batch))
        return await dataplane.predict(served, batch)

    async def scenario():
        batcher = MicroBatcher(run, anyio.CapacityLimiter(1), max_samples=256, max_delay=max_delay)
        if before:
            await asyncio.gather(*(batcher.submit(model, request(1, seed=i)) for i in range(before)))
        arrivals = Arrivals(batcher, model, script, wait)
        batching._sleep, sleep = arrivals.sleep, batching._sleep
        try:
            arrivals.submit()
            while not all(call.done() for call in arrivals.calls):
                await asyncio.gather(*arrivals.calls)
        finally:
            batching._sleep = sleep
        return sizes[1 if before else 0 :], arrivals.waits

    return asyncio.run(scenario())


def test_a_batch_waits_again_while_calls_keep_coming_up_to_its_longest():
    """gRPC's calls reach the core milliseconds apart: a batch holding one waits a step, and another while
    the last brought more, so that a stream of calls fills it, up to the longest wait."""
    grpc = BatchWait(step=0.001, longest=0.003)
    assert batches_of([3, 3, 3, 3], grpc) == ([10], [0.001] * 3)
    assert batches_of([3, 0, 3], grpc) == ([4], [0.001] * 2)  # a step that brought none ends the wait
    assert batches_of([], grpc) == ([1], [0.001])  # a lone call waits one step


def test_a_batch_holding_as_many_as_lately_waits_no_more():
    """Where a few callers wait on each other's answers, all are in once the batch holds as many as the
    last batches held; another step would leave the event loop idle (at 4 callers: 1,173 calls/s with
    one 1 ms step each, 804 stepping until a step brought none)."""
    grpc = BatchWait(step=0.001, longest=0.01)
    assert batches_of([3, 3], grpc, before=4) == ([4], [0.001])
    assert batches_of([3, 3, 3], grpc, before=5) == ([7], [0.001] * 2)


def test_rest_requests_wait_once_for_the_batch_delay_or_not_at_all():
    assert batches_of([3], None) == ([1], [])  # DBF_BATCH_MAX_DELAY_MS 0: no wait
    assert batches_of([3, 3], None, max_delay=0.002) == ([4], [0.002])
