"""LeaseLock on every backend (fake-gcs-server included): acquire, LockHeld, expiry and takeover (an injected clock, no
sleeping), exactly one winner of two racing takeovers, LockLost, a release that never deletes
someone else's lease, keep_alive, and a SIGKILLed holder whose lease the next run takes over."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dpbert.storage import LeaseLock, LockHeld, LockLost, PreconditionFailed, join, read_json, write_text
from dpbert.storage.base import Storage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_acquire_then_a_second_owner_is_refused(backend):
    _, root = backend
    uri, clock = join(root, "state", "lock"), Clock()
    first = LeaseLock(uri, ttl_s=60, owner="run-a", clock=clock).acquire()
    assert first.held and read_json(uri) == {"owner": "run-a", "acquired_at": clock.t, "expires_at": clock.t + 60}
    with pytest.raises(LockHeld) as err:
        LeaseLock(uri, ttl_s=60, owner="run-b", clock=clock).acquire()
    assert err.value.holder == {"owner": "run-a", "expires_at": clock.t + 60} and uri in str(err.value)
    assert first.release() and not first.held
    with LeaseLock(uri, owner="run-b", clock=clock) as second:
        assert second.held and read_json(uri)["owner"] == "run-b"
    assert not second.held and read_json(uri, default=None) is None


def test_an_expired_lease_is_taken_over_and_the_old_holder_loses_it(backend):
    _, root = backend
    uri, clock = join(root, "lock"), Clock()
    old = LeaseLock(uri, ttl_s=10, owner="old", clock=clock).acquire()
    clock.t += 5
    old.renew()                                                # extends to t0 + 15
    clock.t += 9
    with pytest.raises(LockHeld):
        LeaseLock(uri, ttl_s=10, owner="new", clock=clock).acquire()
    clock.t += 2                                               # past t0 + 15
    new = LeaseLock(uri, ttl_s=10, owner="new", clock=clock).acquire()
    with pytest.raises(LockLost):
        old.renew()
    assert not old.held and old.release() is False            # never deletes the new lease
    assert read_json(uri)["owner"] == "new"
    new.renew()
    assert new.release() and read_json(uri, default=None) is None


class _Barrier(Storage):
    """Both takers read the stale lease before either writes (a forced race)."""

    def __init__(self, inner, parties, ignore_preconditions=False):
        self.inner, self.barrier = inner, threading.Barrier(parties)
        self.ignore = ignore_preconditions  # positive control: a store without compare-and-swap
        self.first_reads = threading.Semaphore(parties)

    def read(self, uri):
        found = self.inner.read(uri)
        if self.first_reads.acquire(blocking=False):          # only each taker's first read waits
            self.barrier.wait(timeout=10)
        return found

    def write_bytes(self, uri, data, *, if_generation_match=None, private=False):
        match = None if self.ignore else if_generation_match
        return self.inner.write_bytes(uri, data, if_generation_match=match)


@pytest.mark.parametrize("broken", [False, True])
def test_two_racing_takeovers_exactly_one_wins(backend, broken):
    storage, root = backend
    uri, clock = join(root, "lock"), Clock()
    LeaseLock(uri, ttl_s=10, owner="crashed", clock=clock).acquire()
    clock.t += 11
    racing = _Barrier(storage, 2, ignore_preconditions=broken)
    results = {}

    def take(owner):
        try:
            results[owner] = LeaseLock(uri, ttl_s=10, owner=owner, clock=clock, storage=racing).acquire()
        except LockHeld as err:
            results[owner] = err

    threads = [threading.Thread(target=take, args=(o,)) for o in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o, r in results.items() if isinstance(r, LeaseLock)]
    if broken:  # without preconditions both believe they hold the lock
        assert sorted(winners) == ["x", "y"]
        return
    losers = [r for r in results.values() if isinstance(r, LockHeld)]
    assert len(winners) == 1 and len(losers) == 1 and losers[0].holder["owner"] == winners[0]
    assert read_json(uri)["owner"] == winners[0]


def test_an_unreadable_lease_counts_as_expired(backend):
    _, root = backend
    uri = join(root, "lock")
    write_text(uri, "{torn")
    assert LeaseLock(uri, owner="me").acquire().held


def _wait_for(condition, what: str, timeout_s: float = 30.0):
    """Poll until ``condition()``; a generous deadline only against a hang (no timing is asserted)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_keep_alive_renews_until_release(backend):
    """An injected clock: each half-ttl step of it is followed by a renewal before the clock moves
    again, so after 1.5 ttl only the renewals keep the lease live (no wall-clock margins)."""
    _, root = backend
    uri, clock = join(root, "lock"), Clock()
    lock = LeaseLock(uri, ttl_s=10, owner="alive", clock=clock).acquire().keep_alive(interval_s=0.01)
    for _ in range(3):
        clock.t += 5
        _wait_for(lambda: read_json(uri)["expires_at"] == clock.t + 10, "a renewal")
    with pytest.raises(LockHeld):                              # t0 + 15: past the first expiry
        LeaseLock(uri, ttl_s=10, owner="other", clock=clock).acquire()
    assert lock.release() and lock._thread is None and read_json(uri, default=None) is None


