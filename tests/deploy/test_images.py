"""The container images and the compose stack, built and run by a real Docker engine as the README tells a
user to: the CPU target with the classic builder and with BuildKit, the image serving, healthy, shutting down
cleanly and running on a read-only root, and the compose stack scraping the service, loading the alerts and
alerting when the service stops.

Networking (strict): the engine runs with --bridge=none; every container shares the host's network and
listens on loopback; no test creates a network or talks to anything but 127.0.0.1 (builds reach the package
registries, as pip does on the host). The compose stack runs with docker-compose.host-network.yml.

Where no image registry answers (CI), the base images are stand-ins built from Debian's packages
(tests/deploy/standin_images.py); the output says so. Grafana has no Debian package: it is not started, and
its provisioning is checked against Grafana's documented schema instead (tests/deploy/test_containers.py).

The tests of this module run in file order to overlap waits: the compose stack comes up early, its service
is stopped, and the image tests run while Prometheus waits out DBFServiceDown's `for:`; each test also runs
on its own.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from tests.deploy import dockerfile, standin_images
from tests.deploy.conftest import (
    ALERTS,
    PROMETHEUS_CONFIG,
    REPO,
    grpc_health,
    load_yaml,
    require_grpc_front_end,
    unavailable,
)
from tests.deploy.engine import (
    Container,
    ContainerTestNote,
    buildkit_build,
    classic_build,
    compose_cli,
    docker,
    remove_test_containers,
    require_engine,
    run_detached,
)
from tests.service.conftest import free_port, running_service

pytestmark = pytest.mark.container

DOCKERFILE = REPO / "Dockerfile"
COMPOSE_FILES = (REPO / "docker-compose.yml", REPO / "docker-compose.host-network.yml")
COMPOSE = load_yaml(COMPOSE_FILES[0])["services"]
STAGES = dockerfile.stages(DOCKERFILE)
IMAGE = COMPOSE["dbf-serve"]["image"]  # dbf-serve:cpu, as the README builds it
BUILDKIT_IMAGE = IMAGE + "-buildkit"
MODELS = sorted(path.parent.name for path in (REPO / "models").glob("*/manifest.json"))
GRACE_SECONDS = float(STAGES["cpu"].env()["DBF_GRACEFUL_SHUTDOWN_SECONDS"])
# What the README tells `docker run` for a full drain: docker stop's own default is 10 s.
STOP_TIMEOUT = int(GRACE_SECONDS) + 10
COMPOSE_PROJECT = "dbf-serve-test"
STACK = ("dbf-serve", "prometheus", "alertmanager")  # Grafana: no image here (see above)
PORTS = {"dbf-serve": 8000, "dbf-serve gRPC": 8081, "prometheus": 9090, "alertmanager": 9093}


def loopback(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def wait_for(what: str, check, timeout: float, interval: float = 0.5):
    """Poll ``check`` until it returns something truthy (returned) or ``timeout`` seconds pass (a failure)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except (httpx.TransportError, ValueError, KeyError):
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(interval)


