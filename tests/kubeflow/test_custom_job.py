"""The trainer step as a Vertex AI custom job (kubeflow/custom_job.py), offline: the compiled
template parses as an ``aiplatform_v1`` CustomJob with the pools [chief × 1, worker × (W − 1)];
the rehearsal runs its replicas here. Submission and polling at run time (dpbert.launch):
tests/launch/test_launcher.py and tests/model/test_worker_supervisor.py."""
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
