"""The one ε → σ solver: the smallest noise multiplier whose ε meets a target.

Every "which σ gives ε" question (``dpbert budget --target-epsilon`` for the training or the whole
run, ``accountant.noise_multiplier_for_target``, the benchmarks) is ``smallest_sigma`` over its own
ε(σ), which must not increase with σ. Search: from ``start``, bracket by factors of ``factor``,
then regula falsi (Illinois) on log ε(log σ), keeping the upper end — it meets the target at every
step — and return it rounded UP to 4 decimals (the σ printed is a σ that meets the target).
"""
from __future__ import annotations

import math
from typing import Callable, Dict

#: σ is not searched below this: if it already meets the target it is returned (valid, not minimal).
FLOOR = 1e-2
CEILING = 1e6


def round_up(sigma: float, digits: int = 4) -> float:
    """σ rounded UP to ``digits`` decimals."""
    scale = 10 ** digits
    return math.ceil(sigma * scale - 1e-9) / scale


def _bracket(gap: Callable[[float], float], start: float, factor: float):
    """(lo, hi) with gap(lo) > 0 ≥ gap(hi), or (None, hi) when hi = FLOOR already meets it."""
    hi = max(float(start), FLOOR)
    while gap(hi) > 0:
        hi *= factor
        if hi > CEILING:
            raise ValueError(f"no noise multiplier <= {CEILING:g} meets the target")
    lo = hi / factor
    while gap(lo) <= 0:
        if lo <= FLOOR:
            return None, FLOOR
        hi, lo = lo, max(lo / factor, FLOOR)
    return lo, hi


def smallest_sigma(epsilon_of: Callable[[float], float], target: float, start: float = 1.0,
                   rtol: float = 2e-4, factor: float = 1.25) -> float:
    """The smallest σ (within relative ``rtol``, rounded up to 4 decimals) with
    ``epsilon_of(σ) <= target``; ValueError when none up to ``CEILING`` does."""
    if not target > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target!r}")
    cache: Dict[float, float] = {}

    def gap(sigma: float) -> float:  # log(ε / target): ≤ 0 meets the target
        if sigma not in cache:
            eps = epsilon_of(sigma)
            cache[sigma] = math.inf if eps == math.inf else (math.log(eps / target) if eps > 0 else -math.inf)
        return cache[sigma]

    lo, hi = _bracket(gap, start, factor)
    if lo is None:
        return hi
    a, b, fa, fb, side = math.log(lo), math.log(hi), gap(lo), gap(hi), 0
    tol = math.log1p(rtol)
    while b - a > tol:
        x = b - fb * (b - a) / (fb - fa) if math.isfinite(fa) and math.isfinite(fb) and fa != fb else 0.5 * (a + b)
        x = min(max(x, a + tol / 2), b - tol / 2)  # a step next to the root closes the bracket on the next
        fx = gap(math.exp(x))
        if fx <= 0:
            b, fb = x, fx
            fa, side = (fa / 2 if side == -1 else fa), -1  # Illinois: the end kept twice has its value halved
        else:
            a, fa = x, fx
            fb, side = (fb / 2 if side == 1 else fb), 1
    sigma = round_up(math.exp(b))
    while gap(sigma) > 0:  # PLD's discretisation: never return a σ over the target
        sigma = round_up(sigma * (1 + rtol))
    return sigma
