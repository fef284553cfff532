"""DP-SGD step cost vs. the non-private step on the same model and logical batch, timed on the
SHIPPED training loop.

    python benchmarks/dpsgd_step.py [--quick] [--configs tiny base] [--trainable-only] [--xla]
    python benchmarks/dpsgd_step.py --large-batch [--patients 3000] [--compare-root DIR] [--jit]

Each config runs in its own process; each mode (non-private baseline, then DP) is built with
``dpbert.engine.build.build_training`` — the trainer's own composition — and run through its
``TrainLoop`` with a :class:`TimingHook` recording each step's wall time. The first ``warmup``
steps (tracing) are dropped; the ratio is of the medians (target ≤ 1.5) and of the minimums.
``--trainable-only`` times each ``training.trainable`` set on the demo's model; ``--xla`` compares
eager and XLA (``training.jit_compile``) with DP and non-DP steps interleaved, next to the load
average before and after each process. ``--large-batch`` times the DP step of ``[bias, head]`` on the
demo's model with the patient as the unit (k = 2 tuples each) at thousands of patients per step:
tuples/s and CPU seconds per tuple (``time.process_time``: robust to other jobs on the cores);
``--compare-root`` alternates processes of another checkout (A) and this one (B), A/B/A/B. What
each mode builds, the per-set, XLA and large-batch runs, and the dated figures: docs/benchmarks.md
("The DP-SGD step benchmark", "Large batches of [bias, head]").
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
if "--root" in sys.argv:  # a large-batch worker times the dpbert of another checkout
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])

CONFIGS = {
    # logical batch B = accumulation (T) micro-rounds of B/T examples (P = 1 replica)
    "tiny": dict(preset="tiny", vocab=8000, seq=128, batch=32, accumulation=1, steps=10, warmup=2),
    "base": dict(preset="base", vocab=30522, seq=32, batch=64, accumulation=2, steps=6, warmup=2),
}
#: The per-trainable-set rows (``training.trainable``): the demo's model (MiniLM width, 2 layers,
#: public vocabulary + 19 appended tokens, L = 32) and a logical batch of 64 rows (16 patients × 4).
TRAINABLE_CONFIG = dict(hidden=384, layers=2, heads=12, inter=1536, vocab=30541, new_tokens=19, seq=32,
                        batch=64, steps=5, warmup=1, lora_rank=16, lora_alpha=32.0)
TRAINABLE_SETS = (["all"], ["lora"], ["bias"], ["head"], ["new_tokens"])
#: The large-batch rows: the demo's recipe (its model as above with dropout 0, ``[bias, head]``,
#: the patient as the unit with k = 2 tuples each, q = 1 so every step has all the patients),
#: ``micro_patients`` patients (2× as many rows) per accumulation round.
LARGE_BATCH = dict(patients=3000, k=2, micro_patients=250, steps=2, warmup=1, trainable=("bias", "head"))


def timing_hook():
    """A loop hook that records the wall time of every step (from the previous step's end)."""
    from dpbert.engine.hooks import Hook

    class TimingHook(Hook):
        def __init__(self):
            self.seconds, self.units, self._t = [], [], None

        def on_start(self, loop):
            self._t = time.perf_counter()

        def on_step(self, loop, step, rounds, stats, sampled):
            now = time.perf_counter()
            self.seconds.append(now - self._t)
            self.units.append(int(len(sampled)))
            self._t = now

    return TimingHook()


def _rows_and_config(model_config, vocab: int, batch: int, accumulation: int, steps: int, mode: str,
                     trainable=("all",), seed: int = 0, jit_compile: bool = False):
    import numpy as np

    from dpbert.config import TrainingConfig

    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (batch, model_config.max_seq_length)).astype(np.int32)
    ids[:, 0] = 2
    tc = TrainingConfig(batch_size=batch, steps=steps, sampling="poisson", dataset_size=batch, noise_multiplier=1.0,
                        clip_norm=0.01, accumulation_steps=accumulation, non_private=(mode == "nondp"),
                        learning_rate=1e-5, warmup_steps=0, dp_diagnostics=False, checkpoint_every=10 ** 6,
                        integrity_check_every=0, noise_seed=seed, trainable=list(trainable), jit_compile=jit_compile)
    return ids, tc


