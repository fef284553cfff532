"""Where a job's processes run: the ``Launcher`` protocol and its three implementations.

A :class:`Job` is one program run as ``workers`` processes of one cluster: ``python -m module
*args`` in each, every process reading its rank from ``TF_CONFIG`` (rank 0 is the chief). A
launcher runs it and returns when every process has ended well, else raises
:class:`~dpbert.launch.supervisor.LaunchFailed` (or, in process, what the job raised):

* :class:`InProcessLauncher`: one process, this one: ``module.<entry>(args)``, no ``TF_CONFIG``;
* :class:`LocalWorkersLauncher`: W child processes on loopback (free ports, one ``TF_CONFIG``
  each) under the one supervisor (``dpbert.launch.supervisor.supervise``);
* :class:`VertexCustomJobLauncher`: the replicas of a Vertex AI custom job (``dpbert.launch.vertex``)
  built from a compile-time template; Vertex AI sets each replica's ``TF_CONFIG``.

What a job computes and what its result is are its caller's (e.g. ``dpbert.trainer_workers``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
import uuid
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from dpbert.launch import cluster, supervisor, vertex


@dataclasses.dataclass(frozen=True)
class Job:
    """``python -m module *args`` in each of ``workers`` processes; in process, ``module.entry(args)``.
    ``name``: a short label of this execution (a custom job's display-name suffix)."""

    module: str
    args: Tuple[str, ...] = ()
    workers: int = 1
    entry: str = "main"
    name: str = ""


class Launcher(Protocol):
    """Runs a :class:`Job`; returns each process's stdout in rank order where the launcher captures
    it (else None per process)."""

    def launch(self, job: Job) -> List[Optional[str]]:
        ...  # pragma: no cover


class InProcessLauncher:
    """The job's one process is this one: ``module.entry(list(args))``; what it raises propagates
    unchanged, a non-zero return raises :class:`~dpbert.launch.supervisor.LaunchFailed`."""

    def launch(self, job: Job) -> List[Optional[str]]:
        if job.workers != 1:
            raise ValueError(f"an in-process launch runs one process, the job asks for {job.workers}")
        code = getattr(importlib.import_module(job.module), job.entry)(list(job.args))
        if code not in (None, 0):
            raise supervisor.LaunchFailed(f"{job.module}.{job.entry} returned {code}")
        return [None]


class LocalWorkersLauncher:
    """W child processes of this interpreter on loopback (``cluster.module_command``, one
    ``TF_CONFIG`` each, ``env`` or this process's environment), supervised: the first failure
    stops the others. ``capture_stdout``: every rank's stdout is returned and nothing of the
    children's output is shown; else rank 0's output is this process's (its stderr without the
    workers' noise lines). ``timeout``: the last-resort bound on the whole run, in seconds."""

    def __init__(self, *, timeout: Optional[float] = None, capture_stdout: bool = False,
                 env: Optional[Dict[str, str]] = None, grace_s: float = supervisor.GRACE_S):
        self.timeout, self.capture_stdout, self.env, self.grace_s = timeout, capture_stdout, env, grace_s

    def launch(self, job: Job) -> List[Optional[str]]:
        return self.run(cluster.module_command(job.module, *job.args), job.workers)

    def run(self, command: Sequence[str], workers: int) -> List[Optional[str]]:
        """``command`` (any command line) as the job's ``workers`` processes."""
        envs = supervisor.worker_envs(dict(os.environ if self.env is None else self.env),
                                      cluster.loopback_tf_configs(workers))
        return supervisor.supervise([list(command)] * workers, envs, inherit_rank0=not self.capture_stdout,
                                    capture_stdout=self.capture_stdout, timeout=self.timeout, grace_s=self.grace_s)


class VertexCustomJobLauncher:
    """The job as a Vertex AI custom job from ``template_json`` (``{"project", "region",
    "customJob"}``, compiled by ``kubeflow.custom_job``): every replica gets the job's ``args``;
    submitted and polled (``dpbert.launch.vertex.submit_and_wait``). The template's replicas must
    run the job's module and be as many as its workers."""

    def __init__(self, template_json: str, client=None, sleep: Callable[[float], None] = time.sleep,
                 poll_s: float = vertex.POLL_S):
        self.template = json.loads(template_json)
        self.client, self.sleep, self.poll_s = client, sleep, poll_s

    def launch(self, job: Job) -> List[Optional[str]]:
        pools = self.template["customJob"]["jobSpec"]["workerPoolSpecs"]
        modules = {tuple(pool["containerSpec"].get("command", ()))[2:3] for pool in pools}
        if modules != {(job.module,)}:
            raise ValueError(f"the custom job's replicas run {sorted(modules)}, not the job's module {job.module!r}")
        if vertex.replica_count(self.template) != job.workers:
            raise ValueError(f"the custom job starts {vertex.replica_count(self.template)} replicas, the job asks "
                             f"for {job.workers} workers")
        spec = vertex.job_for(self.template, job.args, (job.name or uuid.uuid4().hex)[:12])
        vertex.submit_and_wait(self.template, spec, client=self.client, sleep=self.sleep, poll_s=self.poll_s)
        return [None] * job.workers
