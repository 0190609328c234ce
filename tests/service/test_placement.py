"""Where the heads run (issue 27): each batch on the provider fastest at its size, as timed at load (here with
a fake timing source: this machine has no GPU), or on the one DBF_DEVICE names; the placement shown in
/v1/models, the v2 model metadata and the metrics; and the IOBinding path that CUDA runs, run here on the
CPU provider."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading

import httpx
import numpy as np
import onnxruntime
import pytest

from service import repository, runtime
from service.__main__ import available_cores
from service.inference import InferenceRequest
from service.placement import CPU, CUDA, BoundHead, SessionHead, decide, page_locked_allocator
from service.repository import load_repository
from service.settings import Settings
from tests.service.conftest import MODELS, serving, start_and_fail
from tests.service.test_operator_mistakes import with_head
from tests.service.test_service import metric, post, zeros_sample

# Seconds per batch of a model's heads: CUDA pays a fixed cost per run, the CPU one per sample.
GPU_LIKE = {
    CPU: {1: 1e-4, 16: 3e-4, 256: 4e-3, 1024: 16e-3},
    CUDA: {1: 5e-4, 16: 5e-4, 256: 6e-4, 1024: 1e-3},
}


def fake_timer(timings):
    """A timing source that answers ``timings`` and records what it was asked to time."""
    asked = []

    def timer(provider, run, n):
        asked.append((provider, run, n))
        return timings[provider][n]

    timer.asked = asked
    return timer


def test_each_batch_runs_where_its_size_ran_fastest():
    runs = {CPU: object(), CUDA: object()}
    timer = fake_timer(GPU_LIKE)
    placement = decide(runs, timer)
    assert sorted(timer.asked, key=str) == sorted(
        ((p, runs[p], n) for p in runs for n in (1, 16, 256, 1024)), key=str
    )
    # CPU at 1 and 16, CUDA at 256 and 1024: the switch lies between 16 and 256 (at their geometric mean).
    assert [placement.provider(n) for n in (1, 16, 64, 65, 256, 1024, 100_000)] == [CPU] * 3 + [CUDA] * 4
    assert placement.sizes() == [(CPU, "1-64"), (CUDA, "65+")]
    assert placement.providers == (CPU, CUDA) and placement.reason == "measured"
    shown = placement.describe()
    assert shown["batches"] == [
        {"provider": CPU, "from_samples": 1, "to_samples": 64},
        {"provider": CUDA, "from_samples": 65, "to_samples": None},
    ]
    assert shown["timings_ms"][CUDA] == {"1": 0.5, "16": 0.5, "256": 0.6, "1024": 1.0}
    assert "1-64 samples on CPUExecutionProvider, 65+ samples on CUDAExecutionProvider" in str(placement)


@pytest.mark.parametrize(
    ("cuda", "expected"),
    [
        ({1: 1e-3, 16: 1e-3, 256: 1e-2, 1024: 1.0}, [(CPU, "1+")]),  # never faster: tiny heads
        ({1: 1e-5, 16: 1e-5, 256: 1e-5, 1024: 1e-5}, [(CUDA, "1+")]),  # always faster: big heads
        (GPU_LIKE[CPU], [(CPU, "1+")]),  # a tie goes to the CPU (no copies, no device memory)
        (
            {1: 1e-3, 16: 1e-4, 256: 1.0, 1024: 1e-3},
            [(CPU, "1-4"), (CUDA, "5-64"), (CPU, "65-512"), (CUDA, "513+")],
        ),
    ],
)
def test_the_buckets_follow_the_timings(cuda, expected):
    placement = decide({CPU: None, CUDA: None}, fake_timer({CPU: GPU_LIKE[CPU], CUDA: cuda}))
    assert placement.sizes() == expected


# onnxruntime's CPU build warns of the CUDA provider asked for, and runs such sessions on the CPU.
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider':UserWarning")
def test_auto_loads_each_model_on_both_providers_and_keeps_what_its_placement_uses(monkeypatch):
    """The load with CUDA usable (faked: this machine has none, and onnxruntime runs the "CUDA" sessions on
    the CPU): each model's heads are timed on both providers, on the same batches, by the timing source
    given, and kept on the providers their placement uses."""
    monkeypatch.setattr(repository, "_cuda_usable", lambda probe, settings: True)
    timed = []

    def timer(provider, run, n):
        run(n)  # the real heads, on a batch of n
        timed.append((provider, n))
        return GPU_LIKE[provider][n]

    everything_on_cpu = {CPU: 1.0, CUDA: 2.0}
    loaded = load_repository(Settings(model_dir=MODELS, default_model="scene15"), timer=timer)
    on_cpu = load_repository(
        Settings(model_dir=MODELS / "scene15"), timer=lambda provider, run, n: everything_on_cpu[provider]
    ).get()
    assert len(timed) == 2 * 4 * len(loaded.models)
    for model in loaded.models.values():
        assert model.placement.sizes() == [(CPU, "1-64"), (CUDA, "65+")]
        assert set(model.heads) == {CPU, CUDA}
        assert all(isinstance(head, BoundHead) for head in model.heads[CUDA].values())
        assert set(model.providers.values()) == {f"{CPU},{CUDA}"}
        assert [model.runs_on_cpu(n) for n in (64, 65)] == [True, False]
    model = loaded.get()
    for n in (1, 300):
        assert len(runtime.predict(model, features_of(model, n))) == n
    assert set(on_cpu.heads) == {CPU} and on_cpu.runs_on_cpu(100_000)  # CUDA's sessions, unused, are gone


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider':UserWarning")
def test_workers_take_the_placement_their_supervisor_measured(monkeypatch, tmp_path, caplog):
    """``--workers N`` measures once and hands the placements on (DBF_PLACEMENT): a worker times nothing for
    the heads measured, but does for a model whose heads changed since, or where the hand-over is
    unreadable."""
    monkeypatch.setattr(repository, "_cuda_usable", lambda probe, settings: True)
    monkeypatch.setattr(logging.getLogger("dbf"), "propagate", True)  # to caplog, as service.app stops it
    supervisor = load_repository(
        Settings(model_dir=MODELS), timer=lambda provider, run, n: GPU_LIKE[provider][n]
    )
    handed = repository.handed_placements(supervisor)

    def untimed(provider, run, n):
        raise AssertionError("timed again")

    worker = load_repository(Settings(model_dir=MODELS, placement=handed), timer=untimed)
    for name, model in worker.models.items():
        assert model.placement.buckets == supervisor.models[name].placement.buckets
        assert model.placement.timings == supervisor.models[name].placement.timings
        assert model.placement.reason == "measured at start by the supervisor process"
    changed = tmp_path / "scene15"
    shutil.copytree(MODELS / "scene15", changed)
    head = pytest.importorskip("onnx").load(str(changed / "gist.onnx"))
    head.doc_string = "the same graph in other bytes"
    with_head(changed, "gist", head.SerializeToString())
    timed = []

    def timer(provider, run, n):
        timed.append(n)
        return 1.0

    for given in (handed, "{not json"):
        model = load_repository(Settings(model_dir=changed, placement=given), timer=timer).get()
        assert model.placement.reason == "measured"
    assert len(timed) == 2 * 2 * 4  # two loads, two providers, four sizes
    assert "DBF_PLACEMENT unreadable" in caplog.text


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider':UserWarning")
@pytest.mark.parametrize("device", [CUDA, CPU])
def test_a_model_forced_to_a_device_runs_every_batch_there_untimed(monkeypatch, device):
    """DBF_DEVICE=cuda or cpu where CUDA is usable (faked): every batch on that provider, its heads alone
    loaded, nothing timed."""
    monkeypatch.setattr(repository, "_cuda_usable", lambda probe, settings: True)

    def untimed(provider, run, n):
        raise AssertionError("timed although forced")

    setting = {CUDA: "cuda", CPU: "cpu"}[device]
    model = load_repository(Settings(model_dir=MODELS / "scene15", device=setting), timer=untimed).get()
    assert model.placement.sizes() == [(device, "1+")] and model.placement.reason == f"DBF_DEVICE={setting}"
    assert set(model.heads) == {device} and set(model.providers.values()) == {device}
    kind = BoundHead if device == CUDA else SessionHead
    assert all(isinstance(head, kind) for head in model.heads[device].values())
    assert len(runtime.predict(model, features_of(model, 3))) == 3


def features_of(model, n: int) -> InferenceRequest:
    rng = np.random.default_rng(n)
    views = {view.name: rng.random((n, view.dim), dtype=np.float32) for view in model.manifest.views}
    return InferenceRequest(views, np.ones((n, len(views)), dtype=bool), "dbf", 1.0)


@pytest.fixture(scope="module")
def handwritten():
    return load_repository(Settings(model_dir=MODELS / "handwritten", device="cpu")).get()


def test_the_runtime_runs_each_batch_on_the_heads_of_its_placement(handwritten):
    """A model placed on two providers by fake timings: a stand-in for CUDA (IOBinding heads on the CPU
    provider: this machine has no GPU) runs the big batches, the CPU's sessions the small ones, with the same
    answers."""
    on_cpu = handwritten.heads[CPU]
    ran = []

    class Spied(BoundHead):
        def run(self, features):
            ran.append(len(features))
            return super().run(features)

    bound = {view: Spied(head.session, head.outputs) for view, head in on_cpu.items()}
    placement = decide({CPU: None, CUDA: None}, fake_timer(GPU_LIKE))
    both = dataclasses.replace(handwritten, heads={CPU: on_cpu, CUDA: bound}, placement=placement)
    for n in (1, 64, 65, 300):
        request = features_of(handwritten, n)
        got, expected = runtime.predict(both, request), runtime.predict(handwritten, request)
        np.testing.assert_array_equal(got.probability, expected.probability)
        np.testing.assert_array_equal(got.discount, expected.discount)
    assert ran == [65] * 6 + [300] * 6  # the six views' heads, for the two batches placed on "CUDA" only


def test_bound_heads_reuse_their_buffers_and_give_the_sessions_answers(handwritten):
    """IOBinding's host buffers are allocated once per thread (grown to a power of two), not per run; the
    answers equal the session's own."""
    session_head = handwritten.heads[CPU]["pix"]
    shapes = []

    def allocate(shape):
        shapes.append(shape)
        return np.empty(shape, dtype=np.float32)

    bound = BoundHead(session_head.session, session_head.outputs, allocate=allocate)
    rng = np.random.default_rng(0)
    for n in (1000, 3, 1024, 1):
        x = rng.random((n, 240), dtype=np.float32)
        for got, expected in zip(bound.run(x), session_head.run(x), strict=True):
            np.testing.assert_array_equal(got, expected)
    assert shapes == [(1024, 240), (1024, 10), (1024,)]  # features, evidence, range excess: once
    answers = {}

    def other_thread():
        answers["other"] = [a.copy() for a in bound.run(rng_x)]

    rng_x = rng.random((5, 240), dtype=np.float32)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert shapes[3:] == [(8, 240), (8, 10), (8,)]  # a thread's own buffers: runs do not share them
    np.testing.assert_array_equal(answers["other"][0], session_head.run(rng_x)[0])
    assert len(shapes) == 6


