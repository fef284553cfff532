"""Measure the noise DP-SGD really adds per update, through the real distributed train step.

``noise_check`` builds a tiny BERT, the configured strategy (P replicas: ``MirroredStrategy``
over P logical CPUs when P > 1) and the real ``DPSGDTrainStep`` with plain SGD at learning rate
1, and feeds it T micro-rounds per logical step whose every row has example mask 0: the loss
and so every clipped gradient is exactly zero, and the parameter change of one step is minus
the averaged noisy gradient, i.e. the noise alone. Over ``steps`` steps and all d coordinates
it estimates the per-coordinate std and compares it with the expected ``σ·C/B`` (B the logical
batch size).

Tolerance, from the sampling distribution of a sample std (not tuned): for m iid N(0, s²)
values the sample std ŝ has relative standard error ≈ 1/√(2m) (delta method:
Var(ŝ²) = 2s⁴/(m−1)). The check passes when |ŝ/s − 1| ≤ z/√(2m) with z = 4 (two-sided
false-failure probability ≈ 6e-5); the 95% confidence interval ŝ/(1 ± 1.96/√(2m)) is reported.
With m ≳ 10⁵ the tolerance is ~1%, while noise added once per shard would be √(P·T) times
larger (≥ 41% off for P·T = 2). It also checks the mean is 0 (|mean| ≤ z·ŝ/√m), that
consecutive steps' noise is uncorrelated (|ρ₁| ≤ z/√m) and that all replicas hold identical
weights after the steps.

CLI (its own process, so P logical CPUs can be configured before TensorFlow starts)::

    python -m dpbert.model.noise_check --replicas 2 --accumulation 1 4 --noise-multiplier 1.0 \
        --clip 0.01 --batch-size 16 --steps 30 [--json]

``run_noise_check_cli(args)`` serves ``dpbert privacy noise-check`` (P > 1 in a subprocess).

Across worker processes (``--workers W``, ``training.strategy: multi_worker``): ``launch_workers``
starts W processes of this module on loopback (free ports, one ``TF_CONFIG`` each, their own
sessions, all killed when one fails or the time limit passes), each builds
``MultiWorkerMirroredStrategy`` (R = W replicas) and runs the same zero-gradient steps. The
expected std is still σC/B (one draw per logical batch: ``dpbert.model.dpsgd``), not σC√W/B or
WσC/B; ``replicas_in_sync`` then compares a digest of every worker's parameters after the steps.
Positive controls: the broken placements are test fixtures (``tests/model/broken_mechanisms.py``)
that the test worker script ``tests/model/multi_worker_worker.py`` applies around
:func:`noise_check` in its own worker processes; they must FAIL the check.

Child processes (``--replicas P`` and ``--workers W``) are started by :func:`module_command`:
``sys.executable -c`` with a bootstrap that puts the folder holding THIS ``dpbert`` package first
on ``sys.path`` before it imports anything, never ``python -m`` (which puts the current folder
first: run from the folder that holds the clone, ``./dpbert`` — the clone, no ``__init__.py`` —
was imported as a namespace package instead of the installed one, and the workers failed).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from dpbert import exit_codes

Z_TOLERANCE = 4.0


def _ensure_devices(replicas: int):
    import tensorflow as tf
    from dpbert.model.train import configure_logical_cpus

    if replicas > 1 and len(tf.config.list_logical_devices("GPU")) < replicas:
        try:
            configure_logical_cpus(replicas)
        except RuntimeError:
            pass
        if len(tf.config.list_logical_devices("CPU")) < replicas:
            raise RuntimeError(
                f"noise_check with {replicas} replicas needs {replicas} devices; TensorFlow was "
                f"initialised with fewer. Run it in a fresh process: python -m dpbert.model.noise_check "
                f"--replicas {replicas}")


def noise_check(replicas: int, accumulation: int, noise_multiplier: float, clip: float,
                batch_size: int, steps: int = 30, seed: Optional[int] = None,
                noise_mode: str = "once", group_size: int = 1, strategy=None) -> Dict:
    """Run ``steps`` real DP-SGD steps with zero gradients and measure the update noise.

    Returns a dict with ``measured_std``, ``expected_std`` (= σ·C/B), ``paper_std`` (σ√(P·T)·C/B,
    what per-shard noise would give), ``ratio``, ``ci95``, ``tolerance``, ``passed`` and the
    auxiliary checks. ``seed=None``: OS entropy. ``group_size = k > 1``: patient mode (user-level
    DP-SGD): ``batch_size`` is B_patients, each round holds m patients × k slots per replica and
    the step clips per group of k; the expected std is still σ·C/B_patients. ``strategy``: a
    ready strategy (``MultiWorkerMirroredStrategy``: ``replicas`` is then R over all workers and
    each worker feeds its own replicas).
    """
    if strategy is None:
        _ensure_devices(replicas)
    import tensorflow as tf
    import tf_keras

    from dpbert.model import bert as bert_lib
    from dpbert.model import dpsgd, sampling
    from dpbert.model.train import make_mlm_functions, mirrored_strategy

    m_per = sampling.micro_batch_size(batch_size, replicas, accumulation)
    local = replicas
    spec = bert_lib.BertSpec(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                             intermediate_size=32, max_seq_length=8, max_predictions=2,
                             dropout=0.1, attention_dropout=0.1, preset="custom")
    if strategy is not None:
        local = len(strategy.extended.worker_devices) if dpsgd.worker_layout(strategy)[0] > 1 else replicas
    elif replicas > 1:
        strategy = mirrored_strategy(replicas)
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        models = bert_lib.build_bert(spec, seed=0 if seed is None else seed)
        optimizer = tf_keras.optimizers.SGD(learning_rate=1.0)
    config = dpsgd.DPSGDConfig(clip_norm=clip, noise_multiplier=noise_multiplier,
                               expected_batch_size=float(batch_size), noise_mode=noise_mode,
                               noise_seed=seed, replicas=replicas, accumulation_steps=accumulation,
                               group_size=group_size)
    specials = [0, 1, 2, 3, 4]
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, specials, 4, 0.15)
    stepper = dpsgd.DPSGDTrainStep(models.mlm, optimizer, config, prepare_fn=prepare_fn, loss_fn=loss_fn,
                                   metrics_fn=metrics_fn, strategy=strategy)
    rng = np.random.default_rng(seed)
    # Real tokens, every row masked out of the loss: the gradient is exactly zero.
    from dpbert.model.masking import example_keys

    def masked_round():
        ids = rng.integers(5, spec.vocab_size, (local * m_per * group_size, spec.max_seq_length)).astype(np.int32)
        features = mask_fn(ids, example_keys(0, 0, np.arange(ids.shape[0])))
        return {k: v.reshape((local, m_per * group_size) + v.shape[1:]) for k, v in features.items()}

    rounds = [{"features": masked_round(), "example_mask": np.zeros((local, m_per * group_size), np.float32)}
              for _ in range(accumulation)]

    def snapshot() -> np.ndarray:
        return np.concatenate([v.numpy().ravel() for v in stepper.variables]).astype(np.float64)

    updates: List[np.ndarray] = []
    before = snapshot()
    examples = 0.0
    for _ in range(steps):
        stats = stepper.run_step(rounds)
        examples += stats["examples"]
        after = snapshot()
        updates.append(before - after)  # lr = 1: θ ← θ − ĝ
        before = after
    noise = np.stack(updates)  # [steps, d]
    m = noise.size
    measured = float(noise.std(ddof=1))
    expected = noise_multiplier * clip / batch_size
    paper = noise_multiplier * math.sqrt(replicas * accumulation) * clip / batch_size
    target = config.noise_std
    rel_se = 1.0 / math.sqrt(2 * m)
    tolerance = Z_TOLERANCE * rel_se
    mean = float(noise.mean())
    lag1 = float(np.corrcoef(noise[:-1].ravel(), noise[1:].ravel())[0, 1]) if steps > 1 else 0.0
    in_sync = True
    if replicas > local:  # other workers hold the other replicas: compared by launch_workers' caller
        pass
    elif replicas > 1:
        for v in stepper.variables:
            values = [x.numpy() for x in v.values]
            in_sync &= all(np.array_equal(values[0], x) for x in values[1:])
    checks = {
        "std": abs(measured / target - 1) <= tolerance,
        "mean": abs(mean) <= Z_TOLERANCE * measured / math.sqrt(m),
        "independent_steps": abs(lag1) <= Z_TOLERANCE / math.sqrt(noise[1:].size) if steps > 1 else True,
        "replicas_in_sync": bool(in_sync),
        "zero_gradient": examples == 0.0,
    }
    return {
        "replicas": replicas, "accumulation": accumulation, "noise_multiplier": noise_multiplier,
        "clip": clip, "batch_size": batch_size, "steps": steps, "noise_mode": noise_mode, "group_size": group_size,
        "strategy": dpsgd.strategy_name(strategy), "workers": dpsgd.worker_layout(strategy)[0],
        # A digest of this process's parameters after the steps (workers must agree exactly).
        "parameter_digest": hashlib.sha256(b"".join(np.ascontiguousarray(v.numpy()).tobytes()
                                                    for v in stepper.variables)).hexdigest(),
        "coordinates": int(noise.shape[1]), "samples": int(m),
        "measured_std": measured, "expected_std": expected, "paper_std": paper, "target_std": target,
        "ratio": measured / target,
        "ci95": [measured / (1 + 1.96 * rel_se), measured / (1 - 1.96 * rel_se)],
        "relative_standard_error": rel_se, "tolerance": tolerance, "mean": mean, "lag1_correlation": lag1,
        "checks": checks, "passed": all(checks.values()),
    }


# --------------------------------------------------------------------------- worker processes
#: Default wall-clock limit of a multi-worker check (start-up ≈ 5–10 s per worker on a loaded CPU).
WORKER_TIMEOUT_S = 300.0


def free_ports(count: int) -> List[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def tf_config(ports: Sequence[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of a loopback cluster (worker 0 is the chief)."""
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": int(index)}})


