"""One privacy budget per DATASET, across every run and output folder: the dataset ledger.

``identity`` (which dataset, where its ledger lives), ``composition`` (the count-free records and the
RDP filter over every entry), ``dataset`` (reserve / finalize by compare-and-swap through
``dpbert.storage``), ``target`` (what the DP stages call).
"""
from dpbert.ledger.composition import LISTED_ONLY, UnitMismatch, compose, ledger_record
from dpbert.ledger.dataset import (BudgetRefused, Reservation, entries_of, finalize, read_ledger,
                                   reserve)
from dpbert.ledger.identity import (LEDGER_ENV, dataset_id_for, default_location, ledger_uri,
                                    location_for, synthetic_dataset_id)
from dpbert.ledger.target import (LedgerTarget, finalize_event, finalize_training, ledger_target,
                                  ledger_target_json, reserve_event, reserve_training)

__all__ = [
    "LISTED_ONLY", "UnitMismatch", "compose", "ledger_record", "BudgetRefused", "Reservation", "entries_of",
    "finalize", "read_ledger", "reserve", "LEDGER_ENV", "dataset_id_for", "default_location", "ledger_uri",
    "location_for", "synthetic_dataset_id", "LedgerTarget", "finalize_event", "finalize_training",
    "ledger_target", "ledger_target_json", "reserve_event", "reserve_training",
]
