"""The Open Inference Protocol (v2) path, binary and JSON, against the real service."""

from __future__ import annotations

import json

import httpx
import msgspec
import numpy as np
import pytest

from service.outputs import TENSORS
from service.v2 import HEADER_LENGTH, decode_response, encode_request
from tests.service.conftest import MODELS, serving
from tests.service.test_service import HANDWRITTEN_DIMS

INFER = "/v2/models/handwritten/infer"


@pytest.fixture(scope="module")
def url():
    with serving(MODELS / "handwritten", max_samples=64) as base:
        yield base


def features(n: int, seed: int = 0, views=HANDWRITTEN_DIMS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.random((n, dim), dtype=np.float32) for name, dim in views.items()}


def infer(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url + INFER, content=body, headers=headers, timeout=30)


def test_metadata_and_probes(url):
    meta = httpx.get(url + "/v2/models/handwritten").json()
    assert {t["name"]: t["shape"] for t in meta["inputs"]} == {
        k: [-1, d] for k, d in HANDWRITTEN_DIMS.items()
    }
    calibrated = meta["parameters"]["calibrated"]  # a model without calibration gives no confidence or sets
    assert [t["name"] for t in meta["outputs"]] == [
        n for n, o in TENSORS.items() if calibrated or not o.calibrated
    ]
    assert httpx.get(url + "/v2/health/ready").json() == {"ready": True}
    assert httpx.get(url + "/v2/health/live").json() == {"live": True}
    assert httpx.get(url + "/v2/models/handwritten/ready").json()["ready"] is True
    assert "binary_tensor_data" in httpx.get(url + "/v2").json()["extensions"]
    assert httpx.get(url + "/v2/models/nope").status_code == 404


def test_binary_answers_equal_the_json_api(url):
    """The same samples through /v2 (binary both ways) and /predict (JSON) give the same answers, a view
    left out included."""
    views = dict(HANDWRITTEN_DIMS)
    del views["zer"]
    given = features(20, views=views)
    body, headers = encode_request(given, method="dbf", lam=1.0)
    response = infer(url, body, headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    got = decode_response(response.content, dict(response.headers))
    samples = [{"views": {k: v[i].tolist() for k, v in given.items()}} for i in range(20)]
    expected = httpx.post(url + "/predict", json={"samples": samples}).json()["predictions"]
    names = list(HANDWRITTEN_DIMS)
    assert got["label"].tolist() == [p["label"] for p in expected]
    assert got["high_conflict"].tolist() == [p["high_conflict"] for p in expected]
    np.testing.assert_allclose(got["probability"], [p["probability"] for p in expected], rtol=1e-6)
    np.testing.assert_allclose(got["uncertainty"], [p["uncertainty"] for p in expected], rtol=1e-6)
    for i, p in enumerate(expected):
        assert got["blamed_view"][i] == (names.index(p["blamed_view"]) if p["high_conflict"] else -1)
        for v, name in enumerate(names):
            assert got["discount"][i, v] == pytest.approx(p["discount"].get(name, 1.0), rel=1e-6)
    assert got["conflict"].shape == (20, 6, 6) and not got["conflict"][:, names.index("zer")].any()


def test_json_tensors_and_chosen_outputs(url):
    given = features(3)
    body = {
        "id": "request-7",
        "inputs": [
            {"name": k, "datatype": "FP32", "shape": list(v.shape), "data": v.ravel().tolist()}
            for k, v in given.items()
        ],
        "outputs": [{"name": "label"}, {"name": "uncertainty", "parameters": {"binary_data": True}}],
        "parameters": {"method": "gbaf"},
    }
    response = httpx.post(url + INFER, json=body)
    assert response.status_code == 200, response.text
    header = json.loads(response.content[: int(response.headers[HEADER_LENGTH])])
    assert header["id"] == "request-7" and header["parameters"]["method"] == "gbaf"
    got = decode_response(response.content, dict(response.headers))
    assert set(got) == {"label", "uncertainty"} and got["uncertainty"].dtype == np.float32
    plain = httpx.post(url + INFER, json={**body, "outputs": None})
    assert plain.headers["content-type"] == "application/json"
    assert {t["name"] for t in plain.json()["outputs"]} == {
        t["name"] for t in httpx.get(url + "/v2/models/handwritten").json()["outputs"]
    }


@pytest.mark.parametrize("n", [1, 40])  # 13 KB and 530 KB of JSON: msgspec's reader and simdjson's
def test_json_tensors_answer_as_binary_ones(url, n):
    given = features(n, seed=n)
    body = {
        "inputs": [
            {"name": k, "datatype": "FP32", "shape": list(v.shape), "data": v.ravel().tolist()}
            for k, v in given.items()
        ],
        "parameters": {"binary_data_output": True},
    }
    response = httpx.post(url + INFER, json=body)
    assert response.status_code == 200, response.text
    got = decode_response(response.content, dict(response.headers))
    binary = infer(url, *encode_request(given))
    expected = decode_response(binary.content, dict(binary.headers))
    assert got.keys() == expected.keys()
    for name, array in expected.items():
        assert got[name].tobytes() == array.tobytes(), name


def _binary(inputs: list[dict], blob: bytes, **extra) -> tuple[bytes, dict[str, str]]:
    header = msgspec.json.encode({"inputs": inputs, **extra})
    return header + blob, {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))}


