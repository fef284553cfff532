r"""White-box one-run audit of DP-SGD with gradient canaries: the canaries, the scores and the
audit's power — the math. The training harness that runs real DP-SGD steps with these canaries is
``dpbert.evaluate.whitebox``; the ε lower bound is the f-DP one-run test
(``dpbert.privacy.fdp_audit``), with ``dpbert.privacy.one_run_audit``'s (ε, δ) bound next to it.

Contract: m canaries of norm exactly C, mutually orthogonal (secret signed rows of a Hadamard
matrix, ``canary_layout``: adding or removing one is the add/remove-one neighbour the accountant
charges), each included with probability ½ and Poisson-sampled like a real unit; scores are the
log-likelihood ratios at the σ the ledger CLAIMS, guessed on the pre-declared
``whitebox_k_grid(m)``; ``weakest_detected_noise_factor`` is the audit's power and
``max_reachable_lower_bound`` the bound with every guess right (a claimed ε above it cannot be
refuted). The canaries' layout, the score, the guess grid and the power, with measured values:
docs/audits.md ("The canaries, the scores and the power").
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Tuple

import numpy as np

from dpbert.privacy import one_run_audit as one_run

__all__ = [
    "fwht", "probe_dims", "canary_layout", "whitebox_k_grid", "canary_vectors", "canary_sums",
    "canary_projections", "llr_scores", "max_reachable_lower_bound", "WHITEBOX_FRACTIONS",
    "guess_counts", "fdp_sigma_bound", "simulate_scores", "noise_factor_detected", "weakest_detected_noise_factor",
    "NOISE_FACTORS",
]


# ----------------------------------------------------------------------------- canaries
def fwht(x: np.ndarray) -> np.ndarray:
    """The (unnormalised, Sylvester-order) Walsh–Hadamard transform along the last axis, whose
    length must be a power of two: ``fwht(x) = x @ H`` with H = ``scipy.linalg.hadamard(n)``
    (symmetric, entries ±1, H·H = n·I). float64, O(n log n) per row."""
    x = np.array(x, dtype=np.float64, copy=True)
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"the Walsh–Hadamard transform needs a power-of-two length, got {n}")
    lead = x.shape[:-1]
    h = 1
    while h < n:
        y = x.reshape(*lead, n // (2 * h), 2, h)
        a = y[..., 0, :].copy()
        y[..., 0, :] += y[..., 1, :]
        y[..., 1, :] = a - y[..., 1, :]
        h *= 2
    return x


def probe_dims(variable_size: int, canary_dims: int) -> int:
    """d': the largest power of two ≤ min(variable size, ``canary_dims``)."""
    cap = min(int(variable_size), int(canary_dims))
    if cap < 2:
        raise ValueError(f"the probe needs at least 2 coordinates, got {cap}")
    return 1 << (cap.bit_length() - 1)


def canary_layout(key: int, m: int, dims: int) -> Tuple[np.ndarray, np.ndarray]:
    """(signs s ∈ {±1}^d', rows π ∈ [d']^m distinct): canary i is c_i = C/√d' · s ⊙ H[π_i], a
    pure function of the secret key (regenerated for scoring instead of kept)."""
    if m > dims:
        raise ValueError(f"canaries ({m}) must be <= the probe's d' = {dims} (orthogonal canaries): "
                         f"raise canary_dims or use fewer canaries")
    rng = np.random.default_rng([int(key), 0x5EED])
    signs = rng.integers(0, 2, size=int(dims)).astype(np.float64) * 2.0 - 1.0
    return signs, rng.permutation(int(dims))[: int(m)]


def canary_vectors(key: int, m: int, dims: int, clip_norm: float) -> np.ndarray:
    """The canaries as a dense float64 ``[m, d']`` matrix (tests; O(m·d') memory)."""
    signs, rows = canary_layout(key, m, dims)
    basis = np.zeros((int(m), int(dims)))
    basis[np.arange(int(m)), rows] = 1.0
    return fwht(basis) * signs * (float(clip_norm) / math.sqrt(dims))


def canary_sums(key: int, participation: np.ndarray, dims: int, clip_norm: float) -> np.ndarray:
    """float32 ``[T, d']``: row t = Σ_i participation[t, i] · c_i (``participation`` bool
    ``[T, m]``: canary i included AND Poisson-sampled at step t) = C/√d' · s ⊙ H·v_t with
    v_t[π_i] = participation[t, i]: one transform per step."""
    participation = np.asarray(participation, dtype=bool)
    steps, m = participation.shape
    signs, rows = canary_layout(key, m, dims)
    v = np.zeros((steps, int(dims)))
    v[:, rows] = participation
    return (fwht(v) * signs * (float(clip_norm) / math.sqrt(dims))).astype(np.float32)


def canary_projections(key: int, observed: np.ndarray, m: int, clip_norm: float) -> np.ndarray:
    """``[T, m]``: y_{t,i} = ⟨g̃_t, c_i⟩ / C² (float64) for the observed noisy sums ``[T, d']``
    = (H·(s ⊙ g̃_t))[π_i] / (C·√d')."""
    observed = np.asarray(observed, dtype=np.float64)
    dims = observed.shape[1]
    signs, rows = canary_layout(key, m, dims)
    return fwht(observed * signs)[:, rows] / (float(clip_norm) * math.sqrt(dims))


