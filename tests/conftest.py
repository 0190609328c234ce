"""Shared test configuration: hypothesis profiles and the benchmark-data directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# No deadlines: timing assertions are flaky on shared 2-core machines. CI runs are derandomised so that a
# failure there reproduces; locally hypothesis explores new examples on every run.
settings.register_profile("dev", deadline=None, max_examples=100)
settings.register_profile(
    "ci", deadline=None, max_examples=100, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The services tests start (in this process or as `python -m service`, which inherits it) serve no gRPC
# unless a test asks for it (grpc_port=, --grpc-port): the default port, 8081, would be every service's, and
# may be another program's.
os.environ["DBF_GRPC_PORT"] = "0"


def _data_dir() -> Path:
    return Path(os.environ.get("DBF_DATA_DIR", "data")).resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data directory (``DBF_DATA_DIR``, default ``./data``).

    Without it the test is skipped with the reason, except when ``DBF_REQUIRE_DATA=1`` (CI), where a missing
    directory is a failure: nothing may be skipped there unnoticed.
    """
    path = _data_dir()
    if not path.is_dir() or not any(path.glob("*.mat")):
        reason = (
            f"benchmark data not found in {path} "
            "(set DBF_DATA_DIR, or fetch it with `python -m training download`)"
        )
        if os.environ.get("DBF_REQUIRE_DATA") == "1":
            pytest.fail(reason + "; DBF_REQUIRE_DATA=1 makes this a failure", pytrace=False)
        pytest.skip(reason)
    return path
