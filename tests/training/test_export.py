"""ONNX export: graphs that reproduce the torch heads, calibrated flags, atomic and deterministic writes."""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import scipy.stats
import torch

from fusion import Opinion, opinion_from_evidence
from manifest import Manifest
from training import export as exporting
from training.calibrate import FusedSplit, calibrate_flag, view_agreement
from training.export import ParityError, check_parity, head_to_onnx, range_excess_session
from training.fit import export
from training.heads import ViewHead
from training.registry import DATASETS
from training.train import TrainConfig


def _raw_and_scaled(rng, n=64, dim=7):
    raw = rng.normal(3.0, 5.0, size=(n, dim)).astype(np.float32)
    raw[:, 2] = 4.0  # a constant feature: the scaler maps it to 0
    low, high = raw.min(0), raw.max(0)
    span = high - low
    scaled = np.where(span > 0, (raw - low) / np.where(span > 0, span, 1), 0).astype(np.float32)
    return raw, scaled, low, high


@pytest.mark.parametrize("activation", ["exp", "softplus"])
@pytest.mark.parametrize("hidden", [(), (8, 5)])
def test_graph_reproduces_the_head_on_raw_features(activation, hidden):
    rng = np.random.default_rng(0)
    raw, scaled, low, high = _raw_and_scaled(rng)
    torch.manual_seed(0)
    head = ViewHead(7, 4, hidden=hidden, activation=activation).eval()
    with torch.no_grad():  # large weights: evidence across the capped exponential's range
        for p in head.parameters():
            p.mul_(20)
    graph = head_to_onnx(head, low, high, view="v").SerializeToString()
    assert check_parity(graph, head, raw, scaled, view="v") <= 1e-4
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    [inp], [out, excess] = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("features", "tensor(float)", ["batch", 7])
    assert (out.name, out.shape) == ("evidence", ["batch", 4])
    assert (excess.name, excess.type, excess.shape) == ("range_excess", "tensor(float)", ["batch"])
    for n in (1, 37):  # dynamic batch axis
        assert [a.shape for a in session.run(None, {"features": raw[:n]})] == [(n, 4), (n,)]


