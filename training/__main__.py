"""``python -m training <command>``: the training package's command line.

``python -m training download [--data-dir DIR] [--dataset NAME ...] [--mirror URL]``

``python -m training experiment --dataset NAME[,NAME] --methods dbf,gbaf --seeds 0,1 --out DIR
[--data-dir DIR] [--protocol heldout|paper] [--lambda L] [--epochs E] [--activation exp,softplus]
[--workers W]``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from training import data


def _download(args: argparse.Namespace) -> int:
    names = args.dataset or [name for name, spec in data.DATASETS.items() if spec.downloadable]
    try:
        for path in data.download(names, args.data_dir, base_urls=args.mirror):
            print(f"ok  {path}")
    except (data.ChecksumError, data.DownloadError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _experiment(args: argparse.Namespace) -> int:
    from training.experiment import RunSpec, run_grid, write_results

    specs = [
        RunSpec(
            dataset=dataset,
            method=method,
            seed=seed,
            protocol=args.protocol,
            lam=args.lam,
            activation=activation,
            epochs=args.epochs,
            hidden=args.hidden,
        )
        for dataset in args.dataset
        for method in args.methods
        for activation in args.activation
        for seed in args.seeds
    ]
    results = run_grid(specs, args.data_dir, workers=args.workers)
    for r in results:
        print(
            f"{r['dataset']:>12} {r['method']:>5} {r['activation']:>8} seed {r['seed']:>2}: "
            f"acc {r['acc_normal']:.3f} conflict {r['acc_conflict']:.3f} auc {r['auc']:.3f} "
            f"({r['seconds']:.1f} s)"
        )
    print(f"wrote {write_results(results, args.out)}")
    return 0


def _names(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "download", help="fetch the benchmark datasets from their public sources and verify their SHA-256"
    )
    fetch.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DBF_DATA_DIR", "data")),
        help="destination (default: $DBF_DATA_DIR or ./data)",
    )
    fetch.add_argument(
        "--dataset",
        action="append",
        choices=sorted(data.DATASETS),
        help="one dataset (repeatable; default all)",
    )
    fetch.add_argument("--mirror", help="base URL to fetch every file from instead of its public source")
    fetch.set_defaults(run=_download)

    from training.experiment import DEFAULT_EPOCHS

    grid = commands.add_parser(
        "experiment", help="train and evaluate a grid of runs; write results and tables"
    )
    grid.add_argument("--dataset", type=_names, required=True, help="comma-separated dataset names")
    grid.add_argument("--methods", type=_names, default=["dbf"], help="comma-separated: bcf,cbf,baf,gbaf,dbf")
    grid.add_argument("--seeds", type=lambda s: [int(x) for x in _names(s)], default=[0])
    grid.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", "data")))
    grid.add_argument("--out", type=Path, required=True)
    grid.add_argument("--protocol", choices=["heldout", "paper"], default="heldout")
    grid.add_argument("--lambda", dest="lam", type=float, default=1.0)
    grid.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    grid.add_argument("--activation", type=_names, default=["exp"], help="comma-separated: exp,softplus")
    grid.add_argument("--hidden", type=lambda s: tuple(int(x) for x in _names(s)), default=())
    grid.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    grid.set_defaults(run=_experiment)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
