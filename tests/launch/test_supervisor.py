"""The one supervisor (dpbert/launch/supervisor.py), without TensorFlow: the first child to exit
non-zero stops the others at once; a child ignoring SIGTERM is killed after the grace; the
last-resort timeout; children die with a supervisor killed outright; every rank's stdout in
rank order; a worker's stderr forwarded without TensorFlow's noise lines (positive control: the
same check fails on the unfiltered stream), its failure tail keeping every line."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from dpbert.launch.supervisor import WorkerFailed, is_noise, supervise

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]

#: What a 2-worker run's stderr must not hold (the check, written independently of ``is_noise``).
NOISE_TEXTS = ("All log messages before absl::InitializeLog()", "fork_posix.cc:77",
               "Coordination agent has successfully connected",
               "Using CollectiveAllReduceStrategy eagerly has significant overhead")
GLOG = re.compile(r"^[IWEF]\d{4} ", re.M)

#: A child that writes what a TensorFlow worker writes on every run, around two lines of its own.
NOISY = r'''
import sys
sys.stderr.write("""WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1732800000.100000   4242 fork_posix.cc:77] Other threads are currently calling into gRPC, skipping fork() handlers
I0000 00:00:1732800000.200000   4242 coordination_service_agent.cc:369] Coordination agent has successfully connected.
W1128 12:00:00.300000  4242 collective_ops.cc:1] a C++ warning
E0000 00:00:1732800000.400000   4242 an.cc:1] a C++ error line
WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly has significant overhead currently. We will be working on improving this in the future.
trainer: step 1 of 2, loss 3.2
the chief's own warning
""")
sys.stderr.flush()
sys.exit(int(sys.argv[1]))
'''


def noise_found(text: str):
    return [t for t in NOISE_TEXTS if t in text] + GLOG.findall(text)


def _env(n=3):
    return [dict(os.environ)] * n


def test_the_first_failure_stops_the_others_at_once():
    fail = [sys.executable, "-c", "import sys, time; time.sleep(0.5); print('boom', file=sys.stderr); sys.exit(3)"]
    started = time.monotonic()
    with pytest.raises(WorkerFailed, match="worker 1 of 3 exit 3") as caught:
        supervise([SLEEP, fail, SLEEP], _env(), grace_s=1.0)
    assert time.monotonic() - started < 10  # not the sleepers' 60 s
    assert caught.value.rank == 1 and caught.value.returncode == 3 and "boom" in caught.value.stderr_tail
    for pid in caught.value.pids:  # every worker ended and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_killed_worker_is_named_by_its_signal_and_success_returns_every_stdout():
    suicide = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(WorkerFailed, match="worker 2 of 3 killed by SIGKILL"):
        supervise([SLEEP, SLEEP, suicide], _env(), grace_s=0.5)
    ok = [sys.executable, "-c", "pass"]
    assert supervise([ok, ok, ok], _env()) == [None, None, None]
    say = [[sys.executable, "-c", f"print('rank {r}')"] for r in range(3)]
    assert supervise(say, _env(), capture_stdout=True) == ["rank 0\n", "rank 1\n", "rank 2\n"]


def test_workers_die_with_a_supervisor_killed_outright(tmp_path):
    """A supervisor SIGKILLed runs no ``finally``: its workers (their own sessions) get SIGKILL from
    the kernel (PR_SET_PDEATHSIG) instead of living on in a collective with a dead peer."""
    pids = tmp_path / "pids"
    record = [sys.executable, "-c", f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
              "time.sleep(60)"]
    script = ("import os; from dpbert.launch.supervisor import supervise; "
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
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead (its parent, init here, has not reaped it yet)


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "time.sleep(60)"]
    fail = [sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(1)"]
    started = time.monotonic()
    with pytest.raises(WorkerFailed):
        supervise([stubborn, fail], _env(2), grace_s=1.0)
    assert time.monotonic() - started < 10


def test_the_last_resort_timeout_stops_everything():
    with pytest.raises(WorkerFailed, match="did not finish within 1 s") as caught:
        supervise([SLEEP, SLEEP], _env(2), timeout=1, grace_s=0.5)
    assert caught.value.rank is None


def test_an_interrupted_supervisor_stops_its_workers_before_the_interrupt_propagates(tmp_path):
    """SIGINT (or SIGTERM mapped to KeyboardInterrupt by the caller) in the wait: every worker's
    group is stopped and reaped, then the interrupt goes on."""
    pids = tmp_path / "pids"
    record = [sys.executable, "-c", f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
              "time.sleep(60)"]
    # SIGINT's default handler restored: a shell's background job (`make test &`) starts with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler
    script = ("import os, signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from dpbert.launch.supervisor import supervise\ntry:\n"
              f"    supervise([{record!r}] * 2, [dict(os.environ)] * 2, grace_s=1.0)\n"
              "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n")
    supervisor = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(pids.read_text().split()) < 2 if pids.exists() else True:
            assert time.monotonic() < deadline and supervisor.poll() is None
            time.sleep(0.05)
        workers = [int(p) for p in pids.read_text().split()]
        supervisor.send_signal(signal.SIGINT)
        out, _ = supervisor.communicate(timeout=20)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert out.strip() == "interrupted"
    assert not any(_alive(pid) for pid in workers)  # stopped before supervise returned


def test_worker_stderr_is_forwarded_without_the_noise_lines_and_the_check_catches_them_unfiltered(capfd):
    """Positive control: the same check on the unfiltered stream (``quiet=False``) finds every noise
    line; the supervisor's forwarded stream holds none, and keeps the child's own lines."""
    child = [sys.executable, "-c", NOISY, "0"]
    assert supervise([child], _env(1), quiet=False) == [None]
    unfiltered = capfd.readouterr().err
    assert len(noise_found(unfiltered)) == len(NOISE_TEXTS) + 4, unfiltered  # 4 glog-prefixed lines
    assert supervise([child], _env(1)) == [None]
    filtered = capfd.readouterr().err
    assert noise_found(filtered) == [], filtered
    assert "trainer: step 1 of 2, loss 3.2\n" in filtered and "the chief's own warning\n" in filtered


def test_a_failed_workers_tail_keeps_every_line():
    """Its diagnosis: the C++ error line included (only the forwarded stream is filtered)."""
    with pytest.raises(WorkerFailed, match="worker 1 of 2 exit 4") as caught:
        supervise([SLEEP, [sys.executable, "-c", NOISY, "4"]], _env(2), grace_s=0.5)
    assert "E0000 00:00:1732800000.400000" in caught.value.stderr_tail
    assert "the chief's own warning" in caught.value.stderr_tail


def test_is_noise_keeps_lines_that_only_mention_a_level():
    assert is_noise("I1128 12:00:00.0 1 x.cc:1] m") and is_noise("W0000 00:00:1.0 1 fork_posix.cc:77] m")
    assert not is_noise("INFO 2026-11-28 trainer: step 1") and not is_noise("I1 think so")
    assert not is_noise("Traceback (most recent call last):")


_FORKS = []
os.register_at_fork(before=lambda: _FORKS.append(1))  # counts forks that run this process's fork handlers


def test_starting_workers_runs_no_fork_handler_in_the_supervisor():
    """gRPC's fork handlers (a supervisor that runs Beam has them) write ``fork_posix.cc:77`` lines
    on every fork of the process: the children are started without a ``preexec_fn``, so by vfork,
    which runs none. Positive control: a ``preexec_fn`` forks and runs them."""
    ok = [sys.executable, "-c", "pass"]
    del _FORKS[:]
    supervise([ok, ok], _env(2))
    assert _FORKS == []
    subprocess.run(ok, preexec_fn=lambda: None, check=True)
    assert _FORKS == [1]


def test_a_missing_command_is_refused_before_anything_starts():
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        supervise([[sys.executable, "-c", "pass"], ["no-such-program-dpbert"]], _env(2))
