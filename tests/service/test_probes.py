"""Black-box: readiness depends on verified models; the service started as users start it."""

import subprocess
import sys

from tests.service.conftest import free_port


def test_no_models_means_no_start(tmp_path):
    command = [sys.executable, "-m", "service", "--port", str(free_port()), "--model-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "no manifest.json" in done.stdout + done.stderr
