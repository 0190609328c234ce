"""``python -m training <command>``: the training package's command line.

``python -m training download [--data-dir DIR] [--dataset NAME ...] [--mirror URL]``

``python -m training experiment --dataset NAME[,NAME] --methods dbf,gbaf --seeds 0,1 --out DIR
[--data-dir DIR] [--protocol heldout|paper] [--lambda L[,L]] [--epochs E] [--activation exp,softplus|paper]
[--workers W]``

``python -m training summarise DIR [DIR ...]``

``python -m training calibration MODEL_DIR [MODEL_DIR ...] [--data-dir DIR]``

``python -m training view-agreement MODEL_DIR [MODEL_DIR ...] [--data-dir DIR] [--write] [--failures]``

``python -m training export --dataset NAME --out models/NAME [--data-dir DIR] [--epochs E] [--hidden W,W]
[--seed S]``

``python -m training fit --data PATH|NAME --out models/NAME [--views a,b,c] [--label-column C]
[--classes a,b,c] [--split-column C] [--epochs E] [--patience P] [--max-minutes M] [--hidden W,W]
[--seed S] [--lambda L] [--target-fpr F] [--quiet]``
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fusion import METHODS
from training.download import ChecksumError, DownloadError, download
from training.registry import DATASETS

# The modules of pyproject's `train` extra, which `make serve` (the service alone) does not install.
TRAIN_EXTRA = ("torch", "scipy", "tqdm", "matplotlib", "onnx", "pyarrow")


def _download(args: argparse.Namespace) -> int:
    names = args.dataset or [name for name, spec in DATASETS.items() if spec.downloadable]
    try:
        for path in download(names, args.data_dir, base_urls=args.mirror):
            print(f"ok  {path}")
    except (ChecksumError, DownloadError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _experiment(args: argparse.Namespace) -> int:
    import time

    from training.data import DataError
    from training.experiment import (
        ResultsDirError,
        RunSpec,
        check_results_dir,
        paper_activation,
        run_grid,
        write_results,
    )

    unknown = [name for name in args.dataset if name not in DATASETS and name != "synthetic"]
    if unknown:
        print(f"error: unknown dataset {unknown[0]!r}; known: {', '.join(DATASETS)}", file=sys.stderr)
        return 1
    try:
        check_results_dir(args.out)  # before the runs, which would be lost
    except ResultsDirError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
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
    try:
        results = run_grid(specs, args.data_dir, workers=args.workers)
    except (DataError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - started
    for r in results:
        spec, m = r.spec, r.evaluation
        print(
            f"{spec.dataset:>12} {spec.method:>5} {spec.activation:>8} seed {spec.seed:>2}: "
            f"acc {m.acc_normal:.3f} conflict {m.acc_conflict:.3f} auc {m.auc:.3f} "
            f"({r.seconds:.1f} s)"
        )
    processes = min(args.workers, len(specs))  # run_grid starts no more than one per run
    print(f"{len(results)} runs in {wall / 60:.1f} min with {processes} workers")
    try:
        print(f"wrote {write_results(results, args.out, wall_seconds=wall)}")
    except (ResultsDirError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _summarise(args: argparse.Namespace) -> int:
    from training.experiment import read_results, summary_markdown

    results = []
    for directory in args.dirs:
        try:
            results += read_results(directory / "results.json")
        except OSError as error:
            print(f"error: {directory / 'results.json'}: {error.strerror or error}", file=sys.stderr)
            return 1
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    sys.stdout.write(summary_markdown(results))
    return 0


def _calibration(args: argparse.Namespace) -> int:
    from training.calibration_tables import calibration_tables

    try:
        sys.stdout.write(calibration_tables(args.models, args.data_dir))
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _view_agreement(args: argparse.Namespace) -> int:
    from training.agreement_tables import failure_table, measured_agreement, write_agreement

    try:
        for directory in args.models:
            manifest = (write_agreement if args.write else measured_agreement)(directory, args.data_dir)
            for view, rates in (manifest.view_agreement or {}).items():
                print(
                    f"{manifest.name} {view}: clean {rates.clean:.3f} (low {rates.clean_low:.3f}) of "
                    f"{rates.samples}, chance "
                    f"{rates.chance:.3f}, test {rates.test:.3f} of {rates.test_samples}"
                )
        if args.failures:
            sys.stdout.write(failure_table(args.models, args.data_dir))
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    from training.data import DataError
    from training.fit import export
    from training.train import TrainConfig

    config = TrainConfig(
        method=args.method,
        lam=args.lam,
        epochs=args.epochs,
        hidden=args.hidden,
        hyperparameters=DATASETS[args.dataset].hyperparameters,
        seed=args.seed,
    )
    try:
        manifest, report = export(
            args.dataset,
            args.out,
            data_dir=args.data_dir,
            config=config,
            seed=args.seed,
            target_false_positive_rate=args.target_fpr,
        )
    except (DataError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(_summary(args.out, manifest, report))
    _warn(report)
    return 0


def _fit(args: argparse.Namespace) -> int:
    import time
    from dataclasses import replace

    from training.architecture import CANDIDATES, OUTVOTED_BETA
    from training.data import DataError
    from training.fit import fit
    from training.progress import Reporters
    from training.readers import load
    from training.registry import DEFAULT_HYPERPARAMETERS
    from training.train import Budget, TrainConfig, weighting_for

    started = time.perf_counter()
    try:
        data = load(
            args.data,
            args.data_dir,
            views=args.views,
            label_column=args.label_column,
            classes=args.classes,
            split_column=args.split_column,
        )
    except (DataError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    read = time.perf_counter() - started
    if not args.quiet:
        missing = {view: rate for view, rate in data.missing_rates().items() if rate}
        print(
            f"read {data.source}: {data.num_samples} samples, {len(data.views)} views "
            f"({', '.join(f'{v} {d}' for v, d in zip(data.view_names, data.view_dims, strict=True))}), "
            f"{data.num_classes} classes" + (f"; missing: {missing}" if missing else "") + f" ({read:.1f} s)",
            file=sys.stderr,
        )
    hyperparameters = data.spec.hyperparameters if data.spec is not None else DEFAULT_HYPERPARAMETERS
    config = TrainConfig(
        method=args.method,
        lam=args.lam,
        hyperparameters=hyperparameters,
        class_weighting=(
            weighting_for(data.labels, num_classes=data.num_classes)
            if args.class_weighting == "auto"
            else args.class_weighting
        ),
        seed=args.seed,
    )
    if args.beta is not None:
        config = replace(config, beta=args.beta)
    budget = Budget(epochs=args.epochs, patience=args.patience, seconds=args.max_minutes * 60)
    try:
        manifest, report = fit(
            data,
            args.out,
            config=config,
            seed=args.seed,
            target_false_positive_rate=args.target_fpr,
            budget=budget,
            hidden=CANDIDATES if args.hidden is None else [args.hidden],
            outvoted_beta=OUTVOTED_BETA if args.beta is None else None,
            card=True,
            progress=Reporters(quiet=args.quiet),
            in_place=True,  # the data was read for this fit alone: scaled where it lies, never held twice
        )
    except (DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    history = report.history
    stop = f", best {history.best_epoch}" + (", stopped early" if history.stopped_early else "")
    print(
        _summary(args.out, manifest, report)
        + f"\n{history.epochs} epochs{stop if report.early_stopping else ''}{_cut_short(history)} in "
        + f"{read + sum(report.seconds.values()):.0f} s; card: {Path(args.out) / 'card.md'}"
    )
    _warn(report)
    return 0


def _cut_short(history) -> str:
    """What the summary line says of a run that the epoch cap or the time limit ended."""
    limit = ("the time limit", "--max-minutes") if history.timed_out else ("the epoch cap", "--epochs")
    if history.still_improving:
        return f", stopped by {limit[0]} while the validation loss still improved (raise {limit[1]})"
    return f", stopped by {limit[0]}" if history.timed_out else ""


def _summary(out: Path, manifest, report) -> str:
    """The line a fit ends with: the card's summary in brief, each test rate with its 95% interval and the
    samples it rests on (a dozen test samples leave an accuracy of 1.000 as low as 0.735)."""
    m, flag, comparison = manifest.metrics, manifest.conflict_flag, report.comparison
    best, fitted_on = comparison.best_view, report.post_hoc.fitted_on
    clean, conflictive = report.post_hoc.raised(report.test)
    alone, plain = comparison.views[best].value, comparison.baseline.accuracy.value
    return (
        f"wrote {out}: accuracy {_with_interval(comparison.fused)} on {comparison.fused.total} clean test "
        f"samples (best view alone {alone:.3f}, {best}; all-views logistic regression {plain:.3f}), "
        f"{m.acc_conflict:.3f} conflictive, {m.acc_all_samples:.3f} over every sample, training ones too; "
        f"AUROC {m.auc:.3f}; "
        f"flag on {flag.score} >= {flag.threshold:.4g} (test: {_with_interval(clean)} clean, "
        f"{_with_interval(conflictive)} conflictive, of {_counts(clean.total, conflictive.total)}); "
        f"calibrated on {fitted_on.samples} "
        + ("validation samples" if fitted_on.kind == "validation" else f"samples, {fitted_on.kind}")
    )


def _counts(clean: int, conflictive: int) -> str:
    """How many clean test samples and conflictive copies (only samples with two views or more have one)."""
    return f"{clean} each" if clean == conflictive else f"{clean} and {conflictive}"


def _with_interval(rate) -> str:
    """``0.917 [0.615, 0.998]``: a :class:`training.metrics.Rate` and its 95% interval."""
    low, high = rate.interval
    return f"{rate.value:.3f} [{low:.3f}, {high:.3f}]"


def _hidden(text: str) -> tuple[int, ...]:
    """Hidden-layer widths from ``512,256``; ``0`` or ``linear``: none."""
    if text.strip() in ("0", "linear"):
        return ()
    try:
        widths = tuple(int(part) for part in _names(text))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive layer widths (e.g. 512,256), or 0 or linear; got {text!r}"
        )
    return widths


def _minutes(text: str) -> float:
    minutes = float(text)
    if not minutes > 0 or minutes == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of minutes, got {text!r}")
    return minutes


def _integer_from(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` (to ``high``, inclusive), or a message saying so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            wanted = f"from {low} to {high:,}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected an integer {wanted}, got {text!r}")
        return value

    return parse


_epochs = _integer_from(1)  # 0 epochs would write an untrained model
_workers = _integer_from(1)
_patience = _integer_from(0)
# 32 bits: a seed that torch's and numpy's generators, all seeded with it, take alike.
_seed = _integer_from(0, 2**32 - 1)


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _warn(report) -> None:
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _names(text: str) -> list[str]:
    # "cat, dog" as written in prose: else ' dog' is no class of the labels (nor a view), and its error
    # quoted the list as "(cat,  dog)", whose every name looked given.
    return [part.strip() for part in text.split(",") if part.strip()]


def _each(parse: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse type: comma-separated values, at least one, each as ``parse`` reads it (or its message)."""

    def parse_each(text: str) -> list:
        if not _names(text):  # a grid with no runs along one axis has none at all
            raise argparse.ArgumentTypeError(f"expected at least one comma-separated value, got {text!r}")
        return [parse(part) for part in _names(text)]

    return parse_each


