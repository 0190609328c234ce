"""The protocols' codecs over the core, in process: what each decodes a body into, how it answers, and how it
words a place in a request. The output registry is what v1 fields, v2 tensors, v2 metadata, the OpenAPI
schema and the client all read."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import zlib
from contextlib import contextmanager
from unittest import mock

import msgspec
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from service import grpc_codec, inference, json_numbers, schemas, v1, v2
from service.api.body import Inflater, content_length
from service.errors import InvalidInput, PayloadTooLarge, ServiceError
from service.inference import InferenceRequest, ModelSignature, Result, ViewSpec
from service.json_numbers import opening_brackets
from service.outputs import FIELDS, OUTPUTS, TENSORS
from service.proto import grpc_predict_v2_pb2 as pb

SIGNATURE = ModelSignature(
    name="toy",
    version="3",
    views=(ViewSpec("a", 2), ViewSpec("b", 3)),
    classes=("x", "y", "z"),
    method="dbf",
    lam=1.0,
    methods=("bcf", "cbf", "baf", "gbaf", "dbf"),
    default_coverage=0.9,
    max_coverage=0.95,
)
UNCALIBRATED = dataclasses.replace(SIGNATURE, default_coverage=None, max_coverage=None)


def result(n: int = 2, present: list[list[bool]] | None = None) -> Result:
    rng = np.random.default_rng(n)
    mask = np.array(present if present is not None else [[True, True]] * n)
    flagged = np.arange(n) % 2 == 0
    return Result(
        present=mask,
        out_of_range=np.zeros_like(mask),
        label=np.arange(n) % 3,
        probability=rng.random((n, 3), dtype=np.float32),
        belief=rng.random((n, 3), dtype=np.float32),
        uncertainty=rng.random(n, dtype=np.float32),
        conflict=rng.random((n, 2, 2), dtype=np.float32),
        discount=rng.random((n, 2), dtype=np.float32),
        high_conflict=flagged,
        blamed_view=np.ones(n, dtype=np.int64),
        view_belief=rng.random((n, 2, 3), dtype=np.float32),
        view_uncertainty=rng.random((n, 2), dtype=np.float32),
        confidence=rng.random(n, dtype=np.float32),
        prediction_set=rng.random((n, 3)) < 0.5,
        method="dbf",
        lam=1.0,
        coverage=0.9,
    )


def v2_body(inputs: list[dict], **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


A = {"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.25]}


# --- the output registry -------------------------------------------------------------------------------


def test_every_output_is_a_field_or_a_tensor_with_a_shape_per_sample():
    assert [o.name for o in OUTPUTS] == list(dict.fromkeys(o.name for o in OUTPUTS))  # distinct
    out = result(4)
    for output in OUTPUTS:
        assert output.field is not None or output.tensor is not None, output.name
        if output.tensor is not None:
            array = output.tensor.take(out)
            assert array.shape == (4, *output.tensor.shape(3, 2)), output.name
            assert (
                array.dtype
                == {"FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_}[output.tensor.datatype]
            )
        if output.field is not None:
            assert len(output.field.column(out, SIGNATURE)) == 4


def test_v1_answers_decode_into_the_generated_types():
    """What v1 encodes, the client's wire type decodes field by field (the registry defines both)."""
    out = result(3, present=[[True, True], [True, False], [False, True]])
    body, headers = v1.encode(SIGNATURE, out)
    assert headers["content-type"] == "application/json"
    decoded = msgspec.json.decode(body, type=schemas.PredictResponse)
    assert (decoded.model, decoded.method, decoded.lam, decoded.views) == ("toy", "dbf", 1.0, ["a", "b"])
    second = decoded.predictions[1]
    assert [f.name for f in msgspec.structs.fields(schemas.Prediction)] == [o.name for o in FIELDS]
    assert second.conflict == [[pytest.approx(float(out.conflict[1, 0, 0])), None], None]
    assert set(second.discount) == {"a"} and set(second.views) == {"a"}
    assert decoded.predictions[0].blamed_view == "b" and second.blamed_view is None  # flagged: even rows
    assert decoded.predictions[0].class_name == "x"


def test_calibrated_outputs_are_null_or_not_offered_without_calibration():
    out = result(2)
    calibrated = msgspec.json.decode(v1.encode(SIGNATURE, out)[0], type=schemas.PredictResponse)
    assert calibrated.coverage == 0.9
    for prediction, members in zip(calibrated.predictions, out.prediction_set, strict=True):
        assert prediction.prediction_set == np.flatnonzero(members).tolist()
        assert 0 <= prediction.confidence <= 1
    plain = msgspec.json.decode(v1.encode(UNCALIBRATED, dataclasses.replace(out, coverage=None))[0])
    assert plain["coverage"] is None
    assert all(p["confidence"] is None and p["prediction_set"] is None for p in plain["predictions"])
    offered = [t["name"] for t in v2.metadata(UNCALIBRATED)["outputs"]]
    assert "confidence" not in offered and "prediction_set" not in offered and "label" in offered
    _, context = v2.decode(v2_body([A]), {}, UNCALIBRATED, max_samples=8)
    assert context.outputs == tuple(offered)
    with pytest.raises(InvalidInput, match=r"outputs\[0\] \(confidence\): unknown output"):
        v2.decode(v2_body([A], outputs=[{"name": "confidence"}]), {}, UNCALIBRATED, max_samples=8)


