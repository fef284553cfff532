"""The budget gate: the ONE decision whether a dataset may spend more.

``decide(doc, entries, request)`` is what every surface asks — ``dpbert budget``, the guard of
``dpbert run``, the ledger reservation (inside its compare-and-swap), the trainer's step limit,
the accountant stage, ``dpbert compile`` and the dashboard — so their verdicts cannot differ.

Rules (derivations: ``dpbert.accounting.filter`` and docs/privacy.md):

1. No pinned budget and none asked for: nothing to enforce (the entry is recorded).
2. The first reservation with a budget PINS it (``Pin``): ε_B, δ_c, the thresholds' δ₂ pool, the
   committed order(s). Later requests must name the same ε (or none: the pinned one applies);
   another ε is refused until ``dpbert ledger --raise-budget`` moves the pin to a committed level.
3. Σ δ₂ of every vocabulary histogram stays within the pool; δ_c never changes.
4. Admitted when some committed order's composed ρ(α) is within its bound (the filter) — or, while
   every entry is ONE run planned before it started and the budget was never raised, when its PLD
   ε at δ_c is within ε_B (a non-adaptive composition; such a first run that exceeds the filter
   closes the dataset to anything else).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from dpbert.accounting import filter as _filter
from dpbert.accounting.epsilon import epsilon as _epsilon
from dpbert.ledger import composition as _records
from dpbert.ledger.dataset import one_planned_run
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon


@dataclasses.dataclass(frozen=True)
class Request:
    """What a reservation asks for: its configured budget (None: the pinned one, or none) and,
    for a first reservation that pins, the run's δ, its histogram's threshold δ₂, the records of
    its whole planned run (to choose the committed order) and how many orders to commit."""
    epsilon_budget: Optional[float] = None
    delta: Optional[float] = None
    threshold_delta: float = 0.0
    first_plan: Sequence[Mapping[str, Any]] = ()
    orders: int = 1


@dataclasses.dataclass(frozen=True)
class Verdict:
    admitted: bool
    rule: str                   # "no_budget" | "rdp_filter" | "one_planned_run_pld"
    reason: Optional[str]       # None | "over_budget" | "budget_mismatch" | "threshold_pool"
    pin: Optional[_filter.Pin]
    new_pin: bool
    epsilon_rdp: float          # composed RDP ε at the committed orders (a figure to read)
    epsilon_pld: Optional[float]
    delta: float                # the dataset's δ (δ_c + pool once pinned)
    delta_threshold: float      # Σ δ₂ used
    usage: tuple                # (α, ρ(α), ρ_B(α)) at the committed orders
    odometer: Optional[Dict[str, Any]]
    entries: int
    requested: Optional[float]

    @property
    def budget(self) -> Optional[float]:
        return None if self.pin is None else self.pin.budget_at()

    @property
    def spent(self) -> float:
        """The figure the budget is enforced against: PLD for one planned run, else the filter's RDP ε."""
        return self.epsilon_pld if self.rule == "one_planned_run_pld" else self.epsilon_rdp

    def to_dict(self) -> Dict[str, Any]:
        return {"admitted": self.admitted, "within_budget": self.admitted, "rule": self.rule, "reason": self.reason,
                "budget": None if self.pin is None else self.pin.to_dict(), "epsilon_budget": self.budget,
                "epsilon_rdp": self.epsilon_rdp, "epsilon_pld": self.epsilon_pld, "epsilon_spent": self.spent,
                "delta": self.delta, "delta_threshold": self.delta_threshold,
                "usage": [{"order": a, "rho": r, "rho_budget": b} for a, r, b in self.usage],
                "odometer": self.odometer, "entries": self.entries}

    def message(self, dataset_id: str, what: str = "this run") -> str:
        if self.reason == "budget_mismatch":
            return (f"dataset {dataset_id}: its budget is pinned at ε = {fmt_epsilon(self.budget)} (δ = "
                    f"{fmt_delta(self.delta)}), {what} asks for privacy.epsilon_budget = {fmt_epsilon(self.requested)}; "
                    f"a filter's budget is fixed in advance. Set privacy.epsilon_budget = {self.budget:.7g} (or leave "
                    f"it unset on this dataset), or raise it to a committed level "
                    f"with: dpbert ledger --dataset {dataset_id} --raise-budget {fmt_epsilon(self.requested)}")
        if self.reason == "threshold_pool":
            return (f"dataset {dataset_id}: the vocabulary thresholds' δ₂ would total {fmt_delta(self.delta_threshold)}, "
                    f"over the pool of {fmt_delta(self.pin.threshold_pool)} committed at its first reservation; "
                    f"reuse an already-released vocabulary or vocab.source: public")
        if self.rule == "one_planned_run_pld":
            figure = f"{fmt_epsilon(self.epsilon_pld)} (PLD: its runs so far are one run planned in advance)"
        else:
            orders = ", ".join(f"{a:g}" for a, _, _ in self.usage)
            figure = (f"{fmt_epsilon(self.epsilon_rdp)} (the Rényi filter at the committed order(s) {orders}; "
                      f"PLD {fmt_epsilon(self.epsilon_pld)})")
        return (f"dataset {dataset_id}: {what} would take its composed ε to {figure}, which exceeds "
                f"privacy.epsilon_budget = {fmt_epsilon(self.budget)} pinned for the dataset at δ = "
                f"{fmt_delta(self.delta)}, counting every run that spent from it ({self.entries} entries with this "
                f"one); nothing was reserved (dpbert ledger --dataset {dataset_id})")


