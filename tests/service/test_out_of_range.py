"""Features far outside a view's training range (issue 29, item 16): the view is reported in
``out_of_range`` and fused as if missing, so nonsense gets no certainty; clean data is never caught."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import httpx
import numpy as np
import pytest

from manifest import Manifest
from service.v2 import decode_response, encode_request
from tests.service.conftest import MODELS, in_range_samples, serving
from tests.service.test_service import metric
from training.protocol import stratified_split
from training.readers import load

# The README's example ("Asking for a prediction"): three of mor's six features lie far below anything seen
# in training.
README_MOR = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
KAR = [0.0] * 64  # inside kar's range


@pytest.fixture(scope="module")
def url():
    with serving(MODELS) as base:
        yield base


def predict(url: str, *views: dict, path: str = "/predict") -> list[dict]:
    body = {"samples": [{"views": v} for v in views], "method": "dbf", "lambda": 1.0}
    response = httpx.post(url + path, json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


@pytest.mark.parametrize("mor", [README_MOR, [1e5] * 6, [1e38] * 6], ids=["readme", "1e5", "1e38"])
def test_nonsense_in_the_only_view_sent_gets_a_vacuous_answer(url, mor):
    """Before: one class, near-certain, with a calibrated confidence to match. Now the view is out of range
    and the answer knows nothing."""
    [answer] = predict(url, {"mor": mor})
    assert answer["out_of_range"] == ["mor"]
    assert answer["uncertainty"] == pytest.approx(1.0)
    assert answer["confidence"] < 0.5 and len(answer["prediction_set"]) != 1
    assert answer["views"] == {} and answer["discount"] == {}


def test_an_out_of_range_view_is_fused_as_if_it_were_missing(url):
    both, kar_alone = predict(url, {"mor": README_MOR, "kar": KAR}, {"kar": KAR})
    assert both["out_of_range"] == ["mor"] and kar_alone["out_of_range"] == []
    for field in ("label", "high_conflict", "prediction_set", "views", "discount", "conflict"):
        assert both[field] == kar_alone[field], field
    for field in ("probability", "belief", "uncertainty", "confidence"):
        np.testing.assert_allclose(both[field], kar_alone[field], rtol=1e-6, err_msg=field)
    assert both["uncertainty"] > 0.9  # kar's own opinion of zeros: it cannot tell


def test_a_vacuous_answer_flagged_by_uncertainty_blames_a_view_sent(url):
    """CUB's flag scores uncertainty: a sample left with no view in range raises it, and the view blamed is
    the one out of range (not the first view of the model, which it did not send)."""
    [answer] = predict(url, {"text": [1e6] * 300}, path="/v1/models/cub/predict")
    assert answer["out_of_range"] == ["text"] and answer["uncertainty"] == pytest.approx(1.0)
    assert answer["high_conflict"] is True and answer["blamed_view"] == "text"


@pytest.mark.data
def test_a_view_out_of_range_is_blamed_before_the_views_left_in(url, data_dir):
    """CUB's image features in another unit (x1000) beside real text: image is fused as missing, the text
    alone is uncertain enough to raise the flag, and the view blamed is the broken one. Before, the text
    (fused, conflict 0) was blamed over the view out of range on every flagged sample, and the alerts named
    the healthy modality."""
    data = load("cub", data_dir)
    views = {"image": data.views["image"][:40] * 1000.0, "text": data.views["text"][:40]}
    body, headers = encode_request(views)
    response = httpx.post(f"{url}/v2/models/cub/infer", content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    answer = decode_response(response.content, response.headers)
    assert answer["out_of_range"][:, 0].all() and not answer["out_of_range"][:, 1].any()
    flagged = answer["high_conflict"]
    assert flagged.mean() > 0.5, flagged.mean()
    assert (answer["blamed_view"][flagged] == 0).all(), answer["blamed_view"]


def test_a_flag_raised_with_one_view_fused_blames_none(url):
    """CUB's flag scores uncertainty: a sample whose `image` view is not sent raises it from `text` alone
    (82% of 400 real CUB samples sent so, against 1.0% with both views: a probe, 2026-11-28), and `text`
    was blamed for each, the fused view "in most conflict" where nothing can conflict with one view: the
    alerts would have named the healthy modality beside DBFViewMissing for the one not sent. Where fewer
    than two views are fused no view is blamed (v1 null, v2 -1); the flags are still counted."""
    path = "/v1/models/cub/predict"
    samples = in_range_samples(32, 0, model_dir=MODELS / "cub", views=["text"])
    httpx.post(url + path, json={"samples": samples[:1]}, timeout=30).raise_for_status()  # the series exist
    counted = {"model": "cub", "method": "dbf"}, {"model": "cub", "view": "text"}
    before = (
        metric(url, "dbf_high_conflict_total", **counted[0]),
        metric(url, "dbf_flagged_by_view_total", **counted[1]),
    )
    answers = httpx.post(url + path, json={"samples": samples}, timeout=30).json()["predictions"]
    flagged = sum(p["high_conflict"] for p in answers)
    assert flagged > 0 and all(p["blamed_view"] is None for p in answers)
    assert metric(url, "dbf_high_conflict_total", **counted[0]) == before[0] + flagged
    assert metric(url, "dbf_flagged_by_view_total", **counted[1]) == before[1]
    text = np.array([s["views"]["text"] for s in samples], np.float32)
    body, headers = encode_request({"text": text})
    response = httpx.post(f"{url}/v2/models/cub/infer", content=body, headers=headers, timeout=60)
    tensors = decode_response(response.content, response.headers)
    assert tensors["high_conflict"].sum() == flagged and (tensors["blamed_view"] == -1).all()


def test_out_of_range_views_are_counted_in_the_metrics(url):
    labels = {"model": "handwritten", "view": "mor"}
    before = metric(url, "dbf_out_of_range_total", **labels)
    kar_before = metric(url, "dbf_out_of_range_total", model="handwritten", view="kar")
    predict(url, {"mor": README_MOR, "kar": KAR}, {"mor": [1e38] * 6}, {"kar": KAR})
    assert metric(url, "dbf_out_of_range_total", **labels) == before + 2
    assert metric(url, "dbf_out_of_range_total", model="handwritten", view="kar") == kar_before


def test_v2_answers_an_out_of_range_tensor_per_view(url):
    metadata = httpx.get(url + "/v2/models/handwritten").json()
    [output] = [o for o in metadata["outputs"] if o["name"] == "out_of_range"]
    assert (output["datatype"], output["shape"]) == ("BOOL", [-1, 6])
    body, headers = encode_request(
        {"mor": np.array([README_MOR, [1e38] * 6], np.float32), "kar": np.zeros((2, 64), np.float32)}
    )
    response = httpx.post(url + "/v2/models/handwritten/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    outputs = decode_response(response.content, response.headers)
    views = [v["name"] for v in metadata["inputs"]]
    assert outputs["out_of_range"].tolist() == [[view == "mor" for view in views]] * 2
    assert (outputs["uncertainty"] > 0.9).all()


def test_the_threshold_is_the_manifests(tmp_path):
    """The manifest's out_of_range.threshold decides: raised past the example's excess, mor is fused."""
    model = tmp_path / "handwritten"
    shutil.copytree(MODELS / "handwritten", model)
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["out_of_range"]["threshold"] = 1e6
    (model / "manifest.json").write_text(json.dumps(manifest))
    with serving(model) as url:
        [answer] = predict(url, {"mor": README_MOR})
    assert answer["out_of_range"] == [] and answer["uncertainty"] < 0.01  # the old certainty


def test_heads_exported_without_range_excess_keep_serving_unchecked(tmp_path, caplog):
    """A model exported before range checks (evidence only) serves as before, and the log says so."""
    onnx = pytest.importorskip("onnx")
    model = tmp_path / "handwritten"
    shutil.copytree(MODELS / "handwritten", model)
    head = onnx.load(str(model / "mor.onnx"))
    kept = [o for o in head.graph.output if o.name == "evidence"]
    del head.graph.output[:]
    head.graph.output.extend(kept)
    content = head.SerializeToString()
    (model / "mor.onnx").write_bytes(content)
    manifest = json.loads((model / "manifest.json").read_text())
    [entry] = [v for v in manifest["views"] if v["name"] == "mor"]
    entry["sha256"] = hashlib.sha256(content).hexdigest()
    (model / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="dbf.repository"), serving(model) as url:
        [answer] = predict(url, {"mor": README_MOR})
        [other] = predict(url, {"mor": README_MOR, "fac": [1e6] * 216})
    assert "model handwritten: the heads of mor give no range_excess" in caplog.text
    assert answer["out_of_range"] == [] and answer["uncertainty"] < 0.01  # as before: not detected
    assert other["out_of_range"] == ["fac"]  # the other heads still check


@pytest.mark.data
@pytest.mark.parametrize("name", ["handwritten", "pie", "scene15", "cub"])
def test_no_sample_of_the_committed_models_data_is_out_of_range(url, data_dir, name):
    """Every sample of each committed model's dataset, the clean test split (held out of the ranges'
    fitting) among them: none is caught. (Conflictive copies are made of these samples' views.)"""
    entry = Manifest.model_validate_json((MODELS / name / "manifest.json").read_text())
    data = load(name, data_dir)
    _, _, test = stratified_split(data.labels, seed=int(entry.training["seed"]))
    caught = []
    for start in range(0, data.num_samples, 1024):  # binary v2: the whole data in a few bodies
        views = {v: data.views[v][start : start + 1024] for v in data.view_names}
        body, headers = encode_request(views)
        response = httpx.post(f"{url}/v2/models/{name}/infer", content=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        caught.append(decode_response(response.content, response.headers)["out_of_range"])
    caught = np.concatenate(caught)
    assert caught.shape == (data.num_samples, len(data.view_names)) and len(test) > 0
    assert np.flatnonzero(caught[test].any(-1)).tolist() == []
    assert np.flatnonzero(caught.any(-1)).tolist() == []
