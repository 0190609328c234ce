"""The benchmark model maker writes a model the service serves, with the views, hidden layers and classes
asked for (small here: the default one takes half a minute to fit)."""

from __future__ import annotations

import onnx

from benchmarks.mlp_model import make
from service.repository import load_repository
from service.settings import Settings


def test_the_benchmark_model_has_the_shape_asked_for(tmp_path):
    out = make(tmp_path / "mlp", dims=(12, 20, 16), hidden=(32, 24), classes=5, samples=400, epochs=1)
    model = load_repository(Settings(model_dir=out)).get()
    assert model.name == "mlp" and len(model.manifest.classes) == 5
    views = [(view.name, view.dim) for view in model.manifest.views]
    assert views == [("view_0", 12), ("view_1", 20), ("view_2", 16)]
    for view in model.manifest.views:
        graph = onnx.load(str(out / view.file)).graph
        weights = {t.name: list(t.dims) for t in graph.initializer if t.name.startswith("weight")}
        assert weights == {"weight0": [view.dim, 32], "weight1": [32, 24], "weight2": [24, 5]}
