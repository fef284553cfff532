"""The launchers (dpbert/launch/launcher.py) and a Vertex AI custom job at run time
(dpbert/launch/vertex.py), offline: in process, the job's entry is called and what it raises
propagates; local workers get one TF_CONFIG each and their stdout comes back in rank order;
the custom job is submitted with the job's arguments and polled against a fake JobServiceClient
(connection errors recreate the client); its replicas' environments are Vertex AI's."""
import json
import sys
import types

import pytest

from dpbert.launch import (CustomJobFailed, InProcessLauncher, Job, LaunchFailed, LocalWorkersLauncher,
                           VertexCustomJobLauncher, WorkerFailed)
from dpbert.launch import vertex
from dpbert.launch.cluster import tf_config_rank

TEMPLATE = {"project": "my-project", "region": "europe-west4", "customJob": {
    "displayName": "dpbert-trainer", "jobSpec": {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
         "containerSpec": {"imageUri": "img", "command": ["python", "-m", "some.module"]}},
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "3",
         "containerSpec": {"imageUri": "img", "command": ["python", "-m", "some.module"]}}]}}}


@pytest.fixture
def fake_module(monkeypatch):
    calls = []
    module = types.ModuleType("dpbert_test_fake_job")
    module.run = lambda argv: calls.append(argv) or (7 if argv == ["fail"] else 0)

    def boom(argv):
        raise KeyError("what the job raised")

    module.boom = boom
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__, calls


def test_in_process_calls_the_entry_and_lets_what_it_raises_through(fake_module):
    name, calls = fake_module
    assert InProcessLauncher().launch(Job(name, ("a", "b"), entry="run")) == [None]
    assert calls == [["a", "b"]]
    with pytest.raises(LaunchFailed, match="returned 7"):
        InProcessLauncher().launch(Job(name, ("fail",), entry="run"))
    with pytest.raises(KeyError, match="what the job raised"):
        InProcessLauncher().launch(Job(name, (), entry="boom"))
    with pytest.raises(ValueError, match="one process"):
        InProcessLauncher().launch(Job(name, (), workers=2, entry="run"))


def test_local_workers_get_one_tf_config_each_and_return_stdout_in_rank_order():
    show = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    configs = LocalWorkersLauncher(capture_stdout=True, timeout=60).run(show, 3)
    assert [tf_config_rank(c) for c in configs] == [0, 1, 2]
    assert len({json.dumps(json.loads(c)["cluster"]) for c in configs}) == 1  # one cluster
    with pytest.raises(WorkerFailed, match="worker 0 of 1 exit 3"):
        LocalWorkersLauncher(capture_stdout=True).run([sys.executable, "-c", "raise SystemExit(3)"], 1)


# --------------------------------------------------------------------------- Vertex AI
class FakeJobService:
    """The two JobServiceClient calls a launch makes; ``states`` is what successive gets return."""

    def __init__(self, states, error="", fail_gets=0):
        self.states, self.error, self.fail_gets = list(states), error, fail_gets
        self.created, self.gets = [], 0

    def create_custom_job(self, parent, custom_job):
        from google.cloud.aiplatform_v1.types import CustomJob

        self.created.append((parent, custom_job))
        return CustomJob(name=f"{parent}/customJobs/123", display_name=custom_job.display_name)

    def get_custom_job(self, name):
        from google.cloud.aiplatform_v1.types import CustomJob, JobState

        self.gets += 1
        if self.fail_gets:
            self.fail_gets -= 1
            raise ConnectionError("reset by peer")
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return CustomJob(name=name, state=getattr(JobState, f"JOB_STATE_{state}"),
                         error={"message": self.error} if self.error else None)


def test_the_custom_job_is_submitted_with_the_jobs_arguments_and_polled():
    from google.cloud.aiplatform_v1.types import CustomJob

    fake, sleeps = FakeJobService(["QUEUED", "RUNNING", "RUNNING", "SUCCEEDED"]), []
    launcher = VertexCustomJobLauncher(json.dumps(TEMPLATE), client=fake, sleep=sleeps.append, poll_s=7)
    assert launcher.launch(Job("some.module", ("{\"x\": 1}",), 4, name="abcdef0123456789")) == [None] * 4
    (parent, job), = fake.created
    assert parent == "projects/my-project/locations/europe-west4"
    submitted = json.loads(CustomJob.to_json(job))
    assert all(p["containerSpec"]["args"] == ["{\"x\": 1}"] for p in submitted["jobSpec"]["workerPoolSpecs"])
    assert submitted["displayName"] == "dpbert-trainer-abcdef012345"
    assert sleeps == [7, 7, 7] and fake.gets == 4


def test_a_failed_job_raises_its_error_and_a_mismatched_job_is_refused_before_submitting():
    fake = FakeJobService(["RUNNING", "FAILED"], error="The replica workerpool1-0 exited with a non-zero status of 137.")
    launcher = VertexCustomJobLauncher(json.dumps(TEMPLATE), client=fake, sleep=lambda s: None)
    with pytest.raises(CustomJobFailed, match="ended JOB_STATE_FAILED: The replica workerpool1-0 exited") as caught:
        launcher.launch(Job("some.module", (), 4))
    assert isinstance(caught.value, LaunchFailed) and caught.value.rank is None
    unused = FakeJobService(["SUCCEEDED"])
    launcher = VertexCustomJobLauncher(json.dumps(TEMPLATE), client=unused, sleep=lambda s: None)
    with pytest.raises(ValueError, match="starts 4 replicas, the job asks for 2"):
        launcher.launch(Job("some.module", (), 2))
    with pytest.raises(ValueError, match="not the job's module 'other.module'"):
        launcher.launch(Job("other.module", (), 4))
    assert unused.created == []


def test_polling_survives_connection_errors_and_gives_up_after_the_limit():
    fake = FakeJobService(["RUNNING", "SUCCEEDED"], fail_gets=2)
    made = []
    factory = lambda region: made.append(region) or fake  # noqa: E731
    job = vertex.job_for(TEMPLATE, ["x"], "x")
    vertex.submit_and_wait(TEMPLATE, job, client=fake, client_factory=factory, sleep=lambda s: None)
    assert made == ["europe-west4", "europe-west4"]
    stuck = FakeJobService(["RUNNING"], fail_gets=vertex.CONNECTION_RETRIES + 1)
    with pytest.raises(ConnectionError):
        vertex.submit_and_wait(TEMPLATE, job, client=stuck, client_factory=lambda r: stuck, sleep=lambda s: None)


def test_the_replicas_get_vertex_ais_cluster_spec_and_tf_config():
    pools = [{"replicaCount": "1"}, {"replicaCount": "2"}]
    envs = vertex.vertex_environments(pools, [7001, 7002, 7003])
    specs, configs = [json.loads(s) for s, _ in envs], [json.loads(c) for _, c in envs]
    assert [s["task"] for s in specs] == [{"type": "workerpool0", "index": 0}, {"type": "workerpool1", "index": 0},
                                          {"type": "workerpool1", "index": 1}]
    assert specs[0]["cluster"] == {"workerpool0": ["localhost:7001"], "workerpool1": ["localhost:7002", "localhost:7003"]}
    assert configs[0]["cluster"] == {"chief": ["localhost:7001"], "worker": ["localhost:7002", "localhost:7003"]}
    assert [tf_config_rank(c) for _, c in envs] == [0, 1, 2]
