"""dbf-serve against peers on the same job: the same heads and fusion (:mod:`benchmarks.peer_model`) served
by MLServer 1.7 as a custom runtime (:mod:`benchmarks.mlserver_runtime`) and by KServe's Python model server
as a custom model (:mod:`benchmarks.kserve_runtime`), all asked the same Open Inference Protocol requests
in one run, alternated: JSON tensors over REST by wrk (``v2-json*`` cases), raw tensors over gRPC by h2load
(``grpc*`` cases, each server's gRPC port; the request checked once by a gRPC client first). MLServer runs
three times: as installed (its default, one inference worker process), with ``parallel_workers`` 0
(inference in the server process, as dbf-serve does it) and with its adaptive batching on
(``mlserver-batching``: off unless a model's settings turn it on, and dbf-serve micro-batches by default);
KServe (whose Python server has no batching of its own) as installed, its per-request logs off (latency,
timing and access lines: dbf-serve runs at ``--log-level warning``).

    python -m benchmarks.peers [--seconds 8] [--repeat 3] [--cases v2-json256,v2-json1,grpc256,grpc1]
                               [--peers mlserver,mlserver-0,mlserver-batching,kserve]
                               [--workers N] [--venv DIR]

``--workers N`` gives each server N processes where its design allows: dbf-serve ``DBF_WORKERS`` (each
serving REST and gRPC), KServe ``--workers`` (REST only: its gRPC server stays in the main process),
MLServer ``parallel_workers`` (inference processes behind its one front-end process, which decodes every
request; ``mlserver-batching`` too); ``mlserver-0`` keeps 0. Without it each runs as installed: dbf-serve
and KServe one process, MLServer one inference worker.

MLServer and dbf-serve pin different FastAPI releases, so MLServer gets its own virtual environment
(``--venv``, made on first use: ``pip install mlserver==1.7.1 'uvloop<0.22' onnxruntime numpy
array-api-compat``); KServe runs in this environment. Prints throughput, p50/p99 latency and the ratio
dbf-serve / the peer; asserts nothing. Needs ``wrk``, and ``h2load`` for the gRPC cases. Every server runs
the heads on the CPU (dbf-serve with ``DBF_DEVICE=cpu``), whatever the host has.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.service import (
    CASES,
    ROOT,
    WRK_SCRIPT,
    Case,
    Load,
    Server,
    alternated,
    check_grpc,
    grpc_frame,
    grpc_request,
    h2load_load,
    median,
    print_row,
    v2_json_body,
    wrk_load,
)
from manifest import Manifest
from service.outputs import TENSORS
from service.proto import grpc_predict_v2_pb2 as pb
from tests.service.conftest import free_port

MLSERVER = "mlserver==1.7.1"
PEERS = "mlserver,mlserver-0,mlserver-batching,kserve"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs per server and case; medians are printed")
    parser.add_argument("--cases", default="v2-json256,v2-json1,grpc256,grpc1")
    parser.add_argument("--peers", default=PEERS)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "handwritten")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-mlserver", help="MLServer's environment")
    parser.add_argument("--workers", type=int, default=None, help="processes per server (see above)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk")
    peers = args.peers.split(",")
    mlserver = _mlserver_environment(args.venv) if any(p.startswith("mlserver") for p in peers) else None
    manifest = Manifest.model_validate_json((args.model_dir / "manifest.json").read_text())
    print(
        f"# dbf-serve vs {', '.join(peers)} ({MLSERVER}; kserve's model server), same heads and fusion, "
        f"model {manifest.name}; median of {args.repeat} alternated runs of {args.seconds} s; "
        f"{os.cpu_count()} cores; "
        f"{'as installed' if args.workers is None else f'--workers {args.workers}'}; "
        "ratio = dbf-serve / the peer's row above it"
    )
    header = f"{'case':<20}{'samples':>8}{'conc':>5} {'server':<18}{'req/s':>9}{'samples/s':>11}"
    print(header + f"{'p50 ms':>9}{'p99 ms':>9}{'ratio':>7}  notes")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT)
        for name in args.cases.split(","):
            case = CASES[name]
            body = Path(tmp) / f"{name}.body"
            if case.grpc:
                body.write_bytes(grpc_frame(grpc_request(args.model_dir, case.samples, manifest.name)))
            else:
                body.write_bytes(v2_json_body(args.model_dir, case.samples))

            runs: dict[str, list[Load]] = {label: [] for label in (*peers, "dbf-serve")}
            for repeat in range(args.repeat):
                for label in run_order(peers, repeat):
                    if label == "dbf-serve":
                        server, grpc_port = _dbf_serve(args.model_dir, args.workers)
                    else:
                        server, grpc_port = _peer(label, mlserver, args.model_dir, Path(tmp), args.workers)
                    with server as url:
                        runs[label].append(_load(case, body, url, grpc_port, args, script))
            for label in peers:
                print_row(
                    case, label, median(runs[label]), None, NOTES.get(label, "").format(**MLSERVER_BATCHING)
                )
                print_row(case, "dbf-serve", median(runs["dbf-serve"]), median(runs[label]), "")


def run_order(peers: list[str], repeat: int) -> list[str]:
    """Which server runs when in the ``repeat``-th round: the peers then dbf-serve, reversed every other
    round (:func:`benchmarks.service.alternated`), so that none always runs first or last, just after
    another's start and stop."""
    return alternated([*peers, "dbf-serve"], repeat)