class _HeldRenewals(Storage):
    """Renewals (writes matched on an existing generation) wait until ``open`` is set: the lease
    expires and is taken over before its holder's first renewal reaches the store."""

    def __init__(self, inner):
        self.inner, self.open = inner, threading.Event()

    def read(self, uri):
        return self.inner.read(uri)

    def delete(self, uri, *, if_generation_match=None):
        return self.inner.delete(uri, if_generation_match=if_generation_match)

    def write_bytes(self, uri, data, *, if_generation_match=None, private=False):
        if if_generation_match:
            assert self.open.wait(timeout=30), "renewal never let through"
        return self.inner.write_bytes(uri, data, if_generation_match=if_generation_match)


def test_keep_alive_reports_a_lease_lost_before_its_renewal(backend):
    storage, root = backend
    uri, clock, held = join(root, "lock"), Clock(), _HeldRenewals(storage)
    lock = LeaseLock(uri, ttl_s=10, owner="slow", clock=clock, storage=held).acquire().keep_alive(interval_s=0.01)
    clock.t += 11                                              # expired before any renewal
    LeaseLock(uri, ttl_s=60, owner="thief", clock=clock).acquire()
    held.open.set()
    _wait_for(lambda: lock.lost is not None, "the keep-alive thread to see the lost lease")
    with pytest.raises(LockLost):
        lock.check()
    assert lock.release() is False and read_json(uri)["owner"] == "thief"


def test_the_held_message_says_when_a_dead_holder_s_lease_expires_and_what_to_do(backend):
    _, root = backend
    uri, clock = join(root, "lock"), Clock(t=1_800_000_000.0)  # 2027-01-15 08:00:00 UTC
    LeaseLock(uri, ttl_s=120, owner="host:4242:abcd", clock=clock).acquire()
    clock.t += 30
    with pytest.raises(LockHeld) as err:
        LeaseLock(uri, ttl_s=120, owner="next", clock=clock).acquire()
    text = str(err.value)
    assert uri in text and "held by host:4242:abcd" in text and "\n" not in text
    assert "until 2027-01-15 08:02:00 UTC (90 s from now)" in text
    assert "if it died" in text and "stale" in text and "re-run after 2027-01-15 08:02:00 UTC" in text
    assert "wait for it to finish" in text


_HOLDER = """
import sys, time
from dpbert.storage import LeaseLock
LeaseLock(sys.argv[1], ttl_s=float(sys.argv[2]), owner="crashing").acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("where", ["local", pytest.param("gcs-server", marks=pytest.mark.slow)])
def test_a_killed_holder_is_taken_over_after_its_ttl(tmp_path, request, where):
    env = dict(os.environ)
    if where == "local":
        uri = str(tmp_path / "state" / "lock")
    else:  # the holder reaches the server through STORAGE_EMULATOR_HOST, this process by its client
        server = request.getfixturevalue("gcs_server")
        request.getfixturevalue("gcs_on_server")
        uri, env = f"gs://{server.bucket}/{tmp_path.name}/state/lock", {**env, **server.env()}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, uri, "30"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with pytest.raises(LockHeld) as err:                       # the dead holder's lease is still live
        LeaseLock(uri, ttl_s=30, owner="next").acquire()
    assert err.value.holder["owner"] == "crashing"
    later = LeaseLock(uri, ttl_s=30, owner="next", clock=lambda: time.time() + 31).acquire()
    assert later.held and read_json(uri)["owner"] == "next"


class _LostReply(Storage):
    """Each write goes through but is reported as a failed precondition (GCS retried a
    conditional upload whose first reply was lost)."""

    def __init__(self, inner):
        self.inner = inner

    def read(self, uri):
        return self.inner.read(uri)

    def delete(self, uri, *, if_generation_match=None):
        return self.inner.delete(uri, if_generation_match=if_generation_match)

    def write_bytes(self, uri, data, *, if_generation_match=None, private=False):
        self.inner.write_bytes(uri, data, if_generation_match=if_generation_match)
        raise PreconditionFailed(f"{uri}: 412 on the retry")


def test_a_write_whose_reply_was_lost_is_recognised_as_ours(backend):
    storage, root = backend
    uri, clock = join(root, "lock"), Clock()
    lock = LeaseLock(uri, ttl_s=10, owner="me", clock=clock, storage=_LostReply(storage)).acquire()
    clock.t += 5
    lock.renew()
    assert lock.held and read_json(uri)["expires_at"] == clock.t + 10
    assert lock.release() and not storage.exists(uri)
    LeaseLock(uri, ttl_s=10, owner="other", clock=clock).acquire()
    with pytest.raises(LockHeld):                              # someone else's lease is not adopted
        LeaseLock(uri, ttl_s=10, owner="me", clock=clock, storage=_LostReply(storage)).acquire()
