"""The whole tiny DAG, ``dpbert run --output DIR --pipeline-root gs://…`` in-process, with its
pipeline root and the dataset ledger on ``gs://``, served by
fake-gcs-server (tests/gcs_server.py) — every gs:// client the run uses: dpbert.storage
(google-cloud-storage), TFX and TensorFlow (tf.io.gfile's built-in GCS filesystem), Beam's gcsio.
The corpus is the tiny DAG's synthetic notes read as a user's dataset (``corpus.path``): the
synthetic corpus's own ledger is never on Cloud Storage, by design.

TensorFlow's GCS filesystem has Google's hosts built in (no endpoint setting), so the run happens
in a loopback-only network + mount namespace (``unshare``: unprivileged user namespaces, or root)
whose private /etc/hosts maps www/storage/oauth2.googleapis.com to 127.0.0.1, where a TLS proxy
with a throw-away CA (CURL_CA_BUNDLE, REQUESTS_CA_BUNDLE) forwards to the server; nothing leaves
the machine. Python clients reach the server directly (STORAGE_EMULATOR_HOST, anonymous). Test
shims, not product code: Beam's credentials lookup is skipped (google.auth.default's metadata
retries), its batch copy/delete run one by one (the server does not answer GCS batch requests).

Checks: the objects under the gs:// root equal a local run's files (same configuration, execution
ids and hex names normalised); nothing but metadata.sqlite is written outside the root (an audit
hook and folder snapshots, as tests/e2e/test_dag_ram.py); the ledger is ``<ledger>/<id>.json``.
Without a namespace the test FAILS naming the requirement. docs/running-on-vertex.md: the option.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.e2e.tiny_dag import REPO, TINY_DAG

BUCKET = "dpbert-e2e"
DATASET_ID = "gcs-e2e"
HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
SERVER_PORT = 8081  # inside the namespace: its own loopback, every port free
REQUIREMENT = ("test_dag_gcs needs a loopback-only network namespace: unprivileged user namespaces "
               "(`unshare -Urnm` must work) or root")


def namespace_prefix():
    """The ``unshare`` command that gives this test its namespaces, None when neither works. A
    PID namespace too: when the driver ends, the kernel ends the server and proxy with it."""
    candidates = [["unshare", "-Urnmpf", "--kill-child"]]
    if os.geteuid() == 0:
        candidates.append(["unshare", "-nmpf", "--kill-child"])
    for prefix in candidates:
        try:
            if subprocess.run(prefix + ["true"], capture_output=True, timeout=30).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2700)  # two tiny DAG runs in one process (gs://, then the local twin)
def test_the_whole_dag_runs_on_gcs(tmp_path):
    prefix = namespace_prefix()
    if prefix is None:
        pytest.fail(REQUIREMENT, pytrace=False)
    # sh stays PID 1 of the namespace (it does not exec its last command: ``exit`` follows), so the
    # driver is an ordinary process with default signal handling.
    driver = "import sys; from tests.e2e.test_dag_gcs import inside; inside(sys.argv[1])"
    proc = subprocess.run(prefix + ["sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c", driver, str(tmp_path)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                          timeout=2600)
    result_file = tmp_path / "result.json"
    assert proc.returncode == 0 and result_file.exists(), proc.stderr[-6000:]
    result = json.loads(result_file.read_text())
    assert not result["violations"], "local writes:\n" + "\n".join(result["violations"][:5])
    assert result["snapshots_unchanged"], result["snapshot_diff"]
    assert result["local_output"] == ["metadata.sqlite"]      # nothing else on the local disk
    gcs, local = set(result["gcs_objects"]), set(result["local_objects"])
    assert gcs == local, f"only on gs://: {sorted(gcs - local)[:20]}; only local: {sorted(local - gcs)[:20]}"
    for part in ("CorpusIngest/tuples/", "DPVocabularyGen/vocabulary/", "MLMPretrainer/model/",
                 "PrivacyAccountant/report/", "_trainer_state/"):
        assert any(name.startswith(part) for name in gcs), part
    ledger = result["ledger"]  # <ledger>/<id>.json, its previous generation, the folder's corpus index
    index = f"gs://{BUCKET}/ledgers/.index.json"
    assert ledger in result["ledger_objects"] and set(result["ledger_objects"]) <= {ledger, ledger + ".previous", index}
    assert ledger == f"gs://{BUCKET}/ledgers/{DATASET_ID}.json" and result["ledger_entries"] >= 1
    assert result["uris_on_gcs"], "every output artifact ML Metadata records lies under the gs:// root"


def test_without_a_namespace_the_test_fails_naming_the_requirement(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "namespace_prefix", lambda: None)
    with pytest.raises(pytest.fail.Exception, match=r"^test_dag_gcs needs .*unshare -Urnm.* or root$"):
        test_the_whole_dag_runs_on_gcs(tmp_path)
    assert not os.listdir(tmp_path)


def test_the_comparison_ignores_ids_and_times_only():
    """Positive control of the object comparison: what differs but an id, a hash or an event
    file's time/host/pid stays different."""
    run_a = ["M/model/3/saved_model.pb", "_trainer_state/" + "ab" * 12 + "/events.out.tfevents.17.vm.2.0.v2"]
    run_b = ["M/model/7/saved_model.pb", "_trainer_state/" + "cd" * 12 + "/events.out.tfevents.18.host.9.1.v2"]
    assert normalised(run_a) == normalised(run_b)
    assert normalised(run_a) != normalised(run_b[:1] + ["_trainer_state/" + "cd" * 12 + "/checkpoint"])
    assert normalised(["M/model/3/saved_model.pb"]) != normalised(["M/model/3/variables.index"])


