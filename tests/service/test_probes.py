"""Black-box: readiness depends on verified models; the service started as users start it."""

import os
import subprocess
import sys
from pathlib import Path

from tests.service.conftest import free_port

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_no_models_means_no_start(tmp_path):
    command = [sys.executable, "-m", "service", "--port", str(free_port()), "--model-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "no manifest.json" in done.stdout + done.stderr


def test_require_gpu_refuses_to_start_on_cpu(tmp_path):
    command = [
        sys.executable,
        "-m",
        "service",
        "--port",
        str(free_port()),
        "--model-dir",
        str(MODELS / "cub"),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, "DBF_REQUIRE_GPU": "true"}
    )
    assert done.returncode != 0  # this machine has no GPU (and the device machine never runs CI)
    assert "DBF_REQUIRE_GPU is set but CUDA cannot run the heads" in done.stdout + done.stderr
