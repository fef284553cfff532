"""The trainer stage as a launched job (dpbert/trainer_workers.py, dpbert/engine/workers.py):
the layout every process trains with; the chief's result returned, or what it failed with
raised, whichever launcher ran it (in process, a Vertex AI custom job against a fake client); a
stopped chief's lease released only when it is that chief's. The non-private baseline on
several workers: its update divides by the cluster's example count (a one-layer stepper whose
statistics stand in for a second worker's shard), and a step without an example (NaN loss) is
left out of the shown means, not averaged into NaN. The two-worker run itself:
tests/e2e/test_workers.py (slow). The supervisor: tests/launch/."""
import json
import logging
import math
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.launch.test_launcher import FakeJobService


def test_every_process_trains_one_cluster_of_w_times_p_replicas():
    from dpbert.config import ConfigError, TrainingConfig
    from dpbert.engine.workers import process_config

    one = TrainingConfig(steps=1, batch_size=8)
    assert process_config(one) is one
    two = process_config(TrainingConfig(steps=1, batch_size=8, workers=2))
    assert (two.strategy, two.replicas, two.workers) == ("multi_worker", 2, 2)
    gpus = process_config(TrainingConfig(steps=1, batch_size=16, workers=2, replicas=4, strategy="mirrored"))
    assert (gpus.strategy, gpus.replicas) == ("multi_worker", 8)
    with pytest.raises(ConfigError, match="training.batch_size must be divisible by training.workers"):
        TrainingConfig(steps=1, batch_size=8, workers=3, replicas=1).validate("training")
    with pytest.raises(ConfigError, match="training.strategy must be default or mirrored"):
        TrainingConfig(steps=1, batch_size=8, workers=2, strategy="multi_worker").validate("training")


def _invocation(tmp_path, workers=1):
    from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig
    from dpbert.trainer_workers import Invocation

    sections = [json.dumps(c.__dict__) for c in (ModelConfig(), TrainingConfig(steps=2, batch_size=8, workers=workers),
                                                 PrivacyConfig(), MembershipConfig())]
    return Invocation(str(tmp_path / "t"), str(tmp_path / "v"), str(tmp_path / "m"), *sections,
                      pipeline_root=str(tmp_path / "root"), result_uri=str(tmp_path / "result.json"))


def test_in_process_the_chief_runs_the_stage_and_its_failure_is_raised_unchanged(tmp_path, monkeypatch):
    """One worker, this process: the stage's properties come back through the result; what the
    stage raised propagates as itself (the run's exit code depends on its type)."""
    from dpbert.launch import InProcessLauncher
    from dpbert.stages import pretrain as stage
    from dpbert.trainer_workers import stage_state_dir, train

    inv = _invocation(tmp_path)
    seen = {}

    def fake_pretrain(inputs, model_dir, **kw):
        seen.update(kw, model_dir=model_dir)
        return type("R", (), {"properties": {"final_mlm_loss": 1.5}, "state_dir": stage_state_dir(inv),
                              "train": type("T", (), {"workers": 1})})()

    monkeypatch.setattr(stage, "pretrain", fake_pretrain)
    result = train(inv, InProcessLauncher())
    assert result["properties"] == {"final_mlm_loss": 1.5} and result["workers"] == 1
    assert seen["model_dir"] == inv.model_dir and seen["training_config"].strategy == "default"

    failure = RefusedHere("over the budget")

    def refused(*args, **kw):
        raise failure

    monkeypatch.setattr(stage, "pretrain", refused)
    with pytest.raises(RefusedHere) as caught:
        train(inv, InProcessLauncher())
    assert caught.value is failure


class RefusedHere(Exception):
    """A stage failure whose type the caller maps to an exit code."""


TEMPLATE = {"project": "my-project", "region": "europe-west4", "customJob": {
    "displayName": "dpbert-trainer", "jobSpec": {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": str(n),
         "containerSpec": {"imageUri": "img", "command": ["python", "-m", "dpbert.trainer_workers"]}}
        for n in (1, 3)]}}}


def test_a_custom_job_returns_the_chiefs_result_or_raises_what_it_recorded(tmp_path):
    from dpbert import storage
    from dpbert.launch import CustomJobFailed, VertexCustomJobLauncher
    from dpbert.trainer_workers import train

    def launcher(states, error=""):
        return VertexCustomJobLauncher(json.dumps(TEMPLATE), client=FakeJobService(states, error),
                                       sleep=lambda s: None)

    inv = _invocation(tmp_path, workers=4)
    storage.write_json(inv.result_uri, {"properties": {"epsilon_train": 1.5}, "workers": 4})
    assert train(inv, launcher(["RUNNING", "SUCCEEDED"])) == {"properties": {"epsilon_train": 1.5}, "workers": 4}
    storage.write_json(inv.result_uri, {"error": {"type": "builtins.ValueError", "message": "no training tuple left"}})
    with pytest.raises(ValueError, match="no training tuple left"):
        train(inv, launcher(["FAILED"], "x"))
    storage.storage_for(inv.result_uri).delete(inv.result_uri)
    with pytest.raises(CustomJobFailed, match="ended JOB_STATE_FAILED: replica 2 exited"):
        train(inv, launcher(["FAILED"], "replica 2 exited"))


