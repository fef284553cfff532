"""DP-SGD step cost vs. the non-private step on the same model and logical batch.

    python benchmarks/dpsgd_step.py [--quick] [--configs tiny base]

Each config runs in its own process: it builds the BERT MLM once, then two real
``DPSGDTrainStep``s on it (non-private: plain gradients; DP: ghost-norm clipping + one noise
draw + AdamW), warms each up (tracing), and times ``steps`` logical steps of each, INTERLEAVED
(non-DP, DP, non-DP, ...) so both see the same machine load; the ratio is of the medians (target
≤ 1.5). Peak memory: ``ru_maxrss`` after building, after the non-DP warm-up (the non-DP peak)
and after the DP warm-up (the peak with both). Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    # name: (preset sizes, vocab, seq len, logical batch, timed steps)
    "tiny": dict(preset="tiny", vocab=8000, seq=128, batch=32, steps=10, warmup=2),
    "base": dict(preset="base", vocab=30522, seq=32, batch=8, steps=3, warmup=1),
}


def _worker(name: str, quick: bool) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dpbert  # noqa: F401
    import numpy as np
    import tf_keras
    from dpbert.config import ModelConfig
    from dpbert.model import bert as bert_lib
    from dpbert.model import dpsgd
    from dpbert.model.train import make_mlm_functions

    def rss_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    cfg = dict(CONFIGS[name])
    if quick:
        cfg["steps"] = max(2, cfg["steps"] // 3)
    spec = bert_lib.spec_from_config(ModelConfig(preset=cfg["preset"], max_seq_length=cfg["seq"], dropout=0.1),
                                     cfg["vocab"])
    models = bert_lib.build_bert(spec, seed=0)
    prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, [0, 1, 2, 3, 4], 4, 0.15)
    rng = np.random.default_rng(0)
    features = rng.integers(5, spec.vocab_size, (1, cfg["batch"], spec.max_seq_length)).astype(np.int32)
    features[:, :, 0] = 2
    rounds = [{"features": features, "example_mask": np.ones((1, cfg["batch"]), np.float32)}]
    memory = {"after_build_mb": rss_mb()}
    steppers, warm = {}, {}
    for mode in ("nondp", "dp"):  # non-DP first, so the peak after it is the non-DP peak
        config = dpsgd.DPSGDConfig(clip_norm=0.01, noise_multiplier=1.0, expected_batch_size=cfg["batch"],
                                   non_private=(mode == "nondp"), noise_seed=0)
        optimizer = tf_keras.optimizers.AdamW(1e-5, jit_compile=False)
        steppers[mode] = dpsgd.DPSGDTrainStep(models.mlm, optimizer, config, prepare_fn=prepare_fn,
                                              loss_fn=loss_fn, metrics_fn=metrics_fn)
        t0 = time.perf_counter()
        for _ in range(cfg["warmup"]):
            steppers[mode].run_step(rounds)
        warm[mode] = time.perf_counter() - t0
        memory[f"peak_after_{mode}_mb"] = rss_mb()
    # Interleaved timing (nondp, dp, nondp, dp, ...): both modes see the same machine load.
    times = {"nondp": [], "dp": []}
    for _ in range(cfg["steps"]):
        for mode in ("nondp", "dp"):
            t = time.perf_counter()
            steppers[mode].run_step(rounds)
            times[mode].append(time.perf_counter() - t)
    median = {mode: float(np.median(v)) for mode, v in times.items()}
    return {
        "params": bert_lib.count_parameters(spec), "hidden": spec.hidden_size, "layers": spec.num_layers,
        "vocab": spec.vocab_size, "seq_len": spec.max_seq_length, "batch": cfg["batch"],
        "timed_steps_per_mode": cfg["steps"], "clipping_path": steppers["dp"].clipping_path,
        "nondp_step_seconds_median": median["nondp"], "dp_step_seconds_median": median["dp"],
        "nondp_step_seconds_all": times["nondp"], "dp_step_seconds_all": times["dp"],
        "ratio_dp_over_nondp": median["dp"] / median["nondp"],
        "meets_target": median["dp"] / median["nondp"] <= 1.5,
        "warmup_seconds": warm, "peak_rss": memory,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="DP-SGD step time / non-DP step time")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.quick)))
        return 0
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    report = {"benchmark": "dpsgd_step", "target_ratio": 1.5, "cpu_count": os.cpu_count(),
              "load_average_before": os.getloadavg(), "results": {}}
    for name in args.configs:
        cmd = [sys.executable, __file__, "--worker", name] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
        report["results"][name] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
