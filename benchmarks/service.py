"""Load ``POST /predict`` with wrk and compare, in one run, with the yardstick: a bare FastAPI endpoint that
validates the same body with pydantic and returns a constant (:mod:`benchmarks.yardstick`), served by the
same uvicorn with the same settings (one worker, log level warning) and loaded by the same wrk.

Goals (issue 7): single-sample HandWritten requests at concurrency 16, at least 0.8x the yardstick's
requests/s; 256-sample requests, at least 1.5x its samples/s. Prints one row per case with throughput,
p50/p99 latency and the ratio to the yardstick (medians of alternated runs: shared machines are noisy);
asserts nothing.

    python -m benchmarks.service [--seconds 10] [--cases single,batch256,...] [--sweep 1,16,256,1024]
    python -m benchmarks.service --paired 12 --seconds 3 [--against ../old-checkout] --cases single

``--paired N`` keeps both servers up and loads them in N pairs of alternating short runs, so that a noisy
neighbour's drift hits both sides of each pair alike; the ratio is the median of the pairs' ratios, with
their quartiles. ``--against DIR`` compares with the service of another checkout (a release before, say)
instead of the yardstick.

``--device cpu|cuda|auto`` sets where the service runs the heads (``DBF_DEVICE``); the notes say where each
batch size ran. ``--model-dir`` takes any model: :mod:`benchmarks.mlp_model` makes one of real size.

``v2-json*`` cases send the same samples as Open Inference Protocol JSON tensors (as fast per sample as v1
JSON is the goal); :mod:`benchmarks.peers` compares that path with MLServer's.

``grpc*`` cases send the same samples over gRPC (ModelInfer, raw tensors) with h2load, and compare them
with REST binary tensors (``v2-binary*``: the same samples, binary answers) on the same service process,
loaded by wrk, in alternated pairs (``--paired`` of them, else ``--repeat``): ratio = gRPC / REST binary.
Goal (issue 26): at least 1 at 1 and at 256 samples. h2load (Debian: ``apt-get install nghttp2-client``)
counts HTTP statuses, and a gRPC error is HTTP 200: the request is checked once with a gRPC client first.

Needs ``wrk`` (Debian: ``apt-get install wrk``). Requests carry random features in the training data's
range, so the heads, fusion and response are the real ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np

from manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
WRK_SCRIPT = """
wrk.method = "POST"
for name, value in string.gmatch(os.getenv("WRK_HEADERS") or "", "([^=;]+)=([^;]*)") do
  wrk.headers[name] = value
