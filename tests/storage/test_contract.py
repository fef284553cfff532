"""The contract every backend meets (local folder, ram://, fake://, gs:// with a fake client and on
fake-gcs-server):
atomic whole-object writes with generations, compare-and-swap preconditions, folders, listings,
the JSON helpers and update_json."""
import threading

import pytest

from dpbert.storage import (PreconditionFailed, join, read_json, read_text, update_json, write_json,
                            write_text)
from dpbert.storage.base import Storage
from tests.storage.conftest import DELETE_PRECONDITION, server_gap


def test_write_then_read_returns_the_data_and_one_generation(backend):
    storage, root = backend
    uri = join(root, "a", "b", "x.bin")                       # parents are created
    gen = storage.write_bytes(uri, b"\x00data")
    assert storage.read(uri) == (b"\x00data", gen) and storage.read_bytes(uri) == b"\x00data"
    assert storage.generation(uri) == gen and storage.exists(uri) and not storage.isdir(uri)
    assert storage.isdir(join(root, "a", "b")) and storage.listdir(join(root, "a", "b")) == ["x.bin"]


def test_a_missing_object(backend):
    storage, root = backend
    uri = join(root, "nope")
    for call in (storage.read, storage.read_bytes, storage.delete):
        with pytest.raises(FileNotFoundError):
            call(uri)
    assert storage.generation(uri) is None and not storage.exists(uri) and not storage.isdir(uri)