class BudgetRefused(RuntimeError):
    """The gate refused a reservation; nothing was written. ``verdict``: the gate's ``Verdict``."""

    def __init__(self, dataset_id: str, verdict: Verdict, what: str = "this run"):
        self.dataset_id, self.verdict = dataset_id, verdict
        self.totals, self.budget = verdict.to_dict(), verdict.budget
        super().__init__(verdict.message(dataset_id, what))


def _pin_for(request: Request, event) -> _filter.Pin:
    delta_c = float(request.delta) - float(request.threshold_delta)
    plan = _records.composed_event([_records.ledger_record(r) for r in request.first_plan]) \
        if request.first_plan else None
    orders, shares = _filter.committed_orders(plan if plan is not None else event, request.epsilon_budget, delta_c,
                                              request.orders)
    return _filter.Pin(float(request.epsilon_budget), delta_c,
                       _filter.THRESHOLD_POOL_HISTOGRAMS * float(request.threshold_delta), orders, shares)


def _same(a: float, b: float) -> bool:
    """The budget a run names is the pinned one (to the 6 digits a person copies from a message)."""
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def decide(doc: Mapping[str, Any], entries: Optional[List[Mapping[str, Any]]] = None,
           request: Optional[Request] = None, pld: bool = False, planned_run_rule: bool = True) -> Verdict:
    """The gate's verdict on ``entries`` (default: the ledger's) under ``doc``'s pinned budget, or
    the one ``request`` would pin. ``pld``: also compute the PLD figure when the filter decides.
    ``planned_run_rule`` False: the filter alone (a lower bound of what is admitted, cheap)."""
    from dpbert.ledger.dataset import entries_of

    entries = entries_of(doc) if entries is None else list(entries)
    request = request or Request()
    records = _records.accountable_records(entries)
    event, delta_threshold = _records.composed_event(records), _records.threshold_delta(records)
    pin = _filter.Pin.from_dict(doc["budget"]) if doc.get("budget") else None
    base = dict(delta_threshold=delta_threshold, entries=sum(1 for e in entries if _records.composed(e)),
                requested=request.epsilon_budget, odometer=None)
    if pin is None and request.epsilon_budget is None:
        delta = float(doc.get("delta") or request.delta or 0.0)
        eps_rdp, eps_pld = _unpinned_figures(event, delta - delta_threshold, pld)
        return Verdict(True, "no_budget", None, None, False, eps_rdp, eps_pld, delta, usage=(), **base)
    new_pin = pin is None
    pin = _pin_for(request, event) if new_pin else pin
    usage = _filter.usage(event, pin)
    eps_rdp = _filter.epsilon_at_orders(event, pin)
    eps_pld = _epsilon(event, pin.delta_conversion, "pld") if event is not None and pld else None
    common = dict(pin=pin, new_pin=new_pin, epsilon_rdp=eps_rdp, delta=pin.delta, usage=usage, **base)
    if request.epsilon_budget is not None and not _same(request.epsilon_budget, pin.budget_at()):
        return Verdict(False, "rdp_filter", "budget_mismatch", epsilon_pld=eps_pld, **common)
    if delta_threshold > pin.threshold_pool * (1 + 1e-9):
        return Verdict(False, "rdp_filter", "threshold_pool", epsilon_pld=eps_pld, **common)
    if any(rho <= bound for _, rho, bound in usage):
        odometer = _filter.odometer(event, pin) if pin.level > 0 else None
        return dataclasses.replace(Verdict(True, "rdp_filter", None, epsilon_pld=eps_pld, **common), odometer=odometer)
    if planned_run_rule and pin.level == 0 and event is not None and one_planned_run(entries):
        eps_pld = _epsilon(event, pin.delta_conversion, "pld")
        return Verdict(eps_pld <= pin.epsilon, "one_planned_run_pld", None if eps_pld <= pin.epsilon else "over_budget",
                       epsilon_pld=eps_pld, **common)
    if event is not None and eps_pld is None and len(entries) <= 2:  # a first run: its PLD figure for the message
        eps_pld = _epsilon(event, pin.delta_conversion, "pld")
    return Verdict(False, "rdp_filter", "over_budget", epsilon_pld=eps_pld, **common)


