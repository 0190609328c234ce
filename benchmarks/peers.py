"""dbf-serve against a peer on the same job: the same heads and fusion served by MLServer 1.7 as a custom
runtime (:mod:`benchmarks.mlserver_runtime`), both asked with the Open Inference Protocol's JSON tensors by
the same wrk, in one run, alternated. MLServer runs twice: as installed (its default, one inference worker
process) and with ``parallel_workers`` 0 (inference in the server process, as dbf-serve does it).

    python -m benchmarks.peers [--seconds 8] [--repeat 3] [--cases v2-json256,v2-json1] [--venv DIR]

MLServer and dbf-serve pin different FastAPI releases, so MLServer gets its own virtual environment
(``--venv``, made on first use: ``pip install mlserver==1.7.1 'uvloop<0.22' onnxruntime numpy
array-api-compat``). Prints throughput, p50/p99 latency and the ratio dbf-serve / MLServer; asserts
nothing. Needs ``wrk``.
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

from benchmarks.service import CASES, ROOT, WRK_SCRIPT, Server, median, print_row, v2_json_body, wrk_load
from manifest import Manifest

MLSERVER = "mlserver==1.7.1"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs per server and case; medians are printed")
    parser.add_argument("--cases", default="v2-json256,v2-json1")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "handwritten")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-mlserver", help="MLServer's environment")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk")
    mlserver = _mlserver_environment(args.venv)
    manifest = Manifest.model_validate_json((args.model_dir / "manifest.json").read_text())
    print(
        f"# dbf-serve vs {MLSERVER} (custom runtime, same heads and fusion), model {manifest.name}, "
        f"OIP v2 JSON tensors, wrk; median of {args.repeat} alternated runs of {args.seconds} s; "
        f"{os.cpu_count()} cores; ratio = dbf-serve / the MLServer row above it"
    )
    header = f"{'case':<20}{'samples':>8}{'conc':>5} {'server':<10}{'req/s':>9}{'samples/s':>11}"
    print(header + f"{'p50 ms':>9}{'p99 ms':>9}{'ratio':>7}  notes")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT)
        headers = {"Content-Type": "application/json"}
        for name in args.cases.split(","):
            case = CASES[name]
            body = Path(tmp) / f"{name}.json"
            body.write_bytes(v2_json_body(args.model_dir, case.samples))
            path = case.path.format(model=manifest.name)
            runs: dict[str, list] = {"mlserver": [], "mlserver-0": [], "dbf-serve": []}
            for _ in range(args.repeat):
                for workers, label in ((None, "mlserver"), (0, "mlserver-0")):
                    with _mlserver(mlserver, args.model_dir, Path(tmp), workers) as url:
                        runs[label].append(wrk_load(url + path, body, headers, case, args.seconds, script))
                with Server(["service", "--model-dir", str(args.model_dir)], {}, ready_path="/ready") as url:
                    runs["dbf-serve"].append(wrk_load(url + path, body, headers, case, args.seconds, script))
            for label in ("mlserver", "mlserver-0"):
                print_row(
                    case,
                    label,
                    median(runs[label]),
                    None,
                    "" if label == "mlserver" else "parallel_workers 0",
                )
                print_row(case, "dbf-serve", median(runs["dbf-serve"]), median(runs[label]), "")


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


def _mlserver(command: Path, model_dir: Path, tmp: Path, parallel_workers: int | None) -> Server:
    """MLServer serving the model with :class:`benchmarks.mlserver_runtime.DBFRuntime`."""
    from tests.service.conftest import free_port

    def argv(port: int) -> list[str]:
        home = Path(tempfile.mkdtemp(dir=tmp))
        settings = {
            "host": "127.0.0.1",
            "http_port": port,
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "debug": False,
        }
        if parallel_workers is not None:
            settings["parallel_workers"] = parallel_workers
        (home / "settings.json").write_text(json.dumps(settings))
        model = home / "handwritten"
        model.mkdir()
        (model / "model-settings.json").write_text(
            json.dumps(
                {
                    "name": "handwritten",
                    "implementation": "benchmarks.mlserver_runtime.DBFRuntime",
                    "parameters": {"uri": str(model_dir.resolve())},
                }
            )
        )
        return [str(command), "start", str(home)]

    # MLServer logs every request at INFO; the runtime and the fusion package come from this repository.
    env = {"PYTHONPATH": str(ROOT), "MLSERVER_LOGGING_LEVEL": "WARNING"}
    return Server([], env, argv=argv, ready_path="/v2/models/handwritten/ready")


if __name__ == "__main__":
    try:
        main()
    except httpx.HTTPError as error:
        sys.exit(f"error: {error}")