def test_forced_to_the_cpu_the_placement_is_shown_in_the_api_and_the_metrics():
    with serving(MODELS / "handwritten", device="cpu") as url:
        [described] = httpx.get(url + "/v1/models").json()["models"]
        placement = {
            "reason": "DBF_DEVICE=cpu",
            "batches": [{"provider": CPU, "from_samples": 1, "to_samples": None}],
            "timings_ms": {},
        }
        assert described["placement"] == placement
        assert set(described["providers"].values()) == {CPU}
        in_words = "every batch on CPUExecutionProvider (DBF_DEVICE=cpu)"
        assert httpx.get(url + "/v2/models/handwritten").json()["parameters"]["placement"] == in_words
        assert metric(url, "dbf_placement_info", model="handwritten", provider=CPU, samples="1+") == 1
        assert post(url, {"samples": [zeros_sample()]}).status_code == 200


def test_cuda_without_a_cuda_provider_refuses_to_start():
    """DBF_DEVICE=cuda (or --device cuda) where CUDA cannot run the heads: no start, and a message that
    says why and what to do."""
    for args, env in ((("--device", "cuda"), None), ((), {"DBF_DEVICE": "cuda"})):
        done = start_and_fail("--model-dir", str(MODELS / "scene15"), *args, env=env)
        assert done.returncode != 0
        assert "DBF_DEVICE=cuda but CUDA cannot run the heads" in done.stderr
        assert "set DBF_DEVICE=auto or cpu" in done.stderr


