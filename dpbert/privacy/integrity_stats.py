"""The statistics of the run-time integrity checks (``dpbert.mechanism.integrity``): p-values that are
EXACT or rigorous upper bounds (never a normal approximation of a tail), and the level each test
is run at so that an honest run fails a whole family of checks with probability ≤ ``FALSE_ALARM``.

Level of a test (Bonferroni over the tests of a family and over the looks of a run). The checks
are evaluated at look k = 1, 2, … (every ``training.integrity_check_every`` steps and at the end;
the number of looks is not known in advance). Look k gets α_k = α·6/(π²k²) (Σ_k α_k = α), split
evenly over the m tests of the family at that look: a test rejects when its p-value < α_k/m.
By the union bound, P(an honest run fails the family at any look) ≤ Σ_k m·α_k/m = α, whatever
the dependence between the tests and the looks. With α = 1e-6 per family and three statistical
families (noise, sampler, released diagnostics), an honest run fails with probability ≤ 3e-6.

The p-values (``p ≤ level`` rejects; each derivation in its docstring):

* ``chi2_two_sided``: exact (scipy's χ² cdf) for a sum of squares of iid N(0, 1).
* ``normal_two_sided``: exact for a Gaussian statistic.
* ``binomial_two_sided`` / ``binomial_upper``: exact binomial tails.
* ``product_sum_two_sided``: a Chernoff bound for Σ x_i·y_i of independent N(0, 1) pairs.
* ``dispersion_lower`` / ``dispersion_upper``: Chernoff bounds for Σ_t (b_t − nq)²/(nq(1−q)),
  b_t iid Binomial(n, q), from the exact binomial pmf.

Pure numpy / scipy: the math layer (no TensorFlow).
"""
from __future__ import annotations

import functools
import math
from typing import Tuple

import numpy as np
from scipy import optimize, special, stats

#: Probability that an honest run fails one family of statistical checks, over the whole run.
FALSE_ALARM = 1e-6


def look_level(alpha: float, look: int, tests: int) -> float:
    """The per-test level at look ``look`` (1-based) of a family of ``tests`` tests whose
    whole-run false-alarm probability is ``alpha``: α·6/(π²·look²)/tests (module docstring)."""
    if look < 1 or tests < 1:
        raise ValueError(f"look and tests must be >= 1, got {look}, {tests}")
    return float(alpha) * 6.0 / (math.pi ** 2 * look ** 2) / tests


def chi2_two_sided(x: float, dof: int) -> float:
    """Two-sided p-value of x = Σ_{i≤dof} z_i², z_i iid N(0, 1): 2·min(P(X ≤ x), P(X ≥ x)),
    X ~ χ²(dof) exactly. Too little (noise missing or scaled down) and too much both reject."""
    if dof < 1:
        return 1.0
    return float(min(1.0, 2.0 * min(stats.chi2.cdf(x, dof), stats.chi2.sf(x, dof))))


def normal_two_sided(z: float) -> float:
    """Two-sided p-value of z ~ N(0, 1): 2·P(Z ≥ |z|)."""
    return float(min(1.0, 2.0 * stats.norm.sf(abs(float(z)))))


def binomial_two_sided(k: float, n: int, p: float) -> float:
    """Two-sided p-value of k ~ Binomial(n, p): 2·min(P(K ≤ k), P(K ≥ k)), exact."""
    k = int(round(k))
    return float(min(1.0, 2.0 * min(stats.binom.cdf(k, n, p), stats.binom.sf(k - 1, n, p))))


def binomial_upper(k: int, n: int, p: float) -> float:
    """P(K ≥ k), K ~ Binomial(n, p), exact."""
    return float(stats.binom.sf(int(k) - 1, int(n), float(p)))


def product_sum_two_sided(s: float, pairs: int) -> float:
    """Bound on P(|Σ_{i≤p} x_i y_i| ≥ |s|) for 2p independent N(0, 1) variables.

    E exp(λ·x·y) = E exp(λ²x²/2) = (1 − λ²)^(−1/2) for |λ| < 1, so by Chernoff
    P(Σ ≥ s) ≤ exp(−λs)(1 − λ²)^(−p/2); the minimising λ solves sλ² + pλ − s = 0,
    λ = (√(p² + 4s²) − p)/(2s). Two-sided: twice that. A stuck noise seed (the same z twice)
    gives s ≈ p, bound ≈ exp(−0.19·p)·2."""
    s, p = abs(float(s)), int(pairs)
    if p < 1 or s == 0.0:
        return 1.0
    lam = (math.sqrt(p * p + 4.0 * s * s) - p) / (2.0 * s)
    log_bound = -lam * s - 0.5 * p * math.log1p(-lam * lam) + math.log(2.0)
    return float(min(1.0, math.exp(min(log_bound, 0.0))))


