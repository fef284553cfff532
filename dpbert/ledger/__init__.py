"""One privacy budget per DATASET, across every run and output folder: the dataset ledger document.

``identity`` (which dataset, where its ledger lives), ``composition`` (the count-free records an
entry charges), ``dataset`` (the document, read fail-closed). What is admitted and the writes:
``dpbert.accounting`` (the budget gate, reserve / finalize by compare-and-swap).
"""
from dpbert.ledger.composition import LISTED_ONLY, UnitMismatch, ledger_record
from dpbert.ledger.dataset import LedgerInvalid, entries_of, read_ledger
from dpbert.ledger.identity import (LEDGER_ENV, dataset_id_for, default_location, ledger_uri, location_for,
                                    synthetic_dataset_id)

__all__ = ["LISTED_ONLY", "UnitMismatch", "ledger_record", "LedgerInvalid", "entries_of", "read_ledger", "LEDGER_ENV",
           "dataset_id_for", "default_location", "ledger_uri", "location_for", "synthetic_dataset_id"]
