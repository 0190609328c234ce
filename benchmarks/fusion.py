"""Time ``fuse(opinion_from_evidence(e), "dbf")`` against a straightforward Algorithm 1, in one run.

Yardstick: :func:`fusion.reference.dbf_from_evidence`, batched numpy that loops over every view pair as
Algorithm 1 is written. Goal (issue 2): at most 0.25x its time at every batch size. Prints a table of
best-of-N times and ratios; it asserts nothing.

    python -m benchmarks.fusion [--batch 1,64,256,4096,65536] [--views 6] [--classes 10] [--torch]
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: this folder would shadow the `fusion` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from fusion import fuse, opinion_from_evidence, reference


def best_time(fn, *, budget: float = 2.0, repeat: int = 5) -> float:
    """Best per-call seconds over ``repeat`` rounds, each round as many calls as fit in ~budget/repeat."""
    timer = timeit.Timer(fn)
    number, elapsed = timer.autorange()
    number = max(1, int(number * (budget / repeat) / max(elapsed, 1e-9)))
    return min(timer.repeat(repeat=repeat, number=number)) / number


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", default="1,64,256,4096,65536")
    parser.add_argument("--views", type=int, default=6)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lam", type=float, default=1.0)
    parser.add_argument("--torch", action="store_true", help="also time torch tensors (CPU) through fuse")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    print(f"# fusion benchmark: DBF, V={args.views}, K={args.classes}, {args.dtype}, lambda={args.lam}")
    print(f"# numpy {np.__version__}, python {platform.python_version()}, {platform.machine()}")
    header = f"{'B':>7} {'yardstick':>12} {'fuse(numpy)':>12} {'ratio':>7}"
    if args.torch:
        import torch

        torch.set_num_threads(1)  # compare like with like: numpy's elementwise loops are single-threaded
        header += f" {'fuse(torch)':>12} {'ratio':>7}"
    print(header)
    for batch in (int(b) for b in args.batch.split(",")):
        # Evidence as heads produce it: mostly small, some classes confident, some views in conflict.
        evidence = (rng.gamma(0.5, 4.0, size=(batch, args.views, args.classes)) ** 2).astype(args.dtype)
        ours, yardstick = fuse(opinion_from_evidence(evidence), "dbf", lam=args.lam), None
        expected = reference.dbf_from_evidence(evidence, lam=args.lam)
        np.testing.assert_allclose(ours.uncertainty, expected[1], rtol=1e-3, atol=1e-5)
        yardstick = best_time(lambda e=evidence: reference.dbf_from_evidence(e, lam=args.lam))
        numpy_time = best_time(lambda e=evidence: fuse(opinion_from_evidence(e), "dbf", lam=args.lam))
        line = f"{batch:>7} {yardstick * 1e6:>10.1f}us {numpy_time * 1e6:>10.1f}us"
        line += f" {numpy_time / yardstick:>7.3f}"
        if args.torch:
            tensor = torch.from_numpy(evidence)
            torch_time = best_time(lambda t=tensor: fuse(opinion_from_evidence(t), "dbf", lam=args.lam))
            line += f" {torch_time * 1e6:>10.1f}us {torch_time / yardstick:>7.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
