"""One append-only privacy ledger per dataset: reserve before a mechanism reads the data,
finalize with what executed, refuse what would take the composed ε over the budget.

The ledger object (``<location>/<dataset_id>.json``, written only through ``dpbert.storage``)::

    {"schema": "dpbert.ledger/1", "dataset_id", "unit": "tuple" | "patient", "delta",
     "entries": {<entry id>: {"id", "chain", "mechanism", "stage", "run_id", "pipeline_root",
                              "time", "updated", "status": "reserved" | "finalized", "unit",
                              "planned": [records], "executed": [records] | null,
                              "epsilon_budget", "config_key", "resume_key"}}}

Records are ``composition.ledger_record`` forms: public parameters and dp-accounting events, never an
exact count. ``delta`` is the dataset's δ, fixed by its first reservation: every total is at it.

Reservation (``reserve``): ONE compare-and-swap (``storage.update_json``) reads every entry,
composes them with the new one and writes the new entry as ``reserved`` only if the RDP total is
within the budget; otherwise ``BudgetRefused`` (with the totals) and nothing is written. Two runs
started together cannot both spend the last ε: the second CAS re-reads the first's entry. The
update function is idempotent (the entry id is drawn before the CAS), as ``update_json`` on gs://
may apply it twice.

Chains (``chain``): a resumed DP-SGD training chain must not be charged twice. Entries are keyed by
(chain, mechanism): a reservation for a chain that already has an entry REPLACES that entry's
planned records (the caller gives the chain's cumulative steps after this run: executed so far
+ what remains) instead of adding a second full charge, and ``finalize`` keeps the larger of the
executed step counts (the trainer's write-ahead step log only grows). A reserved entry that is
never finalized (an interrupted run) stays charged at its planned size.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import uuid
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from dpbert import storage
from dpbert.ledger import composition as _compose
from dpbert.ledger.identity import safe_name

SCHEMA = "dpbert.ledger/1"


class BudgetRefused(RuntimeError):
    """The composed ε of the dataset plus this reservation exceeds the budget; nothing written.
    ``totals``: ``composition.compose`` of everything including the refused entry; ``budget``."""

    def __init__(self, dataset_id: str, totals: Dict[str, Any], budget: float, mechanism: str):
        self.dataset_id, self.totals, self.budget, self.mechanism = dataset_id, totals, budget, mechanism
        super().__init__(
            f"dataset {dataset_id}: {mechanism} would take the composed ε to {totals['epsilon_rdp']:.4g} (RDP filter; "
            f"PLD {totals['epsilon_pld']:.4g}) at δ = {totals['delta']:.3g} over privacy.epsilon_budget = "
            f"{budget:.4g}, counting every run that spent from it ({totals['entries']} entries with this one); "
            f"nothing was reserved (dpbert ledger --dataset {dataset_id})")


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Where an entry lives: pass it to ``finalize``."""
    ledger_uri: str
    entry_id: str
    dataset_id: str

    def __str__(self) -> str:
        return self.entry_id


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def empty_ledger(dataset_id: str) -> Dict[str, Any]:
    return {"schema": SCHEMA, "dataset_id": dataset_id, "unit": None, "delta": None, "entries": {}}


def read_ledger(uri: str, dataset_id: Optional[str] = None) -> Dict[str, Any]:
    """The ledger at ``uri`` (an empty one when missing)."""
    doc = storage.read_json(uri, default=None)
    if doc is None:
        return empty_ledger(dataset_id or "")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{uri}: not a dpbert dataset ledger (schema {SCHEMA})")
    return doc


