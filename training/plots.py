"""The paper's figures from an experiment's output (``results.json`` and ``uncertainties.npz``), as PNG.

* ``uncertainty_distributions.png``: fused uncertainty on clean vs conflictive test samples, a panel per
  dataset (rows) and method (columns), as the paper's uncertainty-distribution figure.
* ``view_uncertainty.png``: mean per-view uncertainty per dataset, with the std over seeds as error bars.
* ``lambda_sweep.png`` (when the results hold DBF runs at several lambdas): the distributions per lambda.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PLOT_FILES = ("uncertainty_distributions.png", "view_uncertainty.png", "lambda_sweep.png")
"""The figures :func:`write_plots` may write."""


def write_plots(out_dir: str | Path) -> list[Path]:
    """Draw every figure the results in ``out_dir`` allow; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    out = Path(out_dir)
    results = json.loads((out / "results.json").read_text())["results"]
    with np.load(out / "uncertainties.npz") as stored:
        arrays = {key: stored[key] for key in stored.files}
    samples = [(r, arrays[f"{i}_normal"], arrays[f"{i}_conflict"]) for i, r in enumerate(results)]
    written = [
        _uncertainty_distributions(samples, out / PLOT_FILES[0]),
        _view_uncertainty(results, out / PLOT_FILES[1]),
    ]
    lambdas = sorted({r["lambda"] for r in results if r["method"] == "dbf"})
    if len(lambdas) > 1:
        written.append(_lambda_sweep(samples, lambdas, out / PLOT_FILES[2]))
    return written


def _histograms(axis, normal: np.ndarray, conflict: np.ndarray, title: str) -> None:
    bins = np.linspace(0, 1, 41)
    axis.hist(normal, bins=bins, alpha=0.6, density=True, label="normal")
    axis.hist(conflict, bins=bins, alpha=0.6, density=True, label="conflictive")
    axis.set_title(title, fontsize=9)
    axis.set_xlim(0, 1)
    axis.tick_params(labelsize=7)


def _uncertainty_distributions(samples: Sequence[tuple[dict, np.ndarray, np.ndarray]], path: Path) -> Path:
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r, _, _ in samples))
    methods = list(dict.fromkeys(r["method"] for r, _, _ in samples))
    figure, axes = plt.subplots(
        len(datasets), len(methods), figsize=(2.6 * len(methods), 2.0 * len(datasets)), squeeze=False
    )
    for row, dataset in enumerate(datasets):
        for col, method in enumerate(methods):
            picked = [(n, c) for r, n, c in samples if r["dataset"] == dataset and r["method"] == method]
            if not picked:
                axes[row][col].axis("off")
                continue
            normal = np.concatenate([n for n, _ in picked])
            conflict = np.concatenate([c for _, c in picked])
            _histograms(axes[row][col], normal, conflict, f"{dataset} {method.upper()}")
    axes[0][0].legend(fontsize=7)
    return _save(figure, path, xlabel="fused uncertainty")


def _view_uncertainty(results: Sequence[dict], path: Path) -> Path:
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    figure, axes = plt.subplots(1, len(datasets), figsize=(3.0 * len(datasets), 2.6), squeeze=False)
    for axis, dataset in zip(axes[0], datasets, strict=True):
        per_run = np.array([r["view_uncertainty"] for r in results if r["dataset"] == dataset])
        names = [f"M{v + 1}" for v in range(per_run.shape[1])]
        axis.bar(names, per_run.mean(0), yerr=per_run.std(0), capsize=3)
        axis.set_ylim(0, 1)
        axis.set_title(dataset, fontsize=9)
    axes[0][0].set_ylabel("mean view uncertainty")
    return _save(figure, path)


def _lambda_sweep(
    samples: Sequence[tuple[dict, np.ndarray, np.ndarray]], lambdas: list[float], path: Path
) -> Path:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(lambdas), figsize=(2.6 * len(lambdas), 2.3), squeeze=False)
    for axis, lam in zip(axes[0], lambdas, strict=True):
        picked = [(n, c) for r, n, c in samples if r["method"] == "dbf" and r["lambda"] == lam]
        _histograms(
            axis,
            np.concatenate([n for n, _ in picked]),
            np.concatenate([c for _, c in picked]),
            f"λ = {lam:g}",
        )
    axes[0][0].legend(fontsize=7)
    return _save(figure, path, xlabel="fused uncertainty (DBF)")


def _save(figure, path: Path, *, xlabel: str | None = None) -> Path:
    import matplotlib.pyplot as plt

    if xlabel:
        figure.supxlabel(xlabel)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
