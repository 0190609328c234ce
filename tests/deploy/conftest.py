"""Helpers for the deployment tests: paths, external tools, YAML, processes to stop, gRPC health."""

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


def require_grpc_front_end(has_grpc_port: bool) -> None:
    """Skip the test, with the reason, unless the service (``has_grpc_port``: ``DBF_GRPC_PORT`` is one of its
    settings) has its gRPC front end; nothing turns the test on but that front end's arrival."""
    if not has_grpc_port:
        pytest.skip(
            "the service has no gRPC front end yet (DBF_GRPC_PORT is not a setting of service/settings.py): "
            "this check runs once it has"
        )


def grpc_health(port: int, timeout: float = 5) -> str:
    """The ``grpc.health.v1`` status of the whole server (service ``""``, what Kubernetes' gRPC probe asks)
    on a loopback ``port``: ``SERVING``, ``NOT_SERVING``..."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        answer = check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
