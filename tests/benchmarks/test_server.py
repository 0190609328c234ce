"""The connection-level benchmark runs end to end (a smoke test: it times nothing and asserts no speed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_server_benchmark_compares_the_protocols():
    command = [sys.executable, "-m", "benchmarks.server", "--requests", "200", "--repeat", "1"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    for case in ("keep-alive, 4 fields", "keep-alive, 62 fields", "new connection each", "1 MB header field"):
        assert re.search(rf"^{case}\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), out
