"""The trainer stage as a launched job (dpbert/trainer_workers.py, dpbert/model/engine/workers.py),
without TensorFlow: the layout every process trains with; the chief's result returned, or what
it failed with raised, whichever launcher ran it (in process, a Vertex AI custom job against a
fake client); a stopped chief's lease released only when it is that chief's. The supervisor
itself: tests/launch/."""
import json
import signal
import subprocess
import sys

import pytest

from tests.launch.test_launcher import FakeJobService


def test_every_process_trains_one_cluster_of_w_times_p_replicas():
    from dpbert.config import ConfigError, TrainingConfig
    from dpbert.model.engine.workers import process_config

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

    def fake_pretrain(tuples_dir, vocabulary_dir, model_dir, **kw):
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
