"""The storage contract every backend meets: whole-object reads and atomic writes with a
generation number, so that read-modify-write (``update_json``, leases, ledgers) is a
compare-and-swap on any backend — a local folder, ``gs://`` or an in-process fake.

URI helpers live here too: a scheme URI (``gs://b/x``) is joined with ``posixpath`` so the scheme
survives; a plain path (or ``file://``) is local.
"""
from __future__ import annotations

import fnmatch
import posixpath
import re
from typing import List, Optional, Tuple

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class PreconditionFailed(Exception):
    """A generation precondition did not hold; nothing was written or deleted."""


class LockHeld(RuntimeError):
    """The lease is held by someone else and has not expired; ``.holder`` is its lease body."""

    def __init__(self, message: str, holder: Optional[dict] = None):
        super().__init__(message)
        self.holder = dict(holder or {})


class LockLost(RuntimeError):
    """Our lease was taken over (it expired and another owner acquired it) or deleted."""


def scheme(uri: str) -> str:
    """``"gs"`` for ``gs://b/x``; ``""`` for a plain path."""
    match = _SCHEME.match(str(uri))
    return match.group(1).lower() if match else ""


def is_remote(uri) -> bool:
    """True for any scheme URI except ``file://`` (those are not POSIX paths on this machine)."""
    return scheme(str(uri)) not in ("", "file")


def join(uri, *parts: str) -> str:
    """Join path parts; a scheme URI keeps its scheme (a part's leading ``/`` does not reset it)."""
    uri = str(uri)
    if not scheme(uri):
        return posixpath.join(uri, *[str(p) for p in parts]) if parts else uri
    out = uri
    for part in parts:
        part = str(part).lstrip("/")
        out = part if not out else (out + part if out.endswith("/") else out + "/" + part)
    return out


def split_segments(path: str) -> List[str]:
    return [s for s in path.split("/") if s]


def glob_match(pattern: str, name: str) -> bool:
    """Glob ``name`` against ``pattern`` segment by segment (``*`` never crosses a ``/``)."""
    pat, parts = split_segments(pattern), split_segments(name)
    return len(pat) == len(parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pat))


def literal_prefix(pattern: str) -> str:
    """The part of a glob pattern before its first wildcard (a listing prefix)."""
    cut = min([i for i, c in enumerate(pattern) if c in "*?["], default=len(pattern))
    return pattern[:cut]


class Storage:
    """One backend. Every method takes a full URI (or path for ``LocalStorage``)."""

    def read_bytes(self, uri) -> bytes:
        return self.read(uri)[0]

    def read(self, uri) -> Tuple[bytes, int]:
        """``(data, generation)`` of one consistent version; FileNotFoundError when missing."""
        raise NotImplementedError

    def generation(self, uri) -> Optional[int]:
        """The current generation, None when the object is missing."""
        raise NotImplementedError

    def write_bytes(self, uri, data: bytes, *, if_generation_match: Optional[int] = None,
                    private: bool = False) -> int:
        """Atomically replace ``uri`` (creating parents); returns the new generation.

        ``private``: an operator-only secret (a key, a salt): mode 0600 on a local disk; on object
        storage access is the bucket's IAM, which the operator sets (docs/running-on-vertex.md).

        ``if_generation_match=0``: the object must not exist; ``g``: its generation must be ``g``.
        A mismatch raises PreconditionFailed and writes nothing.
        """
        raise NotImplementedError

    def delete(self, uri, *, if_generation_match: Optional[int] = None) -> None:
        """Delete one object; FileNotFoundError when missing, PreconditionFailed on a mismatch."""
        raise NotImplementedError

    def exists(self, uri) -> bool:
        raise NotImplementedError

    def isdir(self, uri) -> bool:
        raise NotImplementedError

    def makedirs(self, uri) -> None:
        raise NotImplementedError

    def listdir(self, uri) -> List[str]:
        """Sorted names (not paths) of the direct children; FileNotFoundError for a missing dir."""
        raise NotImplementedError

    def glob(self, pattern) -> List[str]:
        """Sorted full URIs matching ``pattern`` (``*`` does not cross ``/``)."""
        raise NotImplementedError

    def copytree(self, src, dst) -> None:
        """Copy every file under ``src`` to the same relative path under ``dst`` (merging)."""
        raise NotImplementedError

    def rmtree(self, uri) -> None:
        """Remove a folder and everything under it; a missing folder is a no-op."""
        raise NotImplementedError


def check_precondition(uri, current: Optional[int], expected: Optional[int]) -> None:
    """Raise PreconditionFailed unless ``expected`` is None or matches ``current`` (0 = missing)."""
    if expected is None:
        return
    if (current or 0) != int(expected):
        state = "exists" if current else "does not exist"
        raise PreconditionFailed(f"{uri}: generation precondition {expected} failed (object {state})")
