"""f-DP one-run audit (dpbert.privacy.fdp_audit): jax_privacy's published values for its Gaussian
estimator, positive controls (an estimator that ignores abstentions, or reads the wrong tail of the
trade-off curve, misses those values), monotonicity, the DP-SGD curve against the accountant, and
the test of a DP-SGD claim on simulated honest and broken runs."""
import math

import numpy as np
import pytest
from scipy import special, stats

from dpbert.privacy import fdp_audit as F
from dpbert.privacy import whitebox_audit as wa

Q, T, SIGMA, DELTA = 192 / 7000, 50, 0.7832, 1e-5  # the demo's gradient release


# ------------------------------------------------------------------ jax_privacy's own test values
def deterministic_normal(mu, n):
    return stats.norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mu


def pareto(points):
    """jax_privacy ``_pareto_frontier``: the thresholds on the ROC's convex hull."""
    idx = np.arange(points.shape[0])
    while len(idx) > 2:
        d = np.diff(points[idx], axis=0)
        dominated = d[:-1, 1] * d[1:, 0] - d[1:, 1] * d[:-1, 0] <= 0
        if not dominated.any():
            break
        idx = idx[np.r_[True, ~dominated, True]]
    return idx


def scan_epsilon(ins, outs, significance, delta, objective=F.audit_objective):
    """jax_privacy ``CanaryScoreAuditor.epsilon_one_run_fdp`` (one-sided, Bonferroni over the hull's
    thresholds) with the f-DP test ``objective``."""
    th = np.concatenate((np.union1d(ins, outs), [np.inf]))
    fn = np.searchsorted(np.sort(ins), th, side="left")
    tn = np.searchsorted(np.sort(outs), th, side="left")
    keep = pareto(np.stack([fn, tn], 1))
    fn, tn = fn[keep], tn[keep]
    sig = significance / len(fn)
    tp, fp = fn[-1] - fn, tn[-1] - tn
    total, m = tp + fp, int(fn[-1] + tn[-1])
    prec = np.ones(total.size)
    ok = total > 0
    prec[ok] = 1 - stats.beta.ppf(1 - sig, fp[ok] + 1, np.maximum(total[ok] - fp[ok], 1e-300))
    prec[ok & (fp == total)] = 0.0
    best, best_q = 0.0, 0.5
    for i in np.argsort(-prec):
        if total[i] == 0 or tp[i] / total[i] <= best_q:
            continue
        eps = gdp_epsilon(m, int(total[i]), int(tp[i]), sig, delta, best, objective)
        if eps > best:
            best, best_q = eps, special.expit(eps)
    return best


def gdp_epsilon(m, n_guess, n_correct, sig, delta, eps_lo, objective):
    if objective is F.audit_objective:
        return F.epsilon_one_run_fdp(m, n_guess, n_correct, sig, delta, eps_lo)
    from scipy import optimize

    def g(eps):
        return objective(F._gaussian_at(float(eps), delta), m, n_guess, n_correct, sig)

    if g(eps_lo) <= 0:
        return eps_lo
    hi = max(1.0, 2 * eps_lo)
    while g(hi) > 0 and hi < 64:
        eps_lo, hi = hi, 2 * hi
    return optimize.brentq(g, eps_lo, hi, xtol=1e-6) if g(hi) <= 0 else hi


PUBLISHED = [(1, 2.164749), (2, 4.7218075), (4, 9.133752)]  # jax_privacy tests/auditing_test.py, n = 10⁴ a side


def matches_published(objective, cases):
    return all(scan_epsilon(deterministic_normal(s, 10_000), deterministic_normal(0, 10_000), 0.05, 1e-6,
                            objective) == pytest.approx(expected, rel=1e-5) for s, expected in cases)


@pytest.mark.slow
def test_the_port_reproduces_jax_privacys_published_values():
    assert matches_published(F.audit_objective, PUBLISHED)
    assert scan_epsilon(deterministic_normal(0, 1000), deterministic_normal(0, 1000), 0.05, 1e-6) == 0.0


def ignores_abstentions(b, m, n_guess, n_correct, significance):
    """Broken: treats the m − n_guess abstentions as if there were none (m := n_guess)."""
    return F.audit_objective(b, n_guess, n_guess, n_correct, significance)


def wrong_tail(b, m, n_guess, n_correct, significance):
    """Broken: the blow-up y ↦ 1 − f(y) read where its inverse f(1 − y) belongs."""
    return F.audit_objective(lambda y: 1.0 - b(1.0 - y), m, n_guess, n_correct, significance)


def refutes_noise_off_and_keeps_honest(objective, m=1000):
    """The white-box use: simulated ideal runs at the demo's (q, σ, T): the claim rejected without
    noise, kept with it (Bonferroni over the white-box grid)."""
    b, grid, rng = F.dpsgd_blow_up_inverse(SIGMA, Q, T), wa.whitebox_k_grid(m), np.random.default_rng(1)

    def rejected(factor):
        counts = wa.guess_counts(*wa.simulate_scores(m, Q, T, SIGMA, factor, rng), grid)
        return any(objective(b, m, r, v, 0.05 / len(counts)) > 0 for r, v in counts if r)

    return rejected(0.0) and not rejected(1.0)


def test_the_estimator_refutes_noise_off_and_keeps_honest_runs():
    assert refutes_noise_off_and_keeps_honest(F.audit_objective)