def _one_of(known: Sequence[str], kind: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in known:
            raise argparse.ArgumentTypeError(f"unknown {kind} {text!r}; known: {', '.join(known)}")
        return text

    return parse


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return value


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the command is, so that it ends as Ctrl-C does: what it was writing cleaned
    up (a model is written whole or not at all), without a traceback."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def _without_train_extra(absent: ModuleNotFoundError) -> int:
    """A one-line error for a module of the `train` extra that is not installed (a traceback otherwise)."""
    module = (absent.name or "").split(".")[0]
    if module not in TRAIN_EXTRA:
        raise absent
    print(
        f"error: python -m training needs the `train` extra ({module} is not installed here; `make serve` "
        "installs the service alone): from the checkout, python -m pip install -c constraints.txt -e "
        "'.[train]' (or `make lint`, which adds the dev tools)",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    """Run a command; an interrupt (Ctrl-C, SIGTERM) ends it with a line saying so and 130 or 143."""
    import signal
    import threading

    try:  # the parser imports the commands' modules, torch's and scipy's among them
        parser = _parser()
    except ModuleNotFoundError as absent:
        return _without_train_extra(absent)
    args = parser.parse_args(argv)
    # matplotlib (the card's figures) and onnx (the export) are imported once the heads are trained: a fit
    # of many minutes would end in that error; imported first instead (a second at most).
    try:
        for module in TRAIN_EXTRA:
            importlib.import_module(module)
    except ModuleNotFoundError as absent:
        return _without_train_extra(absent)
    # Only the main thread may set a handler; elsewhere (a caller's thread) SIGTERM keeps its own.
    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if handled else None
    try:
        return args.run(args)
    except ModuleNotFoundError as absent:
        return _without_train_extra(absent)
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, _Terminated)
        out = getattr(args, "out", None)
        kept = f": {out} is as it was" if args.command in ("fit", "export") else ""
        print(f"error: {'terminated' if terminated else 'interrupted'}{kept}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    finally:
        if handled:
            signal.signal(signal.SIGTERM, previous)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_download,
        _add_experiment,
        _add_summarise,
        _add_calibration,
        _add_view_agreement,
        _add_export,
        _add_fit,
    ):
        add(commands)
    return parser


def _add_download(commands: argparse._SubParsersAction) -> None:
    """``download``: the benchmark datasets."""
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
        choices=sorted(DATASETS),
        help="one dataset (repeatable; default all)",
    )
    fetch.add_argument("--mirror", help="base URL to fetch every file from instead of its public source")
    fetch.set_defaults(run=_download)


