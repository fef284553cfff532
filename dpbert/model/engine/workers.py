"""Several worker processes of one training run on this machine: the layout and the supervisor.

``training.workers`` = W > 1 makes the run ONE ``MultiWorkerMirroredStrategy`` cluster of W
processes (``process_config``: ``training.strategy`` multi_worker, W × P replicas), each running
the same trainer code on the same inputs with its own ``TF_CONFIG`` (rank 0 is the chief: the
only one that locks and writes the state directory). ``supervise`` starts them and waits:

* the first process to exit non-zero stops the others (SIGTERM, then SIGKILL after
  ``GRACE_S``): a worker waiting in a collective for a dead peer would otherwise wait for the
  collective's own timeout, so the failure is bounded by the poll interval + ``GRACE_S``,
  whatever the training's length, and needs no collective timeout;
* ``timeout`` (optional) is a last-resort bound on the whole run;
* a supervisor killed outright takes its workers with it (Linux: ``PR_SET_PDEATHSIG``).

What this module does not do: judge what a failure cost. The caller reads the chain's step log
(``dpbert.model.engine.chain.read_step_log``) for the last step charged before the loss.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

log = logging.getLogger("dpbert.model.train")

#: Seconds a stopped worker gets between SIGTERM and SIGKILL.
GRACE_S = 5.0
#: Seconds between two looks at the workers.
POLL_S = 0.2


def process_config(training_config):
    """The ``TrainingConfig`` every process of a run with ``training.workers`` = W trains with: W = 1
    is the configuration itself; W > 1 is ``strategy: multi_worker`` over W × ``replicas`` replicas
    (replicas = the devices of one worker). The plan's P (micro-batches B / (P·T)) is then the
    cluster's replica count, which ``multi_worker_strategy`` checks against the cluster it joins."""
    workers = int(getattr(training_config, "workers", 1))
    if workers == 1:
        return training_config
    return dataclasses.replace(training_config, strategy="multi_worker",
                               replicas=workers * int(training_config.replicas))


def loopback_tf_configs(workers: int) -> List[str]:
    """One ``TF_CONFIG`` per rank of a cluster on 127.0.0.1 (free ports; rank 0 is the chief)."""
    from dpbert.model.noise_check import free_ports, tf_config

    ports = free_ports(workers)
    return [tf_config(ports, rank) for rank in range(workers)]


class WorkerFailed(RuntimeError):
    """A worker process exited non-zero (or the run exceeded its last-resort bound); the others
    were stopped. ``rank``: the first to fail (None on a timeout); ``returncode``; ``stderr_tail``."""

    def __init__(self, message: str, rank: Optional[int], returncode: Optional[int], stderr_tail: str = "",
                 pids: Sequence[int] = ()):
        super().__init__(message)
        self.rank, self.returncode, self.stderr_tail = rank, returncode, stderr_tail
        #: Every worker's process id (all of them ended and reaped when this is raised).
        self.pids = list(pids)


def describe_exit(returncode: Optional[int]) -> str:
    """``exit 1`` / ``killed by SIGKILL``."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def _stop(procs: Sequence[subprocess.Popen], grace_s: float):
    """SIGTERM every running process group, SIGKILL what is left after ``grace_s``."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in running:
        if p.poll() is None:
            _signal_group(p, signal.SIGKILL)
        p.wait()


def _signal_group(proc: subprocess.Popen, sig):
    try:
        os.killpg(proc.pid, sig)  # the worker's own session: its children too
    except ProcessLookupError:
        pass


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:  # a local pipe file, not an artifact
            return handle.read()[-chars:]
    except OSError:
        return ""


def supervise(commands: Sequence[Sequence[str]], envs: Sequence[Dict[str, str]], *, inherit_rank0: bool = True,
              timeout: Optional[float] = None, grace_s: float = GRACE_S, cwd: Optional[str] = None,
              poll_s: float = POLL_S) -> None:
    """Run ``commands[r]`` with ``envs[r]`` for every rank r, each in its own session, and wait for
    all. Rank 0's stdout/stderr are this process's (``inherit_rank0``: the chief's progress is the
    run's); the others' go to temporary files whose tail a failure carries. Raises
    :class:`WorkerFailed` at the first non-zero exit (every other worker stopped first) or past
    ``timeout`` seconds; returns None when every worker exited 0."""
    from dpbert.model.noise_check import die_with_parent

    if len(commands) != len(envs) or not commands:
        raise ValueError(f"one environment per command, got {len(commands)} commands and {len(envs)} environments")
    with tempfile.TemporaryDirectory(prefix="dpbert-workers-") as tmp:
        procs: List[subprocess.Popen] = []
        errs: List[Optional[str]] = []
        arm = die_with_parent()
        try:
            for rank, (command, env) in enumerate(zip(commands, envs)):
                err = None if rank == 0 and inherit_rank0 else os.path.join(tmp, f"{rank}.err")
                errs.append(err)
                popen = dict(env=env, cwd=cwd, start_new_session=True, preexec_fn=arm)
                if err is None:
                    procs.append(subprocess.Popen(list(command), **popen))
                    continue
                with open(err, "w") as stream:  # a local pipe file; the child keeps its own descriptor
                    procs.append(subprocess.Popen(list(command), stdout=stream, stderr=stream, **popen))
                log.info("worker %d of %d started (pid %d)", rank, len(commands), procs[-1].pid)
            _wait(procs, errs, timeout, grace_s, poll_s)
        finally:
            _stop(procs, grace_s)


def _wait(procs, errs, timeout, grace_s, poll_s):
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    while True:
        codes = [p.poll() for p in procs]
        failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None:
            _stop(procs, grace_s)
            tail = _tail(errs[failed]) if errs[failed] else ""
            raise WorkerFailed(f"worker {failed} of {len(procs)} {describe_exit(codes[failed])}", failed,
                               codes[failed], tail, [p.pid for p in procs])
        if all(c == 0 for c in codes):
            return
        if deadline is not None and time.monotonic() > deadline:
            _stop(procs, grace_s)
            raise WorkerFailed(f"the {len(procs)} workers did not finish within {timeout:g} s (stopped)", None, None,
                               pids=[p.pid for p in procs])
        time.sleep(poll_s)


def worker_envs(base: Dict[str, str], tf_configs: Sequence[str], extra: Optional[Dict[str, str]] = None) -> List[Dict]:
    """``base`` + ``TF_USE_LEGACY_KERAS=1`` + each rank's ``TF_CONFIG`` (+ ``extra``)."""
    return [dict(base, TF_USE_LEGACY_KERAS="1", TF_CONFIG=config, **(extra or {})) for config in tf_configs]


def tf_config_rank(tf_config: str) -> int:
    """The rank of a ``TF_CONFIG`` task: the chief 0, then the workers (``multi_worker_util.id_in_cluster``
    without TensorFlow)."""
    data = json.loads(tf_config)
    task, cluster = data.get("task", {}), data.get("cluster", {})
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind == "chief":
        return 0
    if kind == "worker":
        return index + (1 if cluster.get("chief") else 0)
    raise ValueError(f"TF_CONFIG task type {kind!r} takes no part in training (chief or worker)")
