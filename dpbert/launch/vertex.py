"""A Vertex AI custom job at run time: submit a CustomJob, wait for it, fail with its error.

As TFX's ``tfx/extensions/google_cloud_ai_platform`` runs its Trainer (``training_clients.
VertexJobClient`` + ``runner._launch_cloud_training``): ``JobServiceClient.create_custom_job``
on the region's endpoint, then ``get_custom_job`` every ``POLL_S`` until the job's state is
SUCCEEDED, FAILED or CANCELLED (the latter two raise :class:`CustomJobFailed` with the job's
error). A connection error while polling recreates the client; ``CONNECTION_RETRIES`` in a row
fail. The job template (``{"project", "region", "customJob"}``, REST JSON) is built at compile
time (``kubeflow.custom_job.build_custom_job``); here every replica gets the job's arguments.

Vertex AI gives each replica ``CLUSTER_SPEC`` and ``TF_CONFIG`` (workerpool0 = ``chief``,
workerpool1 = ``worker``). ``$DPBERT_CUSTOM_JOB_CLIENT=local`` (``CLIENT_ENV``; set by the
rehearsal ``kubeflow.local_v2``) runs the job's replicas as local processes instead
(:class:`LocalJobClient`, with the environments Vertex AI would set). docs/running-on-vertex.md.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import time
from typing import Callable, Sequence

from dpbert.launch.supervisor import LaunchFailed

log = logging.getLogger("dpbert.launch")

#: Seconds between two looks at the job (TFX polls every 60 s too).
POLL_S = 60.0
#: Consecutive connection errors tolerated while polling (the client is recreated after each).
CONNECTION_RETRIES = 5
#: Rehearsal switch (``kubeflow.local_v2``): ``local`` runs the replicas as processes here.
CLIENT_ENV = "DPBERT_CUSTOM_JOB_CLIENT"


class CustomJobFailed(LaunchFailed):
    """The Vertex AI custom job ended FAILED or CANCELLED (its error in the message)."""


def replica_count(template: dict) -> int:
    """How many replicas the template's worker pools start."""
    return sum(int(pool.get("replicaCount", 1)) for pool in template["customJob"]["jobSpec"]["workerPoolSpecs"])


def job_for(template: dict, args: Sequence[str], suffix: str) -> dict:
    """The template's CustomJob with ``args`` as every replica's arguments and a display name of its own."""
    job = copy.deepcopy(template["customJob"])
    for pool in job["jobSpec"]["workerPoolSpecs"]:
        pool["containerSpec"]["args"] = [str(a) for a in args]
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


# --------------------------------------------------------------------------- the rehearsal
def vertex_environments(pools, ports) -> list:
    """(``CLUSTER_SPEC``, ``TF_CONFIG``) of every replica in rank order, as Vertex AI sets them for
    pools ``[chief × 1, worker × (W − 1)]`` (workerpool0 is the ``chief``), on loopback ``ports``."""
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
    Each replica gets Vertex AI's ``CLUSTER_SPEC`` and ``TF_CONFIG``; they run under
    ``dpbert.launch.supervisor.supervise`` (the first to fail stops the others)."""

    def __init__(self):
        self.jobs = {}

    def create_custom_job(self, parent: str, custom_job):
        from google.cloud.aiplatform_v1.types import CustomJob, JobState

        from dpbert.launch.cluster import free_ports, module_command
        from dpbert.launch.supervisor import WorkerFailed, supervise

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
