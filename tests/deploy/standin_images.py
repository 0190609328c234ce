"""Stand-ins for the base images the Dockerfile and the compose stack name, built from Debian bookworm where
no image registry can be reached (CI): ``python:3.11-slim-bookworm`` with Debian's Python 3.11, and
``prom/prometheus`` and ``prom/alertmanager`` with Debian's Prometheus and Alertmanager, each tagged with the
official name so that the project's files build and run unchanged.

A root filesystem comes from ``debootstrap`` (minbase and a few packages) and is cached as a tarball outside
the clone (``DBF_IMAGE_CACHE``, default ``~/.cache/dbf-serve/images``) so that later runs only import it. The
image is that tarball plus a few lines of Dockerfile (no RUN: nothing needs a network to build it), set up as
the official image is: its entry point, user, working directory and volume.

The Python stand-in also carries what *this* host needs to reach PyPI (its CA bundle and the HTTP(S) parts of
its pip configuration), so that the Dockerfile's ``pip install`` works here as it does on the open internet.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.conftest import require_tool
from tests.deploy.engine import docker

SUITE = "bookworm"
MIRROR = os.environ.get("DBF_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# A cached tarball is rebuilt when its packages or its finishing function change; bump this for anything else.
RECIPE_VERSION = 1
NOBODY = 65534
# Marks a stand-in (docker image inspect ... Config.Labels): the tests say when they run on one.
LABEL = "org.dbf-serve.stand-in"


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dbf-serve" / "images"
    return Path(os.environ.get("DBF_IMAGE_CACHE", default))


# --- root filesystems ---------------------------------------------------------------------------------------


def _slim(root: Path) -> None:
    """What the official slim images leave out too: package caches and lists, documentation, translations."""
    for path in (
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
    ):
        shutil.rmtree(root / path, ignore_errors=True)
        (root / path).mkdir(parents=True, exist_ok=True)
    for locale in (root / "usr/share/locale").glob("*"):
        if locale.is_dir():
            shutil.rmtree(locale)


def _python_rootfs(root: Path) -> None:
    # The official image's pip installs anywhere; Debian's refuses to touch the system's packages (PEP 668).
    for marker in (root / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()


def _prometheus_rootfs(root: Path) -> None:
    # Raw time-zone data that Debian's moment-timezone ships for rebuilding it (190 MB): the web UI loads the
    # built files.
    shutil.rmtree(root / "usr/share/javascript/moment-timezone/data/unpacked", ignore_errors=True)
    # The official images' paths: /bin/prometheus, /bin/alertmanager, data owned by nobody.
    (root / "usr/bin/alertmanager").symlink_to("prometheus-alertmanager")
    for data in ("prometheus", "alertmanager", "etc/alertmanager"):
        (root / data).mkdir(parents=True, exist_ok=True)
        os.chown(root / data, NOBODY, NOBODY)


@dataclass(frozen=True)
class RootFilesystem:
    name: str
    packages: tuple[str, ...]
    finish: Callable[[Path], None]

    def key(self) -> str:
        recipe = [RECIPE_VERSION, SUITE, MIRROR, self.packages, inspect.getsource(self.finish)]
        return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]

    def tarball(self) -> Path:
        return cache_dir() / f"debian-{SUITE}-{self.name}-{self.key()}.tar"

    def build(self) -> Path:
        """The cached tarball, made with debootstrap first if there is none (a minute or so)."""
        target = self.tarball()
        if target.is_file():
            return target
        require_tool("debootstrap", package="debootstrap")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
            root = Path(work) / "root"
            command = ["debootstrap", "--variant=minbase", f"--include={','.join(self.packages)}"]
            done = subprocess.run(
                [*command, SUITE, str(root), MIRROR], capture_output=True, text=True, timeout=900, check=False
            )
            if done.returncode != 0:
                log = (root / "debootstrap/debootstrap.log").read_text() if root.exists() else ""
                raise RuntimeError(
                    f"debootstrap failed ({done.returncode}):\n{done.stderr[-3000:]}\n{log[-3000:]}"
                )
            _slim(root)
            self.finish(root)
            partial = Path(work) / "rootfs.tar"
            # Device nodes, /proc and /sys are the engine's to provide.
            excludes = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
            subprocess.run(
                ["tar", "--numeric-owner", "--xattrs", *excludes, "-C", str(root), "-cf", str(partial), "."],
                check=True,
                timeout=600,
            )
            for stale in target.parent.glob(f"debian-{SUITE}-{self.name}-*.tar"):
                stale.unlink()
            partial.replace(target)  # atomic: a run cut short leaves no half tarball behind
        return target


PYTHON_ROOTFS = RootFilesystem(
    "python",
    ("ca-certificates", "python3", "python3-venv", "python3-pip", "python-is-python3"),
    _python_rootfs,
)
PROMETHEUS_ROOTFS = RootFilesystem(
    "prometheus", ("ca-certificates", "prometheus", "prometheus-alertmanager"), _prometheus_rootfs
)


# --- images -------------------------------------------------------------------------------------------------


def _host_pip_access(context: Path) -> list[str]:
    """Dockerfile lines that give the stand-in this host's way to PyPI: its CA bundle (a TLS-inspecting proxy
    may sit on the route) and its index URLs; local (file:) indexes and find-links stay behind."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    lines, conf = [], ["[global]"]
    cert = settings.get("cert") or os.environ.get("SSL_CERT_FILE")
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, context / "host-ca-bundle.crt")
        # Where Debian's OpenSSL (so Python's ssl, and pip) looks by default.
        lines.append("COPY host-ca-bundle.crt /etc/ssl/certs/ca-certificates.crt")
        conf.append("cert = /etc/ssl/certs/ca-certificates.crt")
    for key in ("index-url", "extra-index-url", "trusted-host"):
        values = [v for v in settings.get(key, "").split() if key == "trusted-host" or v.startswith("http")]
        if values:
            conf.append(f"{key} = {' '.join(values)}")
    if len(conf) > 1:
        (context / "pip.conf").write_text("\n".join(conf) + "\n")
        lines.append("COPY pip.conf /etc/pip.conf")
    return lines


