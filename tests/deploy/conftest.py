"""Helpers for the deployment tests: paths, external tools, YAML, free ports, processes to stop."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"


def require_tool(*names: str, package: str) -> str:
    """The path of the first of ``names`` on PATH; without any, skip the test, or fail it in CI.

    CI (``CI`` set, as .ci/run does) installs these tools, so a missing one there is a broken setup, never a
    reason to let the alerting go untested.
    """
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    unavailable(f"{' or '.join(names)} not found on PATH (Debian/Ubuntu: apt-get install {package})")


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it in CI (``CI`` set), where .ci/run provides what it needs."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run this test (.ci/run provides it)", pytrace=False)
    pytest.skip(reason)


def run_tool(*command: str | os.PathLike[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command; a non-zero exit fails the test with everything it printed."""
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def load_all_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def stop(process: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds: a test never leaves its servers behind."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
