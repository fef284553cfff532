"""One-run audit (Steinke, Nasr & Jagielski 2023): the ε lower bound against hand-computed
binomial values, its δ term, monotonicity, validity under the null, and the k-choice."""
import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from dpbert.privacy import one_run_audit as audit
from dpbert.privacy.one_run_audit import AuditInconsistencyError


def hand_pure_dp(r, v, beta):
    """Largest ε with P[Binomial(r, e^ε/(1+e^ε)) >= v] <= β, by root-finding in q directly."""
    q = optimize.brentq(lambda q: stats.binom.sf(v - 1, r, q) - beta, 0.5, 1 - 1e-15, xtol=1e-15)
    return math.log(q / (1 - q))


def test_all_correct_closed_form():
    # v = r: P[W' >= r] = q^r <= β  <=>  q <= β^(1/r)
    for r in (10, 100, 1000):
        q = 0.05 ** (1 / r)
        assert audit.epsilon_lower_bound(r, r) == pytest.approx(math.log(q / (1 - q)), abs=1e-6)
    assert audit.epsilon_lower_bound(100, 100) == pytest.approx(3.49297, abs=1e-4)
    assert audit.epsilon_lower_bound(10, 10) == pytest.approx(1.05187, abs=1e-4)  # q = 0.7411


@pytest.mark.parametrize("r,v,beta", [(20, 18, 0.05), (100, 80, 0.05), (1000, 700, 0.01), (50, 40, 0.1)])
def test_matches_binomial_tail_inversion(r, v, beta):
    eps = audit.epsilon_lower_bound(r, v, beta)
    assert eps == pytest.approx(hand_pure_dp(r, v, beta), abs=1e-6)
    assert audit.p_value(eps, r, v) == pytest.approx(beta, rel=1e-5)


@pytest.mark.parametrize("r,v", [(100, 50), (100, 30), (1, 0), (0, 0), (2, 1), (1000, 500)])
def test_no_better_than_chance_gives_zero(r, v):
    assert audit.epsilon_lower_bound(r, v) == 0.0
    assert audit.epsilon_lower_bound(r, v, delta=1e-5, m=max(r, 1)) == 0.0


def test_one_correct_guess_is_not_evidence():
    # r = v = 1: P = q <= 0.05 never holds for q >= 1/2
    assert audit.epsilon_lower_bound(1, 1) == 0.0
    # smallest all-correct r that rejects ε = 0 at 5%: 0.5^r <= 0.05  <=>  r >= 5
    assert audit.epsilon_lower_bound(4, 4) == 0.0
    assert audit.epsilon_lower_bound(5, 5) > 0.0


def test_monotonicity():
    r = 200
    bounds = [audit.epsilon_lower_bound(r, v) for v in range(100, 201, 10)]
    assert all(a < b for a, b in zip(bounds[1:-1], bounds[2:])) and bounds[0] == 0.0
    assert audit.epsilon_lower_bound(r, 170, beta=0.01) < audit.epsilon_lower_bound(r, 170, beta=0.05)
    pure = audit.epsilon_lower_bound(r, 170)
    approx_small = audit.epsilon_lower_bound(r, 170, delta=1e-6, m=1000)
    approx_big = audit.epsilon_lower_bound(r, 170, delta=1e-4, m=1000)
    assert approx_big < approx_small <= pure
    assert audit.epsilon_lower_bound(r, 170, delta=1e-5, m=100_000) < audit.epsilon_lower_bound(
        r, 170, delta=1e-5, m=1000)


def paper_delta_term(eps, r, v, delta, m):
    """The appendix's form: α = max_i P[v - i <= W' < v] / i, by explicit summation of pmfs."""
    q = 1 / (1 + math.exp(-eps))
    tail = sum(stats.binom.pmf(j, r, q) for j in range(v, r + 1))
    alpha, running = 0.0, 0.0
    for i in range(1, v + 1):
        running += stats.binom.pmf(v - i, r, q)
        alpha = max(alpha, running / i)
    return min(tail + 2 * m * delta * alpha, 1.0)


@pytest.mark.parametrize("eps,r,v,delta,m", [(1.0, 100, 80, 1e-5, 1000), (0.5, 50, 40, 1e-3, 200),
                                             (2.0, 300, 290, 1e-6, 10_000), (0.0, 10, 9, 0.01, 10)])
def test_p_value_delta_term_matches_the_paper(eps, r, v, delta, m):
    assert audit.p_value(eps, r, v, delta, m) == pytest.approx(paper_delta_term(eps, r, v, delta, m),
                                                               rel=1e-9, abs=1e-15)


def test_approximate_dp_bound_is_the_first_unrejected_epsilon():
    r, v, delta, m, beta = 100, 95, 1e-3, 1000, 0.05
    eps = audit.epsilon_lower_bound(r, v, beta, delta, m)
    assert 0 < eps < audit.epsilon_lower_bound(r, v, beta)
    assert audit.p_value(eps, r, v, delta, m) == pytest.approx(beta, rel=1e-4)
    grid = np.linspace(0, eps - 1e-6, 200)
    assert all(audit.p_value(e, r, v, delta, m) <= beta for e in grid)