NOTES = {
    "mlserver-0": "parallel_workers 0",
    "mlserver-batching": "adaptive batching, up to {max_batch_size} requests, {max_batch_time} s",
}

# MLServer's adaptive batching (its documented setting for throughput; off unless a model's settings turn it
# on), set as dbf-serve's micro-batching is by default: one-sample requests are batched as the benchmark's
# concurrency (16) allows, waiting at most 1 ms (dbf-serve's REST batches do not wait, its gRPC ones wait 1 ms
# and up to 3; MLServer does not batch at 0). A starting point, not tuned: MLServer's documentation leaves the
# values to experiment.
MLSERVER_BATCHING = {"max_batch_size": 16, "max_batch_time": 0.001}


def _load(case: Case, body: Path, url: str, grpc_port: int, args: argparse.Namespace, script: Path) -> Load:
    """One run of ``case`` against a server: over gRPC (h2load) or REST (wrk)."""
    if case.grpc:
        address = f"127.0.0.1:{grpc_port}"
        answer = pb.ModelInferResponse.FromString(check_grpc(address, body.read_bytes()))
        _check_outputs(address, {output.name for output in answer.outputs})
        return h2load_load(f"http://{address}{case.path}", body, case, args.seconds)
    path = case.path.format(model=_model_name(args.model_dir))
    _check_rest(url + path, body.read_bytes())
    return wrk_load(url + path, body, {"Content-Type": "application/json"}, case, args.seconds, script)


def _check_rest(url: str, body: bytes) -> None:
    """One request with the body wrk will send: it must be answered (a server answering errors is fast,
    and its ratio meaningless: KServe's peer answered 500 to requests without an id), with every output."""
    answer = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    if answer.status_code != 200:
        raise SystemExit(f"{url} answered {answer.status_code}, not 200: {answer.text[:300]}")
    _check_outputs(url, {output["name"] for output in answer.json()["outputs"]})


def _check_outputs(server: str, names: set[str]) -> None:
    """Every server answers every tensor dbf-serve answers (a peer answering fewer does less work: the
    MLServer peer of 2026-11-23 answered 10 of the 13 and nothing said so)."""
    if missing := sorted(set(TENSORS) - names):
        raise SystemExit(
            f"{server} answered without {', '.join(missing)}: a ratio against it compares less work"
        )


def _dbf_serve(model_dir: Path, workers: int | None) -> tuple[Server, int]:
    """dbf-serve on the model with ``workers`` processes (None: its default, one), and its gRPC port.

    Its heads on the CPU, where the peers run theirs (:class:`benchmarks.peer_model.PeerModel`): its default
    device, ``auto``, would put large batches on a GPU where the host has one.
    """
    grpc_port = free_port()
    command = ["service", "--model-dir", str(model_dir), "--grpc-port", str(grpc_port)]
    env = {"DBF_DEVICE": "cpu", **({} if workers is None else {"DBF_WORKERS": str(workers)})}
    return Server(command, env, ready_path="/ready"), grpc_port


