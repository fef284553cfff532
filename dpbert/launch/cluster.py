"""A cluster of worker processes on this machine: ports, ``TF_CONFIG``, ranks, the child's command.

Nothing here knows what the workers compute. ``free_ports`` + ``tf_config`` lay out a loopback
``MultiWorkerMirroredStrategy`` cluster (worker 0 is the chief); ``tf_config_rank`` reads a
process's rank back from any ``TF_CONFIG`` (loopback, or Vertex AI's chief + workers);
``module_command`` is how every child process is started (below). docs/scaling-out.md.

Child processes run ``sys.executable -c`` with a bootstrap that puts the folder holding THIS
``dpbert`` package first on ``sys.path`` before it imports anything, never ``python -m`` (which
puts the current folder first: run from the folder that holds the clone, ``./dpbert`` — the clone,
no ``__init__.py`` — is imported as a namespace package instead of the installed one, and the
workers fail at their first import).
"""
from __future__ import annotations

import json
import os
import random
import socket
import sys
from typing import List, Sequence, Tuple


def ephemeral_range() -> Tuple[int, int]:
    """The kernel's range for port 0 binds and outgoing connections (Linux; else IANA's)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as handle:  # a kernel setting
            low, high = (int(x) for x in handle.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_ports(count: int) -> List[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 for a loopback cluster, drawn at random BELOW
    the ephemeral range and checked by binding them together (then released). A port 0 bind
    would come from the ephemeral range, which every process's outgoing connections and port-0
    servers draw from: in the seconds before the worker binds it (its TensorFlow import),
    another process could take it first."""
    low, _ = ephemeral_range()
    lo, hi = max(10000, low - 16384), max(10000, low - 1)
    rng = random.SystemRandom()
    socks: List[socket.socket] = []
    try:
        for _ in range(100 * count):
            if len(socks) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", rng.randint(lo, hi) if hi > lo else 0))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        while len(socks) < count:  # nothing free below the range: the kernel's choice
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def tf_config(ports: Sequence[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of a loopback cluster on ``ports`` (worker 0 is the chief)."""
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": int(index)}})


def loopback_tf_configs(workers: int) -> List[str]:
    """One ``TF_CONFIG`` per rank of a cluster on 127.0.0.1 (free ports; rank 0 is the chief)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    ports = free_ports(workers)
    return [tf_config(ports, rank) for rank in range(workers)]


def tf_config_rank(config: str) -> int:
    """The rank of a ``TF_CONFIG`` task: the chief 0, then the workers
    (``multi_worker_util.id_in_cluster`` without TensorFlow)."""
    data = json.loads(config)
    task, cluster = data.get("task", {}), data.get("cluster", {})
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind == "chief":
        return 0
    if kind == "worker":
        return index + (1 if cluster.get("chief") else 0)
    raise ValueError(f"TF_CONFIG task type {kind!r} takes no part in training (chief or worker)")


def module_command(module: str, *args) -> List[str]:
    """The command line that runs ``module`` as ``__main__`` (like ``python -m``) in a child
    process whose ``sys.path[0]`` is the folder holding the ``dpbert`` package THIS process
    imported, whatever the current folder holds (module docstring)."""
    import dpbert

    root = os.path.dirname(os.path.dirname(os.path.abspath(dpbert.__file__)))
    bootstrap = ("import runpy, sys; sys.path[0] = sys.argv[1]; sys.argv = [sys.argv[2]] + sys.argv[3:]; "
                 "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", bootstrap, root, module, *map(str, args)]