MOR = np.full((2, 6), 0.5, np.float32).tobytes()


@pytest.mark.parametrize(
    ("inputs", "blob", "header_length", "status", "message"),
    [
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         MOR[:40], None, 400, "binary data ends after 40 of its 48 bytes"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 44}}],
         MOR, None, 400, "binary_data_size must be 48"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         MOR + b"xx", None, 400, "2 bytes of binary data after the last"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 7], "parameters": {"binary_data_size": 56}}],
         MOR, None, 400, "shape must be [N, 6]"),
        ([{"name": "mor", "datatype": "FP64", "shape": [1, 6], "parameters": {"binary_data_size": 48}}],
         MOR, None, 400, "datatype must be FP32"),
        ([{"name": "mór", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         MOR, None, 400, "unknown input"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         np.full((2, 6), np.nan, np.float32).tobytes(), None, 400, "row 0 has no view"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         np.full((2, 6), np.inf, np.float32).tobytes(), None, 400, "row 0 has a value that is not a finite"),
        ([{"name": "mor", "datatype": "FP32", "shape": [65, 6], "parameters": {"binary_data_size": 1560}}],
         bytes(1560), None, 413, "at most 64 are accepted (DBF_MAX_SAMPLES)"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6]}],
         MOR, None, 400, "no data and no binary_data_size"),
        ([], b"", None, 400, "no inputs"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         MOR, "99999", 400, "does not fit"),
        ([{"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}],
         MOR, "-1", 400, "does not fit"),
    ],
)  # fmt: skip
def test_bad_tensors_are_a_clear_4xx(url, inputs, blob, header_length, status, message):
    body, headers = _binary(inputs, blob)
    if header_length is not None:
        headers[HEADER_LENGTH] = header_length
    response = infer(url, body, headers)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]  # the protocol's error body: {"error": "<message>"}