def _range_excess(raw: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The rule, in float64: the root mean square over the varying features of each one's distance outside
    [low, high] in units of high - low."""
    raw, low, high = (np.asarray(a, np.float64) for a in (raw, low, high))
    varying = high > low
    span = (high - low)[varying]
    outside = (
        np.maximum(np.maximum(low[varying] - raw[:, varying], raw[:, varying] - high[varying]), 0) / span
    )
    return np.sqrt(np.mean(outside**2, axis=1))


def test_range_excess_is_the_root_mean_square_distance_outside_the_training_range():
    """The graph's second output, and the range-excess graph alone (which fit judges its held-out splits
    with), against the rule computed directly, on samples inside the range (0), just outside, far outside,
    and on constant features (which never count, whatever they are sent)."""
    rng = np.random.default_rng(3)
    raw, _, low, high = _raw_and_scaled(rng, n=200, dim=9)  # feature 2 is constant
    graph = head_to_onnx(ViewHead(9, 3), low, high, view="v").SerializeToString()
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    span = high - low
    samples = np.concatenate(
        [
            raw,  # the training data itself: inside
            low + rng.uniform(-0.5, 1.5, size=(200, 9)) * span,  # up to half a span out
            low + rng.uniform(-1e4, 1e4, size=(200, 9)) * span,  # far out
            np.where(np.arange(9) == 2, 1e30, raw[:200]),  # only the constant feature, far out
        ]
    ).astype(np.float32)
    [got] = session.run(["range_excess"], {"features": samples})
    expected = _range_excess(samples, low, high)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    [measured] = range_excess_session(low, high).run(["range_excess"], {"features": samples})
    np.testing.assert_array_equal(measured, got)  # to the bit: fit judges its held-out views with it
    assert (got[:200] == 0).all() and (got[600:] == 0).all()
    assert (got[200:400] > 0).mean() > 0.9 and (got[400:600] > 1000).all()


def test_parity_failure_is_refused():
    rng = np.random.default_rng(1)
    raw, scaled, low, high = _raw_and_scaled(rng)
    head, other = ViewHead(7, 4), ViewHead(7, 4)
    graph = head_to_onnx(other, low, high, view="pix").SerializeToString()
    with pytest.raises(ParityError, match="view pix: ONNX evidence differs"):
        check_parity(graph, head, raw, scaled, view="pix")


def test_flag_calibration_picks_the_better_score_and_meets_the_target_rate():
    rng = np.random.default_rng(2)
    clean = {"uncertainty": rng.random(1000), "max_conflict": rng.random(1000) * 0.5}
    conflictive = {"uncertainty": rng.random(1000), "max_conflict": 0.4 + rng.random(1000) * 0.6}
    score, threshold, separation = calibrate_flag(clean, conflictive, target_false_positive_rate=0.05)
    assert score == "max_conflict"
    assert separation["max_conflict"] > 0.9 > separation["uncertainty"]
    assert np.mean(clean[score] >= threshold) == pytest.approx(0.05, abs=0.002)


def test_the_flag_keeps_the_score_that_flags_more_conflictive_samples_at_its_threshold():
    # Fused uncertainty shifts every conflictive sample a little, the largest conflict some of them far: the
    # first separates them better over all thresholds, the second flags more at the one served.
    rng = np.random.default_rng(3)
    n = 20_000
    clean = {"uncertainty": rng.random(n), "max_conflict": rng.random(n)}
    far = rng.random(n) < 0.4
    conflictive = {
        "uncertainty": 0.3 + rng.random(n),
        "max_conflict": np.where(far, 2 + rng.random(n), rng.random(n)),
    }
    score, threshold, separation = calibrate_flag(clean, conflictive, target_false_positive_rate=0.05)
    assert separation["uncertainty"] > separation["max_conflict"]
    assert score == "max_conflict"
    assert np.mean(conflictive[score] >= threshold) == pytest.approx(0.43, abs=0.01)
    assert np.mean(clean[score] >= threshold) == pytest.approx(0.05, abs=0.002)


def test_view_agreement_counts_each_view_against_the_other_views_fused_where_every_view_is():
    # Five samples, three views, three classes; each view has evidence for its top class alone: a 9, b 6,
    # c 3, so the others' sum never ties. Views' top classes (columns a, b, c; - absent) and, per view, the
    # top class of the others summed (x: not compared):
    #   0: 0 0 1 -> a: 0 (b 6, c 3)   b: 0 (a 9, c 3)   c: 0 (a 9, b 6)   agree: a b -
    #   1: 1 2 1 -> a: 2 (b 6, c 3)   b: 1 (a 9, c 3)   c: 1 (a 9, b 6)   agree: - - c
    #   2: 2 2 2 -> 2 for each                                         agree: a b c
    #   3: 0 - 0 -> a: 0 (c)          b: x              c: 0 (a)          agree: a c
    #   4: 1 - - -> a alone: x
    # The fused opinion plays no part (it is given as 0, 1, 2, 1, 1; view a would agree with it in 0-2).
    top = np.array([[0, 0, 1], [1, 2, 1], [2, 2, 2], [0, 0, 0], [1, 0, 0]])
    present = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 1], [1, 0, 0]], bool)
    evidence = np.eye(3)[top] * np.array([9.0, 6.0, 3.0])[:, None]
    fused_top = np.array([0, 1, 2, 1, 1])
    fused = Opinion(np.eye(3)[fused_top] * 0.5, np.full(5, 0.5))
    split = FusedSplit(fused, fused_top, views=opinion_from_evidence(evidence), present=present)
    test = FusedSplit(fused, fused_top, views=opinion_from_evidence(evidence), present=None)

    rates = view_agreement(split, ["a", "b", "c"], test=test)

    # Only samples 0-2 have every view: the service compares only such samples, a view beside fewer others
    # agreeing at another rate (sample 3's a and c agree, and would have counted for them).
    # a: agrees in 0 and 2. Chance: its tops 0, 1, 2 (1/3 each) against the others' 0, 2, 2 (1/3, 0, 2/3).
    assert (rates["a"].clean, rates["a"].samples) == (2 / 3, 3)
    assert rates["a"].chance == pytest.approx((1 / 3) * (1 / 3) + (1 / 3) * 0 + (1 / 3) * (2 / 3))  # 1/3
    # The alert starts from the low end of the clean rate's 95% Clopper-Pearson interval: 2 of 3.
    assert rates["a"].clean_low == pytest.approx(scipy.stats.beta.ppf(0.025, 2, 3 - 2 + 1))
    assert rates["a"].alert_below == pytest.approx((rates["a"].clean_low + 1 / 3) / 2)
    # b: agrees in 0 and 2; tops 0, 2, 2 (1/3, 0, 2/3) against the others' 0, 1, 2 (1/3 each).
    assert (rates["b"].clean, rates["b"].samples) == (2 / 3, 3)
    assert rates["b"].chance == pytest.approx((1 / 3) * (1 / 3) + (2 / 3) * (1 / 3))
    # c: agrees in 1 and 2; tops 1, 1, 2 (0, 2/3, 1/3) against the others' 0, 1, 2 (1/3 each): chance 1/3.
    assert (rates["c"].clean, rates["c"].samples) == (2 / 3, 3)
    assert rates["c"].chance == pytest.approx(0 * (1 / 3) + (2 / 3) * (1 / 3) + (1 / 3) * (1 / 3))
    # The test split has every view everywhere: all five samples count. Sample 3 (0 0 0) agrees in every
    # view; sample 4 (1 0 0) in none: a's others 0 (b 6, c 3), b's and c's 1 (a 9). Each view: 3 of 5.
    assert (rates["a"].test, rates["a"].test_samples) == (0.6, 5)
    assert (rates["b"].test, rates["c"].test) == (0.6, 0.6)


def test_view_agreement_is_none_where_no_sample_has_every_view():
    views = opinion_from_evidence(np.array([[[9.0, 0.0], [0.0, 0.0]]]))
    alone = FusedSplit(
        Opinion(views.belief[:, 0], views.uncertainty[:, 0]),
        np.array([0]),
        views=views,
        present=np.array([[True, False]]),
    )
    assert view_agreement(alone, ["a", "b"]) is None


def _quick(dataset: str) -> TrainConfig:
    return TrainConfig(epochs=5, hyperparameters=DATASETS[dataset].hyperparameters)


@pytest.mark.data
def test_export_writes_a_verified_deterministic_repository_entry(data_dir, tmp_path):
    manifest, _ = export("cub", tmp_path / "cub", data_dir=data_dir, config=_quick("cub"))
    on_disk = Manifest.model_validate_json((tmp_path / "cub" / "manifest.json").read_text())
    assert on_disk == manifest
    assert [v.name for v in manifest.views] == ["image", "text"]
    assert [v.dim for v in manifest.views] == [1024, 300]
    for view in manifest.views:
        assert hashlib.sha256((tmp_path / "cub" / view.file).read_bytes()).hexdigest() == view.sha256
    assert manifest.fusion.method == "dbf"
    assert manifest.conflict_flag.validation.clean <= 0.05 + 1 / 60  # 60 validation samples
    # Measured on the samples the flag was calibrated on (cub's 480 non-test ones, out of fold) and the test.
    fitted = manifest.calibration.fitted_on.samples
    assert {(v, r.samples, r.test_samples) for v, r in manifest.view_agreement.items()} == {
        ("image", fitted, 120),
        ("text", fitted, 120),
    }
    assert (manifest.calibration.fitted_on.kind, fitted) == ("cross-fitted", 480)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cub"]  # no staging left behind

    again, _ = export("cub", tmp_path / "again", data_dir=data_dir, config=_quick("cub"))
    for name in ("image.onnx", "text.onnx", "manifest.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "cub" / name).read_bytes()
    assert again == manifest


@pytest.mark.data
def test_failed_export_leaves_the_existing_model_untouched(data_dir, tmp_path, monkeypatch):
    export("cub", tmp_path / "cub", data_dir=data_dir, config=_quick("cub"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "cub").iterdir()}

    def broken(*args, view, **kwargs):
        raise ParityError(f"view {view}: ONNX evidence differs from torch by 1.00e+00 (> 0.0001)")

    monkeypatch.setattr(exporting, "check_parity", broken)
    with pytest.raises(ParityError, match="view image"):
        export("cub", tmp_path / "cub", data_dir=data_dir, config=_quick("cub"), seed=1)
    assert {p.name: p.read_bytes() for p in (tmp_path / "cub").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cub"]


MODELS = Path(__file__).resolve().parents[2] / "models"


def _file_size_limit(size: int) -> None:
    """In the child: writes past ``size`` bytes fail (EFBIG, as a full disk fails) instead of killing it."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.data
