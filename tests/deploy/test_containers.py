"""The Dockerfile and the compose stack, without a Docker engine: what goes into the image (and what must
not), the package the image installs, the image's own command run here against the repository's files, and the
compose files checked by the docker CLI where there is one and against the repository in any case."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.deploy import dockerfile
from tests.deploy.conftest import ALERTS, DEPLOY, PROMETHEUS_CONFIG, REPO, load_yaml, run_tool, stop
from tests.service.conftest import free_port

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_GPU = REPO / "docker-compose.gpu.yml"
BY_NAME = dockerfile.stages(DOCKERFILE)
STAGES = list(BY_NAME.values())
RUNTIME_STAGES = ("cpu", "gpu")
# What the image is built from; anything else in the build context is a leak.
IMAGE_SOURCES = ("pyproject.toml", "README.md", "fusion/", "manifest/", "service/", "models/")


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


def mapped_env(stage: dockerfile.Stage, port: int) -> dict[str, str]:
    """The image's environment for running here: its paths mapped onto the repository, listening on loopback
    (not the image's 0.0.0.0) on ``port``."""
    paths = container_paths(stage)
    env = {}
    for key, value in stage.env().items():
        if key == "PATH":
            continue  # the image's /opt/venv/bin is this interpreter's directory
        for inside, outside in paths.items():
            if value == inside or value.startswith(inside + "/"):
                value = str(outside) + value[len(inside) :]
        env[key] = value
    return {**os.environ, **env, "DBF_HOST": "127.0.0.1", "DBF_PORT": str(port)}


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


def test_cuda_base_matches_the_pinned_onnxruntime():
    """onnxruntime-gpu is built for one CUDA major (13 for 1.31) and cuDNN 9: the base must carry both."""
    assert '"onnxruntime-gpu>=1.31,<1.32"' in (REPO / "pyproject.toml").read_text()
    build_info = pytest.importorskip("onnxruntime.capi.build_and_package_info")
    if getattr(build_info, "package_name", "") != "onnxruntime-gpu":
        pytest.skip("the installed onnxruntime is not the GPU package")
    cuda_major = re.match(r"nvidia/cuda:(\d+)\.", BY_NAME["gpu"].base).group(1)
    assert cuda_major == build_info.cuda_version.split(".")[0], (BY_NAME["gpu"].base, build_info.cuda_version)
    assert "-cudnn-" in BY_NAME["gpu"].base  # the cudnn images of CUDA 12 and 13 carry cuDNN 9


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
    for name in ("cpu-build", "gpu-build"):
        installs = [args for args in BY_NAME[name].all("RUN") if "pip install" in args]
        assert installs == ["/opt/venv/bin/pip install ."], installs  # no extras: no torch, no dev tools


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
    assert packages == {"fusion", "manifest", "service"}
    requires = [r for r in metadata.splitlines() if r.startswith("Requires-Dist:") and "extra ==" not in r]
    assert requires and not [r for r in requires if re.search(r"torch|scipy|onnx(?!runtime)", r)], requires


def test_runtime_stages_are_alike_and_safe():
    cpu, gpu = BY_NAME["cpu"], BY_NAME["gpu"]
    for stage in (cpu, gpu):
        user = stage.last("USER")
        # Numeric (Kubernetes' runAsNonRoot can only check a number), and not root.
        assert user and re.fullmatch(r"\d+:\d+", user) and not user.startswith("0:"), user
        assert stage.exec_form("ENTRYPOINT") == ["python", "-m", "service"]
        assert stage.exec_form("CMD") is None  # `docker run IMAGE --workers 4` passes options on
        assert stage.last("EXPOSE") == stage.env()["DBF_PORT"]
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
    env = mapped_env(stage, port)
    assert env["DBF_MODEL_DIR"] == str(REPO / "models")
    _, health = stage.healthcheck()

    def healthy() -> bool:
        return subprocess.run(here(health), env=env, capture_output=True, timeout=30).returncode == 0

    assert not healthy()  # nothing listens yet
    workdir = tmp_path / "app"  # the image's WORKDIR holds only the models
    workdir.mkdir()
    (workdir / "models").symlink_to(REPO / "models")
    log = tmp_path / "service.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            here(stage.exec_form("ENTRYPOINT")), cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not healthy():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the healthcheck never passed:\n{log.read_text()}"
            time.sleep(0.2)
        ready = httpx.get(f"http://127.0.0.1:{port}/ready").json()
        assert ready["status"] == "ready" and "handwritten" in ready["models"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=float(env["DBF_GRACEFUL_SHUTDOWN_SECONDS"]) + 10) == 0, log.read_text()
        assert "Finished server process" in log.read_text()
    finally:
        stop(process)
    assert not healthy()


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
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{port}: published beyond loopback, without authentication"
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


def test_compose_gpu_override():
    app = load_yaml(COMPOSE_GPU)["services"]["dbf-serve"]
    assert app["build"]["target"] == "gpu"
    (device,) = app["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert app["environment"]["DBF_REQUIRE_GPU"] == "true"


def compose_cli() -> list[str]:
    """`docker compose` (v2) or `docker-compose`; they need no engine to check a file."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return [shutil.which("docker-compose")]
    pytest.skip("no docker compose CLI (the checks above read the files themselves)")


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_GPU]], ids=["cpu", "gpu"])
def test_compose_config_is_valid(files):
    cli = compose_cli()
    run_tool(*cli, "--project-directory", REPO, *[arg for f in files for arg in ("-f", f)], "config", "-q")