def _peer(
    label: str, mlserver: Path | None, model_dir: Path, tmp: Path, workers: int | None
) -> tuple[Server, int]:
    """The peer ``label``'s server with ``workers`` processes (None: as installed), and its gRPC port."""
    grpc_port = free_port()
    if label == "kserve":
        return _kserve(model_dir, grpc_port, workers), grpc_port
    parallel_workers = 0 if label == "mlserver-0" else workers
    settings = model_settings(model_dir, batching=label == "mlserver-batching")
    return _mlserver(mlserver, settings, tmp, parallel_workers, grpc_port), grpc_port


def _kserve(model_dir: Path, grpc_port: int, workers: int | None) -> Server:
    """KServe's model server on the model with :class:`benchmarks.kserve_runtime.DBFModel`, logging
    warnings only (:data:`benchmarks.kserve_runtime.LOGGING`), as dbf-serve does here."""

    def argv(port: int) -> list[str]:
        return [
            sys.executable, "-m", "benchmarks.kserve_runtime", "--model-dir", str(model_dir),
            "--http_port", str(port), "--grpc_port", str(grpc_port), "--enable_latency_logging", "false",
            *([] if workers is None else ["--workers", str(workers)]),
        ]  # fmt: skip

    return Server([], {}, argv=argv, ready_path=f"/v2/models/{_model_name(model_dir)}/ready")


def _model_name(model_dir: Path) -> str:
    return Manifest.model_validate_json((model_dir / "manifest.json").read_text()).name


def _mlserver_environment(venv: Path) -> Path:
    """The ``mlserver`` command of ``venv``, installing MLServer there first if need be."""
    command = venv / "bin" / "mlserver"
    if not command.exists():
        print(f"# installing {MLSERVER} into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # uvloop < 0.22: MLServer 1.7's inference workers call asyncio.get_event_loop(), which later uvloop
        # releases refuse outside a running loop (every worker then dies at start).
        packages = [MLSERVER, "uvloop<0.22", "onnxruntime", "numpy", "array-api-compat"]
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages], check=True
        )
    return command


def model_settings(model_dir: Path, *, batching: bool) -> dict[str, object]:
    """MLServer's ``model-settings.json`` for the model with :class:`benchmarks.mlserver_runtime.DBFRuntime`,
    with :data:`MLSERVER_BATCHING` where ``batching``."""
    return {
        "name": "handwritten",
        "implementation": "benchmarks.mlserver_runtime.DBFRuntime",
        "parameters": {"uri": str(model_dir.resolve())},
        **(MLSERVER_BATCHING if batching else {}),
    }


def _mlserver(
    command: Path, model: dict[str, object], tmp: Path, parallel_workers: int | None, grpc_port: int
) -> Server:
    """MLServer serving ``model`` (its :func:`model_settings`)."""

    def argv(port: int) -> list[str]:
        home = Path(tempfile.mkdtemp(dir=tmp))
        settings = {
            "host": "127.0.0.1",
            "http_port": port,
            "grpc_port": grpc_port,
            "metrics_port": free_port(),
            # Its default, True, logs every request (uvicorn's access log); dbf-serve runs at warning.
            "debug": False,
        }
        if parallel_workers is not None:
            settings["parallel_workers"] = parallel_workers
        (home / "settings.json").write_text(json.dumps(settings))
        (home / "handwritten").mkdir()
        (home / "handwritten" / "model-settings.json").write_text(json.dumps(model))
        return [str(command), "start", str(home)]

    # The runtime and the fusion package come from this repository. (MLServer 1.7 has no logging level
    # setting: MLSERVER_LOGGING_LEVEL, set here before, changed nothing; debug off is what quiets it.)
    env = {"PYTHONPATH": str(ROOT)}
    return Server([], env, argv=argv, ready_path="/v2/models/handwritten/ready")


if __name__ == "__main__":
    try:
        main()
    except httpx.HTTPError as error:
        sys.exit(f"error: {error}")
