"""Time training against a straightforward per-sample ``DataLoader`` loop, in one run.

Yardstick: the same model, loss and optimiser fed by a ``torch.utils.data.Dataset`` that returns one sample
(a tuple of per-view tensors and a label) at a time, batched by ``DataLoader``'s default collation, as the
authors' code does. Ours: :func:`training.train.train` over tensors held in memory, and
:func:`training.train.train_members` training ten seeds as one stacked model (time per model). Prints
seconds per epoch and ratios; asserts nothing. Both single-threaded (the experiment runner's setting).

    python -m benchmarks.training [--dataset handwritten] [--epochs 20] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from training.heads import EvidentialHeads
from training.loss import annealing_coefficient, total_loss
from training.protocol import evaluation_sets
from training.readers import load
from training.train import TrainConfig, train, train_members


class _PerSample(torch.utils.data.Dataset):
    def __init__(self, views: list[np.ndarray], labels: np.ndarray) -> None:
        self.views = [torch.as_tensor(v, dtype=torch.float32) for v in views]
        self.labels = torch.as_tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return tuple(v[i] for v in self.views), self.labels[i]


def dataloader_training(views, labels, *, num_classes: int, config: TrainConfig) -> EvidentialHeads:
    """The yardstick: a per-sample Dataset and DataLoader, otherwise the same training as ours."""
    torch.manual_seed(config.seed)
    model = EvidentialHeads([v.shape[1] for v in views], num_classes, activation=config.activation)
    hp = config.hyperparameters
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    loader = torch.utils.data.DataLoader(
        _PerSample(views, labels), batch_size=config.batch_size, shuffle=True
    )
    for epoch in range(1, config.epochs + 1):
        for batch_views, batch_labels in loader:
            loss, _ = total_loss(
                model(list(batch_views)),
                batch_labels,
                method=config.method,
                annealing=annealing_coefficient(epoch, hp.annealing_step),
                gamma=hp.gamma,
            )
            optimizer.zero_grad()
            loss.mean().backward()
            optimizer.step()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="handwritten")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--method", default="dbf")
    parser.add_argument("--data-dir", default=os.environ.get("DBF_DATA_DIR", "data"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    dataset = load(args.dataset, args.data_dir)
    training_split = evaluation_sets(dataset, seed=0).train
    views, labels = training_split.features(), training_split.labels
    config = TrainConfig(
        method=args.method, epochs=args.epochs, hyperparameters=dataset.spec.hyperparameters, seed=0
    )
    k = dataset.num_classes

    def timed(fn) -> float:
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) / args.epochs

    yardstick = timed(lambda: dataloader_training(views, labels, num_classes=k, config=config))
    ours = timed(lambda: train(views, labels, num_classes=k, config=config, progress=False))
    seeds = list(range(10))
    stacked = timed(
        lambda: train_members(
            [views] * 10, [labels] * 10, num_classes=k, config=config, seeds=seeds, progress=False
        )
    ) / len(seeds)
    print(f"# training benchmark: {args.dataset}, {args.method}, {len(labels)} training samples, batch 200, ")
    print(f"# {args.epochs} epochs, torch {torch.__version__}, 1 thread; seconds per epoch per model")
    print(f"{'per-sample DataLoader (yardstick)':<36} {yardstick:8.4f} s   1.00")
    print(f"{'in-memory tensors, one model':<36} {ours:8.4f} s   {ours / yardstick:.2f}")
    print(f"{'in-memory tensors, 10 seeds stacked':<36} {stacked:8.4f} s   {stacked / yardstick:.2f}")


if __name__ == "__main__":
    main()
