"""The trainer step of a compiled Vertex AI spec with ``training.workers`` = W > 1: a Vertex AI
custom job of W replicas, as TFX's ``tfx/extensions/google_cloud_ai_platform`` runs its Trainer
(``training_clients.VertexJobClient`` + ``runner._launch_cloud_training``): the pipeline step
submits the job, polls it, and fails with the job's error.

* ``build_custom_job`` (compile time, offline): the CustomJob template the MLMPretrainer task
  carries as its ``custom_job`` parameter — worker pools ``[chief × 1, worker × (W − 1)]`` on
  ``vertex.machine_type`` (+ ``vertex.accelerator_type`` × ``accelerator_count``), every replica
  running ``python -m dpbert.trainer_workers`` in the pipeline's image, and
  ``scheduling.restartJobOnWorkerRestart``: a replica Vertex AI restarts alone could not rejoin a
  MultiWorkerMirroredStrategy cluster, so the whole job restarts and the chief resumes its chain
  (write-ahead step log, last checkpoint). Checked with ``aiplatform_v1.types.CustomJob.from_json``.
* ``run_custom_job`` (run time, in the pipeline step): the template + this execution's
  ``dpbert.trainer_workers.Invocation`` as every replica's argument; submit, poll every
  ``POLL_S``, then the chief's result (or what it failed with) from ``Invocation.result_uri``.

Vertex AI gives each replica ``CLUSTER_SPEC`` and ``TF_CONFIG`` (workerpool0 = ``chief``,
workerpool1 = ``worker``); ``dpbert.trainer_workers`` takes the rank from ``TF_CONFIG``. A lost replica
inside the job is bounded by MultiWorkerMirroredStrategy's own failure detection: TF 2.16 starts
its coordination service (leader: the chief) and then turns the Python health check (30 s period)
off; the service's heartbeat fails the survivors' blocked collectives with UnavailableError (on
loopback, a SIGKILLed peer failed the other's all-reduce in about 10 s), the replicas exit
non-zero and Vertex AI fails the job — or, after a VM restart, restarts it whole
(``restartJobOnWorkerRestart``). A replica that never starts is not bounded by it (the first
barrier waits without a timeout): only by the job's own time limit, Vertex AI's default here.

The pipeline's service account (the one the PipelineJob runs as) needs
``aiplatform.customJobs.create`` and ``aiplatform.customJobs.get`` (roles/aiplatform.user has
both), and ``iam.serviceAccounts.actAs`` on ``vertex.service_account`` when one is set; the
replicas' account needs read/write on the pipeline root's bucket. ``DPBERT_CUSTOM_JOB_CLIENT=local``
(set by ``kubeflow.local_v2``) runs the job's replicas as local processes instead: the rehearsal.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import re
import time
from typing import Callable, Optional

from dpbert.config import Config, ConfigError

log = logging.getLogger("dpbert.trainer")

#: The command of every replica (the image's interpreter; the argument is the Invocation JSON).
WORKER_COMMAND = ["python", "-m", "dpbert.trainer_workers"]
#: Seconds between two looks at the job (TFX polls every 60 s too).
POLL_S = 60.0
#: Consecutive connection errors tolerated while polling (the client is recreated after each).
CONNECTION_RETRIES = 5
#: Rehearsal switch (``kubeflow.local_v2``): ``local`` runs the replicas as processes here.
CLIENT_ENV = "DPBERT_CUSTOM_JOB_CLIENT"


class CustomJobFailed(RuntimeError):
    """The Vertex AI custom job ended FAILED or CANCELLED (its error in the message)."""


#: A regional Artifact Registry host: ``REGION-docker.pkg.dev`` (``europe-docker.pkg.dev``,
#: ``us-docker.pkg.dev`` and ``*gcr.io`` are multi-regional: they name no region).
_REGIONAL_REGISTRY = re.compile(r"([a-z]+-[a-z]+[0-9]+)-docker\.pkg\.dev/")


def region_of_image(image: str) -> Optional[str]:
    """The region of ``image``'s host when it is a regional Artifact Registry one, else None."""
    match = _REGIONAL_REGISTRY.match(image or "")
    return match.group(1) if match else None


def vertex_region(config: Config, image: str) -> str:
    """``vertex.region``, else the region of ``image``'s regional Artifact Registry host; a
    ConfigError naming ``vertex.region`` when neither says one (a multi-region or other host)."""
    region = config.vertex.region or region_of_image(image)
    if not region:
        raise ConfigError(
            f"vertex.region must be set: the image {image!r} is not on a regional Artifact Registry host "
            f"(REGION-docker.pkg.dev/...), so it names no region; e.g. --set vertex.region=europe-west4")
    return region


