"""Experiments: a run is (dataset, method, seed, protocol, lambda, activation); a grid runs many in parallel.

Protocols (``heldout``, the default, and ``paper``, what the authors' code does) are made by
:func:`training.protocol.evaluation_sets`; their notes are there. A run's results are a :class:`RunResult`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from fusion import METHODS, Method
from training.data import MultiViewData, synthetic
from training.evaluate import Evaluation, evaluate
from training.heads import Activation
from training.plots import PLOT_FILES, write_plots
from training.protocol import EvaluationSets, ProtocolName, evaluation_sets
from training.readers import read_registered
from training.registry import dataset_spec
from training.train import TrainConfig, train_members

# The authors' 1000 epochs. Fewer are not enough on the small datasets: protocol paper, DBF, seed 0, 200 vs
# 1000 epochs gives AUROC 0.49 vs 0.74 on PIE and 0.46 vs 0.60 on CUB (the paper: 0.71 and 0.57).
DEFAULT_EPOCHS = 1000


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    dataset: str
    method: Method = "dbf"
    seed: int = 0
    protocol: ProtocolName = "heldout"
    lam: float = 1.0
    activation: Activation = "exp"
    epochs: int = DEFAULT_EPOCHS
    hidden: tuple[int, ...] = ()


def paper_activation(method: Method) -> Activation:
    """The activation the paper's Table 3 used for ``method``: the authors ran DBF with the capped
    exponential and the baselines with softplus."""
    return "exp" if method == "dbf" else "softplus"


@dataclass(frozen=True)
class RunResult:
    """One run's outcome: its settings, its :class:`Evaluation`, and its share of the training time."""

    spec: RunSpec
    evaluation: Evaluation
    seconds: float  # the group's training time divided by its size (:func:`run_together`)
    trained_together: int

    def record(self) -> dict[str, object]:
        """The run as ``results.json`` lists it: settings (``lam`` as ``lambda``), measures, time."""
        fields = asdict(self.spec)
        fields["lambda"] = fields.pop("lam")
        return {
            **fields,
            **self.evaluation.metrics(),
            "seconds": self.seconds,
            "trained_together": self.trained_together,
        }


def make_splits(dataset: MultiViewData, *, protocol: ProtocolName, seed: int) -> EvaluationSets:
    """The sets an experiment trains and evaluates on: ``protocol``'s, with a conflictive test set."""
    return evaluation_sets(dataset, protocol=protocol, seed=seed, conflictive=("test",))


def run(spec: RunSpec, data_dir: str | os.PathLike[str] | None = None) -> RunResult:
    """Train and evaluate one run."""
    return run_together([spec], data_dir)[0]


def run_together(specs: Sequence[RunSpec], data_dir: str | os.PathLike[str] | None = None) -> list[RunResult]:
    """Runs that differ only in their seed and method, trained together as one stacked model
    (:func:`train_members`); results in the order of ``specs``.

    ``seconds`` in each result is the group's training time divided by its size.
    """
    first = specs[0]
    if any(replace(spec, seed=first.seed, method=first.method) != first for spec in specs):
        raise ValueError("run_together needs runs that differ only in their seed and method")
    # Members of one method side by side: the loss fuses each such run in one call.
    order = sorted(range(len(specs)), key=lambda i: METHODS.index(specs[i].method))
    specs = [specs[i] for i in order]
    dataset = _load(first.dataset, str(data_dir) if data_dir is not None else None)
    seeds = sorted({spec.seed for spec in specs})
    splits = {seed: make_splits(dataset, protocol=first.protocol, seed=seed) for seed in seeds}
    config = TrainConfig(
        lam=first.lam,
        activation=first.activation,
        hidden=first.hidden,
        epochs=first.epochs,
        hyperparameters=dataset.spec.hyperparameters,
    )
    started = time.perf_counter()
    trained = train_members(
        [splits[spec.seed].train.features() for spec in specs],
        [splits[spec.seed].train.labels for spec in specs],
        num_classes=dataset.num_classes,
        config=config,
        seeds=[spec.seed for spec in specs],
        methods=[spec.method for spec in specs],
    )
    seconds = (time.perf_counter() - started) / len(specs)
    results: list[RunResult | None] = [None] * len(specs)
    for i, spec, member in zip(order, specs, trained, strict=True):
        split = splits[spec.seed]
        evaluation = evaluate(
            member.heads, split.test, split.conflictive["test"], method=spec.method, lam=spec.lam
        )
        results[i] = RunResult(spec, evaluation, seconds, len(specs))
    return results


