"""How training reports its epochs: a progress bar on a terminal, a line every few epochs elsewhere.

A reporter is told each epoch's training and validation loss (:meth:`Progress.epoch`); the bar (tqdm) shows
them with its ETA, the lines say the same in plain text for logs, CI and ``--quiet``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Protocol, TextIO

__all__ = ["Progress", "ProgressBar", "ProgressLines", "Reporters", "Silent", "progress_for"]


class Progress(Protocol):
    def epoch(self, epoch: int, train_loss: float, validation_loss: float | None) -> None: ...

    def close(self, *, stopped_early: bool = False) -> None: ...


class Silent:
    """Reports nothing."""

    def epoch(self, epoch: int, train_loss: float, validation_loss: float | None) -> None:
        pass

    def close(self, *, stopped_early: bool = False) -> None:
        pass


class ProgressBar:
    """A tqdm bar over the maximum number of epochs, with the losses; its ETA assumes no early stop."""

    def __init__(self, total: int, *, stream: TextIO | None = None, label: str | None = None) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=label, unit="epoch", dynamic_ncols=True, file=stream or sys.stderr)

    def epoch(self, epoch: int, train_loss: float, validation_loss: float | None) -> None:
        losses = {"loss": f"{train_loss:.4f}"}
        if validation_loss is not None:
            losses["val_loss"] = f"{validation_loss:.4f}"
        self._bar.set_postfix(losses, refresh=False)
        self._bar.update()

    def close(self, *, stopped_early: bool = False) -> None:
        self._bar.close()


class ProgressLines:
    """One line every ``every`` epochs (and at the last one): epoch, losses, time so far and at most left;
    after ``label``, where given."""

    def __init__(
        self, total: int, *, every: int | None = None, stream: TextIO | None = None, label: str | None = None
    ) -> None:
        self._total = total
        self._label = f"{label}: " if label else ""
        self._every = every or max(1, total // 20)
        self._stream = stream or sys.stderr
        self._started = time.perf_counter()
        self._last: tuple[int, float, float | None] | None = None
        self._written = False  # whether the last epoch's line is out

    def epoch(self, epoch: int, train_loss: float, validation_loss: float | None) -> None:
        self._last = (epoch, train_loss, validation_loss)
        self._written = False
        if epoch % self._every == 0 or epoch == self._total:
            self._write()

    def close(self, *, stopped_early: bool = False) -> None:
        if self._last is not None and (not self._written or stopped_early):
            self._write(stopped_early=stopped_early)

    def _write(self, *, stopped_early: bool = False) -> None:
        epoch, train_loss, validation_loss = self._last
        elapsed = time.perf_counter() - self._started
        line = f"{self._label}epoch {epoch}/{self._total}: loss {train_loss:.4f}"
        if validation_loss is not None:
            line += f", validation loss {validation_loss:.4f}"
        line += f", {_clock(elapsed)}"
        if stopped_early:
            line += ", stopped early: no better validation loss for a while"
        elif epoch < self._total:
            line += f", at most {_clock(elapsed / epoch * (self._total - epoch))} left"
        print(line, file=self._stream, flush=True)
        self._written = True


def progress_for(
    total: int, *, quiet: bool = False, bar: bool | None = None, label: str | None = None
) -> Progress:
    """The reporter for a run of at most ``total`` epochs: a bar on a terminal (not under CI, not ``quiet``),
    else lines. ``bar=False`` gives lines, ``bar=True`` a bar, whatever the terminal; ``label`` names the
    run."""
    if bar is None:
        bar = not quiet and sys.stderr.isatty() and not os.environ.get("CI")
    return ProgressBar(total, label=label) if bar else ProgressLines(total, label=label)


class Reporters:
    """Makes each training run's reporter (:func:`progress_for`), named for what that run trains.

    A fit trains several times (each candidate architecture, the cross-fitted models, the heads trained
    again), each run counting its epochs from 1 with its own time left: unnamed, a log reads as one run
    starting over, its time left far short of the fit's.

    Parameters
    ----------
    quiet : bool
        Lines instead of a bar, as :func:`progress_for`.
    label : str, optional
        The run's name, before each line (the bar's description).
    """

    def __init__(self, *, quiet: bool = False, label: str | None = None) -> None:
        self.quiet = quiet
        self.label = label

    def __call__(self, total: int) -> Progress:
        return progress_for(total, quiet=self.quiet, label=self.label)

    def labelled(self, label: str) -> Reporters:
        """Reporters like these for runs named ``label``."""
        return Reporters(quiet=self.quiet, label=label)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}:{seconds:02d}"
