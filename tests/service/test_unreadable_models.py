"""Black-box: a model folder or file that is there but cannot be read, or that is no regular file (a FIFO,
which blocks whoever reads it), refuses the load naming it, at start-up and at a reload; it is never passed
over (that would drop the model it holds) and never waited on."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from service.repository import MAX_HEAD_BYTES
from tests.service.conftest import MODELS, service_process, serving, start_and_fail
from tests.service.test_reload import BODY, PIE, models, repository
from tests.service.test_service import metric

# As root, file permissions stop nobody: the service then runs without the capabilities that override them.
WITHOUT_OVERRIDES = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


def no_permission(folder: Path) -> None:
    folder.chmod(0)


def symlink_to_nowhere(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.symlink_to(folder.with_name("nowhere"))


def symlink_loop(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.symlink_to(folder)


def manifest_to_nowhere(folder: Path) -> None:
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").symlink_to(folder / "nowhere.json")


UNREADABLE = {
    "no permission": no_permission,
    "a symlink to nowhere": symlink_to_nowhere,
    "a symlink loop": symlink_loop,
    "its manifest a symlink to nowhere": manifest_to_nowhere,
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_an_unreadable_model_folder_fails_the_reload_and_its_model_serves_on(tmp_path, case):
    root = repository(tmp_path, "handwritten", "pie")
    under = ()
    if case == "no permission" and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and no setpriv to drop the capabilities that override permissions")
        under = WITHOUT_OVERRIDES
    with service_process("--model-dir", str(root), under=under) as (url, _):
        failures = metric(url, "dbf_model_reloads_total", outcome="failure")
        UNREADABLE[case](root / "pie")
        try:
            refused = httpx.post(url + "/v1/admin/reload", timeout=30)
        finally:
            if case == "no permission":
                (root / "pie").chmod(0o755)  # for pytest to clean up
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["type"] == "reload_failed"
        assert str(root / "pie") in refused.json()["error"]["message"]
        assert metric(url, "dbf_model_reloads_total", outcome="failure") == failures + 1
        assert models(url) == ["handwritten", "pie"]
        assert httpx.post(url + "/v1/models/pie/predict", json=PIE).status_code == 200


def fifo_head(folder: Path) -> Path:
    head = folder / "lbp.onnx"
    head.unlink()
    os.mkfifo(head)
    return head


def fifo_manifest(folder: Path) -> Path:
    manifest = folder / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    return manifest


FIFOS = {"a head": fifo_head, "the manifest": fifo_manifest}


@pytest.mark.parametrize("case", sorted(FIFOS))
def test_a_fifo_fails_the_reload_at_once_and_holds_nothing(tmp_path, case):
    """A FIFO blocks whoever opens it for reading until someone writes: read, it would hang the reload for
    ever, and with it the reload lock (every later reload) and the service's shutdown."""
    root = repository(tmp_path, "handwritten")
    with serving(root) as url:
        shutil.copytree(MODELS / "pie", tmp_path / "pie")
        fifo = FIFOS[case](tmp_path / "pie")
        (tmp_path / "pie").rename(root / "pie")
        fifo = root / "pie" / fifo.name
        for _ in range(2):  # the second is not stuck behind the first
            refused = httpx.post(url + "/v1/admin/reload", timeout=30)
            assert refused.status_code == 409, refused.text
            assert f"{fifo}: cannot read" in refused.json()["error"]["message"]
            assert "a FIFO, not a regular file" in refused.json()["error"]["message"]
        assert models(url) == ["handwritten"]
        fifo.unlink()
        shutil.copy(MODELS / "pie" / fifo.name, fifo)
        assert httpx.post(url + "/v1/admin/reload", timeout=30).json()["models"] == ["handwritten", "pie"]


@pytest.mark.parametrize("case", sorted(FIFOS))
def test_a_fifo_stops_the_start_naming_it(tmp_path, case):
    shutil.copytree(MODELS / "pie", tmp_path / "pie")
    fifo = FIFOS[case](tmp_path / "pie")
    done = start_and_fail("--model-dir", str(tmp_path))
    assert done.returncode != 0
    assert f"{fifo}: cannot read" in done.stderr and "a FIFO, not a regular file" in done.stderr, done.stderr


