"""LeaseLock on every backend: acquire, LockHeld, expiry and takeover (an injected clock, no
sleeping), exactly one winner of two racing takeovers, LockLost, a release that never deletes
someone else's lease, keep_alive, and a SIGKILLed holder whose lease the next run takes over."""
import json
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


def test_keep_alive_renews_until_release_and_reports_a_lost_lease(backend):
    _, root = backend
    uri = join(root, "lock")
    # Margins for a loaded machine (2 busy cores): a renewal thread starved for a whole ttl, or a
    # first renewal landing before the thief, would be the test's failure, not the lock's.
    lock = LeaseLock(uri, ttl_s=1.0, owner="alive").acquire().keep_alive(interval_s=0.05)
    time.sleep(1.5)                                            # 1.5 ttl: only renewals keep it
    with pytest.raises(LockHeld):
        LeaseLock(uri, ttl_s=1.0, owner="other").acquire()
    assert lock.release() and lock._thread is None
    lock = LeaseLock(uri, ttl_s=0.2, owner="slow").acquire().keep_alive(interval_s=1.0)
    time.sleep(0.3)                                            # expired long before its first renewal
    LeaseLock(uri, ttl_s=60, owner="thief").acquire()
    deadline = time.time() + 5
    while lock.lost is None and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(LockLost):
        lock.check()
    assert lock.release() is False and read_json(uri)["owner"] == "thief"


_HOLDER = """
import sys, time
from dpbert.storage import LeaseLock
LeaseLock(sys.argv[1], ttl_s=float(sys.argv[2]), owner="crashing").acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_killed_holder_is_taken_over_after_its_ttl(tmp_path):
    uri = str(tmp_path / "state" / "lock")
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, uri, "30"], cwd=ROOT,
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
    assert later.held and json.loads((tmp_path / "state" / "lock").read_text())["owner"] == "next"


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
