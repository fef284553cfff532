"""The vocabulary mechanism: threshold, (ε, δ), and the mechanism itself."""
import math

import numpy as np
import pytest
from scipy import special, stats

from dpbert.privacy import histogram as H

SIGMA, DELTA, N = 200.0, 1e-9, 256


# ------------------------------------------------------------------------------ threshold

def test_threshold_known_values():
    # Full δ on the threshold (the paper's Corollary 1 with Φ⁻¹): 1 + σ√2·erf⁻¹(1 − 2δ/N).
    c = H.threshold_for(SIGMA, DELTA, N)
    assert c == pytest.approx(1369.389, abs=1e-3)
    assert c == pytest.approx(1 + SIGMA * math.sqrt(2) * special.erfinv(1 - 2 * DELTA / N), abs=1e-3)
    # δ/2 on the threshold (Google's split): 1389.1.
    assert H.threshold_for(SIGMA, DELTA / 2, N) == pytest.approx(1389.106, abs=1e-3)
    # The paper's printed formula drops the √2.
    paper = H.threshold_for(SIGMA, DELTA, N, mode="paper")
    assert paper == pytest.approx(982.54, abs=1e-2)
    assert paper == pytest.approx(1 + SIGMA * special.erfinv(1 - DELTA / N), abs=1e-3)


@pytest.mark.parametrize("sigma,delta,n,m", [(200, 1e-9, 256, 1), (4, 1e-6, 256, 1), (1, 0.04, 4, 1),
                                             (200, 1e-9, 256, 8), (10, 1e-5, 16, 3)])
def test_threshold_tail_is_delta_over_mn(sigma, delta, n, m):
    c = H.threshold_for(sigma, delta, n, max_contributions=m)
    # A fresh word has count ≤ m: it survives iff count + Z ≥ C, probability ≤ P[Z ≥ C − m].
    tail = stats.norm.sf(c - m, scale=sigma)
    assert tail == pytest.approx(delta / (m * n), rel=1e-9)
    assert H.threshold_tail_per_word(sigma, c, m) == pytest.approx(tail, rel=1e-12)
    assert H.actual_threshold_delta(sigma, c, n, m) == pytest.approx(delta, rel=1e-9)
    # A fresh word with a smaller count survives even less often.
    assert stats.norm.sf(c - 1, scale=sigma) <= tail * (1 + 1e-12)


def test_paper_threshold_real_delta():
    paper = H.threshold_for(SIGMA, DELTA, N, mode="paper")
    tail = H.threshold_tail_per_word(SIGMA, paper)
    assert tail == pytest.approx(stats.norm.sf((paper - 1) / SIGMA), rel=1e-12)
    assert tail == pytest.approx(4.61e-7, rel=1e-2)
    real = H.actual_threshold_delta(SIGMA, paper, N)
    assert real == pytest.approx(1.18e-4, rel=1e-2)        # 10⁵ × the claimed 1e-9
    report = H.histogram_report(SIGMA, DELTA, N, threshold_mode="paper")
    assert report["threshold"] == pytest.approx(982.54, abs=1e-2)
    assert report["delta_actual"] == pytest.approx(real, rel=1e-12)
    assert report["delta_claimed"] == DELTA
    assert 1e-4 < report["delta"] <= real                     # true total δ, not the claimed one
    assert "erf" in report["warning"] and "1369.4" in report["warning"]
    assert report["epsilon_split"] == math.inf                # the threshold alone exceeds δ
    assert H.histogram_epsilon(SIGMA, DELTA, paper, N) == math.inf


# ---------------------------------------------------------------------------- ε of parts

def test_epsilon_classic():
    eps = H.epsilon_classic(SIGMA, DELTA, N)
    assert eps == pytest.approx(16 / 200 * math.sqrt(2 * math.log(1.25e9)), rel=1e-12)
    assert eps == pytest.approx(0.518, abs=5e-4)
    assert H.histogram_report(SIGMA, DELTA, N)["epsilon_classic_valid"] is True
    assert H.histogram_report(4.0, 1e-6, N)["epsilon_classic_valid"] is False   # ε ≈ 21


