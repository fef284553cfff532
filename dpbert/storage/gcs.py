"""``gs://`` through ``google-cloud-storage``: real object generations and preconditions
(``if_generation_match``), so compare-and-swap and leases are atomic across machines.

Folders are prefixes; ``makedirs`` writes a ``name/`` placeholder as tf.io.gfile does. The client
is created on first use or injected (``GCSStorage(client=...)``). Offline, this module is tested
only against a fake client that enforces generations like GCS (tests/storage/fake_gcs.py);
real GCS is untested offline. Every method turns google.auth's "no credentials" errors into
``CredentialsMissing`` naming its URI (``base.gs_credentials``).
"""
from __future__ import annotations

import contextlib
import threading
from typing import List, Optional, Tuple

from dpbert.storage.base import (PreconditionFailed, Storage, glob_match, gs_credentials, literal_prefix,
                                 split_segments)


def split(uri) -> Tuple[str, str]:
    """``gs://bucket/a/b`` → ``("bucket", "a/b")``."""
    rest = str(uri)[len("gs://"):] if str(uri).startswith("gs://") else None
    if not rest or not rest.split("/")[0]:
        raise ValueError(f"not a gs://bucket/... uri: {uri}")
    bucket, _, name = rest.partition("/")
    return bucket, "/".join(split_segments(name))


@contextlib.contextmanager
def _translated(uri):
    """GCS errors → ours: 412 → PreconditionFailed, 404 → FileNotFoundError."""
    from google.api_core import exceptions as gexc
    try:
        yield
    except gexc.PreconditionFailed:
        raise PreconditionFailed(f"{uri}: generation precondition failed") from None
    except gexc.NotFound:
        raise FileNotFoundError(f"no such object: {uri}") from None


class GCSStorage(Storage):
    def __init__(self, client=None):
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                from google.cloud import storage
                self._client = storage.Client()
            return self._client

    def _blob(self, uri):
        bucket, name = split(uri)
        return self.client.bucket(bucket).blob(name)

    def _names(self, uri) -> List[str]:
        """Every object name under the folder ``uri`` (recursive)."""
        bucket, name = split(uri)
        prefix = name + "/" if name else ""
        return [b.name for b in self.client.list_blobs(bucket, prefix=prefix)]

    @gs_credentials
    def read(self, uri):
        from google.api_core import exceptions as gexc
        bucket, name = split(uri)
        for _ in range(5):  # replaced or deleted between metadata and download: look again
            with _translated(uri):
                blob = self.client.bucket(bucket).get_blob(name)
                if blob is None:
                    raise FileNotFoundError(f"no such object: {uri}")
                try:
                    data = blob.download_as_bytes(if_generation_match=blob.generation)
                    return data, int(blob.generation)
                except (gexc.PreconditionFailed, gexc.NotFound):
                    continue
        raise PreconditionFailed(f"{uri}: changed during every read attempt")

    @gs_credentials
    def generation(self, uri) -> Optional[int]:
        bucket, name = split(uri)
        blob = self.client.bucket(bucket).get_blob(name) if name else None
        return None if blob is None else int(blob.generation)

    @gs_credentials
    def write_bytes(self, uri, data: bytes, *, if_generation_match=None, private: bool = False) -> int:
        blob = self._blob(uri)
        with _translated(uri):
            blob.upload_from_string(bytes(data), content_type="application/octet-stream",
                                    if_generation_match=if_generation_match)
        return int(blob.generation)

    @gs_credentials
    def delete(self, uri, *, if_generation_match=None) -> None:
        with _translated(uri):
            self._blob(uri).delete(if_generation_match=if_generation_match)

    @gs_credentials
    def exists(self, uri) -> bool:
        return self.generation(uri) is not None or self.isdir(uri)

    @gs_credentials
    def isdir(self, uri) -> bool:
        bucket, name = split(uri)
        prefix = name + "/" if name else ""
        return not name or any(True for _ in self.client.list_blobs(bucket, prefix=prefix, max_results=1))

    @gs_credentials
    def makedirs(self, uri) -> None:
        bucket, name = split(uri)
        if name and not self.isdir(uri):
            with contextlib.suppress(PreconditionFailed), _translated(uri):
                self.client.bucket(bucket).blob(name + "/").upload_from_string(b"", if_generation_match=0)

    @gs_credentials
    def listdir(self, uri) -> List[str]:
        if not self.isdir(uri):
            raise FileNotFoundError(f"no such folder: {uri}")
        prefix = split(uri)[1]
        prefix = prefix + "/" if prefix else ""
        return sorted({n[len(prefix):].split("/")[0] for n in self._names(uri)} - {""})

    @gs_credentials
    def glob(self, pattern) -> List[str]:
        bucket, name = split(pattern)
        found = set()
        for obj in self.client.list_blobs(bucket, prefix=literal_prefix(name)):
            parts = split_segments(obj.name)
            found |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
        return sorted(f"gs://{bucket}/{n}" for n in found if glob_match(name, n))

    @gs_credentials
    def copytree(self, src, dst) -> None:
        (sb, sname), (db, dname) = split(src), split(dst)
        source, target = self.client.bucket(sb), self.client.bucket(db)
        for name in self._names(src):
            new = "/".join(split_segments(dname + "/" + name[len(sname):]))
            new = new + "/" if name.endswith("/") else new
            with _translated(src):
                source.copy_blob(source.blob(name), target, new)

    @gs_credentials
    def rmtree(self, uri) -> None:
        bucket = self.client.bucket(split(uri)[0])
        for name in self._names(uri):
            with contextlib.suppress(FileNotFoundError), _translated(uri):
                bucket.blob(name).delete()
