"""A benchmark model of realistic size (issue 27): heads of embedding-sized views with hidden layers (by
default 3 views of 512, 1024 and 768 features, hidden layers of 1024 and 1024, 20 classes), fitted with
:func:`training.fit.fit` on synthetic data made here (nothing downloaded, nothing committed), so that
:mod:`benchmarks.service` loads the service with heads that cost what real ones do::

    python -m benchmarks.mlp_model /tmp/dbf-models/mlp [--samples 2000] [--epochs 2]
    python -m benchmarks.service --model-dir /tmp/dbf-models/mlp --cases v2-binary256,v2-binary1024

The committed models' heads are single linear layers of at most 1,324 features a sample: one sample's heads
are microseconds of work, so a benchmark on them measures the service around the heads, not the heads.
The weights are trained only for a few epochs: the answers are a classifier's (confident, some conflict),
their quality is not the point.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from training.data import synthetic
from training.fit import fit
from training.train import TrainConfig

DIMS = (512, 1024, 768)
HIDDEN = (1024, 1024)
CLASSES = 20


def make(
    out: Path,
    *,
    dims: tuple[int, ...] = DIMS,
    hidden: tuple[int, ...] = HIDDEN,
    classes: int = CLASSES,
    samples: int = 2000,
    epochs: int = 2,
    seed: int = 0,
) -> Path:
    """Fit the model on ``samples`` synthetic samples and write it to ``out`` (its name: ``out``'s)."""
    # Noise as large as the class means' spread: views that are informative but not trivially so.
    data = synthetic(samples, num_classes=classes, dims=dims, noise=1.0, seed=seed)
    fit(data, out, config=TrainConfig(hidden=hidden, epochs=epochs, seed=seed), seed=seed)
    return out


def _widths(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="the model's directory (its name is the model's)")
    parser.add_argument("--dims", type=_widths, default=DIMS, help="features per view, e.g. 512,1024,768")
    parser.add_argument("--hidden", type=_widths, default=HIDDEN, help="hidden widths, e.g. 1024,1024")
    parser.add_argument("--classes", type=int, default=CLASSES)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    make(
        args.out,
        dims=args.dims,
        hidden=args.hidden,
        classes=args.classes,
        samples=args.samples,
        epochs=args.epochs,
    )
    print(
        f"{args.out}: views {args.dims}, hidden {args.hidden}, {args.classes} classes, made in "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