def build_custom_job(config: Config, image: str, region: Optional[str] = None) -> dict:
    """``{"project", "region", "customJob"}``: the CustomJob (REST JSON, camelCase) without the
    replicas' argument, which only the running step knows (its artifact URIs). ``region``:
    :func:`vertex_region` when not given."""
    workers, vertex = config.training.workers, config.vertex
    if workers < 2:
        raise ConfigError(f"training.workers = {workers}: a custom job is for training.workers > 1")
    if not vertex.project:
        raise ConfigError("vertex.project must be set to compile training.workers > 1 for Vertex AI "
                          "(the project the trainer's custom job runs in)")
    region = region or vertex_region(config, image)
    machine = {"machineType": vertex.machine_type}
    if vertex.accelerator_type:
        machine.update(acceleratorType=vertex.accelerator_type, acceleratorCount=int(vertex.accelerator_count))
    container = {"imageUri": image, "command": list(WORKER_COMMAND)}
    pools = [{"machineSpec": machine, "replicaCount": "1", "containerSpec": container},
             {"machineSpec": dict(machine), "replicaCount": str(workers - 1), "containerSpec": dict(container)}]
    job_spec = {"workerPoolSpecs": pools, "scheduling": {"restartJobOnWorkerRestart": True}}
    if vertex.service_account:
        job_spec["serviceAccount"] = vertex.service_account
    job = {"displayName": f"{config.pipeline.name}-trainer"[:128], "jobSpec": job_spec,
           "labels": {"dpbert-step": "mlm-pretrainer"}}
    check_custom_job(job)
    return {"project": vertex.project, "region": region, "customJob": job}


def check_custom_job(job: dict):
    """Parse ``job`` as an ``aiplatform_v1`` CustomJob (unknown or mistyped fields raise), and
    check the pools: a chief × 1 then workers."""
    from google.cloud.aiplatform_v1.types import CustomJob
    from google.protobuf.json_format import ParseError

    try:
        parsed = CustomJob.from_json(json.dumps(job))
    except ParseError as err:
        raise ValueError(f"not a Vertex AI CustomJob: {err}") from None
    pools = parsed.job_spec.worker_pool_specs
    if len(pools) < 2 or pools[0].replica_count != 1 or pools[1].replica_count < 1:
        raise ValueError(f"a trainer custom job has the pools [chief × 1, worker × (W − 1)], got "
                         f"{[p.replica_count for p in pools]}")
    return parsed


def job_for(template: dict, invocation_json: str, suffix: str) -> dict:
    """The template with every replica's argument (the invocation) and a display name of its own."""
    job = copy.deepcopy(template["customJob"])
    for pool in job["jobSpec"]["workerPoolSpecs"]:
        pool["containerSpec"]["args"] = [invocation_json]
    job["displayName"] = f"{job['displayName'][:100]}-{suffix}"
    return job


def job_client(region: str):
    """The Vertex AI JobServiceClient of ``region`` (regional endpoint), or the rehearsal's."""
    if os.environ.get(CLIENT_ENV) == "local":
        return LocalJobClient()
    from google.cloud.aiplatform_v1 import JobServiceClient

    return JobServiceClient(client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})


def _completed_states():
    from google.cloud.aiplatform_v1.types import JobState

    return ((JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED),
            (JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED))


def submit_and_wait(template: dict, job: dict, client=None, client_factory: Callable = job_client,
                    sleep: Callable[[float], None] = time.sleep, poll_s: float = POLL_S):
    """Create the custom job, poll it until it completes (a connection error recreates the client,
    ``CONNECTION_RETRIES`` in a row fail), return the final CustomJob; FAILED / CANCELLED raise
    :class:`CustomJobFailed` with the job's error."""
    from google.cloud.aiplatform_v1.types import CustomJob

    client = client or client_factory(template["region"])
    parent = f"projects/{template['project']}/locations/{template['region']}"
    name = client.create_custom_job(parent=parent, custom_job=CustomJob.from_json(json.dumps(job))).name
    log.info("submitted Vertex AI custom job %s", name)
    completed, failed = _completed_states()
    retries, response, first = 0, None, True
    while response is None or response.state not in completed:
        if not first:
            sleep(poll_s)
        first = False
        try:
            response, retries = client.get_custom_job(name=name), 0
        except ConnectionError:
            retries += 1
            if retries > CONNECTION_RETRIES:
                raise
            log.warning("connection error polling %s (%d/%d): recreating the client", name, retries,
                        CONNECTION_RETRIES)
            client = client_factory(template["region"])
    if response.state in failed:
        raise CustomJobFailed(f"Vertex AI custom job {name} ended {response.state.name}: "
                              f"{response.error.message or 'no error message'}")
    return response


