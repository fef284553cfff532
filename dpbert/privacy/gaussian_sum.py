r"""A Gaussian sum of bounded per-unit values, with a Gaussian count: one release, its DP events.

Mechanism (``release``). Each privacy unit u (a patient; a tuple under ``privacy.unit: tuple``)
brings one value d_u, clipped to [−c, c]; n units are summed. Released:

    S̃ = Σ_u clip(d_u, −c, c) + N(0, (z_S·c)²)        and, when no public count is used,
    Ñ = n + N(0, z_N²).

Sensitivity, add/remove one unit u with everything else fixed — including the models the values
are computed with, which earlier releases produced (adaptive composition conditions on them): S
moves by clip(d_u) ∈ [−c, c], so |ΔS| ≤ c, and n by exactly 1. No other unit's value moves when
each d_v is a function of v's own rows and of public choices keyed by v's own records only (the
caller's contract, ``dpbert.evaluate.readout``). A broken clip breaks the first bound:
tests/evaluate/test_readout.py shows one unit moving an unclipped sum by far more than c.

Privacy. Divide each coordinate by its noise std: the pair becomes N(0, I) noise around
(S/(z_S·c), n/z_N), whose mean moves by a vector of norm ≤ μ = (z_S⁻² + z_N⁻²)^½ under add/remove.
A Gaussian mechanism of L2 sensitivity μ and unit noise is μ-GDP (Dong, Roth & Su 2022), whose
privacy loss distribution is GaussianDpEvent(1/μ)'s — and exactly what dp-accounting composes
from ComposedDpEvent([GaussianDpEvent(z_S), GaussianDpEvent(z_N)]) (the sum alone: μ = 1/z_S).
``records`` are those events in the ledger's Gaussian form (mechanism ``dp_count``: a Gaussian
mechanism on a sensitivity-1 statistic — S/c is one, with noise std z_S), stage ``readout``.
``split`` gives both halves the same share of μ² when a count is released.

Noise: ``np.random.default_rng()`` (OS entropy) unless a generator is passed (tests); the stds
(z·c, z) are data-independent and released with the values. This module computes no ε: the ε of
``records`` and the budget over them are ``dpbert.accounting``'s. Derivation also in
docs/privacy.md ("The readout of a model").
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from dpbert.privacy import _checks
from dpbert.privacy.count import count_event

STAGE = "readout"


def clip(values, bound: float) -> np.ndarray:
    """Every value clipped to [−bound, bound] (float64)."""
    c = _checks.positive("clip", bound)
    return np.clip(np.asarray(values, np.float64), -c, c)


def split(noise_multiplier: float, with_count: bool) -> Tuple[float, Optional[float]]:
    """(z_S, z_N) whose pair has the noise multiplier ``noise_multiplier`` (module docstring): the sum
    alone gets it; with a count each gets √2 times it (half of μ² each)."""
    z = _checks.positive("noise_multiplier", noise_multiplier)
    return (z * math.sqrt(2.0), z * math.sqrt(2.0)) if with_count else (z, None)


def combined(z_sum: float, z_count: Optional[float]) -> float:
    """1/μ: the one Gaussian noise multiplier equivalent to the pair (module docstring)."""
    mu2 = _checks.positive("z_sum", z_sum) ** -2
    if z_count is not None:
        mu2 += _checks.positive("z_count", z_count) ** -2
    return mu2 ** -0.5


def records(z_sum: float, z_count: Optional[float], unit: str) -> List[Dict[str, Any]]:
    """The release's DP event records for the dataset's ledger (module docstring)."""
    out = [dict(count_event(z_sum, 0, unit=unit), stage=STAGE, statistic="clipped_sum")]
    if z_count is not None:
        out.append(dict(count_event(z_count, 0, unit=unit), stage=STAGE, statistic="count"))
    return out


def release(values, bound: float, z_sum: float, z_count: Optional[float] = None,
            rng: Optional[np.random.Generator] = None) -> Dict[str, Any]:
    """``{"sum", "sum_std", "count", "count_std"}``: S̃ and its noise std z_S·c, and Ñ and z_N (None
    without ``z_count``). ``values``: one per unit, clipped here."""
    clipped = clip(values, bound)
    rng = rng if rng is not None else np.random.default_rng()
    sum_std = _checks.positive("z_sum", z_sum) * float(bound)
    out = {"sum": float(clipped.sum() + rng.normal(0.0, sum_std)), "sum_std": sum_std, "count": None,
           "count_std": None}
    if z_count is not None:
        out["count_std"] = _checks.positive("z_count", z_count)
        out["count"] = float(clipped.size + rng.normal(0.0, out["count_std"]))
    return out