def test_gaussian_epsilon_pld_analytic_and_pydp():
    from pydp.algorithms import numerical_mechanisms as pydp_mech

    eps_half = H.gaussian_epsilon(SIGMA, DELTA / 2, 16.0)
    assert eps_half == pytest.approx(0.434, abs=5e-4)
    assert H.gaussian_epsilon(SIGMA, DELTA / 2, 16.0, method="analytic") == pytest.approx(eps_half, abs=1e-4)
    eps_full = H.gaussian_epsilon(SIGMA, DELTA, 16.0, method="analytic")
    assert eps_full == pytest.approx(0.4242, abs=1e-4)
    assert H.gaussian_epsilon(SIGMA, DELTA, 16.0) == pytest.approx(eps_full, abs=1e-4)
    # Inverse of each other.
    assert H.gaussian_delta(eps_full, SIGMA, 16.0) == pytest.approx(DELTA, rel=1e-6)
    # Oracle: Google's DP library calibrates σ = 200.0 for (0.434, 5e-10, Δ = 16); its σ search is
    # conservative (σ ≥ exact), so the exact ε at σ = 200 is ≤ 0.434.
    assert pydp_mech.GaussianMechanism(0.434, DELTA / 2, 16.0).std == pytest.approx(200.0, rel=1e-3)
    assert eps_half <= 0.434


# ------------------------------------------------------------------------------ the report

def test_report_default_is_paper_corollary_with_true_total_delta():
    r = H.histogram_report(SIGMA, DELTA, N)
    assert r["threshold"] == pytest.approx(1369.389, abs=1e-3)
    assert r["threshold_delta_fraction"] == 1.0
    assert r["delta"] == DELTA                                # total δ of the released histogram
    assert r["delta_threshold"] == pytest.approx(DELTA, rel=1e-9)
    assert r["threshold_tail_per_word"] == pytest.approx(stats.norm.sf(r["threshold"] - 1, scale=SIGMA))
    assert r["epsilon"] == pytest.approx(0.4242, abs=1e-4)
    # The claimed (ε, δ) satisfies the per-configuration bound.
    assert H.histogram_delta(r["epsilon"], SIGMA, r["threshold"], N) <= DELTA
    assert r["delta_gaussian"] == pytest.approx(DELTA, rel=1e-6)
    assert r["epsilon_split"] == math.inf and r["delta_gaussian_split"] == 0.0
    assert (r["sensitivity_l2"], r["noise_multiplier"], r["unit"], r["max_contributions"]) == \
        (16.0, 12.5, "tuple", 1)
    for key in ("sigma", "tuple_words", "threshold_mode", "epsilon_classic", "sensitivity_linf"):
        assert key in r


def test_report_google_split_matches_pydp():
    from pydp.algorithms import partition_selection as ps

    r = H.histogram_report(SIGMA, DELTA, N, threshold_delta_fraction=0.5)
    strategy = ps.create_partition_strategy("gaussian", 0.434, DELTA, N)
    assert r["threshold"] == pytest.approx(strategy.threshold, abs=1e-3)      # 1389.1
    assert r["threshold"] == pytest.approx(1389.106, abs=1e-3)
    assert r["epsilon_split"] == pytest.approx(0.434, abs=5e-4)
    assert r["delta_gaussian_split"] == pytest.approx(DELTA / 2)
    assert r["delta_threshold"] == pytest.approx(DELTA / 2, rel=1e-9)
    assert r["delta"] == DELTA
    # Same keep probabilities as the library's Gaussian partition selection (same σ, same C).
    for count in (1, 1000, 1389, 1500):
        assert stats.norm.sf(r["threshold"] - count, scale=SIGMA) == pytest.approx(
            strategy.probability_of_keep(count), rel=1e-6, abs=1e-15)
    # The per-configuration bound is never worse than the split.
    assert r["epsilon"] <= r["epsilon_split"]
    assert r["epsilon"] == pytest.approx(0.4242, abs=1e-4)


def test_joint_bound_structure():
    c = H.threshold_for(SIGMA, DELTA, N)
    p = H.threshold_tail_per_word(SIGMA, c)
    for eps in (0.3, 0.4242, 0.6):
        joint = H.histogram_delta(eps, SIGMA, c, N)
        assert joint >= H.gaussian_delta(eps, SIGMA, 16.0)           # ℓ = 0: all words present
        assert joint >= -math.expm1(N * math.log1p(-p))              # ℓ = N: all words fresh
        assert joint <= H.gaussian_delta(eps, SIGMA, 16.0) + N * p   # the split (union) bound
    eps = H.histogram_epsilon(SIGMA, 2e-9, c, N)
    assert H.histogram_delta(eps, SIGMA, c, N) <= 2e-9
    assert H.histogram_delta(eps - 1e-6, SIGMA, c, N) > 2e-9          # smallest such ε


