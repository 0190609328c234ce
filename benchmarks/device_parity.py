"""CUDA against the CPU: every committed model's answers on its own data, compared output by output.

Each model is loaded twice through the service's own repository, once with ``DBF_DEVICE=cpu`` and once with
``cuda`` (TF32 as ``DBF_CUDA_TF32`` says), and every sample of its benchmark dataset is answered by the
service's runtime in batches of ``--batch`` samples. Prints, per model, the largest absolute difference of
each numeric output and how many samples' label, flag or prediction set differ::

    python -m benchmarks.device_parity [--models handwritten,pie] [--batch 1024] [--data-dir DIR]

Needs a GPU and onnxruntime-gpu (exits 1 without them); the data as ``training`` reads it (``DBF_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime

from service import runtime
from service.inference import InferenceRequest
from service.repository import load_repository
from service.settings import Settings
from training.readers import read_registered

ROOT = Path(__file__).resolve().parents[1]
NUMERIC = ("probability", "belief", "uncertainty", "conflict", "discount", "confidence")
DISCRETE = ("label", "high_conflict", "prediction_set")


def answers(model_dir: Path, device: str, views: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """Every output of the model at ``model_dir`` for every sample, its heads on ``device``."""
    repository = load_repository(Settings(model_dir=model_dir, device=device, grpc_port=0))
    [model] = repository.models.values()
    n = len(next(iter(views.values())))
    parts: dict[str, list[np.ndarray]] = {name: [] for name in NUMERIC + DISCRETE}
    for start in range(0, n, batch):
        rows = slice(start, min(start + batch, n))
        features = {name: np.ascontiguousarray(matrix[rows]) for name, matrix in views.items()}
        present = np.ones((rows.stop - rows.start, len(views)), dtype=bool)
        fusion = model.manifest.fusion
        result = runtime.predict(model, InferenceRequest(features, present, fusion.method, fusion.lam))
        for name in parts:
            parts[name].append(np.asarray(getattr(result, name)))
    return {name: np.concatenate(values) for name, values in parts.items()}


def compare(model_dir: Path, data_dir: Path, batch: int) -> dict[str, float | int]:
    """Per output, the largest absolute CUDA - CPU difference (numeric) or the samples that differ."""
    data = read_registered(model_dir.name, data_dir)
    cpu, cuda = (answers(model_dir, device, data.views, batch) for device in ("cpu", "cuda"))
    row: dict[str, float | int] = {"samples": len(data.labels)}
    for name in NUMERIC:
        row[name] = float(np.nanmax(np.abs(cuda[name].astype(np.float64) - cpu[name])))
    for name in DISCRETE:
        differs = cuda[name] != cpu[name]
        row[name] = int(differs.reshape(len(differs), -1).any(-1).sum())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="handwritten,scene15,pie,cub")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", ROOT / "data")))
    args = parser.parse_args()
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        sys.exit("onnxruntime has no CUDA provider here: install onnxruntime-gpu on a machine with a GPU")
    tf32 = os.environ.get("DBF_CUDA_TF32", "false")
    print(f"onnxruntime {onnxruntime.__version__}, DBF_CUDA_TF32={tf32}, batches of {args.batch}")
    columns = ["model", "samples", *NUMERIC, *(f"{name} differs" for name in DISCRETE)]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for name in args.models.split(","):
        row = compare(ROOT / "models" / name, args.data_dir, args.batch)
        cells = [f"{row[n]:.2g}" for n in NUMERIC] + [str(row[n]) for n in DISCRETE]
        print(f"| {name} | {row['samples']} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
