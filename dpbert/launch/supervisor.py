"""The one supervisor of child processes: start W of them, wait for all, stop all at the first loss.

``supervise(commands, envs)`` runs ``commands[r]`` with ``envs[r]`` for every rank r, each in its
own session (its own process group, which is what is stopped), and waits:

* the first process to exit non-zero stops the others (SIGTERM to each group, SIGKILL after
  ``grace_s``): a worker waiting in a collective for a dead peer would otherwise wait for the
  collective's own timeout, so a failure is bounded by the poll interval + ``grace_s``;
* ``timeout`` (optional) is a last-resort bound on the whole run;
* an interrupt of the supervisor (KeyboardInterrupt: SIGINT, or SIGTERM where the caller maps it
  so) stops them the same way before it propagates;
* a supervisor killed outright (SIGKILL, an OOM kill: no ``finally`` runs) takes its children
  with it: Linux's parent-death signal, armed in each child (``dying_with_parent``).

Failures raise :class:`WorkerFailed` with the rank, how it ended and the tail of its stderr.
Each child's stderr is read line by line: the lines every TensorFlow worker process writes on
every run and that tell its reader nothing (``is_noise``: glog-prefixed C++ log lines, absl's
pre-initialisation notice, gRPC's fork notice, the coordination agent's connection, the
eager-collective warning) are not forwarded, so W processes are as quiet as one; the failure
tail keeps every line. Knows nothing of what the children compute (docs/scaling-out.md).
"""
from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

log = logging.getLogger("dpbert.launch")

#: Seconds a stopped child gets between SIGTERM and SIGKILL.
GRACE_S = 5.0
#: Seconds between two looks at the children.
POLL_S = 0.2
#: Characters of a failed child's stderr its error carries.
TAIL_CHARS = 3000
#: Seconds a stream reader gets to drain a pipe once its child has ended.
DRAIN_S = 5.0

#: Lines of a TensorFlow worker's stderr that are never forwarded (module docstring).
NOISE = ("All log messages before absl::InitializeLog()", "fork_posix.cc:77",
         "Coordination agent has successfully connected",
         "Using CollectiveAllReduceStrategy eagerly has significant overhead")
#: A glog / absl C++ log line: severity letter, MMDD, a space (``I0000 00:00:...``, ``W1128 ...``).
GLOG_LINE = re.compile(r"^[IWEF]\d{4} ")


def is_noise(line: str) -> bool:
    """True for a line a worker's forwarded stderr drops (``NOISE`` or a glog-prefixed line)."""
    return bool(GLOG_LINE.match(line)) or any(text in line for text in NOISE)


class LaunchFailed(RuntimeError):
    """A launched job failed. ``rank``: the first process known to have failed (None: unknown or
    a timeout)."""

    rank: Optional[int] = None


class WorkerFailed(LaunchFailed):
    """A child process exited non-zero (or the run exceeded its last-resort bound); the others
    were stopped. ``rank``: the first to fail (None on a timeout); ``returncode``; ``stderr_tail``."""

    def __init__(self, message: str, rank: Optional[int], returncode: Optional[int], stderr_tail: str = "",
                 pids: Sequence[int] = ()):
        super().__init__(message)
        self.rank, self.returncode, self.stderr_tail = rank, returncode, stderr_tail
        #: Every child's process id (all of them ended and reaped when this is raised).
        self.pids = list(pids)