# ------------------------------------------------------------------ inside the namespace (driver)

def _loopback_up():
    """``ip link set lo up`` without iproute2 (SIOCGIFFLAGS / SIOCSIFFLAGS)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))


def _isolate(infra):
    _loopback_up()
    hosts = infra / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 " + " ".join(HOSTS) + "\n")
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


def _certificates(infra):
    """A throw-away CA and a certificate for the Google hosts (and 127.0.0.1) signed by it."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=infra, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=dpbert test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", f"/CN={HOSTS[0]}")
    (infra / "ext.cnf").write_text("subjectAltName=" + ",".join(f"DNS:{h}" for h in HOSTS) + ",IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")


def serve_proxy(upstream_port: int, cert: str, key: str):
    """TLS on 127.0.0.1:443 → plain HTTP to the server. Each request is re-sent with a
    Content-Length (TensorFlow's uploads carry a Transfer-Encoding the server answers with 501)
    and an upload session's ``Location`` is turned back to https (the server writes http)."""
    import http.client
    import http.server
    import socketserver
    import ssl

    hop = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length", "expect"}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _body(self) -> bytes:
            if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()

        def forward(self):
            body = self._body()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=300)
            conn.request(self.command, self.path, body=body, headers={**headers, "Content-Length": str(len(body))})
            reply = conn.getresponse()
            data = reply.read()
            conn.close()
            self.send_response_only(reply.status, reply.reason)
            for k, v in reply.getheaders():
                if k.lower() == "location" and v.startswith("http://"):
                    v = "https://" + v[len("http://"):]
                if k.lower() not in hop:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = forward

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()


def _wait_for_url(url, what, context=None, timeout_s=60.0):
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not answering at {url}")
            time.sleep(0.05)


