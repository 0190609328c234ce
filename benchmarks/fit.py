"""Fit a large synthetic Parquet dataset as ``python -m training fit`` does; print samples/s and peak memory.

The data: ``--samples`` samples (200,000), three views of ``--dims`` features (1024, 300, 64: an image
embedding, a text embedding, sensor statistics), ``--classes`` classes (10), written as fixed-size float32
list columns and a string label column. The fit runs in a child process, as the command would: read and
validate (:func:`training.readers.load`), then :func:`training.fit.fit` with the command's defaults, the
data scaled in place, the model card written, for a fixed number of ``--epochs`` (no early stopping).

Yardstick for memory: the data's float32 size (the bound: peak RSS under 2x), and a child that only reads
the file the plain way, ``pyarrow.parquet.read_table`` and each column to a float32 matrix. Prints the
read time, each epoch's time and training samples per second, the other phases, and peak RSS of both
children with their ratios to the data. Asserts nothing.

    python -m benchmarks.fit [--samples 200000] [--dims 1024,300,64] [--epochs 3] [--dir /tmp/dbf-fit-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHUNK = 10_000  # rows generated and written at a time


def write_dataset(path: Path, *, samples: int, dims: list[int], classes: int, seed: int = 0) -> None:
    """Views that separate the classes (class means 1 apart per feature on average, unit noise)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    means = [rng.normal(size=(classes, d)).astype(np.float32) for d in dims]
    names = [f"view_{v}" for v in range(len(dims))]
    schema = pa.schema(
        [pa.field(name, pa.list_(pa.float32(), d)) for name, d in zip(names, dims, strict=True)]
        + [pa.field("label", pa.string())]
    )
    class_names = np.array([f"class_{k:02d}" for k in range(classes)])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, samples, CHUNK):
            n = min(CHUNK, samples - start)
            labels = rng.integers(classes, size=n)
            columns = [
                pa.FixedSizeListArray.from_arrays(
                    (mean[labels] + rng.normal(size=(n, mean.shape[1])).astype(np.float32)).reshape(-1), d
                )
                for mean, d in zip(means, dims, strict=True)
            ]
            writer.write_batch(pa.record_batch([*columns, pa.array(class_names[labels])], schema=schema))


def fit_child(path: str, out: str, epochs: int) -> None:
    """What ``python -m training fit --data PATH --out OUT --epochs E --patience 0 --quiet`` runs."""
    from training.architecture import OUTVOTED_BETA
    from training.fit import fit
    from training.progress import ProgressLines
    from training.readers import load
    from training.registry import DEFAULT_HYPERPARAMETERS
    from training.train import TrainConfig

    started = time.perf_counter()
    data = load(path)
    read = time.perf_counter() - started
    _, report = fit(
        data,
        out,
        config=TrainConfig(epochs=epochs, hyperparameters=DEFAULT_HYPERPARAMETERS),
        outvoted_beta=OUTVOTED_BETA,  # the check on held-out evidence, as the command runs it
        card=True,
        progress=ProgressLines(epochs, every=1),
        in_place=True,
    )
    _answer(
        {
            "read": read,
            "epoch_seconds": report.history.epoch_seconds,
            "train_samples": len(report.sets.train),
            "seconds": report.seconds,
            "accuracy": report.metrics.acc_normal,
        }
    )


def read_child(path: str) -> None:
    """The yardstick: the file read the plain way, each view column to a float32 matrix."""
    import pyarrow.parquet as pq

    started = time.perf_counter()
    table = pq.read_table(path)
    matrices = {}
    for name in table.column_names:
        if name == "label":
            continue
        column = table.column(name).combine_chunks()
        matrices[name] = column.flatten().to_numpy().reshape(len(column), -1).astype(np.float32)
    _answer({"read": time.perf_counter() - started, "matrices": len(matrices)})


def _run(command: list[str]) -> dict:
    """Run a child; its JSON answer."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _answer(fields: dict) -> None:
    """Print a child's answer with its peak resident set (bytes; Linux reports kilobytes)."""
    fields["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(fields))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--dims", default="1024,300,64")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/dbf-fit-bench"))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "fit":
            fit_child(rest[0], rest[1], int(rest[2]))
        else:
            read_child(rest[0])
        return

    dims = [int(d) for d in args.dims.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"synthetic-{args.samples}-{'-'.join(map(str, dims))}.parquet"
    if not path.exists():
        started = time.perf_counter()
        write_dataset(path, samples=args.samples, dims=dims, classes=args.classes)
        print(f"# wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s")
    data_bytes = args.samples * sum(dims) * 4
    me = [sys.executable, "-m", "benchmarks.fit", "--child"]
    fitted = _run([*me, "fit", str(path), str(args.dir / "model"), str(args.epochs)])
    plain = _run([*me, "read", str(path)])

    print(
        f"# fit benchmark: {args.samples} samples, views {'/'.join(map(str, dims))}, {args.classes} classes, "
        f"float32 data {data_bytes / 1e9:.2f} GB; {args.epochs} epochs of {fitted['train_samples']} training "
        f"samples, batch 200, 1 torch thread, {os.cpu_count()} cores"
    )
    print(f"read and validate      {fitted['read']:8.1f} s")
    for epoch, seconds in enumerate(fitted["epoch_seconds"], 1):
        rate = fitted["train_samples"] / seconds
        print(f"epoch {epoch:<16} {seconds:8.1f} s   {rate:9.0f} samples/s")
    for phase, seconds in fitted["seconds"].items():
        if phase != "training":
            print(f"{phase:<22} {seconds:8.1f} s")
    print(f"clean test accuracy    {fitted['accuracy']:8.3f}")
    for what, child in (("fit", fitted), ("plain read (yardstick)", plain)):
        peak = child["peak_rss"]
        print(f"peak RSS, {what:<23} {peak / 1e9:5.2f} GB   {peak / data_bytes:.2f}x the data (bound: 2x)")
    ratio = fitted["read"] / plain["read"]
    print(f"read, plain (yardstick) {plain['read']:7.1f} s   ours (with the checks) {ratio:.2f}x its time")


if __name__ == "__main__":
    main()
