"""Black-box, as its own process: the service starts only on verified models that load (with the GPU it was
told to need), with one process or several, and names the file at fault when it refuses."""

from __future__ import annotations

import json
import os
import shutil

import httpx
import pytest

from tests.service.conftest import MODELS, running_service, service_process, start_and_fail
from tests.service.test_reload import _until_every_worker_serves, worker_processes
from tests.service.test_service import metric, post, zeros_sample


def test_no_models_means_no_start(tmp_path):
    done = start_and_fail("--model-dir", str(tmp_path))
    assert done.returncode != 0
    assert "no manifest.json" in done.stdout + done.stderr


def test_require_gpu_refuses_to_start_on_cpu():
    done = start_and_fail("--model-dir", str(MODELS / "cub"), env={"DBF_REQUIRE_GPU": "true"})
    assert done.returncode != 0  # this machine has no GPU (and the device machine never runs CI)
    assert "DBF_REQUIRE_GPU is set but CUDA cannot run the heads" in done.stdout + done.stderr


def test_a_tampered_model_stops_the_service_naming_the_file(tmp_path):
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    head = tmp_path / "handwritten" / "fac.onnx"
    data = bytearray(head.read_bytes())
    data[-10] ^= 0xFF
    head.write_bytes(bytes(data))
    done = start_and_fail("--model-dir", str(tmp_path))
    assert done.returncode != 0
    assert "fac.onnx: checksum mismatch" in done.stdout + done.stderr


def test_a_missing_or_invalid_model_stops_the_service(tmp_path):
    shutil.copytree(MODELS / "pie", tmp_path / "pie")
    (tmp_path / "pie" / "lbp.onnx").unlink()
    done = start_and_fail("--model-dir", str(tmp_path / "pie"))  # a single model directory
    assert done.returncode != 0
    assert "lbp.onnx: cannot read model file" in done.stdout + done.stderr
    manifest = json.loads((MODELS / "pie" / "manifest.json").read_text())
    manifest["views"][0]["dim"] = -1
    shutil.copy(MODELS / "pie" / "lbp.onnx", tmp_path / "pie" / "lbp.onnx")
    (tmp_path / "pie" / "manifest.json").write_text(json.dumps(manifest))
    done = start_and_fail("--model-dir", str(tmp_path / "pie"))
    assert done.returncode != 0
    assert "manifest.json: invalid manifest" in done.stdout + done.stderr


def test_a_single_model_directory_is_served(tmp_path):
    with running_service("--model-dir", str(MODELS / "cub")) as base:
        assert httpx.get(base + "/ready").json()["models"] == ["cub"]
        assert post(base, {"samples": [zeros_sample(image=1024, text=300)]}).json()["model"] == "cub"


def test_metrics_add_up_across_worker_processes():
    with running_service("--model-dir", str(MODELS / "cub"), "--workers", "2") as base:
        for _ in range(12):  # a new connection each time: both workers serve some
            assert (
                httpx.post(base + "/predict", json={"samples": [zeros_sample(text=300)] * 2}).status_code
                == 200
            )
        assert metric(base, "dbf_predictions_total", model="cub", method="dbf") == 24
        assert metric(base, "dbf_model_info", model="cub", view="text", provider="CPUExecutionProvider") == 1


def test_the_workers_sessions_run_no_more_threads_than_the_process_has_cores():
    """Each worker process builds its own onnxruntime sessions, each with DBF_ONNX_THREADS threads: two
    workers on one core with DBF_ONNX_THREADS=4 held 18 threads more each than with 1 (HandWritten's 6
    heads x 3), 8 threads ready to compute on 1 core. A session gets at most the cores over the workers."""
    one_core = ("taskset", "-c", str(min(os.sched_getaffinity(0))))
    threads = {}
    for onnx_threads in ("1", "4"):
        env = {"DBF_ONNX_THREADS": onnx_threads}
        args = ("--model-dir", str(MODELS / "handwritten"), "--workers", "2", "--grpc-port", "0")
        with service_process(*args, env=env, under=one_core) as (url, service):
            workers = set(worker_processes(service.pid))
            _until_every_worker_serves(url, workers)  # every worker's sessions built
            threads[onnx_threads] = sorted(len(os.listdir(f"/proc/{pid}/task")) for pid in workers)
    assert all(a < b + 6 for a, b in zip(threads["4"], threads["1"], strict=True)), threads


def test_a_tampered_model_stops_every_worker_count(tmp_path):
    shutil.copytree(MODELS / "cub", tmp_path / "cub")
    head = tmp_path / "cub" / "text.onnx"
    head.write_bytes(head.read_bytes()[:-1] + b"\0")
    done = start_and_fail("--model-dir", str(tmp_path / "cub"), "--workers", "2")
    assert done.returncode != 0
    assert "text.onnx: checksum mismatch" in done.stderr