def test_input_validation():
    with pytest.raises(ValueError, match="needs m"):
        audit.epsilon_lower_bound(10, 9, delta=1e-5)
    with pytest.raises(ValueError):
        audit.epsilon_lower_bound(10, 11)
    with pytest.raises(ValueError):
        audit.epsilon_lower_bound(10, 9, beta=0.0)
    with pytest.raises(ValueError):
        audit.epsilon_lower_bound(10, 9, delta=1e-5, m=5)


def test_audit_from_scores_counts_guesses():
    scores = [5, 4, 3, 2, 1, 0]
    included = [True, False, True, False, False, True]
    res = audit.audit_from_scores(scores, included, k_plus=2, k_minus=2)
    # "in": canaries 0 (in, right) and 1 (out, wrong); "out": 4 (out, right) and 5 (in, wrong)
    assert (res["r"], res["v"], res["m"]) == (4, 2, 6)
    assert res["epsilon_lower_bound"] == 0.0 and res["accuracy"] == 0.5
    np.testing.assert_array_equal(audit.guesses_from_scores(scores, 2, 2), [1, 1, 0, 0, -1, -1])
    # ties broken by index
    np.testing.assert_array_equal(audit.guesses_from_scores([1, 1, 1, 1], 1, 1), [1, 0, 0, -1])
    with pytest.raises(ValueError):
        audit.audit_from_scores(scores, included, 4, 3)


def test_perfectly_separated_scores():
    rng = np.random.default_rng(0)
    included = audit.draw_inclusion(400, rng)
    scores = np.where(included, 10.0, 0.0) + rng.normal(0, 0.1, size=400)
    n_in, n_out = included.sum(), (~included).sum()
    assert min(n_in, n_out) >= 100
    res = audit.audit_from_scores(scores, included, 100, 100)
    assert (res["r"], res["v"]) == (200, 200)
    assert res["epsilon_lower_bound"] == pytest.approx(audit.epsilon_lower_bound(200, 200))


def test_null_scores_give_a_valid_bound():
    """Scores independent of inclusion (a non-leaking model): ε̂ > 0 must happen w.p. <= β.
    Over 300 audits the count is ~ Binomial(300, <= 0.05): mean <= 15, sd <= 3.8."""
    rng = np.random.default_rng(1)
    positives = 0
    for _ in range(300):
        included = rng.random(200) < 0.5
        res = audit.audit_from_scores(rng.normal(size=200), included, 20, 20)
        positives += res["epsilon_lower_bound"] > 0
    assert positives <= 15 + 4 * 3.8


def test_randomized_response_at_known_epsilon():
    """A mechanism whose guesses are right w.p. e^ε/(1+e^ε), ε = 2 (exactly what ε-DP allows):
    the bound exceeds the truth in <= 5% of runs and is informative on average."""
    rng = np.random.default_rng(2)
    true_eps, r = 2.0, 1000
    q = special.expit(true_eps)
    bounds = np.array([audit.epsilon_lower_bound(r, int(rng.binomial(r, q))) for _ in range(200)])
    exceed = np.sum(bounds > true_eps)
    assert exceed <= 10 + 4 * math.sqrt(200 * 0.05 * 0.95)
    assert 1.6 < np.mean(bounds) < true_eps


def test_k_grid_and_union_bound():
    assert audit.default_k_grid(1000) == [(10, 0), (10, 10), (20, 0), (20, 20), (50, 0), (50, 50),
                                          (100, 0), (100, 100), (200, 0), (200, 200), (500, 0),
                                          (500, 500)]
    assert audit.default_k_grid(10, fractions=(0.01, 0.5)) == [(1, 0), (1, 1), (5, 0), (5, 5)]
    rng = np.random.default_rng(3)
    included = rng.random(500) < 0.5
    scores = included * 1.5 + rng.normal(size=500)
    candidates = [(25, 0), (50, 50), (100, 100)]
    best = audit.audit_best_of(scores, included, candidates, beta=0.06)
    each = [audit.audit_from_scores(scores, included, kp, km, beta=0.02) for kp, km in candidates]
    assert best["epsilon_lower_bound"] == max(e["epsilon_lower_bound"] for e in each) > 0
    assert best["beta"] == pytest.approx(0.02) and best["beta_total"] == 0.06
    # the price of choosing afterwards: never above the best single choice at the full β
    full = max(audit.audit_from_scores(scores, included, kp, km, beta=0.06)["epsilon_lower_bound"]
               for kp, km in candidates)
    assert best["epsilon_lower_bound"] < full


def test_assert_audit_consistent():
    audit.assert_audit_consistent(1.0, 2.0)
    audit.assert_audit_consistent(2.0, 2.0)
    audit.assert_audit_consistent({"epsilon_lower_bound": 0.0}, 0.5)
    with pytest.raises(AuditInconsistencyError, match="exceeds the accountant"):
        audit.assert_audit_consistent(2.5, 2.0)
    with pytest.raises(AuditInconsistencyError):
        audit.assert_audit_consistent({"epsilon_lower_bound": 3.0}, 1.0)
    with pytest.raises(AuditInconsistencyError):
        audit.assert_audit_consistent(float("nan"), 1.0)


def test_draw_inclusion_is_fair():
    # 4000 OS-CSPRNG coins: Binomial(4000, 1/2), sd ~31.6
    coins = audit.draw_inclusion(4000)
    assert coins.dtype == bool and abs(int(coins.sum()) - 2000) < 4 * 31.7
