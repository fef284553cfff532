"""The shape of a DP-SGD run for a target ε: batch B, steps T and σ (k given) under a compute budget.

Rule (docs/training.md, "Choosing B, T and σ for an ε"): among the candidates with T ≥ T_min and
B·T·k ≤ the budget (patient-tuple-steps; seconds × a measured tuples/s), take the smallest σ/B,
σ being the smallest noise multiplier whose DP-SGD ε at δ meets the target (``solver.smallest_sigma``
over ``epsilon.epsilon`` of PoissonSampled(q = B/n, Gaussian(σ)) self-composed T times: the event of
a Poisson-sampled step per tuple and of a user-level step per patient alike). σ/B is the standard
deviation of the noise on the averaged clipped gradient, in units of C (McKenna et al. 2025, the
noise-batch ratio); σ/(B√T) is shown beside it: the noise left after T steps' averaging, which
Sander et al. 2023 ("TAN without a burn") show sets utility once σ ≳ 2, where ε is a function of
it alone. At a fixed B a longer run needs a larger σ, and along the budget's frontier B·T·k =
budget σ/B falls with T, so the rule spends the budget on the largest batch the fewest steps
allow — T_min stands for the optimisation progress σ/B does not see (a pilot: 640 patients × 60
steps trained worse than 256 × 150).

k (tuples per patient per step) is an input, not a choice: user-level sampling clips a patient's
summed gradient over ≤ k tuples to C, so q, σ and ε do not depend on k (``events.dpsgd_dp_event``,
Charles et al. 2024) — k only multiplies the compute of a step. σ/B alone would therefore always
pick k = 1; what a larger k buys (a less noisy per-patient gradient, more of the corpus per step) is
not in σ/B, so the planner spends the budget for the k it is given.

σ here is the ACCOUNTED σ_eff (gradient and DP diagnostics composed, ``accounting.sigma``):
``sigma_scale`` = σ_eff per unit of ``training.noise_multiplier`` (1 without diagnostics) turns it
into the σ a configuration sets. ``dpbert budget --target-epsilon E --compute N`` prints the table.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Optional, Sequence, Tuple

from dpbert.accounting import solver as _solver
from dpbert.accounting.epsilon import epsilon as _epsilon
from dpbert.privacy import _checks
from dpbert.privacy import events as _events
from dpbert.privacy import histogram as _histogram

#: Default T_min: between the pilot's worse (60) and better (150) step counts. An optimisation
#: heuristic, not a privacy number.
DEFAULT_MIN_STEPS = 100
#: Default candidates: T_min × 2^(i/2), at most this many (each is one σ solve, ≈ 2-6 s of PLD).
MAX_CANDIDATES = 8

EpsilonOf = Callable[[float, float, int], float]  # (σ, q, T) -> ε at the plan's δ


@dataclasses.dataclass(frozen=True)
class Shape:
    """One candidate: B units (patients or tuples) per step, T steps, k tuples per unit."""

    batch_size: int
    steps: int
    k: int
    sigma_accounted: float   # σ_eff: what the accountant charges
    noise_multiplier: float  # σ = σ_eff / sigma_scale rounded up (4 decimals): training.noise_multiplier
    epsilon: float           # ε at δ of (σ_eff, q = B/n, T)
    tuple_steps: int         # B·T·k
    seconds: Optional[float] = None  # B·T·k / tuples per second, when a rate is given

    @property
    def noise_batch_ratio(self) -> float:
        """σ/B: the noise's std on the averaged clipped gradient, in units of C."""
        return self.noise_multiplier / self.batch_size

    @property
    def noise_over_steps(self) -> float:
        """σ/(B√T)."""
        return self.noise_batch_ratio / math.sqrt(self.steps)

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), noise_batch_ratio=self.noise_batch_ratio,
                    noise_over_steps=self.noise_over_steps)