def describe_exit(returncode: Optional[int]) -> str:
    """``exit 1`` / ``killed by SIGKILL``."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


#: Run by the child's own interpreter before the real command: arm Linux's parent-death signal
#: (PR_SET_PDEATHSIG = 1: SIGKILL when the thread that started it dies), give up if that parent
#: is already gone, then become the command (the setting survives exec).
_ARM_AND_EXEC = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


def dying_with_parent(command: Sequence[str], env: Optional[Dict[str, str]] = None) -> List[str]:
    """``command`` behind a small trampoline (this interpreter) that makes it get SIGKILL when this
    process dies: a supervisor killed outright (SIGKILL, an OOM kill) runs no ``finally``, and
    children in their own sessions would otherwise live on, waiting in a collective for the dead
    peer. Armed in the child, not by a ``preexec_fn``: with none, ``subprocess`` starts the child
    by vfork, which runs no fork handlers here (gRPC's write "fork_posix.cc" lines on a fork of
    a process using it). A command not found raises FileNotFoundError here, as Popen would."""
    path = (env or os.environ).get("PATH", os.defpath)
    if shutil.which(command[0], path=path) is None:
        raise FileNotFoundError(errno.ENOENT, f"No such file or directory: {command[0]!r}", command[0])
    return [sys.executable, "-S", "-E", "-c", _ARM_AND_EXEC, str(os.getpid()), *map(str, command)]


class _Reader(threading.Thread):
    """Reads one child's stderr line by line: keeps the last ``TAIL_CHARS`` of it, and writes every
    line to ``sink`` (None: nowhere) unless ``quiet`` and :func:`is_noise`."""

    def __init__(self, stream, sink, quiet: bool):
        super().__init__(daemon=True)
        self.stream, self.sink, self.quiet = stream, sink, quiet
        self.tail: collections.deque = collections.deque()
        self.size = 0

    def run(self):
        try:
            for raw in iter(self.stream.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                self._keep(line)
                if self.sink is not None and not (self.quiet and is_noise(line)):
                    self.sink.write(line)
                    self.sink.flush()
        except (OSError, ValueError):  # the sink or the pipe closed under us: nothing left to forward
            pass
        finally:
            self.stream.close()

    def _keep(self, line: str):
        self.tail.append(line)
        self.size += len(line)
        while self.size - len(self.tail[0]) >= TAIL_CHARS:
            self.size -= len(self.tail.popleft())

    def text(self) -> str:
        self.join(DRAIN_S)
        return "".join(list(self.tail))[-TAIL_CHARS:]


@dataclasses.dataclass
class _Child:
    proc: subprocess.Popen
    reader: Optional[_Reader]
    out_path: Optional[str]

    def stdout(self) -> Optional[str]:
        if self.out_path is None:
            return None
        with open(self.out_path, encoding="utf-8", errors="replace") as handle:  # a local temporary file
            return handle.read()

    def stderr_tail(self) -> str:
        return self.reader.text() if self.reader is not None else ""


def _start(command: Sequence[str], env: Dict[str, str], out_path: Optional[str], *, inherit: bool, quiet: bool,
           cwd: Optional[str]) -> _Child:
    """One child in its own session. ``inherit``: its stderr goes on to this process's (through the
    filter when ``quiet``), its stdout too unless captured to ``out_path``; else both are only read
    for the failure tail (stdout into ``out_path`` when given)."""
    popen = dict(env=env, cwd=cwd, start_new_session=True)
    command = dying_with_parent(command, env)
    if inherit and not quiet:
        stdout = open(out_path, "wb") if out_path else None  # a local temporary file; the child keeps its own
        try:
            return _Child(subprocess.Popen(list(command), stdout=stdout, **popen), None, out_path)
        finally:
            if stdout is not None:
                stdout.close()
    read, write = os.pipe()  # the child's stderr (and its stdout, when neither shown nor captured)
    stdout = open(out_path, "wb") if out_path else (None if inherit else write)
    try:
        proc = subprocess.Popen(list(command), stdout=stdout, stderr=write, **popen)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
        if out_path:
            stdout.close()
    reader = _Reader(os.fdopen(read, "rb"), sys.stderr if inherit else None, quiet)
    reader.start()
    return _Child(proc, reader, out_path)


def supervise(commands: Sequence[Sequence[str]], envs: Sequence[Dict[str, str]], *, inherit_rank0: bool = True,
              capture_stdout: bool = False, quiet: bool = True, timeout: Optional[float] = None,
              grace_s: float = GRACE_S, cwd: Optional[str] = None, poll_s: float = POLL_S) -> List[Optional[str]]:
    """Run ``commands[r]`` with ``envs[r]`` for every rank r, each in its own session, and wait for
    all (module docstring). ``inherit_rank0``: rank 0's output goes on to this process's (the
    chief's progress is the run's; its stderr through :func:`is_noise` when ``quiet``); every other
    rank's is only kept for a failure's tail. ``capture_stdout``: each rank's stdout is returned,
    in rank order (else a list of None). Raises :class:`WorkerFailed` at the first non-zero exit
    (every other child stopped first) or past ``timeout`` seconds."""
    if len(commands) != len(envs) or not commands:
        raise ValueError(f"one environment per command, got {len(commands)} commands and {len(envs)} environments")
    with tempfile.TemporaryDirectory(prefix="dpbert-workers-") as tmp:
        children: List[_Child] = []
        try:
            for rank, (command, env) in enumerate(zip(commands, envs)):
                out_path = os.path.join(tmp, f"{rank}.out") if capture_stdout else None
                children.append(_start(command, env, out_path, inherit=rank == 0 and inherit_rank0, quiet=quiet,
                                       cwd=cwd))
                log.info("worker %d of %d started (pid %d)", rank, len(commands), children[-1].proc.pid)
            _wait(children, timeout, grace_s, poll_s)
            for child in children:  # the last lines forwarded before this returns
                child.stderr_tail()
            return [child.stdout() for child in children]
        finally:
            _stop([child.proc for child in children], grace_s)


def _wait(children: List[_Child], timeout: Optional[float], grace_s: float, poll_s: float):
    procs = [child.proc for child in children]
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    while True:
        codes = [p.poll() for p in procs]
        failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None:
            _stop(procs, grace_s)
            raise WorkerFailed(f"worker {failed} of {len(procs)} {describe_exit(codes[failed])}", failed,
                               codes[failed], children[failed].stderr_tail(), [p.pid for p in procs])
        if all(c == 0 for c in codes):
            return
        if deadline is not None and time.monotonic() > deadline:
            _stop(procs, grace_s)
            raise WorkerFailed(f"the {len(procs)} workers did not finish within {timeout:g} s (stopped)", None, None,
                               pids=[p.pid for p in procs])
        time.sleep(poll_s)


def _stop(procs: Sequence[subprocess.Popen], grace_s: float):
    """SIGTERM every running child's process group, SIGKILL what is left after ``grace_s`` (at
    once when this is interrupted in the grace), and reap them all."""
    running = [p for p in procs if p.poll() is None]
    try:
        for p in running:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for p in running:
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(proc: subprocess.Popen, sig):
    try:
        os.killpg(proc.pid, sig)  # the child's own session: its children too
    except ProcessLookupError:
        pass


def worker_envs(base: Dict[str, str], tf_configs: Sequence[str], extra: Optional[Dict[str, str]] = None) -> List[Dict]:
    """``base`` + ``TF_USE_LEGACY_KERAS=1`` + each rank's ``TF_CONFIG`` (+ ``extra``)."""
    return [dict(base, TF_USE_LEGACY_KERAS="1", TF_CONFIG=config, **(extra or {})) for config in tf_configs]
