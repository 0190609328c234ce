"""deploy/k8s: every object valid against the Kubernetes JSON schemas (strict: unknown fields are errors), the
objects consistent with each other, with the image and with the service, and the PrometheusRule carrying
exactly the alerts of deploy/prometheus/alerts.yml."""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from service.api.routes import probes
from tests.deploy import dockerfile
from tests.deploy.conftest import ALERTS, DEPLOY, REPO, load_all_yaml, load_yaml, require_tool, run_tool

IMAGE = dockerfile.stages(REPO / "Dockerfile")["cpu"]
K8S = DEPLOY / "k8s"
BASE, GPU = K8S / "base", K8S / "gpu"
# The oldest Kubernetes these manifests are for (autoscaling/v2 and policy/v1 are older still), and the newest
# whose schemas kubernetes-validate carries.
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
CORE_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: no schema in kubernetes-validate


def base_objects() -> dict[str, dict]:
    kustomization = load_yaml(BASE / "kustomization.yaml")
    objects = [doc for name in kustomization["resources"] for doc in load_all_yaml(BASE / name)]
    return {obj["kind"]: obj for obj in objects}


def render_module():
    spec = importlib.util.spec_from_file_location("render_prometheusrule", K8S / "render_prometheusrule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strategic_merge(base, patch):
    """Kubernetes' strategic merge, as far as the GPU patch needs it: maps merge, lists of named items merge
    by name (containers, env), other lists are replaced (tolerations)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = strategic_merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and all("name" in item for item in base + patch):
        out = [copy.deepcopy(item) for item in base]
        for item in patch:
            same = [i for i, old in enumerate(out) if old["name"] == item["name"]]
            if same:
                out[same[0]] = strategic_merge(out[same[0]], item)
            else:
                out.append(item)
        return out
    return patch


def gpu_deployment() -> dict:
    kustomization = load_yaml(GPU / "kustomization.yaml")
    (patch,) = [load_yaml(GPU / p["path"]) for p in kustomization["patches"]]
    merged = strategic_merge(base_objects()["Deployment"], patch)
    (image,) = kustomization["images"]
    container = merged["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image["name"]
    container["image"] = f"{image['name']}:{image['newTag']}"
    return merged


def validate(obj: dict, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']} is invalid for Kubernetes {version}: {error}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_objects_are_valid_kubernetes(version):
    objects = base_objects()
    assert set(objects) == CORE_KINDS | OPERATOR_KINDS
    for kind, obj in objects.items():
        if kind not in OPERATOR_KINDS:
            validate(obj, version)
    validate(gpu_deployment(), version)


def test_operator_objects_are_well_formed():
    objects = base_objects()
    for kind in OPERATOR_KINDS:
        assert objects[kind]["apiVersion"] == "monitoring.coreos.com/v1"
        assert objects[kind]["metadata"]["name"] == "dbf-serve"
    monitor, service = objects["ServiceMonitor"], objects["Service"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {port["name"] for port in service["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} <= ports
    assert {endpoint["path"] for endpoint in monitor["spec"]["endpoints"]} == {"/metrics"}
    # The scrape job is named after the Service, and the alerts select that job.
    assert f'up{{job="{service["metadata"]["name"]}"}}' in ALERTS.read_text()


def test_prometheusrule_is_generated_from_alerts_yml(tmp_path):
    committed = (BASE / "prometheusrule.yaml").read_text()
    assert committed == render_module().render(ALERTS.read_text()), (
        "deploy/k8s/base/prometheusrule.yaml is stale: run `python deploy/k8s/render_prometheusrule.py`"
    )
    rule = yaml.safe_load(committed)
    assert rule["spec"] == load_yaml(ALERTS)
    promtool = require_tool("promtool", package="prometheus")
    extracted = tmp_path / "prometheusrule-rules.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    run_tool(promtool, "check", "rules", extracted)


def test_deployment_agrees_with_its_service_image_and_autoscaler():
    objects = base_objects()
    deployment, service = objects["Deployment"], objects["Service"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    for kind in ("PodDisruptionBudget",):
        assert objects[kind]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = objects["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"]  # the autoscaler owns it
    assert objects["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2  # one replica may be drained
    # Two ports, HTTP and gRPC, each the same everywhere: container, environment, Service, image (and the
    # scrape annotation, HTTP's).
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert list(ports) == ["http", "grpc"]
    scraped = pod["metadata"]["annotations"]["prometheus.io/port"]
    assert str(ports["http"]) == env["DBF_PORT"] == scraped == IMAGE.env()["DBF_PORT"]
    assert str(ports["grpc"]) == env["DBF_GRPC_PORT"] == IMAGE.env()["DBF_GRPC_PORT"]
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {name: name for name in ports}
    assert [p["port"] for p in service["spec"]["ports"]] == list(ports.values())
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc["appProtocol"] == "kubernetes.io/h2c"  # gRPC: HTTP/2 in clear text
    # Probes ask endpoints the service has: readiness and start-up /ready, liveness gRPC's health service
    # (grpc.health.v1 for the whole server, on the gRPC port).
    paths = {route.path for route in probes.router.routes}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready" in paths
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["grpc"] == {"port": ports["grpc"]}  # service "": the whole server
    # Shutdown: the grace period outlasts the preStop pause and the service's own drain.
    pause = float(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(env["DBF_GRACEFUL_SHUTDOWN_SECONDS"])
    assert pod["spec"]["terminationGracePeriodSeconds"] > pause + drain
    # The image's non-root user; a read-only root with a writable /tmp.
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"]
    assert f"{security['runAsUser']}:{security['runAsGroup']}" == IMAGE.last("USER")
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
    # Resources: inference threads match the CPUs requested; memory is limited.
    assert env["DBF_INFERENCE_THREADS"] == container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]


def test_gpu_variant():
    deployment = gpu_deployment()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "dbf-serve:gpu"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "DBF_REQUIRE_GPU", "value": "true"} in container["env"]
    assert (
        container["resources"]["requests"]
        == base_objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    )
    assert {t["key"] for t in deployment["spec"]["template"]["spec"]["tolerations"]} == {"nvidia.com/gpu"}


def kustomize_command() -> list[str]:
    """`kustomize build` or `kubectl kustomize` (kubectl >= 1.21 bundles kustomize v4+)."""
    if shutil.which("kustomize"):
        return [shutil.which("kustomize"), "build"]
    kubectl = shutil.which("kubectl")
    if kubectl:
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True).stdout
        found = re.search(r"Kustomize Version: v(\d+)", version)
        if found and int(found.group(1)) >= 4:
            return [kubectl, "kustomize"]
    pytest.skip(
        "no kustomize v4+ (kustomize, or kubectl >= 1.21); the tests above merge the patch themselves"
    )


@pytest.mark.parametrize("variant", ["base", "gpu"])
def test_kustomize_builds_valid_objects(variant):
    built = yaml.safe_load_all(run_tool(*kustomize_command(), K8S / variant).stdout)
    objects = {obj["kind"]: obj for obj in built}
    assert set(objects) == set(base_objects())
    for kind, obj in objects.items():
        if kind not in OPERATOR_KINDS:
            for version in KUBERNETES_VERSIONS:
                validate(obj, version)
    expected = gpu_deployment() if variant == "gpu" else base_objects()["Deployment"]
    if variant == "base":
        expected = copy.deepcopy(expected)
        container = expected["spec"]["template"]["spec"]["containers"][0]
        container["image"] += ":" + load_yaml(BASE / "kustomization.yaml")["images"][0]["newTag"]
    assert_same_deployment(objects["Deployment"], expected)
    assert objects["PrometheusRule"]["spec"] == load_yaml(ALERTS)


def assert_same_deployment(built: dict, expected: dict) -> None:
    """Equal, with lists of named items compared as sets (kustomize may order merged env entries its way)."""

    def normal(value):
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items()}
        if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
            return {v["name"]: normal(v) for v in value}
        if isinstance(value, list):
            return [normal(v) for v in value]
        return value

    assert normal(built) == normal(expected)