def test_a_row_of_nan_marks_the_view_missing_from_that_sample(url):
    """As in fit's data: a batch whose samples lack a view in some rows goes as one request, those rows all
    NaN; the answers are v1's with the view left out of those samples. A row only partly NaN, or a sample
    left with no view, is refused, naming the row."""
    given = features(6, seed=5)
    given["mor"][[1, 3]] = np.nan
    given["kar"][3] = np.nan
    body, headers = encode_request(given)
    response = infer(url, body, headers)
    assert response.status_code == 200, response.text
    got = decode_response(response.content, dict(response.headers))
    samples = [
        {"views": {k: v[i].tolist() for k, v in given.items() if not np.isnan(v[i]).all()}} for i in range(6)
    ]
    expected = httpx.post(url + "/predict", json={"samples": samples}).json()["predictions"]
    np.testing.assert_allclose(got["probability"], [p["probability"] for p in expected], rtol=1e-6)
    names = list(HANDWRITTEN_DIMS)
    assert [set(np.flatnonzero(got["discount"][i] != 1.0)) <= {names.index(n) for n in p["discount"]}
            for i, p in enumerate(expected)] == [True] * 6  # fmt: skip
    assert "mor" not in expected[1]["views"] and {"mor", "kar"}.isdisjoint(expected[3]["views"])

    partly = features(3, seed=6)
    partly["mor"][2, 0] = np.nan
    response = infer(url, *encode_request(partly))
    assert response.status_code == 400
    assert "inputs[5] (mor): row 2 has a value that is not a finite float32" in response.json()["error"]
    nothing = {name: np.full((2, dim), np.nan, np.float32) for name, dim in HANDWRITTEN_DIMS.items()}
    nothing["pix"][0] = 0.5
    response = infer(url, *encode_request(nothing))
    assert response.status_code == 400 and "row 1 has no view" in response.json()["error"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([0.5] * 5, "data must be 6 numbers"),
        ([True] * 6, "data must be 6 numbers"),
        (["0.5"] * 6, "data must be 6 numbers"),
        ([[0.5] * 3, [0.5] * 2], "data must be 6 numbers"),
        # beyond float64: said so, where (it was said to be the wrong count of numbers)
        ([10**400] + [0.5] * 5, "inputs[0] (mor): data[0] is not a finite float32 (a number beyond float64)"),
        ([[0.5] * 5 + [-(10**400)]], "inputs[0] (mor): data[0][5] is not a finite float32"),
        ([1e39] + [0.5] * 5, "not a finite float32"),
        ([0.5, float("nan")] + [0.5] * 4, "inputs[0] (mor): data[1] is NaN, which is not a JSON number"),
        ([float("-inf")] + [0.5] * 5, "inputs[0] (mor): data[0] is -Infinity, which is not a JSON number"),
    ],
)
def test_bad_json_tensors_are_a_400(url, data, message):
    body = {"inputs": [{"name": "mor", "datatype": "FP32", "shape": [1, 6], "data": data}]}
    raw = json.dumps(body).replace("1e+39", "1e39").encode()
    response = httpx.post(url + INFER, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def test_nan_in_a_large_json_tensor_is_located(url):
    """Python's json writes NaN for a float that is none: in a body large enough for the fast reader too, the
    400 names the input and the value, and how a missing view goes instead."""
    data = [0.5] * (64 * 240 - 1) + [float("nan")]
    body = {"inputs": [{"name": "pix", "datatype": "FP32", "shape": [64, 240], "data": data}]}
    response = httpx.post(url + INFER, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("inputs[0] (pix): data[15359] is NaN, which is not a JSON")


# A key given twice (the second after the first, as a client merging dicts badly would): where, the key and
# its second value. Every object of the request the protocol reads.
REPEATS = [
    ("the request", "id", "other"),
    ("inputs[0]", "name", "mor"),
    ("parameters", "lambda", 2.0),
    ("outputs[0]", "name", "probability"),
    ("inputs[0].parameters", "note", 2),
    ("outputs[0].parameters", "binary_data", True),
]


@pytest.mark.parametrize("form", ["json", "big json", "binary"])  # msgspec's reader, simdjson's, a header
@pytest.mark.parametrize(("where", "key", "value"), REPEATS)
def test_a_key_given_twice_is_a_400_naming_it(url, form, where, key, value):
    """v2 reads a repeated key as v1 does: a 400 that names it, at every level of the request, never the
    last of the two taken silently."""
    big = form == "big json"
    given = features(8, views=HANDWRITTEN_DIMS) if big else features(1, views={"fou": 76})
    blobs, inputs = [], []
    for name, array in given.items():
        tensor = {"name": name, "datatype": "FP32", "shape": list(array.shape), "parameters": {"note": 1}}
        if form == "binary":
            blobs.append(array.tobytes())
            tensor["parameters"]["binary_data_size"] = len(blobs[-1])
        else:
            tensor["data"] = array.ravel().tolist()
        inputs.append(tensor)
    request = {
        "id": "r1",
        "inputs": inputs,
        "outputs": [{"name": "label", "parameters": {"binary_data": False}}],
        "parameters": {"lambda": 1.0},
    }
    target = {
        "the request": request,
        "inputs[0]": inputs[0],
        "parameters": request["parameters"],
        "outputs[0]": request["outputs"][0],
        "inputs[0].parameters": inputs[0]["parameters"],
        "outputs[0].parameters": request["outputs"][0]["parameters"],
    }[where]
    target["@repeat@"] = None
    header = json.dumps(request).replace('"@repeat@": null', f"{json.dumps(key)}: {json.dumps(value)}")
    assert header.count(json.dumps(key) + ":") >= 2
    headers = {"content-type": "application/json"}
    if form == "binary":
        headers = {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header.encode()))}
    elif big:
        assert len(header) > 16 * 1024
    response = infer(url, header.encode() + b"".join(blobs), headers)
    assert response.status_code == 400, response.text
    assert f"duplicate key {key!r} in {where}" in response.json()["error"]


