"""ε of a dp-accounting event at δ: the one place dpbert asks dp-accounting for an ε.

``epsilon`` (memoised) is the PLD or RDP ε of an event; ``rdp_at`` is its Rényi curve at given
orders (what the dataset's budget filter composes, ``dpbert.accounting.filter``). Every other
module asks these two; tests/test_accounting_owner.py fails a ``get_epsilon`` call anywhere else.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import dp_accounting
from dp_accounting import pld as _pld
from dp_accounting import rdp as _rdp

from dpbert.privacy import _checks, mechanism_memo, pld_vectorized
from dpbert.privacy import histogram as _histogram

# dp-accounting's PLD construction with its per-ε Python loop vectorized (same formulas), and each
# mechanism's PLD / RDP curve built once per parameter set (the same values, bit for bit).
pld_vectorized.install()
mechanism_memo.install()

ACCOUNTANTS = ("pld", "rdp")
PLD_DISCRETIZATION = _histogram.PLD_DISCRETIZATION


def make_accountant(kind: str) -> dp_accounting.PrivacyAccountant:
    _checks.choice("accountant", kind, ACCOUNTANTS)
    if kind == "pld":
        return _pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    return _rdp.RdpAccountant()


def _gaussian_only(event: dp_accounting.DpEvent) -> Optional[float]:
    """Σ count/σ² over a composition made only of GaussianDpEvents (None if anything else)."""
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return math.inf if event.noise_multiplier == 0 else event.noise_multiplier ** -2
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = _gaussian_only(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [_gaussian_only(e) for e in event.events]
        return None if any(p is None for p in parts) else sum(parts)
    return None


#: Results by (repr of the event, δ, accountant): an event is a frozen value whose repr names every
#: field (floats exactly), and a PLD of a subsampled Gaussian takes seconds to build while plans,
#: guards, ledgers and reports ask for the same ε many times in one process.
_MEMO: Dict[tuple, object] = {}
_MEMO_SIZE = 4096


def _memo(key: tuple, compute):
    if key not in _MEMO:
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.clear()
        _MEMO[key] = compute()
    return _MEMO[key]


def epsilon(event: dp_accounting.DpEvent, delta: float, kind: str) -> float:
    """ε at δ of ``event`` by the ``kind`` accountant ("pld" or "rdp"), memoised."""
    return _memo((repr(event), float(delta), kind), lambda: _epsilon_uncached(event, delta, kind))


def _epsilon_uncached(event: dp_accounting.DpEvent, delta: float, kind: str) -> float:
    """For "pld", a composition of Gaussian mechanisms only (the vocabulary, shuffled DP-SGD) is one
    Gaussian mechanism with noise multiplier (Σ count/σᵢ²)^(−1/2) — its privacy loss distribution
    is exactly that Gaussian's — so its ε is evaluated in closed form (Balle & Wang 2018), the exact
    value the discretized PLD approximates from above (and which dp-accounting 0.4.3 takes seconds
    to reach for noise multipliers ≪ 1)."""
    if kind == "pld":
        weight = _gaussian_only(event)
        if weight is not None:
            if weight == 0:
                return 0.0
            if math.isinf(weight):
                return math.inf
            return _histogram.gaussian_epsilon(weight ** -0.5, delta, 1.0, method="analytic")
    accountant = make_accountant(kind)
    if not accountant.supports(event):
        raise ValueError(f"event is not supported by the {kind} accountant: {event}")
    return float(accountant.compose(event).get_epsilon(delta))


def rdp_at(event: dp_accounting.DpEvent, orders: Sequence[float]) -> Tuple[float, ...]:
    """The Rényi divergence ρ(α) of ``event`` at each of ``orders`` (dp-accounting's RDP
    accountant, memoised)."""
    orders = tuple(float(a) for a in orders)

    def compute():
        accountant = _rdp.RdpAccountant(orders=list(orders))
        if not accountant.supports(event):
            raise ValueError(f"event is not supported by the rdp accountant: {event}")
        return tuple(float(r) for r in accountant.compose(event)._rdp)  # noqa: SLF001 -- the curve itself

    return _memo((repr(event), orders, "rdp_curve"), compute)


def rdp_to_epsilon(order: float, rho: float, delta: float) -> float:
    """dp-accounting's RDP → (ε, δ) conversion at one order (Canonne, Kamath & Steinke 2020,
    Prop. 12: ε = ρ + log(1 − 1/α) − log(δα)/(α − 1))."""
    return float(_rdp.rdp_privacy_accountant.compute_epsilon([order], [rho], delta)[0])


DEFAULT_ORDERS: Tuple[float, ...] = tuple(float(a) for a in _rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
