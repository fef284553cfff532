"""The trainer step as a Vertex AI custom job (kubeflow/custom_job.py), offline: the compiled
template parses as an ``aiplatform_v1`` CustomJob with the pools [chief × 1, worker × (W − 1)];
submission and polling run against a fake JobServiceClient; the replicas' environments are the
ones Vertex AI sets (workerpool0 is the chief)."""
import json

import pytest

from tests.kubeflow.conftest import IMAGE

WORKERS = ["training.workers=4", "vertex.project=my-project", "vertex.region=europe-west4",
           "vertex.machine_type=n1-highmem-8", "vertex.accelerator_type=NVIDIA_TESLA_T4",
           "vertex.accelerator_count=1", "vertex.service_account=trainer@my-project.iam.gserviceaccount.com"]


def trainer_parameters(spec, task="MLMPretrainer"):
    return spec["pipelineSpec"]["root"]["dag"]["tasks"][task]["inputs"]["parameters"]


def template_of(spec, task="MLMPretrainer"):
    return json.loads(trainer_parameters(spec, task)["custom_job"]["runtimeValue"]["constantValue"]["stringValue"])


def test_compiled_trainer_carries_a_custom_job_with_one_chief_and_w_minus_1_workers(compile_spec):
    from google.cloud.aiplatform_v1.types import CustomJob

    template = template_of(compile_spec(WORKERS))
    assert (template["project"], template["region"]) == ("my-project", "europe-west4")
    job = CustomJob.from_json(json.dumps(template["customJob"]))  # unknown or mistyped fields raise
    pools = job.job_spec.worker_pool_specs
    assert [p.replica_count for p in pools] == [1, 3]
    for pool in pools:
        assert pool.machine_spec.machine_type == "n1-highmem-8"
        assert pool.machine_spec.accelerator_type.name == "NVIDIA_TESLA_T4" and pool.machine_spec.accelerator_count == 1
        assert pool.container_spec.image_uri == IMAGE
        assert list(pool.container_spec.command) == ["python", "-m", "dpbert.trainer_workers"]
        assert not pool.container_spec.args  # the invocation is the running step's (its artifact URIs)
    assert job.job_spec.scheduling.restart_job_on_worker_restart
    assert job.job_spec.service_account == "trainer@my-project.iam.gserviceaccount.com"


def test_one_worker_compiles_without_a_custom_job(compile_spec):
    assert "custom_job" not in trainer_parameters(compile_spec())


def test_the_cli_compiles_workers_4_and_refuses_it_without_a_project(tmp_path, capsys):
    from google.cloud.aiplatform_v1.types import CustomJob

    from kubeflow.runner import main

    out = tmp_path / "p.json"
    args = ["compile", "--output", str(out), "--image", IMAGE, "--pipeline-root", "gs://b/root",
            "--set", "training.workers=4", "--set", "privacy.ledger=gs://b/ledgers"]
    assert main(args) == 2
    assert "vertex.project" in capsys.readouterr().err and not out.exists()
    assert main(args + ["--set", "vertex.project=my-project"]) == 0
    job = CustomJob.from_json(json.dumps(template_of(json.loads(out.read_text()))["customJob"]))
    assert [p.replica_count for p in job.job_spec.worker_pool_specs] == [1, 3]


def test_check_custom_job_refuses_a_broken_template():
    """Positive controls of the offline check: an unknown field, and the pools in the wrong order."""
    from dpbert.config import load_config
    from kubeflow.custom_job import build_custom_job, check_custom_job

    job = build_custom_job(load_config(None, WORKERS[:2]), IMAGE)["customJob"]
    check_custom_job(job)
    with pytest.raises(ValueError, match="workerPoolSpecz"):
        check_custom_job(dict(job, jobSpec=dict(job["jobSpec"], workerPoolSpecz=[])))
    swapped = json.loads(json.dumps(job))
    swapped["jobSpec"]["workerPoolSpecs"].reverse()
    with pytest.raises(ValueError, match="chief × 1"):
        check_custom_job(swapped)


# --------------------------------------------------------------------------- submission and polling
class FakeJobService:
    """The two JobServiceClient calls the step makes; ``states`` is what successive gets return."""

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


def _invocation(tmp_path):
    from dpbert.trainer_workers import Invocation

    return Invocation("gs://b/t", "gs://b/v", "gs://b/m", "{}", json.dumps({"workers": 4}), "{}", "{}", "gs://b",
                      str(tmp_path / "result.json"))


def _template():
    from dpbert.config import load_config
    from kubeflow.custom_job import build_custom_job

    return json.dumps(build_custom_job(load_config(None, WORKERS), IMAGE))


def test_the_step_submits_polls_and_returns_the_chiefs_result(tmp_path):
    from google.cloud.aiplatform_v1.types import CustomJob

    from dpbert import storage
    from kubeflow.custom_job import run_custom_job

    inv = _invocation(tmp_path)
    storage.write_json(inv.result_uri, {"properties": {"epsilon_train": 1.5}, "workers": 4})
    fake, sleeps = FakeJobService(["QUEUED", "RUNNING", "RUNNING", "SUCCEEDED"]), []
    result = run_custom_job(_template(), inv, client=fake, sleep=sleeps.append, poll_s=7)
    assert result == {"properties": {"epsilon_train": 1.5}, "workers": 4}
    (parent, job), = fake.created
    assert parent == "projects/my-project/locations/europe-west4"
    submitted = json.loads(CustomJob.to_json(job))
    assert all(p["containerSpec"]["args"] == [inv.to_json()] for p in submitted["jobSpec"]["workerPoolSpecs"])
    assert sleeps == [7, 7, 7] and fake.gets == 4


