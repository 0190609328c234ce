"""The Open Inference Protocol as the ecosystem's own clients speak it: tritonclient's HTTP client (sync and
aio) and kserve's REST client, against the real service. Their answers equal ``/predict``'s; metadata,
readiness, model versions, errors (printable, with the message), compressed bodies and JSON outputs on a
binary request all work as they expect."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput
from tritonclient.utils import InferenceServerException

from tests.service.conftest import MODELS, serving
from tests.service.test_service import HANDWRITTEN_DIMS

NAMES = list(HANDWRITTEN_DIMS)
NAMES_OUT = ("label", "probability", "uncertainty", "high_conflict", "blamed_view")


@pytest.fixture(scope="module")
def url():
    with serving(MODELS / "handwritten") as base:
        yield base


def features(n: int, seed: int = 0, views=HANDWRITTEN_DIMS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.random((n, dim), dtype=np.float32) for name, dim in views.items()}


def expected(url: str, given: dict[str, np.ndarray], **fusion) -> list[dict]:
    """What /predict answers for the same samples."""
    n = len(next(iter(given.values())))
    samples = [{"views": {k: v[i].tolist() for k, v in given.items()}} for i in range(n)]
    return httpx.post(url + "/predict", json={"samples": samples, **fusion}).json()["predictions"]


def assert_same(outputs: dict[str, np.ndarray], predictions: list[dict]) -> None:
    """v2 outputs (by name) agree with v1 predictions."""
    assert outputs["label"].tolist() == [p["label"] for p in predictions]
    np.testing.assert_allclose(outputs["probability"], [p["probability"] for p in predictions], rtol=1e-6)
    np.testing.assert_allclose(outputs["uncertainty"], [p["uncertainty"] for p in predictions], rtol=1e-6)
    assert outputs["high_conflict"].tolist() == [p["high_conflict"] for p in predictions]
    blamed = [NAMES.index(p["blamed_view"]) if p["blamed_view"] else -1 for p in predictions]
    assert outputs["blamed_view"].tolist() == blamed


def triton_inputs(given: dict[str, np.ndarray], *, binary: bool) -> list[triton.InferInput]:
    inputs = []
    for name, array in given.items():
        tensor = triton.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


def host(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture(params=["sync", "aio"])
def sync_and_aio(request, url):
    """Runs a call of tritonclient's HTTP client, sync or aio, against the service."""

    def call(ask):
        if request.param == "sync":
            return ask(triton.InferenceServerClient(host(url)))

        async def scenario():
            client = triton_aio.InferenceServerClient(host(url))
            try:
                return await ask(client)
            finally:
                await client.close()

        return asyncio.run(scenario())

    return call


def test_tritonclient_metadata_readiness_and_versions(url):
    client = triton.InferenceServerClient(host(url))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("handwritten") and client.is_model_ready("handwritten", "1")
    assert not client.is_model_ready("handwritten", "2") and not client.is_model_ready("nope")
    for version in ("", "1"):
        meta = client.get_model_metadata("handwritten", model_version=version)
        assert meta["versions"] == ["1"]
        assert {t["name"]: t["shape"] for t in meta["inputs"]} == {
            k: [-1, d] for k, d in HANDWRITTEN_DIMS.items()
        }
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata("handwritten", model_version="2")
    assert missing.value.status() == "404" and "no version '2'" in str(missing.value)


@pytest.mark.parametrize("binary_inputs", [True, False])
@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_tritonclient_inference_equals_predict(url, binary_inputs, compression):
    given = features(12, seed=3)
    client = triton.InferenceServerClient(host(url))
    result = client.infer(
        "handwritten",
        triton_inputs(given, binary=binary_inputs),
        request_compression_algorithm=compression,
        response_compression_algorithm=compression,
    )
    names = ("label", "probability", "uncertainty", "high_conflict", "blamed_view", "conflict", "discount")
    assert_same({name: result.as_numpy(name) for name in names}, expected(url, given))
    assert result.as_numpy("conflict").shape == (12, 6, 6)
    assert result.get_response()["model_version"] == "1"


