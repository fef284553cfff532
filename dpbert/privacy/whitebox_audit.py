r"""White-box one-run audit of DP-SGD with gradient canaries: the canaries, the scores and
the audit's power — the math. The training harness that runs real DP-SGD steps with these canaries
is ``dpbert.evaluate.whitebox`` (module docstring there: what runs, which variable, what the audit
can and cannot detect); the ε lower bound is ``dpbert.privacy.one_run_audit``.

Canaries (m of them; vectors, no forward/backward pass each): c_i = C/√d' · s ⊙ H[π_i], a row
of the d' × d' Sylvester–Hadamard matrix H (entries ±1) with secret random signs s and a secret
random choice π of m ≤ d' distinct rows (``canary_layout``, from a secret key). Each has norm
exactly C — a valid clipped per-example gradient, so adding/removing canary i is exactly the
add/remove-one neighbour the accountant charges — and they are mutually ORTHOGONAL and dense
(every coordinate ±C/√d'). Any fixed set of norm-C vectors gives a valid audit (the theorem
needs only the independent ½ inclusions); orthogonality removes the canary-to-canary cross-talk
that random directions have (≈ √(#canaries sampled per step / d') per step: 0.12 at the demo's
228 canaries per step and d' = 16384). Measured on the demo configuration (450 steps, m = 10⁴):
with random directions the noise-off positive control reached 3.88 < ε = 4.97 (3952 of 4000
guesses right: the excluded canaries' scores spread by the cross-talk); with orthogonal
canaries it exceeds it (README, "Privacy audits"). Sums and projections are one fast
Walsh–Hadamard transform per step (``fwht``): O(T·d' log d') instead of O(T·m·d'), nothing of
size m·d' in memory. Canary i is included with probability ½ (``one_run_audit.draw_inclusion``)
and, when included, is a unit of its own of the audited run's sampler (the harness enrols it), so
it is Poisson-sampled with the run's q independently at every step, like a real unit;
``canary_sum_t = Σ_{i included, sampled at t} c_i``.

Score (white-box, the log-likelihood ratio): with y_{i,t} = ⟨g̃_t, c_i⟩/C² (≈ N(1, σ²) if canary
i was in step t's batch, N(0, σ²) if not, up to cross-talk),
    s_i = Σ_t log(1 − q + q·exp((y_{i,t} − ½)/σ²))          (``np.logaddexp``: stable)
with σ = the σ the ledger CLAIMS (``noise_multiplier``). Guesses: the 12 pre-declared (k₊, k₋) of
``whitebox_k_grid(m)``. The reported bound is the f-DP one-run test (``dpbert.privacy.fdp_audit``,
Mahloujifar, Melis & Chaudhuri 2025) of the claimed DP-SGD trade-off curve (σ, q, T), Bonferroni
over the 12 guess sets at confidence 1 − β (``fdp_sigma_bound``: σ̂, then ε(σ̂) by the accountant);
Steinke, Nasr & Jagielski 2023's (ε, δ) bound (``one_run_audit.audit_best_of``) is kept next to it
for reference. Why: SNJ's test sees only the (ε, δ) point, and a quarter of the included canaries
never take part at q·T = 1.37, so its noise-off control stayed at 0.98 × the demo's claim; the
f-DP test knows the claimed curve, subsampling included, and its noise-off control reaches 2.78 ×
(docs/audits.md). The grid depends on m only: k = 2, 5, 10, 20, 40, 45 % of m, one-sided (k, 0) and symmetric (k, k).
Its largest choice is (45 %, 45 %), not the black-box grid's (50 %, 50 %): that one can be all
right only when exactly m/2 canaries are included (a ½-draw misses by ≈ √m/2), so a perfect
scorer is capped below it.

Power (``weakest_detected_noise_factor``): the largest factor s < 1 (steps of 0.05) such that
the ideal audit (``simulate_scores``: no cross-talk, no real gradient) of a release with noise σ·s
is expected to refute the claim (median of 5 simulated runs): 0.5 at the demo's (q, σ, T) with
m = 2,000, 0.55 with m = 10⁴. A break between that factor and 1 is not expected to be seen.

The harness returns next to it ``epsilon_upper_bound``, the accountant's ε of the SAME
(σ_claimed, q, T) at δ (``accountant.dpsgd_epsilon``, PLD) — a lower bound above it means the
implementation or the ledger is wrong (or, with probability ≤ β, bad luck;
``one_run_audit.assert_audit_consistent``) — and ``max_reachable_lower_bound`` (here), the bound with every guess right for this m, δ, β and k-grid
(white-box grid: ≈ 4.98 / 5.50 / 5.51 for m = 10³ / 2·10³ / 10⁴ at δ = 1e-5, 95 %; the
black-box grid's 2.87 at m = 10²): a claimed ε above it cannot be refuted by this audit whatever
the implementation does.
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


#: The white-box audit's pre-declared guess fractions (module docstring: why 45 %, not 50 %).
WHITEBOX_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.4, 0.45)


def whitebox_k_grid(m: int):
    """The white-box audit's (k₊, k₋) choices: ``default_k_grid(m, WHITEBOX_FRACTIONS)``."""
    return one_run.default_k_grid(int(m), WHITEBOX_FRACTIONS)


def max_reachable_lower_bound(m: int, beta: float = 0.05, delta: float = 0.0,
                              candidates: Optional[Sequence[Tuple[int, int]]] = None) -> float:
    """The bound ``audit_best_of`` reports when every guess is right: max over the k-grid of
    ``epsilon_lower_bound(r, r, β/K, δ, m)``, r = k₊ + k₋ (the audit's power; module docstring).
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
