"""deploy/kserve: dbf-serve as a KServe serving runtime. The ServingRuntime and the InferenceService load into
the kserve SDK's typed models (strictly: a field the SDK does not know is an error), the runtime's container
is valid Kubernetes (kubernetes-validate, inside a Pod: the two objects themselves are CRDs, of which it
carries no schema), and the two agree with each other, with the image, with the service and with deploy/k8s
where a KServe controller needs them to: the runtime chosen for the model format and protocol, the ports,
the probes, the model directory, the raw deployment mode that two ports need."""

from __future__ import annotations

import re
import typing

import kserve
import kubernetes.client
import kubernetes_validate
import pydantic
import pytest
import yaml
from kserve.model_repository import MODEL_MOUNT_DIRS

from manifest import Manifest
from service.api import routes
from service.api.routes import probes
from tests.deploy import dockerfile
from tests.deploy.conftest import DEPLOY, REPO, load_all_yaml, load_yaml, run_tool
from tests.deploy.test_k8s import KUBERNETES_VERSIONS, base_objects, kustomize_command, validate

KSERVE = DEPLOY / "kserve"
IMAGE = dockerfile.stages(REPO / "Dockerfile")["cpu"]
# KServe's names that its Python SDK lacks (Go constants of its controller).
CONTAINER = "kserve-container"  # the container a predictor's settings are merged into
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
DEFAULT_GRACE_SECONDS = 30  # Kubernetes' terminationGracePeriodSeconds, which a runtime cannot set


def objects() -> dict[str, dict]:
    kustomization = load_yaml(KSERVE / "kustomization.yaml")
    found = [doc for name in kustomization["resources"] for doc in load_all_yaml(KSERVE / name)]
    return {obj["kind"]: obj for obj in found}


def runtime_container() -> dict:
    (container,) = objects()["ServingRuntime"]["spec"]["containers"]
    return container


# --- the kserve SDK's typed models --------------------------------------------------------------------------

_PRIMITIVES = {"str": str, "int": int, "bool": bool}


def typed(data: typing.Any, type_name: str, path: str) -> typing.Any:
    """``data`` (from YAML) as the SDK type ``type_name``: kserve's models field by field (by their
    ``openapi_types``), the Kubernetes types inside them by the Kubernetes client's own validation.

    Strict: an unknown key or a value of the wrong type fails the test, naming its path. (``deserialize`` of
    either SDK's ApiClient would not do: each finds types in its own package only, and a ServingRuntime
    needs both; and they drop the keys a model does not know, so a misspelt field would vanish unseen.)
    """
    if type_name.startswith("list["):
        assert isinstance(data, list), f"{path}: a list expected, got {data!r}"
        return [typed(item, type_name[5:-1], f"{path}[{i}]") for i, item in enumerate(data)]
    if type_name.startswith("dict("):
        assert isinstance(data, dict), f"{path}: a mapping expected, got {data!r}"
        value_type = re.fullmatch(r"dict\([^,]*, (.*)\)", type_name).group(1)
        return {key: typed(value, value_type, f"{path}.{key}") for key, value in data.items()}
    if type_name == "object":  # free-form
        return data
    if type_name in _PRIMITIVES:
        assert type(data) is _PRIMITIVES[type_name], f"{path}: {type_name} expected, got {data!r}"
        return data
    model = getattr(kserve.models, type_name, None)
    if model is None:  # a Kubernetes type: pydantic models that forbid unknown fields
        try:
            return getattr(kubernetes.client.models, type_name).model_validate(data)
        except pydantic.ValidationError as error:
            pytest.fail(f"{path}: not a valid {type_name}: {error}", pytrace=False)
    assert isinstance(data, dict), f"{path}: a {type_name} mapping expected, got {data!r}"
    by_key = {key: attribute for attribute, key in model.attribute_map.items()}
    unknown = sorted(set(data) - set(by_key))
    assert not unknown, f"{path}: {type_name} has no field {', '.join(unknown)}"
    return model(
        **{
            by_key[key]: typed(value, model.openapi_types[by_key[key]], f"{path}.{key}")
            for key, value in data.items()
        }
    )


