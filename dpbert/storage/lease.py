"""A lock that works on object stores: a lease object ``{"owner", "expires_at", "acquired_at"}``
created with ``if_generation_match=0`` and renewed / released matched on OUR generation.

Unlike ``flock``, it survives a crashed holder: the lease expires after ``ttl_s`` and the next
run takes it over with ``if_generation_match=<the stale generation>``, so of two racing takers
exactly one wins. A write that went through although the store reported a precondition failure
(GCS retries a conditional upload whose reply was lost) is recognised by its exact bytes. The
clock is injectable so expiry needs no sleeping in tests.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Callable, Optional

from dpbert.storage.api import storage_for
from dpbert.storage.base import LockHeld, LockLost, PreconditionFailed, Storage

log = logging.getLogger(__name__)


def default_owner() -> str:
    """``hostname:pid:random``: distinct for every process and every lock object."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _parse(data: bytes) -> dict:
    """The lease body; an unreadable one counts as expired (it cannot block forever)."""
    try:
        body = json.loads(data.decode("utf-8"))
        return {"owner": str(body["owner"]), "expires_at": float(body["expires_at"])}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"owner": "?", "expires_at": 0.0}


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def held_message(uri: str, holder: dict, now: float) -> str:
    """Why the lock is refused and what to do: its holder may be alive (wait) or dead (a killed
    process keeps its lease until it expires; then the next run takes it over by itself)."""
    expires = holder["expires_at"]
    seconds = max(0, math.ceil(expires - now))
    return (f"lock {uri} is held by {holder['owner']} until {_when(expires)} ({seconds} s from now); "
            f"if that process is still running, wait for it to finish; if it died, its lease is stale "
            f"and expires then: re-run after {_when(expires)} and the lock is taken over")


class LeaseLock:
    """``with LeaseLock(join(state_dir, "lock"), ttl_s=120).keep_alive(): ...``"""

    def __init__(self, uri, *, ttl_s: float = 120.0, owner: Optional[str] = None,
                 clock: Callable[[], float] = time.time, storage: Optional[Storage] = None):
        if not ttl_s > 0:
            raise ValueError(f"LeaseLock ttl_s must be > 0, got {ttl_s}")
        self.uri, self.ttl_s, self.clock = str(uri), float(ttl_s), clock
        self.owner = owner or default_owner()
        self.storage = storage or storage_for(self.uri)
        self.held = False
        self.lost: Optional[LockLost] = None
        self._gen: Optional[int] = None
        self._sent = b""
        self._acquired_at = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _body(self) -> bytes:
        """The lease we are about to write (kept: only our own write can produce these bytes)."""
        self._sent = json.dumps({"owner": self.owner, "acquired_at": self._acquired_at,
                                 "expires_at": self.clock() + self.ttl_s}).encode("utf-8")
        return self._sent

    def acquire(self) -> "LeaseLock":
        """Create the lease, or take over an expired one; LockHeld when it is live."""
        self._acquired_at = self.clock()
        for _ in range(5):
            try:
                self._gen = self.storage.write_bytes(self.uri, self._body(), if_generation_match=0)
                break
            except PreconditionFailed:
                pass
            try:
                data, stale = self.storage.read(self.uri)
            except FileNotFoundError:
                continue  # released in between: try to create it again
            if data == self._sent:  # our create went through but its reply was lost (a retry)
                self._gen = stale
                break
            holder = _parse(data)
            if holder["expires_at"] > self.clock():
                raise LockHeld(held_message(self.uri, holder, self.clock()), holder)
            try:
                self._gen = self.storage.write_bytes(self.uri, self._body(), if_generation_match=stale)
                log.warning("lock %s: took over the expired lease of %s", self.uri, holder["owner"])
                break
            except PreconditionFailed:
                continue  # another taker won: the next round reports it as held
        else:
            raise LockHeld(f"lock {self.uri} is contended: gave up after 5 rounds")
        self.held, self.lost = True, None
        return self

    def renew(self) -> None:
        """Push the expiry ``ttl_s`` ahead; LockLost if the lease is no longer ours."""
        if not self.held:
            raise LockLost(f"lock {self.uri} is not held by {self.owner}")
        try:
            self._gen = self.storage.write_bytes(self.uri, self._body(), if_generation_match=self._gen)
        except (PreconditionFailed, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                data, gen = self.storage.read(self.uri)
                if data == self._sent:  # our renewal went through but its reply was lost
                    self._gen = gen
                    return
            self.held = False
            raise LockLost(f"lock {self.uri} was taken over or removed; {self.owner} lost it") from None

    def release(self) -> bool:
        """Delete the lease if it is still ours; True if it was. Stops ``keep_alive``."""
        self._stop_thread()
        if not self.held:
            return False
        self.held = False
        try:
            self.storage.delete(self.uri, if_generation_match=self._gen)
            return True
        except (PreconditionFailed, FileNotFoundError):
            log.warning("lock %s: not released, %s no longer held it", self.uri, self.owner)
            return False

    def check(self) -> None:
        """Raise the LockLost that the keep-alive thread met, if any."""
        if self.lost is not None:
            raise self.lost

    def keep_alive(self, interval_s: Optional[float] = None) -> "LeaseLock":
        """Renew every ``interval_s`` (default ttl/3) in a daemon thread until ``release()``.
        A lost lease stops it and is kept in ``.lost`` (``check()`` raises it)."""
        self._stop_thread()
        self._stop = threading.Event()
        interval = self.ttl_s / 3 if interval_s is None else float(interval_s)
        self._thread = threading.Thread(target=self._renew_loop, args=(interval, self._stop),
                                        name=f"lease-{self.uri}", daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                self.renew()
            except LockLost as err:
                self.lost = err
                log.error("%s", err)
                return
            except Exception as err:  # a transient storage error: retry on the next tick
                log.warning("lock %s: renew failed (%s), retrying", self.uri, type(err).__name__)

    def _stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def __enter__(self) -> "LeaseLock":
        return self if self.held else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