def _add_experiment(commands: argparse._SubParsersAction) -> None:
    """``experiment``: a grid of runs on the benchmark datasets."""
    from training.experiment import DEFAULT_EPOCHS

    grid = commands.add_parser(
        "experiment", help="train and evaluate a grid of runs; write results and tables"
    )
    grid.add_argument("--dataset", type=_each(str), required=True, help="comma-separated dataset names")
    grid.add_argument(
        "--methods",
        type=_each(_one_of(METHODS, "method")),
        default=["dbf"],
        help=f"comma-separated: {','.join(METHODS)}",
    )
    grid.add_argument("--seeds", type=_each(_seed), default=[0], help="comma-separated, each 0 to 2**32 - 1")
    grid.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", "data")))
    grid.add_argument("--out", type=Path, required=True)
    grid.add_argument("--protocol", choices=["heldout", "paper"], default="heldout")
    grid.add_argument(
        "--lambda",
        dest="lambdas",
        type=_each(_positive),
        default=[1.0],
        help="comma-separated DBF strictness values (several: a sweep, plotted as lambda_sweep.png)",
    )
    grid.add_argument("--epochs", type=_epochs, default=DEFAULT_EPOCHS)
    grid.add_argument(
        "--activation",
        type=_each(_one_of(("exp", "softplus", "paper"), "activation")),
        default=["exp"],
        help="comma-separated: exp,softplus, or paper (the paper's Table 3: exp for DBF, softplus otherwise)",
    )
    grid.add_argument("--hidden", type=_hidden, default=())
    grid.add_argument(
        "--workers", type=_workers, default=os.cpu_count() or 1, help="processes (at most one per run)"
    )
    grid.set_defaults(run=_experiment)