@pytest.mark.parametrize("coverage", [0, 1, 1.5, -0.1, True, "0.9"])
def test_a_coverage_outside_zero_to_one_is_refused_by_both_protocols(coverage):
    with pytest.raises(InvalidInput, match="'coverage' must be a number between 0 and 1"):
        v1.decode(
            json.dumps({"samples": [{"views": {"a": [1, 2]}}], "coverage": coverage}).encode(),
            {},
            SIGNATURE,
            max_samples=8,
        )
    with pytest.raises(InvalidInput, match=r"parameters\.coverage must be a number between 0 and 1"):
        v2.decode(v2_body([A], parameters={"coverage": coverage}), {}, SIGNATURE, max_samples=8)
    request, _ = v2.decode(v2_body([A], parameters={"coverage": 0.8}), {}, SIGNATURE, max_samples=8)
    assert request.coverage == 0.8


def test_v2_metadata_lists_every_tensor_with_its_shape():
    meta = v2.metadata(SIGNATURE)
    assert meta["versions"] == ["3"]
    assert [t["name"] for t in meta["outputs"]] == list(TENSORS)
    shapes = {t["name"]: t["shape"] for t in meta["outputs"]}
    assert shapes["conflict"] == [-1, 2, 2] and shapes["probability"] == [-1, 3] and shapes["label"] == [-1]
    assert shapes["view_belief"] == [-1, 2, 3]
    msgspec.convert(meta, schemas.ModelMetadata)  # the documented type


# --- v2 decoding ---------------------------------------------------------------------------------------


def test_v2_ignores_fields_and_parameters_that_are_not_ours():
    body = v2_body(
        [{**A, "parameters": {"shared_memory_region": "x"}, "extra": 1}],
        model_name="toy",
        model_version="3",
        id="r1",
        parameters={"sequence_id": 4, "priority": 1, "timeout": 5, "lambda": 2},
        outputs=[{"name": "label", "parameters": {"custom": True}, "other": None}],
    )
    request, context = v2.decode(body, {}, SIGNATURE, max_samples=8)
    assert request.lam == 2.0 and request.method == "dbf" and request.present.tolist() == [[True, False]]
    assert context.id == "r1" and context.outputs == ("label",)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"parameters": {"lambda": 10**309}}, "parameters.lambda must be a positive finite number"),
        ({"parameters": {"lambda": True}}, "parameters.lambda must be a positive finite number"),
        ({"parameters": {"method": 7}}, "parameters.method: unknown method 7"),
        ({"parameters": {"binary_data_output": "yes"}}, "binary_data_output must be true or false"),
        (
            {"outputs": [{"name": "label", "parameters": {"binary_data": 1}}]},
            "binary_data must be true or false",
        ),
        ({"outputs": [{"name": "label", "parameters": {"classification": 2}}]}, "classification extension"),
        (
            {
                "outputs": [
                    {
                        "name": "label",
                        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8},
                    }
                ]
            },
            "outputs[0] (label): the shared-memory extension is not supported; leave its region out",
        ),
        ({"outputs": [{"name": "label"}, {"name": "label"}]}, "outputs[1] (label): asked for twice"),
        ({"id": 7}, "not an inference request"),
        ({"parameters": {"x": json.loads("[" * 200 + "]" * 200)}}, None),  # deep, but within msgspec's limit
    ],
)
def test_v2_refuses_what_is_ours_and_wrong(extra, message):
    body = v2_body([A], **extra)
    if message is None:
        v2.decode(body, {}, SIGNATURE, max_samples=8)
        return
    with pytest.raises(InvalidInput) as refused:
        v2.decode(body, {}, SIGNATURE, max_samples=8)
    assert message in refused.value.message


def test_v2_an_input_in_shared_memory_is_refused_saying_so():
    """Triton's shared-memory extension is not served: an input whose data is a region gets a 400 saying
    that, not "no data"; one that has its data in the request too is read from there."""
    tensor = {key: value for key, value in A.items() if key != "data"}
    region = {"shared_memory_region": "input0", "shared_memory_byte_size": 8}
    with pytest.raises(InvalidInput) as refused:
        v2.decode(v2_body([{**tensor, "parameters": region}]), {}, SIGNATURE, max_samples=8)
    assert refused.value.message == (
        "inputs[0] (a): the shared-memory extension is not supported; send its data in the request"
    )