def llr_scores(projections: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """s_i = Σ_t log(1 − q + q·exp((y_{t,i} − ½)/σ²)): the log-likelihood ratio of "canary i is
    Poisson-sampled with rate q at each step" vs "absent", for y ~ N(1 or 0, σ²)."""
    y = np.asarray(projections, dtype=np.float64)
    q, sigma = float(q), float(sigma)
    if not 0 < q <= 1 or not sigma > 0:
        raise ValueError(f"need 0 < q <= 1 and sigma > 0, got q={q}, sigma={sigma}")
    log_out = math.log1p(-q) if q < 1 else -math.inf
    return np.logaddexp(log_out, math.log(q) + (y - 0.5) / sigma ** 2).sum(axis=0)


@functools.lru_cache(maxsize=64)
def _max_reachable(m: int, beta: float, delta: float, candidates: Tuple[Tuple[int, int], ...]) -> float:
    per_beta = beta / len(candidates)
    return max(one_run.epsilon_lower_bound(kp + km, kp + km, per_beta, delta, m) for kp, km in candidates)


#: The white-box audit's pre-declared guess fractions (docs/audits.md: why 45 %, not 50 %).
WHITEBOX_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.4, 0.45)


def whitebox_k_grid(m: int):
    """The white-box audit's (k₊, k₋) choices: ``default_k_grid(m, WHITEBOX_FRACTIONS)``."""
    return one_run.default_k_grid(int(m), WHITEBOX_FRACTIONS)


def max_reachable_lower_bound(m: int, beta: float = 0.05, delta: float = 0.0,
                              candidates: Optional[Sequence[Tuple[int, int]]] = None) -> float:
    """The bound ``audit_best_of`` reports when every guess is right: max over the k-grid of
    ``epsilon_lower_bound(r, r, β/K, δ, m)``, r = k₊ + k₋ (the audit's power; docs/audits.md).
    An idealisation: the (m/2, m/2) choice can be all right only if exactly m/2 canaries are in,
    so a real draw (±√m/2) stays a little below it even with perfect scores."""
    m = int(m)
    candidates = one_run.default_k_grid(m) if candidates is None else candidates
    return _max_reachable(m, float(beta), float(delta), tuple((int(a), int(b)) for a, b in candidates))


# ----------------------------------------------------------------------------- f-DP scoring
def guess_counts(scores: np.ndarray, included: np.ndarray, candidates) -> list:
    """(n_guess, n_correct) of each pre-declared (k₊, k₋): the guesses of ``guesses_from_scores``."""
    truth = np.where(np.asarray(included, bool), 1, -1)
    out = []
    for kp, km in candidates:
        g = one_run.guesses_from_scores(scores, kp, km)
        out.append((int(np.count_nonzero(g)), int(np.count_nonzero(g * truth == 1))))
    return out


def fdp_sigma_bound(scores, included, candidates, beta: float, q: float, steps: int, sigma: float):
    """(σ̂, counts): the f-DP one-run bound on the noise multiplier (``fdp_audit.dpsgd_sigma_bound``:
    with probability >= 1 − β the audited release is no better than DP-SGD at σ̂; None: no evidence)."""
    from dpbert.privacy import fdp_audit

    counts = guess_counts(scores, included, candidates)
    return fdp_audit.dpsgd_sigma_bound(len(included), counts, beta, q, steps, sigma), counts


def simulate_scores(m: int, q: float, steps: int, sigma: float, noise_factor: float,
                    rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """(scores, included) of the IDEAL white-box audit of a release with noise σ·``noise_factor``
    scored at the claimed σ: y_{t,i} = 1[i included and sampled at t] + N(0, (σ·factor)²), no
    cross-talk, no real gradient."""
    included = rng.random(int(m)) < 0.5
    part = (rng.random((int(steps), int(m))) < q) & included
    y = part + float(noise_factor) * float(sigma) * rng.standard_normal((int(steps), int(m)))
    return llr_scores(y, q, sigma), included


#: The noise scale factors the power scan tries, weakest break first.
NOISE_FACTORS = tuple(round(1.0 - 0.05 * i, 2) for i in range(1, 21))


def noise_factor_detected(factor: float, m: int, q: float, steps: int, sigma: float, beta: float, candidates,
                          replicates: int = 5, seed: int = 0) -> bool:
    """Whether the audit is expected to refute the claim (σ, q, T) when the release's noise is
    σ·``factor``: the claim is rejected (``fdp_audit.claim_rejected``) at the median, over
    ``replicates`` simulated ideal runs (``simulate_scores``), of each guess set's counts."""
    from dpbert.privacy import fdp_audit

    rng = np.random.default_rng([int(seed), int(round(factor * 1000))])
    runs = [guess_counts(*simulate_scores(m, q, steps, sigma, factor, rng), candidates)
            for _ in range(int(replicates))]
    median = [tuple(int(x) for x in np.median(np.asarray(c), axis=0)) for c in zip(*runs)]
    return fdp_audit.claim_rejected(fdp_audit.dpsgd_blow_up_inverse(float(sigma), float(q), int(steps)),
                                    int(m), median, beta)


def weakest_detected_noise_factor(m: int, q: float, steps: int, sigma: float, beta: float, candidates,
                                  factors: Sequence[float] = NOISE_FACTORS, replicates: int = 5,
                                  seed: int = 0) -> Optional[float]:
    """The largest factor s < 1 (``factors``, tried from the weakest break down) whose release
    with noise σ·s the audit is expected to refute (``noise_factor_detected``); None if none."""
    for factor in sorted(factors, reverse=True):
        if noise_factor_detected(factor, m, q, steps, sigma, beta, candidates, replicates, seed):
            return float(factor)
    return None
