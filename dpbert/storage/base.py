"""The storage contract every backend meets: whole-object reads and atomic writes with a
generation number, so that read-modify-write (``update_json``, leases, ledgers) is a
compare-and-swap on any backend — a local folder, ``gs://`` or an in-process fake.

URI helpers live here too: a scheme URI (``gs://b/x``) is joined with ``posixpath`` so the scheme
survives; a plain path (or ``file://``) is local.
"""
from __future__ import annotations

import fnmatch
import functools
import posixpath
import re
import sys
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


#: What a person does about missing Google Cloud credentials (the tail of CredentialsMissing).
CREDENTIALS_FIX = ("run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a "
                   "service account key file")


class CredentialsMissing(RuntimeError):
    """A ``gs://`` URI needed Google Cloud credentials and the environment has none that work.

    One line naming the URI, the client's error type (``cause``, kept as ``__cause__`` too) and
    the fix; the CLI prints it and exits 4 (the environment refused), never a traceback. Not an
    OSError: callers that treat a missing file as "nothing there yet" must not swallow it."""

    def __init__(self, uri, cause: Optional[BaseException] = None):
        self.uri, self.cause = str(uri), cause
        why = "" if cause is None else f" ({_error_name(cause)})"  # the client's words, one line
        super().__init__(f"{self.uri}: no usable Google Cloud credentials{why}: {CREDENTIALS_FIX}")


def _error_name(err: BaseException) -> str:
    """``google.auth DefaultCredentialsError``: the package and class of a client's error."""
    package = ".".join(type(err).__module__.split(".")[:2])
    detail = (str(err).strip().splitlines() or [""])[0][:200]
    return f"{package} {type(err).__name__}" + (f": {detail}" if detail else "")


def is_credentials_error(err: BaseException) -> bool:
    """Whether a client's error says the environment has no usable Google Cloud credentials:
    google.auth's DefaultCredentialsError (none found) or RefreshError (found, but no token could
    be had: expired, revoked), as google-cloud-storage raises them, or TensorFlow's
    UnauthenticatedError (tf.io.gfile's gs://). By type, from modules already imported: an error
    of one of these types means its module is loaded, so nothing is imported here."""
    kinds = []
    auth = sys.modules.get("google.auth.exceptions")
    if auth is not None:
        kinds += [auth.DefaultCredentialsError, auth.RefreshError]
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    if tf_errors is not None:
        kinds.append(tf_errors.UnauthenticatedError)
    return bool(kinds) and isinstance(err, tuple(kinds))


def gs_credentials(method):
    """Decorate a backend method whose first argument is a URI: on a ``gs://`` URI, a credentials
    error (``is_credentials_error``, raised creating the client or refreshing its token on any
    request) becomes CredentialsMissing naming that URI."""

    @functools.wraps(method)
    def wrapper(self, uri, *args, **kwargs):
        try:
            return method(self, uri, *args, **kwargs)
        except CredentialsMissing:
            raise
        except Exception as err:
            if scheme(str(uri)) != "gs" or not is_credentials_error(err):
                raise
            raise CredentialsMissing(uri, err) from err

    return wrapper


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
