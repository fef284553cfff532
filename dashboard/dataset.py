"""The dataset page's data: every entry of ONE dataset's privacy ledger, its own ε, the composed
total after each entry (by time) against the pinned budget, the filter's figure beside PLD and the
odometer — the figures ``dpbert ledger`` prints, decided by the one gate
(``dpbert.accounting.gate.decide``), so the page cannot tell another truth than the gate.

Why the dashboard reads this file although it otherwise reads only ML Metadata: the ledger is not
an artifact and holds nothing of the data — per entry a run id, a pipeline root, a mechanism, the
public parameters of its DP events (σ, q, steps) and times, and the pinned budget: the accounting
numbers ``dpbert ledger`` shows. It is read, never written (no reservation, no ``--raise-budget``),
through ``dpbert.storage`` (a local path or ``gs://``); only a URI ending in ``.json`` whose
document validates as the ledger of the dataset its file names (``dpbert.ledger.dataset.read_ledger``)
is shown, so the ``ledger`` parameter cannot display an arbitrary file.
"""
from __future__ import annotations

import math
import posixpath
from typing import Any, Dict, List, Mapping, Optional

from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
from dpbert.report_model import DATASET_RULE_LABELS


class NoLedger(LookupError):
    """No dataset ledger at the URI (absent, not ``.json``, or not a valid dpbert ledger)."""


def dataset_id_of(uri: str) -> str:
    """The dataset a ledger URI names (``<folder>/<dataset id>.json``); NoLedger otherwise."""
    name = posixpath.basename(str(uri).replace("\\", "/"))
    if not name.endswith(".json") or len(name) <= len(".json"):
        raise NoLedger("a dataset ledger's URI ends in <dataset id>.json")
    return name[:-len(".json")]


def read(uri: str) -> Dict[str, Any]:
    """The ledger document at ``uri`` (read-only); NoLedger when absent or not a valid ledger."""
    from dpbert import storage
    from dpbert.ledger import dataset

    dataset_id = dataset_id_of(uri)
    try:
        if not storage.storage_for(uri).exists(uri):
            raise NoLedger("no dataset ledger at this URI")
        return dataset.read_ledger(uri, dataset_id)
    except (dataset.LedgerInvalid, OSError, ValueError) as err:
        raise NoLedger("not a usable dpbert dataset ledger (dpbert ledger says why)") from err


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _total(verdict) -> Dict[str, Any]:
    """What the gate says of a list of entries: the enforced figure with its rule, both figures."""
    return {"epsilon_spent": verdict.spent, "rule": verdict.rule, "rule_label": DATASET_RULE_LABELS.get(verdict.rule),
            "epsilon_rdp": verdict.epsilon_rdp, "epsilon_pld": verdict.epsilon_pld, "admitted": verdict.admitted}


def _entry_row(entry: Mapping[str, Any], delta_c: Optional[float]) -> Dict[str, Any]:
    from dpbert.accounting.compose import entry_epsilon_at
    from dpbert.ledger import composition

    own = entry_epsilon_at(entry, delta_c)
    return {"id": entry.get("id"), "time": entry.get("time"), "run_id": entry.get("run_id"),
            "pipeline_root": entry.get("pipeline_root"), "mechanism": entry.get("mechanism"),
            "stage": entry.get("stage"), "status": entry.get("status"), "composed": composition.composed(entry),
            "steps": composition.steps_of(composition.charged_records(entry)) or None, **own}


def dataset_view(uri: str) -> Dict[str, Any]:
    """The JSON of ``/api/dataset``: the entries in time order, each with its own ε and the gate's
    composed total over the entries up to it (``after``), and the gate's verdict on them all."""
    from dpbert.accounting import gate
    from dpbert.ledger import dataset

    doc = read(uri)
    entries = dataset.entries_of(doc)
    verdict = gate.decide(doc, entries, pld=True)
    pin = verdict.pin
    delta_c = pin.delta_conversion if pin else (doc.get("delta") or 0.0) - verdict.delta_threshold
    rows = []
    for i, entry in enumerate(entries):
        row = _entry_row(entry, delta_c if doc.get("delta") else None)
        row["after"] = _total(gate.decide(doc, entries[:i + 1], pld=True))
        rows.append(row)
    return {"dataset_id": doc.get("dataset_id") or dataset_id_of(uri), "ledger": uri, "unit": doc.get("unit"),
            "delta": verdict.delta or doc.get("delta"), "budget": None if pin is None else pin.to_dict(),
            "epsilon_budget": verdict.budget, "runs": len({(r["run_id"], r["pipeline_root"]) for r in rows}),
            "entries": rows,
            "totals": {**_total(verdict), "within_budget": verdict.admitted, "odometer": verdict.odometer,
                       "usage": [{"order": a, "rho": r, "rho_budget": b} for a, r, b in verdict.usage]}}


def _eps(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "—"
    return "∞" if math.isinf(number) else fmt_epsilon(number)


def dataset_page(view: Dict[str, Any]) -> Dict[str, Any]:
    """The context of the dataset page: texts for the JSON view's numbers (ε rounded up, δ to 6
    significant digits rounded up) and the verdict sentence."""
    totals, budget = view["totals"], view.get("epsilon_budget")
    rows = [{**r, "own_rdp": _eps(r["epsilon_rdp"]), "own_pld": _eps(r["epsilon_pld"]),
             "total": _eps(r["after"]["epsilon_spent"]), "total_rule": r["after"]["rule_label"] or r["after"]["rule"],
             "total_rdp": _eps(r["after"]["epsilon_rdp"]), "total_pld": _eps(r["after"]["epsilon_pld"])}
            for r in view["entries"]]
    odometer = totals.get("odometer")
    return {"dataset": view, "rows": rows, "total": _eps(totals["epsilon_spent"]),
            "rule": totals["rule_label"] or totals["rule"], "rdp": _eps(totals["epsilon_rdp"]),
            "pld": _eps(totals["epsilon_pld"]), "budget": None if budget is None else _eps(budget),
            "delta": fmt_delta(_number(view.get("delta"))), "within": totals["within_budget"] if budget else None,
            "odometer": None if not odometer else {"level": odometer.get("level"), "epsilon": _eps(odometer.get("epsilon")),
                                                   "delta": fmt_delta(_number(odometer.get("delta")))},
            "usage": [f"α = {u['order']:g}: ρ {u['rho']:.4g} of {u['rho_budget']:.4g}" for u in totals["usage"]]}


def chart_points(view: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The composed total after each entry (by time), for the chart: label, enforced, RDP, PLD."""
    return [{"label": str(r.get("time") or "")[:19], "spent": _number(r["after"]["epsilon_spent"]),
             "rdp": _number(r["after"]["epsilon_rdp"]), "pld": _number(r["after"]["epsilon_pld"])}
            for r in view["entries"]]