def test_a_failed_job_fails_the_step_with_the_jobs_error(tmp_path):
    from kubeflow.custom_job import CustomJobFailed, run_custom_job

    fake = FakeJobService(["RUNNING", "FAILED"], error="The replica workerpool1-0 exited with a non-zero status of 137.")
    with pytest.raises(CustomJobFailed, match="ended JOB_STATE_FAILED: The replica workerpool1-0 exited"):
        run_custom_job(_template(), _invocation(tmp_path), client=fake, sleep=lambda s: None)


def test_a_failed_job_raises_what_the_chief_recorded(tmp_path):
    from dpbert import storage
    from kubeflow.custom_job import run_custom_job

    inv = _invocation(tmp_path)
    storage.write_json(inv.result_uri, {"error": {"type": "builtins.ValueError", "message": "no training tuple left"}})
    with pytest.raises(ValueError, match="no training tuple left"):
        run_custom_job(_template(), inv, client=FakeJobService(["FAILED"], error="x"), sleep=lambda s: None)


def test_polling_survives_connection_errors_and_gives_up_after_the_limit(tmp_path):
    from dpbert import storage
    from kubeflow import custom_job

    inv = _invocation(tmp_path)
    storage.write_json(inv.result_uri, {"properties": {}, "workers": 4})
    fake = FakeJobService(["RUNNING", "SUCCEEDED"], fail_gets=2)
    made = []
    factory = lambda region: made.append(region) or fake  # noqa: E731
    job = custom_job.job_for(json.loads(_template()), inv.to_json(), "x")
    custom_job.submit_and_wait(json.loads(_template()), job, client=fake, client_factory=factory, sleep=lambda s: None)
    assert made == ["europe-west4", "europe-west4"]
    stuck = FakeJobService(["RUNNING"], fail_gets=custom_job.CONNECTION_RETRIES + 1)
    with pytest.raises(ConnectionError):
        custom_job.submit_and_wait(json.loads(_template()), job, client=stuck, client_factory=lambda r: stuck,
                                   sleep=lambda s: None)


def test_the_replicas_get_vertex_ais_cluster_spec_and_tf_config():
    from dpbert.model.engine.workers import tf_config_rank
    from kubeflow.custom_job import vertex_environments

    pools = [{"replicaCount": "1"}, {"replicaCount": "2"}]
    envs = vertex_environments(pools, [7001, 7002, 7003])
    specs, configs = [json.loads(s) for s, _ in envs], [json.loads(c) for _, c in envs]
    assert [s["task"] for s in specs] == [{"type": "workerpool0", "index": 0}, {"type": "workerpool1", "index": 0},
                                          {"type": "workerpool1", "index": 1}]
    assert specs[0]["cluster"] == {"workerpool0": ["localhost:7001"], "workerpool1": ["localhost:7002", "localhost:7003"]}
    assert configs[0]["cluster"] == {"chief": ["localhost:7001"], "worker": ["localhost:7002", "localhost:7003"]}
    assert [tf_config_rank(c) for _, c in envs] == [0, 1, 2]


# --------------------------------------------------------------------------- the rehearsal
REHEARSED = ["corpus.synthetic.patients=6", "vocab.sigma=2", "vocab.size=300", "training.steps=4",
             "training.batch_size=8", "training.checkpoint_every=2", "model.max_seq_length=64",
             "privacy.epsilon_budget=null", "canary.enabled=false", "ner.enabled=false", "audit.enabled=false",
             "training.train_non_private_baseline=false", "membership.holdout_patient_fraction=0",
             "beam.direct_num_workers=1", "training.workers=2", "vertex.project=my-project"]


# A cluster of worker processes: never beside another (loopback ports picked free by two clusters
# at once can collide, and a collision hangs the first collective; tests/e2e/test_workers.py).
@pytest.mark.slow
@pytest.mark.xdist_group("multi_worker")
def test_the_rehearsal_runs_the_custom_job_as_two_replicas_and_reports_it(compile_spec, tmp_path):
    """kubeflow/local_v2 runs the compiled trainer step, whose custom job's replicas start here with
    Vertex AI's CLUSTER_SPEC / TF_CONFIG (workerpool0 = chief); dpbert report reads the rehearsal:
    2 workers, 4 steps, the one-worker plan's ε."""
    import dataclasses
    import time

    from dpbert.config import load_config
    from dpbert.report import build_report, format_report
    from kubeflow.local_v2 import run_info, run_spec_locally
    from pipeline import guard
    from tests.tiny import CLASSIC

    overrides = CLASSIC + REHEARSED
    spec = compile_spec(overrides)
    assert template_of(spec)["customJob"]["jobSpec"]["workerPoolSpecs"][1]["replicaCount"] == "1"
    started = time.monotonic()
    outputs = run_spec_locally(spec, str(tmp_path / "root"),
                               tasks=["CorpusIngest", "DPVocabularyGen", "MLMPretrainer", "PrivacyAccountant"])
    seconds = time.monotonic() - started
    report = build_report(run_info(spec, outputs))
    assert report["status"] == "COMPLETE" and report["pretraining"]["workers"] == 2
    assert report["pretraining"]["steps"] == 4 and report["privacy"]["steps"] == 4
    config = load_config(None, overrides)
    one = dataclasses.replace(config, training=dataclasses.replace(config.training, workers=1))
    assert report["privacy"]["epsilon_train"] == pytest.approx(guard.planned(one)["epsilon_train"], rel=1e-9)
    assert "workers                               2" in format_report(report)
    print(f"rehearsal of the 2-worker custom job (4 tasks): {seconds:.0f} s")
