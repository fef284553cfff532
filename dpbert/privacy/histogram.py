r"""The DP vocabulary mechanism: Gaussian noise on tuple counts, then a threshold.

The mechanism (Hoory et al. 2021, §3; Google's ``GaussianPartitionSelection`` with
``max_partitions_contributed = N``)
-------------------------------------------------------------------------------------------
h_w(D) is the number of privacy units' tuples of D that contain word w (a tuple counts each of
its distinct words once). For every word with h_w(D) > 0, draw Z_w ~ N(0, σ²) independently and
release ``(w, h_w + Z_w)`` iff h_w + Z_w ≥ C. Nothing else is released (not the number of
distinct words, not any exact count). ``noise_and_threshold`` applies it to a batch of words.

Neighbouring datasets and sensitivity
-------------------------------------
Add/remove one privacy unit: D' = D + u. With ``unit = "tuple"`` u is one N-word tuple (m = 1);
with ``unit = "patient"`` u is a patient's at most m = k tuples (the Beam job enforces the cap).
Let Δ_w = h_w(D') − h_w(D). Each tuple adds 1 to at most N distinct words, so
Δ_w ∈ {0, …, m} and Σ_w Δ_w ≤ mN. Hence L∞ sensitivity m and
L2 sensitivity √(Σ Δ_w²) ≤ √(m · Σ Δ_w) ≤ √(m · mN) = m√N   (√N = 16 for a tuple, N = 256).

Privacy: the per-configuration bound (derived here; used for ``epsilon``)
-------------------------------------------------------------------------
Split the words of u into E (h_w(D) ≥ 1: already in D) and F (h_w(D) = 0: fresh), ℓ = |F|.

1. Words outside E ∪ F have the same, independent output under D and D'; an identical
   independent component does not change the hockey-stick divergence
   H_a(P‖Q) = sup_S P(S) − a·Q(S), a = e^ε, so they can be ignored.
2. On E the output is a coordinate-wise post-processing of the Gaussian vector
   (h_w + Z_w)_{w∈E}, whose means differ by Δ_E with ‖Δ_E‖₂² ≤ m·Σ_E Δ_w ≤ m(mN − ℓ) (each
   fresh word uses ≥ 1 of the budget mN). By post-processing, H_a(P_E‖Q_E) and H_a(Q_E‖P_E)
   are ≤ δ_G(ε; σ, Δ_ℓ), Δ_ℓ = √(m(mN − ℓ)), the exact ("analytic") Gaussian δ of Balle & Wang
   (2018, Thm. 8):  δ_G(ε; σ, Δ) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ).
3. On F: under D no fresh word is ever released (it has no count); under D' each is released
   independently with probability ≤ p = P[Z ≥ C − m] (its count is ≤ m), so some fresh word is
   released with probability ≤ p_F = 1 − (1 − p)^ℓ. Write the F-part of D' as
   (1 − p_F)·[none released] + p_F·R. For any event S, with S∅ its slice "no fresh word":
     Q(S) − a P(S) ≤ (1 − p_F) Q_E(S∅) + p_F − a P_E(S∅) ≤ δ_G + p_F,
     P(S) − a Q(S) ≤ P_E(S∅) − a (1 − p_F) Q_E(S∅)
                   = (1 − p_F)[P_E(S∅) − a Q_E(S∅)] + p_F P_E(S∅) ≤ δ_G + p_F.
So every neighbouring pair with ℓ fresh words satisfies (ε, δ_ℓ(ε)),
    δ_ℓ(ε) = δ_G(ε; σ, √(m(mN − ℓ))) + 1 − (1 − p)^ℓ,
and the mechanism is (ε, δ_M(ε))-DP with δ_M(ε) = max_{ℓ = 0..mN} δ_ℓ(ε)
(``histogram_delta``); ``histogram_epsilon`` inverts it (the max is computed over every ℓ,
no monotonicity is assumed).

The split bound (Google's DP library convention) is the corollary
δ_M(ε) ≤ δ_G(ε; σ, m√N) + mNp: with a threshold such that mNp = δ₂ and ε = ε_G(δ₁), the
histogram is (ε_G(δ₁), δ₁ + δ₂)-DP; the library takes δ₁ = δ₂ = δ/2.

Threshold (``threshold_for``, it takes the δ₂ given to the threshold)
---------------------------------------------------------------------
correct:  C = m + σ·Φ⁻¹(1 − δ₂/(mN)), so p = P[Z ≥ C − m] = δ₂/(mN) and the union bound over the
          ≤ mN fresh words gives mNp = δ₂. For m = 1: C = 1 + σΦ⁻¹(1 − δ/N)
          = 1 + σ√2·erf⁻¹(1 − 2δ/N) = 1369.39 for σ = 200, δ₂ = 1e-9, N = 256
          (1389.11 with δ₂ = δ/2 = 5e-10, the library's value).
paper:    the printed C = 1 + σ·erf⁻¹(1 − δ/N) = 982.5 (it drops the √2 of Φ⁻¹ = √2·erf⁻¹(2x−1)):
          p = P[Z ≥ 981.5] = Φ̄(4.907) = 4.6e-7 and mNp = 1.2e-4, the δ it really gives
          (``actual_threshold_delta``), 10⁵ times the claimed 1e-9.

The δ split (default: ``threshold_delta_fraction = 1``, the paper's Corollary 1, repaired)
------------------------------------------------------------------------------------------
``histogram_report(σ, δ, N)`` treats δ as the TOTAL δ of the released histogram, and gives
δ₂ = f·δ to the threshold (f = ``threshold_delta_fraction``). The reported ``epsilon`` is the
smallest ε with δ_M(ε) ≤ δ (per-configuration bound). With f = 1 the ℓ = mN term is
1 − (1 − p)^{mN} < mNp = δ, and for σ = 200, N = 256, δ = 1e-9 the max is attained at ℓ = 0:
ε = ε_G(1e-9; 200, 16) = 0.4242 at C = 1369.4, with total δ = 1e-9 (not 2e-9). This default is
chosen because (i) it is what the configuration documents and the CLI promises
(C = 1 + σΦ⁻¹(1 − δ/N) = 1369.4), (ii) it dominates the library's split at the same total δ
(0.424 < 0.434, and a lower threshold releases more words), and (iii) ``delta`` stays the true
total δ. f = 0.5 reproduces the library: C = 1389.1 and ``epsilon_split`` = ε_G(δ/2) = 0.434
(checked against ``pydp`` in the tests; ``epsilon`` is then still the per-configuration 0.424).
The split bound is what the ledger uses to compose the vocabulary with DP-SGD
(``dpbert.accounting.accountant``): Gaussian event σ/(m√N) in one PLD with the training events,
plus the threshold's δ₂ = mNp.

Classic bound, for comparison
-----------------------------
ε_classic = Δ/σ·√(2 ln(1.25/δ)) (Dwork & Roth 2014, Thm. A.1, valid only for ε < 1):
16/200·√(2 ln 1.25e9) = 0.518 — the paper's number; ≥ the exact ε.

Caveats: the noise is numpy's floating-point normal sampler, not a "secure" discrete sampler
(Mironov 2012's floating-point attack applies in principle to any such implementation);
``pydp``'s ``GaussianPartitionSelectionStrategy.noised_value_if_should_keep`` is a drop-in
alternative if that matters.
"""
from __future__ import annotations

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
    """L2 sensitivity m√N of the count vector (derivation in the module docstring)."""
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
    """δ_M(ε) = max over ℓ = 0..mN of δ_G(ε; σ, √(m(mN − ℓ))) + 1 − (1 − p)^ℓ (module docstring)."""
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


def histogram_epsilon(sigma: float, delta: float, threshold: float, tuple_words: int,
                      max_contributions: int = 1) -> float:
    """Smallest ε with δ_M(ε) ≤ δ: the ε of the released histogram at total δ (inf if the
    threshold alone already costs ≥ δ, e.g. the paper's C = 982.5 at δ = 1e-9)."""
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
        split (C = 1389.1). See the module docstring for why the default is 1.
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
        (word already present) or the threshold (fresh word); see the module docstring,
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
