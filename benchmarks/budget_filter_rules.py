"""The dataset budget's rules side by side on a demo-like ledger (docs/privacy.md, "The dataset's
budget: a pinned filter"): k runs of the demo preset's plan on one dataset, composed under

* the rule before the pin (any of dp-accounting's 156 orders at the full δ_c: no published theorem),
* one committed order α* (the first plan's best, ``filter.best_order``) at δ_c,
* three committed orders with δ shares ¼, ½, ¼,

beside the PLD total (valid only for a sequence fixed in advance). Run: .venv/bin/python
benchmarks/budget_filter_rules.py [--budget 8] [--runs 3]
"""
from __future__ import annotations

import argparse

from dpbert.accounting import filter as F
from dpbert.accounting.accountant import planned_records
from dpbert.accounting.deltas import dataset_delta, threshold_delta
from dpbert.accounting.epsilon import DEFAULT_ORDERS, epsilon, rdp_at, rdp_to_epsilon
from dpbert.config import load_config
from dpbert.ledger import composition


def rows(budget: float, runs: int):
    config = load_config(None, [], preset="demo")
    records = [composition.ledger_record(r) for r in planned_records(config)]
    delta_c = dataset_delta(config) - threshold_delta(config)
    one = composition.composed_event(records)
    pins = {m: F.Pin(budget, delta_c, 0.0, *F.committed_orders(one, budget, delta_c, m)) for m in (1, 3)}
    orders = [a for a in DEFAULT_ORDERS if a > 1.01]
    for k in range(1, runs + 1):
        event = composition.composed_event(records * k)
        any_order = min(rdp_to_epsilon(a, r, delta_c) for a, r in zip(orders, rdp_at(event, orders)))
        yield {"runs": k, "pld": epsilon(event, delta_c, "pld"), "any_order": any_order,
               **{f"orders_{m}": F.epsilon_at_orders(event, pin) for m, pin in pins.items()},
               **{f"within_{m}": F.covers(event, pin) for m, pin in pins.items()},
               "alpha": pins[1].orders, "alphas": pins[3].orders, "delta_c": delta_c}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=8.0)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    print("| runs | PLD (fixed sequence) | any of 156 orders | 1 committed order | 3 committed orders |")
    print("|---|---|---|---|---|")
    for r in rows(args.budget, args.runs):
        print(f"| {r['runs']} | {r['pld']:.3f} | {r['any_order']:.3f} | {r['orders_1']:.3f}"
              f"{'' if r['within_1'] else ' (over)'} | {r['orders_3']:.3f}{'' if r['within_3'] else ' (over)'} |")
    print(f"budget {args.budget}, δ_c = {r['delta_c']:.6g}, α* = {r['alpha']}, three orders {r['alphas']}")


if __name__ == "__main__":
    main()
