"""Every command and code block of the README and the docs that can run here runs, in order, against a real
service (``python -m service``) started on a copy of the committed models, as a reader would run them: the
shell's blocks in bash (``set -euo pipefail``), Python's in the interpreter, in one working directory, with
the service's address in place of ``localhost:8000``. The README's path is among them: toy data as ``.npy``
files, ``python -m training fit``, the service's reload, curl, the Python client and tritonclient."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.examples import ROOT, Block, blocks, pages
from tests.service.conftest import MODELS, free_port, running_service

_ADDRESS = re.compile(r"(?:localhost|127\.0\.0\.1):8000\b")
_GRPC_ADDRESS = re.compile(r"(?:localhost|127\.0\.0\.1):8081\b")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The reader's directory: the committed models under ``models/``, which the service serves."""
    path = tmp_path_factory.mktemp("reader")
    shutil.copytree(MODELS, path / "models")
    return path


@pytest.fixture(scope="module")
def service(workdir) -> Iterator[tuple[str, str]]:
    """The HTTP and the gRPC address the docs' 8000 and 8081 stand for."""
    grpc = f"127.0.0.1:{free_port()}"
    with running_service("--model-dir", str(workdir / "models"), "--grpc-port", grpc.split(":")[1]) as url:
        yield url.removeprefix("http://"), grpc


def _run(block: Block, workdir: Path, addresses: tuple[str, str]) -> subprocess.CompletedProcess:
    code = _GRPC_ADDRESS.sub(addresses[1], _ADDRESS.sub(addresses[0], block.code))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # `python`: this one
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-c", code] if block.language == "python" else ["bash", "-euo", "pipefail"]
    return subprocess.run(
        command,
        input=None if block.language == "python" else code,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _runnable(page: Path) -> list[Block]:
    return [block for block in blocks(page) if block.marker == "run"]


def _with_slow_marked(page: Path) -> object:
    """The README's blocks fit a model with the defaults: a minute or more."""
    return pytest.param(page, marks=pytest.mark.slow) if page == ROOT / "README.md" else page


@pytest.mark.parametrize(
    "page", [_with_slow_marked(p) for p in pages() if _runnable(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_page_examples_run(page, workdir, service):
    for block in _runnable(page):
        done = _run(block, workdir, service)
        assert done.returncode == 0, (
            f"{block.where} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_block_is_run_or_says_why_not(page):
    unmarked = [block.where for block in blocks(page) if block.marker is None]
    assert not unmarked, (
        f"code blocks without <!-- run --> or <!-- not run: why --> before them: {unmarked} "
        "(tests/docs/examples.py)"
    )


def test_the_readme_runs_fit_serve_curl_and_tritonclient():
    """The path a new user takes from the README alone is run, not merely shown."""
    code = "".join(block.code for block in _runnable(ROOT / "README.md"))
    steps = ("np.save(", "python -m training fit", "/v1/admin/reload", "curl -sf", "tritonclient", "Client(")
    for step in steps:
        assert step in code, f"the README's run blocks lack {step!r}"


def test_the_readme_fits_on_a_screen_or_two():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