def _unpinned_figures(event, delta_c: float, pld: bool):
    if event is None:
        return 0.0, (0.0 if pld else None)
    if delta_c <= 0:
        return math.inf, (math.inf if pld else None)
    return _epsilon(event, delta_c, "rdp"), (_epsilon(event, delta_c, "pld") if pld else None)


def largest_admitted(admits: Callable[[int], bool], needed: int) -> int:
    """The largest L ≤ ``needed`` with ``admits(L)`` (monotone: more steps never fit better); 0 if none."""
    if needed <= 0 or admits(needed):
        return max(int(needed), 0)
    lo, hi = 0, int(needed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if admits(mid) else (lo, mid)
    return lo


def planned_entries(vocab_record, train_records, plan_key: str = "planned", pipeline_root: str = "planned",
                    with_vocab: bool = True) -> List[Dict[str, Any]]:
    """Ledger entries for a run not yet reserved: its vocabulary (unless public or ``with_vocab``
    is False: a cached one) and its training, as one planned run."""
    entries = []
    if with_vocab and vocab_record is not None and vocab_record.get("mechanism") != "public":
        entries.append({"id": "planned-vocab", "mechanism": vocab_record["mechanism"], "stage": "vocab",
                        "status": "reserved", "planned": [_records.ledger_record(vocab_record)],
                        "plan_key": plan_key, "pipeline_root": pipeline_root, "time": "~planned-0"})
    if train_records:
        mechanism = "non_private" if any(r["mechanism"] == "non_private" for r in train_records) else "dp_sgd"
        entries.append({"id": "planned-train", "mechanism": mechanism, "stage": "train", "status": "reserved",
                        "planned": [_records.ledger_record(r) for r in train_records], "plan_key": plan_key,
                        "pipeline_root": pipeline_root, "time": "~planned-1"})
    return entries


def request_for(target) -> Request:
    """The gate's request of a ``dpbert.accounting.target.LedgerTarget``."""
    return Request(target.epsilon_budget, target.delta, target.threshold_delta, tuple(target.first_plan),
                   target.orders)


def alone(config, vocab_record, train_records) -> Verdict:
    """The verdict on a run of ``config`` as the first on a fresh dataset."""
    from dpbert.accounting.deltas import dataset_delta, threshold_delta

    return alone_of_records(vocab_record, train_records, config.privacy.epsilon_budget, dataset_delta(config),
                            threshold_delta(config))


def alone_of_records(vocab_record, train_records, budget: Optional[float], delta: float,
                     threshold_delta: float = 0.0) -> Verdict:
    """The verdict on these records as the only run on a fresh dataset with ``budget`` at ``delta``."""
    entries = planned_entries(vocab_record, train_records)
    request = Request(budget, delta, threshold_delta, tuple(r for e in entries for r in e["planned"]))
    return decide({"entries": {}}, entries, request, pld=True)