def _exact_delta_one_word(eps, sigma, c_thr, count, fresh, p):
    """Exact max(H(Q‖P), H(P‖Q)) for the mechanism on a neighbouring pair with ONE existing word
    (count ``count`` in D, count + 1 in D'; None for no existing word) and ``fresh`` fresh words,
    from the closed form of the thresholded 1-D Gaussian (atom at 'not released' + density)."""
    a = math.exp(eps)
    pf = -math.expm1(fresh * math.log1p(-p))
    if count is None:
        return max(pf, max(0.0, 1 - a * (1 - pf)))
    sf = lambda x: stats.norm.sf(x / sigma)  # noqa: E731
    atom_p, atom_q = 1 - sf(c_thr - count), 1 - sf(c_thr - count - 1)
    # H(Q‖P) = pf + sup_A (1 − pf)Q_E(A) − a P_E(A); density ratio q/p = exp((x − c − 1/2)/σ²).
    lo = max(c_thr, count + 0.5 + sigma ** 2 * math.log(a / (1 - pf)))
    d1 = pf + max(0.0, (1 - pf) * atom_q - a * atom_p) + \
        max(0.0, (1 - pf) * sf(lo - count - 1) - a * sf(lo - count))
    # H(P‖Q) = sup_A P_E(A) − a(1 − pf)Q_E(A): p/q > a(1 − pf) iff x < count + 1/2 − σ² ln(a(1 − pf)).
    hi = max(c_thr, count + 0.5 - sigma ** 2 * math.log(a * (1 - pf)))
    d2 = max(0.0, atom_p - a * (1 - pf) * atom_q) + max(
        0.0, (sf(c_thr - count) - sf(hi - count)) - a * (1 - pf) * (sf(c_thr - count - 1) - sf(hi - count - 1)))
    return max(d1, d2)


@pytest.mark.parametrize("eps", [0.25, 0.5, 1.0, 2.0])
def test_joint_bound_upper_bounds_exact_delta_on_tiny_mechanism(eps):
    """Check the derivation on pairs whose exact δ has a closed form: for ℓ fresh words and one
    (or no) existing word, exact δ ≤ δ_G(ε; σ, √|E|) + 1 − (1 − p)^ℓ, and δ_M(ε) ≥ both."""
    sigma = 1.0          # a threshold with a per-word tail ~1e-2, so every term is visible
    for n in (1, 2):
        c_thr = H.threshold_for(sigma, 0.02 * n, n)
        p = H.threshold_tail_per_word(sigma, c_thr)
        bound = H.histogram_delta(eps, sigma, c_thr, n)
        configs = [(None, n)] + [(count, 0) for count in (1, 2, 3, 5, 50)]
        if n == 2:
            configs += [(count, 1) for count in (1, 2, 3, 5, 50)]
        for count, fresh in configs:
            exact = _exact_delta_one_word(eps, sigma, c_thr, count, fresh, p)
            term = (0.0 if count is None else H.gaussian_delta(eps, sigma, 1.0)) \
                - math.expm1(fresh * math.log1p(-p))
            assert exact <= term + 1e-15, (n, count, fresh)
            assert exact <= bound + 1e-15, (n, count, fresh)
        if n == 1:
            # A count far above the threshold: the threshold is irrelevant, the Gaussian term is
            # tight (ℓ = 0, one word).
            tight = _exact_delta_one_word(eps, sigma, c_thr, 50, 0, p)
            assert tight == pytest.approx(H.gaussian_delta(eps, sigma, 1.0), rel=1e-9)
            # All words fresh: exactly the probability that one is released.
            assert _exact_delta_one_word(eps, sigma, c_thr, None, 1, p) == pytest.approx(p, rel=1e-12)
        else:
            # One existing word + one fresh word: the fresh word's term is needed (the Gaussian
            # term alone would be violated by a good fraction of p).
            exact = _exact_delta_one_word(eps, sigma, c_thr, 50, 1, p)
            assert exact >= H.gaussian_delta(eps, sigma, 1.0) + 0.25 * p


