"""What the peers of :mod:`benchmarks.peers` compute, once for both: dbf-serve's heads and fusion in plain
numpy, onnxruntime and this repository's ``fusion`` and ``calibration`` packages (the same tensors dbf-serve
answers: a view out of its training range fused as missing, DBF, the calibrated flag, the calibrated
confidence and the conformal prediction set at the default coverage), with no server's types, so that
MLServer's runtime (:mod:`benchmarks.mlserver_runtime`) and KServe's (:mod:`benchmarks.kserve_runtime`) do
the same work and differ only in how they serve it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime

from calibration import ModelCalibration
from fusion import fuse, opinion_from_evidence


class PeerModel:
    """A model directory's heads, loaded as a peer's documentation would load them (one session per view,
    one thread each)."""

    def __init__(self, directory: Path) -> None:
        self.manifest = json.loads((directory / "manifest.json").read_text())
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        self.sessions = {
            view["name"]: onnxruntime.InferenceSession(
                str(directory / view["file"]), options, providers=["CPUExecutionProvider"]
            )
            for view in self.manifest["views"]
        }
        section = self.manifest["calibration"]
        self.calibration = ModelCalibration.from_parameters(
            confidence=section["confidence"],
            score=section["conformal"]["score"],
            calibration_scores=section["conformal"]["calibration_scores"],
            default_coverage=section["conformal"]["default_coverage"],
        )

    def predict(self, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The output tensors by name for ``given`` {view: (N, dim) float32} (views left out are missing)."""
        views = [view["name"] for view in self.manifest["views"]]
        n = len(next(iter(given.values())))
        k = len(self.manifest["classes"])
        evidence = np.zeros((n, len(views), k), np.float32)
        present = np.zeros((n, len(views)), bool)
        excess = np.zeros((n, len(views)), np.float32)
        for v, name in enumerate(views):
            if name in given:
                evidence[:, v], excess[:, v] = self.sessions[name].run(None, {"features": given[name]})
                present[:, v] = True
        out_of_range = ~(excess <= self.manifest["out_of_range"]["threshold"])
        evidence[out_of_range] = 0.0
        present &= ~out_of_range
        opinions = opinion_from_evidence(evidence)
        fusion = self.manifest["fusion"]
        fused = fuse(
            opinions, fusion["method"], lam=fusion["lambda"], mask=None if present.all() else present
        )
        flag = self.manifest["conflict_flag"]
        max_conflict = fused.conflict.max(axis=(-1, -2))
        score = fused.uncertainty if flag["score"] == "uncertainty" else max_conflict
        flagged = score >= flag["threshold"]
        # dbf-serve's rule: the view furthest out of range where any is, else the one in most conflict.
        furthest = np.where(out_of_range, excess, -1.0).argmax(-1)  # NaN (a NaN feature) counts as most
        blame = np.where(
            out_of_range.any(-1), furthest, np.where(present, fused.conflict.sum(-1), -1.0).argmax(-1)
        )
        return {
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
            "confidence": self.calibration.confidence(fused.belief, fused.uncertainty).astype(np.float32),
            "prediction_set": self.calibration.prediction_set(fused.probability),
            "out_of_range": out_of_range,
        }
