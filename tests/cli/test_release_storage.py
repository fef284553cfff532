"""`dpbert release` reads a run's artifacts through dpbert.storage: artifacts on ram:// (tf.io.gfile)
and fake:// (GCS's semantics, in process) release the bundle a local run releases, byte for byte;
a remote `--to` is written object by object with manifest.json last, each object created only if
absent, and what was written is deleted on an error. The store is tests/dashboard/fakestore.py's."""
import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from dpbert import metadata, release, schema, storage
from dpbert_cli.main import main
from tests.dashboard import fakestore

SCHEMES = ("ram", "fake")


@pytest.fixture
def local(tmp_path):
    """A fresh release store, its artifact root, and the bundle of its DP run released locally."""
    path = str(tmp_path / "metadata.sqlite")
    fakestore.build_release_store(path, str(tmp_path / "root"))
    run = metadata.get_run(metadata.open_store(path), fakestore.RELEASE_RUN)
    manifest = release.write_bundle(run, str(tmp_path / "bundle"))
    return {"path": path, "root": str(tmp_path / "root"), "run": run, "manifest": manifest,
            "bundle": _local_files(tmp_path / "bundle")}


def _local_files(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in Path(directory).rglob("*") if p.is_file()}


def _remote_files(uri):
    store = storage.storage_for(uri)
    return {rel: store.read_bytes(storage.join(uri, rel)) for rel in release.bundle_files(uri)}


def _forget(uri):
    """Delete every object under ``uri`` (ram:// and fake:// live as long as the test process)."""
    store = storage.storage_for(uri)
    for rel in release.bundle_files(uri):
        store.delete(storage.join(uri, rel))


def _upload(local_root: str, uri: str):
    """Every file under ``local_root`` written through the storage layer under ``uri``."""
    store = storage.storage_for(uri)
    for folder, _, names in os.walk(local_root):
        rel = os.path.relpath(folder, local_root).replace(os.sep, "/")
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                store.write_bytes(storage.join(uri, name if rel == "." else f"{rel}/{name}"), f.read())


def _moved(run, old_root: str, new_root: str):
    """The same run with every artifact URI under ``old_root`` moved to ``new_root``."""
    def move(artifact):
        return dataclasses.replace(artifact, uri=new_root + artifact.uri[len(old_root):]) \
            if artifact.uri.startswith(old_root) else artifact
    return dataclasses.replace(run, components=[
        dataclasses.replace(c, inputs=[move(a) for a in c.inputs], outputs=[move(a) for a in c.outputs])
        for c in run.components])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_artifacts_on_object_storage_release_the_same_bundle(local, tmp_path, scheme):
    remote_root = f"{scheme}://h16-artifacts/{tmp_path.name}/root"
    _upload(local["root"], remote_root)
    shutil.rmtree(local["root"])  # nothing local left to read: every read goes through the layer
    run = _moved(local["run"], local["root"], remote_root)
    assert all(a.uri.startswith(remote_root) for c in run.components for a in c.outputs)
    manifest = release.write_bundle(run, str(tmp_path / "from_remote"))
    assert manifest == local["manifest"]  # every path, size, sha256, ε, δ, unit, adjacency
    assert _local_files(tmp_path / "from_remote") == local["bundle"]
    # positive control: one changed byte in a remote artifact changes the manifest
    vocab = next(a for a in run.artifacts(schema.type_name(schema.DP_VOCABULARY)) if not a.private)
    store = storage.storage_for(vocab.uri)
    store.write_bytes(storage.join(vocab.uri, "vocab.txt"), store.read_bytes(storage.join(vocab.uri, "vocab.txt")) + b"x")
    assert release.write_bundle(run, str(tmp_path / "changed")) != local["manifest"]
    _forget(remote_root)


