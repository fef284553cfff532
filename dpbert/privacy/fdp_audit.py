r"""f-DP one-run audit (Mahloujifar, Melis & Chaudhuri 2025, "Auditing f-Differential Privacy in
One Run", ICML 2025, arXiv:2410.22235): the test of a trade-off curve f from one run's guesses.

Protocol: as ``dpbert.privacy.one_run_audit`` (Steinke, Nasr & Jagielski 2023): m canaries, each
in with probability ½; the auditor makes ``n_guess`` guesses from pre-declared ranks, ``n_correct``
are right. This test uses the whole trade-off curve f, not only the claim's (ε, δ) point, so for a
Gaussian-like mechanism it rejects much weaker claims at the same guesses.

Contract: ``audit_objective`` rejects "f-DP" at level β; rejection is monotone in f.
``epsilon_one_run_fdp`` tests the Gaussian curve through (ε, δ) (μ-GDP: never a DP-SGD verdict);
``dpsgd_sigma_bound`` returns σ̂, the smallest σ' whose claimed DP-SGD curve (σ', q, T) is
rejected, with P[σ̂ <= σ_claimed] <= β when the run is the claimed one; ``claim_rejected``
applies Bonferroni over pre-declared guess sets. The test, the two families and why each is
valid: docs/audits.md ("The f-DP one-run test").

The ported objective keeps jax_privacy's Apache-2.0 notice:

    Copyright 2026 DeepMind Technologies Limited.
    Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file
    except in compliance with the License. You may obtain a copy of the License at
    http://www.apache.org/licenses/LICENSE-2.0 . Unless required by applicable law or agreed to
    in writing, software distributed under the License is distributed on an "AS IS" BASIS,
    WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the License for
    the specific language governing permissions and limitations under the License.

(``audit_objective`` and ``epsilon_one_run_fdp`` are adapted from google-deepmind/jax_privacy,
``jax_privacy/auditing.py``: ``_epsilon_one_run_fdp`` and ``_gaussian_dp_blow_up_inverse``; μ is
computed here with scipy instead of ``dp_accounting.get_sigma_gaussian``.)
"""
from __future__ import annotations

import bisect
import functools
import math
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize, signal, stats

__all__ = [
    "gaussian_delta", "gaussian_mu", "gaussian_blow_up_inverse", "audit_objective",
    "epsilon_one_run_fdp", "profile_blow_up_inverse", "dpsgd_privacy_profile",
    "dpsgd_blow_up_inverse", "claim_rejected", "rejecting_set", "dpsgd_sigma_bound",
]

BlowUpInverse = Callable[[float], float]


