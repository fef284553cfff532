"""Measure the noise DP-SGD really adds per update, on the SHIPPED training loop.

``noise_check`` builds the loop ``dpbert run`` trains with (``dpbert.engine.build.
build_training``: plan, Poisson sampler, keyed masks, packing, the real ``DPSGDTrainStep``, step
log, run-time integrity checks, ``TrainLoop`` with its hooks) on a tiny BERT and a synthetic,
public data set of random token rows (n = ``UNITS_PER_BATCH``·B units, q = B/n), in a throw-away
``ram://`` chain, with the configured strategy (P replicas: ``MirroredStrategy`` over P logical
CPUs when P > 1; or a ready ``MultiWorkerMirroredStrategy``), and runs ``steps`` steps.

What it measures is what the run-time noise check (``dpbert.mechanism.integrity``, check 3) reads on
every step: on EVERY coordinate of every trained variable (``noise_probe_coordinates`` covers
them all), the clean clipped sum S and the gradient HANDED TO THE OPTIMIZER G, so the noise the
update carried is G − S/B, per coordinate, wherever and however it was added. The pooled
statistics of that check (Σz², Σz, lag-1 products of z = (B·G − S)/(σC)) give the measured std
ŝ = σC/B·√(Σz²/m) over m = steps × d values, compared with the expected ``σ·C/B`` (B the
logical batch size, σ the gradient's effective noise multiplier). The gradients are real (rows
with masked tokens), not zero: S is subtracted, so the check holds on a step that trains.

The tolerance (z = 4 on the sample std's relative error 1/√(2m), from its sampling
distribution, not tuned) and the other statistics: docs/audits.md, "The noise-std test".

CLI (its own process, so P logical CPUs can be configured before TensorFlow starts)::

    python -m dpbert.diagnostics.noise_check --replicas 2 --accumulation 1 4 --noise-multiplier 1.0 \
        --clip 0.01 --batch-size 16 --steps 30 [--json]

``run_noise_check_cli(args)`` serves ``dpbert privacy noise-check`` (P > 1 in a subprocess).

Across worker processes (``--workers W``, ``training.strategy: multi_worker``):
``multi_worker_noise_check`` starts W processes of this module on loopback with
``dpbert.launch.LocalWorkersLauncher`` (the one supervisor: free ports, one ``TF_CONFIG`` each,
their own sessions, all stopped when one fails or the time limit passes), each builds
``MultiWorkerMirroredStrategy`` (R = W replicas) and runs the same loop on its shard of the units.
The expected std is still σC/B (one draw per logical batch: ``dpbert.mechanism.gaussian``), not σC√W/B
or WσC/B; ``replicas_in_sync`` then compares a digest of every worker's parameters after the steps.
Positive controls: the broken placements are test fixtures (``tests/model/broken_mechanisms.py``)
that the test worker script ``tests/model/multi_worker_worker.py`` applies around
:func:`noise_check` in its own worker processes; they must FAIL the check. Child processes run
this checkout's module from any folder (``dpbert.launch.cluster.module_command``).
"""
from __future__ import annotations

import argparse
import json
import math
import secrets
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from dpbert import exit_codes

Z_TOLERANCE = 4.0
#: The synthetic data set holds this many units per expected batch (q = 1/UNITS_PER_BATCH).
UNITS_PER_BATCH = 8
#: Probe coordinates per trained piece: more than any piece of the check's model has, i.e. all.
ALL_COORDINATES = 2 ** 31 - 1
VOCAB_SIZE, SPECIALS, MASK_ID = 40, (0, 1, 2, 3, 4), 4


def _ensure_devices(replicas: int):
    import tensorflow as tf
    from dpbert.engine.train import configure_logical_cpus

    if replicas > 1 and len(tf.config.list_logical_devices("GPU")) < replicas:
        try:
            configure_logical_cpus(replicas)
        except RuntimeError:
            pass
        if len(tf.config.list_logical_devices("CPU")) < replicas:
            raise RuntimeError(
                f"noise_check with {replicas} replicas needs {replicas} devices; TensorFlow was "
                f"initialised with fewer. Run it in a fresh process: python -m dpbert.diagnostics.noise_check "
                f"--replicas {replicas}")


