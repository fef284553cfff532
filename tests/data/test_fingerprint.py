"""The corpus fingerprint is keyed (``dpbert.data.fingerprint``): the oracle attack, the salt, and
where the fingerprint and the salt may (local ML Metadata's execution record) and may not go (a
compiled spec, an artifact or context property, a file outside the private state root).

The attack: the reader of a spec or of ML Metadata holds the fingerprint and knows the corpus but
one lab value (51 notes, 50 known); 1,000 candidate notes differ in that value only. Positive
control: the unkeyed fingerprint (the same code with the HMAC key dropped) singles out exactly
the true note. Keyed, without the salt, no candidate matches whatever the
attacker keys with (nothing, or a salt of its own); with the salt (the operator) exactly one does,
so the harness itself works.
"""
import hashlib
import hmac
import json
import os
import re
import stat

import pytest

from dpbert.config import CorpusConfig, load_config
from dpbert.data import fingerprint
from dpbert.data.fingerprint import SALT_BYTES, SALT_FILE, corpus_fingerprint, load_or_create_salt

TRUE_GLUCOSE = 437
CANDIDATES = range(1000)  # mg/dL: one of them is the patient's


def _note(i, glucose=None):
    text = f"patient {i} seen in clinic, vitals stable, follow up in two weeks"
    if glucose is not None:
        text = f"patient 50 admitted with polyuria, fasting glucose {glucose} mg/dL, started on insulin"
    return {"text": text, "note_id": f"n{i}", "patient_id": f"p{i}"}


#: The 50 notes the attacker knows, as JSONL (serialised once: the attack writes 1,000 corpora).
KNOWN_NOTES = "".join(json.dumps(_note(i)) + "\n" for i in range(50))


def _write_corpus(path, glucose):
    path.write_text(KNOWN_NOTES + json.dumps(_note(50, glucose)) + "\n")
    return CorpusConfig(path=str(path))


class _Unkeyed:
    """The broken mechanism (a test fixture, not an API): HMAC with its key dropped, i.e. the
    plain sha256 of the same framing."""

    def __init__(self, key, digestmod):
        self._h = hashlib.sha256()

    def update(self, data):
        self._h.update(data)

    def hexdigest(self):
        return self._h.hexdigest()


@pytest.fixture
def unkeyed(monkeypatch):
    def fingerprint_without_key(config):
        with monkeypatch.context() as m:
            m.setattr(fingerprint.hmac, "new", _Unkeyed)
            return corpus_fingerprint(config, b"\0" * SALT_BYTES)
    return fingerprint_without_key


def _candidate_corpora(tmp_path):
    """``[(value, corpus)]``: the attacker's candidate corpora, written once, each in a folder of
    its own under the corpus's name (the name is in the spec, corpus_config; the content keys it)."""
    out = []
    for g in CANDIDATES:
        folder = tmp_path / "attacker" / str(g)
        folder.mkdir(parents=True)
        out.append((g, _write_corpus(folder / "notes.jsonl", g)))
    return out


def _matches(corpora, published, attacker):
    """The candidate values whose corpus the attacker's fingerprint function maps to ``published``."""
    return [g for g, corpus in corpora if attacker(corpus) == published]


def test_unkeyed_fingerprint_recovers_the_lab_value_keyed_recovers_nothing(tmp_path, unkeyed):
    """Unkeyed, the fingerprint gives the glucose value away; keyed, no candidate matches without the salt."""
    corpus = _write_corpus(tmp_path / "notes.jsonl", TRUE_GLUCOSE)
    candidates = _candidate_corpora(tmp_path)
    # Positive control: the unkeyed fingerprint (what a /gcs/-mounted compile put in the spec).
    assert _matches(candidates, unkeyed(corpus), unkeyed) == [TRUE_GLUCOSE]
    # The keyed one, published (local ML Metadata): the salt stays in the private state root.
    salt = load_or_create_salt(str(tmp_path / "state"))
    published = corpus_fingerprint(corpus, salt)
    assert published.startswith("content:")
    assert _matches(candidates, published, unkeyed) == []
    own_salt = os.urandom(SALT_BYTES)
    assert _matches(candidates, published, lambda c: corpus_fingerprint(c, own_salt)) == []
    # The operator, who holds the salt, gets exactly the true note: the harness works.
    assert _matches(candidates, published, lambda c: corpus_fingerprint(c, salt)) == [TRUE_GLUCOSE]


def test_fingerprint_refuses_to_run_unkeyed(tmp_path):
    corpus = _write_corpus(tmp_path / "notes.jsonl", 1)
    for salt in (None, b"", b"short", "a string salt"):
        with pytest.raises(ValueError, match="salt"):
            corpus_fingerprint(corpus, salt)