@dataclasses.dataclass(frozen=True)
class ShapePlan:
    """The chosen shape, every candidate weighed (chosen included, by T) and the inputs."""

    chosen: Shape
    alternatives: Tuple[Shape, ...]
    dataset_size: int
    target_epsilon: float
    delta: float
    budget: int
    min_steps: int

    def to_dict(self) -> dict:
        return {"chosen": self.chosen.to_dict(), "alternatives": [a.to_dict() for a in self.alternatives],
                "dataset_size": self.dataset_size, "target_epsilon": self.target_epsilon, "delta": self.delta,
                "budget_tuple_steps": self.budget, "min_steps": self.min_steps}


def budget_tuple_steps(compute: Optional[int] = None, seconds: Optional[float] = None,
                       tuples_per_second: Optional[float] = None) -> int:
    """The budget in tuple-steps: ``compute`` as given, or ⌊seconds × tuples_per_second⌋."""
    if (compute is None) == (seconds is None):
        raise ValueError("give exactly one of compute (tuple-steps) and seconds")
    if compute is not None:
        return _checks.integer("compute", compute, 1)
    rate = _checks.positive("tuples_per_second", tuples_per_second)
    return max(1, int(math.floor(_checks.positive("seconds", seconds) * rate)))


def candidate_shapes(n: int, budget: int, min_steps: int, k: int = 1, steps_grid: Optional[Sequence[int]] = None,
                     batch_grid: Optional[Sequence[int]] = None, multiple: int = 1) -> List[Tuple[int, int]]:
    """(B, T) pairs with T ≥ min_steps, 1 ≤ B ≤ n, B a multiple of ``multiple`` and B·T·k ≤ budget.
    ``steps_grid`` (default T_min × 2^(i/2), :data:`MAX_CANDIDATES` of them); for each T every B of
    ``batch_grid`` that fits, or without one the largest B that fits (the budget's frontier)."""
    n, budget = _checks.integer("n", n, 1), _checks.integer("budget", budget, 1)
    min_steps, k = _checks.integer("min_steps", min_steps, 1), _checks.integer("k", k, 1)
    multiple = _checks.integer("multiple", multiple, 1)
    if steps_grid is None:
        steps_grid = sorted({int(round(min_steps * 2 ** (i / 2))) for i in range(MAX_CANDIDATES)})
    out = []
    for steps in sorted({_checks.integer("steps", t, 1) for t in steps_grid}):
        if steps < min_steps:
            continue
        most = min(n, budget // (steps * k)) // multiple * multiple
        sizes = [most] if batch_grid is None else [b for b in batch_grid if b <= most and b % multiple == 0]
        out.extend((int(b), steps) for b in sorted(set(sizes)) if b >= 1)
    return out


def _start(target_epsilon: float, delta: float, q: float, steps: int, refine: bool) -> float:
    """A first σ for the search: the Gaussian of the same total noise, σ ≈ q·√T·σ_G (Sander et al.
    2023: close once σ ≳ 2, an underestimate below), σ_G from the analytic Gaussian's ε. Below 2,
    with ``refine``, RDP's σ instead (cheap evaluations, an upper bound on PLD's: the PLD search
    then brackets it in a few steps down instead of many up)."""
    sigma_g = _solver.smallest_sigma(lambda s: _histogram.gaussian_epsilon(s, delta, 1.0, "analytic"),
                                     target_epsilon, 1.0, rtol=1e-3, factor=2.0)
    start = max(q * math.sqrt(steps) * sigma_g, _solver.FLOOR)
    if refine and start < 2.0:
        rdp = accounted_epsilon(delta, "rdp")
        start = _solver.smallest_sigma(lambda s: rdp(s, q, steps), target_epsilon, start, rtol=1e-2, factor=2.0)
    return start


def accounted_epsilon(delta: float, accountant: str = "pld") -> EpsilonOf:
    """ε(σ, q, T) of T Poisson-sampled Gaussian steps at ``delta`` (``epsilon.epsilon``, memoised)."""
    def of(sigma: float, q: float, steps: int) -> float:
        event = _events.dpsgd_dp_event(sigma, q, steps, "poisson", 1, user_level=True)
        return _epsilon(event, delta, accountant)
    return of


def shape_of(n: int, batch_size: int, steps: int, k: int, target_epsilon: float, delta: float,
             epsilon_of: Optional[EpsilonOf] = None, sigma_scale: float = 1.0,
             tuples_per_second: Optional[float] = None) -> Shape:
    """The candidate (B, T) with its smallest σ meeting ``target_epsilon`` (``epsilon_of`` default:
    :func:`accounted_epsilon`, PLD)."""
    q = batch_size / n
    start = _start(target_epsilon, delta, q, steps, refine=epsilon_of is None)
    epsilon_of = epsilon_of or accounted_epsilon(delta)
    sigma = _solver.smallest_sigma(lambda s: epsilon_of(s, q, steps), target_epsilon, start, factor=1.15)
    work = batch_size * steps * k
    # σ_eff is linear in σ: rounded UP, the σ a configuration sets is charged at least σ_eff.
    gradient_sigma = sigma if sigma_scale == 1.0 else _solver.round_up(sigma / sigma_scale)
    return Shape(batch_size=batch_size, steps=steps, k=k, sigma_accounted=sigma,
                 noise_multiplier=gradient_sigma, epsilon=epsilon_of(sigma, q, steps), tuple_steps=work,
                 seconds=None if tuples_per_second is None else work / tuples_per_second)


@dataclasses.dataclass(frozen=True)
class ShapeGrid:
    """The candidates :func:`plan_shape` searches (:func:`candidate_shapes`' arguments after ``n``
    and ``budget``): T ≥ ``min_steps``, ``k`` tuples per unit per step, B a multiple of
    ``multiple``, optional explicit ``steps_grid`` / ``batch_grid``."""
    min_steps: int = DEFAULT_MIN_STEPS
    k: int = 1
    steps_grid: Optional[Sequence[int]] = None
    batch_grid: Optional[Sequence[int]] = None
    multiple: int = 1


def plan_shape(n: int, target_epsilon: float, delta: float, budget: int, grid: ShapeGrid = ShapeGrid(),
               sigma_scale: float = 1.0, tuples_per_second: Optional[float] = None,
               epsilon_of: Optional[EpsilonOf] = None) -> ShapePlan:
    """The shape with the smallest σ/B among :func:`candidate_shapes` over ``grid`` (ties: fewer
    tuple-steps, then more steps). ``n``: the public units the plan samples from (after the
    holdout); ``budget`` in tuple-steps (:func:`budget_tuple_steps`); ``epsilon_of`` default: PLD
    at ``delta``. ValueError (naming the inputs) when no candidate fits the budget."""
    min_steps, k, multiple = grid.min_steps, grid.k, grid.multiple
    target_epsilon = _checks.positive("target_epsilon", target_epsilon)
    delta = _checks.probability("delta", delta)
    sigma_scale = _checks.positive("sigma_scale", sigma_scale)
    pairs = candidate_shapes(n, budget, min_steps, k, grid.steps_grid, grid.batch_grid, multiple)
    if not pairs:
        raise ValueError(f"no shape fits: the compute budget {budget:,} tuple-steps is below T_min = {min_steps} "
                         f"steps × k = {k} × {multiple} unit(s) (the smallest batch); raise the budget or "
                         f"lower the minimum steps")
    shapes = tuple(shape_of(n, b, t, k, target_epsilon, delta, epsilon_of, sigma_scale, tuples_per_second)
                   for b, t in pairs)
    chosen = min(shapes, key=lambda s: (s.noise_batch_ratio, s.tuple_steps, -s.steps))
    return ShapePlan(chosen=chosen, alternatives=shapes, dataset_size=n, target_epsilon=target_epsilon,
                     delta=delta, budget=budget, min_steps=min_steps)
