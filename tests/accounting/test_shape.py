"""The shape planner (``dpbert.accounting.shape``): the chosen (B, T, σ) meets the target ε by an
independent dp-accounting call, it is the smallest σ/B an independently written brute-force search
finds on a finer grid, and ε does not depend on k (tuples per patient per step).

Cost: the PLD checks use one or two candidates in the σ ≳ 2 regime (≈ 1 s each); the searches
over many candidates use a closed-form Rényi accountant written here (Mironov, Talwar & Zhang
2019, integer orders), milliseconds per ε, injected as the planner's ``epsilon_of``.
"""
import math

import dp_accounting
import numpy as np
import pytest
from scipy.special import gammaln

from dpbert.accounting import shape

ORDERS = np.arange(2, 65)  # ε ≤ 3 at δ = 1e-5 is best at α ≈ 1 + log(1/δ)/ε ≤ 13
_A, _J = ORDERS[:, None], np.arange(0, ORDERS[-1] + 1)[None, :]
_LOG_BINOM = np.where(_J <= _A, gammaln(_A + 1) - gammaln(_J + 1) - gammaln(np.maximum(_A - _J, 0) + 1), -np.inf)


def rdp_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε at δ of ``steps`` Poisson-sampled Gaussian steps: the subsampled Gaussian's RDP at integer
    α, log Σ_j C(α, j)(1−q)^(α−j) q^j e^((j²−j)/(2σ²)) / (α − 1), composed over the steps and
    converted by ε = min_α RDP·T + log(1/δ)/(α − 1)."""
    log_q = np.log(q)
    log_1q = np.log1p(-q) if q < 1 else -np.inf
    with np.errstate(invalid="ignore"):
        terms = _LOG_BINOM + (_A - _J) * log_1q + _J * log_q + (_J * _J - _J) / (2 * sigma ** 2)
    terms = np.where(np.isnan(terms), -np.inf, terms)  # (1 − q)^0 at q = 1
    top = terms.max(axis=1, keepdims=True)
    rdp = (np.log(np.exp(terms - top).sum(axis=1)) + top[:, 0]) / (ORDERS - 1)
    return float(np.min(steps * rdp + math.log(1 / delta) / (ORDERS - 1)))


def _brute_sigma(target, q, steps, delta):
    lo, hi = 1e-2, 1e3
    while hi / lo > 1 + 1e-5:  # bisection on log σ: ε is non-increasing in σ
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if rdp_epsilon(mid, q, steps, delta) > target else (lo, mid)
    return hi


def brute_force(n, target, delta, budget, min_steps, k, max_steps):
    """T from min_steps to max_steps in steps of ⌈min_steps/16⌉ at the largest B that fits, and for
    the first few T nine B down to half of it: the (B, T, σ) with the smallest σ/B (σ by bisection on ``rdp_epsilon``)."""
    pairs = set()
    for steps in range(min_steps, max_steps + 1, max(1, min_steps // 16)):
        most = min(n, budget // (steps * k))
        sizes = range(max(1, most // 2), most + 1, max(1, most // 8)) if steps < min_steps + 3 else ()
        pairs |= {(b, steps) for b in set(sizes) | {most} if b >= 1}
    return min(((b, t, _brute_sigma(target, b / n, t, delta)) for b, t in pairs), key=lambda r: r[2] / r[0])


def _disagreements(plan, n, target, delta, budget, min_steps, k, max_steps):
    """Why ``plan`` is not the brute force's answer ([] when it is)."""
    b, t, sigma = brute_force(n, target, delta, budget, min_steps, k, max_steps)
    c, out = plan.chosen, []
    if c.batch_size * c.steps * k > budget or c.steps < min_steps:
        out.append(f"chosen {c.batch_size} x {c.steps} x {k} breaks the constraints")
    if (c.batch_size, c.steps) != (b, t):
        out.append(f"chosen {(c.batch_size, c.steps)}, brute force {(b, t)}")
    elif abs(c.sigma_accounted - sigma) > 1e-3 * sigma:
        out.append(f"σ {c.sigma_accounted} vs brute force {sigma}")
    return out


def _rdp_of(delta):
    return lambda sigma, q, steps: rdp_epsilon(sigma, q, steps, delta)


@pytest.mark.parametrize("n, target, budget, min_steps, k", [
    (30_000, 1.0, 480_000, 64, 1),   # σ ≳ 2 regime
    (7_000, 3.0, 40_000, 20, 2),     # σ < 2: a larger batch costs ε fast
])
def test_the_chosen_shape_is_the_brute_force_smallest_noise_batch_ratio(n, target, budget, min_steps, k):
    delta = 1e-5
    plan = shape.plan_shape(n, target, delta, budget, shape.ShapeGrid(min_steps, k), epsilon_of=_rdp_of(delta))
    assert _disagreements(plan, n, target, delta, budget, min_steps, k, max_steps=2 * min_steps) == []
    for alt in plan.alternatives:  # every row of the table: its σ is the bisection's at that (B, T)
        assert alt.epsilon <= target + 1e-12 and alt.batch_size * alt.steps * k <= budget
        assert alt.sigma_accounted == pytest.approx(_brute_sigma(target, alt.batch_size / n, alt.steps, delta), rel=1e-3)
    # Positive control: a planner that forgets k in the budget picks a batch k× too large — caught.
    if k > 1:
        broken = shape.plan_shape(n, target, delta, budget, shape.ShapeGrid(min_steps, 1), epsilon_of=_rdp_of(delta))
        assert _disagreements(broken, n, target, delta, budget, min_steps, k, max_steps=2 * min_steps)