def _configs(replicas: int, accumulation: int, noise_multiplier: float, clip: float, batch_size: int, steps: int,
             seed: Optional[int], strategy_name: str):
    """(ModelConfig, TrainingConfig) of the check: a tiny BERT, no DP diagnostics (nothing else
    is released), the brute-force clipping check off (it is not what is measured), one checkpoint."""
    from dpbert.config import ModelConfig, TrainingConfig

    model = ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_seq_length=8, dropout=0.1)
    training = TrainingConfig(batch_size=batch_size, noise_multiplier=noise_multiplier, clip_norm=clip, steps=steps,
                              accumulation_steps=accumulation, replicas=replicas, strategy=strategy_name,
                              sampling="poisson", dp_diagnostics=False, warmup_steps=0,
                              checkpoint_every=steps + 1, integrity_check_every=0,
                              seed=0 if seed is None else int(seed), noise_seed=seed)
    return model, training


def _data(batch_size: int, group_size: int, length: int, seed: Optional[int]):
    """(token rows, patient keys or None, units): public random rows, ``group_size`` per patient,
    the same in every worker process (a public seed: the rows are not what is tested)."""
    units = UNITS_PER_BATCH * int(batch_size)
    rng = np.random.default_rng(0 if seed is None else seed)
    ids = rng.integers(len(SPECIALS), VOCAB_SIZE, (units * group_size, length)).astype(np.int32)
    keys = [f"noise-check-patient-{i // group_size}" for i in range(ids.shape[0])] if group_size > 1 else None
    return ids, keys, units


class NoiseProbeHook:
    """A loop hook (``dpbert.engine.hooks.Hook``'s methods; not a subclass, so importing
    this module starts no TensorFlow): per step, that the run-time noise check took the whole probe
    of this step (its value count grew by the probe's size)."""

    def __init__(self):
        self.steps, self.measured_every_step = 0, True

    def on_start(self, loop):
        if loop.checks.noise is None:
            raise RuntimeError("the loop has no run-time noise check (no noise probe)")
        self.count, self.size = loop.checks.noise.count, int(loop.stepper.noise_probe.size)

    def on_step(self, loop, step, rounds, stats, sampled):
        self.steps += 1
        count = loop.checks.noise.count
        self.measured_every_step &= count == self.count + self.size
        self.count = count

    def on_end(self, loop):
        pass

    def close(self, loop):
        pass


def _statistics(noise, target: float, steps: int) -> Dict:
    """The measured std, its tolerance and the auxiliary tests from the run-time noise check's
    pooled statistics (``integrity.NoiseCheck``; module docstring); ``target``: σ_eff·C/B."""
    pooled = noise.result()
    if not pooled["ran"]:
        raise RuntimeError(f"the run-time noise check measured nothing ({pooled['reason']})")
    m, pairs = int(pooled["values"]), int(pooled["pairs"])
    ratio, mean_z = float(pooled["std_ratio"]), float(pooled["mean_z"])  # mean_z ~ N(0, 1) under the claim
    lag1 = float(pooled["lag1"]) if pairs else 0.0
    rel_se = 1.0 / math.sqrt(2 * m)
    measured = ratio * target
    return {
        "samples": m, "measured_std": measured, "ratio": ratio,
        "ci95": [measured / (1 + 1.96 * rel_se), measured / (1 - 1.96 * rel_se)],
        "relative_standard_error": rel_se, "tolerance": Z_TOLERANCE * rel_se,
        "mean": mean_z / math.sqrt(m) * target, "lag1_correlation": lag1,
        "checks": {
            "std": abs(ratio - 1) <= Z_TOLERANCE * rel_se,
            "mean": abs(mean_z) <= Z_TOLERANCE * ratio,
            "independent_steps": abs(lag1) <= Z_TOLERANCE / math.sqrt(pairs) if pairs else steps < 2,
        },
    }


def _in_sync(stepper) -> bool:
    """This process's replicas hold identical weights (other workers: ``combine_workers``)."""
    if stepper.workers > 1 or stepper.replicas == 1:
        return True
    return all(all(np.array_equal(v.values[0].numpy(), x.numpy()) for x in v.values[1:]) for v in stepper.variables)