# ----------------------------------------------------------------------- patient-level unit

def test_patient_level_sensitivity_and_threshold():
    k = 8
    assert H.sensitivity_l2(N, k) == 8 * 16
    r = H.histogram_report(SIGMA, DELTA, N, max_contributions=k)
    assert r["unit"] == "patient" and r["sensitivity_l2"] == 128.0 and r["sensitivity_linf"] == 8.0
    assert r["noise_multiplier"] == pytest.approx(SIGMA / 128)
    assert r["threshold"] == pytest.approx(k + SIGMA * stats.norm.isf(DELTA / (k * N)), rel=1e-12)
    assert r["threshold_tail_per_word"] == pytest.approx(DELTA / (k * N), rel=1e-9)
    assert r["delta_threshold"] == pytest.approx(DELTA, rel=1e-9)
    # The Gaussian part has sensitivity k√N: ε at least that of one Gaussian with Δ = 128.
    assert r["epsilon"] >= H.gaussian_epsilon(SIGMA, DELTA, 128.0, method="analytic") - 1e-9
    assert r["epsilon"] == pytest.approx(H.gaussian_epsilon(SIGMA, DELTA, 128.0, method="analytic"), abs=1e-6)
    assert r["epsilon_classic"] == pytest.approx(8 * H.epsilon_classic(SIGMA, DELTA, N), rel=1e-12)
    # A patient of one tuple is the tuple case.
    one = H.histogram_report(SIGMA, DELTA, N, max_contributions=1, unit="patient")
    assert one["threshold"] == pytest.approx(H.threshold_for(SIGMA, DELTA, N), rel=1e-12)


# --------------------------------------------------------------------------- the mechanism

def _binomial_within(successes, trials, p, alpha=1e-3):
    """Neither one-sided binomial test rejects p at level α."""
    return (stats.binomtest(successes, trials, p, alternative="greater").pvalue > alpha
            and stats.binomtest(successes, trials, p, alternative="less").pvalue > alpha)


def test_neighbouring_datasets_fresh_words_survive_at_the_tail_rate():
    """D vs D ∪ {one tuple of N fresh words}: the fresh words are released at rate p per word
    and the tuple's words at rate 1 − (1 − p)^N ≤ δ₂; the counts of D are only noised."""
    sigma, n, delta2 = 1.0, 4, 0.04          # p = δ₂/N = 1e-2: measurable with 20000 trials
    c_thr = H.threshold_for(sigma, delta2, n)
    p = H.threshold_tail_per_word(sigma, c_thr)
    assert p == pytest.approx(0.01, rel=1e-9)
    d_words, d_counts = ["a", "b", "c"], [50, 3, 0]
    fresh = [f"fresh{i}" for i in range(n)]
    words = d_words + fresh
    counts = np.array(d_counts + [1] * n)
    rng = np.random.default_rng(20211)
    trials = 20000
    fresh_released = any_released = 0
    a_noise = []
    for _ in range(trials):
        kept = dict(H.noise_and_threshold(words, counts, sigma, c_thr, rng))
        assert "c" not in kept                                   # zero count: never released
        k = sum(w in kept for w in fresh)
        fresh_released += k
        any_released += k > 0
        a_noise.append(kept["a"] - 50)                           # 50 ≫ C: always kept
    # Per word: Binomial(trials·N, p); one-sided tests at α = 1e-3 both ways (not above the
    # bound, and not far below it: the mechanism is not accidentally over-conservative).
    assert _binomial_within(fresh_released, trials * n, p)
    assert _binomial_within(any_released, trials, -math.expm1(n * math.log1p(-p)))
    assert stats.binomtest(any_released, trials, delta2, alternative="greater").pvalue > 1e-3
    # Under D the fresh words do not exist: nothing to release, by construction.
    assert all(w not in dict(H.noise_and_threshold(d_words, np.array(d_counts), sigma, c_thr, rng))
               for w in fresh)
    # The released noisy counts carry N(0, σ²) noise.
    assert stats.kstest(a_noise, "norm", args=(0, sigma)).pvalue > 1e-3


