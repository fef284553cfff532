"""Distinguishing test of the DP vocabulary (dpbert.privacy.vocab_audit) on the production
``histogram.noise_and_threshold``: the paper's threshold is flagged at the production parameters
(σ = 200, δ = 1e-9, N = 256), the correct one is not with the same trials; a deliberately broken
noise (a test fixture) is flagged through the privacy-loss tail. Fixed seeds; tolerances from the
binomial law (Clopper–Pearson at the test's own Bonferroni level)."""
import math

import numpy as np
import pytest
from scipy import stats

from dpbert.privacy import histogram
from dpbert.privacy import vocab_audit as va

TRIALS = 50_000   # 1.28e7 draws per dataset at N = 256; the paper's threshold: 5.9 fresh releases expected


def _contains(lo, hi, value):
    return lo <= value <= hi


def test_clopper_pearson_bounds():
    n, alpha = 1000, 0.05
    assert va.clopper_pearson_lower(0, n, alpha) == 0.0
    assert va.clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-9)
    assert va.clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-9)
    assert va.clopper_pearson_upper(n, n, alpha) == 1.0
    k = 37  # the defining equations of the exact interval
    assert stats.binom.sf(k - 1, n, va.clopper_pearson_lower(k, n, alpha)) == pytest.approx(alpha, rel=1e-6)
    assert stats.binom.cdf(k, n, va.clopper_pearson_upper(k, n, alpha)) == pytest.approx(alpha, rel=1e-6)


def test_paper_threshold_is_flagged_and_correct_threshold_is_not_at_production_parameters():
    paper = va.vocab_distinguishing_test(200.0, 1e-9, 256, "paper", trials=TRIALS, seed=3)
    correct = va.vocab_distinguishing_test(200.0, 1e-9, 256, "correct", trials=TRIALS, seed=3)
    fr = paper["fresh_release"]
    # the paper's C = 982.5 releases a fresh word w.p. 4.6e-7 each: 1.18e-4 per tuple of 256
    assert paper["threshold"] == pytest.approx(982.54, abs=0.01)
    assert fr["rate_honest"] == pytest.approx(1.18e-4, rel=0.01)
    assert _contains(fr["rate_lower"], fr["rate_upper"], fr["rate_honest"])  # binomial law
    assert paper["flagged"] and paper["delta_lower_bound"] > 1000 * paper["claimed_delta"]
    assert paper["epsilon_lower_bound"] == math.inf   # no ε makes it (ε, 1e-9)-DP
    # the correct C = 1369.4: P[some fresh word] = 1e-9, never seen in 5e4 trials
    assert correct["threshold"] == pytest.approx(1369.39, abs=0.01)
    assert correct["fresh_release"]["trials_with_release"] == 0
    assert not correct["flagged"] and correct["delta_lower_bound"] == 0.0
    assert correct["epsilon_lower_bound"] == 0.0
    # what "not flagged" means: nothing below the resolution is visible
    assert correct["detection_floor"] > 1000 * correct["claimed_delta"]


def test_a_mechanism_releasing_words_it_was_not_given_is_refused():
    # P_D[fresh word released] = 0 rests on this: under D the fresh words are not in the input.
    def lying(words, counts, sigma, threshold, rng):   # a broken mechanism that invents a word
        return [(len(words), 1.0)]

    with pytest.raises(AssertionError, match="not given"):
        va.vocab_distinguishing_test(200.0, 1e-9, 8, trials=10, seed=0, mechanism=lying)


def _broken_noise(words, counts, sigma, threshold, rng):
    """Test fixture: the production function with a third of the noise (a normalisation bug)."""
    return histogram.noise_and_threshold(words, counts, sigma / 3.0, threshold, rng)


def test_gaussian_part_privacy_loss_tail_flags_a_broken_noise_and_not_the_honest_one():
    kwargs = dict(sigma=4.0, delta=1e-5, tuple_words=16, pair=va.Pair(fresh_words=0), trials=20_000)
    honest = va.vocab_distinguishing_test(seed=5, **kwargs)
    broken = va.vocab_distinguishing_test(seed=5, mechanism=_broken_noise, **kwargs)
    assert honest["claimed_epsilon"] == pytest.approx(4.377, abs=0.01)
    assert not honest["flagged"] and honest["epsilon_lower_bound"] <= honest["claimed_epsilon"]
    # true δ of the broken noise at the claimed ε: δ_G(4.38; 4/3, 4) = 0.39
    assert histogram.gaussian_delta(honest["claimed_epsilon"], 4.0 / 3.0, 4.0) == pytest.approx(0.39, abs=0.01)
    assert broken["flagged"] and broken["delta_lower_bound"] > 0.1
    assert broken["epsilon_lower_bound"] > broken["claimed_epsilon"]
    # Honest tail vs its law: the privacy loss of 16 always-released words is N(±μ²/2, μ²),
    # μ = 4/σ = 1 (censoring below C has probability < 3e-4 per trial); each estimate lies in
    # its two-sided CP interval at the test's Bonferroni level.
    alpha = honest["beta"] / (2 * len(honest["privacy_loss_tail"]) + 1)
    n = honest["trials"]
    for row in honest["privacy_loss_tail"]:
        for key, mean in (("p_d_prime", 0.5), ("p_d", -0.5)):
            p = stats.norm.sf((row["level"] - mean) / 1.0)
            k = round(row[key] * n)
            lo, hi = va.clopper_pearson_lower(k, n, alpha), va.clopper_pearson_upper(k, n, alpha)
            assert lo - 3e-4 <= p <= hi + 3e-4, (row, key, p)


def test_per_word_release_rate_matches_the_threshold_tail():
    # Measurable in well under a second: small σ and N, the paper threshold (p = 2.1e-4 per word).
    res = va.vocab_distinguishing_test(4.0, 1e-5, 16, "paper", trials=50_000, seed=7)
    fr = res["fresh_release"]
    n_words = res["trials"] * res["fresh_words"]
    lo = va.clopper_pearson_lower(fr["words_released"], n_words, res["beta"] / 2)
    hi = va.clopper_pearson_upper(fr["words_released"], n_words, res["beta"] / 2)
    assert _contains(lo, hi, fr["per_word_rate_honest"])
    assert _contains(fr["rate_lower"], fr["rate_upper"], fr["rate_honest"])
    assert res["flagged"]   # real δ 3.4e-3 against the claimed 1e-5
    assert res["delta_reference"] == pytest.approx(fr["rate_honest"])
    assert np.isfinite(res["claimed_epsilon"])