def test_salt_is_created_once_private_and_random(tmp_path):
    state = tmp_path / "root" / "_trainer_state"
    salt = load_or_create_salt(str(state))
    assert len(salt) == SALT_BYTES and load_or_create_salt(str(state)) == salt
    assert stat.S_IMODE(os.stat(state / SALT_FILE).st_mode) == 0o600
    # no temp file left (the storage layer's folder lock file may sit beside it)
    assert sorted(n for n in os.listdir(state) if n != ".dpbert-storage.lock") == [SALT_FILE]
    assert load_or_create_salt(str(tmp_path / "other")) != salt  # os.urandom, per pipeline root
    (state / SALT_FILE).write_text('{"salt": "bm90IGEgc2FsdA=="}')
    with pytest.raises(ValueError, match=re.escape(str(state / SALT_FILE))) as err:
        load_or_create_salt(str(state))
    assert "bm90IGEgc2FsdA" not in str(err.value)


def test_concurrent_first_calls_agree_on_one_salt(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        salts = set(pool.map(lambda _: load_or_create_salt(str(tmp_path)), range(16)))
    assert len(salts) == 1 and sorted(n for n in os.listdir(tmp_path) if n != ".dpbert-storage.lock") == [SALT_FILE]


def _secrets(salt, fp):
    import base64

    digest = fp.split(":", 1)[1]
    return {"salt(b64)": base64.b64encode(salt).decode(), "salt(hex)": salt.hex(), "fingerprint": digest}


def test_compiled_spec_carries_no_content_hash_and_ingest_is_uncached(tmp_path, monkeypatch, unkeyed):
    """A compile on a host with the bucket mounted at /gcs/ puts no digest of the corpus (keyed or
    not) into the PipelineJob JSON, and CorpusIngest runs uncached there."""
    import kubeflow.runner as runner
    from tests.kubeflow.conftest import IMAGE, PIPELINE_ROOT

    corpus = _write_corpus(tmp_path / "notes.jsonl", TRUE_GLUCOSE)
    monkeypatch.setattr(runner, "validate_for_vertex", lambda config, root: None)  # "mounted at /gcs/"
    out = tmp_path / "pipeline.json"
    runner.compile_vertex(load_config(None, [f"corpus.path={corpus.path}"]), str(out), IMAGE, PIPELINE_ROOT)
    text = out.read_text()
    assert unkeyed(corpus).split(":", 1)[1] not in text
    assert re.search(r"[0-9a-f]{40,}", text) is None, "no digest of any kind in the spec"
    spec = json.loads(text)
    tasks = spec["pipelineSpec"]["root"]["dag"]["tasks"]
    assert "corpus_fingerprint" not in tasks["CorpusIngest"]["inputs"]["parameters"]
    assert "cachingOptions" not in tasks["CorpusIngest"]  # re-reads the corpus on every submission
    assert all(t["cachingOptions"]["enableCache"] for name, t in tasks.items() if name != "CorpusIngest")


def test_local_run_keeps_the_salt_private_and_the_fingerprint_on_the_execution_only(tmp_path):
    """The real CorpusIngest under LocalDagRunner with the keyed fingerprint: the salt is nowhere
    in the ML Metadata store (its sqlite bytes) nor under any artifact; the fingerprint is only in
    the execution's parameters (the local private store), never on an artifact or context."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tfx import v1 as tfx

    from pipeline.pipeline import fingerprint_state_root, ingest_component

    corpus = _write_corpus(tmp_path / "notes.jsonl", TRUE_GLUCOSE)
    root, store_path = tmp_path / "root", tmp_path / "metadata.sqlite"
    config = load_config(None, [f"corpus.path={corpus.path}", "privacy.tuple_words=16"])
    component = ingest_component(config, str(root))
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="fingerprint", pipeline_root=str(root), components=[component], enable_cache=True,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(str(store_path))))
    salt_path = os.path.join(fingerprint_state_root(str(root)), SALT_FILE)
    salt = load_or_create_salt(fingerprint_state_root(str(root)))
    fp = component.exec_properties["corpus_fingerprint"]
    assert hmac.compare_digest(fp, corpus_fingerprint(config.corpus, salt))
    secrets = _secrets(salt, fp)

    db = store_path.read_bytes()
    assert salt not in db and not any(s.encode() in db for k, s in secrets.items() if k != "fingerprint")
    config_ = metadata_store_pb2.ConnectionConfig()
    config_.sqlite.filename_uri = str(store_path)
    store = metadata_store.MetadataStore(config_)
    on_records = json.dumps([[str(v) for v in m.custom_properties.values()]
                             for m in store.get_artifacts() + store.get_contexts()])
    assert secrets["fingerprint"] not in on_records
    (execution,) = store.get_executions()
    assert execution.custom_properties["corpus_fingerprint"].string_value == fp  # the local cache key
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if path == salt_path:
                continue
            data = open(path, "rb").read()
            assert salt not in data and not any(s.encode() in data for s in secrets.values()), path
