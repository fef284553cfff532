"""A fake ``google.cloud.storage`` client with the subset GCSStorage uses, enforcing generations
like GCS (one monotonic counter; ``if_generation_match=0`` = must not exist; 412 / 404 raised as
google.api_core's PreconditionFailed / NotFound). The only offline test of the gs:// code.
"""
from __future__ import annotations

import threading

from google.api_core import exceptions as gexc


class FakeClient:
    def __init__(self):
        self.objects = {}  # (bucket, name) -> (data, generation)
        self.lock = threading.RLock()
        self.counter = 0
        self.calls = []

    def bucket(self, name):
        return FakeBucket(self, name)

    def list_blobs(self, bucket_or_name, prefix=None, max_results=None, **_):
        bucket = getattr(bucket_or_name, "name", bucket_or_name)
        with self.lock:
            names = sorted(n for b, n in self.objects if b == bucket and n.startswith(prefix or ""))
            blobs = [FakeBlob(FakeBucket(self, bucket), n, self.objects[(bucket, n)][1]) for n in names]
        return iter(blobs[:max_results] if max_results else blobs)

    def _check(self, key, expected):
        current = self.objects.get(key)
        if expected is not None and (current[1] if current else 0) != expected:
            raise gexc.PreconditionFailed(f"412 {key}")

    def _put(self, key, data):
        self.counter += 1
        self.objects[key] = (bytes(data), self.counter)
        return self.counter


class FakeBucket:
    def __init__(self, client, name):
        self.client, self.name = client, name

    def blob(self, name):
        return FakeBlob(self, name)

    def get_blob(self, name, **_):
        with self.client.lock:
            found = self.client.objects.get((self.name, name))
        return FakeBlob(self, name, found[1]) if found else None

    def copy_blob(self, blob, destination_bucket, new_name=None, **_):
        with self.client.lock:
            key = (self.name, blob.name)
            if key not in self.client.objects:
                raise gexc.NotFound(f"404 {key}")
            gen = self.client._put((destination_bucket.name, new_name), self.client.objects[key][0])
        return FakeBlob(destination_bucket, new_name, gen)


class FakeBlob:
    def __init__(self, bucket, name, generation=None):
        self.bucket, self.name, self.generation = bucket, name, generation

    @property
    def _key(self):
        return (self.bucket.name, self.name)

    def upload_from_string(self, data, content_type=None, if_generation_match=None, **_):
        client = self.bucket.client
        with client.lock:
            client.calls.append(("upload", self.name, if_generation_match))
            client._check(self._key, if_generation_match)
            self.generation = client._put(self._key, data)

    def download_as_bytes(self, if_generation_match=None, **_):
        client = self.bucket.client
        with client.lock:
            if self._key not in client.objects:
                raise gexc.NotFound(f"404 {self._key}")
            client._check(self._key, if_generation_match)
            return client.objects[self._key][0]

    def delete(self, if_generation_match=None, **_):
        client = self.bucket.client
        with client.lock:
            if self._key not in client.objects:
                raise gexc.NotFound(f"404 {self._key}")
            client._check(self._key, if_generation_match)
            del client.objects[self._key]