def _run_loop(tc, model, ids, keys, units: int, group_size: int, noise_mode: str, strategy):
    """Build the shipped loop on a throw-away ``ram://`` chain and run it; (result fields, hook)."""
    from dpbert import storage
    from dpbert.mechanism.replicas import strategy_name
    from dpbert.engine.build import (ChainOutputs, ModelStart, NoiseSpec, RunHooks, TrainingRows,
                                           build_training, digest)
    from dpbert.mechanism.integrity import IntegrityCheckFailed
    from dpbert.privacy.plan import plan_training

    plan = plan_training(tc, units, unit="patient" if group_size > 1 else "tuple", max_contributions=group_size)
    probe = NoiseProbeHook()
    output_dir = f"ram://dpbert-noise-check/{secrets.token_hex(8)}"
    try:
        with build_training(TrainingRows(ids, list(SPECIALS), MASK_ID, patient_keys=keys),
                            ModelStart(model, VOCAB_SIZE), tc,
                            ChainOutputs(output_dir, resume=False, export_saved_model=False, progress=False), plan,
                            NoiseSpec(noise_mode, probe_coordinates=ALL_COORDINATES), RunHooks([probe]),
                            strategy) as training:
            failure = None
            try:
                training.loop.run()
            except IntegrityCheckFailed as err:  # the statistics below still say what was measured
                failure = str(err)
            stepper = training.stepper
            out = _statistics(training.checks.noise, stepper.config.noise_std, probe.steps)
            out.update(strategy=strategy_name(training.strategy), workers=stepper.workers,
                       # A digest of this process's parameters after the steps (workers must agree exactly).
                       parameter_digest=digest(v.numpy() for v in stepper.variables),
                       coordinates=probe.size, target_std=stepper.config.noise_std, in_sync=_in_sync(stepper),
                       loop=f"{type(training.loop).__module__}.{type(training.loop).__name__} (build_training)",
                       integrity_checks={name: r.get("passed") for name, r in training.checks.results().items()},
                       integrity_failure=failure)
    finally:
        store = storage.storage_for(output_dir)
        if store.exists(output_dir):
            store.rmtree(output_dir)
    return out, probe


def noise_check(replicas: int, accumulation: int, noise_multiplier: float, clip: float,
                batch_size: int, steps: int = 30, seed: Optional[int] = None,
                noise_mode: str = "once", group_size: int = 1, strategy=None) -> Dict:
    """Run ``steps`` steps of the shipped DP-SGD loop and measure the update's noise (module docstring).

    Returns a dict with ``measured_std``, ``expected_std`` (= σ·C/B), ``paper_std`` (σ√(P·T)·C/B,
    what per-shard noise would give), ``ratio``, ``ci95``, ``tolerance``, ``passed`` and the
    auxiliary checks. ``seed=None``: OS entropy (noise, sampler, masks; the public rows: seed 0).
    ``group_size = k > 1``: patient mode (user-level DP-SGD): ``batch_size`` is B_patients, each
    patient has k rows and the step clips per patient; the expected std is still σ·C/B_patients.
    ``strategy``: a ready strategy (``MultiWorkerMirroredStrategy``: ``replicas`` is then R over all
    workers and each worker trains on its own units).
    """
    if strategy is None:
        _ensure_devices(replicas)
    from dpbert.mechanism.replicas import worker_layout

    workers = worker_layout(strategy)[0] if strategy is not None else 1
    name = "multi_worker" if workers > 1 else ("mirrored" if replicas > 1 else "default")
    model, tc = _configs(replicas, accumulation, noise_multiplier, clip, batch_size, steps, seed, name)
    ids, keys, units = _data(batch_size, group_size, model.max_seq_length, seed)
    out, probe = _run_loop(tc, model, ids, keys, units, group_size, noise_mode, strategy)
    checks = dict(out.pop("checks"), replicas_in_sync=bool(out.pop("in_sync")),
                  # every planned step ran and its whole update was measured
                  every_step_measured=probe.steps == steps and probe.measured_every_step)
    return dict(
        replicas=replicas, accumulation=accumulation, noise_multiplier=noise_multiplier, clip=clip,
        batch_size=batch_size, steps=steps, noise_mode=noise_mode, group_size=group_size,
        expected_std=noise_multiplier * clip / batch_size,
        paper_std=noise_multiplier * math.sqrt(replicas * accumulation) * clip / batch_size,
        **out, checks=checks, passed=all(checks.values()))