def test_a_big_json_body_with_a_nul_character_in_a_key_is_read(url):
    """simdjson cannot look up a key holding a NUL character: a big JSON body with one (in a field not ours)
    goes to msgspec's reader, never a 500."""
    given = features(8)
    inputs = [
        {"name": k, "datatype": "FP32", "shape": list(v.shape), "data": v.ravel().tolist(), "n\x00": 1}
        for k, v in given.items()
    ]
    body = json.dumps({"inputs": inputs, "x\x00y": 1}).encode()
    assert len(body) > 16 * 1024 and b"\\u0000" in body
    response = infer(url, body, {"content-type": "application/json"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("size", [24, None])  # null is no size: not "no binary data"
@pytest.mark.parametrize("form", ["json", "binary"])
def test_an_input_with_both_data_and_binary_data_size_is_a_400(url, form, size):
    data = np.full((1, 6), 0.5, np.float32)
    tensor = {"name": "mor", "datatype": "FP32", "shape": [1, 6], "data": data.ravel().tolist()}
    tensor["parameters"] = {"binary_data_size": size}
    if form == "binary":
        body, headers = _binary([tensor], data.tobytes())
    else:
        body, headers = json.dumps({"inputs": [tensor]}).encode(), {"content-type": "application/json"}
    response = infer(url, body, headers)
    assert response.status_code == 400, response.text
    assert "inputs[0] (mor): both data and binary_data_size" in response.json()["error"]


def test_fusion_parameters_and_outputs_are_checked(url):
    base = {"inputs": [{"name": "mor", "datatype": "FP32", "shape": [1, 6], "data": [0.5] * 6}]}
    for extra, message in (
        ({"parameters": {"method": "xyz"}}, "unknown method"),
        ({"parameters": {"lambda": -1}}, "positive finite"),
        ({"parameters": {"lambda": True}}, "positive finite"),
        ({"outputs": [{"name": "logits"}]}, "unknown output"),
    ):
        response = httpx.post(url + INFER, json={**base, **extra})
        assert response.status_code == 400 and message in response.text, response.text


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"lambda": float("nan")}, "parameters.lambda must be a positive finite number, got NaN, which"),
        ({"coverage": float("inf")}, "parameters.coverage must be a number between 0 and 1, got Infinity"),
        ({"priority": float("-inf")}, "not an inference request: parameters.priority is -Infinity, which is"),
    ],
)
def test_nan_and_infinity_in_parameters_are_named(url, parameters, message):
    """Python's json (tritonclient's, httpx's) writes NaN and Infinity for such floats: not JSON, refused as
    gRPC refuses them, the parameter named; not as malformed JSON at some byte."""
    body = {"inputs": [{"name": "mor", "datatype": "FP32", "shape": [1, 6], "data": [0.5] * 6}]}
    response = httpx.post(url + INFER, content=json.dumps({**body, "parameters": parameters}))
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(message)


@pytest.mark.parametrize("miscount", ["characters", "one more", "zero"])
def test_a_header_length_that_is_not_the_headers_says_so(url, miscount):
    """A client that counts its JSON header in characters (a non-ASCII id), or one off, cuts it short or reads
    tensor bytes as JSON: the 400 says which length it gave and what it must be."""
    tensor = {"name": "mor", "datatype": "FP32", "shape": [2, 6], "parameters": {"binary_data_size": 48}}
    request = {"id": "réf-ü", "inputs": [tensor], "parameters": {"binary_data_output": False}}
    header = json.dumps(request, ensure_ascii=False)
    given = {"characters": len(header), "one more": len(header.encode()) + 1, "zero": 0}[miscount]
    body = header.encode() + MOR
    response = infer(url, body, {HEADER_LENGTH: str(given)})
    assert response.status_code == 400, response.text
    assert (
        f"Inference-Header-Content-Length says the JSON header is the body's first {given} bytes: it must be "
        "exactly the header's length in bytes" in response.json()["error"]
    )
    assert infer(url, body, {HEADER_LENGTH: str(len(header.encode()))}).json()["id"] == "réf-ü"


def test_an_empty_body_or_a_header_that_is_no_request_is_named_as_such(url):
    response = infer(url, b"", {"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"] == "not an inference request: the body is empty"
    header = b'{"id": 7, "inputs": []}'  # JSON, framed right, but no request: nothing about the length
    response = infer(url, header + MOR, {HEADER_LENGTH: str(len(header))})
    assert response.status_code == 400 and "Inference-Header-Content-Length" not in response.json()["error"]
    assert "Expected `str | null`, got `int` - at `$.id`" in response.json()["error"]


def test_a_byte_order_mark_before_the_json_is_ignored_as_on_v1(url):
    """RFC 8259 lets a parser ignore a UTF-8 byte-order mark before a JSON text; v1 did, and v2 for a body
    large enough for its fast reader, but a smaller one was refused ("JSON is malformed: invalid character
    (byte 0)"): the same body, two rules. Both readers now, and v1."""
    mark = b"\xef\xbb\xbf"
    headers = {"content-type": "application/json"}
    for given in ({"mor": features(1, seed=3)["mor"]}, features(2, seed=3)):  # 120 bytes; 26 kB
        body = {"inputs": [{"name": n, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}
                           for n, a in given.items()]}  # fmt: skip
        plain, marked = (infer(url, prefix + json.dumps(body).encode(), headers) for prefix in (b"", mark))
        assert plain.status_code == marked.status_code == 200, marked.text
        assert marked.json()["outputs"] == plain.json()["outputs"]
        rows = len(next(iter(given.values())))
        samples = [{"views": {n: a[i].tolist() for n, a in given.items()}} for i in range(rows)]
        answer = httpx.post(
            url + "/predict", content=mark + json.dumps({"samples": samples}).encode(), headers=headers
        )
        assert answer.status_code == 200, answer.text
