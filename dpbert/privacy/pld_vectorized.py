"""dp-accounting 0.4.3's Gaussian privacy loss with its hockey-stick divergence over an ARRAY of ε
computed in numpy instead of one Python call per ε.

Why: building the PLD of a Poisson-subsampled Gaussian (connect-the-dots, value discretization
1e-4) evaluates ``get_delta_for_epsilon`` on every discretized ε — 10⁵–10⁷ of them — and the
library inverts the privacy loss in a Python list comprehension (``inverse_privacy_loss`` per ε,
through ``common.log_a_times_exp_b_plus_c``). That loop was ~85 % of an ε's cost (0.6–4 s each)
and ~10 % of the test suite's CPU. Here the same formulas run elementwise on the array:

* without subsampling: x(ℓ) = ±s/2 − ℓσ²/s (``inverse_privacy_loss_without_subsampling``);
* subsampled at q, REMOVE: ℓ₀ = log(e^ℓ/q + 1 − 1/q), x = x₀(ℓ₀); ADD: ℓ₀ = −log(e^{−ℓ}/q + 1 − 1/q),
  x = x₀(ℓ₀); ``math.isclose`` boundaries map to x₀(∓∞) exactly as the scalar code does, and a
  loss outside the support raises as it does;
* δ(ε) = μ_upper_cdf(x) − exp(ε + μ_lower_log_cdf(x)), clipped to [0, 1] (unchanged).

Scalars and other mechanisms go to the library's own code. ``install`` is idempotent; the
equality with the library's loop is a test (tests/privacy/test_pld_vectorized.py).
"""
from __future__ import annotations

import math
import numbers

import numpy as np
from dp_accounting.pld import privacy_loss_mechanism as _plm

_LIBRARY = _plm.GaussianPrivacyLoss.get_delta_for_epsilon


def _isclose(a: np.ndarray, b: float) -> np.ndarray:
    """``math.isclose(a, b)`` elementwise (rel_tol 1e-9, abs_tol 0: symmetric in a and b)."""
    return np.abs(a - b) <= 1e-9 * np.maximum(np.abs(a), abs(b))


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """``common.log_a_times_exp_b_plus_c(a, b, c)`` for a > 0, c < 0 (the subsampled inverse):
    log(a e^b + c) = d + log1p(−e^{log(−c) − d}), d = b + log a; b == 0 gives log(a + c)."""
    d = b + np.log(a)
    log_neg_c = np.log(-c)
    if np.any(log_neg_c >= d[b != 0]):
        raise ValueError("a exp(b) + c must be positive")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = d + np.log1p(-np.exp(log_neg_c - d))
    return np.where(b == 0, np.log(a + c), out)


def inverse_privacy_loss(loss: _plm.GaussianPrivacyLoss, privacy_losses: np.ndarray) -> np.ndarray:
    """``loss.inverse_privacy_loss`` of every element (the library's formulas and edge cases)."""
    ls = np.asarray(privacy_losses, dtype=float)
    q = loss.sampling_prob
    add = loss.adjacency_type == _plm.AdjacencyType.ADD
    if q == 1.0:
        unsub = ls
    else:
        bound = -math.log(1 - q) if add else math.log(1 - q)
        edge = _isclose(ls, bound)
        if np.any(ls[~edge] > bound) if add else np.any(ls[~edge] <= bound):
            raise ValueError(f"privacy loss outside the support of the subsampled mechanism (q = {q})")
        with np.errstate(over="ignore"):
            inner = _log_a_exp_b_plus_c(1 / q, np.where(edge, 0.0, -ls if add else ls), 1 - 1 / q)
        unsub = np.where(edge, math.inf if add else -math.inf, -inner if add else inner)
    shift = 0.5 * loss.sensitivity if add else -0.5 * loss.sensitivity
    with np.errstate(invalid="ignore"):
        return shift - unsub * (loss._standard_deviation ** 2) / loss.sensitivity  # pylint: disable=protected-access


def get_delta_for_epsilon(self, epsilon):
    """``GaussianPrivacyLoss.get_delta_for_epsilon`` with the inverse vectorized (module docstring)."""
    if isinstance(epsilon, numbers.Number):
        return _LIBRARY(self, epsilon)
    epsilons = np.asarray(epsilon)
    deltas = np.zeros_like(epsilons, dtype=float)
    if self.sampling_prob == 1.0:
        inverse_indices = np.full_like(epsilons, True, dtype=bool)
    elif self.adjacency_type == _plm.AdjacencyType.ADD:
        inverse_indices = epsilons < -math.log1p(-self.sampling_prob)
    else:
        inverse_indices = epsilons > math.log1p(-self.sampling_prob)
        other = np.logical_not(inverse_indices)
        deltas[other] = -np.expm1(epsilons[other])
    x_cutoffs = inverse_privacy_loss(self, epsilons[inverse_indices])
    deltas[inverse_indices] = (self.mu_upper_cdf(x_cutoffs)
                               - np.exp(epsilons[inverse_indices] + self.mu_lower_log_cdf(x_cutoffs)))
    return np.clip(deltas, 0, 1)


def install() -> None:
    """Make dp-accounting's Gaussian privacy loss use :func:`get_delta_for_epsilon`."""
    _plm.GaussianPrivacyLoss.get_delta_for_epsilon = get_delta_for_epsilon