def entries_of(doc: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The entries in time order."""
    return sorted(doc.get("entries", {}).values(), key=lambda e: (e.get("time", ""), e["id"]))


def _same_chain(entry: Mapping[str, Any], chain: Optional[str], mechanism: str) -> bool:
    return chain is not None and entry.get("chain") == chain and entry.get("mechanism") == mechanism


def _entry_mechanism(records: Sequence[Mapping[str, Any]], mechanism: str) -> str:
    if any(r.get("mechanism") == "non_private" for r in records):
        return "non_private"
    return mechanism


def one_planned_run(entries: Iterable[Mapping[str, Any]]) -> bool:
    """Every composed entry is part of ONE run: one ``plan_key`` (the vocabulary's configuration,
    ``target.LedgerTarget.vocab_key``) and pipeline root, at most one vocabulary and one training
    chain (a resumed chain is one entry). Not checked: that the training's configuration was fixed
    before the vocabulary ran (a first trainer that failed before reserving, then a new training
    configuration on the cached vocabulary, passes as one run)."""
    charged = [e for e in entries if _compose.composed(e)]
    keys = {(e.get("plan_key"), str(e.get("pipeline_root"))) for e in charged}
    vocabs = [e for e in charged if e.get("stage") == "vocab"]
    chains = {e.get("chain") or e.get("id") for e in charged if e.get("stage") == "train"}
    return len(keys) == 1 and None not in next(iter(keys)) and len(vocabs) <= 1 and len(chains) <= 1


def within(entries: List[Mapping[str, Any]], budget: Optional[float], delta: float,
           pld: bool = False) -> Dict[str, Any]:
    """The filter's verdict on ``entries`` (``totals`` with ``"within_budget"`` and ``"rule"``).

    RDP filter: the RDP total ≤ budget (``composition``). One exception, for the first run on a
    dataset: when every entry is part of one run whose configuration fixed all its mechanisms before
    any ran (``one_planned_run``), that run is a NON-adaptive composition and its PLD total is a
    valid bound, checked instead (as the per-run ledger does). It cannot be followed by anything
    while its RDP total exceeds the budget: the next entry of any other run goes through the RDP
    rule over everything, so either the whole sequence is one PLD-accounted run or it is an RDP
    filter from its start (which route applies depends on public parameters only).
    ``pld``: the PLD total also when the RDP rule decides (shown beside it)."""
    totals = _compose.compose(entries, delta, pld=pld)  # inside a CAS: the RDP total only
    if budget is None or totals["epsilon_rdp"] <= budget:
        return {**totals, "within_budget": True, "rule": "rdp_filter"}
    if one_planned_run(entries):
        totals = _compose.compose(entries, delta)
        return {**totals, "within_budget": bool(totals["epsilon_pld"] <= budget), "rule": "one_planned_run_pld"}
    return {**_compose.compose(entries, delta), "within_budget": False, "rule": "rdp_filter"}


def spent(totals: Mapping[str, Any]) -> float:
    """The ε the budget is enforced against in ``totals`` (``within``'s): the PLD total while the
    ledger is one planned run, else the RDP filter's total."""
    return totals["epsilon_pld"] if totals["rule"] == "one_planned_run_pld" else totals["epsilon_rdp"]


def check_within(doc: Mapping[str, Any], budget: Optional[float], dataset_id: str, mechanism: str,
                 delta: float) -> Dict[str, Any]:
    """``within`` over the ledger's entries; BudgetRefused when over ``budget``."""
    totals = within(entries_of(doc), budget, delta)
    if not totals["within_budget"]:
        raise BudgetRefused(dataset_id, totals, budget, mechanism)
    return totals


def reserve(ledger_uri: str, dataset_id: str, run_id: str, pipeline_root: str, mechanism: str,
            records: Iterable, unit: str, *, delta: float, budget: Optional[float] = None,
            chain: Optional[str] = None, config_key: Optional[str] = None, resume_key: Optional[str] = None,
            plan_key: Optional[str] = None, entry_id: Optional[str] = None) -> Reservation:
    """Write a ``reserved`` entry for ``records`` (event records or ledger forms) before the
    mechanism reads the data, if the composed RDP ε of every entry plus this one is ≤ ``budget``
    (None: record only). ``chain``: replace this chain's own entry (module docstring).
    ``plan_key``: the run's vocabulary configuration (``one_planned_run``).
    Raises BudgetRefused (nothing written), UnitMismatch, ValueError for a bad record."""
    if unit not in _compose.UNITS:
        raise ValueError(f"unit must be one of {', '.join(_compose.UNITS)}, got {unit!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be > 0, got {budget!r}")
    planned = [_compose.ledger_record(r) for r in records]
    _compose.check_unit(unit, planned)
    kind = _entry_mechanism(planned, mechanism)
    new_id = entry_id or uuid.uuid4().hex
    found: Dict[str, str] = {}

    def update(doc):
        doc = doc if doc.get("schema") == SCHEMA else empty_ledger(dataset_id)
        if doc.get("unit") not in (None, unit):
            _compose.check_unit(doc["unit"], [{"unit": unit}])
        if new_id in doc["entries"]:  # this very reservation, applied already (a retried write)
            found["id"] = new_id
            return doc
        own = next((e for e in doc["entries"].values() if _same_chain(e, chain, kind)), None)
        entry = own or {"id": new_id, "chain": chain, "mechanism": kind, "time": _now(), "executed": None}
        entry.update({"stage": planned[0]["stage"] if planned else None, "run_id": run_id,
                      "pipeline_root": str(pipeline_root), "updated": _now(), "status": "reserved", "unit": unit,
                      "planned": planned, "epsilon_budget": budget, "config_key": config_key,
                      "resume_key": resume_key, "plan_key": plan_key, "reservation": new_id})
        doc["entries"][entry["id"]] = entry
        doc["unit"] = doc.get("unit") or unit
        doc["delta"] = doc.get("delta") or delta
        if kind not in _compose.LISTED_ONLY:
            check_within(doc, budget, dataset_id, kind, doc["delta"])
        found["id"] = entry["id"]
        return doc

    storage.update_json(ledger_uri, update, default=empty_ledger(dataset_id))
    return Reservation(ledger_uri, found["id"], dataset_id)


def finalize(reservation: Reservation, executed_records: Iterable) -> Dict[str, Any]:
    """Mark the entry ``finalized`` with what executed. For a chain entry the larger executed step
    count wins (a resume re-finalizes with its cumulative count; a retried write is harmless).
    Returns the entry. KeyError if the entry is not in the ledger."""
    executed = [_compose.ledger_record(r) for r in executed_records]
    result: Dict[str, Any] = {}

    def update(doc):
        entry = doc.get("entries", {}).get(reservation.entry_id)
        if entry is None:
            raise KeyError(f"{reservation.ledger_uri}: no entry {reservation.entry_id}")
        before = entry.get("executed")
        keep = before if before is not None and _compose.steps_of(before) > _compose.steps_of(executed) else executed
        entry.update({"status": "finalized", "executed": keep, "updated": _now()})
        result.update(entry)
        return doc

    storage.update_json(reservation.ledger_uri, update)
    return result