def test_v2_binary_tensors_without_their_header_length_say_so():
    """Without Inference-Header-Content-Length the whole body is read as JSON: its error says what to send."""
    tensor = {key: value for key, value in A.items() if key != "data"}
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": 8}}]}).encode()
    with pytest.raises(InvalidInput) as refused:
        v2.decode(header + np.array([0.5, 0.25], "<f4").tobytes(), {}, SIGNATURE, max_samples=8)
    assert "needs the Inference-Header-Content-Length header" in refused.value.message
    with pytest.raises(InvalidInput) as refused:
        v2.decode(b'{"inputs": [}', {}, SIGNATURE, max_samples=8)
    assert "Inference-Header-Content-Length" not in refused.value.message


def decode_json(body: bytes, *, fast: bool = True) -> tuple[InferenceRequest, v2.Context]:
    """``v2.decode`` of a JSON body read by simdjson whatever its size (fast), or by msgspec alone."""
    with mock.patch.object(v2, "_FAST_READ_BYTES", 0 if fast else math.inf):
        return v2.decode(body, {}, SIGNATURE, max_samples=8)


@pytest.mark.parametrize("fast", [True, False])
def test_v2_deep_nesting_anywhere_is_a_400(fast):
    for deep in (
        b'{"inputs": [], "parameters": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
        b'{"inputs": [], "parameters": {"x": ' + b"[" * 1000 + b"]" * 1000 + b"}}",  # within simdjson's depth
        b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}]}",
    ):
        with pytest.raises(InvalidInput):
            decode_json(deep, fast=fast)


@pytest.mark.parametrize(
    "data",
    [[0.5, 0.25], [[0.5, 0.25]], [1, 0]],
)
def test_v2_json_data_flat_or_nested(data):
    request, _ = v2.decode(v2_body([{**A, "data": data}]), {}, SIGNATURE, max_samples=8)
    assert request.features["a"].tolist() == [np.asarray(data, np.float32).ravel().tolist()]
    assert request.features["a"].dtype == np.float32 and request.features["a"].flags.c_contiguous


@given(
    numbers=st.lists(
        st.floats(allow_nan=False, allow_infinity=False)
        | st.floats(allow_nan=False, allow_infinity=False, width=32)
        | st.integers(-(2**63), 2**64 - 1)  # simdjson's 64-bit integers
        | st.integers(-(10**40), 10**40)  # beyond: msgspec's path
        | st.sampled_from([-0.0, 5e-324, 1.4e-45, 3.4028235e38, 3.4028236e38, 1e308]),
        min_size=2,
        max_size=2,
    ),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,\n\t", ": ")]),
)
def test_v2_json_data_reads_as_msgspec_and_numpy_read_it(numbers, separators):
    """Flat data is read by simdjson straight into doubles: each value the float32 that msgspec's float,
    then numpy's conversion, makes of it (or the same refusal, where it is beyond float32)."""
    data = json.dumps(numbers, separators=separators)
    body = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": %s}]}' % data.encode()
    with np.errstate(over="ignore"):
        expected = np.array(msgspec.json.decode(data, type=list[float]), np.float64).astype(np.float32)
    if not np.isfinite(expected).all():
        with pytest.raises(InvalidInput, match="not a finite float32"):
            decode_json(body)
        return
    request, _ = decode_json(body)
    assert request.features["a"].tobytes() == expected.reshape(1, 2).tobytes()  # -0.0 too


SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
JSON_VALUES = st.recursive(
    SCALARS | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
DATA = (
    st.lists(st.floats(allow_nan=False) | st.integers(-(2**70), 2**70), min_size=2, max_size=2)
    | st.lists(st.lists(st.floats(allow_nan=False), min_size=2, max_size=2), min_size=1, max_size=1)
    | JSON_VALUES
)


@st.composite
def v2_json_bodies(draw) -> bytes:
    """Requests as clients write them, and as they should not: any data, ids and parameters of any JSON,
    fields of the wrong type, repeated keys, random whitespace."""
    inputs = []
    for name in draw(st.lists(st.sampled_from(["a", "b"]), min_size=0, max_size=2)):
        tensor = {"name": name, "datatype": "FP32", "shape": [1, 2 if name == "a" else 3]}
        if draw(st.booleans()):
            tensor["data"] = draw(DATA) if name == "a" else [0.5, 1, -2e-3]
        tensor.update(draw(st.dictionaries(st.sampled_from(["parameters", "shape", "extra"]), JSON_VALUES)))
        inputs.append(tensor)
    extra = draw(st.dictionaries(st.sampled_from(["id", "parameters", "outputs"]), JSON_VALUES))
    body = {"inputs": inputs, **extra}
    text = json.dumps(body, indent=draw(st.sampled_from([None, 1])))
    if draw(st.booleans()):  # a key given twice
        text = text.replace('"name": "a"', '"name": "a", "name": "b"', 1)
    return text.encode()


@given(body=v2_json_bodies())
def test_v2_json_bodies_read_fast_as_msgspec_reads_them(body):
    """simdjson's reader of whole JSON bodies changes nothing but the time: the same request and context,
    or the same refusal, as msgspec's path alone."""

    fast, slow = outcome(decode_json, body), outcome(lambda b: decode_json(b, fast=False), body)
    assert _comparable(fast) == _comparable(slow)


def _comparable(decoded):
    value, error = decoded
    if error is not None:
        return type(error), error.message
    request, context = value
    features = {name: (array.dtype, array.shape, array.tobytes()) for name, array in request.features.items()}
    return features, request.present.tolist(), request.method, request.lam, request.coverage, context


@pytest.mark.parametrize(
    "extra",
    [
        '"id": "urn:r:1"',  # a colon in a string
        '"model_name": "toy"',  # a field not ours (kserve's)
        '"parameters": {}',
        '"parameters": {"seed": 1' + "0" * 30 + "}",  # beyond 64 bits: simdjson cannot read it
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_v2_bodies_with_members_msgspec_drops_are_looked_at_and_taken(extra, fast):
    """Where the header has more members than msgspec kept (not ours, empty, a colon in a string), its
    objects are looked at for a repeated key, and there being none, the request is taken."""
    body = b'{"inputs": [%s], %s}' % (json.dumps(A).encode(), extra.encode())
    request, _ = decode_json(body, fast=fast)
    assert request.features["a"].tolist() == [[0.5, 0.25]]
    repeated = body.replace(b'"inputs"', b'"id": "r", "id": "s", "inputs"')
    with pytest.raises(InvalidInput, match="duplicate key"):
        decode_json(repeated, fast=fast)


def test_ordinary_v2_json_bodies_are_read_fast():
    body = v2_body([A, {"name": "b", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}], id="r[1]x")
    assert v2._read_fast(body, opening_brackets(body)) is None  # a bracket in a string: msgspec reads it
    body = v2_body([A], id="r1", parameters={"lambda": 2, "x": [1, {"y": [2]}]})
    request, flat = v2._read_fast(body, opening_brackets(body))
    assert request.id == "r1" and request.parameters == {"lambda": 2, "x": [1, {"y": [2]}]}
    assert flat[0].tolist() == [0.5, 0.25] and request.inputs[0].data is msgspec.UNSET


@pytest.mark.parametrize(
    "data",
    [
        "[[0.5], [0.25]]",  # as many numbers as the shape asks, nested otherwise than the shape
        "[[0.5], 0.25]",
        "[[0.5, 0.25], []]",
        "[0.5, true]",
        '[0.5, "0.25"]',
        '{"0": 0.5, "1": 0.25}',
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_v2_json_data_that_is_not_numbers_as_the_shape_is_refused(data, fast):
    body = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": %s}]}' % data.encode()
    with pytest.raises(InvalidInput, match=r"inputs\[0\] \(a\): data must be 2 numbers"):
        decode_json(body, fast=fast)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(("data", "where"), [("[0.5, null]", "[1]"), ("[[null, 0.25]]", "[0][0]")])
def test_v2_json_null_data_is_refused_where_it_is_as_a_nan(data, where, fast):
    """orjson (kserve's REST client) writes NaN as null: it was said to be the wrong count of numbers."""
    body = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": %s}]}' % data.encode()
    message = rf"inputs\[0\] \(a\): data{re.escape(where)} is null, not a number \(NaN as orjson"
    with pytest.raises(InvalidInput, match=message):
        decode_json(body, fast=fast)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(("data", "where"), [("[0.5, 1e400]", "[1]"), ("[[0.5, -1e400]]", "[0][1]")])
def test_v2_json_data_beyond_float64_is_refused_where_it_is(data, where, fast):
    """It was said to be the wrong count of numbers ("data must be 2 numbers"), though it was not."""
    body = b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": %s}]}' % data.encode()
    message = (
        rf"inputs\[0\] \(a\): data{re.escape(where)} is not a finite float32 \(a number beyond float64\)"
    )
    with pytest.raises(InvalidInput, match=message):
        decode_json(body, fast=fast)


@given(
    binary_request=st.booleans(),
    default=st.sampled_from([None, True, False]),
    asked=st.lists(st.sampled_from([None, True, False]), min_size=0, max_size=3),
)
def test_v2_binary_outputs_follow_output_then_request_then_body(binary_request, default, asked):
    """An output is binary if it asks; else as the request's binary_data_output says; else exactly when the
    request was binary."""
    names = list(TENSORS)[: len(asked)]
    outputs = [
        {"name": n, **({"parameters": {"binary_data": b}} if b is not None else {})}
        for n, b in zip(names, asked, strict=True)
    ]
    parameters = {"binary_data_output": default} if default is not None else {}
    header = json.dumps(
        {"inputs": [{**A, "data": [0.5, 0.25]}], "parameters": parameters, "outputs": outputs or None}
    )
    headers = {v2.HEADER_LENGTH: str(len(header))} if binary_request else {}
    _, context = v2.decode(header.encode(), headers, SIGNATURE, max_samples=8)
    fallback = binary_request if default is None else default
    if not outputs:
        assert context.outputs == tuple(TENSORS) and context.binary == (set(TENSORS) if fallback else set())
    else:
        assert context.binary == {
            n for n, b in zip(names, asked, strict=True) if (fallback if b is None else b)
        }


def test_each_codec_says_what_its_work_costs_in_proportion_to():
    """What the core decides by where a codec's work runs (service.dataplane): a body's bytes of text
    (JSON, costly per byte) and of binary tensors, and whether the answer's numbers go out binary."""
    body = json.dumps({"inputs": [A]}).encode()
    assert v1.body_bytes(body, {}) == v2.body_bytes(body, {}) == (len(body), 0)
    tensor = {key: value for key, value in A.items() if key != "data"}
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": 8}}]}).encode()
    binary = header + np.array([0.5, 0.25], "<f4").tobytes()
    assert v2.body_bytes(binary, {v2.HEADER_LENGTH: str(len(header))}) == (len(header), 8)
    assert v2.body_bytes(binary, {v2.HEADER_LENGTH: "no length"}) == (len(binary), 0)  # decode refuses it
    request = pb.ModelInferRequest(model_name="toy")
    request.inputs.add(name="a", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([0.5, 0.25])
    typed = grpc_codec.parse(request.SerializeToString())
    assert grpc_codec.body_bytes(typed, {}) == (len(typed), 0)
    request.inputs[0].ClearField("contents")
    request.raw_input_contents.append(np.array([0.5, 0.25], "<f4").tobytes())
    raw = grpc_codec.parse(request.SerializeToString())
    assert grpc_codec.body_bytes(raw, {}) == (0, len(raw))

    _, json_answer = v2.decode(body, {}, SIGNATURE, max_samples=8)
    _, binary_answer = v2.decode(binary, {v2.HEADER_LENGTH: str(len(header))}, SIGNATURE, max_samples=8)
    assert not v1.binary_answer(SIGNATURE) and not v2.binary_answer(json_answer)
    assert v2.binary_answer(binary_answer) and grpc_codec.binary_answer(binary_answer)
    mixed = dataclasses.replace(binary_answer, binary=frozenset(list(binary_answer.binary)[:1]))
    assert not v2.binary_answer(mixed)


def outcome(call, *args):
    """``(value, None)``, or ``(None, the service error)`` it raised."""
    try:
        return call(*args), None
    except ServiceError as error:
        return None, error


@given(text=st.text(max_size=30) | st.from_regex(r"[ \t]?[0-9]{1,6000}[ \t]?", fullmatch=True))
@example(text="17 ")
@example(text="\t17")
def test_header_lengths_are_parsed_defensively(text):
    """Any header value: a length within the body (the digits alone: a field's value has no surrounding
    whitespace, RFC 9110 5.5, which llhttp leaves after it), or a clear 400, never another exception."""
    length, error = outcome(v2.header_length, text, 100)
    if error is None:
        assert length is not None and 0 <= length <= 100 and text.strip(" \t").isdigit()
        assert length == int(text.strip(" \t"))
    else:
        assert isinstance(error, InvalidInput) and "does not fit a 100-byte body" in error.message
        assert len(error.message) < 200


def test_a_header_length_with_whitespace_around_it_is_its_digits():
    """llhttp keeps a header's trailing whitespace: ``Content-Length: 109 `` was read as 109, and
    ``Inference-Header-Content-Length: 109 `` refused."""
    assert [v2.header_length(text, 200) for text in ("109 ", "109\t", " 109", "109")] == [109] * 4


@given(text=st.text(max_size=30) | st.from_regex(r" ?0*[0-9]{1,6000} ?", fullmatch=True))
def test_content_lengths_are_parsed_defensively(text):
    length, error = outcome(content_length, text, 1000)
    if error is None:
        assert length is not None and 0 <= length <= 1000
    elif isinstance(error, PayloadTooLarge):
        assert "DBF_MAX_BODY_BYTES" in error.message and len(error.message) < 200
    else:
        assert isinstance(error, InvalidInput) and "is not a number of bytes" in error.message
        assert len(error.message) < 200


# --- compressed bodies ---------------------------------------------------------------------------------


def decompress(body: bytes, encoding: str, limit: int, piece: int = 1 << 20) -> bytes:
    """``body`` decompressed whole, at most ``piece`` bytes at a time, as the service reads it."""
    inflater, pieces = Inflater(body, encoding, limit), []
    while not inflater.done:
        pieces.append(inflater.inflate(piece))
    return b"".join(pieces)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", lambda b: zlib.compress(b, wbits=31)),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b, wbits=-15)),
    ],
)
def test_compressed_bodies_within_the_limit(encoding, compress):
    body = b'{"inputs": []}' * 10
    assert decompress(compress(body), encoding, 1000) == body
    with pytest.raises(PayloadTooLarge, match="once decompressed"):
        decompress(compress(body), encoding, 100)
    with pytest.raises(InvalidInput):
        decompress(compress(body)[:-6], encoding, 1000)
    with pytest.raises(InvalidInput):
        decompress(b"not compressed at all", encoding, 1000)


def test_a_compression_bomb_is_refused_without_inflating_it():
    bomb = zlib.compress(bytes(1 << 30), wbits=31)  # 1 GiB of zeros in ~1 MB
    with pytest.raises(PayloadTooLarge):
        decompress(bomb, "gzip", 8 << 20)


@given(
    members=st.lists(st.binary(max_size=300) | st.just(b"{}" * 2000), min_size=1, max_size=4),
    padding=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    piece=st.integers(1, 5000),
)
def test_every_gzip_member_is_read_as_gzip_reads_them(members, padding, piece):
    """Concatenated gzip members (zero bytes between or after them too), read a piece of any size at a
    time: what gzip.decompress reads."""
    body = b"".join(
        gzip.compress(member) + bytes(zeros) for member, zeros in zip(members, padding, strict=False)
    )
    assert decompress(body, "gzip", 1 << 20, piece) == gzip.decompress(body) == b"".join(members)


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        # mtime=0: a gzip header holds the time it was written, and a test id made of the bytes differed
        # between the two xdist processes whose collections straddled a second (pytest-xdist then stops)
        ("gzip", gzip.compress(b"{}", mtime=0) + b"junk"),
        ("gzip", gzip.compress(b"{}", mtime=0) + b"\0\0\x1f"),  # zero padding, then not a member
        ("deflate", zlib.compress(b"{}") + b"\0"),
        ("deflate", zlib.compress(b"{}", wbits=-15) + b"{}"),
    ],
    ids=["gzip-then-junk", "gzip-then-padding-then-no-member", "zlib-then-a-byte", "raw-deflate-then-json"],
)
def test_bytes_after_the_compressed_data_are_refused(encoding, body):
    with pytest.raises(
        InvalidInput, match=f"the {encoding} body has .* bytes after the end of its compressed"
    ):
        decompress(body, encoding, 1000)


# --- where a core error is ------------------------------------------------------------------------------


def test_each_protocol_words_the_place_of_a_core_error():
    error = InvalidInput("features too large for the model", sample=4, view=1)
    assert v1.locate(error, SIGNATURE).message == "samples[4].views.b: features too large for the model"
    _, context = v2.decode(
        v2_body(
            [
                {**A, "shape": [5, 2], "data": [0.5] * 10},
                {"name": "b", "datatype": "FP32", "shape": [5, 3], "data": [0.5] * 15},
            ]
        ),
        {},
        SIGNATURE,
        max_samples=8,
    )
    assert v2.locate(error, context).message == "inputs[1] (b): row 4: features too large for the model"


def test_requests_concatenate_for_micro_batching():
    one, _ = v2.decode(v2_body([A]), {}, SIGNATURE, max_samples=8)
    two, _ = v1.decode(b'{"samples": [{"views": {"b": [1, 2, 3]}}]}', {}, SIGNATURE, max_samples=8)
    both = InferenceRequest.concat([one, two])
    assert len(both) == 2 and both.present.tolist() == [[True, False], [False, True]]
    assert both.features["a"].tolist() == [[0.5, 0.25]] and both.features["b"].tolist() == [[1, 2, 3]]


# --- bodies bounded by what a request holds, before they are parsed ------------------------------------

MOST_SAMPLES = 16  # DBF_MAX_SAMPLES of these tests
OUTPUT_NAMES = list(v2._offered(SIGNATURE))


def largest_requests() -> dict[str, bytes]:
    """The biggest JSON requests a client may send SIGNATURE's model with MOST_SAMPLES: every sample with
    every view, every option and output named, and data flat or nested."""
    rng = np.random.default_rng(0)
    rows = {view.name: rng.random((MOST_SAMPLES, view.dim)).round(3) for view in SIGNATURE.views}
    options = {"method": "dbf", "lambda": 2.0, "coverage": 0.9}
    samples = [{"views": {name: r[i].tolist() for name, r in rows.items()}} for i in range(MOST_SAMPLES)]
    outputs = [{"name": name, "parameters": {"binary_data": False}} for name in OUTPUT_NAMES]
    parameters = {**options, "binary_data_output": False}

    def v2_request(nested: bool) -> bytes:
        inputs = [
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(r.shape),
                "parameters": {},
                "data": r.tolist() if nested else r.ravel().tolist(),
            }
            for name, r in rows.items()
        ]
        return v2_body(inputs, id="r1", parameters=parameters, outputs=outputs)

    return {
        "v1": json.dumps({"samples": samples, **options}).encode(),
        "v2 flat": v2_request(nested=False),
        "v2 nested": v2_request(nested=True),
    }


def decode_any(protocol: str, body: bytes):
    if protocol == "v1":
        return v1.parse(body, SIGNATURE, max_samples=MOST_SAMPLES)
    return v2.decode(body, {}, SIGNATURE, max_samples=MOST_SAMPLES)


@pytest.mark.parametrize("protocol", ["v1", "v2 flat", "v2 nested"])
def test_the_largest_requests_a_model_takes_are_within_the_json_counts(protocol):
    """The counts refuse no request a client may send: the largest, every number of it and every container
    counted (JSON_CHECKED_BYTES 0), is read."""
    body = largest_requests()[protocol]
    with mock.patch.object(inference, "JSON_CHECKED_BYTES", 0):
        decoded = decode_any(protocol, body)
    request = decoded if protocol == "v1" else decoded[0]
    assert len(request) == MOST_SAMPLES and request.present.all()
    items = SIGNATURE.json_items(MOST_SAMPLES) - inference.JSON_BESIDE_SAMPLES
    assert json_numbers.commas(body) < items  # the bound is not loose by the room beside the samples


@contextmanager
def counted_unparsed(*, simdjson: bool = False):
    """Every JSON text counted (JSON_CHECKED_BYTES 0), and no parser reading one (each raises if called),
    but simdjson where ``simdjson`` (its tape bounded by the items, its document walked by bounded walks)."""
    refuse = mock.Mock(side_effect=AssertionError("parsed"))
    with (
        mock.patch.object(inference, "JSON_CHECKED_BYTES", 0),
        mock.patch.object(json_numbers, "read", json_numbers.read if simdjson else refuse),
        mock.patch.object(v2, "_DECODER", mock.Mock(decode=refuse)),
        mock.patch.object(v1.json, "loads", refuse),
    ):
        yield


def zeros(n: int) -> bytes:
    return b"[%s]" % b",".join([b"0"] * n)


FLOODS = {
    "numbers in a view": lambda n: b'{"samples": [{"views": {"a": [%s]}}]}' % b",".join([b"0"] * n),
    "numbers in data": lambda n: v2_body([{**A, "data": "X"}]).replace(
        b'"X"', b"[%s]" % b",".join([b"0"] * n)
    ),
    "objects not ours": lambda n: b'{"inputs": [], "x": [%s]}' % b",".join([b"{}"] * n),
}


@pytest.mark.parametrize("flood", FLOODS)
def test_json_of_more_items_than_a_request_holds_is_a_413_unparsed(flood):
    """Two bytes a number (``0,``) or an object (``{},``), a body makes a parser's memory and time many times
    its size: one with more items than the largest request is refused by a count of its commas."""
    most = SIGNATURE.json_items(MOST_SAMPLES)
    body = FLOODS[flood](most + 1)
    protocol = "v1" if b'"samples"' in body else "v2 flat"
    with counted_unparsed(), pytest.raises(PayloadTooLarge, match=f"more than {most} items"):
        decode_any(protocol, body)


@pytest.mark.parametrize(
    ("protocol", "container"), [("v1", b"[]"), ("v1", b"{}"), ("v2 flat", b"[]"), ("v2 flat", b'{"k": 1}')]
)
def test_json_of_more_arrays_and_objects_than_a_request_holds_is_a_400_unconverted(protocol, container):
    """Within the items, containers cost more (a Python dict or list each, where json or msgspec reads
    them): more than the largest request's are refused by a count of ``[`` and ``{`` before those parsers
    read them (simdjson's reader declines such a body, its walk bounded)."""
    most = SIGNATURE.json_containers(MOST_SAMPLES)
    flood = b"[%s]" % b",".join([container] * (most + 1))
    body = (b'{"samples": [], "x": %s}' if protocol == "v1" else b'{"inputs": [], "x": %s}') % flood
    with counted_unparsed(simdjson=True), pytest.raises(InvalidInput, match="JSON arrays and objects"):
        decode_any(protocol, body)


def test_the_fast_readers_walk_of_what_is_beside_the_data_is_bounded():
    """simdjson's document is walked in Python for repeated keys everywhere but in the inputs' data: a body
    holding 20,000 numbers in a field not ours (within the items) is walked no further than
    JSON_BESIDE_SAMPLES values, then read by msgspec, which skips that field."""
    body = v2_body([A]).replace(b'"inputs"', b'"x": %s, "inputs"' % zeros(20_000))
    walked = mock.Mock(wraps=v2._repeated_in)
    with mock.patch.object(v2, "_repeated_in", walked), mock.patch.object(v2, "_FAST_READ_BYTES", 0):
        request, _ = v2.decode(body, {}, SIGNATURE, max_samples=MOST_SAMPLES)
    assert request.features["a"].tolist() == [[0.5, 0.25]]
    assert walked.call_count <= inference.JSON_BESIDE_SAMPLES + 8


def infer_message(*, parameters: int = 0, inputs: tuple[int, ...] = (), outputs: tuple[int, ...] = ()):
    """A ModelInferRequest with ``parameters`` entries, an input of each ``inputs`` entries of parameters
    (and a name, datatype, shape and typed contents), an output of each ``outputs`` (and a name); and how
    many fields it has, its inputs' and outputs' counted in."""
    message = pb.ModelInferRequest(model_name="toy")
    for k in range(parameters):
        message.parameters[f"p{k}"].int64_param = k
    for i, entries in enumerate(inputs):
        tensor = message.inputs.add(name=f"v{i}", datatype="FP32", shape=[1, 2])
        tensor.contents.fp32_contents.extend([0.5, 1.5])
        for k in range(entries):
            tensor.parameters[f"q{k}"].bool_param = True
    for entries in outputs:
        output = message.outputs.add(name="label")
        for k in range(entries):
            output.parameters[f"r{k}"].string_param = "x"
    fields = 1 + parameters + sum(1 + 4 + n for n in inputs) + sum(1 + 1 + n for n in outputs)
    return message.SerializeToString(), fields


@given(
    parameters=st.integers(0, 40),
    inputs=st.lists(st.integers(0, 20), max_size=6),
    outputs=st.lists(st.integers(0, 20), max_size=6),
)
def test_a_messages_fields_are_counted_on_the_wire_as_protobuf_writes_them(parameters, inputs, outputs):
    body, fields = infer_message(parameters=parameters, inputs=tuple(inputs), outputs=tuple(outputs))
    assert grpc_codec._fields_in(body, 0, len(body), grpc_codec._COUNTED_WITHIN) == fields


@pytest.mark.parametrize(
    "shape", [{"parameters": 8000}, {"inputs": (8000,)}, {"outputs": (4000, 4000)}, {"inputs": (0,) * 3500}]
)
def test_a_message_of_more_fields_than_a_request_has_is_refused_before_it_is_parsed(shape):
    """protobuf's parser costs in proportion to the fields, and more for a map's distinct keys (1.5 million
    ``parameters`` entries, 21 MB, took 31 s): past MOST_FIELDS a big message is refused unparsed."""
    body, fields = infer_message(**shape)
    assert fields > grpc_codec.MOST_FIELDS and len(body) > grpc_codec.COUNTED_BYTES
    parsed = mock.patch.object(pb.ModelInferRequest, "FromString", side_effect=AssertionError("parsed"))
    with parsed, pytest.raises(InvalidInput, match=f"more than {grpc_codec.MOST_FIELDS} fields"):
        grpc_codec.parse(body)


def test_messages_of_a_clients_size_are_parsed():
    """A request of 1,024 samples of 64 views, raw, every output asked for: counted, and parsed."""
    message = pb.ModelInferRequest(model_name="toy")
    for v in range(64):
        message.inputs.add(name=f"v{v}", datatype="FP32", shape=[1024, 4])
        message.raw_input_contents.append(np.zeros((1024, 4), np.float32).tobytes())
    for name in TENSORS:
        message.outputs.add(name=name).parameters["binary_data"].bool_param = True
    body = message.SerializeToString()
    assert len(body) > grpc_codec.COUNTED_BYTES
    assert len(grpc_codec.parse(body).request.inputs) == 64


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"int_contents": [1, 2]}, "int_contents for an FP32 input: send its values in fp32_contents"),
        ({"fp64_contents": [0.5, 1.5]}, "fp64_contents for an FP32 input"),
        ({"fp32_contents": [0.5, 1.5], "int_contents": [1]}, "int_contents for an FP32 input"),
        ({}, "no fp32_contents and no raw_input_contents"),
    ],
)
def test_typed_grpc_values_of_another_type_are_named_not_ignored(given, message):
    request = pb.ModelInferRequest(model_name="toy")
    request.inputs.add(name="a", datatype="FP32", shape=[1, 2], contents=pb.InferTensorContents(**given))
    parsed = grpc_codec.parse(request.SerializeToString())
    with pytest.raises(InvalidInput, match=f"inputs\\[0\\] \\(a\\): {message}"):
        grpc_codec.decode(parsed, {}, SIGNATURE, max_samples=8)