HOLD = """
import sys, time
from dpbert import storage
lease = storage.LeaseLock(sys.argv[1], ttl_s=600).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_only_the_stopped_chiefs_lease_is_released(tmp_path):
    """A lease held by a process the supervisor stopped is deleted (the re-run need not wait for it
    to expire); the positive control: a live holder's lease, named by another pid, stays."""
    from dpbert import schema, storage
    from dpbert.trainer_workers import release_dead_lease

    state = str(tmp_path / "state")
    lock = storage.join(state, schema.STATE_LOCK_FILE)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, lock], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert not release_dead_lease(state, holder.pid + 100000)  # not the holder: kept
    assert storage.storage_for(lock).exists(lock)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert release_dead_lease(state, holder.pid)
    assert not storage.storage_for(lock).exists(lock)
    assert not release_dead_lease(state, holder.pid)  # nothing left to release


# --------------------------------------------------------------------------- the non-private baseline
def test_the_baselines_update_divides_by_the_clusters_example_count():
    """Each worker's rounds hold its own shard only; the summed gradient is the cluster's, and so
    must the count be: the one the statistics' all-reduce sums (stand-in: another worker's shard
    adds 3 examples to them). This process's own count (3) would scale the update and split the
    workers' weights."""
    import tensorflow as tf
    import tf_keras

    from dpbert.mechanism import gaussian
    from dpbert.mechanism import step as step_lib
    from dpbert.engine.build import GHOST

    x = tf_keras.Input((3,))
    model = tf_keras.Model(x, tf_keras.layers.Dense(2, kernel_initializer=tf_keras.initializers.Constant(0.1))(x))
    stepper = step_lib.DPSGDTrainStep(
        model, tf_keras.optimizers.SGD(1.0), gaussian.DPSGDConfig(clip_norm=1.0, noise_multiplier=1.0,
                                                                  expected_batch_size=4.0, non_private=True),
        prepare_fn=lambda f: (f[:, :3], f[:, 3]), loss_fn=lambda y, out: tf.reduce_sum(tf.square(out - y[:, None]), 1),
        clipping=GHOST)
    accumulate, apply, seen = stepper._accumulate_fn, stepper._apply_fn, []

    def with_another_workers_shard(batch, round_index):
        stats, norms = accumulate(batch, round_index)
        return dict(stats, examples=stats["examples"] + 3.0), norms

    stepper._accumulate_fn = with_another_workers_shard
    stepper._apply_fn = lambda denominator, canary: seen.append(float(denominator)) or apply(denominator, canary)
    features = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    stats = stepper.run_step([{"features": features[None], "example_mask": np.array([[1, 1, 1, 0]], np.float32)}])
    assert stats["examples"] == 6.0 and seen == [6.0]  # not 3.0, this process's own rounds


def test_a_step_without_an_example_is_left_out_of_the_baselines_shown_means(caplog):
    """0/0 is recorded as NaN for such a step (no loss); the progress line and the artifact's
    initial/final loss average the steps that had one. Control: the plain mean is NaN."""
    from dpbert.engine.progress import Progress, finite_mean
    from dpbert.stages.pretrain import _head_mean, _tail_mean

    losses = [4.0, float("nan"), 3.0, 2.0, float("nan")]
    assert math.isnan(sum(losses[-3:]) / 3)  # what the window's mean was
    assert _tail_mean(losses, 3) == 2.5 and _head_mean(losses, 3) == 3.5 and _tail_mean(losses, 1) is None
    mean, counted = finite_mean([])
    assert counted == 0 and math.isnan(mean)
    progress = Progress(5, 0, "SGD (non-private)", interval=0.0, label="exact (private)")
    with caplog.at_level(logging.INFO, logger="dpbert.engine.train"):
        for step, loss in enumerate(losses, 1):
            progress.update(step, {"loss": loss, "accuracy": 0.5 if loss == loss else float("nan")})
    assert "nan" not in caplog.records[-1].getMessage()
    assert "loss 3.000, accuracy 0.500 (exact (private): mean of the 3 steps with an example among the last 5)" \
        in caplog.records[-1].getMessage()
