r"""The composed ε of every event ever charged to one dataset, and the budget filter over it.

What an entry holds (``ledger_record``): the ACCOUNTABLE part of a DP event record
(``dpbert.privacy.events``) and its public parameters — the dp-accounting event, the unit, σ,
steps, the sampling rate of Poisson DP-SGD, the histogram's threshold δ₂ — and never an exact
count: a shuffled DP-SGD record's ``dataset_size`` (the trained rows) and the q = B/n that would
give it back are dropped; its event keeps only the occurrence count E = ⌈sB/n⌉ the accountant needs.

Composition (``compose``) at the dataset's δ (fixed by its first reservation):
the Gaussian parts of every vocabulary histogram and every training / count event of every
entry compose in ONE accountant, evaluated at δ_c = δ − Σ δ₂, δ₂ the threshold δ of each
histogram (the split bound of ``dpbert.privacy.histogram``: conditioned on no fresh word released
by any of the histograms — probability ≥ 1 − Σ δ₂, a union bound — each vocabulary is a
post-processing of its Gaussian). For one vocabulary and one training this is exactly
``dpbert.privacy.accountant.ledger``'s ``epsilon_total_rdp`` / ``epsilon_total_pld`` (tested).

The budget check is a privacy FILTER, enforced with the RDP total. Across runs the operator picks
the next run's parameters after seeing earlier results, so the mechanisms are chosen adaptively
and the number of runs is not fixed in advance. Composing the RDP of adaptively chosen mechanisms
and halting before the sum would exceed a fixed budget is valid (Feldman & Zrnic 2021, "Individual
privacy accounting via a Rényi filter", Thm. 3.1, for one order α). dpbert checks the (ε, δ)
conversion: ε_RDP(δ_c) = min_α [ρ(α) + log1p(−1/α) − log(δ_c·α)/(α − 1)] ≤ budget, i.e. "there is
an order α whose composed ρ(α) is within B(α) = budget − log1p(−1/α) + log(δ_c·α)/(α − 1)": the
filter over a set of orders that halts only when EVERY order is over its budget, which is
(budget, δ_c)-DP (Lécuyer 2021, "Practical privacy filters and odometers with Rényi DP", Thm. 1).
The PLD total is shown beside it (tighter, but PLD composition of a fixed sequence does not cover
adaptively chosen ones); it decides only for the first run on a dataset while that run is all the
ledger holds (``dataset.within``: a run whose configuration fixed its mechanisms in advance is a
non-adaptive composition).

One privacy unit per dataset (tuple or patient, the first entry's): an event of the other unit is
refused (``UnitMismatch``), not converted by group privacy — a patient holds up to k tuples and the
group-privacy conversion of an (ε, δ) guarantee to k tuples (kε, k·e^{(k−1)ε}δ) is too loose to
spend a budget on. Listed, not composed: non-private baselines (ε = ∞, operator-only results)
and the dχ branch (metric local privacy, not (ε, δ) of the same neighbouring relation).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping

import dp_accounting

from dpbert.privacy import accountant as _accountant
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


def compose(entries: Iterable[Mapping[str, Any]], delta: float, pld: bool = True) -> Dict[str, Any]:
    """``{"epsilon_rdp", "epsilon_pld", "delta", "delta_threshold", "delta_composed", "entries",
    "listed", "adjacency"}`` of every composed entry at total δ = ``delta``; ε = ∞ when the
    thresholds' Σ δ₂ leaves no δ. ``pld=False``: the RDP total only (epsilon_pld None)."""
    entries = list(entries)
    records = [r for e in entries if composed(e) for r in charged_records(e) if r.get("mechanism") not in LISTED_ONLY]
    records = [r for r in records if "event" in r]
    delta_threshold = sum(r.get("threshold_delta", 0.0) for r in records if r["mechanism"] == "dp_histogram")
    delta_c = delta - delta_threshold
    adjacency = "zero_out" if any(r.get("adjacency") == "zero_out" for r in records) else "add_or_remove_one"
    out = {"delta": delta, "delta_threshold": delta_threshold, "delta_composed": delta_c,
           "entries": sum(1 for e in entries if composed(e)), "listed": sum(1 for e in entries if not composed(e)),
           "adjacency": adjacency}
    if not records:
        return {**out, "epsilon_rdp": 0.0, "epsilon_pld": 0.0 if pld else None}
    if delta_c <= 0:
        return {**out, "epsilon_rdp": math.inf, "epsilon_pld": math.inf if pld else None}
    event = grouped([_events.dp_event_from_dict(r["event"]) for r in records])
    rdp = float(_accountant._epsilon(event, delta_c, "rdp"))  # noqa: SLF001 -- memoised
    if not pld:
        return {**out, "epsilon_rdp": rdp, "epsilon_pld": None}
    # The PLD total: the accountant's own evaluation (closed form for Gaussian-only compositions).
    pld_epsilon = _accountant._epsilon(event, delta_c, "pld")  # noqa: SLF001 -- the one PLD evaluator
    return {**out, "epsilon_rdp": rdp, "epsilon_pld": float(pld_epsilon)}


def entry_epsilon(entry: Mapping[str, Any], delta: float) -> Dict[str, float]:
    """The entry's own ε (RDP and PLD) at ``delta``, alone; ∞ for a listed non-private entry."""
    if not composed(entry):
        return {"epsilon_rdp": math.inf if entry.get("mechanism") == "non_private" else math.nan,
                "epsilon_pld": math.inf if entry.get("mechanism") == "non_private" else math.nan}
    got = compose([entry], delta)
    return {"epsilon_rdp": got["epsilon_rdp"], "epsilon_pld": got["epsilon_pld"]}
