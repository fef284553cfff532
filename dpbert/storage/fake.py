"""``fake://``: an in-process object store that enforces generations exactly like GCS (one
monotonic counter, ``if_generation_match=0`` = must not exist), for tests of code that will run
against ``gs://``. One registry per process; ``reset()`` empties it between tests.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Set, Tuple

from dpbert.storage.base import Storage, check_precondition, glob_match, split_segments

_LOCK = threading.RLock()
_OBJECTS: Dict[str, Tuple[bytes, int]] = {}
_DIRS: Set[str] = set()
_COUNTER = [0]


def reset() -> None:
    """Forget every fake object (test isolation)."""
    with _LOCK:
        _OBJECTS.clear()
        _DIRS.clear()


def _key(uri) -> str:
    uri = str(uri)
    if not uri.startswith("fake://"):
        raise ValueError(f"not a fake:// uri: {uri}")
    return "fake://" + "/".join(split_segments(uri[len("fake://"):]))


def _children(key: str) -> Set[str]:
    prefix = key.rstrip("/") + "/"
    names = [k for k in list(_OBJECTS) + list(_DIRS) if k.startswith(prefix)]
    return {k[len(prefix):].split("/")[0] for k in names}


class FakeStorage(Storage):
    """All instances share the one registry of this process."""

    reset = staticmethod(reset)

    def read(self, uri):
        with _LOCK:
            if _key(uri) not in _OBJECTS:
                raise FileNotFoundError(f"no such object: {uri}")
            return _OBJECTS[_key(uri)]

    def generation(self, uri) -> Optional[int]:
        with _LOCK:
            found = _OBJECTS.get(_key(uri))
            return found[1] if found else None

    def write_bytes(self, uri, data: bytes, *, if_generation_match=None, private: bool = False) -> int:
        key = _key(uri)
        with _LOCK:
            check_precondition(uri, self.generation(uri), if_generation_match)
            _COUNTER[0] += 1
            _OBJECTS[key] = (bytes(data), _COUNTER[0])
            return _COUNTER[0]

    def delete(self, uri, *, if_generation_match=None) -> None:
        with _LOCK:
            current = self.generation(uri)
            if current is None:
                raise FileNotFoundError(f"no such object: {uri}")
            check_precondition(uri, current, if_generation_match)
            del _OBJECTS[_key(uri)]

    def exists(self, uri) -> bool:
        with _LOCK:
            return _key(uri) in _OBJECTS or self.isdir(uri)

    def isdir(self, uri) -> bool:
        key = _key(uri)
        with _LOCK:
            return key in _DIRS or bool(_children(key)) or key == "fake://"

    def makedirs(self, uri) -> None:
        parts = split_segments(_key(uri)[len("fake://"):])
        with _LOCK:
            for i in range(1, len(parts) + 1):
                _DIRS.add("fake://" + "/".join(parts[:i]))

    def listdir(self, uri) -> List[str]:
        with _LOCK:
            if not self.isdir(uri):
                raise FileNotFoundError(f"no such folder: {uri}")
            return sorted(_children(_key(uri)))

    def glob(self, pattern) -> List[str]:
        pattern = _key(pattern)
        with _LOCK:
            names = set(_OBJECTS) | set(_DIRS)
            names |= {"fake://" + "/".join(split_segments(k[7:])[:i])
                      for k in _OBJECTS for i in range(1, len(split_segments(k[7:])))}
            return sorted(n for n in names if glob_match(pattern[7:], n[7:]))

    def copytree(self, src, dst) -> None:
        src, dst = _key(src), _key(dst)
        with _LOCK:
            for key in [k for k in _OBJECTS if k.startswith(src + "/")]:
                self.write_bytes(dst + key[len(src):], _OBJECTS[key][0])
            for key in [k for k in _DIRS if k.startswith(src + "/")]:
                self.makedirs(dst + key[len(src):])

    def rmtree(self, uri) -> None:
        prefix = _key(uri) + "/"
        with _LOCK:
            for key in [k for k in _OBJECTS if k.startswith(prefix)]:
                del _OBJECTS[key]
            for key in [k for k in _DIRS if k.startswith(prefix) or k == prefix[:-1]]:
                _DIRS.discard(key)
