"""One-run privacy audit (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1)
Training Run", NeurIPS 2023, arXiv:2305.08846).

Protocol: ``m`` canaries, each included in the training data independently with probability
1/2 (``S_i`` uniform in {-1, +1}). After the ONE training run, every canary gets a score (here:
its exposure, ``dpbert.evaluate.canary``); the auditor guesses "in" for the ``k+`` highest
scores, "out" for the ``k-`` lowest and abstains on the rest. ``r = k+ + k-`` guesses, ``v`` of
them correct.

Contract: :func:`p_value` is the p-value of "training is (ε, δ)-DP" by the paper's Theorem 3.1
(δ >= 0; cross-checked against the authors' reference code); :func:`epsilon_lower_bound` reports
the smallest ε the data cannot reject at level β, so ``P[ε̂ > ε*] <= β``. The derivation:
docs/audits.md ("The one-run bound").

Choosing k: the bound is valid for ``k+``/``k-`` fixed before the scores are seen. Trying
several and reporting the best inflates the bound; :func:`audit_best_of` evaluates each of
``K`` pre-declared choices at level ``β / K`` (Bonferroni / union bound) and reports the max,
which is valid at level β.

What is audited: the neighbouring relation that the canaries exercise. A canary appended as
its own training example (``canary.canary_examples``) is add/remove-one, matching the DP-SGD
accountant's ε; a canary written into an existing example (``canary.insert_canaries``) turns the
neighbour into a substitution, whose ε can be up to about twice the add/remove ε; a canary
inserted c times is a group of c. :func:`assert_audit_consistent` compares a lower bound with
an upper bound for the SAME relation and δ; a lower bound above the upper bound means the
accounting or the DP implementation is wrong (or, with probability <= β, bad luck), and fails
the run.
"""
from __future__ import annotations

import functools
import math
import secrets
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize, special, stats

__all__ = [
    "AuditInconsistencyError", "p_value", "epsilon_lower_bound", "guesses_from_scores",
    "audit_from_scores", "default_k_grid", "audit_best_of", "draw_inclusion",
    "assert_audit_consistent",
]


class AuditInconsistencyError(AssertionError):
    """The empirical ε lower bound exceeds the accountant's ε upper bound."""


def _check_counts(r: int, v: int, m: Optional[int], beta: float, delta: float):
    if not (isinstance(r, (int, np.integer)) and isinstance(v, (int, np.integer))):
        raise TypeError("r and v must be integers")
    if not 0 <= v <= r:
        raise ValueError(f"need 0 <= v <= r, got v={v}, r={r}")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    if delta > 0:
        if m is None:
            raise ValueError("delta > 0 needs m, the number of canaries (the 2mδ term)")
        if m < r:
            raise ValueError(f"need r <= m, got r={r}, m={m}")


def p_value(epsilon: float, r: int, v: int, delta: float = 0.0, m: Optional[int] = None) -> float:
    """Right-hand side of (★): an upper bound on ``P[W >= v]`` under (ε, δ)-DP, capped at 1."""
    r, v = int(r), int(v)
    _check_counts(r, v, m, 0.5, delta)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    q = float(special.expit(epsilon))
    f_v = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(f_v, 1.0)
    i = np.arange(1, v + 1)
    f_v_minus_i = stats.binom.sf(v - i - 1, r, q)  # P[Binomial >= v - i]
    alpha = float(np.max((f_v_minus_i - f_v) / i))
    return min(f_v + 2.0 * int(m) * float(delta) * alpha, 1.0)


@functools.lru_cache(maxsize=4096)
def epsilon_lower_bound(r: int, v: int, beta: float = 0.05, delta: float = 0.0,
                        m: Optional[int] = None, *, epsilon_max: float = 100.0,
                        grid_points: int = 400) -> float:
    """``inf{ε >= 0 : p_value(ε; r, v, δ, m) > β}`` (docs/audits.md): with probability at least
    ``1 - β`` the true ε of an (ε, δ)-DP training run is at least this. ``m`` (number of
    canaries) is required when ``delta > 0``. 0 when even ε = 0 is not rejected (e.g.
    ``v <= r / 2``). Memoised (a pure function of scalars; an audit's power table asks for the
    same (r, v) many times, each a root search over binomial tails)."""
    r, v = int(r), int(v)
    _check_counts(r, v, m, beta, delta)
    if r == 0 or p_value(0.0, r, v, delta, m) > beta:
        return 0.0

    def rejected(eps: float) -> bool:
        return p_value(eps, r, v, delta, m) <= beta

    # an upper end that is not rejected
    hi = 1.0
    while rejected(hi):
        hi *= 2.0
        if hi > epsilon_max:
            return float(epsilon_max)
    lo = 0.0  # invariant: lo is rejected, hi is not
    if delta > 0:
        # the p-value need not be monotone in ε: bracket the FIRST unrejected ε by a scan up
        # from 0 (the grid ends at hi, which is not rejected, so the scan always stops)
        for eps in np.linspace(0.0, hi, int(grid_points) + 1)[1:]:
            if not rejected(float(eps)):
                hi = float(eps)
                break
            lo = float(eps)
    return float(optimize.bisect(lambda e: beta - p_value(e, r, v, delta, m), lo, hi, xtol=1e-9))