def module_command(module: str, *args: str) -> List[str]:
    """The command line that runs ``module`` as ``__main__`` (like ``python -m``) in a child
    process whose ``sys.path[0]`` is the folder holding the ``dpbert`` package THIS process
    imported, whatever the current folder holds (module docstring)."""
    import dpbert

    root = os.path.dirname(os.path.dirname(os.path.abspath(dpbert.__file__)))
    bootstrap = ("import runpy, sys; sys.path[0] = sys.argv[1]; sys.argv = [sys.argv[2]] + sys.argv[3:]; "
                 "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", bootstrap, root, module, *map(str, args)]


def launch_workers(command: Sequence[str], workers: int, timeout: float = WORKER_TIMEOUT_S,
                   env: Optional[Dict[str, str]] = None) -> List[str]:
    """Run ``command`` as ``workers`` processes of one loopback ``MultiWorkerMirroredStrategy``
    cluster (free ports; ``TF_CONFIG`` per process) and return each one's stdout, in rank order.

    Bounded: every process runs in its own session; when one exits non-zero the others (which
    would wait in a collective forever) are killed, and so is every process still running after
    ``timeout`` seconds. Raises ``RuntimeError`` (with the failing worker's stderr tail) or
    ``TimeoutError``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    ports = free_ports(workers)
    base = dict(os.environ if env is None else env, TF_USE_LEGACY_KERAS="1")
    tmp = tempfile.mkdtemp(prefix="dpbert-workers-")
    procs, outs, errs = [], [], []
    try:
        for i in range(workers):
            outs.append(open(os.path.join(tmp, f"{i}.out"), "w+"))
            errs.append(open(os.path.join(tmp, f"{i}.err"), "w+"))
            procs.append(subprocess.Popen(list(command), stdout=outs[i], stderr=errs[i], start_new_session=True,
                                          env=dict(base, TF_CONFIG=tf_config(ports, i))))
        deadline = time.monotonic() + float(timeout)
        failed = None
        while any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        timed_out = failed is None and any(p.poll() is None for p in procs)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        texts = []
        for f in outs + errs:
            f.seek(0)
            texts.append(f.read())
        if timed_out:
            raise TimeoutError(f"{workers} worker processes did not finish within {timeout:g} s (killed)")
        if failed is not None:
            raise RuntimeError(f"worker {failed} of {workers} exited with {procs[failed].returncode}:\n"
                               f"{texts[workers + failed][-3000:]}")
        return texts[:workers]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in outs + errs:
            f.close()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def multi_worker_noise_check(workers: int, accumulations: Sequence[int], noise_multiplier: float, clip: float,
                             batch_size: int, steps: int, seed: Optional[int] = None, noise_mode: str = "once",
                             timeout: float = WORKER_TIMEOUT_S) -> List[Dict]:
    """The noise check on ``workers`` loopback worker processes (module docstring). Returns one
    result per T."""
    cmd = module_command("dpbert.model.noise_check", "--as-worker", "--replicas", workers,
                         "--accumulation", *accumulations, "--noise-multiplier", noise_multiplier,
                         "--clip", clip, "--batch-size", batch_size, "--steps", steps,
                         "--noise-mode", noise_mode, "--json", *(["--seed", seed] if seed is not None else []))
    outputs = [json.loads(out.strip().splitlines()[-1]) for out in launch_workers(cmd, workers, timeout)]
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
    from dpbert.model.train import make_strategy

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
        from dpbert.model.train import configure_logical_cpus
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
        except (RuntimeError, TimeoutError) as err:
            sys.stderr.write(f"noise-check --workers {workers}: {err}\n")
            return exit_codes.ENVIRONMENT
    elif args.replicas > 1:
        cmd = module_command("dpbert.model.noise_check", "--replicas", args.replicas, "--accumulation",
                             *accumulations, "--noise-multiplier", args.noise_multiplier, "--clip", args.clip,
                             "--batch-size", args.batch_size, "--steps", args.steps, "--noise-mode", mode,
                             "--json", *(["--seed", seed] if seed is not None else []))
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)  # launch_workers only
    args = parser.parse_args(argv)
    if args.as_worker:  # one process of a loopback cluster (TF_CONFIG set by launch_workers)
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
