"""A DP count of the training units, for planning q and the steps when no public n is given.

q = B/n and steps = ceil(epochs·n/B) must not depend on the exact private n (the exact n of one
neighbouring dataset differs from the other's by one, and a q or a step count that moves with it is
a data-dependent choice the accountant does not see). When ``training.dataset_size`` (a public n)
is not configured, the trainer plans with a Gaussian count instead:

    n̂ = max(1, round(n + N(0, (σ_c·k)²)))

where adding or removing one unit changes n by at most k (k = 1 per tuple; k = max tuples per
patient for the patient unit), so n̂ is the Gaussian mechanism with noise multiplier σ_c —
``GaussianDpEvent(σ_c)`` — post-processed by rounding. Its record (``count_event``) is written with
the training record and composed by the accountant in the same ledger (and PLD) as the
vocabulary and the training steps. Every use downstream of n̂ (q, steps, the noise normaliser
q·n̂, canary probabilities) is post-processing.

A run with ``privacy.epsilon_budget`` set must use a public ``training.dataset_size`` instead: the
budget guard checks the ε before any private data is read, which it cannot do with n unknown.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import dp_accounting
import numpy as np

from dpbert.privacy import _checks
from dpbert.privacy.events import SCHEMA, dp_event_to_dict

DEFAULT_COUNT_NOISE = 20.0


def dp_count(exact: int, noise_multiplier: float, max_contributions: int = 1,
             rng: Optional[np.random.Generator] = None) -> int:
    """n̂ = max(1, round(exact + N(0, (σ_c·k)²))). ``rng`` None: OS entropy (tests pass one)."""
    sigma = _checks.positive("noise_multiplier", noise_multiplier)
    k = _checks.integer("max_contributions", max_contributions, 1)
    rng = rng if rng is not None else np.random.default_rng()
    return max(1, int(round(int(exact) + rng.normal(0.0, sigma * k))))


def count_event(noise_multiplier: float, released: int, unit: str = "tuple",
                max_contributions: int = 1) -> Dict[str, Any]:
    """The ledger record of one DP count (composed with the training records)."""
    sigma = _checks.positive("noise_multiplier", noise_multiplier)
    k = _checks.integer("max_contributions", max_contributions, 1)
    return {"schema": SCHEMA, "mechanism": "dp_count", "stage": "train",
            "event": dp_event_to_dict(dp_accounting.GaussianDpEvent(sigma)),
            "noise_multiplier": sigma, "released": int(released), "unit": unit, "max_contributions": k,
            "adjacency": "add_or_remove_one"}
