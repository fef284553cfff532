"""The local supervisor of a multi-worker trainer (dpbert/model/engine/workers.py, dpbert/trainer_workers.py),
without TensorFlow: the first worker to exit non-zero stops the others at once; the layout every
process trains with; ranks from TF_CONFIG; a stopped chief's lease released only when it is that
chief's; the worker command runs this checkout's module from any folder."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _env():
    return [dict(os.environ)] * 3


def test_the_first_failure_stops_the_others_at_once():
    from dpbert.model.engine.workers import WorkerFailed, supervise

    fail = [sys.executable, "-c", "import sys, time; time.sleep(0.5); print('boom', file=sys.stderr); sys.exit(3)"]
    started = time.monotonic()
    with pytest.raises(WorkerFailed, match="worker 1 of 3 exit 3") as caught:
        supervise([SLEEP, fail, SLEEP], _env(), grace_s=1.0)
    assert time.monotonic() - started < 10  # not the sleepers' 60 s
    assert caught.value.rank == 1 and caught.value.returncode == 3 and "boom" in caught.value.stderr_tail
    for pid in caught.value.pids:  # every worker ended and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_killed_worker_is_named_by_its_signal_and_success_returns():
    from dpbert.model.engine.workers import WorkerFailed, supervise

    suicide = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(WorkerFailed, match="worker 2 of 3 killed by SIGKILL"):
        supervise([SLEEP, SLEEP, suicide], _env(), grace_s=0.5)
    ok = [sys.executable, "-c", "pass"]
    assert supervise([ok, ok, ok], _env()) is None


def test_workers_die_with_a_supervisor_killed_outright(tmp_path):
    """A supervisor SIGKILLed runs no ``finally``: its workers (their own sessions) get SIGKILL from
    the kernel (PR_SET_PDEATHSIG) instead of living on in a collective with a dead peer."""
    pids = tmp_path / "pids"
    record = [sys.executable, "-c", f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
              "time.sleep(60)"]
    script = ("import json, os, sys; from dpbert.model.engine.workers import supervise; "
              f"supervise([{record!r}] * 2, [dict(os.environ)] * 2)")
    supervisor = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(pids.read_text().split()) < 2 if pids.exists() else True:
            assert time.monotonic() < deadline and supervisor.poll() is None
            time.sleep(0.05)
        workers = [int(p) for p in pids.read_text().split()]
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "a worker outlived its supervisor"
            time.sleep(0.05)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead (its parent, init here, has not reaped it yet)


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    from dpbert.model.engine.workers import WorkerFailed, supervise

    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "time.sleep(60)"]
    fail = [sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(1)"]
    started = time.monotonic()
    with pytest.raises(WorkerFailed):
        supervise([stubborn, fail], _env()[:2], grace_s=1.0)
    assert time.monotonic() - started < 10


def test_the_last_resort_timeout_stops_everything():
    from dpbert.model.engine.workers import WorkerFailed, supervise

    with pytest.raises(WorkerFailed, match="did not finish within 1 s") as caught:
        supervise([SLEEP, SLEEP], _env()[:2], timeout=1, grace_s=0.5)
    assert caught.value.rank is None


def test_every_process_trains_one_cluster_of_w_times_p_replicas():
    from dpbert.config import ConfigError, TrainingConfig
    from dpbert.model.engine.workers import process_config

    one = TrainingConfig(steps=1, batch_size=8)
    assert process_config(one) is one
    two = process_config(TrainingConfig(steps=1, batch_size=8, workers=2))
    assert (two.strategy, two.replicas, two.workers) == ("multi_worker", 2, 2)
    gpus = process_config(TrainingConfig(steps=1, batch_size=16, workers=2, replicas=4, strategy="mirrored"))
    assert (gpus.strategy, gpus.replicas) == ("multi_worker", 8)
    with pytest.raises(ConfigError, match="training.batch_size must be divisible by training.workers"):
        TrainingConfig(steps=1, batch_size=8, workers=3, replicas=1).validate("training")
    with pytest.raises(ConfigError, match="training.strategy must be default or mirrored"):
        TrainingConfig(steps=1, batch_size=8, workers=2, strategy="multi_worker").validate("training")


def test_ranks_from_tf_config():
    from dpbert.model.engine.workers import loopback_tf_configs, tf_config_rank

    assert [tf_config_rank(c) for c in loopback_tf_configs(3)] == [0, 1, 2]
    vertex = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 1}}
    assert tf_config_rank(json.dumps(vertex)) == 2
    with pytest.raises(ValueError, match="ps"):
        tf_config_rank(json.dumps({"cluster": {}, "task": {"type": "ps", "index": 0}}))


HOLD = """
import sys, time
from dpbert import storage
lease = storage.LeaseLock(sys.argv[1], ttl_s=600).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_only_the_stopped_chiefs_lease_is_released(tmp_path):
    """A lease held by a process the supervisor stopped is deleted (the re-run need not wait for it
    to expire); the positive control: a live holder's lease, named by another pid, stays."""
    from dpbert import schema, storage
    from dpbert.trainer_workers import release_dead_lease

    state = str(tmp_path / "state")
    lock = storage.join(state, schema.STATE_LOCK_FILE)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, lock], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert not release_dead_lease(state, holder.pid + 100000)  # not the holder: kept
    assert storage.storage_for(lock).exists(lock)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert release_dead_lease(state, holder.pid)
    assert not storage.storage_for(lock).exists(lock)
    assert not release_dead_lease(state, holder.pid)  # nothing left to release


def test_the_worker_command_runs_this_checkout_from_a_folder_that_shadows_it(tmp_path):
    from dpbert.trainer_workers import MODULE
    from dpbert.model.noise_check import module_command

    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "workers.py").write_text("print('the shadow ran')\n")
    # and a folder named like the package, with no __init__.py (the clone, seen from its parent):
    # ``python -m`` imported it as a namespace package and the noise check's workers failed
    (tmp_path / "dpbert").mkdir()
    (tmp_path / "dpbert" / "README.md").write_text("not the package\n")
    result = subprocess.run(module_command(MODULE), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "the shadow ran" not in result.stdout
    assert result.returncode == 2 and "usage: python -m dpbert.trainer_workers" in result.stderr


def test_cluster_ports_are_free_distinct_and_below_the_ephemeral_range():
    """Not from the range port-0 binds and outgoing connections draw from (another process could
    take such a port before the worker binds it, and the cluster would hang)."""
    import socket

    from dpbert.model.noise_check import _ephemeral_range, free_ports

    low, _ = _ephemeral_range()
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(10000 <= p < low for p in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