#: Above this n the pmf is summed over b ∈ nq ± (60·√(nq(1−q)) + 60) only (mass outside < 1e-700).
FULL_SUPPORT_MAX = 4_000_000


@functools.lru_cache(maxsize=4)
def _dispersion_terms(n: int, q: float) -> Tuple[np.ndarray, np.ndarray]:
    """(log pmf, y) over the support of b ~ Binomial(n, q), y = (b − nq)²/(nq(1−q)); the whole
    support up to ``FULL_SUPPORT_MAX`` units, beyond it a window whose outside mass is negligible."""
    n = int(n)
    mean, var = n * q, n * q * (1.0 - q)
    if n <= FULL_SUPPORT_MAX:
        b = np.arange(n + 1, dtype=np.float64)
    else:
        width = 60.0 * math.sqrt(var) + 60.0
        b = np.arange(max(0, math.floor(mean - width)), min(n, math.ceil(mean + width)) + 1, dtype=np.float64)
    return stats.binom.logpmf(b, n, q), np.square(b - mean) / var


def _chernoff(log_mgf, d: float, steps: int, sign: float) -> float:
    """min over λ > 0 of exp(−sign·λ·d + T·log E exp(sign·λ·Y)) (sign −1: the lower tail of
    D = Σ_t Y_t at d, sign +1: the upper tail), searched over log λ ∈ [−14, 8] (the objective
    is convex in λ, so unimodal in log λ: a grid, then Brent around its best point)."""
    def objective(log_lam):
        lam = math.exp(log_lam)
        return -sign * lam * d + steps * log_mgf(sign * lam)

    grid = np.linspace(-14.0, 8.0, 45)
    values = [objective(x) for x in grid]
    best = int(np.argmin(values))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    if hi > lo:
        res = optimize.minimize_scalar(objective, bounds=(lo, hi), method="bounded")
        value = min(values[best], float(res.fun))
    else:
        value = values[best]
    return float(min(1.0, math.exp(min(value, 0.0))))


def dispersion_lower(sizes, n: int, q: float) -> float:
    """Bound on P(D ≤ d) for D = Σ_t (b_t − nq)²/(nq(1−q)), b_t iid Binomial(n, q) (a Poisson
    sampler's batch sizes; E D = T): min_λ>0 exp(λd)·(E exp(−λY))^T with E exp(−λY) summed over
    the exact pmf. A fixed batch size b ≡ B gives d = T(B − nq)²/(nq(1−q)) ≈ 0 and a bound
    ≈ P(b = B)^T (≈ (2π·nq(1−q))^(−T/2)): it rejects once T is a few tens of steps."""
    sizes = np.asarray(sizes, np.float64)
    if sizes.size == 0 or not 0 < q < 1:
        return 1.0
    logpmf, y = _dispersion_terms(n, q)
    d = float(np.sum(np.square(sizes - n * q)) / (n * q * (1.0 - q)))
    return _chernoff(lambda lam: float(special.logsumexp(logpmf + lam * y)), d, sizes.size, -1.0)


def dispersion_upper(sizes, n: int, q: float) -> float:
    """Bound on P(D ≥ d) (``dispersion_lower``'s D): min_λ>0 exp(−λd)·(E exp(λY))^T over the exact
    pmf (finite: b ≤ n). Batch sizes more spread than a Binomial(n, q) (a sampler mixing rates)
    reject."""
    sizes = np.asarray(sizes, np.float64)
    if sizes.size == 0 or not 0 < q < 1:
        return 1.0
    logpmf, y = _dispersion_terms(n, q)
    d = float(np.sum(np.square(sizes - n * q)) / (n * q * (1.0 - q)))
    return _chernoff(lambda lam: float(special.logsumexp(logpmf + lam * y)), d, sizes.size, 1.0)