def guesses_from_scores(scores: Sequence[float], k_plus: int, k_minus: int) -> np.ndarray:
    """+1 for the ``k_plus`` highest scores, -1 for the ``k_minus`` lowest, 0 otherwise. Ties are
    broken by canary index (fixed before the inclusion draw, so independent of it)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    m = scores.size
    k_plus, k_minus = int(k_plus), int(k_minus)
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k_plus, k_minus >= 0 and k_plus + k_minus <= m={m}, "
                         f"got {k_plus}, {k_minus}")
    if np.isnan(scores).any():
        raise ValueError("scores must not be NaN")
    order = np.argsort(-scores, kind="stable")  # highest first, lower index first among ties
    guesses = np.zeros(m, dtype=np.int8)
    guesses[order[:k_plus]] = 1
    if k_minus:
        guesses[order[m - k_minus:]] = -1
    return guesses


def audit_from_scores(scores: Sequence[float], included: Sequence[bool], k_plus: int,
                      k_minus: int, beta: float = 0.05, delta: float = 0.0) -> Dict[str, float]:
    """One-run audit with a FIXED ``(k_plus, k_minus)``. ``included[i]``: canary i was in the
    training data (drawn with probability 1/2, :func:`draw_inclusion`).

    Returns ``{"epsilon_lower_bound", "r", "v", "m", "k_plus", "k_minus", "beta", "delta",
    "accuracy", "p_value_at_0"}``.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    included = np.asarray(included, dtype=bool).reshape(-1)
    if scores.shape != included.shape:
        raise ValueError(f"{scores.size} scores but {included.size} inclusion flags")
    m = int(scores.size)
    guesses = guesses_from_scores(scores, k_plus, k_minus)
    truth = np.where(included, 1, -1)
    r = int(np.count_nonzero(guesses))
    v = int(np.count_nonzero(guesses * truth == 1))
    eps = epsilon_lower_bound(r, v, beta, delta, m)
    return {"epsilon_lower_bound": eps, "r": r, "v": v, "m": m, "k_plus": int(k_plus),
            "k_minus": int(k_minus), "beta": float(beta), "delta": float(delta),
            "accuracy": v / r if r else float("nan"),
            "p_value_at_0": p_value(0.0, r, v, delta, m) if r else 1.0}


def default_k_grid(m: int, fractions: Iterable[float] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
                   symmetric: bool = True) -> List[Tuple[int, int]]:
    """Pre-declared ``(k_plus, k_minus)`` candidates: ``k_plus = round(f · m)`` for each fraction
    (at least 1), with ``k_minus = 0`` and, if ``symmetric``, also ``k_minus = k_plus`` (when
    ``2 k_plus <= m``). Depends on m only, never on the scores."""
    out: List[Tuple[int, int]] = []
    for f in fractions:
        k = max(1, int(round(f * m)))
        if k <= m and (k, 0) not in out:
            out.append((k, 0))
        if symmetric and 2 * k <= m and (k, k) not in out:
            out.append((k, k))
    return out


def audit_best_of(scores: Sequence[float], included: Sequence[bool],
                  candidates: Optional[Sequence[Tuple[int, int]]] = None, beta: float = 0.05,
                  delta: float = 0.0) -> Dict[str, object]:
    """Audit with ``K`` pre-declared ``(k_plus, k_minus)`` choices, each at level ``β / K``
    (union bound), reporting the largest bound: ``P[reported ε > ε*] <= β``. ``candidates``
    default: :func:`default_k_grid`. Returns the best audit dict plus ``"beta_total"``,
    ``"candidates"`` and ``"all"`` (every per-choice result)."""
    m = len(np.asarray(scores).reshape(-1))
    candidates = default_k_grid(m) if candidates is None else [tuple(c) for c in candidates]
    if not candidates:
        raise ValueError("no (k_plus, k_minus) candidate")
    per_beta = beta / len(candidates)
    results = [audit_from_scores(scores, included, kp, km, per_beta, delta) for kp, km in candidates]
    best = max(results, key=lambda res: res["epsilon_lower_bound"])
    out: Dict[str, object] = dict(best)
    out.update({"beta_total": float(beta), "candidates": [list(c) for c in candidates],
                "all": results})
    return out


def draw_inclusion(m: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """``m`` independent fair coins (OS CSPRNG unless ``rng``): which canaries are included."""
    if rng is None:
        system = secrets.SystemRandom()
        return np.asarray([system.random() < 0.5 for _ in range(int(m))], dtype=bool)
    return np.asarray(rng.random(int(m)) < 0.5, dtype=bool)


def assert_audit_consistent(lower, upper: float, tol: float = 1e-9) -> None:
    """Raise :class:`AuditInconsistencyError` if the empirical lower bound exceeds the
    accountant's upper bound (beyond ``tol``), or either is NaN. ``lower``: a float or an audit
    dict (its ``"epsilon_lower_bound"``). Both must be for the same δ and neighbouring relation
    (docs/audits.md)."""
    if isinstance(lower, dict):
        lower = lower["epsilon_lower_bound"]
    lower, upper = float(lower), float(upper)
    if math.isnan(lower) or math.isnan(upper):
        raise AuditInconsistencyError(f"audit comparison with NaN (lower={lower}, upper={upper})")
    if lower > upper + tol:
        raise AuditInconsistencyError(
            f"empirical privacy lower bound ε >= {lower:.4f} exceeds the accountant's upper bound "
            f"ε <= {upper:.4f}: the privacy accounting or the DP-SGD implementation is wrong")
