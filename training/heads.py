"""Per-view evidential heads: a small network per view whose non-negative output is Dirichlet evidence.

Paper section 3.4 and appendix B. The paper describes 2-layer fully connected heads with ReLU; the authors'
public code uses one linear layer per view. ``hidden`` chooses: ``()`` is the single linear layer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

Activation = Literal["exp", "softplus"]

EVIDENCE_CAP = 1e13
_LOG_CAP = math.log(EVIDENCE_CAP)


def capped_exp(x: torch.Tensor) -> torch.Tensor:
    """The paper's capped exponential ``f(x) = C / (1 + C e^-x)``, ``C = 1e13`` (appendix B).

    Behaves like ``e^x`` for small inputs and flattens at ``C``. Computed in log space as
    ``exp(log C - softplus(log C - x))``, which never overflows (``softplus(z) >= max(z, 0)``, so the exponent
    is at most ``min(log C, x)``).

    >>> [f"{value:.4g}" for value in capped_exp(torch.tensor([-30.0, 0.0, 1.0, 1e4])).tolist()]
    ['9.358e-14', '1', '2.718', '1e+13']
    """
    return torch.exp(_LOG_CAP - nn.functional.softplus(_LOG_CAP - x))


def evidence_activation(logits: torch.Tensor, activation: Activation) -> torch.Tensor:
    """Non-negative evidence from a head's last linear layer: the capped exponential or softplus."""
    return capped_exp(logits) if activation == "exp" else nn.functional.softplus(logits)


def head_weights(in_features: int, num_classes: int, *, hidden: Sequence[int] = ()) -> int:
    """How many weights (biases included) a :class:`ViewHead` of these sizes has.

    >>> head_weights(240, 10), head_weights(240, 10, hidden=(64,))
    (2410, 16074)
    """
    widths = [in_features, *hidden, num_classes]
    return sum((fan_in + 1) * fan_out for fan_in, fan_out in itertools.pairwise(widths))


class ViewHead(nn.Module):
    """One view's evidential classifier: ``(N, dim)`` features to ``(N, K)`` evidence >= 0.

    Parameters
    ----------
    in_features : int
        The view's feature dimension.
    num_classes : int
    hidden : sequence of int
        Hidden layer widths, each followed by ReLU; ``()`` is a single linear layer.
    activation : {"exp", "softplus"}
        The evidence activation: the capped exponential (DBF's choice) or softplus (the baselines').
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        hidden: Sequence[int] = (),
        activation: Activation = "exp",
    ) -> None:
        super().__init__()
        if activation not in ("exp", "softplus"):
            raise ValueError(f"unknown activation {activation!r}; expected 'exp' or 'softplus'")
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return evidence_activation(self.net(x), self.activation)


class EvidentialHeads(nn.Module):
    """One :class:`ViewHead` per view; maps the V views of a batch to evidence ``(N, V, K)``."""

    def __init__(
        self,
        view_dims: Sequence[int],
        num_classes: int,
        *,
        hidden: Sequence[int] = (),
        activation: Activation = "exp",
    ) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            ViewHead(dim, num_classes, hidden=hidden, activation=activation) for dim in view_dims
        )

    def forward(self, views: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(views) != len(self.heads):
            raise ValueError(f"expected {len(self.heads)} views, got {len(views)}")
        return torch.stack([head(x) for head, x in zip(self.heads, views, strict=True)], dim=-2)
