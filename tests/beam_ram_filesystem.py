"""Test-only Beam filesystem for TensorFlow's in-process ``ram://`` scheme.

Beam knows ``gs://``, ``s3://``, ``hdfs://`` and local paths; the in-process DAG test
(tests/e2e/test_dag_ram.py) keeps its pipeline root on ``ram://``, so the vocabulary's Beam job
must read the tuples and write its histogram there too. Every call delegates to ``tf.io.gfile``;
``ram://`` lives in THIS process's memory, so it only works with Beam's DirectRunner in
``in_memory`` mode (a ``multi_processing`` worker would see an empty filesystem).

Importing this module registers the filesystem (Beam finds FileSystem subclasses by scheme).
"""
from __future__ import annotations

from apache_beam.io.filesystem import (BeamIOError, CompressedFile, CompressionTypes, FileMetadata,
                                       FileSystem)

SCHEME = "ram"


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


class RamFileSystem(FileSystem):
    """``ram://`` through ``tf.io.gfile`` (see the module docstring)."""

    @classmethod
    def scheme(cls):
        return SCHEME

    def join(self, basepath, *paths):
        out = basepath.rstrip("/")
        for part in paths:
            out += "/" + part.strip("/")
        return out

    def split(self, path):
        if not path.startswith(SCHEME + "://"):
            raise ValueError(f"not a {SCHEME}:// path: {path}")
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path):
        _gfile().makedirs(path)

    def has_dirs(self):
        return True

    def _list(self, dir_or_prefix):
        gfile = _gfile()
        if not gfile.exists(dir_or_prefix):
            return
        try:
            for root, _dirs, files in gfile.walk(dir_or_prefix):
                for name in files:
                    path = self.join(root, name)
                    yield FileMetadata(path, gfile.stat(path).length, self.last_updated(path))
        except Exception as err:  # noqa: BLE001 -- Beam's contract: BeamIOError on a failed listing
            raise BeamIOError("List operation failed", {dir_or_prefix: err})

    def _open(self, path, mode, compression_type):
        compression_type = FileSystem._get_compression_type(path, compression_type)
        raw = _gfile().GFile(path, mode)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return raw
        return CompressedFile(raw, compression_type=compression_type)

    def create(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        parent = self.split(path)[0]
        if parent:
            _gfile().makedirs(parent)
        return self._open(path, "wb", compression_type)

    def open(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        return self._open(path, "rb", compression_type)

    def copy(self, source_file_names, destination_file_names):
        errors = {}
        for src, dst in zip(source_file_names, destination_file_names):
            try:
                _gfile().copy(src, dst, overwrite=True)
            except Exception as err:  # noqa: BLE001
                errors[(src, dst)] = err
        if errors:
            raise BeamIOError("Copy operation failed", errors)

    def rename(self, source_file_names, destination_file_names):
        errors = {}
        for src, dst in zip(source_file_names, destination_file_names):
            try:
                _gfile().rename(src, dst, overwrite=True)
            except Exception as err:  # noqa: BLE001
                errors[(src, dst)] = err
        if errors:
            raise BeamIOError("Rename operation failed", errors)

    def exists(self, path):
        return _gfile().exists(path)

    def size(self, path):
        return _gfile().stat(path).length

    def last_updated(self, path):
        return _gfile().stat(path).mtime_nsec / 1e9

    def checksum(self, path):
        if not self.exists(path):
            raise BeamIOError(f"Path does not exist: {path}")
        return str(self.size(path))

    def metadata(self, path):
        if not self.exists(path):
            raise BeamIOError(f"Path does not exist: {path}")
        return FileMetadata(path, self.size(path), self.last_updated(path))

    def delete(self, paths):
        gfile, errors = _gfile(), {}
        for path in paths:
            try:
                if gfile.isdir(path):
                    gfile.rmtree(path)
                else:
                    gfile.remove(path)
            except Exception as err:  # noqa: BLE001
                errors[path] = err
        if errors:
            raise BeamIOError("Delete operation failed", errors)