def _serve(infra):
    """fake-gcs-server on 127.0.0.1:SERVER_PORT (external URL: the Google host, so upload sessions
    come back through the proxy), the proxy on :443, and the bucket."""
    import ssl
    import urllib.request

    from tests import gcs_server

    log = open(infra / "server.log", "wb")
    subprocess.Popen([str(gcs_server.binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                      "-port", str(SERVER_PORT), "-backend", "memory", "-external-url", f"https://{HOSTS[0]}",
                      "-log-level", "warn"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    proxy = f"from tests.e2e.test_dag_gcs import serve_proxy; serve_proxy({SERVER_PORT}, 'server.pem', 'server.key')"
    subprocess.Popen([sys.executable, "-c", proxy], cwd=infra, stdout=log, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": REPO})
    plain = f"http://127.0.0.1:{SERVER_PORT}"
    _wait_for_url(f"{plain}/storage/v1/b", "fake-gcs-server")
    trusted = ssl.create_default_context(cafile=str(infra / "ca.pem"))
    _wait_for_url(f"https://{HOSTS[1]}/storage/v1/b", "the TLS proxy", context=trusted)
    request = urllib.request.Request(f"{plain}/storage/v1/b", data=json.dumps({"name": BUCKET}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=30).close()
    return plain


def _environment(infra, plain_url):
    """Every client on the server; no Google credentials or metadata server are looked for."""
    os.environ.update({
        "STORAGE_EMULATOR_HOST": plain_url,               # google-cloud-storage: endpoint, anonymous
        "CURL_CA_BUNDLE": str(infra / "ca.pem"),           # TensorFlow's libcurl
        "REQUESTS_CA_BUNDLE": str(infra / "ca.pem"),       # google-cloud-storage's upload sessions
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",     # TensorFlow: no OAuth token request
        "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True",
        "GOOGLE_CLOUD_PROJECT": "dpbert-test",
    })


def _beam_shims():
    """Test shims: Beam connects anonymously at once (google.auth.default would retry the metadata
    server), and its batch copy / delete go one request at a time (no GCS batch API here)."""
    from apache_beam.internal.gcp import auth
    from apache_beam.io.gcp import gcsio
    from google.api_core import exceptions as gexc

    auth.get_service_credentials = lambda pipeline_options: None

    def copy_batch(self, pairs):
        out = []
        for src, dest in pairs:
            try:
                self.copy(src, dest)
                out.append((src, dest, None))
            except gexc.GoogleAPICallError as err:
                out.append((src, dest, err.code))
        return out

    def delete_batch(self, paths):
        out = []
        for path in list(paths):
            try:
                self.delete(path)
                out.append((path, None))
            except gexc.GoogleAPICallError as err:
                out.append((path, err.code))
        return out

    gcsio.GcsIO.copy_batch, gcsio.GcsIO.delete_batch = copy_batch, delete_batch


def _run_dag(corpus, output_dir, pipeline_root, ledger):
    """``dpbert run --output OUTPUT_DIR [--pipeline-root PIPELINE_ROOT]`` in this process (as
    tests/e2e/test_dag_ram.py: Beam in memory, one trainer worker) on ``corpus`` as the user
    dataset DATASET_ID, its ledger folder ``ledger`` (the synthetic corpus's ledger is kept off
    Cloud Storage by design); None: the default root ``OUTPUT_DIR/pipeline_root``."""
    from dpbert_cli.main import main

    args = ["run", "--corpus", str(corpus), "--output", str(output_dir)]
    if pipeline_root is not None:
        args += ["--pipeline-root", pipeline_root]
    for override in TINY_DAG + [f"corpus.dataset_id={DATASET_ID}", f"privacy.ledger={ledger}",
                                "beam.direct_running_mode=in_memory", "beam.direct_num_workers=1",
                                "training.workers=1"]:
        args += ["--set", override]
    code = main(args)
    if code != 0:
        raise RuntimeError(f"dpbert {' '.join(args)}: exit {code}")


def normalised(names):
    """Execution ids (digit-only path segments), long hex names (uuids, hashes) and TensorBoard
    event files' time/host/pid → placeholders."""
    out = set()
    for name in names:
        parts = ["<id>" if p.isdigit() else re.sub(r"[0-9a-f]{16,}", "<hex>", p) for p in name.split("/")]
        parts[-1] = re.sub(r"^events\.out\.tfevents\..*", "events.out.tfevents.<time.host.pid>", parts[-1])
        out.add("/".join(parts))
    return sorted(out)


def _gcs_objects(root):
    """Object names under ``root`` relative to it, folder placeholders (``name/``) left out."""
    from google.cloud import storage

    bucket, _, prefix = root[len("gs://"):].partition("/")
    names = [b.name for b in storage.Client().list_blobs(bucket, prefix=prefix.rstrip("/") + "/")]
    return [n[len(prefix) + 1:] for n in names if not n.endswith("/")]


def _local_files(root):
    """Files under ``root`` relative to it, the local backend's bookkeeping (its lock files) left out."""
    from dpbert.storage.local import _ours

    return [os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files if not _ours(f)]


def _audited_gcs_run(work, corpus, pipeline_root, ledger_folder):
    """The DAG on gs:// with every local write recorded (test_dag_ram's hook and snapshots)."""
    import tempfile

    from tests.e2e.test_dag_ram import WriteAudit, _snapshot

    scratch, cwd, home, out = (work / n for n in ("scratch", "cwd", "home", "out"))
    for folder in (scratch, cwd, home, out):
        folder.mkdir()
    tempfile.tempdir = str(scratch)
    os.environ.update({"TMPDIR": str(scratch), "MPLCONFIGDIR": str(scratch), "XDG_CACHE_HOME": str(scratch),
                       "HOME": str(home)})
    os.environ.pop("DPBERT_LEDGER", None)
    os.chdir(cwd)
    # Keras writes its configuration (~/.keras/keras.json) on its first import, in any process and
    # whatever the pipeline root: imported here, the snapshot below has it from the start.
    import tensorflow.python.keras.backend  # noqa: F401
    metadata_path = str(out / "metadata.sqlite")
    before = {"cwd": _snapshot(cwd), "home": _snapshot(home)}
    audit = WriteAudit.get()
    audit.allowed = (str(scratch), os.devnull, *(metadata_path + s for s in ("", "-journal", "-wal", "-shm")))
    audit.violations, audit.armed = [], True
    try:
        _run_dag(corpus, out, pipeline_root, ledger_folder)
    finally:
        audit.armed = False
    after = {"cwd": _snapshot(cwd), "home": _snapshot(home)}
    diff = {k: sorted(set(after[k]) ^ set(before[k])) for k in after}
    return metadata_path, {
        "violations": [f"{e} {p}\n{s}" for e, p, s in audit.violations],
        "snapshots_unchanged": after == before, "snapshot_diff": diff, "local_output": sorted(os.listdir(out))}


def inside(work_dir: str):
    """The driver, run inside the namespaces: the DAG on gs://, then the same DAG on a local
    folder; what the test asserts goes to ``<work_dir>/result.json``."""
    from pathlib import Path

    work = Path(work_dir)
    infra = work / "infra"
    infra.mkdir()
    _isolate(infra)
    _certificates(infra)
    _environment(infra, _serve(infra))
    _beam_shims()
    from dpbert import metadata, storage
    from dpbert.data.synthetic import generate_notes, write_jsonl
    from dpbert.ledger import identity

    corpus = str(infra / "notes.jsonl")  # the tiny DAG's synthetic notes, read as a user's corpus
    write_jsonl(generate_notes(24, 2, 2, seed=7), corpus)
    root = f"gs://{BUCKET}"
    metadata_path, result = _audited_gcs_run(work, corpus, f"{root}/pipeline_root", f"{root}/ledgers")
    ledger = identity.ledger_uri(f"{root}/ledgers", DATASET_ID)
    run = metadata.get_run(metadata.open_store(metadata_path))
    local = work / "local"
    _run_dag(corpus, local, None, str(work / "local-ledgers"))  # the default root: local/pipeline_root
    result.update({
        "gcs_objects": normalised(_gcs_objects(f"{root}/pipeline_root")),
        "local_objects": normalised(_local_files(str(local / "pipeline_root"))),
        "ledger": ledger, "ledger_objects": storage.storage_for(root).glob(f"{root}/ledgers/*"),
        "ledger_entries": len(storage.read_json(ledger).get("entries", {})),
        "uris_on_gcs": all(a.uri.startswith(f"{root}/pipeline_root/") for c in run.components for a in c.outputs),
    })
    (work / "result.json").write_text(json.dumps(result, indent=1))