def test_a_head_with_the_wrong_signature_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    shutil.copytree(MODELS / "cub", tmp_path / "cub")
    graph = onnx.load(str(tmp_path / "cub" / "text.onnx"))
    graph.graph.input[0].name = "x"
    for node in graph.graph.node:
        node.input[:] = ["x" if name == "features" else name for name in node.input]
    content = graph.SerializeToString()
    (tmp_path / "cub" / "text.onnx").write_bytes(content)
    manifest = json.loads((tmp_path / "cub" / "manifest.json").read_text())
    manifest["views"][1]["sha256"] = __import__("hashlib").sha256(content).hexdigest()
    (tmp_path / "cub" / "manifest.json").write_text(json.dumps(manifest))
    done = start_and_fail("--model-dir", str(tmp_path / "cub"))
    assert done.returncode != 0
    assert "text.onnx: takes ['x']" in done.stderr


class _AnsweringPipe:
    """A stand-in for the pipe of uvicorn's health check to a worker that answers at once."""

    def send(self, message: bytes) -> None:
        pass

    def poll(self, timeout: float) -> bool:
        return True

    def recv(self) -> bool:
        return True


class _FakeWorker:
    """A stand-in for uvicorn's worker Process in :class:`service.server.WorkerSupervisor`'s bookkeeping."""

    started = 0

    def __init__(self, config=None, sockets=None, *, alive: bool = True, exitcode: int | None = None):
        _FakeWorker.started += 1
        self.pid = 1000 + _FakeWorker.started
        self.alive, self.exitcode = alive, exitcode
        self.process = self  # uvicorn's Process wraps a multiprocessing one: process.process.is_alive()
        self.parent_conn = _AnsweringPipe()  # the health check's: this one has always answered

    def is_alive(self, timeout: float = 5) -> bool:
        return self.alive

    def start(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def join(self) -> None:
        pass


def test_a_worker_that_fails_to_start_again_is_retried_while_another_serves(monkeypatch):
    """uvicorn stops every worker when a replacement exits STARTUP_FAILURE (its models no longer load: the
    directory changed since the start). WorkerSupervisor starts the slot again later while a sibling
    serves, forgets that once the slot holds a live worker (SIGHUP's restart put one there), and stops, to
    exit non-zero, only when none serves."""
    from uvicorn.config import STARTUP_FAILURE, Config

    from service import server

    monkeypatch.setattr(server, "Process", _FakeWorker)
    monkeypatch.setattr(server.metrics, "forget_processes", lambda pids: None)
    now = [100.0]
    monkeypatch.setattr(server.time, "monotonic", lambda: now[0])
    supervisor = server.WorkerSupervisor(Config(app=None, workers=2), sockets=[])
    failed, sibling = _FakeWorker(alive=False, exitcode=STARTUP_FAILURE), _FakeWorker()
    supervisor.processes = [failed, sibling]
    supervisor.keep_subprocess_alive()
    assert not supervisor.should_exit.is_set() and supervisor.processes == [failed, sibling]
    now[0] += 1.5  # past the first wait (1 s): started again
    supervisor.keep_subprocess_alive()
    replacement = supervisor.processes[0]
    assert replacement is not failed and replacement.alive
    replacement.alive, replacement.exitcode = False, STARTUP_FAILURE  # fails again: waits 2 s this time
    supervisor.keep_subprocess_alive()
    now[0] += 1.5
    supervisor.keep_subprocess_alive()
    assert supervisor.processes[0] is replacement
    restarted = supervisor.processes[0] = _FakeWorker()  # SIGHUP's restart put a live one in the slot
    now[0] += 1.0
    supervisor.keep_subprocess_alive()
    assert supervisor.processes[0] is restarted and not supervisor.retry_at
    restarted.alive, restarted.exitcode = False, STARTUP_FAILURE
    sibling.alive, sibling.exitcode = False, STARTUP_FAILURE
    supervisor.keep_subprocess_alive()
    assert supervisor.should_exit.is_set() and supervisor.failed


def test_workers_slow_to_start_are_not_killed_as_hung(tmp_path):
    """A worker answers uvicorn's health check only once its interpreter has started and imported the
    service (3 s on a busy 2-core VM; here 8 s more, as on a slower one). uvicorn's supervisor gives it 5 s,
    then kills it as hung and starts another, which fares no better: with two workers, one served and the
    other slot was killed and started again every 6 s for ever (the health checks run in turn, so the second
    worker had its first one later). A worker may take up to a minute to answer first."""
    slow = tmp_path / "slow-interpreter"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\n\ntime.sleep(8)\n")
    path = os.pathsep.join(filter(None, [str(slow), os.environ.get("PYTHONPATH")]))
    with service_process("--workers", "2", env={"PYTHONPATH": path}, timeout=120) as (url, service):
        workers = set(worker_processes(service.pid))
        assert len(workers) == 2
        _until_every_worker_serves(url, workers)