def test_the_chosen_shape_meets_the_target_by_an_independent_dp_accounting_call():
    """n = 30,000, ε = 1, δ = 1e-5 (the reference table in docs/training.md): B = 7,500, T = 64
    needs σ = 7.646; dp-accounting's own PLD accountant, called here, gives ε within 1e-3 of 1."""
    n, target, delta = 30_000, 1.0, 1e-5
    plan = shape.plan_shape(n, target, delta, budget=480_000, grid=shape.ShapeGrid(64, steps_grid=(64,)))
    c = plan.chosen
    assert (c.batch_size, c.steps) == (7_500, 64)
    assert c.noise_multiplier == pytest.approx(7.646, abs=1e-3)

    def direct(sigma):
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(c.batch_size / n, dp_accounting.GaussianDpEvent(sigma)), c.steps)
        return dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(delta)

    assert target - 1e-3 <= direct(c.sigma_accounted) <= target
    assert direct(c.sigma_accounted * 0.98) > target  # positive control: 2 % less noise is caught


def test_epsilon_does_not_depend_on_k():
    """The plan's ε for k ∈ {1, 4, 16} (user-level: a patient's ≤ k tuples are ONE clipped unit) is
    one number: the training record's event is the same; so is the planner's choice for a budget k×
    larger. Positive control: example-level sampling with k tuples per patient (group privacy) has
    an event that depends on k. That a patient's k tuples are clipped as one unit is
    tests/model/test_patient_clipping.py::test_group_clipping_matches_brute_force."""
    from dpbert.accounting.accountant import dpsgd_epsilon
    from dpbert.config import load_config
    from dpbert.privacy import events
    from dpbert.privacy.plan import plan_for_config

    epsilons, recorded, plans, example_level = set(), set(), set(), set()
    for k in (1, 4, 16):
        config = load_config(None, [f"privacy.max_tuples_per_patient={k}", "training.steps=10"], preset="demo")
        plan = plan_for_config(config, config.training.dataset_patients)
        assert plan.max_contributions == k and plan.micro_batch_rows == plan.micro_batch * k
        record = events.dpsgd_event(0.8, plan.batch_size, plan.dataset_size, plan.steps, "poisson", k, unit="patient")
        assert record["max_contributions"] == k  # the record names k; its event does not hold it
        recorded.add(repr(events.accountable_event(record)))
        epsilons.add(dpsgd_epsilon(0.8, plan.sampling_probability, plan.steps, 1e-5, max_contributions=k,
                                   user_level=True))
        example_level.add(repr(events.dpsgd_dp_event(0.8, plan.sampling_probability, plan.steps, "poisson", k)))
        chosen = shape.plan_shape(30_000, 1.0, 1e-5, 100_000 * k, shape.ShapeGrid(20, k), epsilon_of=_rdp_of(1e-5)).chosen
        plans.add((chosen.batch_size, chosen.steps, chosen.sigma_accounted, chosen.noise_batch_ratio))
    assert len(recorded) == 1 and len(epsilons) == 1 and len(plans) == 1
    assert len(example_level) == 3


def test_candidates_keep_the_constraints():
    pairs = shape.candidate_shapes(n=1_000, budget=50_000, min_steps=40, k=4, multiple=8)
    assert pairs and all(t >= 40 and b <= 1_000 and b % 8 == 0 and b * t * 4 <= 50_000 for b, t in pairs)
    assert pairs[0] == (312, 40)  # ⌊50,000 / 160⌋ = 312, a multiple of 8
    assert len(pairs) <= shape.MAX_CANDIDATES
    capped = shape.candidate_shapes(n=100, budget=10 ** 9, min_steps=10, steps_grid=(10, 20))
    assert capped == [(100, 10), (100, 20)]  # B ≤ n: q ≤ 1
    grid = shape.candidate_shapes(n=10_000, budget=40_000, min_steps=10, steps_grid=(10, 5, 40),
                                  batch_grid=(500, 1_000, 5_000))
    assert grid == [(500, 10), (1_000, 10)] + [(500, 40), (1_000, 40)]
    with pytest.raises(ValueError, match="no shape fits.*T_min = 50"):
        shape.plan_shape(1_000, 1.0, 1e-5, budget=99, grid=shape.ShapeGrid(50, 2))


def test_the_budget_in_tuple_steps():
    assert shape.budget_tuple_steps(compute=1_000) == 1_000
    assert shape.budget_tuple_steps(seconds=3_600, tuples_per_second=12.5) == 45_000
    with pytest.raises(ValueError, match="exactly one"):
        shape.budget_tuple_steps(compute=5, seconds=5, tuples_per_second=1)
    with pytest.raises(ValueError, match="tuples_per_second"):
        shape.budget_tuple_steps(seconds=5)


def test_the_closed_form_renyi_accountant_agrees_with_dp_accounting():
    """The test's own accountant is an RDP accountant: dp-accounting's RDP at the same orders."""
    sigma, q, steps, delta = 1.3, 0.02, 50, 1e-5
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    theirs = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in ORDERS]).compose(event)
    rho = np.asarray(theirs._rdp)  # noqa: SLF001 -- the curve itself
    ours = rdp_epsilon(sigma, q, steps, delta)
    assert ours == pytest.approx(float(np.min(rho + math.log(1 / delta) / (ORDERS - 1))), rel=1e-6)
    assert theirs.get_epsilon(delta) <= ours  # dp-accounting converts with a tighter bound