def test_serving_runtime_loads_into_the_kserve_sdk_model():
    runtime = objects()["ServingRuntime"]
    assert runtime["apiVersion"] == kserve.constants.KSERVE_V1ALPHA1
    loaded = typed(runtime, "V1alpha1ServingRuntime", "ServingRuntime")
    assert isinstance(loaded, kserve.V1alpha1ServingRuntime)
    (container,) = loaded.spec.containers
    assert isinstance(container, kubernetes.client.V1Container)
    assert container.liveness_probe.grpc.port == container.ports[1].container_port


def test_inference_service_loads_into_the_kserve_sdk_model():
    service = objects()["InferenceService"]
    assert service["apiVersion"] == kserve.constants.KSERVE_V1BETA1
    loaded = typed(service, "V1beta1InferenceService", "InferenceService")
    assert isinstance(loaded, kserve.V1beta1InferenceService)
    assert isinstance(loaded.spec.predictor.model, kserve.V1beta1ModelSpec)


def test_typed_loading_refuses_what_the_sdk_does_not_know():
    """The loading above can fail: a misspelt field of KServe's or of Kubernetes', a port as a string."""
    runtime = objects()["ServingRuntime"]
    misspelt = {**runtime, "spec": {**runtime["spec"], "protocolVersion": ["v2"]}}
    with pytest.raises(AssertionError, match=r"ServingRuntimeSpec has no field protocolVersion\n"):
        typed(misspelt, "V1alpha1ServingRuntime", "ServingRuntime")
    container = runtime_container()
    with pytest.raises(pytest.fail.Exception, match=r"readinesProbe\s+Extra inputs are not permitted"):
        typed({**container, "readinesProbe": container["readinessProbe"]}, "V1Container", "container")
    port = {**container["ports"][0], "containerPort": "8000"}
    with pytest.raises(pytest.fail.Exception, match=r"containerPort\s+Input should be a valid integer"):
        typed(port, "V1ContainerPort", "port")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_runtime_container_is_valid_kubernetes(version):
    """kubernetes-validate has no schema for KServe's CRDs; the runtime's container and volumes, which KServe
    puts into the predictor's pod, are checked inside a Pod."""
    runtime = objects()["ServingRuntime"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": runtime["metadata"]["name"]},
        "spec": {"containers": runtime["spec"]["containers"], "volumes": runtime["spec"]["volumes"]},
    }
    validate(pod, version)
    # (Should kubernetes-validate ever carry KServe's schemas, validate the objects themselves.)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(runtime, version, strict=True)


# --- what a KServe controller needs ------------------------------------------------------------------------


def supported_labels(runtime: dict, runtime_named: bool) -> set[str]:
    """The model-format labels KServe matches a model against (ModelSpec.RuntimeSupportsModel): every
    supported format when the InferenceService names the runtime, else only those with autoSelect."""
    labels = set()
    for supported in runtime["spec"]["supportedModelFormats"]:
        if runtime_named or supported.get("autoSelect"):
            labels.add(f"mt:{supported['name']}")
            if "version" in supported:
                labels.add(f"mt:{supported['name']}:{supported['version']}")
    return labels


def model_label(model: dict) -> str:
    """KServe's label of the InferenceService's model format (ModelSpec.getModelFormatLabel)."""
    fmt = model["modelFormat"]
    return f"mt:{fmt['name']}" + (f":{fmt['version']}" if "version" in fmt else "")


def test_inference_service_selects_the_runtime():
    """By name, and also by model format and protocol alone (KServe's automatic selection)."""
    runtime, service = objects()["ServingRuntime"], objects()["InferenceService"]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    for runtime_named in (True, False):
        assert model_label(model) in supported_labels(runtime, runtime_named)
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert set(runtime["spec"]["protocolVersions"]) <= PROTOCOLS
    # REST and gRPC Open Inference Protocol; not KServe's v1 (/v1/models/NAME:predict): not served here.
    assert runtime["spec"]["protocolVersions"] == [
        kserve.constants.PredictorProtocol.REST_V2.value,
        kserve.constants.PredictorProtocol.GRPC_V2.value,
    ]
    served = {route.path for router in (*routes.PROTECTED, *routes.OPEN) for route in router.routes}
    assert "/v1/models/{name}/predict" in served and not any(path.endswith(":predict") for path in served)
    # The format's versions are the manifest schema's, every one of which the service reads.
    versions = {f["version"] for f in runtime["spec"]["supportedModelFormats"] if f["name"] == "dbf"}
    assert versions == {str(v) for v in typing.get_args(Manifest.model_fields["schema_version"].annotation)}
    assert model["modelFormat"]["version"] in versions


