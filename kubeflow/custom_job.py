"""The trainer step of a compiled Vertex AI spec with ``training.workers`` = W > 1, at compile time:
the CustomJob template the MLMPretrainer task carries as its ``custom_job`` parameter, as TFX's
``tfx/extensions/google_cloud_ai_platform`` runs its Trainer on Vertex AI.

``build_custom_job`` (offline): worker pools ``[chief × 1, worker × (W − 1)]`` on
``vertex.machine_type`` (+ ``vertex.accelerator_type`` × ``accelerator_count``), every replica
running ``python -m dpbert.trainer_workers`` in the pipeline's image, and
``scheduling.restartJobOnWorkerRestart``: a replica Vertex AI restarts alone could not rejoin a
MultiWorkerMirroredStrategy cluster, so the whole job restarts and the chief resumes its chain
(write-ahead step log, last checkpoint). Checked with ``aiplatform_v1.types.CustomJob.from_json``.

At run time the step hands the template to ``dpbert.launch.VertexCustomJobLauncher``
(``dpbert.launch.vertex``: submit with this execution's invocation as every replica's argument,
poll, fail with the job's error); ``dpbert.trainer_workers.train`` then reads the chief's result.
Vertex AI gives each replica ``CLUSTER_SPEC`` and ``TF_CONFIG`` (workerpool0 = ``chief``,
workerpool1 = ``worker``). A lost replica inside the job is bounded by MultiWorkerMirroredStrategy's
own failure detection: TF 2.16 starts its coordination service (leader: the chief) and then turns
the Python health check (30 s period) off; the service's heartbeat fails the survivors' blocked
collectives with UnavailableError (on loopback, a SIGKILLed peer failed the other's all-reduce in
about 10 s), the replicas exit non-zero and Vertex AI fails the job — or, after a VM restart,
restarts it whole (``restartJobOnWorkerRestart``). A replica that never starts is not bounded by
it (the first barrier waits without a timeout): only by the job's own time limit.

The pipeline's service account needs ``aiplatform.customJobs.create`` and ``.get``
(roles/aiplatform.user has both), and ``iam.serviceAccounts.actAs`` on ``vertex.service_account``
when one is set; the replicas' account needs read/write on the pipeline root's bucket.
``CLIENT_ENV`` = ``local`` (set by ``kubeflow.local_v2``) runs the replicas as local processes.
"""
from __future__ import annotations

import json
import re
from typing import Optional

from dpbert.config import Config, ConfigError
from dpbert.launch.vertex import CLIENT_ENV  # noqa: F401  (the rehearsal's switch, kubeflow.local_v2)

#: The command of every replica (the image's interpreter; the argument is the Invocation JSON).
WORKER_COMMAND = ["python", "-m", "dpbert.trainer_workers"]


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