def run_custom_job(template_json: str, inv, client=None, sleep: Callable[[float], None] = time.sleep,
                   poll_s: float = POLL_S) -> dict:
    """The trainer step on Vertex AI: submit this execution's job, wait, return the chief's
    result (``dpbert.trainer_workers.run_local_workers``'s); a failed job raises what the chief
    recorded when it did, else :class:`CustomJobFailed`."""
    from dpbert import storage
    from dpbert.trainer_workers import error_uri, raise_recorded

    template = json.loads(template_json)
    job = job_for(template, inv.to_json(), os.path.basename(inv.result_uri).split(".")[0][:12])
    try:
        submit_and_wait(template, job, client=client, sleep=sleep, poll_s=poll_s)
    except CustomJobFailed:
        for rank in range(inv.workers):
            raise_recorded(storage.read_json(error_uri(inv, rank), default=None))
        raise
    result = storage.read_json(inv.result_uri)
    raise_recorded(result)
    return result


# --------------------------------------------------------------------------- the rehearsal
def vertex_environments(pools, ports) -> list:
    """(rank, ``CLUSTER_SPEC``, ``TF_CONFIG``) of every replica, as Vertex AI sets them for pools
    ``[chief × 1, worker × (W − 1)]`` (workerpool0 is the ``chief``), on loopback ``ports``."""
    counts = [int(p["replicaCount"]) for p in pools]
    hosts = [f"localhost:{port}" for port in ports]
    pool_hosts = [hosts[:counts[0]], hosts[counts[0]:counts[0] + counts[1]]]
    cluster = {"workerpool0": pool_hosts[0], "workerpool1": pool_hosts[1]}
    tf_cluster = {"chief": pool_hosts[0], "worker": pool_hosts[1]}
    out = []
    for pool, (kind, members) in enumerate((("chief", pool_hosts[0]), ("worker", pool_hosts[1]))):
        for index in range(len(members)):
            spec = {"cluster": cluster, "environment": "cloud", "task": {"type": f"workerpool{pool}", "index": index}}
            config = {"cluster": tf_cluster, "environment": "cloud", "task": {"type": kind, "index": index}}
            out.append((json.dumps(spec), json.dumps(config)))
    return out


class LocalJobClient:
    """A JobServiceClient stand-in that runs a custom job's replicas here (``create_custom_job``
    blocks until they end; ``get_custom_job`` reports how): the rehearsal of ``kubeflow.local_v2``.
    Each replica gets Vertex AI's ``CLUSTER_SPEC`` and ``TF_CONFIG``; the first to fail stops the others."""

    def __init__(self):
        self.jobs = {}

    def create_custom_job(self, parent: str, custom_job):
        from google.cloud.aiplatform_v1.types import CustomJob, JobState

        from dpbert.model.engine.workers import WorkerFailed, supervise
        from dpbert.model.noise_check import free_ports, module_command

        job = json.loads(CustomJob.to_json(custom_job))
        pools = job["jobSpec"]["workerPoolSpecs"]
        envs, commands = [], []
        for cluster_spec, tf_config in vertex_environments(pools, free_ports(sum(int(p["replicaCount"]) for p in pools))):
            envs.append(dict(os.environ, TF_USE_LEGACY_KERAS="1", CLUSTER_SPEC=cluster_spec, TF_CONFIG=tf_config))
        for pool in pools:
            container = pool["containerSpec"]
            command = container["command"] + container.get("args", [])
            if command[:2] == ["python", "-m"]:  # this interpreter, this checkout's packages, any folder
                command = module_command(command[2], *command[3:])
            commands += [command] * int(pool["replicaCount"])
        name = f"{parent}/customJobs/local-{len(self.jobs) + 1}"
        try:
            supervise(commands, envs)
            state, message = JobState.JOB_STATE_SUCCEEDED, ""
        except WorkerFailed as err:
            state, message = JobState.JOB_STATE_FAILED, str(err)
        self.jobs[name] = CustomJob(name=name, display_name=job["displayName"], state=state,
                                    error={"message": message} if message else None)
        return self.jobs[name]

    def get_custom_job(self, name: str):
        return self.jobs[name]