#: The guesses behind the shift-1 value: m = 20,000, 406 guesses, 379 right, at 0.05/386 (the
#: hull's 386 thresholds), as ``scan_epsilon`` finds them.
SHIFT_ONE = (20_000, 406, 379, 0.05 / 386, 1e-6)


def test_the_published_value_at_its_guesses():
    assert F.epsilon_one_run_fdp(*SHIFT_ONE) == pytest.approx(2.164749, rel=1e-5)


@pytest.mark.parametrize("broken", [ignores_abstentions, wrong_tail])
def test_a_broken_estimator_misses_the_published_value_at_its_guesses(broken):
    m, r, v, sig, delta = SHIFT_ONE
    assert gdp_epsilon(m, r, v, sig, delta, 0.0, broken) != pytest.approx(2.164749, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("broken", [ignores_abstentions, wrong_tail])
def test_a_broken_estimator_misses_the_published_values(broken):
    assert not matches_published(broken, PUBLISHED[:1])


# ------------------------------------------------------------------ properties
def test_gaussian_mu_inverts_the_gdp_delta():
    for eps, delta in ((1.0, 1e-5), (3.0, 1e-6), (0.1, 0.1)):
        mu = F.gaussian_mu(eps, delta)
        assert F.gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-6)
        assert F.gaussian_delta(eps, mu * 1.01) > delta
    b = F.gaussian_blow_up_inverse(1.0)
    assert b(0.5) == pytest.approx(stats.norm.cdf(-1.0)) and b(1e-9) < 1e-9


def test_the_bound_grows_with_correct_guesses_and_with_beta_and_is_zero_at_chance():
    m, r = 200, 50
    eps = [F.epsilon_one_run_fdp(m, r, v, 0.05, 1e-5) for v in (25, 35, 42, 50)]
    assert eps[0] == 0.0 and all(a < b for a, b in zip(eps, eps[1:]))
    assert F.epsilon_one_run_fdp(m, r, 42, 0.2, 1e-5) > eps[2] > F.epsilon_one_run_fdp(m, r, 42, 0.01, 1e-5)


def test_a_profile_built_curve_is_below_and_close_to_the_gaussian_curve():
    mu = 1.0
    eps = np.linspace(0, 38, 761)
    deltas = np.array([F.gaussian_delta(e, mu) for e in eps])
    exact, tabulated = F.gaussian_blow_up_inverse(mu), F.profile_blow_up_inverse(eps, deltas)
    for y in (1e-6, 1e-3, 0.05, 0.3, 0.7, 0.99):
        assert exact(y) * 0.98 - 1e-12 <= tabulated(y) <= exact(y) + 1e-12, y


def test_the_dpsgd_profile_bounds_the_accountants_epsilon_from_above_within_t_h():
    from dpbert.accounting.accountant import dpsgd_epsilon

    eps = np.linspace(0, 38, 3041)
    prof = F.dpsgd_privacy_profile(SIGMA, Q, T, eps)
    mine = eps[np.argmax(prof <= DELTA)]
    accountant = dpsgd_epsilon(SIGMA, Q, T, DELTA)
    assert accountant - 1e-3 <= mine <= accountant + T * F.LOSS_STEP + 0.0125
    assert np.all(np.diff(prof) <= 1e-12)  # δ(ε) decreases


def test_the_dpsgd_claim_is_kept_on_honest_runs_and_refuted_without_noise():
    m, grid = 1000, wa.whitebox_k_grid(1000)
    b = F.dpsgd_blow_up_inverse(SIGMA, Q, T)
    rng = np.random.default_rng(0)
    for _ in range(3):
        counts = wa.guess_counts(*wa.simulate_scores(m, Q, T, SIGMA, 1.0, rng), grid)
        assert not F.claim_rejected(b, m, counts, 0.05)
    counts = wa.guess_counts(*wa.simulate_scores(m, Q, T, SIGMA, 0.0, rng), grid)
    assert F.claim_rejected(b, m, counts, 0.05)
    # rejection is monotone in the claim: a weaker claim (less noise) is not rejected before a stronger one
    weaker = F.dpsgd_blow_up_inverse(SIGMA / 2, Q, T)
    assert all(weaker(y) <= b(y) + 1e-12 for y in (1e-4, 0.01, 0.2, 0.6))
    assert not F.claim_rejected(F.dpsgd_blow_up_inverse(0.2, Q, T), m, counts, 0.05)


def test_the_sigma_bound_brackets_the_claim():
    perfect = [(kp + km, kp + km) for kp, km in wa.whitebox_k_grid(1000)]
    sigma_hat = F.dpsgd_sigma_bound(1000, perfect, 0.05, 0.1, 10, 2.0, rtol=0.05)
    assert sigma_hat < 2.0 and F.claim_rejected(F.dpsgd_blow_up_inverse(sigma_hat, 0.1, 10), 1000, perfect, 0.05)
    chance = [(r, r // 2) for r, _ in perfect]
    assert F.dpsgd_sigma_bound(1000, chance, 0.05, 0.1, 10, 2.0) is None
    with pytest.raises(ValueError, match="n_correct"):
        F.audit_objective(F.gaussian_blow_up_inverse(1.0), 10, 20, 5, 0.05)
    assert math.isfinite(F.gaussian_mu(0.0, 1e-5))