@pytest.mark.skipif(CUDA in onnxruntime.get_available_providers(), reason="CUDA is there: auto measures")
def test_auto_with_the_cpu_alone_times_nothing():
    """Without a CUDA provider there is nothing to choose between: no timing at load."""

    def timer(provider, run, n):
        raise AssertionError("timed with a single provider")

    model = load_repository(Settings(model_dir=MODELS / "scene15"), timer=timer).get()
    assert model.placement.sizes() == [(CPU, "1+")]
    assert model.placement.reason == "the only provider that runs here"


@pytest.mark.parametrize(
    ("quota", "expected"), [("50000 100000", 1), ("150000 100000", 2), ("max 100000", None)]
)
def test_workers_auto_takes_the_cores_this_process_may_use(tmp_path, quota, expected):
    """One worker per core the process may run on: its affinity, or its cgroup's CPU quota rounded up."""
    (tmp_path / "cpu.max").write_text(quota + "\n")
    cores = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path) == min(cores, expected or cores)
    assert available_cores(tmp_path / "absent") == cores


@pytest.mark.parametrize(("quota", "expected"), [("50000", 1), ("150000", 2), ("-1", None)])
def test_workers_auto_reads_a_cgroup_v1_quota_too(tmp_path, quota, expected):
    """cgroup v1 (no cpu.max): the quota is cpu/cpu.cfs_quota_us over cpu.cfs_period_us, -1 for none.
    The default inference threads are the same count."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    cores = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path) == min(cores, expected or cores)
    assert Settings().inference_threads == available_cores()


def test_without_cpu_affinity_the_cores_are_the_machines(tmp_path, monkeypatch):
    """macOS and Windows have no ``sched_getaffinity`` (nor cgroups): the service still starts there."""
    monkeypatch.delattr(os, "sched_getaffinity")
    assert available_cores(tmp_path) == (os.cpu_count() or 1)
    assert Settings().inference_threads == (os.cpu_count() or 1)


def test_workers_must_be_a_number_or_auto():
    done = start_and_fail("--model-dir", str(MODELS / "scene15"), "--workers", "all")
    assert done.returncode == 2 and "'all' is neither a number of workers (1 or more) nor auto" in done.stderr


def test_page_locked_buffers_that_cannot_be_had_leave_ordinary_ones(monkeypatch, caplog):
    """Where onnxruntime lists a CUDA device but cannot allocate its host memory (faked: no GPU here), the
    allocator is refused at load, with a warning, rather than failing a request's first run."""
    from onnxruntime.capi import _pybind_state as capi

    cpu_memory = capi.OrtMemoryInfo(
        "Cpu", capi.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, capi.OrtMemType.DEFAULT
    )

    class Device:
        ep_name = CUDA

        def memory_info(self, kind):
            return cpu_memory  # no allocator shared for it: allocating fails

    monkeypatch.setattr(onnxruntime, "get_ep_devices", lambda: [Device()])
    monkeypatch.setattr(logging.getLogger("dbf"), "propagate", True)  # to caplog, as service.app stops it
    assert page_locked_allocator() is None
    assert "page-locked host buffers unavailable" in caplog.text
    monkeypatch.setattr(onnxruntime, "get_ep_devices", lambda: [])  # no CUDA device listed
    assert page_locked_allocator() is None


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider':UserWarning")
@pytest.mark.parametrize("evidence_type", ["DOUBLE", "FLOAT16", "INT64"])
def test_a_head_whose_evidence_is_not_float32_runs_bound_as_it_does_on_the_cpu(
    monkeypatch, tmp_path, evidence_type
):
    """A head may give its evidence in another numeric type (the runtime casts it to float32): it loads and
    serves on the CPU. Bound on CUDA (faked: onnxruntime runs the session on the CPU), its output was bound to
    a float32 buffer, and every run failed ("Unexpected output data type"): with DBF_DEVICE=cuda, every
    request sending the view was a 500; with auto, the load's timing raised."""
    onnx = pytest.importorskip("onnx")
    helper, numpy_helper, TensorProto = onnx.helper, onnx.numpy_helper, onnx.TensorProto
    evidence_type = getattr(TensorProto, evidence_type)
    monkeypatch.setattr(repository, "_cuda_usable", lambda probe, settings: True)
    shutil.copytree(MODELS / "scene15", tmp_path / "scene15")
    weights = numpy_helper.from_array(np.full((20, 15), 0.05, dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["features", "w"], ["z"]),
        helper.make_node("Exp", ["z"], ["positive"]),
        helper.make_node("Cast", ["positive"], ["evidence"], to=evidence_type),
    ]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 20])],
        [helper.make_tensor_value_info("evidence", evidence_type, ["N", 15])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with_head(tmp_path / "scene15", "gist", model.SerializeToString())
    answers = {}
    for device in ("cuda", "cpu"):
        loaded = load_repository(Settings(model_dir=tmp_path / "scene15", device=device)).get()
        assert isinstance(
            loaded.heads[{"cuda": CUDA, "cpu": CPU}[device]]["gist"],
            BoundHead if device == "cuda" else SessionHead,
        )
        answers[device] = runtime.predict(loaded, features_of(loaded, 3))
    np.testing.assert_array_equal(answers["cuda"].view_belief, answers["cpu"].view_belief)
    np.testing.assert_array_equal(answers["cuda"].probability, answers["cpu"].probability)
