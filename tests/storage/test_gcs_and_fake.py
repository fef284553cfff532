"""gs:// against the fake client (the only offline test of GCSStorage: real GCS is untested
here) and fake://'s registry."""
import pytest

from dpbert.storage import PreconditionFailed, fake, join
from dpbert.storage.fake import FakeStorage
from dpbert.storage.gcs import GCSStorage, split
from tests.storage.fake_gcs import FakeBlob, FakeClient


def test_preconditions_reach_the_client_and_its_errors_become_ours():
    client = FakeClient()
    storage = GCSStorage(client=client)
    gen = storage.write_bytes("gs://b/x", b"1", if_generation_match=0)
    assert client.calls[-1] == ("upload", "x", 0) and client.objects[("b", "x")] == (b"1", gen)
    with pytest.raises(PreconditionFailed):
        storage.write_bytes("gs://b/x", b"2", if_generation_match=gen + 1)
    with pytest.raises(PreconditionFailed):
        storage.delete("gs://b/x", if_generation_match=gen + 1)
    with pytest.raises(FileNotFoundError):
        storage.read("gs://b/y")
    assert client.objects[("b", "x")] == (b"1", gen)


def test_read_looks_again_when_the_object_changes_during_a_read(monkeypatch):
    client = FakeClient()
    storage = GCSStorage(client=client)
    storage.write_bytes("gs://b/x", b"old")
    original, replaced = FakeBlob.download_as_bytes, []

    def racing_download(blob, **kwargs):
        if not replaced:  # another writer replaces the object between metadata and download
            replaced.append(storage.write_bytes("gs://b/x", b"new"))
        return original(blob, **kwargs)

    monkeypatch.setattr(FakeBlob, "download_as_bytes", racing_download)
    assert storage.read("gs://b/x") == (b"new", replaced[0])


def test_folders_are_prefixes_with_gfile_style_placeholders():
    client = FakeClient()
    storage = GCSStorage(client=client)
    storage.makedirs("gs://b/run/empty")
    assert ("b", "run/empty/") in client.objects and storage.isdir("gs://b/run/empty")
    assert storage.listdir("gs://b/run/empty") == [] and storage.listdir("gs://b/run") == ["empty"]
    assert split("gs://b/run//x/") == ("b", "run/x")
    with pytest.raises(ValueError):
        split("gs:///x")


def test_the_client_is_made_on_first_use_only():
    assert GCSStorage()._client is None


def test_fake_reset_forgets_everything():
    storage = FakeStorage()
    storage.write_bytes("fake://b/x", b"1")
    storage.makedirs("fake://b/d")
    fake.reset()
    assert not storage.exists("fake://b/x") and not storage.isdir("fake://b/d")
    with pytest.raises(ValueError):
        storage.read("gs://b/x")


def test_fake_generations_are_global_and_monotonic():
    storage = FakeStorage()
    gens = [storage.write_bytes(join("fake://b", name), b"") for name in ("x", "y", "x")]
    assert gens == sorted(gens) and len(set(gens)) == 3
