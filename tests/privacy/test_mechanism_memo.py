"""dpbert.privacy.mechanism_memo: each mechanism's PLD / RDP curve built once per parameter set gives
the ε and the Rényi curve the library's own path gives, bit for bit, cold and warm."""
import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_module
from dp_accounting.rdp import rdp_privacy_accountant as rdp_module

from dpbert.accounting import epsilon as epsilon_module
from dpbert.privacy import mechanism_memo


def _training(q, sigma, count):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count)


# A vocabulary Gaussian composed with training at two step counts (the gate's bisection asks
# exactly these), another q at the same σ, another σ at the same q, and a Gaussian alone (σ ≥ 2
# keeps each PLD small: the test's subject is which PLD is reused, not its size).
EVENTS = [dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(1.25), _training(0.05, 2.0, n)])
          for n in (3, 40)] + [_training(0.1, 2.0, 3), _training(0.05, 3.0, 3), dp_accounting.GaussianDpEvent(3.0)]
ORDERS = (1.5, 2.0, 3.5, 8.0, 32.0)


def _library(monkeypatch, compute):
    """``compute()`` with dp-accounting's own constructions (the memos uninstalled)."""
    with monkeypatch.context() as patch:
        patch.setattr(pld_module, "from_gaussian_mechanism", mechanism_memo._LIBRARY_PLD)
        patch.setattr(rdp_module, "_compute_rdp_poisson_subsampled_gaussian", mechanism_memo._LIBRARY_RDP)
        return compute()


def _curve(event):
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    return accountant.compose(event)._rdp


def test_the_accountant_uses_the_memos():
    assert pld_module.from_gaussian_mechanism is mechanism_memo.from_gaussian_mechanism
    assert rdp_module._compute_rdp_poisson_subsampled_gaussian is mechanism_memo.compute_rdp_poisson_subsampled_gaussian


def _all(compute):
    return [compute(event, kind) for event in EVENTS for kind in ("pld", "rdp")]


def test_epsilons_and_curves_are_the_librarys_bit_for_bit(monkeypatch):
    mechanism_memo.cache_clear()
    cold = _all(lambda event, kind: epsilon_module._epsilon_uncached(event, 1e-6, kind))
    warm = _all(lambda event, kind: epsilon_module._epsilon_uncached(event, 1e-6, kind))
    theirs = _library(monkeypatch, lambda: _all(lambda event, kind: epsilon_module._epsilon_uncached(
        event, 1e-6, kind)))
    assert cold == warm == theirs
    for event in EVENTS:
        np.testing.assert_array_equal(_curve(event), _library(monkeypatch, lambda: _curve(event)))
    q, sigma = 0.05, 2.0
    theirs = mechanism_memo._LIBRARY_RDP(q=q, noise_multiplier=sigma, orders=ORDERS)
    np.testing.assert_array_equal(mechanism_memo.compute_rdp_poisson_subsampled_gaussian(q, sigma, ORDERS), theirs)


def test_a_shared_curve_or_pld_cannot_be_changed_in_place():
    curve = mechanism_memo.compute_rdp_poisson_subsampled_gaussian(0.05, 2.0, ORDERS)
    with pytest.raises(ValueError):
        curve += 1.0
    assert mechanism_memo.compute_rdp_poisson_subsampled_gaussian(0.05, 2.0, ORDERS) is curve
    pld = pld_module.from_gaussian_mechanism(2.0, value_discretization_interval=1e-4, sampling_prob=0.05)
    for pmf in (pld._pmf_remove, pld._pmf_add):
        with pytest.raises(ValueError):
            pmf._probs[0] += 1.0
    assert pld_module.from_gaussian_mechanism(2.0, value_discretization_interval=1e-4, sampling_prob=0.05) is pld


def test_the_comparison_catches_a_memo_that_forgets_the_sampling_rate(monkeypatch):
    """Positive control: a memo keyed by σ alone hands q = 0.05's PLD and curve to q = 0.1."""
    pld_by_sigma, rdp_by_sigma = {}, {}

    def pld_forgetting_q(standard_deviation, **kwargs):
        return pld_by_sigma.setdefault(standard_deviation, mechanism_memo._LIBRARY_PLD(standard_deviation, **kwargs))

    def rdp_forgetting_q(q, noise_multiplier, orders):
        return rdp_by_sigma.setdefault(noise_multiplier, mechanism_memo._LIBRARY_RDP(q, noise_multiplier, orders))

    monkeypatch.setattr(pld_module, "from_gaussian_mechanism", pld_forgetting_q)
    monkeypatch.setattr(rdp_module, "_compute_rdp_poisson_subsampled_gaussian", rdp_forgetting_q)
    for kind in ("pld", "rdp"):
        epsilon_module._epsilon_uncached(EVENTS[0], 1e-6, kind)  # fills the broken memo at q = 0.05
        ours = epsilon_module._epsilon_uncached(EVENTS[2], 1e-6, kind)  # q = 0.1, σ = 2
        theirs = _library(monkeypatch, lambda: epsilon_module._epsilon_uncached(EVENTS[2], 1e-6, kind))
        assert ours != theirs, kind