def test_a_head_larger_than_any_onnx_model_fails_the_reload_unread(tmp_path):
    """A head was read whole before its checksum was checked: a sparse file of 3 GiB took a reload 21 s and
    the service's memory from 122 MiB to 3.2 GiB, kept after the refusal. A file larger than protobuf's
    limit on one ONNX model is refused by its size, unread, and the models being served serve on."""
    root = repository(tmp_path, "handwritten")
    with serving(root) as url:
        shutil.copytree(MODELS / "pie", tmp_path / "pie")
        with (tmp_path / "pie" / "lbp.onnx").open("r+b") as head:
            head.truncate(MAX_HEAD_BYTES + 1)  # sparse: it takes no disk
        (tmp_path / "pie").rename(root / "pie")
        started = time.monotonic()
        refused = httpx.post(url + "/v1/admin/reload", timeout=60)
        took = time.monotonic() - started
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert f"{root / 'pie' / 'lbp.onnx'}: model file of more than 2,147,483,647 bytes" in message, message
        assert took < 2, f"the reload took {took:.1f} s"
        assert models(url) == ["handwritten"]
        assert httpx.post(url + "/predict", json=BODY).status_code == 200


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="no prlimit to limit the address space")
def test_reading_a_head_reserves_no_more_memory_than_it_holds(tmp_path):
    """Read with a read of up to the 2 GiB limit, each head reserved that much address space first: under a
    limit of 1.5 GB (ulimit -v; strict overcommit refuses alike) the start failed, MemoryError, where the
    service holds 0.9 GB once started. Each file is read by its size: the service starts within 1 GiB more
    than it holds (measured first: that grows with the machine's cores, its threads' stacks and arenas)."""
    serve = ("--model-dir", str(MODELS / "pie"))
    cpu = {"DBF_DEVICE": "cpu"}
    with service_process(*serve, env=cpu) as (_, unlimited):
        held = address_space(unlimited.pid)
    limited = ("prlimit", f"--as={held + (1 << 30)}", "--")
    with service_process(*serve, env=cpu, under=limited) as (url, _):
        assert httpx.post(url + "/predict", json=PIE).status_code == 200


def address_space(pid: int) -> int:
    """The process's address space now (VmSize), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmSize for process {pid}")


def test_a_manifest_that_is_no_file_on_disk_is_refused_unechoed(tmp_path):
    """A manifest linked to /proc/self/environ (its size says 0) was parsed, and the parser's refusal quoted
    its first bytes, the service's environment, in the log and the 409. Refused now by its size."""
    shutil.copytree(MODELS / "pie", tmp_path / "pie")
    manifest = tmp_path / "pie" / "manifest.json"
    manifest.unlink()
    manifest.symlink_to("/proc/self/environ")
    done = start_and_fail("--model-dir", str(tmp_path), env={"AAA_SECRET": "hunter2"})
    assert done.returncode != 0
    refusal = f"{manifest}: cannot read manifest (its size says 0 bytes, the read gave more"
    assert refusal in done.stderr, done.stderr
    assert "hunter2" not in done.stderr and "AAA_SECRET" not in done.stderr


def test_a_manifest_linked_to_a_secret_is_refused_without_quoting_it(tmp_path):
    """A manifest linked to a file outside the model folder, here a secret's (an API key), is read: refused,
    the parser's message quoted the file's bytes (all of a short key) in the log and the 409."""
    shutil.copytree(MODELS / "pie", tmp_path / "pie")
    secret = tmp_path / "api-key"
    secret.write_text("k3y-0f-the-service\n")
    manifest = tmp_path / "pie" / "manifest.json"
    manifest.unlink()
    manifest.symlink_to(secret)
    done = start_and_fail("--model-dir", str(tmp_path))
    assert done.returncode != 0
    assert f"{manifest}: invalid manifest" in done.stderr and "Invalid JSON" in done.stderr, done.stderr
    assert "k3y" not in done.stderr
