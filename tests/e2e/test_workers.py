"""``training.workers`` in the DAG (dpbert/trainer_workers.py): ``dpbert run`` starts the trainer's W
worker processes on loopback and supervises them.

1. ``--set training.workers=2``: exit 0, the ε of the one-worker plan (the mechanism is the same:
   q, steps and σ do not depend on the layout; tests/model/test_multi_worker.py shows the released
   parameters are those of one process), the report and the dashboard say 2 workers.
2. A worker SIGKILLed mid-run: the run exits non-zero within a bounded time (no collective
   timeout: the supervisor stops the others at once), one line names the worker and the steps
   the step log charged; the step log holds every executed step; the re-run resumes from the
   last checkpoint and charges every executed step: ε = the plan's ε for the steps executed.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    from dpbert.model.engine.chain import chains

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
    from dpbert.model.engine.chain import chains

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
