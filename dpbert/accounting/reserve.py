"""Reserve before a mechanism reads the data, finalize with what executed: the dataset ledger's
writes, each ONE compare-and-swap with the budget gate inside it.

Reservation (``reserve``): ``storage.update_json`` reads every entry, asks the gate
(``dpbert.accounting.gate.decide``) about them with the new one, and writes the entry as
``reserved`` — pinning the budget at the dataset's first budgeted reservation — only if admitted;
otherwise ``BudgetRefused`` and nothing is written. Two runs started together cannot both spend
the last ε: the second CAS re-reads the first's entry. The update is idempotent (the entry id is
drawn before the CAS), as ``update_json`` on gs:// may apply it twice. The document is validated
inside the CAS (``dpbert.ledger.dataset.validate``: a foreign, newer or copied ledger is an error,
never replaced) and the previous generation is kept before each rewrite.

Chains: a resumed DP-SGD training chain must not be charged twice. Entries are keyed by
(chain, mechanism): a reservation for a chain that already has an entry REPLACES that entry's
planned records (the caller gives the chain's cumulative steps: executed so far + what remains)
and ``finalize`` keeps the larger executed step count (the write-ahead step log only grows). A
reserved entry that is never finalized (an interrupted run) stays charged at its planned size.
"""
from __future__ import annotations

import dataclasses
import math
import uuid
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

