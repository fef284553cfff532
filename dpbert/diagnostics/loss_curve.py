"""The loss curve a PretrainedModel carries: at most ``points`` (+ the last) of a run's per-step
losses, evenly strided, and the training step of each point (``schema.LOSS_CURVE_STEPS``), so the
report and the dashboard plot the curve against steps, not point indices. Plain Python."""
from __future__ import annotations

from typing import List


def _curve_indices(n: int, points: int) -> List[int]:
    """The indices ``loss_curve`` keeps of ``n`` values: all, or ``points`` evenly strided + the last."""
    if n <= points:
        return list(range(n))
    stride = n / points
    return [int(i * stride) for i in range(points)] + [n - 1]


def loss_curve(losses, points: int = 200) -> List[float]:
    """At most ``points`` (+ the last) losses, evenly strided, rounded for a property."""
    return [round(float(losses[i]), 5) for i in _curve_indices(len(losses), points)]


def curve_steps(n: int, first_step: int = 0, points: int = 200) -> List[int]:
    """The true training step of each point of ``loss_curve`` over ``n`` per-step values of a run
    that started at ``first_step`` (a resume's checkpoint step): value i is step first_step + i + 1.
    Stored as ``loss_curve_steps`` so the curve is plotted against steps, not point indices."""
    return [first_step + i + 1 for i in _curve_indices(n, points)]