def test_generation_zero_means_must_not_exist(backend):
    storage, root = backend
    uri = join(root, "once")
    first = storage.write_bytes(uri, b"first", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        storage.write_bytes(uri, b"second", if_generation_match=0)
    assert storage.read(uri) == (b"first", first)


def test_a_stale_generation_writes_nothing_and_a_current_one_swaps(backend):
    storage, root = backend
    uri = join(root, "cas")
    old = storage.write_bytes(uri, b"v1")
    new = storage.write_bytes(uri, b"v2", if_generation_match=old)
    assert new > old
    with pytest.raises(PreconditionFailed):
        storage.write_bytes(uri, b"v3", if_generation_match=old)
    with pytest.raises(PreconditionFailed):
        storage.write_bytes(join(root, "missing"), b"v", if_generation_match=old)
    assert storage.read(uri) == (b"v2", new) and not storage.exists(join(root, "missing"))


@server_gap(DELETE_PRECONDITION)
def test_delete_is_generation_matched(backend):
    storage, root = backend
    uri = join(root, "d")
    gen = storage.write_bytes(uri, b"1")
    with pytest.raises(PreconditionFailed):
        storage.delete(uri, if_generation_match=gen + 12345)
    assert storage.read(uri) == (b"1", gen)
    storage.delete(uri, if_generation_match=gen)
    assert not storage.exists(uri)


def test_recreating_a_deleted_object_never_reuses_a_generation(backend):
    storage, root = backend
    uri = join(root, "d")
    seen = {storage.write_bytes(uri, b"1")}
    for _ in range(5):  # delete and re-create at once, same size: still a new generation (no ABA)
        storage.delete(uri, if_generation_match=storage.generation(uri))
        assert not storage.exists(uri)
        seen.add(storage.write_bytes(uri, b"1"))
    assert len(seen) == 6


def test_folders_listings_and_glob(backend):
    storage, root = backend
    storage.makedirs(join(root, "empty"))
    for name in ("a/1.json", "a/2.json", "a/sub/3.json", "b.txt"):
        storage.write_bytes(join(root, name), b"{}")
    assert storage.isdir(join(root, "empty")) and storage.isdir(root)
    assert storage.listdir(root) == ["a", "b.txt", "empty"]
    assert storage.listdir(join(root, "a")) == ["1.json", "2.json", "sub"]
    assert storage.glob(join(root, "a", "*.json")) == [join(root, "a", "1.json"), join(root, "a", "2.json")]
    assert storage.glob(join(root, "*", "sub")) == [join(root, "a", "sub")]
    with pytest.raises(FileNotFoundError):
        storage.listdir(join(root, "nope"))


def test_copytree_and_rmtree(backend):
    storage, root = backend
    for name in ("src/x", "src/deep/y"):
        storage.write_bytes(join(root, name), name.encode())
    storage.copytree(join(root, "src"), join(root, "dst"))
    assert storage.read_bytes(join(root, "dst", "deep", "y")) == b"src/deep/y"
    assert storage.listdir(join(root, "dst")) == ["deep", "x"]
    storage.rmtree(join(root, "src"))
    assert not storage.exists(join(root, "src", "x")) and not storage.isdir(join(root, "src"))
    storage.rmtree(join(root, "src"))                          # missing: a no-op
    assert storage.read_bytes(join(root, "dst", "x")) == b"src/x"


def test_json_and_text_helpers(backend):
    _, root = backend
    uri = join(root, "state", "config.json")
    gen = write_json(uri, {"b": [1, 2], "a": "é"})
    assert read_json(uri) == {"a": "é", "b": [1, 2]}
    assert read_json(join(root, "none.json"), default=None) is None
    with pytest.raises(FileNotFoundError):
        read_json(join(root, "none.json"))
    with pytest.raises(PreconditionFailed):
        write_json(uri, {}, if_generation_match=gen + 1)
    write_text(join(root, "t.txt"), "héllo\n")
    assert read_text(join(root, "t.txt")) == "héllo\n"
    write_text(join(root, "bad.json"), "{not json")
    with pytest.raises(ValueError, match="bad.json"):
        read_json(join(root, "bad.json"))


def test_update_json_creates_then_increments_from_threads(backend):
    _, root = backend
    uri = join(root, "counter.json")
    assert update_json(uri, lambda v: {"n": v.get("n", 0) + 1}) == {"n": 1}

    def bump():
        for _ in range(10):
            update_json(uri, lambda v: v.update(n=v["n"] + 1), retries=200)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert read_json(uri) == {"n": 41}


class _IgnoresPreconditions(Storage):
    """A deliberately broken backend (positive control): writes ignore ``if_generation_match``."""

    def __init__(self, inner):
        self.inner = inner

    def read(self, uri):
        return self.inner.read(uri)

    def write_bytes(self, uri, data, *, if_generation_match=None, private=False):
        return self.inner.write_bytes(uri, data)


@pytest.mark.parametrize("broken", [False, True])
def test_update_json_retries_a_lost_race_and_a_broken_cas_loses_the_update(backend, monkeypatch, broken):
    storage, root = backend
    uri = join(root, "race.json")
    write_json(uri, {"n": 0})
    if broken:
        monkeypatch.setattr("dpbert.storage.api.storage_for", lambda _: _IgnoresPreconditions(storage))
    raced = []

    def bump(value):
        if not raced:  # another writer commits while we compute
            raced.append(1)
            write_json(uri, {"n": value["n"] + 100})
        return {"n": value["n"] + 1}

    update_json(uri, bump)
    assert read_json(uri) == ({"n": 1} if broken else {"n": 101})


def test_update_json_gives_up_after_its_retries(backend):
    _, root = backend
    uri = join(root, "hot.json")
    write_json(uri, {"n": 0})
    calls = []

    def always_raced(value):
        calls.append(1)
        write_json(uri, {"n": len(calls)})
        return {"n": -1}

    with pytest.raises(PreconditionFailed):
        update_json(uri, always_raced, retries=3)
    assert len(calls) == 3 and read_json(uri) == {"n": 3}


def test_ram_listing_keeps_only_the_folders_own_names():
    """TF's ram:// listing matches by prefix: listing .../1 also returned "7" of a sibling .../17."""
    from dpbert import storage

    root = "ram://listing-prefix-test"
    store = storage.storage_for(root)
    store.write_bytes(f"{root}/1/a", b"x")
    store.write_bytes(f"{root}/17/b", b"y")
    assert store.listdir(f"{root}/1") == ["a"]
    store.rmtree(root)
    assert not store.exists(f"{root}/1/a") and not store.exists(f"{root}/17/b")
