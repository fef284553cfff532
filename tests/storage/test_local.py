"""Local folders: compare-and-swap across processes, generations that belong to the data read,
no ABA, bookkeeping hidden; plus the URI helpers and that dpbert.storage imports no TensorFlow."""
import os
import subprocess
import sys

import pytest

from dpbert.storage import PreconditionFailed, is_remote, join, read_json, storage_for
from dpbert.storage.fake import FakeStorage
from dpbert.storage.gcs import GCSStorage
from dpbert.storage.gfile import GFileStorage
from dpbert.storage.local import LOCK_NAME, LocalStorage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_INCREMENT = """
import sys
from dpbert.storage import update_json
for _ in range(int(sys.argv[2])):
    update_json(sys.argv[1], lambda v: {"n": v.get("n", 0) + 1}, retries=1000)
"""


def test_processes_racing_update_json_lose_no_increment(tmp_path):
    uri, procs, each = str(tmp_path / "shared" / "counter.json"), 4, 20
    running = [subprocess.Popen([sys.executable, "-c", _INCREMENT, uri, str(each)], cwd=ROOT)
               for _ in range(procs)]
    assert [p.wait(timeout=120) for p in running] == [0] * procs
    assert read_json(uri) == {"n": procs * each}


def test_read_returns_the_generation_of_the_version_it_read(tmp_path):
    storage, uri = LocalStorage(), str(tmp_path / "x")
    gen = storage.write_bytes(uri, b"a")
    with open(uri, "rb") as held:                              # a reader keeps the old version open
        storage.write_bytes(uri, b"b")
        assert held.read() == b"a" and os.fstat(held.fileno()).st_mtime_ns // 1000 == gen
    assert storage.read(uri)[0] == b"b" and storage.read(uri)[1] > gen


def test_a_failed_precondition_leaves_no_temp_file_and_bookkeeping_is_hidden(tmp_path):
    storage, folder = LocalStorage(), tmp_path / "f"
    storage.write_bytes(str(folder / "x"), b"1")
    with pytest.raises(PreconditionFailed):
        storage.write_bytes(str(folder / "x"), b"2", if_generation_match=0)
    assert sorted(os.listdir(folder)) == sorted([LOCK_NAME, "x"])
    assert storage.listdir(str(folder)) == ["x"] and storage.glob(str(folder / "*")) == [str(folder / "x")]
    assert storage.glob(str(folder / ".*")) == []


def test_file_uris_are_local(tmp_path):
    uri = "file://" + str(tmp_path / "y.json")
    assert storage_for(uri) is storage_for(str(tmp_path)) and not is_remote(uri)
    storage_for(uri).write_bytes(uri, b"{}")
    assert (tmp_path / "y.json").read_bytes() == b"{}" and storage_for(uri).glob(uri) == [uri]


def test_storage_for_picks_the_backend_by_scheme():
    assert isinstance(storage_for("/tmp/x"), LocalStorage) and isinstance(storage_for("rel/x"), LocalStorage)
    assert isinstance(storage_for("fake://b/x"), FakeStorage)
    assert isinstance(storage_for("ram://x"), GFileStorage) and isinstance(storage_for("hdfs://n/x"), GFileStorage)
    assert type(storage_for("gs://b/x")) is GCSStorage       # no client is made until first use
    assert [is_remote(u) for u in ("gs://b", "ram://x", "fake://b", "/a", "a/b")] == [True] * 3 + [False] * 2


def test_join_keeps_the_scheme():
    assert join("gs://b", "x", "y.json") == "gs://b/x/y.json"
    assert join("gs://b/", "/x") == "gs://b/x" and join("ram://t/", "a") == "ram://t/a"
    assert join("/tmp/a", "b") == "/tmp/a/b" and join("rel") == "rel"


def test_importing_the_layer_loads_neither_tensorflow_nor_the_gcs_client(tmp_path):
    code = ("import sys, dpbert.storage as s; s.update_json(sys.argv[1], lambda v: v); "
            "print(sorted(m for m in ('tensorflow', 'google.cloud.storage') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.json")], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