def run_loop(model_config, vocab: int, batch: int, accumulation: int, steps: int, mode: str,
             trainable=("all",), new_token_ids=None, seed: int = 0, hooks=()):
    """Build the trainer's loop (``build_training``) on random rows and run it with a timing hook
    (and ``hooks``: tests observe the loop); (TimingHook, Training)."""
    import secrets

    from dpbert import storage
    from dpbert.engine.build import ChainOutputs, ModelStart, RunHooks, TrainingRows, build_training

    ids, tc = _rows_and_config(model_config, vocab, batch, accumulation, steps, mode, trainable, seed)
    hook = timing_hook()
    uri = f"ram://dpbert-bench/{secrets.token_hex(6)}"
    try:
        with build_training(TrainingRows(ids, [0, 1, 2, 3, 4], 4),
                            ModelStart(model_config, vocab, new_token_ids=new_token_ids), tc,
                            ChainOutputs(uri, resume=False, export_saved_model=False, progress=False),
                            hooks=RunHooks([hook] + list(hooks))) as training:
            training.loop.run()
    finally:
        store = storage.storage_for(uri)
        if store.exists(uri):
            store.rmtree(uri)
    return hook, training


def interleaved(model_config, vocab: int, batch: int, accumulation: int, steps: int, warmup: int, jit: bool,
                trainable=("all",), new_token_ids=None) -> dict:
    """The shipped loop built twice (non-DP, DP; compiled or not), their steps interleaved (the
    first of each pair alternates); per mode the wall time of every step, the host's batch
    preparation and (compiled DP) the noise draw alone."""
    import contextlib
    import secrets

    from dpbert import storage
    from dpbert.engine.build import ChainOutputs, ModelStart, TrainingRows, build_training

    total = warmup + steps
    out = {mode: {"seconds": []} for mode in ("nondp", "dp")}
    uris = []
    with contextlib.ExitStack() as stack:
        loops = {}
        for mode in out:
            ids, tc = _rows_and_config(model_config, vocab, batch, accumulation, total, mode, trainable,
                                       jit_compile=jit)
            uris.append(f"ram://dpbert-bench/{secrets.token_hex(6)}")
            training = stack.enter_context(build_training(
                TrainingRows(ids, [0, 1, 2, 3, 4], 4), ModelStart(model_config, vocab, new_token_ids=new_token_ids), tc,
                ChainOutputs(uris[-1], resume=False, export_saved_model=False, progress=False)))
            loops[mode] = training.loop
            for hook in training.loop.hooks:
                hook.on_start(training.loop)
        for i in range(total):
            for mode in (("nondp", "dp") if i % 2 == 0 else ("dp", "nondp")):
                start = time.perf_counter()
                loops[mode]._take_step()  # pylint: disable=protected-access  (one step of the shipped loop)
                out[mode]["seconds"].append(time.perf_counter() - start)
        for mode, loop in loops.items():
            start = time.perf_counter()
            for step in range(3):
                loop.source.rounds(step, step, 1)
            out[mode]["host_batch_seconds"] = (time.perf_counter() - start) / 3
            executor = loop.stepper.executor
            if getattr(executor, "_noise_buffers", None) is not None:
                executor.wait_ahead()
                start = time.perf_counter()
                executor._draw_ahead_fn()  # pylint: disable=protected-access
                out[mode]["noise_draw_seconds"] = time.perf_counter() - start
            for hook in loop.hooks:
                hook.close(loop)
    for uri in uris:
        store = storage.storage_for(uri)
        if store.exists(uri):
            store.rmtree(uri)
    return out