def run_grid(
    specs: Iterable[RunSpec], data_dir: str | os.PathLike[str] | None, *, workers: int = 1
) -> list[RunResult]:
    """Run every spec. Runs that differ only in their seed and method train together (:func:`run_together`);
    the groups go to ``workers`` processes, each torch single-threaded (these small models train fastest
    one per core), largest dataset first so that the small ones fill in at the end. With fewer groups than
    workers, the largest groups are halved until every worker has one. Results come back in the order of
    ``specs``."""
    specs = list(specs)
    grouped: dict[RunSpec, list[int]] = {}
    for i, spec in enumerate(specs):
        grouped.setdefault(replace(spec, seed=0, method="dbf"), []).append(i)
    groups = [
        sorted(members, key=lambda i: (METHODS.index(specs[i].method), specs[i].seed))
        for members in grouped.values()
    ]

    def cost(group: list[int]) -> float:
        return _expected_cost(specs[group[0]], data_dir) * len(group)

    while len(groups) < workers:
        largest = max(groups, key=cost)
        if len(largest) < 2:
            break
        groups.remove(largest)
        groups += [largest[: len(largest) // 2], largest[len(largest) // 2 :]]
    groups.sort(key=cost, reverse=True)
    batches = [[specs[i] for i in group] for group in groups]
    if workers <= 1:
        _configure_worker()
        outcomes = [run_together(batch, data_dir) for batch in batches]
    else:
        # No more processes than batches: each is a copy of this one, torch and the data included.
        processes = min(workers, len(batches))
        with ProcessPoolExecutor(max_workers=processes, initializer=_configure_worker) as pool:
            outcomes = list(pool.map(run_together, batches, [data_dir] * len(batches)))
    results: list[RunResult | None] = [None] * len(specs)
    for group, outcome in zip(groups, outcomes, strict=True):
        for i, result in zip(group, outcome, strict=True):
            results[i] = result
    return results


def _expected_cost(spec: RunSpec, data_dir: str | os.PathLike[str] | None) -> float:
    """Relative training time of one run: its number of training steps (samples x epochs)."""
    return len(_load(spec.dataset, str(data_dir) if data_dir is not None else None).labels) * spec.epochs


def summary_table(results: Sequence[Mapping[str, object]], *, metric: str) -> str:
    """Markdown table of ``metric`` as mean +- std over seeds, datasets as columns, one row per method, and
    per activation and hidden layers where the results have more than one of them.

    ``results`` are records as ``results.json`` holds them (:meth:`RunResult.record`)."""
    datasets_seen = list(dict.fromkeys(str(r["dataset"]) for r in results))
    rows = list(dict.fromkeys(_row(r) for r in results))
    label_activation = len({row[1] for row in rows}) > 1
    label_hidden = len({row[2] for row in rows}) > 1
    lines = ["| | " + " | ".join(map(_cell, datasets_seen)) + " |", "|---" * (len(datasets_seen) + 1) + "|"]
    for row in rows:
        method, activation, hidden = row
        cells = []
        for name in datasets_seen:
            values = [float(r[metric]) for r in results if r["dataset"] == name and _row(r) == row]
            cells.append(f"{np.mean(values):.2f} ± {np.std(values):.2f}" if values else "")
        details = ([activation] if label_activation else []) + (
            [f"hidden {','.join(map(str, hidden)) or 'none'}"] if label_hidden else []
        )
        label = method.upper() + (f" ({', '.join(details)})" if details else "")
        lines.append(f"| {_cell(label)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: a pipe would open another cell, a line break another row, a
    backslash escape the pipe after it."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


SUMMARY_SECTIONS = (
    ("AUROC of conflictive-sample detection by fused uncertainty", "auc"),
    ("Accuracy on the clean test set", "acc_normal"),
    ("Accuracy on the conflictive test set", "acc_conflict"),
    ("Expected calibration error on the clean test set", "ece"),
)


def summary_markdown(results: Sequence[Mapping[str, object]]) -> str:
    """The paper's tables (AUROC, clean and conflictive accuracy) and ECE, as markdown sections."""
    return "\n".join(
        f"## {title}\n\n{summary_table(results, metric=metric)}\n" for title, metric in SUMMARY_SECTIONS
    )


def read_results(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """The records of an experiment's ``results.json`` (:func:`write_results`), checked for what
    :func:`summary_markdown` reads of them.

    Raises
    ------
    ValueError
        Naming the file and, where one record is at fault, its index and key.
    OSError
        Where it cannot be read.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except RecursionError:  # json's parser recurses once per level of nesting
        raise ValueError(f"{path}: nested too deeply to be an experiment's results") from None
    except ValueError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    records = document.get("results") if isinstance(document, dict) else None
    if not isinstance(records, list):
        raise ValueError(f'{path}: no list of results (an object with a list under "results")')
    for i, record in enumerate(records):
        problem = _record_problem(record)
        if problem:
            raise ValueError(f"{path}: result {i}: {problem}")
    return records


def _record_problem(record: object) -> str | None:
    """What makes ``record`` unfit for the summary tables, or None."""
    if not isinstance(record, dict):
        return "not an object"
    for key in ("dataset", "method"):
        if not isinstance(record.get(key), str):
            return f"{key} is {record.get(key)!r}, not a name"
    for _, metric in SUMMARY_SECTIONS:
        value = record.get(metric)
        if isinstance(value, bool) or not isinstance(value, int | float):  # NaN is a measure: kept
            return f"{metric} is {value!r}, not a number"
    if not isinstance(record.get("activation", ""), str):
        return f"activation is {record['activation']!r}, not a name"
    hidden = record.get("hidden", [])
    if not isinstance(hidden, list) or not all(type(width) is int for width in hidden):
        return f"hidden is {hidden!r}, not a list of layer widths"
    return None


def _row(result: Mapping[str, object]) -> tuple[str, str, tuple[int, ...]]:
    return str(result["method"]), str(result.get("activation", "")), tuple(result.get("hidden", ()))


RESULT_FILES = ("results.json", "results.md", "uncertainties.npz", *PLOT_FILES)
"""What :func:`write_results` writes into its directory (the plots as the results allow)."""


class ResultsDirError(ValueError):
    """A directory an experiment's results may not be written to; the message says why and what to do."""


def check_results_dir(out_dir: str | os.PathLike[str]) -> None:
    """Refuse ``out_dir`` for an experiment's results unless writing them there overwrites nothing but an
    earlier experiment's: it is absent (made, with its parents) or a directory whose :data:`RESULT_FILES`
    are regular files, and where it holds any of them, its ``results.json`` is an experiment's.

    Checked before the runs (found out afterwards, hours of runs would be lost) and again before writing.

    Raises
    ------
    ResultsDirError
        Naming the file or directory and what it is.
    """
    out = Path(out_dir)
    ancestor = next(path for path in (out, *out.parents) if os.path.lexists(path))
    if not ancestor.is_dir():
        made = "" if ancestor == out else f", so {out} cannot be made there"
        raise ResultsDirError(f"{ancestor}: a file, not a directory{made}; name a directory for the results")
    if ancestor != out:
        return
    present = [name for name in RESULT_FILES if os.path.lexists(out / name)]
    for name in present:
        path = out / name
        if path.is_symlink() or not path.is_file():  # written through, a link would write outside out_dir
            kind = "a symbolic link" if path.is_symlink() else "not a regular file"
            raise ResultsDirError(f"{path}: {kind}; results are written only as files of {out}")
    if present and not _is_results(out / "results.json"):
        raise ResultsDirError(
            f"{out}: holds {present[0]} but no results.json of an experiment, so it is not overwritten: "
            "name a new directory for the results"
        )


def _is_results(path: Path) -> bool:
    """Whether ``path`` is an experiment's results.json (:func:`write_results`)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and isinstance(document.get("results"), list)


def write_results(
    results: Sequence[RunResult],
    out_dir: str | os.PathLike[str],
    *,
    wall_seconds: float | None = None,
) -> Path:
    """``out_dir/results.json`` (each run's :meth:`RunResult.record`), ``results.md`` (the paper's tables),
    ``uncertainties.npz`` (fused uncertainties per run, keyed by index) and the plots of
    :mod:`training.plots`, where :func:`check_results_dir` allows. Returns the directory.

    Every file is written beside the others in a hidden staging directory of ``out_dir`` and renamed into
    place only once all are, under a lock of ``out_dir``; a figure these results do not have is removed. So
    an interrupt while the files are made (nearly all of the writing's time) leaves the earlier results as
    they were, and of two experiments writing one directory at once, one's files are left, all of them; an
    interrupt among the renames themselves (microseconds) can still leave some of each."""
    out = Path(out_dir)
    check_results_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".results.", dir=out))
    try:
        records = [result.record() for result in results]
        document: dict[str, object] = {"results": records}
        if wall_seconds is not None:
            document["wall_seconds"] = round(wall_seconds, 3)  # ms: a small grid takes well under 0.1 s
        (staging / "results.json").write_text(json.dumps(document, indent=1) + "\n")
        (staging / "results.md").write_text(summary_markdown(records))
        arrays = {}
        for i, result in enumerate(results):  # keyed by the run's index in results.json
            arrays[f"{i}_normal"] = result.evaluation.u_normal
            arrays[f"{i}_conflict"] = result.evaluation.u_conflict
        np.savez_compressed(staging / "uncertainties.npz", **arrays)
        write_plots(staging)
        with _locked(out):
            check_results_dir(out)  # another writer may have put something else there meanwhile
            for name in RESULT_FILES:
                if (staging / name).exists():
                    os.replace(staging / name, out / name)
                else:  # an earlier experiment's figure (a lambda sweep), which these results do not draw
                    (out / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` itself (no lock file left behind), released on leaving; none where
    the system has no ``flock`` (Windows opens no directory)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


@functools.lru_cache(maxsize=8)
def _load(name: str, data_dir: str | None) -> MultiViewData:
    """A benchmark dataset by registry name (``synthetic``: a small generated one, for tests).

    An unknown name is a KeyError listing the known ones: a run never borrows another dataset's settings.
    """
    if name == "synthetic":
        return synthetic(300, num_classes=3, seed=0)
    spec = dataset_spec(name)
    return read_registered(spec, data_dir if data_dir is not None else os.environ.get("DBF_DATA_DIR", "data"))


def _configure_worker() -> None:
    """One torch thread per process, and glibc's malloc told to keep freed memory.

    A training step allocates and frees megabyte-sized temporaries; by default glibc hands them back to the
    kernel and every new one page-faults in again, which on this kind of VM made elementwise ops several
    times slower than on reused memory (docs/benchmarks.md).
    """
    import torch

    torch.set_num_threads(1)
    if sys.platform == "linux":
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:  # not glibc (musl): nothing to tune
            return
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's maximum: smaller blocks come from the heap
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)  # and the heap is not trimmed below 1 GiB of free memory


_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
