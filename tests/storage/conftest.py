"""``backend``: (storage, a fresh root URI) for every backend of dpbert.storage — a local
tmp_path, ``ram://``, ``fake://`` and ``gs://`` served by a fake client (installed as the
process's gs:// storage, so ``storage_for`` and the helpers reach it too)."""
import uuid

import pytest

from dpbert.storage import api, fake
from dpbert.storage.gcs import GCSStorage
from tests.storage.fake_gcs import FakeClient

BACKENDS = ["local", "ram", "fake", "gcs"]


@pytest.fixture(autouse=True)
def _fresh_fake():
    fake.reset()
    yield
    fake.reset()


@pytest.fixture
def gcs(monkeypatch):
    storage = GCSStorage(client=FakeClient())
    monkeypatch.setitem(api._SINGLETONS, "gs", storage)
    return storage


def make_backend(kind, tmp_path, request):
    tag = uuid.uuid4().hex[:8]
    if kind == "local":
        root = str(tmp_path / "root")
    elif kind == "ram":
        root = f"ram://storage-{tag}"
    elif kind == "fake":
        root = f"fake://bucket/{tag}"
    else:
        request.getfixturevalue("gcs")
        root = f"gs://bucket/{tag}"
    return api.storage_for(root), root


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    storage, root = make_backend(request.param, tmp_path, request)
    yield storage, root
    storage.rmtree(root)
