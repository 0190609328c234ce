"""``benchmarks.peers`` runs each peer as dbf-serve runs there: equal work beside the serving itself."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from benchmarks import peers
from benchmarks.peer_model import PeerModel
from benchmarks.service import check_grpc, grpc_frame, grpc_request, v2_json_body
from service.outputs import TENSORS

ROOT = Path(__file__).resolve().parents[2]


def test_kserves_peer_logs_no_line_per_request_as_dbf_serve_logs_none(tmp_path, capfd):
    """dbf-serve runs at ``--log-level warning``; KServe's own logging configuration wrote three lines to
    stdout per REST request (uvicorn's access line, its timing middleware's wall and CPU lines) and one per
    gRPC call (its logging interceptor), work in the timed loop that dbf-serve did not do."""
    directory = ROOT / "models" / "handwritten"
    server, grpc_port = peers._peer("kserve", None, directory, tmp_path, None)
    body = v2_json_body(directory, 1)
    call = grpc_frame(grpc_request(directory, 1, "handwritten"))
    with server as url:
        capfd.readouterr()  # what it wrote while starting
        for _ in range(3):
            peers._check_rest(f"{url}/v2/models/handwritten/infer", body)
            check_grpc(f"127.0.0.1:{grpc_port}", call)
    out, err = capfd.readouterr()
    assert "/infer" not in out + err
    assert "kserve.trace" not in out + err
    assert "ModelInfer" not in out + err


def test_kserves_restarted_worker_processes_log_no_line_per_request_either(tmp_path, capfd):
    """With ``--workers``, KServe starts a REST worker process again when one misses a heartbeat (a busy
    machine's start did), and gives the new one no ``--log_config_file``: it logged every request at INFO."""
    directory = ROOT / "models" / "handwritten"
    server, _ = peers._peer("kserve", None, directory, tmp_path, 2)
    body = v2_json_body(directory, 1)
    with server as url:
        workers = _rest_workers(server.proc.pid)
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (len(_rest_workers(server.proc.pid) - workers) == 2 and _ready(url)):
            assert time.monotonic() < deadline, "KServe started no new worker processes"
            time.sleep(0.5)
        capfd.readouterr()  # what they wrote while starting
        for _ in range(4):
            peers._check_rest(f"{url}/v2/models/handwritten/infer", body)
    out, err = capfd.readouterr()
    assert "/infer" not in out + err
    assert "kserve.trace" not in out + err


def _rest_workers(parent: int) -> set[int]:
    """The worker processes KServe's ``parent`` has spawned (not multiprocessing's resource tracker)."""
    workers = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if ppid == parent and b"spawn_main" in command and b"resource_tracker" not in command:
            workers.add(int(stat.parent.name))
    return workers


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/models/handwritten/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_mlserver_runs_with_its_adaptive_batching_too_as_dbf_serve_micro_batches_by_default(tmp_path):
    """MLServer batches no requests unless a model's settings give ``max_batch_size`` over 1 and
    ``max_batch_time`` over 0 (its documented setting for throughput); dbf-serve micro-batches one-sample
    requests by default, which doubles their throughput: the peers ran MLServer without it."""
    directory = ROOT / "models" / "handwritten"
    assert "mlserver-batching" in peers.PEERS.split(",")
    batching = tmp_path / "batching"
    batching.mkdir()
    peers._peer("mlserver-batching", Path("mlserver"), directory, batching, None)  # writes its settings
    (written,) = batching.rglob("model-settings.json")
    settings = json.loads(written.read_text())
    assert settings["max_batch_size"] > 1
    assert settings["max_batch_time"] > 0
    assert settings["implementation"] == "benchmarks.mlserver_runtime.DBFRuntime"
    as_installed = tmp_path / "as-installed"
    as_installed.mkdir()
    peers._peer("mlserver", Path("mlserver"), directory, as_installed, None)
    (written,) = as_installed.rglob("model-settings.json")
    assert "max_batch_size" not in json.loads(written.read_text())


def test_dbf_serve_runs_its_heads_on_the_cpu_as_the_peers_do():
    """The peers' heads run on onnxruntime's CPU provider only; dbf-serve's default device, ``auto``, puts
    large batches on a GPU where the host has one: on a GPU machine the ratios compared a GPU with CPUs."""
    directory = ROOT / "models" / "handwritten"
    assert {
        provider for session in PeerModel(directory).sessions.values() for provider in session.get_providers()
    } == {"CPUExecutionProvider"}
    server, grpc_port = peers._dbf_serve(directory, None)
    assert server.env["DBF_DEVICE"] == "cpu"
    assert ["--grpc-port", str(grpc_port)] == server.command[server.command.index("--grpc-port") :][:2]
    server, _ = peers._dbf_serve(directory, 2)
    assert server.env["DBF_WORKERS"] == "2"


def test_each_round_of_runs_reverses_the_order_of_the_one_before():
    """dbf-serve ran last in every round, each time straight after a peer's server stopped."""
    assert peers.run_order(["mlserver", "kserve"], 0) == ["mlserver", "kserve", "dbf-serve"]
    assert peers.run_order(["mlserver", "kserve"], 1) == ["dbf-serve", "kserve", "mlserver"]
    assert peers.run_order(["mlserver", "kserve"], 2) == ["mlserver", "kserve", "dbf-serve"]


def test_a_server_answering_fewer_outputs_than_dbf_serve_is_refused_before_timing(monkeypatch):
    """The peers' answers were checked for a 200 only: the MLServer peer of 2026-11-23 answered 10 of
    dbf-serve's 13 tensors (no confidence, prediction set or range check), and its ratios were printed."""
    every = [{"name": name, "datatype": "FP32", "shape": [1], "data": [0.0]} for name in TENSORS]
    fewer = [output for output in every if output["name"] not in {"confidence", "prediction_set"}]
    for outputs, refused in ((every, False), (fewer, True)):
        answer = httpx.Response(200, json={"model_name": "handwritten", "outputs": outputs})
        monkeypatch.setattr(peers.httpx, "post", lambda *_, answer=answer, **__: answer)
        if refused:
            with pytest.raises(SystemExit, match="confidence, prediction_set"):
                peers._check_rest("http://peer/v2/models/handwritten/infer", b"{}")
        else:
            peers._check_rest("http://peer/v2/models/handwritten/infer", b"{}")
