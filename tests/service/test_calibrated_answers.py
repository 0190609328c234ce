"""Calibrated confidence and conformal prediction sets, served: in both protocols and the client, at the
model's coverage or one a request asks for, judged on the model's own fusion, counted in the metrics."""

from __future__ import annotations

import dataclasses
import itertools
import json

import httpx
import numpy as np
import pytest

from calibration import CoverageError, conformal_rank
from manifest import Manifest
from service import runtime
from service.client import Client
from service.inference import InferenceRequest
from service.repository import load_repository
from service.settings import Settings
from service.v2 import decode_response, encode_request
from tests.service.conftest import MODELS, in_range_samples, serving
from tests.service.test_service import HANDWRITTEN_DIMS, metric
from training.readers import load

MANIFEST = Manifest.model_validate_json((MODELS / "handwritten" / "manifest.json").read_text())
SCORES = len(MANIFEST.calibration.conformal.calibration_scores)


@pytest.fixture(scope="module")
def url():
    with serving(MODELS) as base:
        yield base


def samples(n: int, seed: int = 0, views=HANDWRITTEN_DIMS) -> list[dict]:
    return in_range_samples(n, seed, views=views)


def predict(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/predict", json=body, timeout=30)


def test_every_committed_model_is_calibrated():
    for name in ("handwritten", "pie", "scene15", "cub"):
        entry = Manifest.model_validate_json((MODELS / name / "manifest.json").read_text())
        assert entry.schema_version == 2 and entry.calibration is not None, name
        assert entry.calibration.conformal.default_coverage == 0.9


def test_answers_carry_confidence_and_a_prediction_set(url):
    answer = predict(url, {"samples": samples(20)}).json()
    assert answer["coverage"] == MANIFEST.calibration.conformal.default_coverage
    for p in answer["predictions"]:
        assert 0 <= p["confidence"] <= 1
        assert p["prediction_set"] == sorted(set(p["prediction_set"]))
        assert all(0 <= k < 10 for k in p["prediction_set"])
    # The set is built on the projected probability: its members are the most probable classes.
    for p in answer["predictions"]:
        if p["prediction_set"]:
            ranked = np.argsort(p["probability"])[::-1][: len(p["prediction_set"])]
            assert sorted(ranked.tolist()) == p["prediction_set"]


def test_sets_grow_with_the_coverage_asked_for(url):
    body = {"samples": samples(30, seed=1)}
    sizes = []
    for coverage in (0.5, 0.8, 0.9, 0.99):
        answer = predict(url, {**body, "coverage": coverage}).json()
        assert answer["coverage"] == coverage
        sizes.append([len(p["prediction_set"]) for p in answer["predictions"]])
    for smaller, larger in itertools.pairwise(sizes):
        assert all(a <= b for a, b in zip(smaller, larger, strict=True))
    # The confidence does not depend on the coverage; the label never changes.
    a, b = (predict(url, {**body, "coverage": c}).json()["predictions"] for c in (0.5, 0.99))
    assert [p["confidence"] for p in a] == [p["confidence"] for p in b]
    assert [p["label"] for p in a] == [p["label"] for p in b]


def test_a_coverage_the_calibration_set_cannot_support_is_a_400_naming_the_most_it_does(url):
    too_high = 1 - 1 / (SCORES + 1) + 1e-4  # just past n / (n + 1)
    with pytest.raises(CoverageError):
        conformal_rank(SCORES, coverage=too_high)
    answer = predict(url, {"samples": samples(1), "coverage": too_high})
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert f"calibrated on {SCORES}" in message and "n / (n + 1)" in message
    body, headers = encode_request({"mor": np.zeros((1, 6), np.float32)})
    header = json.loads(body[: int(headers["inference-header-content-length"])])
    header["parameters"]["coverage"] = too_high
    raw = json.dumps(header).encode()
    v2 = httpx.post(
        url + "/v2/models/handwritten/infer",
        content=raw + body[int(headers["inference-header-content-length"]) :],
        headers={**headers, "inference-header-content-length": str(len(raw))},
    )
    assert v2.status_code == 400 and f"calibrated on {SCORES}" in v2.json()["error"]


@pytest.mark.parametrize("option", ["method", "lambda", "coverage"])
def test_a_null_option_is_a_400_in_both_protocols(url, option):
    """null is not a value of any option: "coverage": null is refused (as the schema says: a number), as a
    null method or lambda is, in v1's body and in v2's parameters."""
    v1 = predict(url, {"samples": samples(1), option: None})
    assert v1.status_code == 400 and option in v1.json()["error"]["message"], v1.text
    tensor = {"name": "mor", "datatype": "FP32", "shape": [1, 6], "data": [0.5] * 6}
    v2 = httpx.post(
        url + "/v2/models/handwritten/infer", json={"inputs": [tensor], "parameters": {option: None}}
    )
    assert v2.status_code == 400 and f"parameters.{option}" in v2.json()["error"], v2.text


def test_v2_gives_them_as_tensors_and_metadata_lists_them(url):
    meta = httpx.get(url + "/v2/models/handwritten").json()
    outputs = {t["name"]: t for t in meta["outputs"]}
    assert outputs["confidence"] == {"name": "confidence", "datatype": "FP32", "shape": [-1]}
    assert outputs["prediction_set"] == {"name": "prediction_set", "datatype": "BOOL", "shape": [-1, 10]}
    assert meta["parameters"]["calibrated"] is True and meta["parameters"]["coverage"] == 0.9
    assert meta["parameters"]["max_coverage"] == pytest.approx(SCORES / (SCORES + 1))
    given = samples(8, seed=2)
    features = {k: np.array([s["views"][k] for s in given], np.float32) for k in HANDWRITTEN_DIMS}
    body, headers = encode_request(features)
    header = json.loads(body[: int(headers["inference-header-content-length"])])
    header["parameters"]["coverage"] = 0.8
    raw = json.dumps(header).encode()
    response = httpx.post(
        url + "/v2/models/handwritten/infer",
        content=raw + body[int(headers["inference-header-content-length"]) :],
        headers={**headers, "inference-header-content-length": str(len(raw))},
    )
    got = decode_response(response.content, response.headers)
    expected = predict(url, {"samples": given, "coverage": 0.8}).json()["predictions"]
    np.testing.assert_allclose(got["confidence"], [p["confidence"] for p in expected], rtol=1e-6)
    assert [np.flatnonzero(row).tolist() for row in got["prediction_set"]] == [
        p["prediction_set"] for p in expected
    ]


def test_judged_on_the_models_fusion_whatever_fusion_is_asked_for(url):
    """Like the flag: the calibration was fitted on the manifest's fusion, and holds for that one."""
    body = {"samples": samples(15, seed=3)}
    own = predict(url, body).json()["predictions"]
    other = predict(url, {**body, "method": "cbf", "lambda": 3.0}).json()["predictions"]
    assert [p["prediction_set"] for p in own] == [p["prediction_set"] for p in other]
    assert [
        p["confidence"] if p["label"] == q["label"] else None for p, q in zip(own, other, strict=True)
    ] == [q["confidence"] for q in other]


@pytest.mark.data
def test_a_fusion_that_answers_another_label_has_no_calibrated_confidence_for_it(url, data_dir):
    """The calibrator gives the probability that the model's own fusion's label is right. HandWritten samples
    on which CBF picks another label than DBF: their confidence under CBF is null (v2: NaN), not DBF's
    probability for a label the answer does not give; where the labels agree it is the model's."""
    data = load("handwritten", data_dir)
    rows = [243, 264, 648, 776, 882, 0, 1, 2]  # CBF answers another label on the first five
    views = {view: data.views[view][rows] for view in data.view_names}
    body = {"samples": [{"views": {v: x[i].tolist() for v, x in views.items()}} for i in range(len(rows))]}
    own = predict(url, body).json()["predictions"]
    other = predict(url, {**body, "method": "cbf", "lambda": 1.0}).json()["predictions"]
    differ = [p["label"] != q["label"] for p, q in zip(own, other, strict=True)]
    assert differ == [True] * 5 + [False] * 3
    assert [q["confidence"] for q in other] == [None] * 5 + [p["confidence"] for p in own[5:]]
    binary, headers = encode_request(views, method="cbf", lam=1.0)
    response = httpx.post(url + "/v2/models/handwritten/infer", content=binary, headers=headers, timeout=30)
    confidence = decode_response(response.content, response.headers)["confidence"]
    assert np.isnan(confidence[:5]).all()
    np.testing.assert_array_equal(confidence[5:], [p["confidence"] for p in own[5:]])


def test_samples_missing_views_still_get_them(url):
    """The guarantee is for complete samples (the calibration samples had every view); a sample missing
    views is answered all the same, its set built from the views it has."""
    some = samples(5, seed=4, views={"pix": 240, "mor": 6})
    complete = samples(5, seed=4)
    answers = predict(url, {"samples": some + complete}).json()["predictions"]
    for p in answers:
        assert p["prediction_set"] is not None and 0 <= p["confidence"] <= 1
    assert all(set(p["views"]) == {"pix", "mor"} for p in answers[:5])


def test_the_client_and_the_metrics_see_them(url):
    before = metric(url, "dbf_prediction_set_size_count", model="handwritten")
    confident = metric(url, "dbf_confidence_count", model="handwritten")
    with Client(url) as client:
        result = client.predict_batch([s["views"] for s in samples(4, seed=5)], coverage=0.95)
    assert result.coverage == 0.95
    assert all(isinstance(p.prediction_set, list) and 0 <= p.confidence <= 1 for p in result.predictions)
    assert metric(url, "dbf_prediction_set_size_count", model="handwritten") == before + 4
    assert metric(url, "dbf_confidence_count", model="handwritten") == confident + 4


def test_prediction_sets_rank_classes_by_belief_where_float32_probabilities_tie(monkeypatch):
    """A strongly discounted fusion leaves beliefs of 1e-9 and an uncertainty that rounds to 1 in float32,
    where every projected probability rounds to 1 / K. The sets were built from those float32 ties, so that
    HandWritten's RAPS ranked the classes by index, and a set held class 0 instead of the class the model
    believes most (its label). fit computes the calibration scores from belief and uncertainty in float64."""
    model = load_repository(Settings(model_dir=MODELS / "handwritten", device="cpu")).get()
    fuse = runtime.fuse

    def swamped(opinions, method, **options):  # the same beliefs' order, scaled far below the uncertainty
        fused = fuse(opinions, method, **options)
        belief = (fused.belief * np.float32(1e-9)).astype(np.float32)
        return dataclasses.replace(fused, belief=belief, uncertainty=1 - belief.sum(-1))

    monkeypatch.setattr(runtime, "fuse", swamped)
    rng = np.random.default_rng(0)
    views = {view.name: rng.random((64, view.dim), dtype=np.float32) for view in model.manifest.views}
    result = runtime.predict(
        model, InferenceRequest(views, np.ones((64, len(views)), dtype=bool), "dbf", 1.0)
    )
    assert (result.uncertainty == 1).all() and (result.probability == np.float32(0.1)).all()  # all tied
    assert len(set(result.label.tolist())) > 1
    assert result.prediction_set[np.arange(64), result.label].all()
