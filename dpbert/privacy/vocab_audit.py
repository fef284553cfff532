r"""Distinguishing test of the DP vocabulary: an empirical (ε, δ) LOWER bound.

It runs the production mechanism, ``dpbert.privacy.histogram.noise_and_threshold`` (the function
the Beam job ``dpbert/vocab/beam_histogram.py`` calls on every shard), with the configured σ and
threshold C, on two neighbouring histograms ``trials`` times each: D, and D′ = D + one tuple u of
N words (ℓ of them fresh). Clopper–Pearson intervals on the events "the privacy loss of the
CLAIMED mechanism exceeds λ" (and "a fresh word is released", probability exactly 0 under D)
bound δ(ε) from below for every ε at once.

Contract: ``delta_lower_bound``, ``epsilon_lower_bound`` and ``flagged`` (the claim (ε, δ) is
refuted at confidence 1 − β; an honest mechanism is flagged with probability ≤ β). The test
cannot see below its resolution (``detection_floor``, ``smallest_reportable_delta``): "not
flagged" means "no violation above the resolution", never "(ε, δ)-DP"; it tests one neighbouring
pair and the noise + threshold function only. The statistic, the events and what it can and
cannot show: docs/audits.md ("The vocabulary test in detail").
"""
from __future__ import annotations

import dataclasses
import math
import secrets
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from scipy import special, stats

from dpbert.privacy import histogram

__all__ = ["Pair", "clopper_pearson_lower", "clopper_pearson_upper", "vocab_distinguishing_test"]

#: The neighbouring pair the test draws, in words (the claimed (ε, δ) is that of this pair's
#: mechanism: one tuple's, k = 1; a per-patient ε_V with k tuples per patient is larger and is not
#: what the test exercises).
NEIGHBOUR = "one tuple (D′ = D + one tuple of N words)"

#: Words per mechanism call (bounds the transient arrays: ≈ 50 MB at 2²¹).
CHUNK_WORDS = 1 << 21


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided (1 − α) Clopper–Pearson lower bound on a binomial p from k successes in n."""
    return 0.0 if k <= 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 − α) Clopper–Pearson upper bound on a binomial p from k successes in n."""
    return 1.0 if k >= n else float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


