"""A peer of :mod:`benchmarks.peers`: dbf-serve's heads and fusion (:mod:`benchmarks.peer_model`) served by
MLServer, as a custom runtime, written the way MLServer's documentation writes one (inputs decoded by its
``NumpyCodec``, outputs encoded by it). Runs in MLServer's own environment (``benchmarks.peers`` makes it):
numpy, onnxruntime and this repository's ``fusion`` package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from benchmarks.peer_model import PeerModel


class DBFRuntime(MLModel):
    async def load(self) -> bool:
        self.model = PeerModel(Path(self.settings.parameters.uri))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        given = {tensor.name: NumpyCodec.decode_input(tensor).astype(np.float32) for tensor in payload.inputs}
        outputs = self.model.predict(given)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(name, array) for name, array in outputs.items()],
        )
