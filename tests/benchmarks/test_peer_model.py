"""The peers of ``benchmarks.peers`` do dbf-serve's job: for the same samples they compute every tensor
dbf-serve answers, equal to its own (else a ratio against them would compare different work)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.peer_model import PeerModel
from benchmarks.service import sample_features
from service import runtime
from service.inference import InferenceRequest
from service.outputs import TENSORS
from service.repository import load_repository
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", ["handwritten", "cub"])
def test_the_peer_model_computes_every_tensor_dbf_serve_answers(model):
    directory = ROOT / "models" / model
    features = sample_features(directory, 64)
    first = next(iter(features))
    features[first] = features[first].copy()
    features[first][:4] *= 1000.0  # far outside its training range: fused as missing by both
    served = load_repository(Settings(model_dir=directory.parent)).get(model)
    manifest = served.manifest
    result = runtime.predict(
        served,
        InferenceRequest(
            features, np.ones((64, len(manifest.views)), bool), manifest.fusion.method, manifest.fusion.lam
        ),
    )
    peer = PeerModel(directory).predict(features)
    assert result.out_of_range[:4, 0].all()
    assert set(peer) == set(TENSORS)
    for name, output in TENSORS.items():
        np.testing.assert_array_equal(peer[name], output.tensor.take(result), err_msg=name)


def test_kserves_peer_survives_the_pickling_its_worker_processes_need():
    """``benchmarks.peers --workers N`` runs KServe's REST front end in N processes, into which KServe
    pickles the model: its onnxruntime sessions could not be, and the server died at start."""
    import pickle

    from benchmarks.kserve_runtime import DBFModel

    directory = ROOT / "models" / "handwritten"
    features = sample_features(directory, 8)
    model = DBFModel("handwritten", directory)
    copy = pickle.loads(pickle.dumps(model))
    for name, tensor in model.model.predict(features).items():
        np.testing.assert_array_equal(copy.model.predict(features)[name], tensor, err_msg=name)
