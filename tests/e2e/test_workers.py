"""``training.workers`` in the DAG (dpbert/trainer_workers.py): ``dpbert run`` starts the trainer's W
worker processes on loopback and supervises them.

1. ``--set training.workers=2``: exit 0, the ε of the one-worker plan (the mechanism is the same:
   q, steps and σ do not depend on the layout; tests/model/test_multi_worker.py shows the released
   parameters are those of one process), the report and the dashboard say 2 workers.
   The run's stderr is as quiet as one process's: none of TensorFlow's per-run worker lines
   (``tests/launch/test_supervisor.py`` shows the same check catches them on an unfiltered stream).
2. A worker SIGKILLed mid-run: the run exits non-zero within a bounded time (no collective
   timeout: the supervisor stops the others at once), one line names the worker and the steps
   the step log charged; the step log holds every executed step; the re-run resumes from the
   last checkpoint and charges every executed step: ε = the plan's ε for the steps executed.
3. The non-private baseline on two workers trains as in one process: the same loss at every
   step (the test-only PRF sampler gives both layouts the same batches), the same parameters on
   both workers, a finite final loss below the first.

``python -m tests.e2e.test_workers OUT W``: the baseline run of 3 as one of W processes.
"""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch.test_supervisor import noise_found
from tests.tiny import set_args

# xdist_group: clusters of worker processes never run side by side in one session (loopback ports
# picked free by two clusters at once could collide; a collision hangs the first collective).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("multi_worker")]

REPO = Path(__file__).resolve().parents[2]
BASE = ["corpus.synthetic.patients=6", "vocab.sigma=2", "vocab.size=300", "training.batch_size=8",
        "model.max_seq_length=64", "privacy.epsilon_budget=null", "canary.enabled=false", "ner.enabled=false",
        "training.train_non_private_baseline=false", "membership.holdout_patient_fraction=0",
        "beam.direct_running_mode=in_memory", "audit.enabled=false", "training.workers=2"]


def _env():
    return dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")


def _run_args(out, overrides):
    return [sys.executable, "-m", "dpbert_cli", "run", "--output", str(out), *set_args(BASE + list(overrides))]


def _config(overrides):
    from dpbert.config import load_config

    return load_config(None, [o for o in set_args(BASE + list(overrides)) if o != "--set"], preset="demo")


def _report(out):
    result = subprocess.run([sys.executable, "-m", "dpbert_cli", "report", "--output", str(out), "--json"],
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def _chain(out):
    from dpbert.engine.chain import chains

    found = chains(str(out / "pipeline_root"))
    assert len(found) == 1, found
    return found[0]


def test_two_workers_train_the_dag_with_one_workers_epsilon(tmp_path):
    import dataclasses

    from dashboard.views import pretraining_rows
    from pipeline import guard

    overrides = ["training.steps=4", "training.checkpoint_every=2"]
    out = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run(_run_args(out, overrides), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                            timeout=900)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-4000:]
    assert noise_found(result.stderr) == [], result.stderr[-4000:]
    report = _report(out)
    assert report["pretraining"]["workers"] == 2 and report["pretraining"]["steps"] == 4
    assert {"label": "worker processes", "value": "2"} in pretraining_rows(report)
    config = _config(overrides)
    one = dataclasses.replace(config, training=dataclasses.replace(config.training, workers=1))
    planned = guard.planned(one)
    assert report["privacy"]["epsilon_train"] == pytest.approx(planned["epsilon_train"], rel=1e-9)
    print(f"dpbert run with training.workers=2: {seconds:.0f} s")


