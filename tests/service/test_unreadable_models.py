"""Black-box: a model folder that is there but cannot be read refuses the reload naming it; it is never
passed over (that would drop the model it holds)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import service_process
from tests.service.test_reload import PIE, models, repository
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