def _run(mechanism: Callable, counts: np.ndarray, trials: int, sigma: float, threshold: float,
         rng: np.random.Generator, chunk_words: int):
    """Released (trial, slot, value) arrays of ``trials`` independent runs on ``counts``."""
    width = counts.size
    per_call = max(1, int(chunk_words) // max(width, 1))
    trial_out: List[np.ndarray] = []
    slot_out: List[np.ndarray] = []
    value_out: List[np.ndarray] = []
    for start in range(0, trials, per_call):
        k = min(per_call, trials - start)
        labels = np.arange(k * width, dtype=np.int64)
        kept = mechanism(labels, np.tile(counts, k), sigma, threshold, rng)
        if not kept:
            continue
        words = np.fromiter((int(w) for w, _ in kept), np.int64, len(kept))
        values = np.fromiter((float(v) for _, v in kept), np.float64, len(kept))
        if words.min() < 0 or words.max() >= k * width or np.unique(words).size != words.size:
            raise AssertionError("the mechanism released a word it was not given, or one word twice")
        if not np.all(np.isfinite(values)):
            raise AssertionError("the mechanism released a non-finite count")
        trial, slot = np.divmod(words, width)
        trial_out.append(trial + start)
        slot_out.append(slot)
        value_out.append(values)
    if not trial_out:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(trial_out), np.concatenate(slot_out), np.concatenate(value_out)


def _privacy_loss(trial, slot, value, trials: int, existing_slots: np.ndarray, counts_d: np.ndarray,
                  fresh_slots: np.ndarray, sigma: float, threshold: float) -> np.ndarray:
    """L(o) per trial (docs/audits.md), +inf when a fresh word was released."""
    loss = np.zeros(trials)
    if existing_slots.size:
        h = counts_d[existing_slots].astype(np.float64)
        # Start from "nothing released" for every existing word, then correct released ones.
        unreleased = special.log_ndtr((threshold - h - 1) / sigma) - special.log_ndtr((threshold - h) / sigma)
        loss += unreleased.sum()
        position = np.full(counts_d.size + fresh_slots.size, -1)
        position[existing_slots] = np.arange(existing_slots.size)
        pos = position[slot]
        hit = pos >= 0
        released = (2.0 * (value[hit] - h[pos[hit]]) - 1.0) / (2.0 * sigma ** 2)
        np.add.at(loss, trial[hit], released - unreleased[pos[hit]])
    if fresh_slots.size:
        is_fresh = np.isin(slot, fresh_slots)
        loss[np.unique(trial[is_fresh])] = np.inf
    return loss


def _declared_levels(levels, existing: int, sigma: float) -> list:
    """Pre-declared privacy-loss levels (claimed mechanism only): the Gaussian part's loss is
    N(μ²/2, μ²) with μ = √(N − ℓ)/σ; 25 points spanning its range."""
    if levels is None:
        if not existing:
            return []
        mu = math.sqrt(existing) / sigma
        levels = (-0.5 * mu ** 2 + mu * np.linspace(-2.0, 8.0, 25)).tolist()
    return [float(x) for x in levels]


def _tail_rows(levels, loss_d, loss_dp, trials: int, alpha: float) -> list:
    """P[loss > λ] under D′ and D with Clopper–Pearson bounds at each level."""
    tail = []
    for lam in levels:
        k_dp = int(np.count_nonzero(loss_dp > lam))
        k_d = int(np.count_nonzero(loss_d > lam))
        tail.append({"level": lam, "p_d_prime": k_dp / trials, "p_d": k_d / trials,
                     "p_d_prime_lower": clopper_pearson_lower(k_dp, trials, alpha),
                     "p_d_upper": clopper_pearson_upper(k_d, trials, alpha)})
    return tail


def _lower_bounds(fresh_lo: float, tail: list, eps_claimed: float, delta_claimed: float):
    """(ε lower bound at the claimed δ, δ lower bound at the claimed ε) from the release rate of
    fresh words and the privacy-loss tail."""
    if fresh_lo > delta_claimed:
        eps_lower = math.inf
    else:
        eps_lower = 0.0
        for row in tail:
            if row["p_d_prime_lower"] > delta_claimed:
                eps_lower = max(eps_lower, math.log((row["p_d_prime_lower"] - delta_claimed) / row["p_d_upper"]))
    delta_lo = fresh_lo
    for row in tail:
        delta_lo = max(delta_lo, row["p_d_prime_lower"] - math.exp(eps_claimed) * row["p_d_upper"])
    return eps_lower, max(delta_lo, 0.0)


def _fresh_release(fresh_trials: int, trials: int, fresh: int, released_fresh: int, alpha: float,
                   p_word: float) -> dict:
    return {
        "trials_with_release": fresh_trials,
        "rate": fresh_trials / trials,
        "rate_lower": clopper_pearson_lower(fresh_trials, trials, alpha),
        "rate_upper": clopper_pearson_upper(fresh_trials, trials, alpha),
        "words_released": released_fresh,
        "per_word_rate": released_fresh / (trials * fresh) if fresh else 0.0,
        "per_word_rate_upper": clopper_pearson_upper(released_fresh, trials * fresh, alpha) if fresh else 0.0,
        "per_word_rate_honest": p_word,
        "rate_honest": -math.expm1(fresh * math.log1p(-p_word)),
    }


@dataclasses.dataclass(frozen=True)
class Pair:
    """The neighbouring pair D, D′ :func:`vocab_distinguishing_test` runs on and the privacy-loss
    levels declared for it (see its Args: ``fresh_words``, ``existing_count``, ``levels``)."""
    fresh_words: Optional[int] = None
    existing_count: Optional[int] = None
    levels: Optional[Sequence[float]] = None


def vocab_distinguishing_test(sigma: float, delta: float, tuple_words: int, threshold_mode: str = "correct",
                              *, threshold_delta_fraction: float = 1.0, pair: Pair = Pair(),
                              trials: int = 100_000, beta: float = 0.05, seed: Optional[int] = None,
                              mechanism: Optional[Callable] = None) -> Dict[str, object]:
    """Run the distinguishing test (docs/audits.md) for the vocabulary configuration
    (``vocab.sigma``, ``vocab.delta``, ``privacy.tuple_words``, ``vocab.threshold_mode``,
    ``vocab.threshold_delta_fraction``; unit = one tuple).

    Args (``fresh_words``, ``existing_count`` and ``levels`` are the fields of ``pair``):
      fresh_words: ℓ, the added tuple's words absent from D (default N: the worst case for the
        threshold); the other N − ℓ are in D with count ``existing_count`` (default
        ceil(C + 4σ): released almost surely, so their privacy loss is the Gaussian's).
      trials: runs on each of D and D′. beta: 1 − confidence of all statements together.
      levels: the pre-declared privacy-loss levels λ (default: 25 points spanning the claimed
        privacy loss's range, from the claimed σ only).
      mechanism: the function under test, ``(words, counts, sigma, threshold, rng) -> kept
        (word, noisy) pairs``; default the production ``histogram.noise_and_threshold``
        (tests pass deliberately broken ones).
      seed: fixes the draws; None = OS entropy.

    Returns a dict: claimed_epsilon, claimed_delta (of ONE added tuple), neighbour (``NEIGHBOUR``), delta_lower_bound (at the claimed ε),
    epsilon_lower_bound (at the claimed δ; inf possible), flagged, confidence, beta, trials,
    detection_floor, smallest_reportable_delta, sigma, threshold, threshold_mode, tuple_words, fresh_words,
    existing_words, existing_count, fresh_release {trials_with_release, rate, rate_lower,
    rate_upper, words_released, per_word_rate, per_word_rate_upper, per_word_rate_honest,
    rate_honest}, privacy_loss_tail [{level, p_d_prime, p_d, p_d_prime_lower, p_d_upper}],
    delta_reference (the analytic δ of THIS pair for the honest mechanism at the claimed ε:
    δ_G(ε; σ, √(N − ℓ)) + 1 − (1 − p)^ℓ, an upper bound on the truth), seconds.
    """
    t_start = time.perf_counter()
    fresh_words, existing_count, levels = pair.fresh_words, pair.existing_count, pair.levels
    n_words = int(tuple_words)
    report = histogram.histogram_report(sigma, delta, n_words, threshold_mode,
                                        threshold_delta_fraction=threshold_delta_fraction)
    sigma, threshold = float(report["sigma"]), float(report["threshold"])
    eps_claimed = float(report["epsilon"])
    delta_claimed = float(delta)  # paper mode: the δ the configuration claims, not the real one
    fresh = n_words if fresh_words is None else int(fresh_words)
    if not 0 <= fresh <= n_words:
        raise ValueError(f"fresh_words must be in [0, {n_words}], got {fresh_words}")
    trials = int(trials)
    if trials < 1 or not 0 < beta < 1:
        raise ValueError("need trials >= 1 and 0 < beta < 1")
    existing = n_words - fresh
    h_exist = int(math.ceil(threshold + 4 * sigma)) if existing_count is None else int(existing_count)
    if existing and h_exist < 1:
        raise ValueError("existing_count must be >= 1")
    mechanism = histogram.noise_and_threshold if mechanism is None else mechanism

    # D: background words (around C) then the existing words of u; D′: + 1 on those, then fresh.
    background = np.maximum(1, np.round([threshold - sigma, threshold, threshold + sigma,
                                         threshold + 3 * sigma])).astype(np.int64)
    counts_d = np.concatenate([background, np.full(existing, h_exist, np.int64)])
    counts_d_prime = np.concatenate([background, np.full(existing, h_exist + 1, np.int64),
                                     np.ones(fresh, np.int64)])
    existing_slots = np.arange(background.size, background.size + existing)
    fresh_slots = np.arange(counts_d.size, counts_d.size + fresh)

    rng = np.random.default_rng(seed if seed is not None else secrets.randbits(128))
    run_d = _run(mechanism, counts_d, trials, sigma, threshold, rng, CHUNK_WORDS)
    run_dp = _run(mechanism, counts_d_prime, trials, sigma, threshold, rng, CHUNK_WORDS)
    loss_d = _privacy_loss(*run_d, trials, existing_slots, counts_d, fresh_slots[:0], sigma, threshold)
    loss_dp = _privacy_loss(*run_dp, trials, existing_slots, counts_d, fresh_slots, sigma, threshold)

    levels = _declared_levels(levels, existing, sigma)
    alpha = float(beta) / (2 * len(levels) + 1)
    fresh_trials = int(np.count_nonzero(np.isinf(loss_dp)))
    fresh_lo = clopper_pearson_lower(fresh_trials, trials, alpha)
    tail = _tail_rows(levels, loss_d, loss_dp, trials, alpha)
    eps_lower, delta_lo = _lower_bounds(fresh_lo, tail, eps_claimed, delta_claimed)
    p_word = histogram.threshold_tail_per_word(sigma, threshold)
    reference = (histogram.gaussian_delta(eps_claimed, sigma, math.sqrt(existing)) if existing else 0.0) \
        - math.expm1(fresh * math.log1p(-p_word))
    return {
        "claimed_epsilon": eps_claimed,
        "claimed_delta": delta_claimed,
        # What the claim is about: the (ε, δ) of ONE added tuple, not the ledger's per-patient ε_V.
        "neighbour": NEIGHBOUR,
        "delta_lower_bound": delta_lo,
        "epsilon_lower_bound": eps_lower,
        "flagged": bool(delta_lo > delta_claimed),
        "confidence": 1.0 - float(beta),
        "beta": float(beta),
        "trials": trials,
        "detection_floor": -math.expm1(math.log(0.5) / trials),
        "smallest_reportable_delta": clopper_pearson_lower(1, trials, alpha),
        "sigma": sigma,
        "threshold": threshold,
        "threshold_mode": threshold_mode,
        "tuple_words": n_words,
        "fresh_words": fresh,
        "existing_words": existing,
        "existing_count": h_exist if existing else None,
        "fresh_release": _fresh_release(fresh_trials, trials, fresh,
                                        int(np.count_nonzero(np.isin(run_dp[1], fresh_slots))), alpha, p_word),
        "privacy_loss_tail": tail,
        "delta_reference": reference,
        "seconds": time.perf_counter() - t_start,
    }