# ----------------------------------------------------------------------------- Gaussian family
def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP (Dong, Roth & Su 2022, Cor. 2.13): Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    if mu <= 0:
        return 0.0
    a, b = -epsilon / mu + mu / 2, -epsilon / mu - mu / 2
    return float(max(0.0, stats.norm.cdf(a) - math.exp(stats.norm.logcdf(b) + epsilon)))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The largest μ with μ-GDP ⊂ (ε, δ)-DP (δ(ε; μ) increases with μ): the Gaussian mechanism of
    sensitivity 1 and σ = 1/μ that is exactly (ε, δ)-DP."""
    if not 0 < delta < 1 or epsilon < 0:
        raise ValueError(f"need epsilon >= 0 and 0 < delta < 1, got {epsilon}, {delta}")
    hi = 1.0
    while gaussian_delta(epsilon, hi) < delta:
        hi *= 2.0
    return float(optimize.brentq(lambda mu: gaussian_delta(epsilon, mu) - delta, 0.0, hi, xtol=1e-12))


def gaussian_blow_up_inverse(mu: float) -> BlowUpInverse:
    """b(y) = f(1 − y) = Φ(Φ⁻¹(y) − μ) for G_μ."""
    return lambda y: float(stats.norm.cdf(stats.norm.ppf(y) - mu))


# ----------------------------------------------------------------------------- the test
def audit_objective(blow_up_inverse: BlowUpInverse, m: int, n_guess: int, n_correct: int,
                    significance: float) -> float:
    """> 0 iff ``n_correct`` right of ``n_guess`` guesses among m canaries rejects the f-DP claim
    at level ``significance`` (docs/audits.md; jax_privacy's ``audit_objective``)."""
    m, n_guess, n_correct = int(m), int(n_guess), int(n_correct)
    if not 0 <= n_correct <= n_guess <= m or m < 1:
        raise ValueError(f"need 0 <= n_correct <= n_guess <= m, got {n_correct}, {n_guess}, {m}")
    r = significance * n_correct / m
    h = significance * (n_guess - n_correct) / m
    for i in range(n_correct - 1, -1, -1):
        h_new = max(h, blow_up_inverse(r))
        if h == h_new:  # neither h nor r can change afterwards
            break
        r_new = min(r + (i / (n_guess - i)) * (h_new - h), 1.0)
        h, r = h_new, r_new
    return r + h - n_guess / m


def epsilon_one_run_fdp(m: int, n_guess: int, n_correct: int, significance: float, delta: float,
                        eps_lo: float = 0.0) -> float:
    """jax_privacy's estimator: from ``eps_lo`` (rejected), doubling to a non-rejected ε, then the
    root of the objective between them (Brent) — an ε whose Gaussian curve G_{μ(ε, δ)} is rejected
    (the objective need not be monotone in ε, so the root found depends on ``eps_lo``, as in
    jax_privacy); ``eps_lo`` when it is not rejected. A μ-GDP test (docs/audits.md)."""
    if not 0 < significance < 1 or not 0 < delta < 1:
        raise ValueError(f"need 0 < significance, delta < 1, got {significance}, {delta}")

    def objective(eps):
        return audit_objective(_gaussian_at(float(eps), float(delta)), m, n_guess, n_correct, significance)

    if objective(eps_lo) <= 0:
        return float(eps_lo)
    eps_hi = max(1.0, 2 * eps_lo)
    while objective(eps_hi) > 0:
        eps_lo, eps_hi = eps_hi, eps_hi * 2
    return float(optimize.brentq(objective, eps_lo, eps_hi, xtol=1e-6))


@functools.lru_cache(maxsize=1000)
def _gaussian_at(eps: float, delta: float) -> BlowUpInverse:
    return gaussian_blow_up_inverse(gaussian_mu(eps, delta))


# ----------------------------------------------------------------------------- DP-SGD family
#: Loss grid step of ``dpsgd_privacy_profile``: each step's loss is rounded UP to it, so the
#: composed loss is overstated by at most T·h (0.025 at T = 50): ε(δ) a little above the accountant's.
LOSS_STEP = 5e-4


def _step_loss_pmf(sigma: float, q: float, h: float, cap: float, add: bool) -> Tuple[np.ndarray, int, float]:
    """One Poisson-subsampled Gaussian step's privacy loss, rounded UP to the grid k·h:
    (pmf over k = k0 … k0 + len − 1, k0, mass above ``cap`` (set to +∞)). REMOVE (``add`` False):
    L = log(1 − q + q·e^{(y − ½)/σ²}) under y ~ (1 − q)N(0, σ²) + qN(1, σ²) (the canary's world);
    ADD: −L under y ~ N(0, σ²). L(y) increases in y; y(ℓ) = ½ + σ² log((e^ℓ − 1 + q)/q)."""
    floor = math.log1p(-q)  # L > log(1 − q): the loss of an unsampled step
    if add:  # bins of −L (≤ −log(1 − q)); its lower tail below −cap is rounded up into the first bin
        k0, k1 = math.floor(-cap / h), math.ceil(-floor / h)
        edges = np.arange(k0 - 1, k1 + 1) * h
        cdf = stats.norm.sf(_y_of_loss(-edges, sigma, q) / sigma)  # P[−L <= e] = P[y >= y(−e)]
        mass = np.diff(cdf)
        mass[0] += cdf[0]
        return np.clip(mass, 0.0, None), k0, 0.0
    k0, k1 = math.floor(floor / h), math.ceil(cap / h)
    edges = np.arange(k0 - 1, k1 + 1) * h  # bin k holds (k − 1)h < L <= kh
    y = _y_of_loss(edges, sigma, q)
    cdf = (1 - q) * stats.norm.cdf(y / sigma) + q * stats.norm.cdf((y - 1) / sigma)
    over = float((1 - q) * stats.norm.sf(y[-1] / sigma) + q * stats.norm.sf((y[-1] - 1) / sigma))
    return np.clip(np.diff(cdf), 0.0, None), k0, over


def _y_of_loss(loss: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """y(ℓ) = ½ + σ² log((e^ℓ − 1 + q)/q); −∞ at or below ℓ = log(1 − q)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = np.expm1(loss) + q
        y = 0.5 + sigma ** 2 * (np.log(np.where(inner > 0, inner, 1.0)) - math.log(q))
    return np.where(inner > 0, y, -np.inf)


def _convolve(a, b, k_lo: int, k_hi: int):
    """The sum of two independent grid losses, each (pmf, k0, mass at +∞), truncated to [k_lo, k_hi]:
    mass above goes to +∞, mass below is rounded up to k_lo (both only overstate the loss)."""
    (pa, ka, oa), (pb, kb, ob) = a, b
    pc = np.clip(signal.fftconvolve(pa, pb), 0.0, None)  # FFT round-off: ±1e-17
    kc, over = ka + kb, 1.0 - (1.0 - oa) * (1.0 - ob)
    if kc + pc.size - 1 > k_hi:
        keep = k_hi - kc + 1
        over += float(pc[keep:].sum())
        pc = pc[:keep]
    if kc < k_lo:
        cut = k_lo - kc
        pc = np.concatenate([[pc[: cut + 1].sum()], pc[cut + 1:]])
        kc = k_lo
    return pc, kc, over


def _compose(step, steps: int, k_lo: int, k_hi: int):
    """``steps``-fold self-composition by repeated squaring (``_convolve``)."""
    result, power, n = None, step, int(steps)
    while n:
        if n & 1:
            result = power if result is None else _convolve(result, power, k_lo, k_hi)
        n >>= 1
        if n:
            power = _convolve(power, power, k_lo, k_hi)
    return result


def _hockey_stick(loss_pmf, h: float, epsilons: np.ndarray) -> np.ndarray:
    """δ(ε) = P[L = ∞] + Σ_{ℓ > ε} p(ℓ)(1 − e^{ε − ℓ}) for the composed loss L (suffix sums)."""
    pmf, k0, over = loss_pmf
    loss = (k0 + np.arange(pmf.size)) * h
    s0 = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]])
    s1 = np.concatenate([np.cumsum((pmf * np.exp(-loss))[::-1])[::-1], [0.0]])
    idx = np.searchsorted(loss, epsilons, side="right")
    return np.clip(over + s0[idx] - np.exp(epsilons) * s1[idx], 0.0, 1.0)


def dpsgd_privacy_profile(sigma: float, q: float, steps: int, epsilons: Sequence[float],
                          h: float = LOSS_STEP, cap: float = 40.0) -> np.ndarray:
    """An upper bound on δ(ε) of T Poisson-subsampled Gaussian steps (noise σ, sensitivity 1,
    add/remove one unit), the max over both neighbour orders, at each ε of ``epsilons`` (0 <= ε <
    cap − T·log(1/(1 − q))). The per-step loss is rounded up to the grid h and every truncation
    overstates the loss (``_step_loss_pmf``, ``_convolve``), so this bounds the exact profile —
    the accountant's (dp-accounting PLD) to within T·h in ε (tested)."""
    sigma, q, steps = float(sigma), float(q), int(steps)
    if not (sigma > 0 and 0 < q < 1 and steps >= 1):
        raise ValueError(f"need sigma > 0, 0 < q < 1, steps >= 1, got {sigma}, {q}, {steps}")
    epsilons = np.asarray(epsilons, np.float64)
    k_lo, k_hi = math.floor(-cap / h), math.ceil(cap / h)
    out = np.zeros_like(epsilons)
    for add in (False, True):
        step = _step_loss_pmf(sigma, q, h, cap, add)
        out = np.maximum(out, _hockey_stick(_compose(step, steps, k_lo, k_hi), h, epsilons))
    return out


def profile_blow_up_inverse(epsilons: Sequence[float], deltas: Sequence[float]) -> BlowUpInverse:
    """b(y) = f(1 − y) for f = sup_j f_{ε_j, δ_j}, f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α))
    (symmetric, convex: a valid trade-off function below the mechanism's true curve when it is
    (ε_j, δ_j)-DP for every j). Tabulated at y = 10⁻¹², … (4000 geometric points to 10⁻², then
    4000 even ones to 1) and read at the grid point at or below y: b increases, so the value read
    is below b(y) (the claim only gets weaker; relative loss < 0.7 % near 0)."""
    eps = np.asarray(epsilons, np.float64)[None, :]
    dlt = np.asarray(deltas, np.float64)[None, :]
    ys = np.concatenate([[0.0], np.geomspace(1e-12, 1e-2, 4000), np.linspace(1e-2, 1.0, 4001)[1:]])
    table = np.zeros(ys.size)
    for start in range(0, ys.size, 1024):  # [chunk, len(ε)] at a time
        y = ys[start:start + 1024, None]
        f = np.maximum(1 - dlt - np.exp(eps) * (1 - y), np.exp(-eps) * (y - dlt)).max(axis=1)
        table[start:start + 1024] = np.maximum(f, 0.0)
    grid, values = ys.tolist(), table.tolist()

    def blow_up_inverse(y: float) -> float:
        return values[max(0, bisect.bisect_right(grid, float(y)) - 1)]

    return blow_up_inverse


@functools.lru_cache(maxsize=256)
def dpsgd_blow_up_inverse(sigma: float, q: float, steps: int) -> BlowUpInverse:
    """b(y) of the claimed DP-SGD mechanism (σ, q, T): ``profile_blow_up_inverse`` of
    ``dpsgd_privacy_profile`` on ε = 0, 0.05, …, 38."""
    epsilons = np.linspace(0.0, 38.0, 761)
    return profile_blow_up_inverse(epsilons, dpsgd_privacy_profile(sigma, q, steps, epsilons))


def claim_rejected(blow_up_inverse: BlowUpInverse, m: int, counts: Sequence[Tuple[int, int]],
                   beta: float) -> bool:
    """Whether any of the K pre-declared guess sets (``counts``: (n_guess, n_correct) each) rejects
    the claim at β/K (Bonferroni): the claim is then refuted at level β."""
    return rejecting_set(blow_up_inverse, m, counts, beta) is not None


def rejecting_set(blow_up_inverse: BlowUpInverse, m: int, counts: Sequence[Tuple[int, int]],
                  beta: float) -> Optional[int]:
    """The index of the first guess set of ``counts`` that rejects the claim at β/K, or None."""
    per = float(beta) / len(counts)
    for j, (r, v) in enumerate(counts):
        if r > 0 and audit_objective(blow_up_inverse, m, r, v, per) > 0:
            return j
    return None


def dpsgd_sigma_bound(m: int, counts: Sequence[Tuple[int, int]], beta: float, q: float, steps: int,
                      sigma_claimed: float, lo_factor: float = 1 / 8, hi_factor: float = 16.0,
                      rtol: float = 2e-3) -> Optional[float]:
    """σ̂: the smallest noise multiplier in [σ·lo_factor, σ·hi_factor] whose DP-SGD claim (q, T) the
    guesses reject (all larger ones are rejected too: docs/audits.md), by bisection in log σ to
    ``rtol``; σ·lo_factor when even that is rejected; None when none in the range is (no evidence).
    With probability >= 1 − β the audited mechanism is not better than σ̂: σ̂ > σ_true."""
    def rejected(s: float) -> bool:
        return claim_rejected(dpsgd_blow_up_inverse(float(s), float(q), int(steps)), m, counts, beta)

    claimed = float(sigma_claimed)
    if rejected(claimed):  # bracket from the claim: the honest answer lies above it, a break's below
        lo, hi = claimed * lo_factor, claimed
        if rejected(lo):
            return lo
    else:
        lo, hi = claimed, claimed * hi_factor
        if not rejected(hi):
            return None
    while hi / lo > 1 + rtol:  # invariant: lo not rejected, hi rejected
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if rejected(mid) else (mid, hi)
    return hi
