"""gs:// on a real GCS JSON API (fake-gcs-server on loopback, tests/gcs_server.py): the server
fixture itself (pinned version, loopback only), a read that is raced by a replacement, and
processes racing on one generation — update_json and the dataset ledger's last ε (slow tier;
threads over the same code run in make test: test_contract.py, tests/ledger/). The shared
contract and lease tests run on this server too (``backend`` ``gcs-server``, conftest.py)."""
import os
import subprocess
import sys
import uuid

import pytest

from dpbert.storage import join, read_json, write_json
from dpbert.storage.gcs import GCSStorage, split
from tests import gcs_server as server_module
from tests.ledger.test_dataset_ledger import _budget_for_one, train_record

REPO = __file__.rsplit("/tests/", 1)[0]


def test_the_server_is_the_pinned_version_listening_on_loopback_only(gcs_server):
    assert gcs_server.version == server_module.SERVER_VERSION and gcs_server.url.startswith("http://127.0.0.1:")
    port = int(gcs_server.url.rsplit(":", 1)[1])
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:  # local address (hex ip:port), state 0A = LISTEN
            rows = [line.split() for line in f.readlines()[1:]]
        listening |= {r[1] for r in rows if r[3] == "0A" and int(r[1].rsplit(":", 1)[1], 16) == port}
    assert listening == {f"0100007F:{port:04X}"}                # 127.0.0.1, not 0.0.0.0 / ::


def test_an_unexpected_server_version_is_refused_before_it_starts(tmp_path, monkeypatch):
    """Positive control of the version check: the gaps marked xfail are those of one release."""
    monkeypatch.setattr(server_module, "SERVER_VERSION", "v0.0.0")
    with pytest.raises(RuntimeError, match="written for v0.0.0: review the gaps"):
        server_module.start(tmp_path / "log")
    assert not (tmp_path / "log").exists()


class _UnmatchedRead(GCSStorage):
    """Positive control: the metadata's generation, then a download of whatever is there now."""

    def read(self, uri):
        bucket, name = split(uri)
        generation = self.client.bucket(bucket).get_blob(name).generation
        return self.client.bucket(bucket).blob(name).download_as_bytes(), int(generation)


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("client", ["fake", "server"])
def test_a_read_raced_by_a_replacement_returns_one_version(client, broken, request, monkeypatch):
    """Between the metadata and the download another writer replaces the object: the download names
    the metadata's generation (and matches on it), which is gone, so the read looks again and
    returns the new bytes with THEIR generation, never the new bytes with the old generation."""
    from google.cloud.storage import Blob

    from tests.storage.fake_gcs import FakeBlob

    storage = request.getfixturevalue("gcs" if client == "fake" else "gcs_on_server")
    storage = _UnmatchedRead(client=storage.client) if broken else storage
    uri = f"gs://{request.getfixturevalue('gcs_server').bucket if client == 'server' else 'b'}/{uuid.uuid4().hex}"
    old = storage.write_bytes(uri, b"old")
    blob_class = FakeBlob if client == "fake" else Blob
    original, replaced = blob_class.download_as_bytes, []

    def racing_download(blob, *args, **kwargs):
        if not replaced:
            replaced.append(storage.write_bytes(uri, b"new"))
        return original(blob, *args, **kwargs)

    monkeypatch.setattr(blob_class, "download_as_bytes", racing_download)
    assert storage.read(uri) == ((b"new", old) if broken else (b"new", replaced[0]))


# A racer: installs a gs:// storage whose first read of the raced object waits until every racer
# has read it (all hold ONE generation before anyone writes); "broken" drops the precondition of
# every write (the positive control: a store without compare-and-swap).
_RACER = """
import os, sys, time
from dpbert.storage import api, PreconditionFailed
from dpbert.storage.gcs import GCSStorage
mode, uri, barrier, parties, broken = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"

class Racing(GCSStorage):
    waited = False
    def read(self, name):
        try:
            found = super().read(name)
        except FileNotFoundError as err:
            found = err
        if name == uri and not Racing.waited:
            Racing.waited = True
            open(os.path.join(barrier, str(os.getpid())), "w").close()
            deadline = time.monotonic() + 120
            while len(os.listdir(barrier)) < parties and time.monotonic() < deadline:
                time.sleep(0.01)
        if isinstance(found, Exception):
            raise found
        return found
    def write_bytes(self, name, data, *, if_generation_match=None, private=False):
        match = None if broken else if_generation_match
        return super().write_bytes(name, data, if_generation_match=match, private=private)

api._SINGLETONS["gs"] = Racing()
if mode == "update_json":
    try:
        api.update_json(uri, lambda v: {"n": v.get("n", 0) + 1}, retries=1)
        print("won")
    except PreconditionFailed:
        print("lost")
else:
    from dpbert.accounting.gate import BudgetRefused
    from tests.ledger.test_dataset_ledger import reserve, train_record
    try:
        reserve(uri, [train_record()], budget=float(sys.argv[6]))
        print("won")
    except BudgetRefused:
        print("refused")
"""


def _race(server, tmp_path, mode, uri, parties, broken, *extra):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, **server.env()}
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, mode, uri, str(barrier), str(parties),
                               "1" if broken else "0", *extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(parties)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return sorted(outs)


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_two_processes_racing_update_json_on_one_generation_one_wins(gcs_server, gcs_on_server, tmp_path, broken):
    uri = f"gs://{gcs_server.bucket}/{uuid.uuid4().hex}/counter.json"
    write_json(uri, {"n": 0})
    outs = _race(gcs_server, tmp_path, "update_json", uri, 2, broken)
    assert outs == (["won", "won"] if broken else ["lost", "won"])
    assert read_json(uri) == {"n": 1}                         # broken: both "won", one update lost


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_processes_racing_for_a_dataset_s_last_epsilon_on_gcs_one_wins(gcs_server, gcs_on_server, tmp_path,
                                                                       broken):
    from dpbert.ledger import dataset as ld
    from dpbert.ledger import identity

    uri = identity.ledger_uri(join(f"gs://{gcs_server.bucket}", uuid.uuid4().hex, "ledgers"), "ds-1")
    budget = _budget_for_one(train_record())
    outs = _race(gcs_server, tmp_path, "reserve", uri, 3, broken, repr(budget))
    assert outs == (["won"] * 3 if broken else ["refused", "refused", "won"])  # broken: ε overspent
    assert len(ld.entries_of(ld.read_ledger(uri))) == 1