# --------------------------------------------------------------------------- worker processes
#: Default wall-clock limit of a multi-worker check (start-up ≈ 5–10 s per worker on a loaded CPU).
WORKER_TIMEOUT_S = 300.0


def launch_workers(command: Sequence[str], workers: int, timeout: float = WORKER_TIMEOUT_S,
                   env: Optional[Dict[str, str]] = None) -> List[str]:
    """Run ``command`` as ``workers`` processes of one loopback ``MultiWorkerMirroredStrategy``
    cluster and return each one's stdout, in rank order (``dpbert.launch.LocalWorkersLauncher``:
    every process in its own session, all stopped when one exits non-zero or after ``timeout``
    seconds). Raises ``dpbert.launch.WorkerFailed`` (a RuntimeError, with the failing worker's
    stderr tail)."""
    from dpbert.launch import LocalWorkersLauncher

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return LocalWorkersLauncher(timeout=timeout, capture_stdout=True, env=env).run(command, workers)


def multi_worker_noise_check(workers: int, accumulations: Sequence[int], noise_multiplier: float, clip: float,
                             batch_size: int, steps: int, seed: Optional[int] = None, noise_mode: str = "once",
                             timeout: float = WORKER_TIMEOUT_S) -> List[Dict]:
    """The noise check on ``workers`` loopback worker processes (module docstring). Returns one
    result per T."""
    from dpbert.launch import Job, LocalWorkersLauncher

    args = ("--as-worker", "--replicas", workers, "--accumulation", *accumulations, "--noise-multiplier",
            noise_multiplier, "--clip", clip, "--batch-size", batch_size, "--steps", steps, "--noise-mode", noise_mode,
            "--json", *(["--seed", seed] if seed is not None else []))
    launcher = LocalWorkersLauncher(timeout=timeout, capture_stdout=True)
    stdout = launcher.launch(Job("dpbert.diagnostics.noise_check", tuple(map(str, args)), workers))
    outputs = [json.loads(out.strip().splitlines()[-1]) for out in stdout]
    return [combine_workers([out[t_index] for out in outputs]) for t_index in range(len(accumulations))]


def combine_workers(per_worker: List[Dict]) -> Dict:
    """The chief's result, with ``replicas_in_sync`` decided over every worker's parameters."""
    result = dict(per_worker[0])
    digests = {r["parameter_digest"] for r in per_worker}
    result["checks"] = dict(result["checks"], replicas_in_sync=len(digests) == 1)
    result["workers_in_sync"] = len(digests) == 1
    result["passed"] = all(result["checks"].values())
    return result


def _as_worker(args) -> List[Dict]:
    """One worker process of ``multi_worker_noise_check``: the strategy first (before any op)."""
    import dpbert  # noqa: F401  (sets TF_USE_LEGACY_KERAS)
    from dpbert.engine.train import make_strategy

    strategy = make_strategy("multi_worker", args.replicas)
    return [noise_check(args.replicas, t, args.noise_multiplier, args.clip, args.batch_size, steps=args.steps,
                        seed=args.seed, noise_mode=args.noise_mode, strategy=strategy)
            for t in args.accumulation]


def _format(result: Dict) -> str:
    lo, hi = result["ci95"]
    return (f"noise check P={result['replicas']} T={result['accumulation']} ({result['strategy']}, "
            f"{result['noise_mode']}): measured std {result['measured_std']:.6g} "
            f"[95% CI {lo:.6g}, {hi:.6g}] vs expected σC/B = {result['expected_std']:.6g} "
            f"(ratio {result['ratio']:.4f}, tolerance ±{result['tolerance']:.4f}; per-shard noise would give "
            f"{result['paper_std']:.6g}) over {result['samples']} values: "
            f"{'PASS' if result['passed'] else 'FAIL ' + str(result['checks'])}")


