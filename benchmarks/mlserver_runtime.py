"""The peer of :mod:`benchmarks.peers`: dbf-serve's heads and fusion served by MLServer, as a custom runtime,
written the way MLServer's documentation writes one (inputs decoded by its ``NumpyCodec``, outputs encoded
by it). It computes what dbf-serve answers per sample (the same tensors, DBF, the calibrated flag), so the
two servers do the same work and differ only in how they serve it. Runs in MLServer's own environment
(``benchmarks.peers`` makes it): numpy, onnxruntime and this repository's ``fusion`` package.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from fusion import fuse, opinion_from_evidence


class DBFRuntime(MLModel):
    async def load(self) -> bool:
        directory = Path(self.settings.parameters.uri)
        self.manifest = json.loads((directory / "manifest.json").read_text())
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        self.sessions = {
            view["name"]: onnxruntime.InferenceSession(
                str(directory / view["file"]), options, providers=["CPUExecutionProvider"]
            )
            for view in self.manifest["views"]
        }
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        views = [view["name"] for view in self.manifest["views"]]
        given = {tensor.name: NumpyCodec.decode_input(tensor).astype(np.float32) for tensor in payload.inputs}
        n = len(next(iter(given.values())))
        k = len(self.manifest["classes"])
        evidence = np.zeros((n, len(views), k), np.float32)
        present = np.zeros((n, len(views)), bool)
        for v, name in enumerate(views):
            if name in given:
                evidence[:, v] = self.sessions[name].run(["evidence"], {"features": given[name]})[0]
                present[:, v] = True
        opinions = opinion_from_evidence(evidence)
        fusion = self.manifest["fusion"]
        fused = fuse(
            opinions, fusion["method"], lam=fusion["lambda"], mask=None if present.all() else present
        )
        flag = self.manifest["conflict_flag"]
        max_conflict = fused.conflict.max(axis=(-1, -2))
        score = fused.uncertainty if flag["score"] == "uncertainty" else max_conflict
        flagged = score >= flag["threshold"]
        blame = np.where(present, fused.conflict.sum(-1), -1.0).argmax(-1)
        outputs = {
            "label": fused.probability.argmax(-1).astype(np.int64),
            "probability": fused.probability,
            "belief": fused.belief,
            "uncertainty": fused.uncertainty,
            "conflict": fused.conflict,
            "discount": fused.discount,
            "high_conflict": flagged,
            "blamed_view": np.where(flagged, blame, -1).astype(np.int64),
            "view_belief": opinions.belief,
            "view_uncertainty": opinions.uncertainty,
        }
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(name, array) for name, array in outputs.items()],
        )