def samples(model: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` random samples for ``model``, every view at its manifest's dimension."""
    manifest = json.loads((REPO / "models" / model / "manifest.json").read_text())
    rng = np.random.default_rng(seed)
    return [
        {"views": {v["name"]: rng.random(v["dim"]).tolist() for v in manifest["views"]}} for _ in range(n)
    ]


def assert_same_answer(got, expected, path: str = "") -> None:
    """Two JSON answers equal up to float rounding (the same heads, on two onnxruntime installs)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), path
        for key in expected:
            assert_same_answer(got[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same_answer(a, b, f"{path}[{i}]")
    elif isinstance(expected, float):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, err_msg=path)
    else:
        assert got == expected, path


def serve(
    name: str, *args: str, options: tuple[str, ...] = (), grpc_port: int | None = None
) -> tuple[Container, str]:
    """The image on the host's network, listening on a free loopback port (and for gRPC on ``grpc_port``,
    else on another free one); returns it and its URL once /ready answers 200."""
    port = free_port()
    env = ("--env", "DBF_HOST=127.0.0.1", "--env", f"DBF_PORT={port}")
    env += ("--env", f"DBF_GRPC_PORT={grpc_port or free_port()}")
    container = run_detached(IMAGE, *args, name=name, options=(*env, *options))

    def ready() -> bool:
        if json.loads(container.state("Running")) is not True:
            pytest.fail(f"{name} exited:\n{container.logs()}", pytrace=False)
        return httpx.get(f"{loopback(port)}/ready", timeout=2).status_code == 200

    wait_for(f"{name} ready", ready, timeout=90)
    return container, loopback(port)


def processes(container: Container) -> list[tuple[int, int, str]]:
    """(pid, uid, command line) of every process in ``container``, read from its /proc."""
    code = (
        "import os, json; print(json.dumps([(int(p), os.stat('/proc/' + p).st_uid, "
        "open('/proc/%s/cmdline' % p, 'rb').read().decode().replace(chr(0), ' ').strip()) "
        "for p in os.listdir('/proc') if p.isdigit()]))"
    )
    return [tuple(p) for p in json.loads(container.python(code))]


def image_config(image: str) -> dict:
    return json.loads(docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)


# --- the engine, the base images, the builds ----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    version = require_engine()
    remove_test_containers()
    yield version
    remove_test_containers()


@pytest.fixture(scope="module")
def base_images(engine: str) -> None:
    """The Dockerfile's Python base and the compose stack's Prometheus and Alertmanager: present, pulled,
    or stand-ins built from Debian."""
    python_image = dockerfile.parse(DOCKERFILE.read_text())[0]["PYTHON_IMAGE"]
    assert python_image == standin_images.PYTHON.official
    needed = [
        standin_images.PYTHON,
        standin_images.prometheus_stand_in(COMPOSE["prometheus"]["image"]),
        standin_images.alertmanager_stand_in(COMPOSE["alertmanager"]["image"]),
    ]
    for note in standin_images.ensure(needed):
        warnings.warn(note, ContainerTestNote, stacklevel=1)


@dataclass
class Build:
    image: str
    log: str


@pytest.fixture(scope="module")
def cpu_image(base_images: None) -> Build:
    """The README's `docker build -t dbf-serve:cpu --target cpu .`, with the classic builder."""
    done = classic_build("--force-rm", "--target", "cpu", "--tag", IMAGE, REPO)
    return Build(IMAGE, done.stdout + done.stderr)


def test_cpu_target_builds_with_the_classic_builder(cpu_image: Build):
    """The classic builder builds every stage before the target: the CPU target's must not touch CUDA."""
    built_from = re.findall(r"^Step \d+/\d+ : FROM (\S+) AS (\S+)$", cpu_image.log, re.M)
    assert built_from == [("${PYTHON_IMAGE}", "cpu-build"), ("${PYTHON_IMAGE}", "cpu")], built_from
    config = image_config(cpu_image.image)
    stage = STAGES["cpu"]
    assert config["User"] == stage.last("USER") == "10001:10001"
    assert config["Entrypoint"] == stage.exec_form("ENTRYPOINT") and config.get("Cmd") is None
    assert config["Healthcheck"]["Test"] == ["CMD", *stage.healthcheck()[1]]
    assert config["WorkingDir"] == "/app" and sorted(config["ExposedPorts"]) == ["8000/tcp", "8081/tcp"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert {k: v for k, v in stage.env().items() if k != "PATH"}.items() <= env.items()
    assert env["PATH"].startswith("/opt/venv/bin:")


# --- the compose stack --------------------------------------------------------------------------------------


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class ComposeStack:
    """docker-compose.yml with docker-compose.host-network.yml, as project COMPOSE_PROJECT."""

    def __init__(self) -> None:
        self.cli = compose_cli()
        self.service_stopped_at: float | None = None

    def compose(self, *args: str, timeout: float = 300) -> str:
        files = [arg for f in COMPOSE_FILES for arg in ("-f", str(f))]
        command = [*self.cli, "--project-name", COMPOSE_PROJECT, "--project-directory", str(REPO), *files]
        client, *rest = command
        return docker(*rest, *args, timeout=timeout, client=client).stdout

    def container(self, service: str) -> str:
        (container,) = self.compose("ps", "--quiet", service).split()
        return container

    def prometheus(self, path: str) -> dict:
        answer = httpx.get(f"{loopback(PORTS['prometheus'])}/api/v1/{path}", timeout=5)
        answer.raise_for_status()
        return answer.json()["data"]

    def alerts(self, name: str) -> list[dict]:
        url = f"{loopback(PORTS['alertmanager'])}/api/v2/alerts"
        return httpx.get(url, params={"filter": f'alertname="{name}"'}, timeout=5).json()

    def stop_service(self) -> None:
        """`docker compose stop dbf-serve`, once: the container drains and exits 0."""
        if self.service_stopped_at is None:
            self.compose("stop", "dbf-serve", timeout=120)
            self.service_stopped_at = time.monotonic()
        state = json.loads(
            docker("inspect", "--format", "{{json .State}}", self.container("dbf-serve")).stdout
        )
        assert state["Status"] == "exited" and state["ExitCode"] == 0 and not state["OOMKilled"], state


@pytest.fixture(scope="module")
def stack(cpu_image: Build) -> Iterator[ComposeStack]:
    """The stack up (the service built by compose itself), on the host's network; torn down at the end."""
    stack = ComposeStack()
    stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")  # what a killed run left
    busy = [f"{service} ({port})" for service, port in PORTS.items() if port_in_use(port)]
    if busy:
        unavailable(f"loopback ports taken, the stack cannot listen there: {', '.join(busy)}")
    networks = docker("network", "ls", "--quiet").stdout.split()
    stack.compose("build", "dbf-serve", timeout=900)
    try:
        stack.compose("up", "--detach", "--no-build", *STACK)
        assert docker("network", "ls", "--quiet").stdout.split() == networks, "compose created a network"
        for service in STACK:
            mode = docker("inspect", "--format", "{{.HostConfig.NetworkMode}}", stack.container(service))
            assert mode.stdout.strip() == "host", service
        warnings.warn(
            "Grafana is not started (where no registry answers, Debian has no package to make a stand-in "
            "of its image from): its provisioning is checked against Grafana's documented schema instead "
            "(test_containers.py); the dashboard is not rendered",
            ContainerTestNote,
            stacklevel=1,
        )
        wait_for("dbf-serve ready", lambda: httpx.get(f"{loopback(8000)}/ready").status_code == 200, 90)
        yield stack
    finally:
        stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout=180)


def test_compose_stack_scrapes_the_service_and_loads_every_rule(stack: ComposeStack):
    def target_up():
        targets = stack.prometheus("targets")["activeTargets"]
        return [t for t in targets if t["labels"]["job"] == "dbf-serve" and t["health"] == "up"]

    (target,) = wait_for("Prometheus scraping dbf-serve", target_up, timeout=60)
    assert target["labels"]["instance"] == "dbf-serve:8000"
    expected = {
        (group["name"], rule["alert"]) for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]
    }

    def rules_evaluated():
        loaded = [(g["name"], r) for g in stack.prometheus("rules")["groups"] for r in g["rules"]]
        return loaded if all(r["health"] == "ok" for _, r in loaded) else None

    loaded = wait_for("every rule evaluated", rules_evaluated, timeout=60)
    assert {(group, rule["name"]) for group, rule in loaded} == expected
    assert all(rule["type"] == "alerting" and not rule.get("lastError") for _, rule in loaded)


def test_compose_alertmanager_is_up_and_receives_from_prometheus(stack: ComposeStack):
    assert httpx.get(f"{loopback(PORTS['alertmanager'])}/-/ready").status_code == 200
    status = httpx.get(f"{loopback(PORTS['alertmanager'])}/api/v2/status").json()
    assert status["cluster"]["status"] == "disabled"  # nothing listens for peers
    receivers = {r["name"] for r in load_yaml(REPO / "deploy/alertmanager/alertmanager.yml")["receivers"]}
    assert all(f"name: {name}" in status["config"]["original"] for name in receivers)
    (target,) = load_yaml(PROMETHEUS_CONFIG)["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    active = wait_for(
        "an active Alertmanager", lambda: stack.prometheus("alertmanagers")["activeAlertmanagers"], 60
    )
    assert [a["url"] for a in active] == [f"http://{target}/api/v2/alerts"]


def has_grpc_port(python: Callable[[str], str]) -> bool:
    """Whether the image's service has a gRPC front end (DBF_GRPC_PORT one of its settings), asked of the
    image's own Python: ``python`` runs code there and returns what it printed."""
    return python("import service.settings as s; print('grpc_port' in s.Settings.model_fields)") == "True"


def test_compose_service_answers_grpc_health(stack: ComposeStack):
    """The stack's service answers grpc.health.v1 where the compose files put its gRPC port (loopback)."""
    require_grpc_front_end(has_grpc_port(Container(stack.container("dbf-serve")).python))
    assert grpc_health(PORTS["dbf-serve gRPC"]) == "SERVING"


def test_compose_service_stops_cleanly(stack: ComposeStack):
    """`docker compose stop dbf-serve` drains and exits 0 (and starts DBFServiceDown's clock: see below)."""
    stack.stop_service()


# --- BuildKit, and what the image holds -------------------------------------------------------------------


def run_python(image: str, code: str) -> str:
    """What ``code`` prints, run by the image's own Python in a container of its own."""
    done = docker("run", "--rm", "--network", "host", "--entrypoint", "python", image, "-c", code)
    return done.stdout.strip()


def installed(image: str) -> list[str]:
    """NAME==VERSION of every distribution in the image's Python environment."""
    code = "import importlib.metadata as m; print(*(d.name + '==' + d.version for d in m.distributions()))"
    return sorted(run_python(image, code).split())


def test_cpu_target_builds_with_buildkit(cpu_image: Build):
    """BuildKit builds only the target's stages; the image is the classic builder's, package for package."""
    buildkit_build("--target", "cpu", "--tag", BUILDKIT_IMAGE, REPO)
    keys = ("User", "Entrypoint", "Cmd", "Env", "Healthcheck", "WorkingDir", "ExposedPorts")
    classic, buildkit = image_config(cpu_image.image), image_config(BUILDKIT_IMAGE)
    assert {k: buildkit.get(k) for k in keys} == {k: classic.get(k) for k in keys}
    assert installed(BUILDKIT_IMAGE) == installed(cpu_image.image)


def test_cpu_image_holds_the_cpu_runtime_and_no_build_tools(cpu_image: Build):
    code = """
import importlib.metadata as m, json, os, pathlib, sys
import onnxruntime
home = os.environ["HOME"]
print(json.dumps({
    "uid": [os.getuid(), os.getgid()],
    "home": [home, os.path.isdir(home), os.stat(home).st_uid],
    "prefix": sys.prefix,
    "distributions": sorted(d.metadata["Name"].lower() for d in m.distributions()),
    "providers": onnxruntime.get_available_providers(),
    "cuda": [str(p) for p in pathlib.Path(sys.prefix).rglob("*cuda*.so*")],
}))
"""
    done = docker("run", "--rm", "--network", "host", "--entrypoint", "python", cpu_image.image, "-c", code)
    found = json.loads(done.stdout)
    assert found["uid"] == [10001, 10001]
    assert found["home"] == ["/home/dbf", True, 10001]  # HOME exists (it did not: onnxruntime complained)
    assert found["prefix"] == "/opt/venv"
    assert "onnxruntime" in found["distributions"] and "onnxruntime-gpu" not in found["distributions"]
    assert not {"pip", "setuptools", "torch", "onnx"} & set(found["distributions"])
    assert "CUDAExecutionProvider" not in found["providers"] and not found["cuda"]
    assert "[W:onnxruntime" not in done.stderr  # no warning at import (telemetry off, HOME there)


# --- the image, run as the README says ----------------------------------------------------------------------


def test_image_serves_as_the_readme_says(cpu_image: Build):
    """Ready with every model, the same answers as the service run here, non-root, Python as PID 1, healthy
    by its HEALTHCHECK, and `docker stop` answering the request in flight and exiting 0 within the grace
    period."""
    container, url = serve("dbf-serve-test-serve", options=("--stop-timeout", str(STOP_TIMEOUT)))
    assert httpx.get(f"{url}/ready").json() == {"status": "ready", "models": MODELS}
    body = {"samples": samples("handwritten", 3)}
    answer = httpx.post(f"{url}/predict", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    with running_service("--model-dir", str(REPO / "models")) as here:
        assert_same_answer(answer.json(), httpx.post(f"{here}/predict", json=body, timeout=30).json())

    pid1 = {pid: (uid, command) for pid, uid, command in processes(container)}[1]
    assert pid1 == (10001, "python -m service")
    health = wait_for("healthy", lambda: json.loads(container.state("Health"))["Status"] == "healthy", 90)
    assert health

    # docker stop while a request is in flight (its body still arriving): answered, then exit 0.
    port = int(url.rsplit(":", 1)[1])
    payload = json.dumps({"samples": samples("handwritten", 2, seed=1)}).encode()
    head = (
        f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    stopped: list = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head + payload[:100])
        time.sleep(0.3)
        began = time.monotonic()
        stopping = threading.Thread(
            target=lambda: stopped.append(docker("stop", container.name, timeout=120))
        )
        stopping.start()
        wait_for("the listening socket closed", lambda: not port_in_use(port), timeout=30, interval=0.1)
        conn.sendall(payload[100:])
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
        stopping.join(timeout=120)
    took = time.monotonic() - began
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 200 OK", reply[:300]
    assert len(json.loads(rest.split(b"\r\n\r\n", 1)[1])["predictions"]) == 2
    state = json.loads(container.state(""))
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, container.logs())
    assert took < STOP_TIMEOUT, f"docker stop took {took:.1f} s"
    logs = container.logs()
    assert "Finished server process" in logs and "[W:onnxruntime" not in logs, logs


@pytest.mark.parametrize("workers", ["1", "2"])
def test_docker_stop_while_starting_exits_at_once(cpu_image: Build, workers: str):
    """`docker stop` while Python is still importing (a second or more, before the models load): PID 1
    gets no signal it does not handle, and SIGTERM's handler came after those imports, so the signal was
    dropped, Docker waited out the stop timeout and killed it (exit 137; in Kubernetes, the whole grace
    period of a pod deleted as it started). It must exit 0 at once."""
    port = free_port()
    env = (
        "--env",
        "DBF_HOST=127.0.0.1",
        "--env",
        f"DBF_PORT={port}",
        "--env",
        f"DBF_GRPC_PORT={free_port()}",
    )
    options = (*env, "--stop-timeout", "20", "--tmpfs", "/tmp")
    container = run_detached(
        IMAGE, "--workers", workers, name=f"dbf-serve-test-stop-{workers}", options=options
    )
    container.exec("true")  # started (a tenth of a second or so): Python runs, its imports do
    docker("stop", container.name, timeout=120)
    state = json.loads(container.state(""))
    assert state["ExitCode"] == 0, (state, container.logs())  # not 137: killed after the stop timeout
    assert "Uvicorn running" not in container.logs()  # stopped before serving: the case at hand


def test_image_answers_grpc_health(cpu_image: Build):
    """The image serves gRPC beside HTTP, at DBF_GRPC_PORT: grpc.health.v1 SERVING once ready (Kubernetes'
    gRPC probe of deploy/k8s and deploy/kserve)."""
    require_grpc_front_end(has_grpc_port(lambda code: run_python(IMAGE, code)))
    grpc_port = free_port()
    container, _ = serve("dbf-serve-test-grpc", grpc_port=grpc_port)
    assert grpc_health(grpc_port) == "SERVING"
    docker("stop", container.name, timeout=120)
    assert json.loads(container.state("ExitCode")) == 0, container.logs()


def test_image_is_healthy_serving_on_ipv6(cpu_image: Build):
    """DBF_HOST=::1: the HEALTHCHECK asks the service where it listens, not 127.0.0.1 (where nothing does);
    read-only, as deploy/k8s runs it. It stayed unhealthy however well the service answered."""
    port = free_port()
    env = ("--env", "DBF_HOST=::1", "--env", f"DBF_PORT={port}", "--env", f"DBF_GRPC_PORT={free_port()}")
    container = run_detached(
        IMAGE, name="dbf-serve-test-ipv6", options=(*env, "--read-only", "--health-interval", "1s")
    )
    url = f"http://[::1]:{port}"
    wait_for("ready on [::1]", lambda: httpx.get(f"{url}/ready", timeout=2).status_code == 200, timeout=90)
    health = wait_for("healthy", lambda: json.loads(container.state("Health"))["Status"] == "healthy", 30)
    assert health, container.state("Health")
    docker("stop", container.name, timeout=120)


def test_read_only_root_with_a_tmpfs_runs_two_workers(cpu_image: Build):
    """The documented way to run read-only with several workers: /tmp on a tmpfs."""
    container, url = serve(
        "dbf-serve-test-workers", "--workers", "2", options=("--read-only", "--tmpfs", "/tmp")
    )
    workers = [p for p in processes(container) if "spawn_main" in p[2]]
    assert len(workers) == 2 and all(uid == 10001 for _, uid, _ in workers), workers
    for seed in range(4):  # over fresh connections: both workers may answer
        answer = httpx.post(
            f"{url}/predict", json={"samples": samples("handwritten", 2, seed=seed)}, timeout=30
        )
        assert answer.status_code == 200, answer.text
    metrics = httpx.get(f"{url}/metrics").text
    assert "dbf_predictions_total{" in metrics
    docker("stop", container.name, timeout=120)
    assert json.loads(container.state("ExitCode")) == 0, container.logs()
    assert "[W:onnxruntime" not in container.logs()


def test_read_only_root_without_a_tmpfs(cpu_image: Build):
    """One worker writes nothing and serves; several need /tmp for their shared metrics, and say so."""
    container, _ = serve("dbf-serve-test-read-only", options=("--read-only",))
    docker("stop", container.name, timeout=120)
    assert json.loads(container.state("ExitCode")) == 0, container.logs()
    done = docker(
        "run", "--rm", "--network", "host", "--read-only", "--env", "DBF_HOST=127.0.0.1",
        "--env", f"DBF_PORT={free_port()}", IMAGE, "--workers", "2", check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "--workers 2 needs a writable directory" in done.stderr and "--tmpfs /tmp" in done.stderr


@pytest.mark.parametrize("limit", [("--cpus", "1"), ("--cpuset-cpus", "0")], ids=["quota", "affinity"])
def test_a_one_core_container_runs_one_worker_and_one_inference_thread(cpu_image: Build, limit):
    """`--cpus 1` (a CPU quota: cgroup v2's cpu.max, v1's cpu.cfs_quota_us) or `--cpuset-cpus 0` leaves the
    service one core, whatever the host has: `--workers auto` starts one worker (the server is PID 1, no
    worker processes), and the inference threads' default is one too. They were the host's cores: on a
    cgroup v1 host `--workers auto` ignored the quota, and the threads ignored quota and affinity both."""
    container, url = serve(
        f"dbf-serve-test-one-core-{limit[0].strip('-')}", "--workers", "auto",
        options=(*limit, "--read-only", "--tmpfs", "/tmp"),
    )  # fmt: skip
    assert [command for _, _, command in processes(container) if "spawn_main" in command] == []
    code = "from service.settings import Settings; print(Settings().inference_threads)"
    assert container.python(code) == "1"  # as the server found it: the same cgroup and affinity
    answer = httpx.post(f"{url}/predict", json={"samples": samples("handwritten", 2)}, timeout=30)
    assert answer.status_code == 200, answer.text
    docker("stop", container.name, timeout=120)
    assert json.loads(container.state("ExitCode")) == 0, container.logs()


# --- the compose stack, at last: the alert ------------------------------------------------------------------


@pytest.mark.slow  # the rule's `for:` and a notification
def test_compose_stopping_the_service_fires_service_down(stack: ComposeStack):
    """DBFServiceDown reaches Alertmanager once the service has been down for the rule's `for:`."""
    stack.stop_service()
    (rule,) = [r for g in load_yaml(ALERTS)["groups"] for r in g["rules"] if r["alert"] == "DBFServiceDown"]
    hold = float(rule["for"].rstrip("m")) * 60
    assert rule["for"].endswith("m")
    interval = max(float(v.rstrip("s")) for v in load_yaml(PROMETHEUS_CONFIG)["global"].values())
    # The failed scrape, the evaluation that sees it, `for:`, the evaluation that fires, the notification.
    deadline = hold + 4 * interval + 30 - (time.monotonic() - stack.service_stopped_at)
    (alert,) = wait_for(
        "DBFServiceDown in Alertmanager", lambda: stack.alerts("DBFServiceDown"), max(deadline, 10), 2
    )
    assert alert["labels"] == {
        "alertname": "DBFServiceDown",
        "instance": "dbf-serve:8000",
        "job": "dbf-serve",
        "severity": "critical",
    }
    assert alert["status"]["state"] == "active"
    assert [r["name"] for r in alert["receivers"]] == ["on-call"]  # critical: alertmanager.yml's route
