"""A peer of :mod:`benchmarks.peers`: dbf-serve's heads and fusion (:mod:`benchmarks.peer_model`) served by
KServe's Python model server (REST and gRPC), as a custom ``kserve.Model``, written the way KServe's
documentation writes one (inputs and outputs through its ``InferRequest`` and ``InferResponse``).

    python -m benchmarks.kserve_runtime --model-dir DIR --http_port P --grpc_port G [--workers N]

(the ports and ``--workers``, its REST processes, are KServe's own options; it parses the command line
itself). Runs in this repository's
environment: kserve is a dev dependency.
"""

from __future__ import annotations

import argparse
import json
import logging.config
from pathlib import Path
from typing import Any

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.utils import generate_uuid

from benchmarks.peer_model import PeerModel

# KServe's own logging configuration logs every REST request at INFO three times over (uvicorn's access
# line, its timing middleware's wall and CPU lines, which --enable_latency_logging leaves on) and every gRPC
# call once (its logging interceptor); dbf-serve runs at --log-level warning beside it (benchmarks.peers).
# Set at import, before KServe configures anything (it then keeps a configuration it finds), so that it holds
# in every process: KServe's REST worker processes (--workers) import this module first, and one it starts
# again after a missed heartbeat is given no --log_config_file (kserve 0.21), so took KServe's INFO levels.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
    "loggers": {
        name: {"handlers": ["stderr"], "level": "WARNING", "propagate": False}
        for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access")
    },
}
logging.config.dictConfig(LOGGING)

_DATATYPES = {"float32": "FP32", "int64": "INT64", "bool": "BOOL"}


class DBFModel(Model):
    def __init__(self, name: str, directory: Path) -> None:
        super().__init__(name)
        self.directory = directory
        self.model = PeerModel(directory)
        self.ready = True

    # With --workers N KServe pickles its models into each REST process: their sessions cannot be, so each
    # process loads the heads again.
    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "model"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.model = PeerModel(self.directory)

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None, **_: Any
    ) -> InferResponse:
        given = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        outputs = []
        for name, array in self.model.predict(given).items():
            output = InferOutput(name, list(array.shape), _DATATYPES[array.dtype.name])
            output.set_data_from_numpy(array, binary_data=payload.from_grpc)
            outputs.append(output)
        # A request without an id (wrk's) gets one, as KServe's documented custom model does: its REST
        # front end refuses an answer without (a 500 for every request before).
        response_id = payload.id or generate_uuid()
        return InferResponse(response_id, self.name, outputs, from_grpc=payload.from_grpc)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, required=True)
    args, _ = parser.parse_known_args()
    name = json.loads((args.model_dir / "manifest.json").read_text())["name"]
    ModelServer().start([DBFModel(name, args.model_dir)])  # --workers from the command line, default 1