def test_tritonclient_json_outputs_on_a_binary_request_versions_and_parameters(url):
    given = features(5, seed=4)
    client = triton.InferenceServerClient(host(url))
    outputs = [
        triton.InferRequestedOutput("label", binary_data=False),
        triton.InferRequestedOutput("probability", binary_data=False),
        triton.InferRequestedOutput("uncertainty", binary_data=True),
        triton.InferRequestedOutput("high_conflict", binary_data=False),
        triton.InferRequestedOutput("blamed_view", binary_data=False),
    ]
    result = client.infer(
        "handwritten",
        triton_inputs(given, binary=True),
        model_version="1",
        outputs=outputs,
        request_id="req-9",
        parameters={"method": "gbaf", "lambda": 2.0},
    )
    response = result.get_response()
    assert response["id"] == "req-9"
    assert response["parameters"] == {"method": "gbaf", "lambda": 2.0, "coverage": 0.9}  # the model's
    as_json = {o["name"]: "data" in o for o in response["outputs"]}
    assert as_json == {"label": True, "probability": True, "uncertainty": False, "high_conflict": True,
                       "blamed_view": True}  # fmt: skip
    assert_same(
        {o.name(): result.as_numpy(o.name()) for o in outputs},
        expected(url, given, method="gbaf", **{"lambda": 2.0}),
    )


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (lambda c, i: c.infer("nope", i), "404", "no model named 'nope'"),
        (lambda c, i: c.infer("handwritten", i, model_version="3"), "404", "no version '3'"),
        (lambda c, i: c.infer("handwritten", i, parameters={"method": "xyz"}), "400", "unknown method 'xyz'"),
        (
            lambda c, i: c.infer("handwritten", i, outputs=[triton.InferRequestedOutput("logits")]),
            "400",
            "outputs[0] (logits): unknown output",
        ),
        # refused by the server before any route (the message was a dict: v1's error format)
        (
            lambda c, i: c.infer("handwritten", i, headers={f"x-h{n}": "1" for n in range(101)}),
            "431",
            "more than 100 header fields",
        ),
        (lambda c, i: c.infer("m" * 40_000, i), "414", "request target over"),
    ],
)
def test_tritonclient_errors_carry_the_message(url, call, status, message):
    client = triton.InferenceServerClient(host(url))
    with pytest.raises(InferenceServerException) as error:
        call(client, triton_inputs(features(2), binary=True))
    assert error.value.status() == status
    assert message in str(error.value) and message in error.value.message()


def test_tritonclient_statistics_of_every_model_are_said_not_served(url, sync_and_aio):
    """tritonclient's get_inference_statistics() without a model asks for Triton's ``/v2/models/stats``,
    which read as the metadata of a model named 'stats': "no model named 'stats'" told its user nothing."""
    with pytest.raises(InferenceServerException) as error:
        sync_and_aio(lambda client: client.get_inference_statistics())
    assert error.value.status() == "404"
    assert str(error.value.message()).startswith("no endpoint /v2/models/stats: the endpoints are listed at")
    assert "statistics" in str(error.value.message())


def test_a_model_named_stats_is_served_its_metadata(tmp_path):
    """Triton's statistics share the path of a model called 'stats', a name a manifest may give."""
    shutil.copytree(MODELS / "cub", tmp_path / "stats")
    manifest = json.loads((tmp_path / "stats" / "manifest.json").read_text())
    (tmp_path / "stats" / "manifest.json").write_text(json.dumps({**manifest, "name": "stats"}))
    with serving(tmp_path) as base:
        client = triton.InferenceServerClient(host(base))
        assert client.get_model_metadata("stats")["name"] == "stats" and client.is_model_ready("stats")


def test_tritonclient_errors_name_the_input_and_row(url):
    given = features(3)
    given["fou"] = np.where(np.arange(3)[:, None] == 2, np.float32(1e38), given["fou"]).astype(np.float32)
    client = triton.InferenceServerClient(host(url))
    with pytest.raises(InferenceServerException) as error:
        client.infer("handwritten", triton_inputs(given, binary=True))
    assert "inputs[1] (fou): row 2: features too large for the model" in str(error.value)
    wrong = {"mor": np.zeros((2, 5), np.float32)}
    with pytest.raises(InferenceServerException, match=r"inputs\[0\] \(mor\): shape must be \[N, 6\]"):
        client.infer("handwritten", triton_inputs(wrong, binary=False))


