"""The Docker engine as the container tests drive it: its CLI, its two builders, and containers that share the
host's network (never a bridge: the daemon may run with --bridge=none, and the tests listen on loopback only).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.conftest import require_tool, unavailable

# Every container a test starts carries it, so that a test run removes what it left behind.
TEST_LABEL = "org.dbf-serve.test"


class ContainerTestNote(UserWarning):
    """Where a container test departs from what a user would run: a stand-in image, a service not started."""


def docker(
    *args: str | os.PathLike[str],
    check: bool = True,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    client: str = "docker",
) -> subprocess.CompletedProcess:
    """``docker ARGS``; with ``check``, a non-zero exit fails the test with what it printed."""
    command = [client, *map(str, args)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if check:
        assert done.returncode == 0, (
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done


def require_engine() -> str:
    """The engine's version; without a docker CLI or an engine answering it, skip the test (fail it in CI)."""
    require_tool("docker", package="docker.io")
    done = docker("version", "--format", "{{.Server.Version}}", check=False, timeout=30)
    if done.returncode != 0:
        unavailable(
            f"no Docker engine answers ({done.stderr.strip()}); start one with "
            "`dockerd --bridge=none --iptables=false` (.ci/run does)"
        )
    return done.stdout.strip()


def compose_cli() -> list[str]:
    """`docker compose` (v2) or `docker-compose` (v1, Debian's); skipped without either (they need no engine
    to check a file; CI installs docker-compose)."""
    docker_cli = shutil.which("docker")
    if docker_cli and subprocess.run([docker_cli, "compose", "version"], capture_output=True).returncode == 0:
        return [docker_cli, "compose"]
    return [require_tool("docker-compose", package="docker-compose")]


def classic_build(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess:
    """``docker build`` with the classic builder (what Docker without BuildKit, and docker-compose v1, use);
    its RUN steps share the host's network, the only one there is."""
    return docker("build", "--network", "host", *args, timeout=900, env={"DOCKER_BUILDKIT": "0"})


def _client_version(client: Path) -> tuple[int, ...]:
    out = subprocess.run(
        [client, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, check=False
    ).stdout
    found = re.match(r"(\d+)\.(\d+)", out.strip())
    return tuple(map(int, found.groups())) if found else ()


def buildkit_builder() -> tuple[list[str], dict[str, str]] | None:
    """A command (and its environment) that builds with BuildKit into the engine's images: ``docker buildx
    build --load`` where the buildx plugin is installed, else a docker client older than 23.0 (those build
    with the engine's BuildKit themselves under DOCKER_BUILDKIT=1: Debian bookworm's docker.io). None
    without either."""
    if docker("buildx", "version", check=False).returncode == 0:
        return ["docker", "buildx", "build", "--load"], {}
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        client = Path(directory) / "docker"
        if client.is_file() and os.access(client, os.X_OK) and () < _client_version(client) < (23,):
            return [str(client), "build"], {"DOCKER_BUILDKIT": "1"}
    return None


def buildkit_build(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess:
    """``docker build`` with BuildKit (skipped where there is none; a failure in CI, which has Debian's)."""
    builder = buildkit_builder()
    if builder is None:
        unavailable("no BuildKit here: neither the buildx plugin nor a docker client older than 23.0")
    (client, *command), env = builder
    return docker(*command, "--network", "host", *args, timeout=900, env=env, client=client)


@dataclass
class Container:
    name: str

    def exec(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return docker("exec", self.name, *command, check=check)

    def python(self, code: str) -> str:
        """What ``code`` prints, run by the image's own Python in the container."""
        return self.exec("python", "-c", code).stdout.strip()

    def state(self, field: str = "") -> str:
        """``.State`` (or one of its fields) as JSON."""
        path = ".State" + (f".{field}" if field else "")
        return docker("inspect", "--format", "{{json " + path + "}}", self.name).stdout.strip()

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr


def run_detached(image: str, *args: str, name: str, options: tuple[str, ...] = ()) -> Container:
    """``docker run --detach`` on the host's network; ``args`` go to the image's entry point."""
    docker(
        "run", "--detach", "--network", "host", "--label", TEST_LABEL, "--name", name, *options, image, *args
    )
    return Container(name)


def remove_test_containers() -> None:
    """Remove every container a test started (by TEST_LABEL), running or not, with its anonymous volumes."""
    listed = docker("ps", "--all", "--quiet", "--filter", f"label={TEST_LABEL}", check=False).stdout.split()
    if listed:
        docker("rm", "--force", "--volumes", *listed, check=False)
