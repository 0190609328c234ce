"""What a careless operator (or a broken export) gets past the checksums: models that load but misbehave,
manifest numbers out of range, an empty API key. Each is refused at start-up (and at reload, 409), naming
the file or the variable."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.conftest import free_port, running_service, start_and_fail
from tests.service.test_service import HANDWRITTEN_DIMS, zeros_sample

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "models"
BODY = {"samples": [zeros_sample(**HANDWRITTEN_DIMS)]}


def head(dim: int, width: int, *, declared: int = 10, bias: float = 0.0) -> bytes:
    """An ONNX head whose graph declares evidence (N, ``declared``) but gives (N, ``width``): the width
    goes through a value computed at run time (reshape to (-1, width + 0 * sum(features))), so that shape
    inference cannot see it and onnxruntime keeps the declared shape, as a careless export can."""
    weights = helper.make_tensor("w", TensorProto.FLOAT, [dim, width], [0.01] * (dim * width))
    shift = helper.make_tensor("b", TensorProto.FLOAT, [width], [bias] * width)
    constants = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("width", TensorProto.FLOAT, [1], [float(width)]),
        helper.make_tensor("rows", TensorProto.INT64, [1], [-1]),
    ]
    nodes = [
        helper.make_node("MatMul", ["features", "w"], ["z"]),
        helper.make_node("Add", ["z", "b"], ["shifted"]),
        helper.make_node("ReduceSum", ["features"], ["total"], keepdims=0),
        helper.make_node("Mul", ["total", "zero"], ["nothing"]),
        helper.make_node("Add", ["width", "nothing"], ["computed"]),
        helper.make_node("Cast", ["computed"], ["columns"], to=TensorProto.INT64),
        helper.make_node("Concat", ["rows", "columns"], ["shape"], axis=0),
        helper.make_node("Reshape", ["shifted", "shape"], ["evidence"]),
    ]
    return onnx_head(nodes, [weights, shift, *constants], dim=dim, classes=declared)


def any_dim_head(dim: int, classes: int = 10, *, excess: float | None = None) -> bytes:
    """A tiny ONNX head that takes (N, ``dim``) features of any size (evidence: their sum times 0, plus 1);
    with ``excess``, it gives that ``range_excess`` for every sample too."""
    constants = [
        helper.make_tensor("zeros", TensorProto.FLOAT, [classes], [0.0] * classes),
        helper.make_tensor("ones", TensorProto.FLOAT, [classes], [1.0] * classes),
        helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
    ]
    nodes = [
        helper.make_node("ReduceSum", ["features", "axis"], ["total"], keepdims=1),
        helper.make_node("Mul", ["total", "zeros"], ["nothing"]),
        helper.make_node("Add", ["nothing", "ones"], ["evidence"]),
    ]
    if excess is None:
        return onnx_head(nodes, constants, dim=dim, classes=classes)
    constants.append(helper.make_tensor("excess", TensorProto.FLOAT, [1], [excess]))
    nodes += [
        helper.make_node("ReduceSum", ["nothing", "axis"], ["none"], keepdims=0),
        helper.make_node("Add", ["none", "excess"], ["range_excess"]),
    ]
    declared = helper.make_tensor_value_info("range_excess", TensorProto.FLOAT, ["N"])
    return onnx_head(nodes, constants, dim=dim, classes=classes, more=[declared])


def endless_head(dim: int, classes: int = 10) -> bytes:
    """A head whose evidence (ones) waits for a Loop of 2**63 - 1 turns, its result multiplied by 0."""
    scalar = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["going_in"], ["going_out"]),
            helper.make_node("Add", ["count_in", "step"], ["count_out"]),
        ],
        "turn",
        [
            scalar("turn", TensorProto.INT64, []),
            scalar("going_in", TensorProto.BOOL, []),
            scalar("count_in", TensorProto.FLOAT, []),
        ],
        [scalar("going_out", TensorProto.BOOL, []), scalar("count_out", TensorProto.FLOAT, [])],
        [helper.make_tensor("step", TensorProto.FLOAT, [], [1.0])],
    )
    constants = [
        helper.make_tensor("turns", TensorProto.INT64, [], [2**63 - 1]),
        helper.make_tensor("going", TensorProto.BOOL, [], [True]),
        helper.make_tensor("start", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("zeros", TensorProto.FLOAT, [classes], [0.0] * classes),
        helper.make_tensor("ones", TensorProto.FLOAT, [classes], [1.0] * classes),
        helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
    ]
    nodes = [
        helper.make_node("Loop", ["turns", "going", "start"], ["count"], body=body),
        helper.make_node("ReduceSum", ["features", "axis"], ["total"], keepdims=1),
        helper.make_node("Mul", ["total", "zeros"], ["nothing"]),
        helper.make_node("Mul", ["nothing", "count"], ["still_nothing"]),
        helper.make_node("Add", ["still_nothing", "ones"], ["evidence"]),
    ]
    return onnx_head(nodes, constants, dim=dim, classes=classes)


def string_head(dim: int, classes: int = 10) -> bytes:
    """A head whose evidence is strings of the right shape (zeros cast to text): its declared shape passes."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "w"], ["z"]),
            helper.make_node("Cast", ["z"], ["evidence"], to=TensorProto.STRING),
        ],
        "head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", dim])],
        [helper.make_tensor_value_info("evidence", TensorProto.STRING, ["N", classes])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [dim, classes], [0.0] * (dim * classes))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def float64_head(dim: int, classes: int = 10, *, evidence: float = 1e300) -> bytes:
    """A head whose evidence is float64 (declared so), ``evidence`` for every class whatever the features."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "w"], ["z"]),
            helper.make_node("Cast", ["z"], ["wide"], to=TensorProto.DOUBLE),
            helper.make_node("Add", ["wide", "b"], ["evidence"]),
        ],
        "head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", dim])],
        [helper.make_tensor_value_info("evidence", TensorProto.DOUBLE, ["N", classes])],
        initializer=[
            helper.make_tensor("w", TensorProto.FLOAT, [dim, classes], [0.0] * (dim * classes)),
            helper.make_tensor("b", TensorProto.DOUBLE, [classes], [evidence] * classes),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def one_row_head(dim: int, classes: int = 10, *, rows_up_to: int) -> bytes:
    """A head whose evidence (the features' sum times 5 in class 3, plus 0.1) has every row for batches of
    up to ``rows_up_to`` samples and only the first row for larger ones."""
    weights = np.zeros((dim, classes), np.float32)
    weights[:, 3] = 5.0
    constants = [
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(np.full(classes, 0.1, np.float32), "b"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([rows_up_to], np.int64), "most"),
    ]
    nodes = [
        helper.make_node("MatMul", ["features", "w"], ["z"]),
        helper.make_node("Relu", ["z"], ["positive"]),
        helper.make_node("Add", ["positive", "b"], ["every_row"]),
        helper.make_node("Shape", ["features"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
        helper.make_node("LessOrEqual", ["rows", "most"], ["few"]),
        helper.make_node("Cast", ["few"], ["all_of_them"], to=TensorProto.INT64),
        helper.make_node("Sub", ["rows", "one"], ["the_others"]),
        helper.make_node("Mul", ["all_of_them", "the_others"], ["more"]),
        helper.make_node("Add", ["one", "more"], ["end"]),
        helper.make_node("Slice", ["every_row", "zero", "end", "zero"], ["evidence"]),
    ]
    return onnx_head(nodes, constants, dim=dim, classes=classes)


def fixed_batch_head(dim: int, classes: int = 10, *, samples: int = 2) -> bytes:
    """A head declared to take batches of ``samples`` only (evidence: ones)."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "w"], ["z"]),
            helper.make_node("Add", ["z", "b"], ["evidence"]),
        ],
        "head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [samples, dim])],
        [helper.make_tensor_value_info("evidence", TensorProto.FLOAT, [samples, classes])],
        initializer=[
            numpy_helper.from_array(np.zeros((dim, classes), np.float32), "w"),
            numpy_helper.from_array(np.ones(classes, np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def onnx_head(nodes: list, initializers: list, *, dim: int, classes: int, more: list = ()) -> bytes:
    """A head's ONNX file: ``nodes`` from 'features' (N, ``dim``) to 'evidence' declared (N, ``classes``),
    and the ``more`` outputs after it."""
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", dim])],
        [helper.make_tensor_value_info("evidence", TensorProto.FLOAT, ["N", classes]), *more],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def with_head(model: Path, view: str, content: bytes, *, dim: int | None = None) -> Path:
    """Replace ``view``'s head of the model copied at ``model``, with a manifest checksum (and ``dim``) to
    match."""
    manifest = json.loads((model / "manifest.json").read_text())
    [entry] = [v for v in manifest["views"] if v["name"] == view]
    (model / entry["file"]).write_bytes(content)
    entry["sha256"] = hashlib.sha256(content).hexdigest()
    entry["dim"] = dim or entry["dim"]
    (model / "manifest.json").write_text(json.dumps(manifest))
    return model / entry["file"]


def with_manifest(model: Path, change) -> Path:
    manifest = json.loads((model / "manifest.json").read_text())
    change(manifest)
    (model / "manifest.json").write_text(json.dumps(manifest, allow_nan=True))  # Infinity, NaN as written
    return model / "manifest.json"


def batch_mean_head(dim: int, classes: int = 10) -> bytes:
    """A head that centres its features on their mean over the batch before exp(features @ w): each sample's
    evidence depends on the other samples of its batch (rows of zeros alone do not show it)."""
    weights = helper.make_tensor(
        "w", TensorProto.FLOAT, [dim, classes], [0.1 * k for k in range(dim * classes)]
    )
    nodes = [
        helper.make_node("ReduceMean", ["features"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["features", "mean"], ["centred"]),
        helper.make_node("MatMul", ["centred", "w"], ["z"]),
        helper.make_node("Exp", ["z"], ["evidence"]),
    ]
    return onnx_head(nodes, [weights], dim=dim, classes=classes)


def set_lambda_infinite(m: dict) -> None:
    m["fusion"]["lambda"] = float("inf")


def set_auroc_over_one(m: dict) -> None:
    m["conflict_flag"]["validation_auroc"]["uncertainty"] = 1.5


def set_no_range_threshold(m: dict) -> None:
    m.setdefault("out_of_range", {})["threshold"] = 0.0


BAD_HEADS = {  # the HandWritten view 'mor' (dim 6, 10 classes)
    "narrower than declared": (
        head(6, 9),
        "gives evidence of shape (2, 9) for 2 samples; manifest says (2, 10)",
    ),
    "wider than declared": (
        head(6, 11),
        "gives evidence of shape (2, 11) for 2 samples; manifest says (2, 10)",
    ),
    "negative evidence": (head(6, 10, bias=-1.0), "gives negative or non-finite evidence"),
    # Before, the start hung for ever, deaf to SIGTERM, naming no file; a reload blamed a network mount.
    "never done": (
        endless_head(6),
        "a probe batch of 2 samples of zeros did not finish within 10 s: a graph that loops, or computes "
        "far more than a head does",
    ),
    # Before, a TypeError: the start's traceback named no file, a reload answered 500, and the watcher
    # (DBF_RELOAD_POLL_SECONDS) stopped for good.
    "evidence of strings": (string_head(6), "gives evidence of type object; a head's is numbers"),
    # Before, it loaded, and every request sending the view was refused (400, "features too large for the
    # model"), zeros as well: the runtime fuses float32, where 1e300 is infinite.
    "float64 evidence beyond float32": (
        float64_head(6),
        "gives negative or non-finite evidence for features of zeros (an absent view's): [inf, inf",
    ),
    # Before, it loaded, and every answer had beliefs, uncertainty and probabilities of 0 (a strength of
    # inf): 10 classes of 3e38, finite each, sum past float32's range.
    "evidence summing past float32": (
        head(6, 10, bias=3e38),
        "gives evidence for features of zeros whose sum is past float32's range: [3.0000000054977558e+38",
    ),
    # Before, each loaded (the probe ran a batch of 2 alone): the first answered every request of another
    # size 500 ("internal error"), the second broadcast its first row to every sample of a batch of 3 or more.
    "a batch of 2 only": (
        fixed_batch_head(6),
        "fails on a probe batch of 1 sample of zeros: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got "
        "invalid dimensions for input: features",
    ),
    "one row for 3 samples": (
        one_row_head(6, rows_up_to=2),
        "gives evidence of shape (1, 10) for 3 samples; manifest says (3, 10)",
    ),
    # Before, it loaded, and requests batched together changed each other's answers (scene15, one sample
    # alone: label 0, uncertainty 0.5; beside another: label 13, uncertainty 0.29), answered 200.
    "evidence that depends on the batch": (
        batch_mean_head(6),
        "gives sample 0 of a probe batch of 3 another evidence than alone",
    ),
    "negative range excess": (
        any_dim_head(6, excess=-1.0),
        "gives range_excess of shape (2,) for 2 samples of zeros, starting [-1.0, -1.0]; a head's is one "
        "non-negative number per sample",
    ),
}
BAD_NUMBERS = {
    "lambda Infinity": (set_lambda_infinite, "fusion.lambda\n  Input should be a finite number"),
    "AUROC over 1": (
        set_auroc_over_one,
        "validation_auroc.uncertainty\n  Input should be less than or equal to 1",
    ),
    "out-of-range threshold 0": (
        set_no_range_threshold,
        "out_of_range.threshold\n  Input should be greater than 0",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADS))
def test_a_head_that_misbehaves_on_a_probe_batch_stops_the_service(tmp_path, case):
    content, message = BAD_HEADS[case]
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    file = with_head(tmp_path / "handwritten", "mor", content)
    done = start_and_fail("--model-dir", str(tmp_path / "handwritten"))
    assert done.returncode != 0
    assert f"{file}: {message}" in done.stderr, done.stderr[-2000:]


def test_a_head_giving_negative_evidence_for_some_features_is_no_answer(tmp_path):
    """A head whose evidence goes negative for features other than the probe's zeros (here features times
    0.01 and no activation) loads; its negative evidence was fused into beliefs below 0 and an uncertainty
    of 1.06, answered 200. Now such a request is a 500 naming the model and the view, in every protocol,
    and the other views serve on."""
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    with_head(tmp_path / "handwritten", "mor", head(6, 10))
    negative = {"samples": [{"views": {"mor": [-1.0] * 6}}]}
    with running_service("--model-dir", str(tmp_path / "handwritten")) as url:
        for path, body in (
            ("/predict", negative),
            ("/v2/models/handwritten/infer", {"inputs": [v2_tensor("mor", [-1.0] * 6)]}),
        ):
            refused = httpx.post(url + path, json=body)
            assert refused.status_code == 500, refused.text
            assert "model 'handwritten' is broken: the head of view 'mor' gives negative evidence" in (
                refused.text
            )
        positive = {"samples": [{"views": {"mor": [1.0] * 6}}]}
        assert httpx.post(url + "/predict", json=positive).status_code == 200
        assert httpx.post(url + "/predict", json=BODY).status_code == 200


def test_features_whose_evidence_sums_past_float32_are_refused_not_answered_as_zeros(tmp_path):
    """Evidence finite in every class can still sum past float32's range (a head without a cap on its
    evidence, features far out): fused, the Dirichlet strength was inf, and the answer (200) had beliefs,
    uncertainty and probabilities of 0. Such features are refused as an evidence overflow is."""
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    with_head(tmp_path / "handwritten", "mor", linear_head(6, 10, weight=1e37))
    with running_service("--model-dir", str(tmp_path / "handwritten")) as url:
        refused = httpx.post(url + "/predict", json={"samples": [{"views": {"mor": [5.0] * 6}}]})
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert message == "samples[0].views.mor: features too large for the model (its evidence overflows)"
        answer = httpx.post(url + "/predict", json={"samples": [{"views": {"mor": [0.1] * 6}}]})
        assert answer.status_code == 200
        assert sum(answer.json()["predictions"][0]["probability"]) == pytest.approx(1, abs=1e-5)


def test_a_head_giving_one_row_for_a_batch_is_no_answer_for_any_of_its_samples(tmp_path):
    """A head that answers the probe's batches in full but gives one row for a larger one: assigned to the
    batch's evidence, the row was broadcast, and every sample (other requests' too, batched together) got
    the first one's answer, 200. Now the batch is refused naming the model and the view (500); a single
    sample, whose one row is its own, is answered."""
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    with_head(tmp_path / "handwritten", "mor", one_row_head(6, rows_up_to=3))
    samples = [{"views": {"mor": [value] * 6}} for value in (1.0, 0.0, 0.0, 0.0)]
    with running_service("--model-dir", str(tmp_path / "handwritten")) as url:
        refused = httpx.post(url + "/predict", json={"samples": samples})
        assert refused.status_code == 500, refused.text
        message = refused.json()["error"]["message"]
        assert (
            "model 'handwritten' is broken: the head of view 'mor' gives outputs of shape (1, 10)" in message
        )
        assert "for 4 samples" in message
        alone = httpx.post(url + "/predict", json={"samples": samples[1:2]})
        assert alone.status_code == 200 and alone.json()["predictions"][0]["uncertainty"] > 0.9


def linear_head(dim: int, classes: int, *, weight: float) -> bytes:
    """A head whose evidence is the features times ``weight``, summed, in every class (no activation)."""
    weights = helper.make_tensor("w", TensorProto.FLOAT, [dim, classes], [weight] * (dim * classes))
    return onnx_head(
        [helper.make_node("MatMul", ["features", "w"], ["evidence"])], [weights], dim=dim, classes=classes
    )


def v2_tensor(name: str, values: list[float]) -> dict:
    return {"name": name, "shape": [1, len(values)], "datatype": "FP32", "data": values}


def test_a_head_with_its_tensors_in_another_file_stops_the_service(tmp_path):
    """ONNX external data was read from the service's working directory, where no checksum covers it: the
    attack probe swapped that file and the answers changed with every checksum still matching."""
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    split = tmp_path / "split"
    split.mkdir()
    model = onnx.load_from_string(head(6, 10))
    raw = [numpy_helper.from_array(numpy_helper.to_array(t), t.name) for t in model.graph.initializer]
    del model.graph.initializer[:]
    model.graph.initializer.extend(raw)  # raw bytes: what ONNX moves to another file
    onnx.save_model(
        model,
        split / "mor.onnx",
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    file = with_head(tmp_path / "handwritten", "mor", (split / "mor.onnx").read_bytes())
    done = start_and_fail("--model-dir", str(tmp_path / "handwritten"), cwd=split)  # weights.bin is there
    assert done.returncode != 0
    expected = (
        "keeps tensors in another file (ONNX external data), which the manifest's checksum does not cover"
    )
    assert f"{file}: {expected}" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("case", sorted(BAD_NUMBERS))
def test_a_manifest_number_out_of_range_stops_the_service(tmp_path, case):
    change, message = BAD_NUMBERS[case]
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    file = with_manifest(tmp_path / "handwritten", change)
    done = start_and_fail("--model-dir", str(tmp_path / "handwritten"))
    assert done.returncode != 0
    assert f"{file}: invalid manifest" in done.stderr and message in done.stderr, done.stderr[-2000:]


def with_dim_as_text(m: dict) -> None:
    m["views"][0]["dim"] = str(m["views"][0]["dim"])


def with_name_repeated(text: str) -> str:
    # A second "name" first in the object; json.dumps cannot write a repeated key.
    return text.replace("{", '{"name": "impostor", ', 1)


# A manifest export did not write: before, pydantic read "6" as 6 and kept a repeated key's last value.
LOOSE_MANIFESTS = {
    "a dim written as a string": (
        lambda model: with_manifest(model, with_dim_as_text),
        "views.0.dim\n  Input should be a valid integer",
    ),
    "a key repeated": (
        lambda model: rewritten(model / "manifest.json", with_name_repeated),
        "invalid manifest: duplicate key(s) ['name']",
    ),
}


def rewritten(file: Path, change) -> Path:
    file.write_text(change(file.read_text()))
    return file


@pytest.mark.parametrize("case", sorted(LOOSE_MANIFESTS))
def test_a_manifest_read_loosely_before_stops_the_service(tmp_path, case):
    change, message = LOOSE_MANIFESTS[case]
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    file = change(tmp_path / "handwritten")
    done = start_and_fail("--model-dir", str(tmp_path / "handwritten"))
    assert done.returncode != 0
    assert f"{file}: invalid manifest" in done.stderr and message in done.stderr, done.stderr[-2000:]


def test_a_view_over_the_maximum_dim_stops_the_service(tmp_path):
    """The issue's absurd dim (2e7), with a head that really takes it: a request leaving that view out
    would allocate 80 MB of zeros per sample."""
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    with_head(tmp_path / "handwritten", "mor", any_dim_head(20_000_000), dim=20_000_000)
    done = start_and_fail("--model-dir", str(tmp_path / "handwritten"))
    assert done.returncode != 0
    manifest = tmp_path / "handwritten" / "manifest.json"
    assert (
        f"{manifest}: view 'mor' has dim 20000000; at most 65536 are served (DBF_MAX_VIEW_DIM)" in done.stderr
    )
    # Within the maximum, such a head serves.
    with_head(tmp_path / "handwritten", "mor", any_dim_head(65536), dim=65536)
    with running_service("--model-dir", str(tmp_path / "handwritten")) as url:
        assert httpx.get(url + "/ready").status_code == 200


def test_a_model_copied_under_another_folder_stops_the_service_naming_both(tmp_path):
    """Two folders whose manifests give one name (a model copied to try a change): which one is served would
    depend on folder order, so neither is; the error names both folders' manifests."""
    for folder in ("handwritten", "handwritten-copy"):
        shutil.copytree(MODELS / "handwritten", tmp_path / folder)
    done = start_and_fail("--model-dir", str(tmp_path))
    assert done.returncode != 0
    first, second = (tmp_path / folder / "manifest.json" for folder in ("handwritten", "handwritten-copy"))
    assert f"{second}: model name 'handwritten' is used twice (also by {first})" in done.stderr, done.stderr
    # Said once, without the framework's traceback of the lifespan that stopped (a 60-line one before).
    assert "Traceback" not in done.stderr and "Application startup failed" in done.stderr


def test_a_raps_free_rank_past_int64_serves_as_every_rank_free(tmp_path):
    """RAPS's free_rank beyond the classes frees every rank. One past int64 (10**30, valid JSON and schema)
    loaded, then every request of the model was a 500 (numpy could not add the object array it made)."""
    answers = {}
    for free_rank in (10, 10**30):
        model = tmp_path / str(free_rank) / "handwritten"
        shutil.copytree(MODELS / "handwritten", model)
        # The committed penalty (0.5): its calibration scores reach 2.17, past what a penalty of 0.1 can give.
        score = {"kind": "raps", "penalty": 0.5, "free_rank": free_rank}
        with_manifest(model, lambda m, score=score: m["calibration"]["conformal"].__setitem__("score", score))
        with running_service("--model-dir", str(model)) as url:
            answer = httpx.post(url + "/predict", json=BODY)
            assert answer.status_code == 200, answer.text
            answers[free_rank] = answer.json()["predictions"][0]["prediction_set"]
    assert answers[10**30] == answers[10]


def too_wide(model: Path) -> Path:
    with_head(model, "mor", any_dim_head(70_000), dim=70_000)
    return model / "manifest.json"  # the file at fault: it declares the dim


def test_misbehaving_models_are_refused_at_reload_naming_the_file(tmp_path):
    """The same checks at reload: 409 naming the file, and the good model serves on."""
    root = tmp_path / "repository"
    shutil.copytree(MODELS / "handwritten", root / "handwritten")
    with running_service("--model-dir", str(root)) as url:
        before = httpx.post(url + "/predict", json=BODY).json()
        attempts = [
            lambda model: (with_head(model, "mor", BAD_HEADS["wider than declared"][0]), "gives evidence"),
            lambda model: (with_manifest(model, set_lambda_infinite), "Input should be a finite number"),
            lambda model: (too_wide(model), "DBF_MAX_VIEW_DIM"),
            lambda model: (with_head(model, "mor", string_head(6)), "gives evidence of type"),
        ]
        for attempt in attempts:
            staged = tmp_path / "staged"
            shutil.copytree(MODELS / "handwritten", staged)
            file, message = attempt(staged)
            shutil.rmtree(root / "handwritten")
            staged.rename(root / "handwritten")
            refused = httpx.post(url + "/v1/admin/reload")
            assert refused.status_code == 409
            error = refused.json()["error"]
            assert error["type"] == "reload_failed"
            assert str(root / "handwritten" / file.name) in error["message"] and message in error["message"]
            assert httpx.post(url + "/predict", json=BODY).json() == before


@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_refuses_to_start(key):
    """Set but empty: locking everyone out, or letting everyone in? Neither: it says so and stops."""
    done = start_and_fail("--model-dir", str(MODELS / "handwritten"), env={"DBF_API_KEY": key})
    assert done.returncode != 0
    assert "DBF_API_KEY: Value error, set but empty" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        ([], {"DBF_API_KEYS": "s3cret"}, "DBF_API_KEYS (did you mean DBF_API_KEY?): not a setting"),
        ([], {"DBF_GRPCPORT": "0"}, "DBF_GRPCPORT (did you mean DBF_GRPC_PORT?): not a setting"),
        (["--port", "70000"], {}, "argument --port: '70000' is not a port (1 to 65535)"),
        (["--grpc-port", "-1"], {}, "argument --grpc-port: '-1' is not a port (0 to 65535)"),
        ([], {"DBF_PORT": "0"}, "DBF_PORT: Input should be greater than or equal to 1"),
        ([], {"DBF_LOG_LEVEL": "bogus"}, "DBF_LOG_LEVEL: Input should be 'debug', 'info'"),
        ([], {"DBF_BATCH_MAX_DELAY_MS": "inf"}, "DBF_BATCH_MAX_DELAY_MS: Input should be less than or equal"),
        ([], {"DBF_GRPC_BATCH_DELAY_MS": "1e30"}, "DBF_GRPC_BATCH_DELAY_MS: Input should be less than"),
        ([], {"DBF_MODEL_DIR": ""}, "DBF_MODEL_DIR: Value error, set but empty"),
        (["--model-dir", ""], {}, "argument --model-dir: '' is empty: give the model repository's path"),
        (["--model-dir", " "], {}, "argument --model-dir: ' ' is empty: give the model repository's path"),
        ([], {"DBF_WORKERS": "0"}, "DBF_WORKERS: Input should be greater than or equal to 1"),
        ([], {"DBF_API_KEY": "clé"}, "DBF_API_KEY: Value error, holds a character that is not printable"),
        ([], {"DBF_API_KEY": "first\nsecond"}, "DBF_API_KEY: Value error, holds a character that is not"),
    ],
    ids=["key-typo", "port-typo", "port-range", "grpc-port-range", "port-zero", "log-level", "delay",
         "grpc-delay", "empty-model-dir", "empty-model-dir-flag", "blank-model-dir-flag", "workers",
         "key-not-ascii", "key-of-two-lines"],
)  # fmt: skip
def test_a_setting_mistyped_or_out_of_range_refuses_to_start_naming_it(args, env, said):
    """A probe of the settings: a typo of DBF_API_KEY started the service with the API open; DBF_GRPCPORT
    left gRPC on; --port 70000 listened on 4464, DBF_PORT=0 on a port the kernel chose; --model-dir '' looked
    for models in the working directory, --model-dir ' ' ended in a traceback; an unknown log level, or an
    unbounded batch wait (every request then hung), ended in a traceback or not at all; a key of 'clé'
    served, answering 401 to the key sent by curl (UTF-8 read as Latin-1) and INTERNAL to gRPC's clients
    (which refuse to send it). Each now stops before anything starts."""
    done = start_and_fail("--model-dir", str(MODELS / "handwritten"), *args, env=env)
    assert done.returncode != 0
    assert said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        ([], {"DBF_HOST": ""}, "DBF_HOST: Value error, set but empty"),
        (["--host", ""], {}, "--host '' (or DBF_HOST): empty"),
        (["--host", "[::1]"], {}, "--host '[::1]' (or DBF_HOST): not an address to listen on"),
        ([], {"DBF_HOST": "host.invalid"}, "--host 'host.invalid' (or DBF_HOST): not an address to listen"),
    ],
    ids=["empty-variable", "empty-flag", "bracketed", "unresolvable"],
)  # fmt: skip
def test_an_empty_or_unresolvable_host_refuses_to_start_naming_it(args, env, said):
    """A probe of the settings: DBF_HOST= (a compose file's unset ${HOST}) served HTTP on every interface,
    with a warning about 'listening on  '; a host that does not resolve stopped the service after its models
    loaded, blaming DBF_GRPC_PORT ('cannot serve gRPC on port 8081'), or, with gRPC off, saying only
    '[Errno -2] Name or service not known'."""
    done = start_and_fail("--model-dir", str(MODELS / "handwritten"), "--grpc-port", "0", *args, env=env)
    assert done.returncode != 0
    assert said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_address_grpc_cannot_listen_on_is_named_with_its_host():
    """192.0.2.1 (TEST-NET-1) is no address of this machine: the error blamed the gRPC port alone."""
    grpc_port = free_port()
    done = start_and_fail(
        "--model-dir", str(MODELS / "handwritten"), "--host", "192.0.2.1", "--grpc-port", str(grpc_port)
    )
    assert done.returncode != 0
    assert f"cannot serve gRPC on 192.0.2.1 port {grpc_port} (DBF_HOST, DBF_GRPC_PORT" in done.stderr, (
        done.stderr
    )


def test_a_port_in_use_with_several_workers_is_named_with_its_setting():
    """With --workers 2 the port busy was said as '[Errno 98] Address already in use' alone: no address, no
    setting (one worker's uvicorn names the address)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        model = str(MODELS / "handwritten")
        done = start_and_fail("--model-dir", model, "--workers", "2", "--port", str(port), "--grpc-port", "0")
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1 port {port} (DBF_HOST, DBF_PORT" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_same_port_for_http_and_grpc_is_refused_up_front():
    """It was found only as 'address already in use', from whichever bound second."""
    done = subprocess.run(
        [sys.executable, "-m", "service", "--port", "18999", "--grpc-port", "18999"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--grpc-port 18999 is --port's too" in done.stderr


def test_a_manifest_larger_than_any_model_has_is_refused_unread(tmp_path):
    """A 1 GiB manifest.json took the loader to 9.5 GB (a 100 MiB one, during a reload, a running service
    from 125 MB to 1 GB): it is refused after its first 16 MiB, naming the file."""
    from service.repository import MAX_MANIFEST_BYTES, ModelLoadError, read_manifest

    manifest = tmp_path / "manifest.json"
    with manifest.open("wb") as out:
        out.write(b'{"views": [' + b" " * MAX_MANIFEST_BYTES + b"]}")
    with pytest.raises(ModelLoadError, match=f"{manifest}: manifest of more than 16,777,216 bytes"):
        read_manifest(manifest)


def set_class_name_of_a_megabyte(m: dict) -> None:
    m["classes"][3] = "3" * 1_000_000


def set_model_name_of_a_megabyte(m: dict) -> None:
    m["name"] = "n" * 1_000_000


LONG_NAMES = {
    # Before, it loaded: every answer carried the name once per sample, so a 60 kB request of 200 samples
    # of scene15 (class names of a megabyte) was answered 200 MB, and one of 1024 samples would be 1 GB,
    # none of which DBF_MAX_ANSWER_VALUES counts.
    "class name": (set_class_name_of_a_megabyte, "classes.3\n  String should have at most 1024 characters"),
    # Before, it loaded, under a name no URL can carry (past the 32 KiB request line): unreachable.
    "model name": (set_model_name_of_a_megabyte, "name\n  String should have at most 250 characters"),
}


@pytest.mark.parametrize("case", sorted(LONG_NAMES))
def test_a_name_longer_than_an_answer_or_a_url_takes_stops_the_service(tmp_path, case):
    change, message = LONG_NAMES[case]
    shutil.copytree(MODELS / "handwritten", tmp_path / "handwritten")
    file = with_manifest(tmp_path / "handwritten", change)
    done = start_and_fail("--model-dir", str(tmp_path / "handwritten"))
    assert done.returncode != 0
    assert f"{file}: invalid manifest" in done.stderr and message in done.stderr, done.stderr[-2000:]