def test_patient_level_fresh_words_survive_at_tail_rate():
    sigma, n, k = 1.0, 2, 3
    c_thr = H.threshold_for(sigma, 0.06, n, max_contributions=k)   # p = 0.06 / (k·n) = 1e-2
    p = H.threshold_tail_per_word(sigma, c_thr, k)
    assert p == pytest.approx(0.01, rel=1e-9)
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(k * n)]
    counts = np.full(k * n, k)               # worst case: every fresh word has count k
    trials = 10000
    released = sum(len(H.noise_and_threshold(words, counts, sigma, c_thr, rng)) for _ in range(trials))
    assert _binomial_within(released, trials * k * n, p)


def test_noise_and_threshold_contract():
    rng = np.random.default_rng(3)
    words = np.array(["x", "y", "z", "w"])
    counts = np.array([100, 0, 100, 0])
    kept = H.noise_and_threshold(words, counts, 2.0, 50.0, rng)
    assert [w for w, _ in kept] == ["x", "z"]
    # Exactly one N(0, σ²) draw per word with count > 0, in order.
    expected = np.array([100, 100]) + np.random.default_rng(3).normal(0.0, 2.0, size=2)
    assert [v for _, v in kept] == pytest.approx(expected.tolist())
    assert all(isinstance(v, float) for _, v in kept)
    # Below the threshold: dropped, never returned.
    assert H.noise_and_threshold(["a"], np.array([1]), 1.0, 1e6, rng) == []
    assert H.noise_and_threshold([], np.array([]), 1.0, 10.0, rng) == []


@pytest.mark.parametrize("call,message", [
    (lambda: H.threshold_for(-1, 1e-9, 256), "sigma must be"),
    (lambda: H.threshold_for(0, 1e-9, 256), "sigma must be"),
    (lambda: H.threshold_for(200, 0, 256), "delta must be in (0, 1)"),
    (lambda: H.threshold_for(200, 1.0, 256), "delta must be in (0, 1)"),
    (lambda: H.threshold_for(200, 1e-9, 0), "tuple_words must be an integer >= 1"),
    (lambda: H.threshold_for(200, 1e-9, 2.5), "tuple_words must be an integer >= 1"),
    (lambda: H.threshold_for(200, 1e-9, 256, mode="exact"), "mode must be one of"),
    (lambda: H.threshold_for(200, 1e-9, 256, max_contributions=0), "max_contributions must be"),
    (lambda: H.threshold_tail_per_word(200, float("nan")), "threshold must be a finite number"),
    (lambda: H.histogram_report(200, 1e-9, 256, threshold_delta_fraction=0), "threshold_delta_fraction"),
    (lambda: H.histogram_report(200, 1e-9, 256, threshold_delta_fraction=1.5), "threshold_delta_fraction"),
    (lambda: H.histogram_report(200, 1e-9, 256, threshold_mode="x"), "threshold_mode must be one of"),
    (lambda: H.histogram_report(200, 1e-9, 256, max_contributions=2, unit="tuple"),
     "max_contributions must be 1 when unit is tuple"),
    (lambda: H.histogram_report(200, 1e-9, 256, unit="admission"), "unit must be one of"),
    (lambda: H.gaussian_epsilon(200, 1e-9, -16), "sensitivity must be"),
    (lambda: H.noise_and_threshold(["a"], np.array([1, 2]), 1.0, 1.0, np.random.default_rng()),
     "counts must be a 1-D array aligned with words"),
    (lambda: H.noise_and_threshold(["a"], np.array([-1]), 1.0, 1.0, np.random.default_rng()),
     "counts must be finite and >= 0"),
    (lambda: H.noise_and_threshold(["a"], np.array([1]), -1.0, 1.0, np.random.default_rng()),
     "sigma must be"),
    (lambda: H.noise_and_threshold(["a"], np.array([1]), 1.0, 1.0, np.random.RandomState(0)),
     "rng must be a numpy.random.Generator"),
])
def test_bad_parameters_are_rejected_with_their_name(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_error_message_shows_value():
    with pytest.raises(ValueError, match=r"^sigma must be a finite number > 0, got -1$"):
        H.threshold_for(-1, 1e-9, 256)


def test_negative_count_error_does_not_echo_counts():
    with pytest.raises(ValueError) as err:
        H.noise_and_threshold(["a", "b"], np.array([12345, -1]), 1.0, 1.0, np.random.default_rng())
    assert "12345" not in str(err.value)