def test_view_agreement_write_that_fails_leaves_the_manifest_as_it_was(data_dir, tmp_path):
    """``view-agreement --write`` rewrites a served model's manifest. Written in place, a write that failed
    half-way (a full disk; here the file size limit just past the old manifest's size) left it truncated:
    8,192 of 10,825 bytes on a full tmpfs, a model that no longer loaded, and a service restarted then served
    no model at all."""
    model = tmp_path / "handwritten"
    shutil.copytree(MODELS / "handwritten", model)
    manifest = json.loads((model / "manifest.json").read_text())
    del manifest["view_agreement"]  # as exported before it existed: the measured section makes it grow
    (model / "manifest.json").write_text(json.dumps(manifest))
    before = {p.name: p.read_bytes() for p in model.iterdir()}

    command = [sys.executable, "-m", "training", "view-agreement", "--write", "--data-dir", str(data_dir)]
    size = len(before["manifest.json"]) + 100
    done = subprocess.run(
        [*command, str(model)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: _file_size_limit(size),
    )
    assert done.returncode == 1, done.stderr
    assert "manifest.json" in done.stderr
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before  # nothing left beside it either

    written = subprocess.run([*command, str(model)], capture_output=True, text=True, timeout=300)
    assert written.returncode == 0, written.stderr
    assert Manifest.model_validate_json((model / "manifest.json").read_text()).view_agreement is not None
    assert sorted(p.name for p in model.iterdir()) == sorted(before)
    assert (model / "manifest.json").stat().st_mode & 0o777 == 0o644  # readable by the service as before


def _tampered(tmp_path: Path, change) -> Path:
    """A copy of the committed CUB model whose manifest ``change`` edits (a dict, in place)."""
    model = tmp_path / "model"
    shutil.copytree(MODELS / "cub", model)
    manifest = json.loads((model / "manifest.json").read_text())
    change(manifest)
    (model / "manifest.json").write_text(json.dumps(manifest))
    return model


@pytest.mark.parametrize("command", ["calibration", "view-agreement"])
@pytest.mark.parametrize(
    ("change", "said"),
    [
        # A user's fit of a directory called pie: measured on the PIE benchmark, it ended in "error: 'image'".
        (lambda m: m.update(dataset="pie"), "views image, text are not the pie benchmark's"),
        (lambda m: m.update(dataset="mnist"), "'mnist' is no benchmark dataset"),
        (lambda m: m["training"].pop("seed"), "no seed of its split"),  # was "error: 'seed'"
        (lambda m: m["training"].update(seed="abc"), "no seed of its split"),
        (lambda m: m.update(views=m["views"][:1]), "manifest.json: not a model's manifest"),
    ],
    ids=["other-benchmark", "unknown", "no-seed", "text-seed", "invalid"],
)
def test_measuring_a_model_not_exported_from_a_benchmark_names_it(tmp_path, capsys, command, change, said):
    from training.__main__ import main

    model = _tampered(tmp_path, change)
    assert main([command, str(model), "--data-dir", str(tmp_path / "no-data")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {model}") and said in err and len(err.splitlines()) == 1, err


@pytest.mark.data
@pytest.mark.parametrize("command", ["calibration", "view-agreement"])
def test_a_head_that_is_not_the_one_its_manifest_names_is_refused(data_dir, tmp_path, capsys, command):
    """As the service refuses it: figures measured on other heads than the served ones are another model's."""
    from training.__main__ import main

    model = _tampered(tmp_path, lambda manifest: None)
    head = model / "image.onnx"
    graph = onnx.load(head)
    graph.doc_string = "another head"  # a graph that loads and answers, but not the bytes the model names
    onnx.save(graph, head)
    assert main([command, str(model), "--data-dir", str(data_dir)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {head}: not the head its manifest names (checksum mismatch)\n"