def test_tritonclient_aio(url):
    given = features(7, seed=5)

    async def scenario() -> tuple:
        client = triton_aio.InferenceServerClient(host(url))
        try:
            ready = await client.is_model_ready("handwritten", "1")
            meta = await client.get_model_metadata("handwritten")
            result = await client.infer(
                "handwritten", triton_inputs(given, binary=True), request_compression_algorithm="gzip"
            )
            with pytest.raises(InferenceServerException) as error:
                await client.infer("handwritten", triton_inputs(given, binary=True), model_version="2")
            return ready, meta, result, error.value
        finally:
            await client.close()

    ready, meta, result, error = asyncio.run(scenario())
    assert ready and meta["versions"] == ["1"]
    names = ("label", "probability", "uncertainty", "high_conflict", "blamed_view")
    assert_same({name: result.as_numpy(name) for name in names}, expected(url, given))
    assert error.status() == "404" and "no version '2'" in str(error)


def kserve_inputs(given: dict[str, np.ndarray], *, binary: bool) -> list[InferInput]:
    inputs = []
    for name, array in given.items():
        tensor = InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("binary", [False, True])
def test_kserve_rest_client(url, binary):
    """kserve's client sends a top-level model_name (and an id) with every request: extension fields, not
    errors."""
    given = features(6, seed=6)

    async def scenario() -> tuple:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
        try:
            live = await client.is_server_live(url)
            ready = await client.is_server_ready(url) and await client.is_model_ready(url, "handwritten")
            request = InferRequest("handwritten", kserve_inputs(given, binary=binary))
            answer = await client.infer(url, request, model_name="handwritten")
            json_outputs = InferRequest(
                "handwritten",
                kserve_inputs(given, binary=binary),
                request_outputs=[RequestedOutput("label", {"binary_data": False})],
            )
            only_label = await client.infer(url, json_outputs, model_name="handwritten")
            with pytest.raises(httpx.HTTPStatusError) as error:
                await client.infer(
                    url, InferRequest("nope", kserve_inputs(given, binary=binary)), model_name="nope"
                )
            return live, ready, answer, only_label, error.value
        finally:
            await client.close()

    live, ready, answer, only_label, error = asyncio.run(scenario())
    assert live and ready
    outputs = {output.name: output.as_numpy() for output in answer.outputs}
    assert_same(outputs, expected(url, given))
    assert [o.name for o in only_label.outputs] == ["label"]
    assert only_label.outputs[0].as_numpy().tolist() == outputs["label"].tolist()
    assert error.response.status_code == 404 and "no model named 'nope'" in str(error)


@pytest.mark.parametrize("rows", [2, 300])  # 300: a body the fast reader (simdjson) reads first
def test_kserve_rest_client_json_nan_is_refused_saying_where_and_why(url, rows):
    """kserve's REST client writes JSON with orjson, which writes NaN as ``null``: a view missing from a
    sample as fit's data marks it (a row all NaN) arrives as nulls. "data must be 12 numbers, flat or nested
    as the shape" told its user, who sent that many, nothing of the null."""
    given = features(rows, seed=8, views={"kar": 64})
    given["kar"][1] = np.nan

    async def scenario() -> httpx.HTTPStatusError:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
        try:
            request = InferRequest("handwritten", kserve_inputs(given, binary=False))
            with pytest.raises(httpx.HTTPStatusError) as error:
                await client.infer(url, request, model_name="handwritten")
            return error.value
        finally:
            await client.close()

    error = asyncio.run(scenario())
    assert error.response.status_code == 400
    message = error.response.json()["error"]
    assert message.startswith("inputs[0] (kar): data[64] is null, not a number"), message
    assert "a row all NaN in binary data" in message


def test_kserve_v2_data_model_with_its_nulls(url):
    """kserve's own request model (pydantic, as KServe's server reads requests) writes ``null`` for every
    field left out, ``parameters`` too: read as none given, as KServe reads them."""
    from kserve.protocol.rest.v2_datamodels import InferenceRequest, RequestInput, RequestOutput

    given = features(3, seed=7)
    inputs = [
        RequestInput(name=name, shape=list(array.shape), datatype="FP32", data=array.ravel().tolist())
        for name, array in given.items()
    ]
    request = InferenceRequest(inputs=inputs, outputs=[RequestOutput(name=name) for name in NAMES_OUT])
    body = request.model_dump_json()
    assert '"parameters":null' in body and '"id":null' in body
    response = httpx.post(url + "/v2/models/handwritten/infer", content=body)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}
    assert_same(outputs, expected(url, given))
