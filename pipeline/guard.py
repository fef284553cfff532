"""The budget guard: the planned ε is computed from the configuration before any component runs.

If it exceeds ``privacy.epsilon_budget`` the run stops (exit 3) and nothing is written.
"""
from __future__ import annotations

from typing import Optional

from dpbert.config import Config


def planned(config: Config) -> Optional[dict]:
    """The planned ledger, or None while no accountant is available for this configuration."""
    try:
        from dpbert.privacy.accountant import planned_ledger
    except ImportError:
        return None
    from dpbert.data.corpus import count_tuples

    n = config.training.dataset_size or count_tuples(config.corpus, config.privacy.tuple_words)
    return planned_ledger(config, n)


def preflight_corpus(config: Config):
    """Open the corpus and read its first document, so a missing path, an empty corpus or a CSV
    without a TEXT column fails before anything is written."""
    from dpbert.data.corpus import iter_documents

    next(iter(iter_documents(config.corpus)))


def check_budget(config: Config) -> Optional[dict]:
    """Preflight the corpus, then compute the planned ledger (None if no accountant yet)."""
    preflight_corpus(config)
    return planned(config)


def over_budget_message(ledger: dict) -> str:
    return (f"planned ε = {ledger['epsilon_total_pld']:.4g} (δ = {ledger['delta']:.3g}) exceeds "
            f"privacy.epsilon_budget = {ledger['epsilon_budget']:.4g}; nothing was run or written. "
            f"Raise vocab.sigma / training.noise_multiplier, or lower training.steps.")
