"""Training loop over tensors held in memory: the benchmark datasets are small, so no Dataset/DataLoader."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch
from torch import nn

from fusion import Method
from training.heads import Activation, EvidentialHeads, evidence_activation
from training.loss import annealing_coefficient, total_loss
from training.progress import Progress, ProgressBar, Silent
from training.registry import DEFAULT_HYPERPARAMETERS, Hyperparameters

ClassWeighting = Literal["none", "sqrt", "balanced"]
"""How much a training sample's loss weighs by its class's share (:func:`class_weights`)."""

_WEIGHTING_POWER: dict[str, float] = {"none": 0.0, "sqrt": 0.5, "balanced": 1.0}


def class_weights(labels: np.ndarray, *, num_classes: int, weighting: ClassWeighting) -> np.ndarray:
    """Each class's weight in the training loss: ``(N / (K n_c)) ** p``, scaled to average 1 over ``labels``.

    ``p`` is 0 for ``"none"`` (every sample alike), 1 for ``"balanced"`` (every class's samples weigh as
    much in all, scikit-learn's ``class_weight="balanced"``) and 0.5 for ``"sqrt"``, between the two. The
    evidential loss keeps rewarding evidence for samples it already gets right, so on data where one class
    is rare, unweighted training grows the common class's evidence without bound and the rare class's
    hardly at all, and averaging fusion then answers the common class everywhere. A class absent from
    ``labels`` counts as one sample.

    Examples
    --------
    >>> labels = np.array([0] * 90 + [1] * 10)
    >>> class_weights(labels, num_classes=2, weighting="balanced").round(3)
    array([0.556, 5.   ])
    >>> class_weights(labels, num_classes=2, weighting="sqrt").round(3)
    array([0.833, 2.5  ])
    >>> class_weights(np.array([0, 1, 1, 0]), num_classes=2, weighting="sqrt")
    array([1., 1.])
    """
    counts = np.maximum(np.bincount(labels, minlength=num_classes), 1).astype(np.float64)
    weights = (len(labels) / (num_classes * counts)) ** _WEIGHTING_POWER[weighting]
    return weights / weights[labels].mean()


IMBALANCE = 4.0
"""``fit``'s classes are weighted (``"sqrt"``) where the commonest outnumbers the rarest more than this."""


def weighting_for(labels: np.ndarray, *, num_classes: int) -> ClassWeighting:
    """``fit``'s default class weighting: ``"sqrt"`` where the commonest class has more than :data:`IMBALANCE`
    times the samples of the rarest, else ``"none"``: where unweighted training starts to lose a rare class
    that a view separates, while below it data sets keep the paper's training (docs/data/fit.md).

    >>> weighting_for(np.repeat([0, 1], [80, 20]), num_classes=2)
    'none'
    >>> weighting_for(np.repeat([0, 1, 2], [90, 50, 10]), num_classes=3)
    'sqrt'
    """
    counts = np.bincount(labels, minlength=num_classes)
    counts = counts[counts > 0]
    return "sqrt" if counts.max() > IMBALANCE * counts.min() else "none"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that decides a training run; the same config and seed give the same heads."""

    method: Method = "dbf"
    lam: float = 1.0
    activation: Activation = "exp"
    hidden: tuple[int, ...] = ()
    epochs: int = 1000
    batch_size: int = 200
    hyperparameters: Hyperparameters = DEFAULT_HYPERPARAMETERS
    beta: float = 1.0
    class_weighting: ClassWeighting = "none"
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class EarlyStopping:
    """Stop once the validation loss has not improved for ``patience`` epochs; keep the best epoch's heads.

    The validation loss is the objective with the KL term fully annealed (``sigma = 1``, Eq. 17), so that
    epochs compare; training never stops before the annealing is complete (``sigma_t`` follows the epochs
    actually run, ``min(1, t / T)``, whatever the maximum).

    The validation loss is evaluated every :attr:`every` epochs and on the run's last one, not every epoch:
    where an epoch is one optimizer step and the patience a thousand of them (small data under the default
    :class:`Budget`), a pass over the validation samples every epoch took a quarter of the training time.
    The heads kept are then the best of epochs at most ``patience / 100`` apart (every epoch below a patience
    of 200: fits of more than about 1,000 training samples at batch 200 are as before).
    """

    patience: int = 30

    @property
    def every(self) -> int:
        """Epochs between evaluations of the validation loss: a hundredth of the patience, at least 1."""
        return max(1, self.patience // 100)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How long ``fit`` trains by default: optimizer steps rather than epochs, so that the budget follows the
    data's size, and a bound on the wall time whatever the data.

    A fixed number of epochs starves small data (400 training samples at batch 200 make 2 steps an epoch:
    1000 epochs are 2,000 steps) and lets large data run for hours. Here the epoch cap is ``steps`` steps'
    worth of epochs (never fewer than the KL annealing's), the early-stopping patience ``patience_steps``
    steps' worth (never fewer than ``min_patience`` epochs), and training stops after ``seconds``. A given
    ``epochs`` or ``patience`` replaces its rule (``patience=0``: no early stopping).
    """

    steps: int = 10_000
    patience_steps: int = 1_000
    min_patience: int = 30
    seconds: float | None = 600.0
    epochs: int | None = None
    patience: int | None = None

    def max_epochs(self, samples: int, config: TrainConfig) -> int:
        """The epoch cap for ``samples`` training samples."""
        if self.epochs is not None:
            return self.epochs
        per_epoch = math.ceil(samples / config.batch_size)
        return max(config.hyperparameters.annealing_step, math.ceil(self.steps / per_epoch))

    def early_stopping(self, samples: int, config: TrainConfig) -> EarlyStopping | None:
        """The early stopping for ``samples`` training samples; None for ``patience=0``."""
        if self.patience is not None:
            return EarlyStopping(patience=self.patience) if self.patience > 0 else None
        per_epoch = math.ceil(samples / config.batch_size)
        return EarlyStopping(patience=max(self.min_patience, math.ceil(self.patience_steps / per_epoch)))


@dataclass(frozen=True)
class History:
    """What one member's training went through, epoch by epoch."""

    epochs: int  # run
    best_epoch: int  # whose heads were kept: the last one without early stopping
    stopped_early: bool
    train_loss: list[float]  # mean over the epoch's samples
    validation_loss: list[float]  # empty without validation data
    epoch_seconds: list[float]  # the whole stacked run's time per epoch
    # The epochs whose validation loss was evaluated (EarlyStopping.every), one per validation_loss entry.
    validation_epochs: list[int] = field(default_factory=list)
    # The time limit ended the run (early stopping did not).
    timed_out: bool = False
    # The epoch cap or the time limit ended the run while the validation loss was still improving: its best
    # epoch lies within the last ``patience`` epochs (with early stopping only).
    still_improving: bool = False


@dataclass(frozen=True)
class Trained:
    heads: EvidentialHeads
    history: History


class SampleSet(Protocol):
    """Samples whose features come a chunk at a time (:class:`training.protocol.Samples`)."""

    labels: np.ndarray
    present: np.ndarray | None

    def __len__(self) -> int: ...

    def features(self, start: int = 0, stop: int | None = None) -> list[np.ndarray]: ...


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
        Show a progress bar with the loss; default: when stderr is a terminal and not under CI.

    Returns
    -------
    EvidentialHeads
        In eval mode, on the CPU.
    """
    return train_members(
        [views], [labels], num_classes=num_classes, config=config, seeds=[config.seed], progress=progress
    )[0].heads


def train_members(
    views: Sequence[Sequence[np.ndarray]],
    labels: Sequence[np.ndarray],
    *,
    num_classes: int,
    config: TrainConfig,
    seeds: Sequence[int],
    methods: Sequence[Method] | None = None,
    rows: Sequence[np.ndarray] | None = None,
    present: Sequence[np.ndarray | None] | None = None,
    validation: Sequence[SampleSet] | None = None,
    early_stopping: EarlyStopping | None = None,
    time_limit: float | None = None,
    progress: bool | Progress | Callable[[int], Progress] | None = None,
) -> list[Trained]:
    """Train M independent models at once, one per seed, each on its own data: as :func:`train` M times.

    The members are stacked along a leading axis, so every operation runs once on ``(M, batch, ...)`` tensors
    instead of M times on small ones (the per-operation overhead dominates these small models). Member m is
    initialised from ``seeds[m]``, shuffles its data with its own generator and gets the gradient of its own
    loss (the members' losses are summed, not averaged, so weight decay and Adam see what they would alone);
    results equal separate runs up to floating-point summation order.

    Parameters
    ----------
    views : M sequences of V arrays, each (N, d_v)
        Each member's scaled features; N must be the same for all members. A single member's arrays are
        used as they are (float32, C-contiguous: no copy), so large data is held once.
    labels : M int arrays, each (N,)
    seeds : M ints
    methods : M fusion methods, optional
        Member m fuses with ``methods[m]`` in its loss (default: ``config.method`` for all). Put members of
        one method next to each other: each such run is fused in one call (:func:`total_loss`).
    rows : M int arrays, optional
        The rows of ``views`` each member trains on, the same number for all (default: every row).
    present : M bool arrays (N, V) or None, optional
        Which views each row has (missing rows hold finite placeholders, e.g. 0): the loss masks the
        missing ones (:func:`total_loss`). None: every view everywhere.
    validation : M sample sets, optional
        Each member's validation samples, the same number for all: their loss is recorded every epoch.
    early_stopping : EarlyStopping, optional
        Stop on the validation loss (needs ``validation``); each member keeps its best epoch's heads.
    time_limit : float, optional
        Stop after the epoch during which this many seconds of training have passed.
    progress : bool, Progress or callable, optional
        A reporter (:mod:`training.progress`), a function of the epoch cap that makes one, or whether to
        show a bar; default: a bar when stderr is a terminal and not under CI.

    Returns
    -------
    list of Trained
        Per member, its heads (in eval mode, on the CPU) and its :class:`History`.
    """
    methods = [config.method] * len(seeds) if methods is None else list(methods)
    if not (len(views) == len(labels) == len(seeds) == len(methods)) or not seeds:
        raise ValueError(
            "need one views, labels, seed and method per member: "
            f"{len(views)}, {len(labels)}, {len(seeds)}, {len(methods)}"
        )
    if early_stopping is not None and validation is None:
        raise ValueError("early stopping needs validation data")
    fusion_methods: Method | list[Method] = methods[0] if len(set(methods)) == 1 else methods
    members = _initialised_members(views[0], num_classes, config=config, seeds=seeds)
    stacked = _StackedHeads(members)
    batches = _Batches(views, labels, seeds=seeds, rows=rows, present=present)
    weights = _member_class_weights(labels, rows, num_classes=num_classes, weighting=config.class_weighting)
    hp = config.hyperparameters
    # fused: one kernel per weight instead of a dozen small operations each, which dominate these small heads
    optimizer = torch.optim.Adam(stacked.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, fused=True)
    reporter = _reporter(progress, config.epochs)
    watch = _Watch(len(seeds), early_stopping, annealing_step=hp.annealing_step, time_limit=time_limit)
    every = 1 if early_stopping is None else early_stopping.every
    latest_validation = None  # the progress shows the last evaluated validation loss between evaluations
    for epoch in range(1, config.epochs + 1):
        started = time.perf_counter()
        train_loss = _train_epoch(
            stacked, batches, optimizer, epoch=epoch, methods=fusion_methods, config=config, weights=weights
        )
        last = epoch == config.epochs or watch.ends(epoch)
        validation_loss = (
            _validation_loss(stacked, validation, fusion_methods, config=config, weights=weights)
            if validation is not None and (epoch % every == 0 or last)
            else None
        )
        watch.record(epoch, stacked, train_loss, validation_loss, seconds=time.perf_counter() - started)
        if validation_loss is not None:
            latest_validation = float(np.mean(validation_loss))
        reporter.epoch(epoch, float(np.mean(train_loss)), latest_validation)
        if watch.stop(epoch):
            break
    reporter.close(stopped_early=watch.stopped_early)
    return watch.finish(stacked, members)


def _member_class_weights(
    labels: Sequence[np.ndarray],
    rows: Sequence[np.ndarray] | None,
    *,
    num_classes: int,
    weighting: ClassWeighting,
) -> torch.Tensor | None:
    """Per member, its classes' weights from its own training rows, (M, K); None where all weigh 1."""
    if weighting == "none":
        return None
    trained_on = [np.asarray(member if rows is None else member[rows[m]]) for m, member in enumerate(labels)]
    weights = [class_weights(member, num_classes=num_classes, weighting=weighting) for member in trained_on]
    return torch.as_tensor(np.stack(weights), dtype=torch.float32)


def _weighted(loss: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Each sample's loss, (M, B), times its class's weight (:func:`class_weights`)."""
    return loss if weights is None else loss * weights.gather(1, labels.long())


def _initialised_members(
    views: Sequence[np.ndarray], num_classes: int, *, config: TrainConfig, seeds: Sequence[int]
) -> list[EvidentialHeads]:
    """One freshly initialised model per seed, each drawn right after seeding torch with its seed."""
    members = []
    for seed in seeds:
        torch.manual_seed(seed)
        members.append(
            EvidentialHeads(
                [v.shape[1] for v in views],
                num_classes,
                hidden=config.hidden,
                activation=config.activation,
            )
        )
    return members


class _Batches:
    """The members' training data as stacked tensors, and each epoch's shuffled batches of it.

    Member m shuffles its rows with its own generator (seeded with ``seeds[m]``); the members' rows sit side
    by side in one flat tensor per view, so a batch is one ``index_select`` (faster than advanced
    indexing).
    """

    def __init__(
        self,
        views: Sequence[Sequence[np.ndarray]],
        labels: Sequence[np.ndarray],
        *,
        seeds: Sequence[int],
        rows: Sequence[np.ndarray] | None,
        present: Sequence[np.ndarray | None] | None,
    ) -> None:
        m, num_views = len(seeds), len(views[0])
        tensors = [_stacked_tensor([member[i] for member in views], np.float32) for i in range(num_views)]
        all_targets = _stacked_tensor(labels, np.int64)  # (M, N_all)
        n_all = all_targets.shape[1]
        self.row_index = (
            None if rows is None else torch.as_tensor(np.stack([np.asarray(r, np.int64) for r in rows]))
        )
        self.n = n_all if self.row_index is None else self.row_index.shape[1]
        self.masks = None
        if present is not None and any(p is not None and not p.all() for p in present):
            self.masks = _stacked_tensor(
                [np.ones((n_all, num_views), bool) if p is None else p for p in present], bool
            ).reshape(m * n_all, -1)
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.flat = [t.reshape(m * n_all, -1) for t in tensors]
        self.flat_targets = all_targets.reshape(-1)
        self.offsets = torch.arange(m)[:, None] * n_all
        self.m = m

    def shuffled(
        self, batch_size: int
    ) -> Iterator[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor | None]]:
        """One epoch's batches: per view ``(M, B, d_v)`` features, ``(M, B)`` labels, ``(M, B, V)`` mask."""
        m = self.m
        order = torch.stack([torch.randperm(self.n, generator=g) for g in self.generators])  # (M, N)
        for start in range(0, self.n, batch_size):
            batch = order[:, start : start + batch_size]  # (M, B)
            if self.row_index is not None:
                batch = self.row_index.gather(1, batch)
            picked = (batch + self.offsets).reshape(-1)
            b = batch.shape[1]
            yield (
                [t.index_select(0, picked).reshape(m, b, -1) for t in self.flat],
                self.flat_targets.index_select(0, picked).reshape(m, b),
                None if self.masks is None else self.masks.index_select(0, picked).reshape(m, b, -1),
            )


def _train_epoch(
    stacked: _StackedHeads,
    batches: _Batches,
    optimizer: torch.optim.Optimizer,
    *,
    epoch: int,
    methods: Method | list[Method],
    config: TrainConfig,
    weights: torch.Tensor | None,
) -> list[float]:
    """One pass over every member's training rows; each member's mean (class-weighted) loss over them."""
    hp = config.hyperparameters
    annealing = annealing_coefficient(epoch, hp.annealing_step)
    total = torch.zeros(batches.m, dtype=torch.float64)
    for inputs, labels, mask in batches.shuffled(config.batch_size):
        loss, _ = total_loss(
            stacked(inputs),  # (M, B, V, K)
            labels,
            method=methods,
            lam=config.lam,
            annealing=annealing,
            beta=config.beta,
            gamma=hp.gamma,
            mask=mask,
        )
        loss = _weighted(loss, labels, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.mean(-1).sum().backward()  # each member: the mean over its batch
        optimizer.step()
        total += loss.detach().sum(-1)
    return (total / batches.n).tolist()


class _Watch:
    """Per member, the epochs' losses and times, the best epoch on the validation loss and its weights;
    whether to stop early."""

    def __init__(
        self,
        m: int,
        early_stopping: EarlyStopping | None,
        *,
        annealing_step: int,
        time_limit: float | None,
    ) -> None:
        self.early_stopping = early_stopping
        self.annealing_step = annealing_step
        self.deadline = None if time_limit is None else time.perf_counter() + time_limit
        self.records = [_Record() for _ in range(m)]
        self.best = [math.inf] * m
        self.best_epoch = [0] * m
        self.best_state: list[dict[str, torch.Tensor] | None] = [None] * m
        self.epoch = 0
        self.stopped_early = False
        self.timed_out = False

    def record(
        self,
        epoch: int,
        stacked: _StackedHeads,
        train_loss: list[float],
        validation_loss: list[float] | None,
        *,
        seconds: float,
    ) -> None:
        self.epoch = epoch
        for i, record in enumerate(self.records):
            record.train_loss.append(train_loss[i])
            record.epoch_seconds.append(seconds)
            if validation_loss is not None:
                record.validation_epochs.append(epoch)
                record.validation_loss.append(validation_loss[i])
                if self.early_stopping is not None and validation_loss[i] < self.best[i]:
                    self.best[i], self.best_epoch[i] = validation_loss[i], epoch
                    self.best_state[i] = stacked.member_state(i)

    def stop(self, epoch: int) -> bool:
        """Whether every member has gone ``patience`` epochs without a better validation loss (never
        before the KL annealing is complete), or the time is up."""
        self.stopped_early = self._patience_spent(epoch)
        self.timed_out = not self.stopped_early and self._time_up()
        return self.stopped_early or self.timed_out

    def ends(self, epoch: int) -> bool:
        """Whether the run stops after ``epoch`` unless its validation loss is a new best: its last chance
        to be evaluated."""
        return self._patience_spent(epoch) or self._time_up()

    def _patience_spent(self, epoch: int) -> bool:
        return (
            self.early_stopping is not None
            and epoch >= self.annealing_step
            and all(epoch - best >= self.early_stopping.patience for best in self.best_epoch)
        )

    def _time_up(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def still_improving(self, m: int) -> bool:
        """Whether member ``m``'s best validation loss is within its last ``patience`` epochs."""
        return (
            self.early_stopping is not None
            and self.best_state[m] is not None
            and self.epoch - self.best_epoch[m] < self.early_stopping.patience
        )

    def finish(self, stacked: _StackedHeads, members: Sequence[EvidentialHeads]) -> list[Trained]:
        """Each member's best epoch's heads (its last without early stopping) and its history."""
        for i, state in enumerate(self.best_state):
            if state is not None:
                stacked.load_member_state(i, state)
        heads = stacked.unstack(members)
        return [
            Trained(
                heads=member,
                history=History(
                    epochs=self.epoch,
                    best_epoch=self.best_epoch[i] if self.best_state[i] is not None else self.epoch,
                    stopped_early=self.stopped_early,
                    train_loss=record.train_loss,
                    validation_loss=record.validation_loss,
                    validation_epochs=record.validation_epochs,
                    epoch_seconds=record.epoch_seconds,
                    timed_out=self.timed_out,
                    still_improving=self.still_improving(i),
                ),
            )
            for i, (member, record) in enumerate(zip(heads, self.records, strict=True))
        ]


def _stacked_tensor(arrays: Sequence[np.ndarray], dtype) -> torch.Tensor:
    """``(M, ...)`` tensor of M arrays; one array is viewed, not copied (large data is held once)."""
    if len(arrays) == 1:
        return torch.from_numpy(np.ascontiguousarray(arrays[0], dtype=dtype))[None]
    return torch.as_tensor(np.stack([np.asarray(a, dtype=dtype) for a in arrays]))


@dataclass
class _Record:
    train_loss: list[float] = field(default_factory=list)
    validation_loss: list[float] = field(default_factory=list)
    validation_epochs: list[int] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)


def _validation_loss(
    stacked: _StackedHeads,
    validation: Sequence[SampleSet],
    methods: Method | list[Method],
    *,
    config: TrainConfig,
    weights: torch.Tensor | None,
    batch_size: int = 4096,
) -> list[float]:
    """Each member's mean loss on its validation samples, the KL term fully annealed, each sample weighted
    as in training."""
    n = len(validation[0])
    if any(len(member) != n for member in validation):
        raise ValueError("every member needs the same number of validation samples")
    total = torch.zeros(len(validation), dtype=torch.float64)
    masked = any(member.present is not None and not member.present.all() for member in validation)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            chunks = [member.features(start, start + batch_size) for member in validation]
            inputs = [
                torch.as_tensor(np.stack([chunk[v] for chunk in chunks]).astype(np.float32, copy=False))
                for v in range(len(chunks[0]))
            ]
            labels = torch.as_tensor(
                np.stack([member.labels[start : start + batch_size] for member in validation])
            )
            mask = None
            if masked:
                mask = torch.as_tensor(
                    np.stack(
                        [
                            np.ones((len(labels[0]), len(inputs)), bool)
                            if member.present is None
                            else member.present[start : start + batch_size]
                            for member in validation
                        ]
                    )
                )
            loss, _ = total_loss(
                stacked(inputs),
                labels,
                method=methods,
                lam=config.lam,
                annealing=1.0,
                beta=config.beta,
                gamma=config.hyperparameters.gamma,
                mask=mask,
            )
            total += _weighted(loss, labels, weights).sum(-1)
    return (total / max(n, 1)).tolist()


def _reporter(progress: bool | Progress | Callable[[int], Progress] | None, total: int) -> Progress:
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    if isinstance(progress, bool):
        return ProgressBar(total) if progress else Silent()
    if callable(progress):  # a reporter has no __call__: this makes one for the epoch cap
        return progress(total)
    return progress


class _StackedLinear(nn.Module):
    """M linear layers applied to M inputs at once: ``(M, N, in) -> (M, N, out)``.

    Weights are stored ``(M, out, in)`` as in :class:`torch.nn.Linear`, and the weight gradient is computed
    as ``grad^T @ x`` (:class:`_BatchedLinear`): MKL's batched GEMM is faster in that layout, forward and
    for the weight gradient, than in the one autograd picks for ``baddbmm`` (docs/benchmarks.md).
    """

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]).contiguous())
        self.bias = nn.Parameter(torch.stack([layer.bias.detach()[None, :] for layer in layers]).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BatchedLinear.apply(x, self.weight, self.bias)


class _BatchedLinear(torch.autograd.Function):
    """``x @ weight^T + bias`` for (M, N, in), (M, out, in), (M, 1, out), with the fast gradient layouts."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias, x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x)
        return grad_x, grad_weight, grad.sum(1, keepdim=True)


class _StackedHeads(nn.Module):
    """M :class:`EvidentialHeads` of one architecture, trained together; :meth:`unstack` gives them back."""

    def __init__(self, members: Sequence[EvidentialHeads]) -> None:
        super().__init__()
        first = members[0]
        self.views = nn.ModuleList()
        for v, head in enumerate(first.heads):
            layers = [module for module in head.net if isinstance(module, nn.Linear)]
            stacked = nn.ModuleList(
                _StackedLinear([member.heads[v].net[2 * i] for member in members]) for i in range(len(layers))
            )
            self.views.append(stacked)
        self.activation = first.heads[0].activation

    def forward(self, views: Sequence[torch.Tensor]) -> torch.Tensor:
        logits = []
        for layers, x in zip(self.views, views, strict=True):
            for i, layer in enumerate(layers):
                x = layer(x)
                if i < len(layers) - 1:
                    x = torch.relu(x)
            logits.append(x)
        # One activation over every view's logits: its few operations per call, not per view.
        return evidence_activation(torch.stack(logits, dim=-2), self.activation)

    def member_state(self, m: int) -> dict[str, torch.Tensor]:
        """A copy of member ``m``'s weights (to restore with :meth:`load_member_state`)."""
        return {name: parameter[m].detach().clone() for name, parameter in self.named_parameters()}

    def load_member_state(self, m: int, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                parameter[m].copy_(state[name])

    def unstack(self, members: Sequence[EvidentialHeads]) -> list[EvidentialHeads]:
        """Copy the trained weights back into ``members`` (in eval mode) and return them."""
        with torch.no_grad():
            for m, member in enumerate(members):
                for v, layers in enumerate(self.views):
                    for i, layer in enumerate(layers):
                        linear = member.heads[v].net[2 * i]
                        linear.weight.copy_(layer.weight[m])
                        linear.bias.copy_(layer.bias[m, 0])
        return [member.eval() for member in members]


def predict_evidence(
    model: EvidentialHeads, views: Sequence[np.ndarray] | SampleSet, *, batch_size: int = 4096
) -> np.ndarray:
    """The heads' evidence for features ``views``: float32 array (N, V, K).

    ``views`` is a sequence of (N, d_v) arrays, or a sample set whose features are gathered a batch at a
    time (:class:`training.protocol.Samples`). Rows of missing views get evidence too (of their
    placeholder features): mask them in the fusion.
    """
    out = []
    gather = getattr(views, "features", None)
    n = len(views) if gather is not None else len(views[0])
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            if gather is None:
                chunk = [v[start : start + batch_size] for v in views]
            else:
                chunk = gather(start, start + batch_size)
            batch = [torch.as_tensor(np.asarray(v, dtype=np.float32)) for v in chunk]
            out.append(model(batch).numpy())
    if out:
        return np.concatenate(out)
    return np.zeros((0, len(model.heads), model.heads[0].net[-1].out_features), dtype=np.float32)