def _interleaved_worker(name: str, jit: bool, quick: bool) -> dict:
    """One (config, compiled or not) process: ``interleaved`` and the DP ÷ non-DP ratios."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dpbert  # noqa: F401
    import numpy as np
    from dpbert.config import ModelConfig

    if name == "demo":
        cfg = dict(TRAINABLE_CONFIG, accumulation=1)
        mc = ModelConfig(hidden_size=cfg["hidden"], num_layers=cfg["layers"], num_heads=cfg["heads"],
                         intermediate_size=cfg["inter"], max_seq_length=cfg["seq"], dropout=0.1)
    else:
        cfg = dict(CONFIGS[name])
        mc = ModelConfig(preset=cfg["preset"], max_seq_length=cfg["seq"], dropout=0.1)
    steps = max(2, cfg["steps"] // 2) if quick else cfg["steps"]
    times = interleaved(mc, cfg["vocab"], cfg["batch"], cfg["accumulation"], steps, cfg["warmup"], jit)
    row = {"jit_compile": jit, "batch": cfg["batch"], "accumulation": cfg["accumulation"], "seq_len": cfg["seq"],
           "timed_steps_per_mode": steps}
    for mode, t in times.items():
        timed = t["seconds"][cfg["warmup"]:]
        row[mode] = dict(t, median=float(np.median(timed)), minimum=float(min(timed)),
                         first_step_seconds=t["seconds"][0])
    row["ratio_dp_over_nondp"] = row["dp"]["median"] / row["nondp"]["median"]
    row["ratio_of_minimums"] = row["dp"]["minimum"] / row["nondp"]["minimum"]
    return row


def _xla_matrix(quick: bool, env: dict) -> dict:
    """Eager and XLA × demo and BERT-base, each process's load average next to its figures."""
    rows = {}
    for name in ("demo", "base"):
        for jit in (False, True):
            before = os.getloadavg()
            cmd = [sys.executable, __file__, "--interleaved-worker", name, "--jit", str(int(jit))] + \
                (["--quick"] if quick else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
            if proc.returncode != 0:
                raise SystemExit(f"{name} jit={jit} failed:\n{proc.stderr[-4000:]}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["load_average_before"], row["load_average_after"] = before, os.getloadavg()
            rows[f"{name}/{'xla' if jit else 'eager'}"] = row
    for name in ("demo", "base"):
        eager, xla = rows[f"{name}/eager"], rows[f"{name}/xla"]
        rows[f"{name}/xla_over_eager"] = {mode: xla[mode]["median"] / eager[mode]["median"] for mode in ("nondp", "dp")}
    return rows


def _patient_loop(mc, vocab: int, patients: int, k: int, micro_patients: int, steps: int, jit: bool):
    """The shipped loop (``build_training``) of the large-batch rows, with a hook timing every
    step's wall and CPU seconds; yields (loop, hook) inside the build's context."""
    import contextlib
    import secrets

    import numpy as np

    from dpbert import storage
    from dpbert.config import TrainingConfig
    from dpbert.engine.build import ChainOutputs, ModelStart, RunHooks, TrainingRows, build_training
    from dpbert.privacy.plan import plan_training

    cfg = LARGE_BATCH
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (patients * k, mc.max_seq_length)).astype(np.int32)
    ids[:, 0] = 2
    tc = TrainingConfig(batch_size=patients, steps=steps, sampling="poisson", dataset_size=patients,
                        noise_multiplier=1.0, clip_norm=1.0, accumulation_steps=patients // micro_patients,
                        learning_rate=1e-2, warmup_steps=0, dp_diagnostics=False, checkpoint_every=10 ** 6,
                        integrity_check_every=0, noise_seed=0, trainable=list(cfg["trainable"]), jit_compile=jit)
    plan = plan_training(tc, patients, unit="patient", max_contributions=k)
    keys = [f"patient-{i // k}" for i in range(patients * k)]
    hook = timing_hook()
    uri = f"ram://dpbert-bench/{secrets.token_hex(6)}"

    @contextlib.contextmanager
    def built():
        try:
            with build_training(TrainingRows(ids, [0, 1, 2, 3, 4], 4, patient_keys=keys), ModelStart(mc, vocab), tc,
                                ChainOutputs(uri, resume=False, export_saved_model=False, progress=False),
                                plan=plan, hooks=RunHooks([hook])) as training:
                yield training.loop, hook
        finally:
            store = storage.storage_for(uri)
            if store.exists(uri):
                store.rmtree(uri)

    return built()


def _large_batch_worker(patients: int, micro_patients: int, steps: int, jit: bool) -> dict:
    """One process: warm-up step(s), then ``steps`` timed DP steps of the large-batch rows."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dpbert  # noqa: F401
    import numpy as np
    from dpbert.config import ModelConfig

    cfg, model = LARGE_BATCH, TRAINABLE_CONFIG
    mc = ModelConfig(hidden_size=model["hidden"], num_layers=model["layers"], num_heads=model["heads"],
                     intermediate_size=model["inter"], max_seq_length=model["seq"], dropout=0.0)
    load_before = os.getloadavg()
    wall, cpu = [], []
    with _patient_loop(mc, model["vocab"], patients, cfg["k"], micro_patients, cfg["warmup"] + steps, jit) as (loop, _):
        for hook in loop.hooks:
            hook.on_start(loop)
        for i in range(cfg["warmup"] + steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            loop._take_step()  # pylint: disable=protected-access  (one step of the shipped loop)
            if i >= cfg["warmup"]:
                wall.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
        for hook in loop.hooks:
            hook.close(loop)
    tuples = patients * cfg["k"]
    return {"patients_per_step": patients, "tuples_per_step": tuples, "micro_patients": micro_patients,
            "rounds": patients // micro_patients, "jit_compile": jit, "trainable": list(cfg["trainable"]),
            "timed_steps": steps, "step_wall_seconds": wall, "step_cpu_seconds": cpu,
            "tuples_per_second": tuples / float(np.median(wall)),
            "cpu_ms_per_tuple": 1e3 * float(np.median(cpu)) / tuples,
            "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "dpbert_root": str(Path(dpbert.__file__).resolve().parents[1])}


def _large_batch(args, env: dict) -> dict:
    """The large-batch rows, one process per repetition; with ``--compare-root`` A (that
    checkout) and B (this one) alternate A/B/A/B, each row labelled with its root and commit."""
    import statistics

    roots = ([("before", args.compare_root)] if args.compare_root else []) + [("after", str(ROOT))]
    rows = {label: [] for label, _ in roots}
    for _ in range(args.repeats):
        for label, root in roots:
            cmd = [sys.executable, __file__, "--large-batch-worker", "--root", root, "--patients", str(args.patients),
                   "--micro-patients", str(args.micro_patients), "--steps", str(args.steps), "--jit", str(int(args.jit))]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
            if proc.returncode != 0:
                raise SystemExit(f"large batch ({label}) failed:\n{proc.stderr[-4000:]}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=root).stdout.strip()
            rows[label].append(row)
    out = {"runs": rows}
    for label, runs in rows.items():
        out[label] = {"tuples_per_second_median": statistics.median(r["tuples_per_second"] for r in runs),
                      "cpu_ms_per_tuple_median": statistics.median(r["cpu_ms_per_tuple"] for r in runs)}
    if args.compare_root:
        out["after_over_before_tuples_per_second"] = \
            out["after"]["tuples_per_second_median"] / out["before"]["tuples_per_second_median"]
        out["before_over_after_cpu_per_tuple"] = \
            out["before"]["cpu_ms_per_tuple_median"] / out["after"]["cpu_ms_per_tuple_median"]
    return out


def _timed(hook, warmup: int) -> list:
    return hook.seconds[warmup:] or hook.seconds[-1:]


def _trainable_worker(quick: bool) -> dict:
    """DP step ÷ non-DP step of the SAME trainable set, per set, on the shipped loop."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dpbert  # noqa: F401
    import numpy as np
    from dpbert.config import ModelConfig
    from dpbert.network import bert as bert_lib

    cfg = dict(TRAINABLE_CONFIG)
    if quick:
        cfg["steps"] = 3
    mc = ModelConfig(hidden_size=cfg["hidden"], num_layers=cfg["layers"], num_heads=cfg["heads"],
                     intermediate_size=cfg["inter"], max_seq_length=cfg["seq"], dropout=0.1)
    new_ids = list(range(cfg["vocab"] - cfg["new_tokens"], cfg["vocab"]))
    rows = {}
    for names in TRAINABLE_SETS:
        times, size = {}, None
        for mode in ("nondp", "dp"):
            hook, training = run_loop(mc, cfg["vocab"], cfg["batch"], 1, cfg["warmup"] + cfg["steps"], mode,
                                      names, new_ids)
            times[mode], size = _timed(hook, cfg["warmup"]), training.selection.size
        median = {mode: float(np.median(v)) for mode, v in times.items()}
        rows["+".join(names)] = {
            "trainable_parameters": size, "nondp_step_seconds_median": median["nondp"],
            "dp_step_seconds_median": median["dp"], "ratio_dp_over_nondp": median["dp"] / median["nondp"],
            "nondp_step_seconds_all": times["nondp"], "dp_step_seconds_all": times["dp"],
            "meets_target_1_15": median["dp"] / median["nondp"] <= 1.15}
    spec = bert_lib.spec_from_config(mc, cfg["vocab"])
    return {"model": {k: cfg[k] for k in ("hidden", "layers", "heads", "inter", "vocab", "new_tokens", "seq",
                                          "batch", "lora_rank")},
            "total_parameters": bert_lib.count_parameters(spec), "timed_steps_per_mode": cfg["steps"],
            "loop": "dpbert.engine.build.build_training (TrainLoop + TimingHook)", "sets": rows}


def _worker(name: str, quick: bool, only: str = None) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dpbert  # noqa: F401
    import numpy as np
    from dpbert.config import ModelConfig
    from dpbert.network import bert as bert_lib

    def rss_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    cfg = dict(CONFIGS[name])
    if quick:
        cfg["steps"] = max(2, cfg["steps"] // 3)
    mc = ModelConfig(preset=cfg["preset"], max_seq_length=cfg["seq"], dropout=0.1)
    if only:  # memory run: one mode alone in this process, warm-up + 2 steps, then its peak RSS
        run_loop(mc, cfg["vocab"], cfg["batch"], cfg["accumulation"], cfg["warmup"] + 2, only)
        return {"mode": only, "peak_rss_mb": rss_mb()}
    times, clipping = {}, None
    for mode in ("nondp", "dp"):
        hook, training = run_loop(mc, cfg["vocab"], cfg["batch"], cfg["accumulation"], cfg["warmup"] + cfg["steps"],
                                  mode)
        times[mode] = _timed(hook, cfg["warmup"])
        clipping = training.stepper.clipping_path if mode == "dp" else clipping
    median = {mode: float(np.median(v)) for mode, v in times.items()}
    spec = bert_lib.spec_from_config(mc, cfg["vocab"])
    return {
        "params": bert_lib.count_parameters(spec), "hidden": spec.hidden_size, "layers": spec.num_layers,
        "vocab": spec.vocab_size, "seq_len": spec.max_seq_length, "batch": cfg["batch"],
        "accumulation": cfg["accumulation"], "micro_batch": cfg["batch"] // cfg["accumulation"],
        "timed_steps_per_mode": cfg["steps"], "clipping_path": clipping,
        "loop": "dpbert.engine.build.build_training (TrainLoop + TimingHook)",
        "nondp_step_seconds_median": median["nondp"], "dp_step_seconds_median": median["dp"],
        "nondp_step_seconds_all": times["nondp"], "dp_step_seconds_all": times["dp"],
        "ratio_dp_over_nondp": median["dp"] / median["nondp"],
        "ratio_of_minimums": min(times["dp"]) / min(times["nondp"]),
        "meets_target": median["dp"] / median["nondp"] <= 1.5, "peak_rss_mb": rss_mb(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="DP-SGD step time / non-DP step time")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["dp", "nondp"], help=argparse.SUPPRESS)
    parser.add_argument("--trainable-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-trainable", action="store_true",
                        help="leave out the per-trainable-set rows (training.trainable)")
    parser.add_argument("--trainable-only", action="store_true", help="only the per-trainable-set rows")
    parser.add_argument("--xla", action="store_true",
                        help="only eager vs XLA (training.jit_compile), DP and non-DP interleaved, demo and base")
    parser.add_argument("--interleaved-worker", choices=["demo"] + list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--jit", type=int, default=0, help="--large-batch: 1 = XLA (training.jit_compile)")
    parser.add_argument("--large-batch", action="store_true",
                        help="only the large-batch rows: [bias, head], patient unit, --patients per step")
    parser.add_argument("--patients", type=int, default=LARGE_BATCH["patients"])
    parser.add_argument("--micro-patients", type=int, default=LARGE_BATCH["micro_patients"],
                        help="patients per accumulation round (a divisor of --patients)")
    parser.add_argument("--steps", type=int, default=LARGE_BATCH["steps"], help="timed steps per process")
    parser.add_argument("--repeats", type=int, default=2, help="processes per checkout")
    parser.add_argument("--compare-root", default=None,
                        help="another checkout (e.g. a git worktree of an earlier commit), run alternately")
    parser.add_argument("--large-batch-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.large_batch_worker:
        print(json.dumps(_large_batch_worker(args.patients, args.micro_patients, args.steps, bool(args.jit))))
        return 0
    if args.interleaved_worker:
        print(json.dumps(_interleaved_worker(args.interleaved_worker, bool(args.jit), args.quick)))
        return 0
    if args.trainable_worker:
        print(json.dumps(_trainable_worker(args.quick)))
        return 0
    if args.worker:
        print(json.dumps(_worker(args.worker, args.quick, args.only)))
        return 0
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    report = {"benchmark": "dpsgd_step", "target_ratio": 1.5, "cpu_count": os.cpu_count(),
              "load_average_before": os.getloadavg(), "results": {}}
    def run(*extra):
        cmd = [sys.executable, __file__, "--worker"] + list(extra) + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
        if proc.returncode != 0:
            raise SystemExit(f"{extra} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    if args.large_batch:
        report["large_batch"] = _large_batch(args, env)
        report["load_average_after"] = os.getloadavg()
        print(json.dumps(report, indent=2))
        return 0
    if args.xla:
        report["eager_vs_xla"] = _xla_matrix(args.quick, env)
        report["load_average_after"] = os.getloadavg()
        print(json.dumps(report, indent=2))
        return 0
    for name in ([] if args.trainable_only else args.configs):
        result = run(name)
        # Peak memory of each mode ALONE (the interleaved process holds two optimizers).
        result["peak_rss_alone_mb"] = {mode: run(name, "--only", mode)["peak_rss_mb"] for mode in ("nondp", "dp")}
        report["results"][name] = result
    if not args.skip_trainable:
        cmd = [sys.executable, __file__, "--trainable-worker"] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
        if proc.returncode != 0:
            raise SystemExit(f"trainable rows failed:\n{proc.stderr[-4000:]}")
        report["trainable"] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
