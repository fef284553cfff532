"""One append-only privacy ledger per dataset: the document, read fail-closed.

The ledger object (``<location>/<dataset_id>.json``, written only through ``dpbert.storage``)::

    {"schema": "dpbert.ledger/2", "dataset_id", "unit": "tuple" | "patient", "delta",
     "budget": <the pinned filter, dpbert.accounting.filter.Pin.to_dict()> | absent,
     "entries": {<entry id>: {"id", "chain", "mechanism", "stage", "run_id", "pipeline_root",
                              "time", "updated", "status": "reserved" | "finalized", "unit",
                              "planned": [records], "executed": [records] | null,
                              "epsilon_budget", "config_key", "resume_key", "plan_key"}}}

Records are ``composition.ledger_record`` forms: public parameters and dp-accounting events, never an
exact count. Who writes it and what is admitted: ``dpbert.accounting`` (reserve / finalize by
compare-and-swap, the budget gate inside it). Schema 1 (no pinned budget) is read and upgraded at
the next reservation.

Fail closed (``LedgerInvalid``, exit 2, naming the file; nothing is ever replaced): a document that
is not JSON, has no ``schema`` key, names an unknown or newer schema, belongs to another dataset
(its ``dataset_id`` differs from the one asked for, or from its own file name: a copied file), or
whose entries are not a mapping. Each rewrite first keeps the previous generation beside it
(``previous_uri``).
"""
from __future__ import annotations

import datetime
import posixpath
from typing import Any, Dict, Iterable, List, Mapping, Optional

from dpbert import storage
from dpbert.config import ConfigError, normalise_dataset_id
from dpbert.ledger import composition as _compose
from dpbert.ledger.identity import safe_name

SCHEMA = "dpbert.ledger/2"
#: Schemas this dpbert reads (older ones are upgraded when next written).
READABLE = ("dpbert.ledger/1", SCHEMA)


class LedgerInvalid(ConfigError):
    """A ledger document this dpbert must not read or replace (exit 2, the file named)."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def empty_ledger(dataset_id: str) -> Dict[str, Any]:
    return {"schema": SCHEMA, "dataset_id": normalise_dataset_id(dataset_id) if dataset_id else "", "unit": None,
            "delta": None, "entries": {}}


def _schema_problem(doc) -> Optional[str]:
    if not isinstance(doc, dict):
        return "not a JSON object"
    schema = doc.get("schema")
    if schema is None:
        return "it has no schema key"
    if schema in READABLE:
        return None
    if isinstance(schema, str) and schema.startswith("dpbert.ledger/"):
        return f"it was written by a newer dpbert (schema {schema}; this one reads {', '.join(READABLE)})"
    return f"unknown schema {schema!r}"


def validate(doc, uri: str, dataset_id: Optional[str] = None) -> Dict[str, Any]:
    """``doc`` if it is a ledger of ``dataset_id`` stored under its own name, else ``LedgerInvalid``."""
    problem = _schema_problem(doc)
    if problem is None and not isinstance(doc.get("entries"), dict):
        problem = "its entries are not a mapping"
    if problem is None and not isinstance(doc.get("budget", {}), dict):
        problem = "its budget is not a mapping"
    own = normalise_dataset_id(doc.get("dataset_id") or "") if problem is None else ""
    if problem is None and dataset_id is not None and own != normalise_dataset_id(dataset_id):
        problem = f"it is the ledger of dataset {doc.get('dataset_id')!r}, not of {dataset_id!r}"
    if problem is None and posixpath.basename(str(uri)) != safe_name(own) + ".json":
        problem = (f"it holds dataset {doc.get('dataset_id')!r}, whose ledger is {safe_name(own)}.json: a copied or "
                   f"renamed ledger is not a new budget")
    if problem is not None:
        raise LedgerInvalid(f"{uri}: not a usable dpbert dataset ledger: {problem}. Nothing was read into a budget "
                            f"and the file is left as it is; restore it (each rewrite keeps "
                            f"{posixpath.basename(previous_uri(uri))}) or move it aside")
    return doc


def read_ledger(uri: str, dataset_id: Optional[str] = None) -> Dict[str, Any]:
    """The ledger at ``uri`` (an empty one when the object does not exist); ``LedgerInvalid``
    for anything else that is not a ledger of ``dataset_id``."""
    try:
        doc = storage.read_json(uri, default=None)
    except ValueError as err:  # not JSON
        raise LedgerInvalid(f"{uri}: not a usable dpbert dataset ledger: not JSON ({err}); the file is left as it "
                            f"is") from None
    if doc is None:
        return empty_ledger(dataset_id or "")
    return validate(doc, uri, dataset_id)


def previous_uri(uri: str) -> str:
    """Where the generation before the last rewrite is kept."""
    return str(uri) + ".previous"


def keep_previous(uri: str, doc: Mapping[str, Any]):
    """Keep ``doc`` (the generation about to be replaced) at ``previous_uri``."""
    if doc.get("entries") or doc.get("budget"):
        storage.write_json(previous_uri(uri), doc, private=True)


def entries_of(doc: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The entries in time order."""
    return sorted(doc.get("entries", {}).values(), key=lambda e: (e.get("time", ""), e["id"]))


def one_planned_run(entries: Iterable[Mapping[str, Any]]) -> bool:
    """Every composed entry is part of ONE run: one ``plan_key`` (the vocabulary's configuration)
    and pipeline root, at most one vocabulary and one training chain (a resumed chain is one entry).
    Not checked: that the training's configuration was fixed before the vocabulary ran (a first
    trainer that failed before reserving, then a new training configuration on the cached
    vocabulary, passes as one run)."""
    charged = [e for e in entries if _compose.composed(e)]
    keys = {(e.get("plan_key"), str(e.get("pipeline_root"))) for e in charged}
    vocabs = [e for e in charged if e.get("stage") == "vocab"]
    chains = {e.get("chain") or e.get("id") for e in charged if e.get("stage") == "train"}
    return len(keys) == 1 and None not in next(iter(keys)) and len(vocabs) <= 1 and len(chains) <= 1
