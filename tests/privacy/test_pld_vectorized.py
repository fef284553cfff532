"""dpbert.privacy.pld_vectorized: dp-accounting's Gaussian hockey-stick divergence over an array of ε,
vectorized, against the library's own per-ε loop."""
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_mechanism as plm

from dpbert.privacy import pld_vectorized

CASES = [(sigma, q, adjacency) for sigma in (0.3, 1.15, 4.0) for q in (0.01, 0.2, 1.0)
         for adjacency in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD)]


def _epsilons(loss):
    """ε across the support (every 0.04), both boundaries of the subsampled loss included and
    approached geometrically (1e-2 … 1e-12 inside), and 0. The library's loop costs ~10 µs an ε."""
    q = loss.sampling_prob
    hi = -math.log1p(-q) if (q < 1 and loss.adjacency_type == plm.AdjacencyType.ADD) else 40.0
    lo = math.log1p(-q) if (q < 1 and loss.adjacency_type == plm.AdjacencyType.REMOVE) else -40.0
    lo, hi = max(lo, -40.0), min(hi, 40.0)
    grid = np.linspace(lo, hi, 2001)
    inside = (hi - lo) * np.geomspace(1e-2, 1e-12, 50)
    return np.concatenate([grid, lo + inside, hi - inside, [lo * (1 - 1e-12), hi * (1 - 1e-12), 0.0]])


@pytest.mark.parametrize("sigma,q,adjacency", CASES)
def test_vectorized_deltas_equal_the_librarys_loop(sigma, q, adjacency):
    loss = plm.GaussianPrivacyLoss(sigma, sensitivity=1.0, sampling_prob=q, adjacency_type=adjacency)
    eps = _epsilons(loss)
    ours = pld_vectorized.get_delta_for_epsilon(loss, eps)
    theirs = pld_vectorized._LIBRARY(loss, eps)  # the library's per-ε list comprehension
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-300)
    assert pld_vectorized.get_delta_for_epsilon(loss, 0.5) == pld_vectorized._LIBRARY(loss, 0.5)


def test_the_comparison_catches_a_wrong_inverse():
    """Positive control: the other adjacency's inverse (a plausible slip) is far outside tolerance."""
    remove = plm.GaussianPrivacyLoss(1.15, sensitivity=1.0, sampling_prob=0.2,
                                     adjacency_type=plm.AdjacencyType.REMOVE)
    add = plm.GaussianPrivacyLoss(1.15, sensitivity=1.0, sampling_prob=0.2, adjacency_type=plm.AdjacencyType.ADD)
    eps = np.linspace(0.0, 0.2, 101)
    wrong = pld_vectorized.get_delta_for_epsilon(add, eps)
    assert not np.allclose(wrong, pld_vectorized._LIBRARY(remove, eps), rtol=1e-12, atol=1e-300)


def test_the_accountant_uses_it_and_its_epsilon_is_the_librarys():
    import dp_accounting

    from dpbert.accounting import accountant
    from dpbert.accounting import epsilon as epsilon_module

    assert plm.GaussianPrivacyLoss.get_delta_for_epsilon is pld_vectorized.get_delta_for_epsilon
    # σ = 2: the PLD's ~10⁵ discretized ε cost the library's loop ~1 s (σ = 0.7: ~5 s)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(2.0)), 3)
    ours = epsilon_module._epsilon_uncached(event, 1e-6, "pld")
    plm.GaussianPrivacyLoss.get_delta_for_epsilon = pld_vectorized._LIBRARY
    try:
        theirs = epsilon_module._epsilon_uncached(event, 1e-6, "pld")
    finally:
        pld_vectorized.install()
    assert ours == pytest.approx(theirs, rel=1e-12)