def test_a_truncated_remote_event_file_is_refused(local, tmp_path):
    remote_root = f"fake://h16-artifacts/{tmp_path.name}/root"
    _upload(local["root"], remote_root)
    run = _moved(local["run"], local["root"], remote_root)
    model = next(a for a in run.artifacts(schema.type_name(schema.PRETRAINED_MODEL)) if not a.private)
    name = storage.join(model.uri, next(iter(fakestore.RELEASE_TENSORBOARD)))
    store = storage.storage_for(name)
    store.write_bytes(name, store.read_bytes(name)[:-3])
    with pytest.raises(release.ReleaseError, match="fake://.*not a readable TensorBoard event file.*truncated"):
        release.write_bundle(run, str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    _forget(remote_root)


def test_storage_lock_files_of_a_local_artifact_are_not_released(local, tmp_path):
    """An artifact written through the local storage layer has a hidden lock file per folder (it
    holds the folder's last generation, a time stamp): listed by os.walk, never released."""
    run = local["run"]
    model = next(a for a in run.artifacts(schema.type_name(schema.PRETRAINED_MODEL)) if not a.private)
    weights = os.path.join(model.uri, "model", "saved_model.pb")
    storage.storage_for(weights).write_bytes(weights, Path(weights).read_bytes())
    lock = Path(model.uri, "model", ".dpbert-storage.lock")
    assert lock.exists()  # positive control: the file is there to leak
    manifest = release.write_bundle(run, str(tmp_path / "b"))
    assert manifest == local["manifest"] and _local_files(tmp_path / "b") == local["bundle"]


def _recording(monkeypatch, scheme, fail_at=None, foreign_at=None):
    """Record the storage writes of ``scheme``; fail the ``fail_at``-th; let another writer take
    the ``foreign_at``-th object just before it is written."""
    cls = type(storage.storage_for(f"{scheme}://x"))
    real, writes = cls.write_bytes, []

    def write_bytes(self, uri, data, **kw):
        writes.append(uri)
        if len(writes) == fail_at:
            raise OSError(28, "No space left on device")
        if len(writes) == foreign_at:
            real(self, uri, b"another writer's")
        return real(self, uri, data, **kw)

    monkeypatch.setattr(cls, "write_bytes", write_bytes)
    return writes


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_remote_bundle_is_the_local_one_written_manifest_last(local, tmp_path, capsys, monkeypatch, scheme):
    target = f"{scheme}://h16-bundles/{tmp_path.name}/bundle"
    writes = _recording(monkeypatch, scheme)
    assert main(["release", "--metadata", local["path"], "--to", target, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == local["manifest"]
    assert _remote_files(target) == local["bundle"]
    assert writes[-1] == storage.join(target, release.MANIFEST_FILE)
    assert sorted(writes) == sorted(storage.join(target, p) for p in local["bundle"])
    # a second release into it: exit 2 naming --to's bundle, nothing changed
    assert main(["release", "--metadata", local["path"], "--to", target]) == 2
    err = capsys.readouterr().err
    assert target in err and "not empty" in err and err.count("\n") == 1
    assert _remote_files(target) == local["bundle"]
    _forget(target)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_failed_remote_write_deletes_what_it_wrote_and_only_that(local, tmp_path, monkeypatch, scheme):
    run, target = local["run"], f"{scheme}://h16-bundles/{tmp_path.name}/full"
    writes = _recording(monkeypatch, scheme, fail_at=3)
    with pytest.raises(release.ReleaseError, match=f"cannot write the bundle {target}.*No space left"):
        release.write_bundle(run, target)
    assert len(writes) == 3 and release.bundle_files(target) == []
    # another writer takes the 4th object meanwhile: refused (created only if absent), ours deleted
    target = f"{scheme}://h16-bundles/{tmp_path.name}/raced"
    writes = _recording(monkeypatch, scheme, foreign_at=4)
    with pytest.raises(release.ReleaseError, match=f"cannot write the bundle {target}"):
        release.write_bundle(run, target)
    foreign = writes[3][len(target) + 1:]
    assert _remote_files(target) == {foreign: b"another writer's"}
    _forget(target)
