"""How far the proxy-chosen learning rate and clip norm are from the oracle-chosen ones. A
benchmark, never a test: at the demo's sizes it trains (1 + proxies) × grid × repeats runs.

    TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python benchmarks/tuning_gap.py \\
        --out bench_tuning_gap [--config FILE] [--set SECTION.FIELD=VALUE ...] [--proxies synthetic,public] \\
        [--learning-rates 1e-3,3e-3,1e-2] [--clip-norms 0.1,1,10] [--repeats 1] [--proxy-batch b] \\
        [--patients 1000] [--oracle-patients N]

What it measures (the configuration's planned run: B, T, σ over its public n; default the demo):

1. the ORACLE: every grid point trained with the shipped loop at the planned B and σ (no scaling)
   on a stand-in for the private corpus — the configuration's synthetic corpus at its OWN seed
   (``corpus.synthetic``; ``--oracle-patients`` patients, default ``corpus.synthetic.patients``),
   the text ``dpbert tune`` refuses to read — scored on held-out patients of that corpus;
2. each PROXY: ``dpbert tune``'s search (``dpbert.tuning.tune.Tuner``) at batch b with
   σ_b = σ·b/B on the synthetic generator at the public seed or the shipped BC5CDR text;
3. per proxy: ``gap_nats`` = the oracle's loss at the proxy's choice − the oracle's best loss (0:
   the proxy chose what the oracle would), and ``spearman``, the rank correlation of the proxy's
   and the oracle's losses over the grid.

Resumable row by row: each finished (setting, lr, C, repeat) is appended to ``rows.jsonl`` under
``--out`` and a rerun trains only the missing ones. ``results.json`` and ``results.csv`` hold the
table with the date and the git commit.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import logging
import math
import os
import subprocess
from typing import Dict

log = logging.getLogger("tuning_gap")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tuner_class():
    from dpbert.tuning.tune import Tuner

    class CachedTuner(Tuner):
        """A ``Tuner`` whose rows are read from / appended to ``rows.jsonl`` (resumable)."""

        setting, path, cache = "", "", {}

        def train_row(self, learning_rate, clip_norm, repeat):
            key = f"{self.setting}|{learning_rate!r}|{clip_norm!r}|{repeat}"
            if key not in self.cache:
                loss = super().train_row(learning_rate, clip_norm, repeat)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "heldout_loss": loss if math.isfinite(loss) else "inf"}) + "\n")
                self.cache[key] = loss
                log.info("%s lr=%g C=%g repeat %d: %.4f", self.setting, learning_rate, clip_norm, repeat, loss)
            return self.cache[key]

    return CachedTuner


def _read_cache(path: str) -> Dict[str, float]:
    cache = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    cache[row["key"]] = float(row["heldout_loss"])
    return cache


def _run(setting: str, plan, config, proxy, args, grid, cache, proxy_batch):
    tuner_class = _tuner_class()
    tuner = type(f"Cached_{setting}", (tuner_class,), {"setting": setting, "cache": cache,
                                                        "path": os.path.join(args.out, "rows.jsonl")})
    try:
        return tuner(plan, config.model, config.training, proxy, grid=grid, proxy_batch=proxy_batch,
                     seed=args.seed, repeats=args.repeats).run()
    except ValueError as err:  # every point diverged: keep the rows, no choice
        log.warning("%s: %s", setting, err)
        return None


def _oracle_proxy(config, args):
    from dpbert.tuning import proxy as proxy_lib

    spec = proxy_lib.spec_for(config, "synthetic", args.seed, args.patients)
    patients = args.oracle_patients or config.corpus.synthetic.patients
    return proxy_lib.build_proxy(dataclasses.replace(spec, seed=config.corpus.synthetic.seed, patients=patients,
                                                     heldout_patients=max(1, args.patients // 5)))


def _losses(result, grid):
    by_point = {(r["learning_rate"], r["clip_norm"]): r["heldout_loss"] for r in result.rows} if result else {}
    return [by_point.get(p, math.inf) for p in grid.points()]


def _compare(oracle, proxy, grid) -> dict:
    from scipy.stats import spearmanr

    o, p = _losses(oracle, grid), _losses(proxy, grid)
    best = min(o)
    chosen = None if proxy is None else (proxy.choice["learning_rate"], proxy.choice["clip_norm"])
    gap = o[grid.points().index(chosen)] - best if chosen is not None else math.inf
    finite = [(a, b) for a, b in zip(o, p) if math.isfinite(a) and math.isfinite(b)]
    rho = float(spearmanr(*zip(*finite)).statistic) if len(finite) > 2 else float("nan")
    return {"choice": None if chosen is None else {"learning_rate": chosen[0], "clip_norm": chosen[1]},
            "losses": p, "gap_nats": gap, "spearman": rho}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _write(args, plan, grid, oracle, compared):
    stamp = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": _commit()}
    doc = {**stamp, "plan": plan.to_dict(), "grid": [list(p) for p in grid.points()], "repeats": args.repeats,
           "oracle": {"choice": oracle.choice if oracle else None, "losses": _losses(oracle, grid)},
           "proxies": compared}
    from dpbert import schema

    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        f.write(schema.dumps(doc, indent=2) + "\n")
    with open(os.path.join(args.out, "results.csv"), "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["date", "commit", "setting", "learning_rate", "clip_norm", "heldout_loss", "chosen", "gap_nats"])
        for name, losses, choice, gap in [("oracle", doc["oracle"]["losses"], doc["oracle"]["choice"], 0.0)] + [
                (f"proxy:{k}", v["losses"], v["choice"], v["gap_nats"]) for k, v in compared.items()]:
            for (lr, c), loss in zip(grid.points(), losses):
                hit = choice is not None and (choice["learning_rate"], choice["clip_norm"]) == (lr, c)
                w.writerow([stamp["date"], stamp["commit"], name, lr, c, loss, int(hit), gap if hit else ""])
    return doc


def main(argv=None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from dpbert.config import load_config
    from dpbert.tuning import proxy as proxy_lib
    from dpbert.tuning import tune as tune_lib

    os.makedirs(args.out, exist_ok=True)
    config = load_config(args.config, list(args.set), preset=None if args.config else "demo")
    grid = tune_lib.Grid(args.learning_rates, args.clip_norms)
    plan = tune_lib.plan_of(config)
    cache = _read_cache(os.path.join(args.out, "rows.jsonl"))
    oracle = _run("oracle", plan, config, _oracle_proxy(config, args), args, grid, cache, plan.batch_size)
    compared = {}
    for source in args.proxies:
        proxy = proxy_lib.build_proxy(proxy_lib.spec_for(config, source, args.seed, args.patients,
                                                         max(1, args.patients // 5)))
        compared[source] = _compare(oracle, _run(f"proxy:{source}", plan, config, proxy, args, grid, cache,
                                                 args.proxy_batch), grid)
    doc = _write(args, plan, grid, oracle, compared)
    print(json.dumps({"oracle": doc["oracle"]["choice"],
                      **{k: {"choice": v["choice"], "gap_nats": v["gap_nats"], "spearman": v["spearman"]}
                         for k, v in compared.items()}}, indent=2, default=str))
    return 0


def _floats(text: str):
    return tuple(float(v) for v in text.split(",") if v.strip())


def _parse(argv):
    from dpbert.tuning import proxy as proxy_lib
    from dpbert.tuning import tune as tune_lib

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (rows.jsonl, results.json, results.csv)")
    p.add_argument("--config", help="configuration file (default: the demo preset)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--proxies", type=lambda s: tuple(s.split(",")), default=proxy_lib.SOURCES)
    p.add_argument("--learning-rates", type=_floats, default=tune_lib.LEARNING_RATES)
    p.add_argument("--clip-norms", type=_floats, default=tune_lib.CLIP_NORMS)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--proxy-batch", type=int, help=f"default min(B, {tune_lib.PROXY_BATCH})")
    p.add_argument("--patients", type=int, default=proxy_lib.PROXY_PATIENTS, help="synthetic proxy patients")
    p.add_argument("--oracle-patients", type=int, help="default corpus.synthetic.patients")
    p.add_argument("--seed", type=int, default=proxy_lib.PROXY_SEED)
    return p.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
