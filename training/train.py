"""Training loop over tensors held in memory: the benchmark datasets are small, so no Dataset/DataLoader."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fusion import Method
from training.heads import Activation, EvidentialHeads
from training.loss import annealing_coefficient, total_loss


@dataclass(frozen=True, kw_only=True)
class Hyperparameters:
    """One dataset's training settings (paper appendix B, Table 4)."""

    lr: float
    annealing_step: int
    gamma: float
    weight_decay: float


# Paper appendix B, Table 4 ("Hyperparameters for Different Datasets").
PAPER_HYPERPARAMETERS: dict[str, Hyperparameters] = {
    "cub": Hyperparameters(lr=0.003, annealing_step=10, gamma=1.0, weight_decay=1e-4),
    "handwritten": Hyperparameters(lr=0.003, annealing_step=50, gamma=0.7, weight_decay=1e-5),
    "pie": Hyperparameters(lr=0.003, annealing_step=50, gamma=0.5, weight_decay=1e-5),
    "caltech101": Hyperparameters(lr=0.0003, annealing_step=30, gamma=0.5, weight_decay=1e-4),
    "scene15": Hyperparameters(lr=0.01, annealing_step=30, gamma=0.5, weight_decay=1e-5),
}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that decides a training run; the same config and seed give the same heads."""

    method: Method = "dbf"
    lam: float = 1.0
    activation: Activation = "exp"
    hidden: tuple[int, ...] = ()
    epochs: int = 1000
    batch_size: int = 200
    hyperparameters: Hyperparameters = field(default_factory=lambda: PAPER_HYPERPARAMETERS["handwritten"])
    beta: float = 1.0
    seed: int = 0


def train(
    views: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    num_classes: int,
    config: TrainConfig,
    progress: bool | None = None,
) -> EvidentialHeads:
    """Train one evidential head per view on scaled features, fusing with ``config.method`` in the loss.

    Parameters
    ----------
    views : sequence of arrays, each (N, d_v)
        Training features per view, already scaled.
    labels : int array, shape (N,)
    num_classes : int
    config : TrainConfig
    progress : bool, optional
        Show a progress bar with loss and accuracy; default: when stderr is a terminal and not under CI.

    Returns
    -------
    EvidentialHeads
        In eval mode, on the CPU.
    """
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    tensors = [torch.as_tensor(np.asarray(v, dtype=np.float32)) for v in views]
    targets = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    model = EvidentialHeads(
        [t.shape[1] for t in tensors], num_classes, hidden=config.hidden, activation=config.activation
    )
    hp = config.hyperparameters
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    n = targets.shape[0]
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    bar = _progress_bar(config.epochs, enabled=progress)
    model.train()
    for epoch in range(1, config.epochs + 1):
        annealing = annealing_coefficient(epoch, hp.annealing_step)
        order = torch.randperm(n, generator=generator)
        total, correct = 0.0, 0
        for start in range(0, n, config.batch_size):
            batch = order[start : start + config.batch_size]
            evidence = model([t[batch] for t in tensors])
            loss, fused = total_loss(
                evidence,
                targets[batch],
                method=config.method,
                lam=config.lam,
                annealing=annealing,
                beta=config.beta,
                gamma=hp.gamma,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if progress:
                total += float(loss) * batch.numel()
                correct += int((fused.probability.argmax(-1) == targets[batch]).sum())
        if progress:
            bar.set_postfix(loss=f"{total / n:.4f}", acc=f"{correct / n:.3f}", refresh=False)
            bar.update()
    bar.close()
    return model.eval()


def predict_evidence(
    model: EvidentialHeads, views: Sequence[np.ndarray], *, batch_size: int = 4096
) -> np.ndarray:
    """The heads' evidence for features ``views`` (each (N, d_v)): float32 array (N, V, K)."""
    out = []
    n = len(views[0])
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            batch = [
                torch.as_tensor(np.asarray(v[start : start + batch_size], dtype=np.float32)) for v in views
            ]
            out.append(model(batch).numpy())
    return np.concatenate(out) if out else np.zeros((0, len(views), 0), dtype=np.float32)


class _NoBar:
    def set_postfix(self, **_: object) -> None: ...
    def update(self) -> None: ...
    def close(self) -> None: ...


def _progress_bar(total: int, *, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="epoch", dynamic_ncols=True)
