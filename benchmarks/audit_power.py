"""Power and cost of the white-box one-run audit (``dpbert.evaluate.whitebox``).

    TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python benchmarks/audit_power.py \\
        [--quick] [--seeds 1] [--json out.json]

Honest runs (the shipped training loop, ``build_training``; no fault injection) of the tiny audit
model (1 layer, H = 16, V = 1024, L = 16, ``training.trainable: [all]``; probe = the largest
trained piece, the word embedding, d' = 16384) on 160 rows of the embedded synthetic
corpus, B = 16 (q = 0.1), T = 60 steps, C = 1, δ = 1e-5, 95 % confidence. The lower bound is the
f-DP one-run test of the claimed DP-SGD curve (``dpbert.privacy.fdp_audit``); SNJ's is printed next
to it, with the weakest noise factor the audit is expected to detect. σ is calibrated with
the PLD accountant for a claimed ε_T ≈ 2, 4, 8 (the accountant's ε of the same (σ, q, T, δ) is
the upper bound reported). For each claimed ε and m ∈ {10³, 10⁴} it prints the lower bound, the
ratio lower / claimed, and the reachable maximum (every guess right).

Cost: the audit (build, trace, T steps with the canary units enrolled, canary sums, scores,
bound) against the SAME loop without canaries (``build_training`` with the same model, rows, q, T,
σ), both timed end to end in this process, and the canary work alone (sums + projections, no training)
at T = 450 steps (the demo's) and m = 10⁴, the part that grows with m·d'·T.
``--quick``: m = 10³ only and no T = 450 row. Prints a table, then one JSON document.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROWS, BATCH, STEPS, DELTA, CLIP = 160, 16, 60, 1e-5, 1.0
TARGETS = (2.0, 4.0, 8.0)


def tiny_configs(sigma: float):
    """(ModelConfig, TrainingConfig) of the audited tiny run."""
    from dpbert.config import ModelConfig, TrainingConfig

    mc = ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     max_seq_length=16, dropout=0.0)
    tc = TrainingConfig(batch_size=BATCH, steps=STEPS, noise_multiplier=sigma, clip_norm=CLIP, delta=DELTA,
                        learning_rate=1e-3, warmup_steps=0, dataset_size=ROWS, dp_diagnostics=False)
    return mc, tc


def plain_training_seconds(ids, vocab: int, sigma: float) -> dict:
    """The same loop as the audit (``build_training``), without the probe and the canary units."""
    import secrets

    from dpbert import storage
    from dpbert.evaluate.whitebox import MASK_ID, SPECIAL_IDS
    from dpbert.engine.build import ChainOutputs, ModelStart, TrainingRows, build_training

    mc, tc = tiny_configs(sigma)
    uri = f"ram://dpbert-audit-power/{secrets.token_hex(6)}"
    t0 = time.perf_counter()
    with build_training(TrainingRows(ids, list(SPECIAL_IDS), MASK_ID), ModelStart(mc, vocab), tc,
                        ChainOutputs(uri, resume=False, export_saved_model=False, progress=False)) as training:
        t1 = time.perf_counter()
        training.loop.run()
    end = time.perf_counter()
    storage.storage_for(uri).rmtree(uri)
    return {"total": end - t0, "train": end - t1}


def canary_overhead_seconds(m: int, steps: int, dims: int = 16384, q: float = 0.1) -> dict:
    """Canary sums + projections + scores for ``steps`` steps, without training."""
    import numpy as np

    from dpbert.privacy import whitebox_audit as wa

    rng = np.random.default_rng(0)
    part = rng.random((steps, m)) < q / 2
    t0 = time.perf_counter()
    sums = wa.canary_sums(1, part, dims, CLIP)
    t1 = time.perf_counter()
    observed = sums + rng.standard_normal(sums.shape, dtype=np.float32)
    t2 = time.perf_counter()
    wa.llr_scores(wa.canary_projections(1, observed, m, CLIP), q, 1.0)
    t3 = time.perf_counter()
    return {"steps": steps, "canaries": m, "dims": dims, "sums": t1 - t0, "scores": t3 - t2,
            "total": (t1 - t0) + (t3 - t2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the JSON document here")
    args = parser.parse_args(argv)

    from dpbert.evaluate import whitebox as wb
    from dpbert.accounting.accountant import noise_multiplier_for_target

    ids, vocab = wb.demo_token_rows()
    ids = ids[:ROWS]
    q = BATCH / ROWS
    sizes = (1000,) if args.quick else (1000, 10_000)
    rows = []
    for target in TARGETS:
        sigma = noise_multiplier_for_target(target, q, STEPS, DELTA, accountant="pld", tol=1e-3)
        for m in sizes:
            for seed in range(args.seeds):
                mc, tc = tiny_configs(sigma)
                res = wb.whitebox_audit(ids, list(wb.SPECIAL_IDS), vocab, mc, tc, mask_token_id=wb.MASK_ID,
                                        settings=wb.AuditSettings(canaries=m, seed=1000 + seed, public=True))
                row = {k: res[k] for k in ("epsilon_lower_bound", "epsilon_lower_bound_snj", "sigma_upper_bound",
                                           "weakest_detected_noise_factor", "epsilon_upper_bound", "max_reachable_lower_bound",
                                           "canaries", "confidence", "steps", "q", "sigma_claimed", "k_plus",
                                           "k_minus", "accuracy", "seconds")}
                row.update(target=target, seed=seed,
                           ratio=res["epsilon_lower_bound"] / res["epsilon_upper_bound"])
                rows.append(row)
                print(f"claimed ε {row['epsilon_upper_bound']:5.2f} (σ {sigma:.3f})  m {m:6d}  seed {seed}  "
                      f"lower {row['epsilon_lower_bound']:5.3f} (SNJ {row['epsilon_lower_bound_snj']:5.3f}, detects σ × "
                      f"{row['weakest_detected_noise_factor']})  ratio {row['ratio']:.3f}  reachable "
                      f"{row['max_reachable_lower_bound']:.2f}  audit {row['seconds']['total']:.1f}s", flush=True)

    # Cost: the audit at claimed ε ≈ 4 and the largest m vs the same training without canaries.
    sigma4 = rows[len(sizes) * args.seeds]["sigma_claimed"]
    audit_cost = [r for r in rows if r["target"] == 4.0 and r["canaries"] == sizes[-1]][0]["seconds"]
    plain = plain_training_seconds(ids, vocab, sigma4)
    cost = {"canaries": sizes[-1], "audit_seconds": audit_cost, "plain_training_seconds": plain,
            "ratio_total": audit_cost["total"] / plain["total"]}
    print(f"cost at m = {sizes[-1]}: audit {audit_cost['total']:.1f}s (train loop with the canary units "
          f"{audit_cost['train']:.1f}s) vs the loop without canaries {plain['total']:.1f}s (loop "
          f"{plain['train']:.1f}s): ×{cost['ratio_total']:.2f}", flush=True)
    if not args.quick:
        cost["canary_work_demo_steps"] = canary_overhead_seconds(10_000, 450)
        c = cost["canary_work_demo_steps"]
        print(f"canary work alone at T = 450, m = 10⁴, d' = 16384: sums {c['sums']:.1f}s + scores "
              f"{c['scores']:.1f}s = {c['total']:.1f}s", flush=True)

    print("\n| claimed ε (PLD) | σ | m | lower bound | lower / claimed | reachable max |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['epsilon_upper_bound']:.2f} | {r['sigma_claimed']:.3f} | {r['canaries']} | "
              f"{r['epsilon_lower_bound']:.3f} | {r['ratio']:.3f} | {r['max_reachable_lower_bound']:.2f} |")
    document = {"setting": {"rows": ROWS, "batch_size": BATCH, "q": q, "steps": STEPS, "delta": DELTA,
                            "clip_norm": CLIP, "model": tiny_configs(1.0)[0].__dict__},
                "runs": rows, "cost": cost}
    text = json.dumps(document, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
