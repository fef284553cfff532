"""Any other ``tf.io.gfile`` scheme (``ram://`` in tests, ``hdfs://``, ``s3://`` …).

gfile has no preconditions, so generations are emulated IN THIS PROCESS: a dict of
``uri -> generation`` and one ``threading.Lock`` around every compare + write. That is sound only
within one process (``ram://`` is per process anyway); two processes sharing a gfile store must
not rely on it. TensorFlow is imported on first use, not when dpbert.storage is imported. A
``gs://`` URI given to this backend directly (``storage_for`` sends gs:// to GCSStorage) raises
``CredentialsMissing`` when TensorFlow finds no credentials (``base.gs_credentials``).
"""
from __future__ import annotations

import threading
import uuid
from typing import Dict, List, Optional

from dpbert.storage.base import Storage, check_precondition, gs_credentials, join

_LOCK = threading.RLock()
_GENERATIONS: Dict[str, int] = {}
_COUNTER = [0]


def _gfile():
    import tensorflow as tf
    return tf.io.gfile


def _norm(uri) -> str:
    return str(uri).rstrip("/")


class GFileStorage(Storage):
    """Files through ``tf.io.gfile``; generations emulated per process (see module docstring)."""

    @gs_credentials
    def generation(self, uri) -> Optional[int]:
        with _LOCK:
            gfile = _gfile()
            if not gfile.exists(uri) or gfile.isdir(uri):
                _GENERATIONS.pop(_norm(uri), None)
                return None
            if _norm(uri) not in _GENERATIONS:  # written outside this layer: give it one now
                _COUNTER[0] += 1
                _GENERATIONS[_norm(uri)] = _COUNTER[0]
            return _GENERATIONS[_norm(uri)]

    @gs_credentials
    def read(self, uri):
        with _LOCK:
            gen = self.generation(uri)
            if gen is None:
                raise FileNotFoundError(f"no such file: {uri}")
            with _gfile().GFile(uri, "rb") as f:
                return f.read(), gen

    @gs_credentials
    def write_bytes(self, uri, data: bytes, *, if_generation_match=None, private: bool = False) -> int:
        gfile = _gfile()
        parent = _norm(uri).rsplit("/", 1)[0] if "/" in _norm(uri).split("://")[-1] else None
        with _LOCK:
            check_precondition(uri, self.generation(uri), if_generation_match)
            if parent:
                gfile.makedirs(parent)
            tmp = f"{_norm(uri)}.dpbert-tmp-{uuid.uuid4().hex}"
            with gfile.GFile(tmp, "wb") as f:
                f.write(bytes(data))
            gfile.rename(tmp, uri, overwrite=True)
            _COUNTER[0] += 1
            _GENERATIONS[_norm(uri)] = _COUNTER[0]
            return _COUNTER[0]

    @gs_credentials
    def delete(self, uri, *, if_generation_match=None) -> None:
        with _LOCK:
            current = self.generation(uri)
            if current is None:
                raise FileNotFoundError(f"no such file: {uri}")
            check_precondition(uri, current, if_generation_match)
            _gfile().remove(uri)
            _GENERATIONS.pop(_norm(uri), None)

    @gs_credentials
    def exists(self, uri) -> bool:
        return _gfile().exists(uri)

    @gs_credentials
    def isdir(self, uri) -> bool:
        return _gfile().isdir(uri)

    @gs_credentials
    def makedirs(self, uri) -> None:
        _gfile().makedirs(uri)

    @gs_credentials
    def listdir(self, uri) -> List[str]:
        if not self.isdir(uri):
            raise FileNotFoundError(f"no such folder: {uri}")
        names = {n.rstrip("/") for n in _gfile().listdir(uri)}
        # TF's ram:// listing matches by string prefix: listing .../1 also yields "7" from a
        # sibling .../17; keep only names that exist under this folder.
        base = _norm(uri).rstrip("/")
        return sorted(n for n in names if ".dpbert-tmp-" not in n and _gfile().exists(f"{base}/{n}"))

    @gs_credentials
    def glob(self, pattern) -> List[str]:
        return sorted(p for p in _gfile().glob(pattern) if ".dpbert-tmp-" not in p)

    @gs_credentials
    def copytree(self, src, dst) -> None:
        src = _norm(src)
        for folder, _dirs, files in _gfile().walk(src):
            rel = _norm(folder)[len(src):].lstrip("/")
            self.makedirs(join(dst, rel) if rel else dst)
            for name in files:
                self.write_bytes(join(dst, rel, name), self.read_bytes(join(folder, name)))

    @gs_credentials
    def rmtree(self, uri) -> None:
        with _LOCK:
            if self.exists(uri):
                try:
                    _gfile().rmtree(uri)
                except Exception:  # ram:// rmtree can fail on its own listing: delete file by file
                    for folder, _dirs, files in list(_gfile().walk(_norm(uri))):
                        for name in files:
                            _gfile().remove(f"{_norm(folder).rstrip('/')}/{name}")
            prefix = _norm(uri) + "/"
            for key in [k for k in _GENERATIONS if k.startswith(prefix)]:
                del _GENERATIONS[key]
