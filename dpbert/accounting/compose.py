r"""The composed ε of every entry of a dataset ledger (figures to read; the budget is the gate's).

The Gaussian parts of every vocabulary histogram and every training / count event of every entry
compose in ONE accountant, evaluated at δ_c = δ − Σ δ₂, δ₂ the threshold δ of each histogram (the
split bound of ``dpbert.privacy.histogram``: conditioned on no fresh word released by any of the
histograms — probability ≥ 1 − Σ δ₂, a union bound — each vocabulary is a post-processing of its
Gaussian). For one vocabulary and one training this is exactly ``accountant.ledger``'s
``epsilon_total_rdp`` / ``epsilon_total_pld`` (tested). The PLD total is valid for a sequence fixed
in advance (one planned run); across adaptively chosen runs the guarantee is the filter's
(``dpbert.accounting.gate``).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Mapping, Optional

from dpbert.accounting.epsilon import epsilon as _epsilon
from dpbert.ledger import composition as _records


def compose(entries: Iterable[Mapping[str, Any]], delta: float, pld: bool = True) -> Dict[str, Any]:
    """``{"epsilon_rdp", "epsilon_pld", "delta", "delta_threshold", "delta_composed", "entries",
    "listed", "adjacency"}`` of every composed entry at total δ = ``delta``; ε = ∞ when the
    thresholds' Σ δ₂ leaves no δ. ``pld=False``: the RDP total only (epsilon_pld None)."""
    entries = list(entries)
    records = _records.accountable_records(entries)
    delta_threshold = _records.threshold_delta(records)
    delta_c = delta - delta_threshold
    adjacency = "zero_out" if any(r.get("adjacency") == "zero_out" for r in records) else "add_or_remove_one"
    out = {"delta": delta, "delta_threshold": delta_threshold, "delta_composed": delta_c,
           "entries": sum(1 for e in entries if _records.composed(e)),
           "listed": sum(1 for e in entries if not _records.composed(e)), "adjacency": adjacency}
    if not records:
        return {**out, "epsilon_rdp": 0.0, "epsilon_pld": 0.0 if pld else None}
    if delta_c <= 0:
        return {**out, "epsilon_rdp": math.inf, "epsilon_pld": math.inf if pld else None}
    event = _records.composed_event(records)
    rdp = float(_epsilon(event, delta_c, "rdp"))
    return {**out, "epsilon_rdp": rdp, "epsilon_pld": float(_epsilon(event, delta_c, "pld")) if pld else None}


def entry_epsilon(entry: Mapping[str, Any], delta: float) -> Dict[str, float]:
    """The entry's own ε (RDP and PLD) at ``delta``, alone; ∞ for a listed non-private entry."""
    if not _records.composed(entry):
        value = math.inf if entry.get("mechanism") == "non_private" else math.nan
        return {"epsilon_rdp": value, "epsilon_pld": value}
    got = compose([entry], delta)
    return {"epsilon_rdp": got["epsilon_rdp"], "epsilon_pld": got["epsilon_pld"]}


def entry_epsilon_at(entry: Mapping[str, Any], delta_conversion: Optional[float]) -> Dict[str, float]:
    """The entry's own ε at the dataset's conversion δ_c (its own thresholds' δ₂ added: ``compose``
    subtracts them), never at the dataset's larger δ, which would read smaller; 0 without a δ yet."""
    if not delta_conversion:
        return {"epsilon_rdp": 0.0, "epsilon_pld": 0.0}
    own = _records.threshold_delta(_records.accountable_records([entry]))
    return entry_epsilon(entry, delta_conversion + own)