def _add_summarise(commands: argparse._SubParsersAction) -> None:
    """``summarise``: experiments' tables together."""
    summary = commands.add_parser(
        "summarise", help="print the tables of one or more experiment outputs together (rows by setting)"
    )
    summary.add_argument("dirs", type=Path, nargs="+", help="directories holding results.json")
    summary.set_defaults(run=_summarise)


def _add_calibration(commands: argparse._SubParsersAction) -> None:
    """``calibration``: exported benchmark models' confidence and sets."""
    tables = commands.add_parser(
        "calibration",
        help="measure exported benchmark models' confidence and prediction sets on their test split",
    )
    tables.add_argument("models", type=Path, nargs="+", help="model directories (models/NAME)")
    tables.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", "data")))
    tables.set_defaults(run=_calibration)


def _add_view_agreement(commands: argparse._SubParsersAction) -> None:
    """``view-agreement``: exported benchmark models' views against the other views fused."""
    agreement = commands.add_parser(
        "view-agreement",
        help="measure how often each view of exported benchmark models agrees with the other views fused "
        "(the manifest's view_agreement), and how broken views show in it",
    )
    agreement.add_argument("models", type=Path, nargs="+", help="model directories (models/NAME)")
    agreement.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", "data")))
    agreement.add_argument(
        "--write", action="store_true", help="write the measured section into each manifest (heads untouched)"
    )
    agreement.add_argument(
        "--failures",
        action="store_true",
        help="print the table of each view broken in turn on the test split",
    )
    agreement.set_defaults(run=_view_agreement)


def _add_export(commands: argparse._SubParsersAction) -> None:
    """``export``: a benchmark dataset's model, as ``models/`` holds."""
    from training.experiment import DEFAULT_EPOCHS

    out = commands.add_parser(
        "export", help="train with the default settings and write an ONNX model repository entry"
    )
    out.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    out.add_argument("--out", type=Path, required=True, help="the model's directory, e.g. models/handwritten")
    out.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DBF_DATA_DIR", "data")))
    out.add_argument("--method", default="dbf", choices=METHODS)
    out.add_argument("--lambda", dest="lam", type=float, default=1.0)
    out.add_argument("--epochs", type=_epochs, default=DEFAULT_EPOCHS)
    out.add_argument(
        "--hidden", type=_hidden, default=(), help="hidden layer widths, e.g. 512,256 (default: linear heads)"
    )
    out.add_argument("--seed", type=_seed, default=0)
    out.add_argument("--target-fpr", type=float, default=0.05, help="flag rate on clean calibration samples")
    out.set_defaults(run=_export)


