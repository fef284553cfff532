r"""What a dataset ledger entry charges: count-free records of DP events (no ε is computed here).

What an entry holds (``ledger_record``): the ACCOUNTABLE part of a DP event record
(``dpbert.privacy.events``) and its public parameters — the dp-accounting event, the unit, σ,
steps, the sampling rate of Poisson DP-SGD, the histogram's threshold δ₂ — and never an exact
count: a shuffled DP-SGD record's ``dataset_size`` (the trained rows) and the q = B/n that would
give it back are dropped; its event keeps only the occurrence count E = ⌈sB/n⌉ the accountant needs.

One privacy unit per dataset (tuple or patient, the first entry's): an event of the other unit is
refused (``UnitMismatch``), not converted by group privacy — a patient holds up to k tuples and the
group-privacy conversion of an (ε, δ) guarantee to k tuples (kε, k·e^{(k−1)ε}δ) is too loose to
spend a budget on. Listed, not composed: non-private baselines (ε = ∞, operator-only results)
and the dχ branch (metric local privacy, not (ε, δ) of the same neighbouring relation).
The ε of these records and the budget over them: ``dpbert.accounting`` (compose, gate).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping

import dp_accounting

from dpbert.privacy import events as _events

#: Mechanisms an entry may name that are listed and never composed.
LISTED_ONLY = ("non_private", "dchi")
UNITS = ("tuple", "patient")


class UnitMismatch(ValueError):
    """An event of another privacy unit than the dataset's (tuple vs patient)."""


def ledger_record(record) -> Dict[str, Any]:
    """The count-free accountable form of an event record (see the module docstring)."""
    if isinstance(record, Mapping) and record.get("mechanism") in LISTED_ONLY and "schema" not in record:
        return dict(record)
    if isinstance(record, Mapping) and record.get("ledger_form"):
        return dict(record)
    rec = _events.validate_record(record)
    out: Dict[str, Any] = {"ledger_form": 1, "mechanism": rec["mechanism"], "stage": rec["stage"]}
    if rec["mechanism"] == "non_private":
        return out
    out["unit"] = rec["unit"]
    out["event"] = _events.dp_event_to_dict(_events.accountable_event(rec))
    if rec["mechanism"] == "dp_histogram":
        out.update({k: rec[k] for k in ("sigma", "threshold", "tuple_words", "max_contributions", "delta",
                                        "threshold_delta")})
    elif rec["mechanism"] == "dp_count":
        out["noise_multiplier"] = rec["noise_multiplier"]
    else:
        out.update({k: rec[k] for k in ("sampling", "steps", "noise_multiplier", "batch_size", "max_contributions",
                                        "adjacency")})
        out["sampling_unit"] = rec.get("sampling_unit", "tuple")
        if rec["sampling"] == "poisson":  # the PLANNED public q (the sampler's own); shuffle: none
            out["sampling_probability"] = rec["sampling_probability"]
        else:
            out["occurrences"] = rec["participations"] * (2 if rec["straddling"] else 1)
    return out


def with_steps(record: Mapping[str, Any], steps: int) -> Dict[str, Any]:
    """A Poisson DP-SGD ledger record re-planned for ``steps`` executed steps (its own σ, q, k)."""
    if record.get("mechanism") != "dp_sgd" or record.get("sampling") != "poisson":
        raise ValueError("only a Poisson DP-SGD record can be re-planned from its step count; give the "
                         "executed records of a shuffled run")
    out = dict(record)
    out["steps"] = int(steps)
    out["event"] = _events.dp_event_to_dict(_events.dpsgd_dp_event(
        record["noise_multiplier"], record["sampling_probability"], int(steps), "poisson",
        record["max_contributions"], record.get("sampling_unit") == "patient"))
    return out


def steps_of(records: Iterable[Mapping[str, Any]]) -> int:
    return sum(int(r.get("steps", 0)) for r in records)


def charged_records(entry: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """What an entry charges: its executed records once finalized, else its planned ones (an
    interrupted run stays charged at its planned size: conservative)."""
    if entry.get("status") == "finalized" and entry.get("executed") is not None:
        return list(entry["executed"])
    return list(entry.get("planned") or [])


def composed(entry: Mapping[str, Any]) -> bool:
    return entry.get("mechanism") not in LISTED_ONLY


def check_unit(unit, records: Iterable[Mapping[str, Any]]):
    for r in records:
        if r.get("mechanism") in LISTED_ONLY or "unit" not in r:
            continue
        if unit is not None and r["unit"] != unit:
            raise UnitMismatch(f"the dataset's privacy unit is {unit}, this event's is {r['unit']}: one unit per "
                               f"dataset (privacy.unit); a {r['unit']}-level ε does not spend a {unit}-level budget")


def _flatten(events, counts: Dict[Any, int], times: int = 1):
    for event in events:
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            _flatten([event.event], counts, times * event.count)
        elif isinstance(event, dp_accounting.ComposedDpEvent):
            _flatten(event.events, counts, times)
        elif not isinstance(event, dp_accounting.NoOpDpEvent):
            counts[event] = counts.get(event, 0) + times


def grouped(events) -> dp_accounting.DpEvent:
    """The same composition with equal events counted once: SelfComposed(e, a) ∘ SelfComposed(e, b)
    = SelfComposed(e, a + b) (composition is commutative), so a chain's segments and repeated runs
    cost one PLD self-composition each instead of one per entry."""
    counts: Dict[Any, int] = {}
    _flatten(events, counts)
    return dp_accounting.ComposedDpEvent([e if c == 1 else dp_accounting.SelfComposedDpEvent(e, c)
                                          for e, c in counts.items()])


def accountable_records(entries: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The records every composed entry charges (listed entries and records without an event left out)."""
    return [r for e in entries if composed(e) for r in charged_records(e)
            if r.get("mechanism") not in LISTED_ONLY and "event" in r]


def threshold_delta(records: Iterable[Mapping[str, Any]]) -> float:
    """Σ δ₂ of the vocabulary histograms among ``records``."""
    return sum(r.get("threshold_delta", 0.0) for r in records if r.get("mechanism") == "dp_histogram")


def composed_event(records: Iterable[Mapping[str, Any]]):
    """One dp-accounting event composing ``records`` (equal events grouped); None when empty."""
    records = list(records)
    return grouped([_events.dp_event_from_dict(r["event"]) for r in records]) if records else None
