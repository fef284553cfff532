"""dp-accounting 0.4.3's per-mechanism constructions built once per parameter set, composed as before.

Why: the gate's step search, the planners and the reports ask for the ε of the same mechanism at
many step counts (``largest_admitted`` bisects the count; a ledger adds one run to the same
vocabulary). The library rebuilds the mechanism each time, and that construction, not the
composition, is most of an ε's cost:

* PLD: ``PLDAccountant`` calls ``privacy_loss_distribution.from_gaussian_mechanism(σ, Δ, q, …)``
  once per Gaussian or Poisson-subsampled Gaussian event, then ``self_compose(count)`` on it;
* RDP: ``RdpAccountant`` adds ``count × _compute_rdp_poisson_subsampled_gaussian(q, σ, orders)``.

Both are pure functions of their (hashable) arguments, and their results are not modified after
construction (a PLD's ``compose``/``self_compose`` return new objects; the RDP accountant scales a
copy), and the cached arrays are made read-only so that a library change which did modify them
would raise instead of changing the next ε. Memoising them by the full argument tuple therefore
returns the very values the library computes: every ε is bit-identical
(tests/privacy/test_mechanism_memo.py compares the library's own path on a set of events, with a
positive control). ``install`` is idempotent.
"""
from __future__ import annotations

import functools

import numpy as np
from dp_accounting.pld import pld_pmf as _pld_pmf
from dp_accounting.pld import privacy_loss_distribution as _pld
from dp_accounting.rdp import rdp_privacy_accountant as _rdp

#: A Gaussian or subsampled Gaussian PLD at discretization 1e-4 takes 1.6–5.9 MB (σ from 2 down to
#: 0.3, measured), so 16 of them stay under ~100 MB; a step search uses two (vocabulary, training).
_PLD_CACHE_SIZE = 16
_LIBRARY_PLD = _pld.from_gaussian_mechanism
_LIBRARY_RDP = _rdp._compute_rdp_poisson_subsampled_gaussian  # pylint: disable=protected-access


@functools.lru_cache(maxsize=_PLD_CACHE_SIZE)
def _gaussian_pld(*args, **kwargs):
    pld = _LIBRARY_PLD(*args, **kwargs)
    for pmf in (pld._pmf_remove, pld._pmf_add):  # pylint: disable=protected-access
        if isinstance(pmf, _pld_pmf.DensePLDPmf):  # an array (a sparse PMF holds a dict)
            pmf._probs.setflags(write=False)  # pylint: disable=protected-access  (shared: an update raises)
    return pld


@functools.wraps(_LIBRARY_PLD)
def from_gaussian_mechanism(*args, **kwargs):
    """The library's ``from_gaussian_mechanism``, built once per argument tuple."""
    return _gaussian_pld(*args, **kwargs)


@functools.lru_cache(maxsize=1024)
def _rdp_curve(q: float, noise_multiplier: float, orders: tuple) -> np.ndarray:
    curve = np.asarray(_LIBRARY_RDP(q=q, noise_multiplier=noise_multiplier, orders=orders))
    curve.setflags(write=False)  # shared between callers: an in-place update would raise
    return curve


def compute_rdp_poisson_subsampled_gaussian(q, noise_multiplier, orders):
    """The library's per-step RDP curve of the Poisson-subsampled Gaussian, once per (q, σ, orders)."""
    return _rdp_curve(q, noise_multiplier, tuple(orders))


def install() -> None:
    """Route dp-accounting's two constructions through the memos (idempotent)."""
    _pld.from_gaussian_mechanism = from_gaussian_mechanism
    # pylint: disable-next=protected-access
    _rdp._compute_rdp_poisson_subsampled_gaussian = compute_rdp_poisson_subsampled_gaussian


def cache_clear() -> None:
    _gaussian_pld.cache_clear()
    _rdp_curve.cache_clear()