def _worker_pid(parent: int, rank: int):
    """The process of ``rank`` among ``parent``'s children running dpbert.trainer_workers (by its TF_CONFIG)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid != parent or b"dpbert.trainer_workers" not in cmdline:
            continue
        config = next((e[len(b"TF_CONFIG="):] for e in environ if e.startswith(b"TF_CONFIG=")), None)
        if config and json.loads(config)["task"]["index"] == rank:
            return int(entry.name)
    return None


def _step_log_count(out):
    from dpbert.engine.chain import chains

    found = chains(str(out / "pipeline_root"))
    return found[0]["steps_executed"] if found else 0


def test_a_killed_worker_fails_the_run_fast_and_the_rerun_charges_every_executed_step(tmp_path):
    from dpbert.accounting import accountant

    overrides = ["training.steps=12", "training.checkpoint_every=4"]
    out = tmp_path / "run"
    proc = subprocess.Popen(_run_args(out, overrides), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while _step_log_count(out) < 6:
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 6"
            time.sleep(0.2)
        victim = _worker_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=300)
        stopped_after = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert stopped_after < 60, stopped_after  # bounded by the supervisor, not by a collective timeout
    chain = _chain(out)
    executed, checkpoint = chain["steps_executed"], chain["checkpoint_step"]
    line = next(line for line in stderr.splitlines() if "worker 1 of 2 killed by SIGKILL" in line)
    assert f"the step log charged {executed} step(s)" in line
    assert 6 <= executed < 12 and checkpoint <= executed  # every step started is in the write-ahead log

    try:  # bounded below pytest's timeout, so a hang shows the re-run's own output
        rerun = subprocess.run(_run_args(out, overrides), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                               timeout=400)
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else str(err.stderr)
        raise AssertionError(f"the re-run did not finish in 400 s:\n{stderr[-4000:]}") from None
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    total = executed + 12 - checkpoint  # the lost steps after the checkpoint ran again, and are charged again
    assert _chain(out)["steps_executed"] == total
    report = _report(out)
    assert report["pretraining"]["steps"] == total and report["privacy"]["steps"] == total
    model_dir = next(p for p in (out / "pipeline_root" / "MLMPretrainer" / "model").iterdir()
                     if (p / "dp_events.json").exists())
    record = json.loads((model_dir / "dp_events.json").read_text())[0]
    expected = accountant.dpsgd_epsilon(record["noise_multiplier"], record["sampling_probability"], total,
                                        report["privacy"]["delta_train"])
    assert report["privacy"]["epsilon_train"] == pytest.approx(expected, rel=1e-9)
    print(f"killed at step log {executed} (checkpoint {checkpoint}); stopped {stopped_after:.1f} s after the kill:\n{line}")


# --------------------------------------------------------------------------- the non-private baseline
def tiny_baseline(out_dir: str, workers: int) -> dict:
    """A tiny non-private run in this process: alone (``workers`` 1) or as one worker of a loopback
    cluster. The PRF test sampler (``tests/model/prf_sampling.py``, keyed by the noise seed) gives
    every layout the same batches; the masks are keyed by the example ids."""
    import numpy as np

    from dpbert.engine.train import make_strategy

    strategy = make_strategy("multi_worker", workers) if workers > 1 else None  # before any op
    from dpbert.config import ModelConfig, TrainingConfig
    from tests.model.conftest import SPECIALS, repetitive_corpus
    from tests.model.prf_sampling import prf_sampler, train_with

    tc = TrainingConfig(batch_size=8, steps=12, replicas=workers, accumulation_steps=4 // workers,
                        strategy="multi_worker" if workers > 1 else "default", non_private=True, noise_seed=11,
                        checkpoint_every=1000, warmup_steps=1, integrity_check_every=0)
    result = train_with(token_ids=repetitive_corpus(n=60), special_token_ids=SPECIALS, vocab_size=40,
                        model_config=ModelConfig(preset="tiny", num_layers=1, max_seq_length=16, dropout=0.0),
                        training_config=tc, output_dir=out_dir, progress=False, export_saved_model=False,
                        sampler_factory=prf_sampler(5), example_ids=np.arange(60) * 7 + 3, strategy=strategy)
    return {"loss": result.released_diagnostics["loss"], "batch_size": result.released_diagnostics["batch_size"],
            "digest": result.to_dict()["parameter_digest"]}


def _baseline_runs(out, workers: int):
    from dpbert.launch import Job, LocalWorkersLauncher

    launcher = LocalWorkersLauncher(capture_stdout=True, timeout=400, env=_env())
    stdout = launcher.launch(Job("tests.e2e.test_workers", (str(out), str(workers)), workers))
    return [json.loads(text.strip().splitlines()[-1]) for text in stdout]


def test_the_non_private_baseline_trains_on_two_workers_as_in_one_process(tmp_path):
    from dpbert.privacy.diagnostics import window
    from dpbert.stages.pretrain import _head_mean, _tail_mean

    (one,), two = _baseline_runs(tmp_path / "one", 1), _baseline_runs(tmp_path / "two", 2)
    assert two[0]["digest"] == two[1]["digest"], "the workers' parameters differ"
    assert two[0]["batch_size"] == one["batch_size"] and min(one["batch_size"]) > 0  # the same batches, none empty
    assert two[0]["loss"][0] == pytest.approx(one["loss"][0], rel=1e-6)
    assert two[0]["loss"] == pytest.approx(one["loss"], rel=1e-4)  # every step: the same updates
    first, final = _head_mean(two[0]["loss"], 1), _tail_mean(two[0]["loss"], window(len(two[0]["loss"])))
    assert math.isfinite(final) and final < first, two[0]["loss"]


if __name__ == "__main__":
    if sys.argv[2] == "1":  # one process: no cluster
        os.environ.pop("TF_CONFIG", None)
    print(json.dumps(tiny_baseline(sys.argv[1], int(sys.argv[2]))))