def _run(replicas: int, accumulations: List[int], noise_multiplier: float, clip: float, batch_size: int,
         steps: int, seed: Optional[int], noise_mode: str) -> List[Dict]:
    if replicas > 1:  # before TensorFlow initialises its devices
        import dpbert  # noqa: F401  (sets TF_USE_LEGACY_KERAS)
        from dpbert.engine.train import configure_logical_cpus
        configure_logical_cpus(replicas)
    return [noise_check(replicas, t, noise_multiplier, clip, batch_size, steps=steps, seed=seed,
                        noise_mode=noise_mode) for t in accumulations]


def run_noise_check_cli(args) -> int:
    """Entry point for ``dpbert privacy noise-check`` (an argparse namespace with ``replicas``,
    ``accumulation`` (int or list), ``noise_multiplier``, ``clip``, ``batch_size``, ``steps``,
    optionally ``seed``, ``noise_mode``, ``json``). With P > 1 the check runs in a fresh process
    (``module_command``) so P logical CPUs can be configured before TensorFlow starts. Prints the result(s); returns 0 if every check passed, else 1."""
    import os
    import subprocess

    accumulations = args.accumulation if isinstance(args.accumulation, (list, tuple)) else [args.accumulation]
    seed = getattr(args, "seed", None)
    mode = getattr(args, "noise_mode", "once")
    workers = getattr(args, "workers", None)
    workers = 1 if workers is None else int(workers)
    if workers < 1:
        sys.stderr.write(f"--workers must be >= 1, got {workers}\n")
        return exit_codes.BAD_INPUT
    if workers > 1:
        if args.replicas not in (1, workers):
            sys.stderr.write(f"--workers {workers}: one replica per worker process (--replicas {args.replicas} "
                             f"is not supported with --workers)\n")
            return exit_codes.BAD_INPUT
        try:
            results = multi_worker_noise_check(workers, accumulations, args.noise_multiplier, args.clip,
                                               args.batch_size, args.steps, seed, mode,
                                               timeout=float(getattr(args, "timeout", None) or WORKER_TIMEOUT_S))
        except RuntimeError as err:  # dpbert.launch.WorkerFailed: a worker failed, or the time limit passed
            sys.stderr.write(f"noise-check --workers {workers}: {err}\n")
            return exit_codes.ENVIRONMENT
    elif args.replicas > 1:
        from dpbert.launch.cluster import module_command
        from dpbert.launch.supervisor import dying_with_parent

        cmd = module_command("dpbert.diagnostics.noise_check", "--replicas", args.replicas, "--accumulation",
                             *accumulations, "--noise-multiplier", args.noise_multiplier, "--clip", args.clip,
                             "--batch-size", args.batch_size, "--steps", args.steps, "--noise-mode", mode,
                             "--json", *(["--seed", seed] if seed is not None else []))
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1")
        proc = subprocess.run(dying_with_parent(cmd, env), capture_output=True, text=True, env=env)
        if not proc.stdout.strip():
            sys.stderr.write(proc.stderr[-4000:])
            return 2
        results = json.loads(proc.stdout)
        results = results if isinstance(results, list) else [results]
    else:
        results = _run(1, accumulations, args.noise_multiplier, args.clip, args.batch_size, args.steps, seed, mode)
    if getattr(args, "json", False):
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    else:
        for result in results:
            print(_format(result))
    return 0 if all(r["passed"] for r in results) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--accumulation", type=int, nargs="+", default=[1])
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--clip", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--noise-mode", default="once", choices=["once", "paper"])
    parser.add_argument("--json", action="store_true", help="JSON output (default: one line per check)")
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)  # multi_worker_noise_check only
    args = parser.parse_args(argv)
    if args.as_worker:  # one process of a loopback cluster (TF_CONFIG set by its launcher)
        print(json.dumps(_as_worker(args)))
        return 0
    results = _run(args.replicas, args.accumulation, args.noise_multiplier, args.clip, args.batch_size,
                   args.steps, args.seed, args.noise_mode)
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    else:
        for result in results:
            print(_format(result))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