@dataclass(frozen=True)
class StandIn:
    """A stand-in for ``official``: a root filesystem and the official image's configuration."""

    official: str
    rootfs: RootFilesystem
    dockerfile: tuple[str, ...]
    carries_pip_access: bool = False
    what: str = ""

    def build(self) -> None:
        base = f"dbf-serve-stand-in/{self.rootfs.name}:{self.rootfs.key()}"
        if docker("image", "inspect", base, check=False).returncode != 0:
            with self.rootfs.build().open("rb") as tarball:
                done = subprocess.run(
                    ["docker", "import", "-", base],
                    stdin=tarball,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            assert done.returncode == 0, f"docker import {base}: {done.stderr}"
        with tempfile.TemporaryDirectory() as context:
            label = f"{self.what}; root filesystem {self.rootfs.key()}"
            lines = [f"FROM {base}", f'LABEL {LABEL}="{label}"', *self.dockerfile]
            if self.carries_pip_access:
                lines += _host_pip_access(Path(context))
            (Path(context) / "Dockerfile").write_text("\n".join(lines) + "\n")
            # No RUN: the classic builder needs no network (and there is no bridge for it to use).
            docker(
                "build",
                "--network",
                "none",
                "-t",
                self.official,
                context,
                timeout=300,
                env={"DOCKER_BUILDKIT": "0"},
            )


PYTHON = StandIn(
    "python:3.11-slim-bookworm",
    PYTHON_ROOTFS,
    ("ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8", 'CMD ["python3"]'),
    carries_pip_access=True,
    what="Debian bookworm's python3 (3.11), python and pip on PATH",
)


def _prometheus_project_stand_in(
    official: str, program: str, port: int, storage_flag: str, package: str
) -> StandIn:
    """``prom/PROGRAM:TAG`` laid out as the Prometheus project's images are (/bin/PROGRAM, its configuration
    in /etc/PROGRAM, its data in /PROGRAM owned by nobody), with Debian's ``package``."""
    return StandIn(
        official,
        PROMETHEUS_ROOTFS,
        (
            "USER 65534:65534",
            f"WORKDIR /{program}",
            f'VOLUME ["/{program}"]',
            f"EXPOSE {port}",
            f'ENTRYPOINT ["/bin/{program}"]',
            f'CMD ["--config.file=/etc/{program}/{program}.yml", "{storage_flag}=/{program}"]',
        ),
        what=f"Debian bookworm's {package}",
    )


def prometheus_stand_in(official: str) -> StandIn:
    return _prometheus_project_stand_in(official, "prometheus", 9090, "--storage.tsdb.path", "prometheus")


def alertmanager_stand_in(official: str) -> StandIn:
    return _prometheus_project_stand_in(
        official, "alertmanager", 9093, "--storage.path", "prometheus-alertmanager"
    )


# --- what the tests call ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    """One builder of the cache at a time (two test runs on one machine share it)."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def is_stand_in(image: str) -> str | None:
    """What a stand-in image is made of, or None for any other image."""
    done = docker("image", "inspect", "--format", "{{json .Config.Labels}}", image, check=False)
    if done.returncode != 0:
        return None
    return (json.loads(done.stdout) or {}).get(LABEL)


def ensure(stand_ins: list[StandIn]) -> list[str]:
    """Every image of ``stand_ins`` present: as it is, pulled, or else built as a stand-in. Returns a line
    for each stand-in in use, for the test's output."""
    notes, missing = [], []
    for stand_in in stand_ins:
        present = docker("image", "inspect", stand_in.official, check=False).returncode == 0
        what = is_stand_in(stand_in.official) if present else None
        if what and stand_in.rootfs.key() not in what:
            missing.append((stand_in, ["an earlier stand-in, made by another recipe, is replaced"]))
            continue
        if not present:
            pulled = docker("pull", "--quiet", stand_in.official, check=False, timeout=300)
            if pulled.returncode != 0:
                missing.append((stand_in, pulled.stderr.strip().splitlines()[-1:]))
                continue
        if what:
            notes.append(f"{stand_in.official} is a stand-in ({what}), built here from Debian packages")
    if missing:
        with _cache_lock():
            # The root filesystems are independent: make them side by side (debootstrap waits on the mirror).
            rootfses = {stand_in.rootfs for stand_in, _ in missing}
            with ThreadPoolExecutor(len(rootfses)) as pool:
                for built in [pool.submit(rootfs.build) for rootfs in rootfses]:
                    built.result()
            for stand_in, why in missing:
                stand_in.build()
                notes.append(
                    f"{stand_in.official} could not be pulled ({' '.join(why)}): using a stand-in built from "
                    f"{stand_in.what} with debootstrap (root filesystem cached in {cache_dir()})"
                )
    return notes
