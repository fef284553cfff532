"""dpbert's one storage layer: every artifact, state, checkpoint and ledger path is read and
written through it, so the same code runs on a local folder, ``gs://`` (Vertex AI), ``ram://``
and the in-process ``fake://`` used by tests.

Objects are written whole and atomically and carry a generation number, so read-modify-write is a
compare-and-swap (``update_json``) and a lock is a lease object (``LeaseLock``) that a crashed
process cannot hold forever. A ``gs://`` URI without usable Google Cloud credentials raises
``CredentialsMissing`` (one line naming the URI and the fix). TensorFlow and the GCS client are imported only when a ``gs://`` or
gfile URI is used.
"""
from dpbert.storage.api import (read_json, read_text, storage_for, update_json, write_json,
                                write_text)
from dpbert.storage.base import (CredentialsMissing, LockHeld, LockLost, PreconditionFailed, Storage,
                                 is_remote, join, scheme)
from dpbert.storage.lease import LeaseLock

__all__ = [
    "PreconditionFailed", "LockHeld", "LockLost", "CredentialsMissing", "Storage", "storage_for", "join", "is_remote",
    "scheme", "read_json", "write_json", "read_text", "write_text", "update_json", "LeaseLock",
]
