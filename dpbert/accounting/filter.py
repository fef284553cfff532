r"""The dataset's budget as a Rényi-DP filter committed at its first reservation (docs/privacy.md,
"The dataset's budget: a pinned filter").

Runs on one dataset are chosen adaptively (each after seeing the last one's results) and their
number is not fixed, so their ε are not composed with PLD: the budget is a FILTER. Feldman & Zrnic
(2021, Thm. 3.1): for a fixed order α and a fixed bound ρ_B, adaptively chosen mechanisms whose
Rényi divergences ρ_i(α) are known before each runs, run only while Σ ρ_i(α) ≤ ρ_B, give a
transcript that is (α, ρ_B)-RDP; any valid RDP → (ε, δ) conversion then applies, dp-accounting's
(Canonne, Kamath & Steinke 2020, Prop. 12) included. So the budget (ε_B, δ_c) becomes
ρ_B(α) = ε_B − log(1 − 1/α) + log(δ_c·α)/(α − 1) at an order committed in advance.

A committed SET of orders α_1..α_m with δ shares w_j (Σ w_j = 1) admits a run while SOME order
stays within ρ_B(α_j; ε_B, w_j·δ_c). Order by order: the stopped transcript of order j's own
filter is (α_j, ρ_B,j)-RDP; the final transcript equals the one of an order still within its
bound, so the hockey-stick divergence at e^{ε_B} is at most Σ_j (CKS bound of order j at w_j·δ_c)
= δ_c (docs/privacy.md writes the steps).

Levels (``--raise-budget``): the grid ε_k = ε_B·2^{k/2}, k = 0, 1, …, committed with the pin, δ^{(0)} = δ_c
and δ^{(k)} = δ_c·6/(π²k²) for k ≥ 1. The odometer reading is the smallest level whose filter
covers every entry; it holds at δ = Σ_{j≤k} δ^{(j)} (a union over the levels up to it).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from dpbert.accounting.epsilon import DEFAULT_ORDERS, rdp_at, rdp_to_epsilon

#: How many vocabulary histograms' threshold δ₂ the pinned pool holds, in units of the first one's.
THRESHOLD_POOL_HISTOGRAMS = 4
#: δ shares of a three-order commitment (the middle order is the first plan's best).
THREE_ORDER_SHARES = (0.25, 0.5, 0.25)
RULE = "rdp_filter/committed-orders"


def rho_budget(order: float, epsilon: float, delta: float) -> float:
    """ρ_B(α) = ε − log(1 − 1/α) + log(δ·α)/(α − 1): the Rényi bound whose dp-accounting
    conversion at δ is exactly ε."""
    return epsilon - math.log1p(-1.0 / order) + math.log(delta * order) / (order - 1.0)


def level_epsilon(epsilon: float, level: int) -> float:
    return float(epsilon) * 2.0 ** (level / 2.0)


def level_delta(delta_conversion: float, level: int) -> float:
    return float(delta_conversion) if level == 0 else float(delta_conversion) * 6.0 / (math.pi ** 2 * level ** 2)


def odometer_delta(delta_conversion: float, level: int) -> float:
    """δ of an odometer reading at ``level``: Σ_{j≤level} δ^{(j)}."""
    return sum(level_delta(delta_conversion, j) for j in range(level + 1))


@dataclasses.dataclass(frozen=True)
class Pin:
    """What the dataset's first reservation commits: the budget ε_B, the conversion's δ_c, the pool
    for the vocabulary thresholds' δ₂, the orders and their δ shares, and the current level."""
    epsilon: float
    delta_conversion: float
    threshold_pool: float
    orders: Tuple[float, ...]
    shares: Tuple[float, ...]
    level: int = 0

    def __post_init__(self):
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"the budget must be a finite ε > 0, got {self.epsilon!r}")
        if not 0 < self.delta_conversion < 1 or self.threshold_pool < 0:
            raise ValueError(f"bad δ of a pinned budget: δ_c {self.delta_conversion!r}, pool {self.threshold_pool!r}")
        if len(self.orders) != len(self.shares) or not self.orders or abs(sum(self.shares) - 1) > 1e-9 \
                or any(a <= 1.01 for a in self.orders) or any(w <= 0 for w in self.shares):
            raise ValueError(f"bad committed orders {self.orders!r} / δ shares {self.shares!r}")

    @property
    def delta(self) -> float:
        """The dataset's δ: the conversion's δ_c plus the thresholds' pool."""
        return self.delta_conversion + self.threshold_pool

    def budget_at(self, level: Optional[int] = None) -> float:
        return level_epsilon(self.epsilon, self.level if level is None else level)

    def rho_budgets(self, level: Optional[int] = None) -> Tuple[float, ...]:
        level = self.level if level is None else level
        delta = level_delta(self.delta_conversion, level)
        return tuple(rho_budget(a, self.budget_at(level), w * delta) for a, w in zip(self.orders, self.shares))

    def to_dict(self) -> Dict[str, Any]:
        return {"rule": RULE, "epsilon": self.epsilon, "delta": self.delta, "delta_conversion": self.delta_conversion,
                "threshold_pool": self.threshold_pool, "orders": list(self.orders), "delta_shares": list(self.shares),
                "level": self.level, "level_epsilon": self.budget_at()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Pin":
        if d.get("rule") != RULE:
            raise ValueError(f"unknown budget rule {d.get('rule')!r} (this dpbert knows {RULE})")
        return cls(float(d["epsilon"]), float(d["delta_conversion"]), float(d["threshold_pool"]),
                   tuple(float(a) for a in d["orders"]), tuple(float(w) for w in d["delta_shares"]),
                   int(d.get("level", 0)))


def best_order(event, epsilon: float, delta: float, orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    """The order at which the filter admits the most repetitions of ``event`` (the first plan):
    argmax_α ρ_B(α)/ρ(α) — equivalently, the order whose conversion is smallest for the k-fold
    composition of the plan that reaches the budget. Orders ≤ 1.01 are skipped (no conversion)."""
    usable = [a for a in orders if a > 1.01]
    curve = rdp_at(event, usable)
    scores = [(rho_budget(a, epsilon, delta) / r if r > 0 else math.inf, -a) for a, r in zip(usable, curve)]
    return usable[max(range(len(usable)), key=lambda i: scores[i])]


def committed_orders(event, epsilon: float, delta: float, count: int = 1) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """(orders, δ shares) to commit: the first plan's best order, or it and its neighbours at
    about ×2/3 and ×3/2 in dp-accounting's grid with shares ¼, ½, ¼."""
    alpha = best_order(event, epsilon, delta)
    if count == 1:
        return (alpha,), (1.0,)
    if count != 3:
        raise ValueError(f"the budget filter commits 1 or 3 orders, got {count}")
    usable = [a for a in DEFAULT_ORDERS if a > 1.01]
    low = min(usable, key=lambda a: abs(a - max(alpha * 2 / 3, 1.02)) + (1e9 if a >= alpha else 0))
    high = min(usable, key=lambda a: abs(a - alpha * 3 / 2) + (1e9 if a <= alpha else 0))
    return (low, alpha, high), THREE_ORDER_SHARES


def usage(event, pin: Pin, level: Optional[int] = None) -> Tuple[Tuple[float, float, float], ...]:
    """(α, ρ(α), ρ_B(α)) at each committed order of the pin, at ``level``."""
    curve = rdp_at(event, pin.orders) if event is not None else tuple(0.0 for _ in pin.orders)
    return tuple(zip(pin.orders, curve, pin.rho_budgets(level)))


def covers(event, pin: Pin, level: Optional[int] = None) -> bool:
    """The filter at ``level`` admits a ledger whose composed event is ``event``: some committed
    order is within its bound."""
    return any(rho <= bound for _, rho, bound in usage(event, pin, level))


def epsilon_at_orders(event, pin: Pin) -> float:
    """min_j conversion of ρ(α_j) at w_j·δ_c: the composed RDP ε at the committed orders (a figure
    to read; the guarantee is the filter's (ε_B, δ))."""
    if event is None:
        return 0.0
    curve = rdp_at(event, pin.orders)
    return min(rdp_to_epsilon(a, r, w * pin.delta_conversion) for a, r, w in zip(pin.orders, curve, pin.shares))


def odometer(event, pin: Pin) -> Optional[Dict[str, Any]]:
    """The smallest level ≤ the pin's whose filter covers ``event``: {level, epsilon, delta}
    (δ = Σ_{j≤level} δ^{(j)}); None when not even the current level covers it."""
    for level in range(pin.level + 1):
        if covers(event, pin, level):
            return {"level": level, "epsilon": pin.budget_at(level),
                    "delta": odometer_delta(pin.delta_conversion, level) + pin.threshold_pool}
    return None


def level_for(pin: Pin, epsilon: float) -> int:
    """The smallest grid level whose ε is ≥ ``epsilon`` (a raise never goes down)."""
    level = pin.level
    while pin.budget_at(level) < epsilon * (1 - 1e-12):
        level += 1
    return level