end
local f = assert(io.open(os.getenv("WRK_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
"""


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass(frozen=True)
class Case:
    name: str
    samples: int
    concurrency: int
    path: str = "/predict"
    server_env: tuple[tuple[str, str], ...] = ()
    binary: bool = False
    v2_json: bool = False  # Open Inference Protocol tensors as JSON
    grpc: bool = False  # Open Inference Protocol over gRPC, raw tensors: against REST binary (grpc_paired)


CASES = {
    "single": Case("single", 1, 16),
    "single-unbatched": Case("single-unbatched", 1, 16, server_env=(("DBF_BATCHING", "false"),)),
    "single-delay2ms": Case("single-delay2ms", 1, 16, server_env=(("DBF_BATCH_MAX_DELAY_MS", "2"),)),
    "batch256": Case("batch256", 256, 4),
    "batch256-unbatched": Case("batch256-unbatched", 256, 4, server_env=(("DBF_BATCHING", "false"),)),
    "v2-json256": Case("v2-json256", 256, 4, path="/v2/models/{model}/infer", v2_json=True),
    "v2-json1": Case("v2-json1", 1, 16, path="/v2/models/{model}/infer", v2_json=True),
    "v2-binary256": Case("v2-binary256", 256, 4, path="/v2/models/{model}/infer", binary=True),
    "v2-binary1024": Case("v2-binary1024", 1024, 4, path="/v2/models/{model}/infer", binary=True),
    "grpc1": Case("grpc1", 1, 16, path=GRPC_INFER, grpc=True),
    "grpc256": Case("grpc256", 256, 4, path=GRPC_INFER, grpc=True),
}


@dataclass
class Load:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    errors: str


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; medians are printed")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "handwritten")
    parser.add_argument("--no-yardstick", action="store_true", help="only the service's own figures")
    parser.add_argument(
        "--sweep", default="", help="batch sizes for binary v2 requests at concurrency 4 (e.g. 1,16,256,1024)"
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        help="the service's DBF_DEVICE (default: its own default)",
    )
    parser.add_argument("--paired", type=int, default=0, help="pairs of alternating runs, both servers up")
    parser.add_argument(
        "--against", type=Path, help="with --paired: another checkout's service, not the yardstick"
    )
    args = parser.parse_args()
    if args.against and not args.paired:
        parser.error("--against needs --paired")
    for size in filter(None, args.sweep.split(",")):
        CASES[f"v2-sweep{size}"] = Case(
            f"v2-sweep{size}", int(size), 4, "/v2/models/{model}/infer", binary=True
        )
        args.cases += f",v2-sweep{size}"
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk")
    manifest = Manifest.model_validate_json((args.model_dir / "manifest.json").read_text())
    cases = [CASES[name] for name in args.cases.split(",")]
    if args.device:  # where the heads run (service.placement): set for every case's service
        device = (("DBF_DEVICE", args.device),)
        cases = [replace(case, server_env=case.server_env + device) for case in cases]
    baseline = f"the service of {args.against}" if args.against else "yardstick (bare FastAPI + pydantic)"
    # the services started inherit the environment: DBF_WORKERS=8 runs eight worker processes each
    workers = os.environ.get("DBF_WORKERS", "1")
    workers = "one uvicorn worker" if workers == "1" else f"uvicorn workers: {workers} (DBF_WORKERS)"
    if args.paired:
        print(
            f"# service benchmark: model {manifest.name}, wrk, {workers} each; both servers up, "
            f"{args.paired} pairs of alternating {args.seconds} s runs; medians"
        )
    else:
        print(
            f"# service benchmark: model {manifest.name}, wrk, {workers}; per case the median of "
            f"{args.repeat} runs of {args.seconds} s, yardstick and service alternated"
        )
    print(f"# {os.cpu_count()} cores; ratio = service / {baseline} (grpc cases: gRPC / REST binary tensors)")
    header = f"{'case':<20}{'samples':>8}{'conc':>5} {'server':<18}{'req/s':>9}{'samples/s':>11}"
    print(header + f"{'p50 ms':>9}{'p99 ms':>9}{'ratio':>7}  notes")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT)
        for case in cases:
            json_path = Path(tmp) / f"{case.name}.json"
            json_path.write_bytes(json_body(args.model_dir, case.samples))
            body, headers = json_path, {"Content-Type": "application/json"}
            if case.binary:
                body = Path(tmp) / f"{case.name}.bin"
                content, headers = _binary_body(args.model_dir, case.samples)
                body.write_bytes(content)
            elif case.v2_json:
                body = Path(tmp) / f"{case.name}.v2.json"
                body.write_bytes(v2_json_body(args.model_dir, case.samples))
            if case.grpc:
                grpc_paired(case, manifest, args, Path(tmp), script)
                continue
            if args.paired:
                paired(case, manifest, args, json_path, body, headers, script)
                continue
            yardstick_runs, service_runs, provider = [], [], ""
            sides = ["service"] if args.no_yardstick else ["yardstick", "service"]
            for repeat in range(args.repeat):  # alternated, so that a noisy neighbour hits both alike
                for side in alternated(sides, repeat):
                    if side == "yardstick":  # the same samples as JSON: the yardstick has no binary path
                        with Server(["uvicorn", "benchmarks.yardstick:app"], {}) as url:
                            json_headers = {"Content-Type": "application/json"}
                            yardstick_runs.append(
                                wrk_load(
                                    url + "/predict", json_path, json_headers, case, args.seconds, script
                                )
                            )
                        continue
                    command = ["service", "--model-dir", str(args.model_dir)]
                    with Server(command, dict(case.server_env)) as url:
                        placement = httpx.get(url + "/v1/models").json()["models"][0]["placement"]
                        provider = ", ".join(
                            f"{b['provider']} {b['from_samples']}-{b['to_samples'] or ''}"
                            for b in placement["batches"]
                        )
                        path = case.path.format(model=manifest.name)
                        service_runs.append(wrk_load(url + path, body, headers, case, args.seconds, script))
            baseline = median(yardstick_runs) if yardstick_runs else None
            if baseline:
                print_row(case, "yardstick", baseline, None, "")
            print_row(case, "service", median(service_runs), baseline, provider)


def alternated(sides: list[str], repeat: int) -> list[str]:
    """The order the ``sides`` run in, in the ``repeat``-th round: as given, reversed every other round, so
    that none always runs first or last."""
    return sides if repeat % 2 == 0 else sides[::-1]


def paired(case: Case, manifest: Manifest, args, json_path: Path, body: Path, headers, script: Path) -> None:
    """Both servers up; ``args.paired`` pairs of runs, which goes first alternating; the ratio printed is the
    median of the pairs' ratios (their quartiles in the notes)."""
    path = case.path.format(model=manifest.name)
    service = Server(["service", "--model-dir", str(args.model_dir)], dict(case.server_env))
    if args.against:
        checkout = args.against.resolve()
        other = Server(
            ["service", "--model-dir", str(checkout / _inside_checkout(args.model_dir))],
            dict(case.server_env),
            cwd=checkout,
        )
        other_url, other_body, other_headers = path, body, headers
    else:  # the same samples as JSON: the yardstick has no binary path
        other = Server(["uvicorn", "benchmarks.yardstick:app"], {})
        other_url, other_body, other_headers = "/predict", json_path, {"Content-Type": "application/json"}
    runs: dict[str, list[Load]] = {"other": [], "service": []}
    with service as service_root, other as other_root:
        targets = {
            "service": (service_root + path, body, headers),
            "other": (other_root + other_url, other_body, other_headers),
        }
        for i in range(args.paired):
            for side in ("service", "other") if i % 2 else ("other", "service"):
                url, sent, sent_headers = targets[side]
                runs[side].append(wrk_load(url, sent, sent_headers, case, args.seconds, script))
    ratios = [
        s.requests_per_s / o.requests_per_s for s, o in zip(runs["service"], runs["other"], strict=True)
    ]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print_row(case, "against" if args.against else "yardstick", median(runs["other"]), None, "")
    notes = f"paired ratio quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}"
    print_row(case, "service", median(runs["service"]), None, notes, ratio=statistics.median(ratios))


def grpc_paired(case: Case, manifest: Manifest, args, tmp: Path, script: Path) -> None:
    """gRPC (h2load) against REST binary tensors (wrk) with the same samples, on one service process, in
    alternated pairs; the ratio printed is the median of the pairs' ratios (their quartiles in the notes)."""
    if shutil.which("h2load") is None:
        sys.exit("h2load not found: apt-get install nghttp2-client")
    rest_body = tmp / f"{case.name}.rest.bin"
    content, rest_headers = _binary_body(args.model_dir, case.samples)
    rest_body.write_bytes(content)
    grpc_body = tmp / f"{case.name}.grpc"
    grpc_body.write_bytes(grpc_frame(grpc_request(args.model_dir, case.samples, manifest.name)))
    grpc_port = _free_port()
    command = ["service", "--model-dir", str(args.model_dir), "--grpc-port", str(grpc_port)]
    runs: dict[str, list[Load]] = {"rest-binary": [], "grpc": []}
    with Server(command, dict(case.server_env)) as url:
        grpc_url = f"http://127.0.0.1:{grpc_port}{case.path}"
        check_grpc(f"127.0.0.1:{grpc_port}", grpc_body.read_bytes())
        rest_url = url + f"/v2/models/{manifest.name}/infer"
        for i in range(args.paired or args.repeat):
            for side in ("grpc", "rest-binary") if i % 2 else ("rest-binary", "grpc"):
                if side == "grpc":
                    runs[side].append(h2load_load(grpc_url, grpc_body, case, args.seconds))
                else:
                    load = wrk_load(rest_url, rest_body, rest_headers, case, args.seconds, script)
                    runs[side].append(load)
    ratios = [
        g.requests_per_s / r.requests_per_s for g, r in zip(runs["grpc"], runs["rest-binary"], strict=True)
    ]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print_row(case, "rest-bin", median(runs["rest-binary"]), None, "wrk, binary tensors")
    notes = f"h2load; paired ratio quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}"
    print_row(case, "grpc", median(runs["grpc"]), None, notes, ratio=statistics.median(ratios))


def grpc_request(model_dir: Path, n: int, model: str) -> bytes:
    """The same samples as :func:`_binary_body`, as a ModelInferRequest with raw tensors (as tritonclient
    sends them), all outputs asked for."""
    from service.proto import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    for view, features in sample_features(model_dir, n).items():
        request.inputs.add(name=view, datatype="FP32", shape=features.shape)
        request.raw_input_contents.append(np.ascontiguousarray(features, "<f4").tobytes())
    return request.SerializeToString()


def grpc_frame(message: bytes) -> bytes:
    """A gRPC message on the wire (what h2load sends as the body): not compressed, its length, itself."""
    return b"\0" + len(message).to_bytes(4, "big") + message


def check_grpc(address: str, framed: bytes) -> bytes:
    """One ModelInfer with the body h2load will send, by a gRPC client: it must succeed (h2load cannot
    tell: a gRPC error is HTTP 200). Returns the answer (a serialised ModelInferResponse)."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        infer = channel.unary_unary(GRPC_INFER)  # bytes in, bytes out
        return infer(framed[5:], timeout=30)  # raises on any status but OK


def h2load_load(url: str, body: Path, case: Case, seconds: int) -> Load:
    """h2load's load of ``url`` with gRPC calls of ``body`` (a framed message): ``case.concurrency``
    connections of one stream each (as wrk's connections), after 2 s of warm-up; percentiles from its
    per-request log."""
    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        command = [
            "h2load", "-t1", f"-c{case.concurrency}", "-m1", f"-D{seconds}", "--warm-up-time=2",
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body),
            f"--log-file={log.name}", url,
        ]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        times = sorted(
            int(line.split()[2]) / 1000 for line in Path(log.name).read_text().splitlines() if line
        )
    done = re.search(
        r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored", out
    )
    return Load(
        requests_per_s=float(re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", out).group(1)),
        p50_ms=times[len(times) // 2],
        p99_ms=times[min(len(times) - 1, int(0.99 * len(times)))],
        non_2xx=int(done.group(2)) + int(done.group(3)),
        errors="",
    )


def _free_port() -> int:
    from tests.service.conftest import free_port

    return free_port()


def _inside_checkout(model_dir: Path) -> Path:
    """``model_dir`` as a path within a checkout (the same model in the other checkout)."""
    resolved = model_dir.resolve()
    return resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved


def median(runs: list[Load]) -> Load:
    """Per field, the median over the runs (socket errors and non-2xx answers: the sum)."""
    return Load(
        requests_per_s=statistics.median(r.requests_per_s for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        non_2xx=sum(r.non_2xx for r in runs),
        errors=" ".join(r.errors for r in runs if r.errors),
    )


def print_row(
    case: Case, server: str, load: Load, baseline: Load | None, notes: str, *, ratio: float | None = None
) -> None:
    """One row; the ratio is to ``baseline``'s throughput, or ``ratio`` as given."""
    if baseline:
        ratio = load.requests_per_s / baseline.requests_per_s
    shown = f"{ratio:7.2f}" if ratio is not None else f"{'':>7}"
    if load.non_2xx or load.errors:
        notes += f" non-2xx {load.non_2xx} {load.errors}".rstrip()
    print(
        f"{case.name:<20}{case.samples:>8}{case.concurrency:>5} {server:<18}{load.requests_per_s:>9.1f}"
        f"{load.requests_per_s * case.samples:>11.0f}{load.p50_ms:>9.2f}{load.p99_ms:>9.2f}{shown}  {notes}",
        flush=True,
    )


def sample_features(model_dir: Path, n: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` samples of each view's features, float32, uniform within the view's training range: a view far
    outside it is fused as missing, another path than the one measured."""
    from training.export import training_ranges

    rng = np.random.default_rng(seed)
    return {
        view: (minimum + rng.random((n, minimum.size)) * span).astype(np.float32)
        for view, (minimum, span) in training_ranges(model_dir).items()
    }


def json_body(model_dir: Path, n: int) -> bytes:
    samples = sample_features(model_dir, n)
    views = [{view: features[i].tolist() for view, features in samples.items()} for i in range(n)]
    return json.dumps({"samples": [{"views": sample} for sample in views]}).encode()


def v2_json_body(model_dir: Path, n: int) -> bytes:
    """The same samples as :func:`json_body`, as Open Inference Protocol tensors in JSON (flat data, as
    tritonclient and kserve send them), all outputs asked for."""
    inputs = [
        {"name": view, "datatype": "FP32", "shape": list(features.shape), "data": features.ravel().tolist()}
        for view, features in sample_features(model_dir, n).items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def _binary_body(model_dir: Path, n: int) -> tuple[bytes, dict[str, str]]:
    from service.v2 import encode_request  # the binary path's own encoder, as a client would use it

    return encode_request(sample_features(model_dir, n))


class Server:
    """``python -m <module> ...`` on a free port until the block ends (or ``argv(port)``, a command of one's
    own, ready once ``ready_path`` answers)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        *,
        argv: Callable[[int], list[str]] | None = None,
        ready_path: str = "/docs",
        cwd: Path = ROOT,
    ) -> None:
        from tests.service.conftest import free_port

        self.port = free_port()
        if argv is not None:
            self.command = argv(self.port)
        else:
            module, *rest = command
            self.command = [
                sys.executable,
                "-m",
                module,
                *rest,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ]
            self.command += ["--log-level", "warning"]
        # No gRPC unless asked (--grpc-port): its default port, 8081, may be another server's here.
        self.env = {**os.environ, "DBF_GRPC_PORT": "0", **env}
        self.ready_path = ready_path
        self.cwd = cwd  # the checkout whose code runs (python -m imports from it)

    def __enter__(self) -> str:
        # A session of its own: stopping it stops the worker processes it starts too (MLServer's pool).
        self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, start_new_session=True)
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + self.ready_path, timeout=1.0).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self._stop(signal.SIGKILL)
        raise TimeoutError(f"{self.command} did not start")

    def __exit__(self, *_: object) -> None:
        self._stop(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # MLServer 1.7 can hang stopping its inference pool
            self._stop(signal.SIGKILL)
            self.proc.wait()

    def _stop(self, stop: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self.proc.pid, stop)


def wrk_load(url: str, body: Path, headers: dict[str, str], case: Case, seconds: int, script: Path) -> Load:
    env = {
        **os.environ,
        "WRK_BODY": str(body),
        "WRK_HEADERS": ";".join(f"{k}={v}" for k, v in headers.items()),
    }
    # Warm up (first requests build caches and thread pools), then measure.
    warm = ["wrk", "-t1", f"-c{case.concurrency}", "-d2s", "-s", str(script), url]
    subprocess.run(warm, env=env, capture_output=True, check=True)
    command = ["wrk", "-t1", f"-c{case.concurrency}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return Load(
        requests_per_s=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        p50_ms=_millis(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),
        p99_ms=_millis(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),
        non_2xx=int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0,
        errors=m.group(0) if (m := re.search(r"Socket errors:.*", out)) else "",
    )


def _millis(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    value, unit = match.groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


if __name__ == "__main__":
    main()