from dpbert import storage
from dpbert.accounting import gate as _gate
from dpbert.ledger import composition as _compose
from dpbert.ledger import dataset as _doc


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Where an entry lives: pass it to ``finalize``."""
    ledger_uri: str
    entry_id: str
    dataset_id: str

    def __str__(self) -> str:
        return self.entry_id


def _same_chain(entry: Mapping[str, Any], chain: Optional[str], mechanism: str) -> bool:
    return chain is not None and entry.get("chain") == chain and entry.get("mechanism") == mechanism


def _entry_mechanism(records: Sequence[Mapping[str, Any]], mechanism: str) -> str:
    return "non_private" if any(r.get("mechanism") == "non_private" for r in records) else mechanism


@dataclasses.dataclass(frozen=True)
class EntryKeys:
    """Who writes an entry and how it is found again. ``run_id`` / ``pipeline_root``: the run and
    the output tree reserving it. ``chain``: the training chain whose own entry a resume replaces
    (None: a one-off event). ``config_key`` / ``resume_key`` / ``plan_key``: what the guard and the
    one-run check match the entry by (the vocabulary's configuration, the chain's resume key, the
    run's vocabulary plan). ``entry_id``: a fixed id for this reservation (None: a fresh random one)."""
    run_id: str
    pipeline_root: str
    chain: Optional[str] = None
    config_key: Optional[str] = None
    resume_key: Optional[str] = None
    plan_key: Optional[str] = None
    entry_id: Optional[str] = None


def _check_arguments(unit: str, delta: Optional[float], budget: Optional[float]):
    if unit not in _compose.UNITS:
        raise ValueError(f"unit must be one of {', '.join(_compose.UNITS)}, got {unit!r}")
    if delta is None or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be > 0, got {budget!r}")


def reserve(ledger_uri: str, dataset_id: str, keys: EntryKeys, mechanism: str, records: Iterable, unit: str, *,
            request: "_gate.Request") -> Reservation:
    """Write a ``reserved`` entry for ``records`` (event records or ledger forms) before the
    mechanism reads the data, if the gate admits every entry with it. ``request``: the run's
    ``privacy.epsilon_budget`` (None: the pinned one if any), its δ (required) and what a first
    budgeted reservation pins (``threshold_delta``, ``first_plan``, ``orders``). ``keys``: the
    entry's identity (``keys.chain``: replace this chain's own entry). Raises BudgetRefused
    (nothing written), UnitMismatch, LedgerInvalid, ValueError."""
    budget, delta = request.epsilon_budget, request.delta
    _check_arguments(unit, delta, budget)
    planned = [_compose.ledger_record(r) for r in records]
    _compose.check_unit(unit, planned)
    kind = _entry_mechanism(planned, mechanism)
    new_id = keys.entry_id or uuid.uuid4().hex
    request = dataclasses.replace(request, first_plan=tuple(request.first_plan))
    found: Dict[str, str] = {}

    def update(doc):
        doc = _doc.validate(doc, ledger_uri, dataset_id)
        if doc.get("unit") not in (None, unit):
            _compose.check_unit(doc["unit"], [{"unit": unit}])
        if new_id in doc["entries"]:  # this very reservation, applied already (a retried write)
            found["id"] = new_id
            return doc
        _doc.keep_previous(ledger_uri, doc)
        own = next((e for e in doc["entries"].values() if _same_chain(e, keys.chain, kind)), None)
        entry = own or {"id": new_id, "chain": keys.chain, "mechanism": kind, "time": _doc.now(), "executed": None}
        entry.update({"stage": planned[0]["stage"] if planned else None, "run_id": keys.run_id,
                      "pipeline_root": str(keys.pipeline_root), "updated": _doc.now(), "status": "reserved",
                      "unit": unit, "planned": planned, "epsilon_budget": budget, "config_key": keys.config_key,
                      "resume_key": keys.resume_key, "plan_key": keys.plan_key, "reservation": new_id})
        doc["entries"][entry["id"]] = entry
        doc.update(schema=_doc.SCHEMA, unit=doc.get("unit") or unit, delta=doc.get("delta") or delta)
        if kind not in _compose.LISTED_ONLY:
            _admit(doc, request, dataset_id, kind)
        found["id"] = entry["id"]
        return doc

    storage.update_json(ledger_uri, update, default=_doc.empty_ledger(dataset_id))
    return Reservation(ledger_uri, found["id"], dataset_id)


def _admit(doc: Dict[str, Any], request: "_gate.Request", dataset_id: str, kind: str):
    verdict = _gate.decide(doc, request=request)
    if not verdict.admitted:
        raise _gate.BudgetRefused(dataset_id, verdict, f"the {kind} reservation")
    if verdict.new_pin:
        doc["budget"] = verdict.pin.to_dict()
        doc["delta"] = verdict.pin.delta


def finalize(reservation: Reservation, executed_records: Iterable) -> Dict[str, Any]:
    """Mark the entry ``finalized`` with what executed. For a chain entry the larger executed step
    count wins (a resume re-finalizes with its cumulative count; a retried write is harmless).
    Returns the entry. KeyError if the entry is not in the ledger."""
    executed = [_compose.ledger_record(r) for r in executed_records]
    result: Dict[str, Any] = {}

    def update(doc):
        doc = _doc.validate(doc, reservation.ledger_uri, reservation.dataset_id)
        entry = doc.get("entries", {}).get(reservation.entry_id)
        if entry is None:
            raise KeyError(f"{reservation.ledger_uri}: no entry {reservation.entry_id}")
        _doc.keep_previous(reservation.ledger_uri, doc)
        before = entry.get("executed")
        keep = before if before is not None and _compose.steps_of(before) > _compose.steps_of(executed) else executed
        entry.update({"status": "finalized", "executed": keep, "updated": _doc.now()})
        result.update(entry)
        return doc

    storage.update_json(reservation.ledger_uri, update)
    return result


def raise_budget(ledger_uri: str, dataset_id: str, epsilon: float) -> Dict[str, Any]:
    """Move the dataset's pinned budget to the smallest committed level whose ε ≥ ``epsilon``
    (``filter.level_for``: never down). Returns the new pin's dict. ValueError when nothing is pinned."""
    from dpbert.accounting import filter as _filter

    out: Dict[str, Any] = {}

    def update(doc):
        doc = _doc.validate(doc, ledger_uri, dataset_id)
        if not doc.get("budget"):
            raise ValueError(f"dataset {dataset_id} has no pinned budget to raise ({ledger_uri}): its first run "
                             f"with privacy.epsilon_budget pins one")
        pin = _filter.Pin.from_dict(doc["budget"])
        raised = dataclasses.replace(pin, level=_filter.level_for(pin, epsilon))
        _doc.keep_previous(ledger_uri, doc)
        doc["budget"] = raised.to_dict()
        out.update(doc["budget"])
        return doc

    storage.update_json(ledger_uri, update)
    return out
