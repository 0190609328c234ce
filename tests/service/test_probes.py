"""Black-box: the service refuses to start without verified models, or without the GPU it was told to need."""

from pathlib import Path

from tests.service.conftest import start_and_fail

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_no_models_means_no_start(tmp_path):
    done = start_and_fail("--model-dir", str(tmp_path))
    assert done.returncode != 0
    assert "no manifest.json" in done.stdout + done.stderr


def test_require_gpu_refuses_to_start_on_cpu():
    done = start_and_fail("--model-dir", str(MODELS / "cub"), env={"DBF_REQUIRE_GPU": "true"})
    assert done.returncode != 0  # this machine has no GPU (and the device machine never runs CI)
    assert "DBF_REQUIRE_GPU is set but CUDA cannot run the heads" in done.stdout + done.stderr
