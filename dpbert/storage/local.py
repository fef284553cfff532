"""Local folders (plain paths and ``file://``): the ONE module of dpbert that calls ``os``,
``open``, ``fcntl`` and ``shutil`` on state and artifacts.

Atomic write: a temp file in the same folder, fsync, ``os.replace``. Generations: each write
stamps its file's mtime with a fresh microsecond number, strictly increasing per folder (the last
one is kept in the folder's ``.dpbert-storage.lock``), and the compare + write runs under
``fcntl.flock`` on that file, so a compare-and-swap is atomic across processes and never sees
the same generation twice at one path (no ABA after delete and re-create). A reader ``fstat``s
the file it opened, so data and generation always belong together. Needs a filesystem that
keeps microsecond mtimes (ext4, xfs, tmpfs, overlayfs); a write checks this.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob as _glob
import os
import shutil
import tempfile
import time
from typing import List, Optional

from dpbert.storage.base import Storage, check_precondition

LOCK_NAME = ".dpbert-storage.lock"
TMP_PREFIX = ".dpbert-tmp-"


def _path(uri) -> str:
    uri = os.fspath(uri)
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _ours(name: str) -> bool:
    """Our bookkeeping files, hidden from listings and copies."""
    return name == LOCK_NAME or name.startswith(TMP_PREFIX)


def _gen_of(stat: os.stat_result) -> int:
    return stat.st_mtime_ns // 1000


@contextlib.contextmanager
def _folder_lock(folder: str):
    """An exclusive ``flock`` on the folder's lock file (released when its fd closes)."""
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _next_generation(lock_fd: int, current: Optional[int]) -> int:
    """max(now in µs, the folder's last + 1, current + 1); remembered in the lock file."""
    raw = os.pread(lock_fd, 32, 0).strip()
    last = int(raw) if raw.isdigit() else 0
    gen = max(time.time_ns() // 1000, last + 1, (current or 0) + 1)
    os.pwrite(lock_fd, b"%20d\n" % gen, 0)
    return gen


class LocalStorage(Storage):
    """A POSIX folder tree. Safe across threads and processes on one filesystem."""

    def read(self, uri):
        with open(_path(uri), "rb") as f:
            gen = _gen_of(os.fstat(f.fileno()))
            return f.read(), gen

    def generation(self, uri) -> Optional[int]:
        try:
            stat = os.stat(_path(uri))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if os.path.isdir(_path(uri)) else _gen_of(stat)

    def _install(self, uri, fill, if_generation_match: Optional[int], private: bool = False) -> int:
        """Write a temp file with ``fill(fileobj)``, then swap it in under the folder lock
        (mode 0600 when ``private``: operator-only secrets such as keys and salts)."""
        path = _path(uri)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600 if private else 0o644)
            with _folder_lock(folder) as lock:
                current = self.generation(path)
                check_precondition(uri, current, if_generation_match)
                gen = _next_generation(lock, current)
                os.utime(tmp, ns=(gen * 1000, gen * 1000))
                if _gen_of(os.stat(tmp)) != gen:
                    raise OSError(f"{folder}: the filesystem does not keep microsecond mtimes")
                os.replace(tmp, path)
            return gen
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def write_bytes(self, uri, data: bytes, *, if_generation_match=None, private: bool = False) -> int:
        return self._install(uri, lambda f: f.write(bytes(data)), if_generation_match, private)

    def delete(self, uri, *, if_generation_match=None) -> None:
        path = _path(uri)
        folder = os.path.dirname(os.path.abspath(path))
        if self.generation(path) is None:
            raise FileNotFoundError(f"no such file: {uri}")
        with _folder_lock(folder):
            current = self.generation(path)
            if current is None:
                raise FileNotFoundError(f"no such file: {uri}")
            check_precondition(uri, current, if_generation_match)
            os.unlink(path)

    def exists(self, uri) -> bool:
        return os.path.exists(_path(uri))

    def isdir(self, uri) -> bool:
        return os.path.isdir(_path(uri))

    def makedirs(self, uri) -> None:
        os.makedirs(_path(uri), exist_ok=True)

    def listdir(self, uri) -> List[str]:
        return sorted(n for n in os.listdir(_path(uri)) if not _ours(n))

    def glob(self, pattern) -> List[str]:
        prefix = "file://" if os.fspath(pattern).startswith("file://") else ""
        found = _glob.glob(_path(pattern))
        return sorted(prefix + p for p in found if not _ours(os.path.basename(p)))

    def copytree(self, src, dst) -> None:
        src, dst = _path(src), _path(dst)
        for folder, dirs, files in os.walk(src):
            target = os.path.join(dst, os.path.relpath(folder, src))
            os.makedirs(target, exist_ok=True)
            for name in (n for n in files if not _ours(n)):
                with open(os.path.join(folder, name), "rb") as source:
                    self._install(os.path.join(target, name),
                                  lambda f, s=source: shutil.copyfileobj(s, f, 1 << 20), None)

    def rmtree(self, uri) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(_path(uri))