def test_raw_deployment_with_both_ports():
    """Raw deployment (Knative allows one port per container); the first port, which KServe's Service
    publishes on port 80, is HTTP; the gRPC port's name marks it as HTTP/2 to KServe; both are the image's."""
    service = objects()["InferenceService"]
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    container = runtime_container()
    assert container["name"] == CONTAINER
    assert container["image"] == "dbf-serve"  # kustomization.yaml's images set its registry and tag
    (image,) = load_yaml(KSERVE / "kustomization.yaml")["images"]
    assert image == {"name": "dbf-serve", "newTag": "cpu"}
    env = {e["name"]: e["value"] for e in container["env"]}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert list(ports) == ["http", "grpc"]
    assert str(ports["http"]) == env["DBF_PORT"] == IMAGE.env()["DBF_PORT"]
    assert str(ports["grpc"]) == env["DBF_GRPC_PORT"] == IMAGE.env()["DBF_GRPC_PORT"]
    assert ports["grpc"] == kserve.constants.DEFAULT_GRPC_PORT  # KServe's and MLServer's default
    assert "grpc" in container["ports"][1]["name"]  # KServe gives its Service port appProtocol h2c
    annotations = objects()["ServingRuntime"]["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == env["DBF_PORT"]
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_runtime_serves_what_kserve_downloads_and_stops_in_time():
    container = runtime_container()
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DBF_MODEL_DIR"] == MODEL_MOUNT_DIRS  # where the storage initializer puts the models
    assert env["DBF_HOST"] == "0.0.0.0"
    storage = objects()["InferenceService"]["spec"]["predictor"]["model"]["storageUri"]
    assert re.match(r"(pvc|gs|s3|https|oci)://", storage), storage
    # Named after a committed model: the URL KServe reports (/v2/models/NAME/infer) is one the service serves.
    name = objects()["InferenceService"]["metadata"]["name"]
    assert (REPO / "models" / name / "manifest.json").is_file()
    pause = float(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pause + float(env["DBF_GRACEFUL_SHUTDOWN_SECONDS"]) < DEFAULT_GRACE_SECONDS


def test_runtime_container_is_deploy_k8s_container():
    """The pod deploy/k8s runs, as a runtime: the same ports, probes, resources, security, shutdown pause and
    environment, but for the model directory and the drain that the default grace period bounds."""
    (k8s,) = base_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    pod = base_objects()["Deployment"]["spec"]["template"]["spec"]
    container = runtime_container()
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "resources", "lifecycle"):
        assert container[key] == k8s[key], key
    assert container["volumeMounts"] == k8s["volumeMounts"]
    assert objects()["ServingRuntime"]["spec"]["volumes"] == pod["volumes"]
    security = {**pod["securityContext"], **k8s["securityContext"]}
    assert container["securityContext"] == security
    differ = {"DBF_MODEL_DIR", "DBF_GRACEFUL_SHUTDOWN_SECONDS"}
    same = {e["name"]: e["value"] for e in container["env"] if e["name"] not in differ}
    assert same == {e["name"]: e["value"] for e in k8s["env"] if "value" in e and e["name"] not in differ}
    paths = {route.path for route in probes.router.routes}
    assert container["readinessProbe"]["httpGet"]["path"] in paths
    # KServe's autoscaler for the predictor: deploy/k8s's HorizontalPodAutoscaler.
    predictor = objects()["InferenceService"]["spec"]["predictor"]
    hpa = base_objects()["HorizontalPodAutoscaler"]["spec"]
    (metric,) = hpa["metrics"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    assert predictor["scaleMetric"] == metric["resource"]["name"]
    assert predictor["scaleTarget"] == metric["resource"]["target"]["averageUtilization"]


def test_kustomize_builds_the_runtime_with_the_image():
    built = {obj["kind"]: obj for obj in yaml.safe_load_all(run_tool(*kustomize_command(), KSERVE).stdout)}
    assert built.keys() == objects().keys()
    (container,) = built["ServingRuntime"]["spec"]["containers"]
    assert container["image"] == "dbf-serve:cpu"