def _add_fit(commands: argparse._SubParsersAction) -> None:
    """``fit``: a user's data: what to read and where to write (:func:`_add_fit_training`: how)."""
    own = commands.add_parser(
        "fit",
        help="fit a DBF model to your data (a directory of .npy files, a Parquet file, or a benchmark "
        "dataset's name) and write it, with its model card, as a model repository entry",
        description="Fit one evidential head per view with DBF, calibrate the high-conflict flag, and write "
        "OUT (per-view ONNX, manifest.json, card.md and its figures); OUT must be absent or a model "
        "directory, and is replaced only once all of it is written. Formats: see the docs, "
        "docs/data/formats.md.",
    )
    own.add_argument(
        "--data",
        required=True,
        help="a directory of <view>.npy files, a .parquet file, or a "
        f"benchmark dataset ({', '.join(DATASETS)})",
    )
    own.add_argument("--out", type=Path, required=True, help="the model's directory; its name is the model's")
    own.add_argument("--views", type=_names, help="comma-separated views to use, in this order (default all)")
    own.add_argument(
        "--label-column",
        help="the labels' column (Parquet; default label) or file stem (.npy directory; default labels)",
    )
    own.add_argument(
        "--classes",
        type=_names,
        help="comma-separated class names in label order (default: classes.txt, else the sorted labels)",
    )
    own.add_argument(
        "--split-column",
        help="a column (or file stem) of train/validation/test per sample, "
        "instead of a stratified 70/10/20 split",
    )
    _add_fit_training(own)
    own.set_defaults(run=_fit)


def _add_fit_training(own: argparse.ArgumentParser) -> None:
    """``fit``'s options of training, fusion and calibration."""
    from training.architecture import SMALL_HIDDEN
    from training.train import Budget

    own.add_argument(
        "--epochs",
        type=_epochs,
        help=f"at most this many (default: {Budget.steps:,} optimizer steps' worth, at least the KL "
        "annealing's epochs)",
    )
    own.add_argument(
        "--patience",
        type=_patience,
        help="stop after this many epochs without a better validation loss (default: "
        f"{Budget.patience_steps:,} optimizer steps' worth, at least {Budget.min_patience}; "
        "0: no early stopping)",
    )
    own.add_argument(
        "--max-minutes",
        type=_minutes,
        default=Budget.seconds / 60,
        help="stop training after this long, keeping the best epoch's heads; two candidate heads get half "
        "each; the calibrations' cross-fitting, and heads trained again where a weak view outvotes the "
        "others, get as long again each, so a fit can take up to 4 times this, and its evaluation besides "
        f"(default {Budget.seconds / 60:g})",
    )
    own.add_argument(
        "--hidden",
        type=_hidden,
        help="hidden layer widths of each view's head, e.g. 512,256; 0 or linear: a linear head (default: "
        f"linear or hidden layers of {','.join(map(str, SMALL_HIDDEN))}, whichever is more accurate on the "
        "validation split)",
    )
    own.add_argument(
        "--seed", type=_seed, default=0, help="seeds the split and the heads' initialisation (0 to 2**32 - 1)"
    )
    own.add_argument("--lambda", dest="lam", type=float, default=1.0, help="DBF's strictness (default 1)")
    own.add_argument("--method", default="dbf", choices=METHODS)
    own.add_argument(
        "--beta",
        type=_non_negative,
        help="weight of each view's own loss beside the fused one (the paper's beta; default 1, and the "
        "heads trained again with 0.1 where the fused model is below its best view on held-out samples: "
        "out of fold, or the validation split's)",
    )
    own.add_argument(
        "--class-weighting",
        choices=("auto", "none", "sqrt", "balanced"),
        default="auto",
        help="how much each training sample's loss weighs by its class's share: none (alike), balanced "
        "(every class as much in all) or sqrt (between: the inverse square root of the share); default "
        "auto: sqrt where the commonest class outnumbers the rarest more than 4 to 1, else none",
    )
    own.add_argument(
        "--target-fpr",
        type=float,
        default=0.05,
        help="share of clean calibration samples the high-conflict flag raises (default 0.05)",
    )
    own.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DBF_DATA_DIR", "data")),
        help="where benchmark datasets are (for --data NAME)",
    )
    own.add_argument("--quiet", action="store_true", help="a line every few epochs instead of a progress bar")


if __name__ == "__main__":
    sys.exit(main())
