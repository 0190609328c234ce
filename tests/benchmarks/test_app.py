"""The ASGI-level benchmark runs end to end (a smoke test: it times nothing and asserts no speed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_app_benchmark_compares_service_and_yardstick():
    command = [sys.executable, "-m", "benchmarks.app", "--requests", "64", "--repeat", "1", "--samples", "2"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    for app in ("yardstick", "service"):
        assert re.search(rf"^{app}\s+[\d.]+ us wall\s+[\d.]+ us cpu$", out, re.M), out
    assert re.search(r"^ratio \(service / yardstick requests per second\): [\d.]+$", out, re.M), out
