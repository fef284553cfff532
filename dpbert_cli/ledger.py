"""``dpbert ledger``: what every run spent from one dataset, the composed totals and what is left.

The dataset is ``--dataset ID`` or the configuration's (``corpus.dataset_id``, or the synthetic
corpus's generator id); the ledger folder is ``--ledger`` or the configuration's
(``privacy.ledger``, ``$DPBERT_LEDGER``, the per-user folder). Reads only.
"""
from __future__ import annotations

import math

from dpbert import exit_codes
from dpbert_cli.args import config_args
from dpbert_cli.output import print_json


def add_ledger_parser(sub):
    p = sub.add_parser("ledger", help="every run that spent from a dataset, the composed ε and the budget left",
                       description="The dataset's privacy ledger (dpbert.ledger): each entry (time, run, pipeline "
                                   "root, mechanism, ε, status), the RDP filter total the budget is enforced with, "
                                   "the PLD total beside it, and what remains of the budget. Reads only.")
    config_args(p)
    p.add_argument("--dataset", help="the dataset id (default: the configuration's corpus.dataset_id, or the "
                                     "synthetic corpus's generator id)")
    p.add_argument("--ledger", help="the ledger folder (default: privacy.ledger, $DPBERT_LEDGER, "
                                    "~/.local/share/dpbert/ledgers)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_ledger)
    return p


def ledger_view(uri: str, dataset_id: str, budget=None) -> dict:
    """The JSON of ``dpbert ledger``: entries with their own ε, totals, remaining budget."""
    from dpbert.ledger import composition, dataset

    doc = dataset.read_ledger(uri, dataset_id)
    entries = dataset.entries_of(doc)
    delta = doc.get("delta")
    rows = []
    for e in entries:
        own = composition.entry_epsilon(e, delta) if delta else {"epsilon_rdp": 0.0, "epsilon_pld": 0.0}
        rows.append({"time": e.get("time"), "updated": e.get("updated"), "run_id": e.get("run_id"),
                     "pipeline_root": e.get("pipeline_root"), "mechanism": e.get("mechanism"),
                     "stage": e.get("stage"), "status": e.get("status"), "chain": e.get("chain"),
                     "composed": composition.composed(e), "epsilon_budget": e.get("epsilon_budget"),
                     "steps": composition.steps_of(composition.charged_records(e)) or None, **own})
    if budget is None:
        budget = next((e.get("epsilon_budget") for e in reversed(entries) if e.get("epsilon_budget")), None)
    totals = dataset.within(entries, budget, delta, pld=True) if delta else \
        {"epsilon_rdp": 0.0, "epsilon_pld": 0.0, "within_budget": True, "rule": "rdp_filter"}
    spent = dataset.spent(totals)
    return {"dataset_id": dataset_id, "ledger": uri, "unit": doc.get("unit"), "delta": delta, "entries": rows,
            "runs": len({r["run_id"] for r in rows}),
            "totals": {"epsilon_rdp": totals["epsilon_rdp"], "epsilon_pld": totals["epsilon_pld"],
                       "rule": totals["rule"], "epsilon_budget": budget,
                       "remaining": None if budget is None else max(budget - spent, 0.0)}}


def _fmt(x) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else "n/a" if math.isnan(x) else f"{x:.4g}"


def print_view(view: dict):
    t = view["totals"]
    print(f"dataset {view['dataset_id']} ({view['ledger']}): unit {view['unit'] or '-'}, "
          f"δ = {_fmt(view['delta'])}, {len(view['entries'])} entries (stage executions)")
    for r in view["entries"]:
        steps = f" {r['steps']} steps" if r["steps"] else ""
        listed = "" if r["composed"] else "  (listed, not composed)"
        print(f"  {r['time']}  {r['run_id']}  {r['pipeline_root']}  {r['mechanism']}{steps}  "
              f"ε RDP {_fmt(r['epsilon_rdp'])} / PLD {_fmt(r['epsilon_pld'])}  {r['status']}{listed}")
    print(f"composed: ε = {_fmt(t['epsilon_rdp'])} (RDP filter), {_fmt(t['epsilon_pld'])} (PLD)"
          + ("; one run planned in advance: its PLD total counts" if t["rule"] == "one_planned_run_pld" else ""))
    print(f"budget {_fmt(t['epsilon_budget'])}, remaining {_fmt(t['remaining'])}")


def cmd_ledger(args) -> int:
    from dpbert.ledger import identity
    from dpbert_cli.commands import UserError, load

    config = load(args)
    dataset_id = args.dataset or identity.dataset_id_for(config.corpus)
    if not dataset_id:
        raise UserError("no dataset: give --dataset ID or set corpus.dataset_id")
    location = args.ledger or identity.location_for(config)
    view = ledger_view(identity.ledger_uri(location, dataset_id), dataset_id, config.privacy.epsilon_budget
                       if args.overrides or args.config else None)
    if args.json:
        print_json(view)
    else:
        print_view(view)
    return exit_codes.OK
