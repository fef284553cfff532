"""``dpbert ledger``: what every run spent from one dataset, its pinned budget and what the gate
still admits; ``--raise-budget E`` moves the pin to a committed level.

The dataset is ``--dataset ID`` or the configuration's (``corpus.dataset_id``, or the synthetic
corpus's generator id); the ledger folder is ``--ledger`` or the configuration's
(``privacy.ledger``, ``$DPBERT_LEDGER``, the per-user folder). Reads only, but for ``--raise-budget``.
"""
from __future__ import annotations

from dpbert import exit_codes
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
from dpbert_cli.args import config_args
from dpbert_cli.output import print_json


def add_ledger_parser(sub):
    p = sub.add_parser("ledger", help="every run that spent from a dataset, the composed ε and its pinned budget",
                       description="The dataset's privacy ledger: each entry (time, run, pipeline root, mechanism, "
                                   "ε, status), the composed ε at the committed order(s) of its pinned budget "
                                   "filter, the PLD total beside it, and what the budget gate still admits.")
    config_args(p)
    p.add_argument("--dataset", help="the dataset id (default: the configuration's corpus.dataset_id, or the "
                                     "synthetic corpus's generator id)")
    p.add_argument("--ledger", help="the ledger folder (default: privacy.ledger, $DPBERT_LEDGER, "
                                    "~/.local/share/dpbert/ledgers)")
    p.add_argument("--raise-budget", type=float, metavar="EPSILON",
                   help="move the dataset's pinned budget to the smallest committed level ε_B·2^(k/2) >= EPSILON "
                        "(its total is then an odometer reading, docs/privacy.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_ledger)
    return p


def _entry_row(e: dict, delta_c) -> dict:
    from dpbert.accounting.compose import entry_epsilon_at
    from dpbert.ledger import composition

    own = entry_epsilon_at(e, delta_c)
    return {"time": e.get("time"), "updated": e.get("updated"), "run_id": e.get("run_id"),
            "pipeline_root": e.get("pipeline_root"), "mechanism": e.get("mechanism"), "stage": e.get("stage"),
            "status": e.get("status"), "chain": e.get("chain"), "composed": composition.composed(e),
            "epsilon_budget": e.get("epsilon_budget"),
            "steps": composition.steps_of(composition.charged_records(e)) or None, **own}


def ledger_view(uri: str, dataset_id: str) -> dict:
    """The JSON of ``dpbert ledger``: entries with their own ε, and the gate's verdict on them all."""
    from dpbert.accounting import gate
    from dpbert.ledger import dataset

    doc = dataset.read_ledger(uri, dataset_id)
    entries = dataset.entries_of(doc)
    verdict = gate.decide(doc, entries, pld=True)
    pin = verdict.pin
    delta_c = pin.delta_conversion if pin else (doc.get("delta") or 0.0) - verdict.delta_threshold
    rows = [_entry_row(e, delta_c if doc.get("delta") else None) for e in entries]
    return {"dataset_id": doc.get("dataset_id") or dataset_id, "ledger": uri, "unit": doc.get("unit"),
            "delta": verdict.delta or doc.get("delta"), "entries": rows, "runs": len({r["run_id"] for r in rows}),
            "budget": None if pin is None else pin.to_dict(),
            "totals": {"epsilon_rdp": verdict.epsilon_rdp, "epsilon_pld": verdict.epsilon_pld, "rule": verdict.rule,
                       "epsilon_budget": verdict.budget, "within_budget": verdict.admitted,
                       "epsilon_spent": verdict.spent, "odometer": verdict.odometer,
                       "usage": [{"order": a, "rho": r, "rho_budget": b} for a, r, b in verdict.usage]}}


def print_view(view: dict):
    t, pin = view["totals"], view["budget"]
    print(f"dataset {view['dataset_id']} ({view['ledger']}): unit {view['unit'] or '-'}, "
          f"δ = {fmt_delta(view['delta'])}, {len(view['entries'])} entries (stage executions)")
    for r in view["entries"]:
        steps = f" {r['steps']} steps" if r["steps"] else ""
        listed = "" if r["composed"] else "  (listed, not composed)"
        print(f"  {r['time']}  {r['run_id']}  {r['pipeline_root']}  {r['mechanism']}{steps}  "
              f"ε RDP {fmt_epsilon(r['epsilon_rdp'])} / PLD {fmt_epsilon(r['epsilon_pld'])}  {r['status']}{listed}")
    if pin is None:
        print(f"composed: ε = {fmt_epsilon(t['epsilon_rdp'])} (RDP), {fmt_epsilon(t['epsilon_pld'])} (PLD); "
              f"no budget pinned (the first run with privacy.epsilon_budget pins one)")
        return
    orders = ", ".join(f"α = {u['order']:g}: ρ {u['rho']:.4g} of {u['rho_budget']:.4g}" for u in t["usage"])
    print(f"budget: ε = {fmt_epsilon(pin['level_epsilon'])} at δ = {fmt_delta(pin['delta'])} "
          f"(pinned ε_B = {fmt_epsilon(pin['epsilon'])}, level {pin['level']}; filter at {orders})")
    print(f"composed: ε = {fmt_epsilon(t['epsilon_rdp'])} (RDP at the committed orders), "
          f"{fmt_epsilon(t['epsilon_pld'])} (PLD, valid for one run planned in advance)"
          + ("; one run planned in advance: its PLD total counts" if t["rule"] == "one_planned_run_pld" else "")
          + f" → {'within budget' if t['within_budget'] else 'OVER BUDGET: closed to further runs'}")
    odo = t.get("odometer")
    if odo:
        print(f"odometer reading (budget raised): level {odo['level']}, ε = {fmt_epsilon(odo['epsilon'])} at "
              f"δ = {fmt_delta(odo['delta'])}")


def cmd_ledger(args) -> int:
    from dpbert.accounting.reserve import raise_budget
    from dpbert import storage
    from dpbert.config import normalise_dataset_id
    from dpbert.ledger import identity
    from dpbert_cli.commands import UserError, load

    config = load(args)
    dataset_id = args.dataset or identity.dataset_id_for(config.corpus)
    dataset_id = normalise_dataset_id(dataset_id) if dataset_id else dataset_id
    if not dataset_id:
        raise UserError("no dataset: give --dataset ID or set corpus.dataset_id")
    location = args.ledger or identity.location_for(config)
    uri = identity.ledger_uri(location, dataset_id)
    if not storage.storage_for(uri).exists(uri):
        raise UserError(f"--dataset {dataset_id}: no ledger at {uri} (no run has spent from this dataset there; "
                        f"check the id and --ledger / privacy.ledger)")
    if args.raise_budget is not None:
        pin = raise_budget(uri, dataset_id, args.raise_budget)
        print(f"dataset {dataset_id}: budget raised to level {pin['level']}, ε = {fmt_epsilon(pin['level_epsilon'])} "
              f"(the committed grid ε_B·2^(k/2)); its total is now an odometer reading")
    view = ledger_view(uri, dataset_id)
    print_json(view) if args.json else print_view(view)
    return exit_codes.OK
