"""``backend``: (storage, a fresh root URI) for every backend of dpbert.storage — a local
tmp_path, ``ram://``, ``fake://``, ``gs://`` served by a fake client, and ``gs://`` on a real GCS
JSON API (``gcs-server``: fake-gcs-server on loopback, tests/gcs_server.py). Either gs:// storage is
installed as the process's gs:// storage, so ``storage_for`` and the helpers reach it too.

``@server_gap(reason)`` on a test: what the pinned server does not enforce; on ``gcs-server``
that test is a strict xfail (a server that enforces it fails the test until the mark goes), the
in-process fake client keeps covering it."""
import uuid

import pytest

from dpbert.storage import api, fake
from dpbert.storage.gcs import GCSStorage
from tests.storage.fake_gcs import FakeClient

BACKENDS = ["local", "ram", "fake", "gcs", "gcs-server"]
#: What the pinned fake-gcs-server (tests/gcs_server.py SERVER_VERSION) does not enforce: it answers
#: a DELETE with ifGenerationMatch as if none were given (fixed in a later release; so is GET's, which
#: GCSStorage.read does not depend on: its download names the generation, a replaced one is a 404).
DELETE_PRECONDITION = "fake-gcs-server v1.54.0 ignores ifGenerationMatch on DELETE"


def server_gap(reason: str):
    return pytest.mark.server_gap(reason=reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "server_gap(reason): not enforced by the pinned fake-gcs-server; "
                                       "a strict xfail on the gcs-server backend (tests/storage/conftest.py)")


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


@pytest.fixture
def gcs_on_server(gcs_server, monkeypatch):
    """GCSStorage on the session's fake-gcs-server, as the process's gs:// storage."""
    storage = GCSStorage(client=gcs_server.client())
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
    elif kind == "gcs":
        request.getfixturevalue("gcs")
        root = f"gs://bucket/{tag}"
    else:
        root = f"gs://{request.getfixturevalue('gcs_server').bucket}/{tag}"
        request.getfixturevalue("gcs_on_server")
        gap = request.node.get_closest_marker("server_gap")
        if gap is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=gap.kwargs["reason"]))
    return api.storage_for(root), root


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    storage, root = make_backend(request.param, tmp_path, request)
    yield storage, root
    storage.rmtree(root)
