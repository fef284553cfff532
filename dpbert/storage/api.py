"""``storage_for(uri)`` picks the backend from the URI's scheme; the JSON/text helpers and
``update_json`` (read-modify-write by compare-and-swap) work on any URI through it.
"""
from __future__ import annotations

import copy
import json
import random
import threading
import time
from typing import Any, Callable, Optional

from dpbert.storage.base import PreconditionFailed, Storage, scheme

_RAISE = object()
_SINGLETONS: dict = {}
_SINGLETONS_LOCK = threading.Lock()


def _make(kind: str) -> Storage:
    if kind == "gs":
        from dpbert.storage.gcs import GCSStorage
        return GCSStorage()
    if kind == "fake":
        from dpbert.storage.fake import FakeStorage
        return FakeStorage()
    if kind == "local":
        from dpbert.storage.local import LocalStorage
        return LocalStorage()
    from dpbert.storage.gfile import GFileStorage
    return GFileStorage()


def storage_for(uri) -> Storage:
    """``gs://`` → GCSStorage; ``fake://`` → FakeStorage; ``file://`` or a plain path →
    LocalStorage; any other scheme (``ram://``, ``hdfs://`` …) → GFileStorage (tf.io.gfile).
    One instance per kind and process (GFileStorage's emulated generations live in it)."""
    kind = scheme(str(uri))
    kind = "local" if kind in ("", "file") else kind if kind in ("gs", "fake") else "gfile"
    with _SINGLETONS_LOCK:
        if kind not in _SINGLETONS:
            _SINGLETONS[kind] = _make(kind)
        return _SINGLETONS[kind]


def read_text(uri) -> str:
    return storage_for(uri).read_bytes(uri).decode("utf-8")


def write_text(uri, text: str, *, if_generation_match: Optional[int] = None, private: bool = False) -> int:
    return storage_for(uri).write_bytes(uri, text.encode("utf-8"), if_generation_match=if_generation_match,
                                        private=private)


def _decode(uri, data: bytes):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{uri}: not valid JSON ({type(err).__name__} at position "
                         f"{getattr(err, 'pos', getattr(err, 'start', '?'))})") from None


def _encode(data) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def read_json(uri, default: Any = _RAISE):
    """The parsed JSON at ``uri``; ``default`` when missing (FileNotFoundError if none given)."""
    try:
        data = storage_for(uri).read_bytes(uri)
    except FileNotFoundError:
        if default is _RAISE:
            raise
        return default
    return _decode(uri, data)


def write_json(uri, data, *, if_generation_match: Optional[int] = None, private: bool = False) -> int:
    return storage_for(uri).write_bytes(uri, _encode(data), if_generation_match=if_generation_match,
                                        private=private)


def update_json(uri, fn: Callable[[Any], Any], *, default=None, retries: int = 20):
    """Read-modify-write by compare-and-swap: ``fn`` gets a fresh copy of the current value
    (``default`` or ``{}`` when missing) and returns the new one (None: keep its mutated
    argument). It reruns on every lost race, so it must not have side effects; after
    ``retries`` lost races PreconditionFailed propagates. On gs:// a write whose reply was lost
    and whose automatic retry got 412 looks like a lost race, so ``fn`` can be applied twice:
    an update that must happen exactly once should carry its own id and check it in ``fn``."""
    storage = storage_for(uri)
    for attempt in range(retries):
        try:
            data, gen = storage.read(uri)
            value = _decode(uri, data)
        except FileNotFoundError:
            value, gen = copy.deepcopy({} if default is None else default), 0
        new = fn(value)
        new = value if new is None else new
        try:
            storage.write_bytes(uri, _encode(new), if_generation_match=gen)
            return new
        except PreconditionFailed:
            if attempt == retries - 1:
                raise
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** attempt)))
    raise PreconditionFailed(f"{uri}: retries must be at least 1")
