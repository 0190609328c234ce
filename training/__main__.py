"""``python -m training <command>``: the training package's command line.

``python -m training download [--data-dir DIR] [--dataset NAME ...] [--mirror URL]``

``python -m training experiment --dataset NAME[,NAME] --methods dbf,gbaf --seeds 0,1 --out DIR
[--data-dir DIR] [--protocol heldout|paper] [--lambda L[,L]] [--epochs E] [--activation exp,softplus|paper]
[--workers W]``

``python -m training summarise DIR [DIR ...]``
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
    import time

    from training.experiment import RunSpec, paper_activation, run_grid, write_results

    specs = [
        RunSpec(
            dataset=dataset,
            method=method,
            seed=seed,
            protocol=args.protocol,
            lam=lam,
            activation=paper_activation(method) if activation == "paper" else activation,
            epochs=args.epochs,
            hidden=args.hidden,
        )
        for dataset in args.dataset
        for method in args.methods
        for lam in args.lambdas
        for activation in args.activation
        for seed in args.seeds
    ]
    started = time.perf_counter()
    results = run_grid(specs, args.data_dir, workers=args.workers)
    wall = time.perf_counter() - started
    for r in results:
        print(
            f"{r['dataset']:>12} {r['method']:>5} {r['activation']:>8} seed {r['seed']:>2}: "
            f"acc {r['acc_normal']:.3f} conflict {r['acc_conflict']:.3f} auc {r['auc']:.3f} "
            f"({r['seconds']:.1f} s)"
        )
    print(f"{len(results)} runs in {wall / 60:.1f} min with {args.workers} workers")
    print(f"wrote {write_results(results, args.out, wall_seconds=wall)}")
    return 0


def _summarise(args: argparse.Namespace) -> int:
    import json

    from training.experiment import summary_markdown

    results = []
    for directory in args.dirs:
        try:
            results += json.loads((directory / "results.json").read_text())["results"]
        except (OSError, ValueError, KeyError) as error:
            print(f"error: {directory / 'results.json'}: {error}", file=sys.stderr)
            return 1
    sys.stdout.write(summary_markdown(results))
    return 0


def _export(args: argparse.Namespace) -> int:
    from training.export import export
    from training.train import PAPER_HYPERPARAMETERS, TrainConfig

    config = TrainConfig(
        method=args.method,
        lam=args.lam,
        epochs=args.epochs,
        hyperparameters=PAPER_HYPERPARAMETERS[args.dataset],
        seed=args.seed,
    )
    manifest = export(
        args.dataset,
        args.out,
        data_dir=args.data_dir,
        method=args.method,
        lam=args.lam,
        config=config,
        seed=args.seed,
        target_false_positive_rate=args.target_fpr,
    )
    m, flag = manifest.metrics, manifest.conflict_flag
    print(
        f"wrote {args.out}: accuracy {m.acc_normal:.3f} clean, {m.acc_conflict:.3f} conflictive, "
        f"{m.acc_all_samples:.3f} all samples; AUROC {m.auc:.3f}; "
        f"flag on {flag.score} >= {flag.threshold:.4f} "
        f"(test: {flag.test.clean:.3f} clean, {flag.test.conflictive:.3f} conflictive)"
    )
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
    grid.add_argument(
        "--lambda",
        dest="lambdas",
        type=lambda s: [float(x) for x in _names(s)],
        default=[1.0],
        help="comma-separated DBF strictness values (several: a sweep, plotted as lambda_sweep.png)",
    )
    grid.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    grid.add_argument(
        "--activation",
        type=_names,
        default=["exp"],
        help="comma-separated: exp,softplus, or paper (the paper's Table 3: exp for DBF, softplus otherwise)",
    )
    grid.add_argument("--hidden", type=lambda s: tuple(int(x) for x in _names(s)), default=())
    grid.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    grid.set_defaults(run=_experiment)

    summary = commands.add_parser(
        "summarise", help="print the tables of one or more experiment outputs together (rows by setting)"
    )
    summary.add_argument("dirs", type=Path, nargs="+", help="directories holding results.json")
    summary.set_defaults(run=_summarise)

    out = commands.add_parser(
        "export", help="train with the default settings and write an ONNX model repository entry"
    )
    out.add_argument("--dataset", required=True, choices=sorted(data.DATASETS))
    out.add_argument("--out", type=Path, required=True, help="the model's directory, e.g. models/handwritten")
    out.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", "data")))
    out.add_argument("--method", default="dbf", choices=["bcf", "cbf", "baf", "gbaf", "dbf"])
    out.add_argument("--lambda", dest="lam", type=float, default=1.0)
    out.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    out.add_argument("--seed", type=int, default=0)
    out.add_argument("--target-fpr", type=float, default=0.05, help="flag rate on clean validation samples")
    out.set_defaults(run=_export)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
