r"""The DP vocabulary mechanism: Gaussian noise on tuple counts, then a threshold.

The mechanism (Hoory et al. 2021, §3; Google's ``GaussianPartitionSelection`` with
``max_partitions_contributed = N``): h_w(D) is the number of privacy units' tuples of D that
contain word w (a tuple counts each of its distinct words once). For every word with h_w(D) > 0,
draw Z_w ~ N(0, σ²) independently and release ``(w, h_w + Z_w)`` iff h_w + Z_w ≥ C. Nothing else
is released (not the number of distinct words, not any exact count). ``noise_and_threshold``
applies it to a batch of words.

Contract: a unit (a tuple, or a patient's at most m = k tuples) changes at most mN counts by at
most m each (L2 sensitivity m√N). ``histogram_delta`` / ``histogram_epsilon`` give the exact
per-configuration (ε, δ) (the max over the number of fresh words, no monotonicity assumed);
``threshold_for`` the threshold C for the δ₂ given to it (``correct``, or the paper's printed
``paper`` value, whose real δ is ``actual_threshold_delta``); ``histogram_report`` the release's
figures with δ the TOTAL δ of the histogram. The derivation, the δ split, the threshold and the
classic bound for comparison: docs/privacy.md ("The DP vocabulary's derivation").
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize, special, stats

from dpbert.privacy import _checks

#: PLD value discretization interval (1e-3 is visibly pessimistic for these ε).
PLD_DISCRETIZATION = 1e-4
THRESHOLD_MODES = ("correct", "paper")
UNITS = ("tuple", "patient")


# ------------------------------------------------------------------------------- sensitivity

def _tuple_words(value) -> int:
    return _checks.integer("tuple_words", value, 1)


def _max_contributions(value) -> int:
    return _checks.integer("max_contributions", value, 1)


def sensitivity_l2(tuple_words: int, max_contributions: int = 1) -> float:
    """L2 sensitivity m√N of the count vector (derivation in docs/privacy.md)."""
    return _max_contributions(max_contributions) * math.sqrt(_tuple_words(tuple_words))


# --------------------------------------------------------------------------------- threshold

def threshold_for(sigma: float, delta: float, tuple_words: int, mode: str = "correct",
                  max_contributions: int = 1) -> float:
    """The threshold C for the δ (= δ₂) given to the threshold.

    correct: C = m + σ·Φ⁻¹(1 − δ/(mN)) → P[a fresh word is released] ≤ δ/(mN), so with at
    most mN fresh words the union bound is δ. (1369.39 for σ=200, δ=1e-9, N=256, m=1.)
    paper: C = m + σ·erf⁻¹(1 − δ/(mN)), the paper's printed formula (m = 1: 982.5); wrong, it
    drops the √2 — see ``actual_threshold_delta`` for the δ it really gives.
    """
    sigma = _checks.positive("sigma", sigma)
    delta = _checks.probability("delta", delta)
    n = _tuple_words(tuple_words)
    m = _max_contributions(max_contributions)
    _checks.choice("mode", mode, THRESHOLD_MODES)
    per_word = delta / (m * n)
    if mode == "correct":
        return m + sigma * float(stats.norm.isf(per_word))   # Φ⁻¹(1 − x) = isf(x), no cancellation
    return m + sigma * float(special.erfcinv(per_word))      # erf⁻¹(1 − x) = erfc⁻¹(x)


def threshold_tail_per_word(sigma: float, threshold: float, max_contributions: int = 1) -> float:
    """p = P[N(0, σ²) ≥ C − m]: the largest probability that one fresh word is released."""
    sigma = _checks.positive("sigma", sigma)
    threshold = _checks.finite("threshold", threshold)
    m = _max_contributions(max_contributions)
    return float(stats.norm.sf((threshold - m) / sigma))


def actual_threshold_delta(sigma: float, threshold: float, tuple_words: int,
                           max_contributions: int = 1) -> float:
    """δ₂ = m·N·p: the union bound over the ≤ mN fresh words (1.2e-4 for the paper's C = 982.5)."""
    n = _tuple_words(tuple_words)
    m = _max_contributions(max_contributions)
    return min(1.0, m * n * threshold_tail_per_word(sigma, threshold, m))


# ---------------------------------------------------------------------------- Gaussian parts

def epsilon_classic(sigma: float, delta: float, tuple_words: int, max_contributions: int = 1) -> float:
    """ε = m√N/σ · √(2 ln(1.25/δ)) (Dwork & Roth 2014, Thm. A.1). Only a valid bound if < 1."""
    sigma = _checks.positive("sigma", sigma)
    delta = _checks.probability("delta", delta)
    return sensitivity_l2(tuple_words, max_contributions) / sigma * math.sqrt(2 * math.log(1.25 / delta))


def gaussian_delta(epsilon: float, sigma: float, sensitivity: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Thm. 8), both directions.

    δ = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ), computed as Φ(a)·(1 − exp(ε + lnΦ(b) − lnΦ(a)))
    so that values down to ~1e-300 keep their relative precision.
    """
    _checks.non_negative("epsilon", epsilon)
    sigma = _checks.positive("sigma", sigma)
    return float(_gaussian_delta(float(epsilon), sigma, np.asarray([_checks.non_negative(
        "sensitivity", sensitivity)]))[0])


def _gaussian_delta(epsilon: float, sigma: float, sensitivity: np.ndarray) -> np.ndarray:
    sens = np.asarray(sensitivity, dtype=np.float64)
    out = np.zeros_like(sens)
    live = sens > 0
    if not np.any(live) or epsilon == math.inf:
        return out
    mu = sens[live] / sigma
    log_a = special.log_ndtr(mu / 2 - epsilon / mu)
    log_b = special.log_ndtr(-mu / 2 - epsilon / mu)
    out[live] = np.exp(log_a) * -np.expm1(np.minimum(epsilon + log_b - log_a, 0.0))
    return out


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float, method: str = "pld") -> float:
    """The exact ε at δ of one Gaussian mechanism with L2 ``sensitivity`` and noise std σ.

    ``pld``: dp-accounting's privacy loss distribution (noise multiplier σ/Δ, pessimistic
    discretization 1e-4); ``analytic``: the Balle & Wang formula inverted by Brent's method.
    They agree to ~1e-4 (0.4340 for σ=200, Δ=16, δ=5e-10; 0.4242 at δ=1e-9).
    """
    sigma = _checks.positive("sigma", sigma)
    delta = _checks.probability("delta", delta)
    sensitivity = _checks.positive("sensitivity", sensitivity)
    _checks.choice("method", method, ("pld", "analytic"))
    if method == "pld":
        from dp_accounting.pld import privacy_loss_distribution as pld

        return float(pld.from_gaussian_mechanism(
            sigma, sensitivity=sensitivity,
            value_discretization_interval=PLD_DISCRETIZATION).get_epsilon_for_delta(delta))
    return _invert(lambda eps: float(_gaussian_delta(eps, sigma, np.asarray([sensitivity]))[0]), delta)


def _invert(delta_of_epsilon, delta: float) -> float:
    """Smallest ε ≥ 0 with delta_of_epsilon(ε) ≤ δ (a non-increasing function); inf if none."""
    if delta_of_epsilon(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_of_epsilon(hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    lo = hi / 2.0 if hi > 1.0 else 0.0
    root = optimize.brentq(lambda e: delta_of_epsilon(e) - delta, lo, hi, xtol=1e-12, rtol=1e-12)
    # brentq's root is within its tolerance; step up until the constraint holds (never report
    # an ε whose δ exceeds the target).
    step = max(1e-12, 1e-12 * root)
    while delta_of_epsilon(root) > delta:
        root += step
        step *= 2
    return float(root)


# --------------------------------------------------------------- the whole mechanism's (ε, δ)

def histogram_delta(epsilon: float, sigma: float, threshold: float, tuple_words: int,
                    max_contributions: int = 1) -> float:
    """δ_M(ε) = max over ℓ = 0..mN of δ_G(ε; σ, √(m(mN − ℓ))) + 1 − (1 − p)^ℓ (docs/privacy.md)."""
    epsilon = _checks.non_negative("epsilon", epsilon)
    sigma = _checks.positive("sigma", sigma)
    n = _tuple_words(tuple_words)
    m = _max_contributions(max_contributions)
    p = threshold_tail_per_word(sigma, threshold, m)
    return _histogram_delta(epsilon, sigma, p, n, m)


def _histogram_delta(epsilon: float, sigma: float, p: float, n: int, m: int) -> float:
    fresh = np.arange(m * n + 1, dtype=np.float64)
    sens = np.sqrt(m * (m * n - fresh))
    fresh_released = -np.expm1(fresh * np.log1p(-p)) if p < 1 else (fresh > 0).astype(np.float64)
    return float(np.max(_gaussian_delta(epsilon, sigma, sens) + fresh_released))


@functools.lru_cache(maxsize=256)
def histogram_epsilon(sigma: float, delta: float, threshold: float, tuple_words: int,
                      max_contributions: int = 1) -> float:
    """Smallest ε with δ_M(ε) ≤ δ: the ε of the released histogram at total δ (inf if the
    threshold alone already costs ≥ δ, e.g. the paper's C = 982.5 at δ = 1e-9). Memoised: a pure
    function of scalars that plans, guards and reports ask for again (~0.1–0.5 s each)."""
    sigma = _checks.positive("sigma", sigma)
    delta = _checks.probability("delta", delta)
    n = _tuple_words(tuple_words)
    m = _max_contributions(max_contributions)
    p = threshold_tail_per_word(sigma, threshold, m)
    if _histogram_delta(math.inf, sigma, p, n, m) >= delta:
        return math.inf
    return _invert(lambda eps: _histogram_delta(eps, sigma, p, n, m), delta)


# ------------------------------------------------------------------------------------ report

def histogram_report(sigma: float, delta: float, tuple_words: int, threshold_mode: str = "correct",
                     max_contributions: int = 1, threshold_delta_fraction: float = 1.0,
                     unit: Optional[str] = None) -> Dict:
    """Threshold and (ε, δ) of the vocabulary histogram; ``delta`` is the TRUE total δ.

    Args:
      sigma: noise standard deviation on each count.
      delta: the total δ of the released histogram (``vocab.delta``).
      tuple_words: N.
      threshold_mode: ``correct`` (Φ⁻¹) or ``paper`` (the printed erf⁻¹ formula, reported
        with the δ it really gives and a warning).
      max_contributions: m = 1 for a tuple, k for a patient with ≤ k tuples.
      threshold_delta_fraction: f ∈ (0, 1]: the threshold is computed from δ₂ = f·δ. Default 1
        (the paper's Corollary 1, C = 1369.4 for 200/1e-9/256); 0.5 is Google's DP library
        split (C = 1389.1). See docs/privacy.md for why the default is 1.
      unit: ``tuple`` or ``patient``; default ``tuple`` if m = 1 else ``patient``.

    Returns a dict:
      threshold, threshold_mode, threshold_delta_fraction, sigma, tuple_words, unit,
      max_contributions, sensitivity_l2 (m√N), sensitivity_linf (m), noise_multiplier (σ/m√N),
      epsilon — the ε of the released histogram at total ``delta`` (per-configuration bound),
      delta — the true total δ (= the argument, except in paper mode where the threshold costs
        more: then δ_M(epsilon), ≈ 1.2e-4 for 200/1e-9/256),
      delta_threshold — δ₂ = mN·p, the union bound on releasing any fresh word (= f·δ),
      threshold_tail_per_word — p = P[N(0,σ²) ≥ C − m] (C − 1 for a tuple),
      delta_gaussian — δ_G(epsilon; σ, m√N), the Gaussian part's δ alone at ``epsilon``. The two
        parts are not added: a neighbouring pair pays for each of its words either the Gaussian
        (word already present) or the threshold (fresh word); see docs/privacy.md,
      epsilon_split, delta_gaussian_split — the split bound ε_G(δ − δ₂) at δ₁ = δ − δ₂ (Google's
        convention; inf when f = 1 leaves nothing to the Gaussian),
      epsilon_classic (at ``delta``, the paper's formula) and epsilon_classic_valid (< 1),
      and in paper mode delta_claimed (the argument), delta_actual (mN·p) and warning.
    """
    sigma = _checks.positive("sigma", sigma)
    delta = _checks.probability("delta", delta)
    n = _tuple_words(tuple_words)
    m = _max_contributions(max_contributions)
    _checks.choice("threshold_mode", threshold_mode, THRESHOLD_MODES)
    f = _checks.fraction("threshold_delta_fraction", threshold_delta_fraction)
    if unit is None:
        unit = "tuple" if m == 1 else "patient"
    _checks.choice("unit", unit, UNITS)
    if unit == "tuple" and m != 1:
        raise ValueError(f"max_contributions must be 1 when unit is tuple, got {m}")

    threshold = threshold_for(sigma, f * delta, n, threshold_mode, m)
    tail = threshold_tail_per_word(sigma, threshold, m)
    delta_threshold = actual_threshold_delta(sigma, threshold, n, m)
    sens = sensitivity_l2(n, m)
    eps_classic = epsilon_classic(sigma, delta, n, m)
    report = {
        "mechanism": "dp_histogram",
        "sigma": sigma,
        "tuple_words": n,
        "unit": unit,
        "max_contributions": m,
        "sensitivity_l2": sens,
        "sensitivity_linf": float(m),
        "noise_multiplier": sigma / sens,
        "threshold_mode": threshold_mode,
        "threshold_delta_fraction": f,
        "threshold": threshold,
        "threshold_tail_per_word": tail,
        "delta_threshold": delta_threshold,
        "epsilon_classic": eps_classic,
        "epsilon_classic_valid": eps_classic < 1,
    }
    if threshold_mode == "correct":
        epsilon = histogram_epsilon(sigma, delta, threshold, n, m)
        total = delta
    else:
        # The paper's claim: ε of the Gaussian at the full δ. What it really gives at that ε:
        epsilon = gaussian_epsilon(sigma, delta, sens, method="analytic")
        total = histogram_delta(epsilon, sigma, threshold, n, m)
    delta_split = delta - f * delta if threshold_mode == "correct" else delta - delta_threshold
    report.update({
        "epsilon": epsilon,
        "delta": total,
        "delta_gaussian": gaussian_delta(epsilon, sigma, sens) if math.isfinite(epsilon) else 0.0,
        "delta_gaussian_split": max(delta_split, 0.0),
        "epsilon_split": (gaussian_epsilon(sigma, delta_split, sens, method="pld")
                          if delta_split > 0 and f < 1 else math.inf),
    })
    if threshold_mode == "paper":
        report.update({
            "delta_claimed": delta,
            "delta_actual": delta_threshold,
            "warning": (f"threshold_mode='paper': C = {threshold:.1f} is the paper's printed "
                        f"1 + σ·erf⁻¹(1 − δ/N), which drops a factor √2; a fresh word survives it "
                        f"with probability {tail:.3g}, so the threshold alone gives δ = "
                        f"{delta_threshold:.3g}, not {delta:.3g}. Use threshold_mode='correct' "
                        f"(C = {threshold_for(sigma, f * delta, n, 'correct', m):.1f})."),
        })
    return report


# --------------------------------------------------------------------------------- mechanism

def noise_and_threshold(words: Sequence, counts, sigma: float, threshold: float,
                        rng: np.random.Generator) -> List[Tuple[object, float]]:
    """Apply the mechanism to a batch: one N(0, σ²) draw per word with count > 0, keep
    noisy ≥ threshold. Returns the kept ``(word, noisy_count)`` pairs only (never an exact
    count). ``counts``: numpy array aligned with ``words``; ``rng``: a numpy Generator.
    Each word must appear once in the whole histogram (one draw per word overall).
    """
    sigma = _checks.positive("sigma", sigma)
    threshold = _checks.finite("threshold", threshold)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.shape[0] != len(words):
        raise ValueError(f"counts must be a 1-D array aligned with words ({len(words)} words), "
                         f"got shape {counts.shape}")
    if counts.size == 0:
        return []
    if not np.issubdtype(counts.dtype, np.number) or np.issubdtype(counts.dtype, np.complexfloating):
        raise ValueError(f"counts must be numeric, got dtype {counts.dtype}")
    counts = counts.astype(np.float64)
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("counts must be finite and >= 0")
    present = np.flatnonzero(counts > 0)
    noisy = counts[present] + rng.normal(0.0, sigma, size=present.size)
    keep = noisy >= threshold
    return [(words[int(i)], float(v)) for i, v in zip(present[keep], noisy[keep])]
