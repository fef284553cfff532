"""Issue 22 item 2: a changed corpus is never served from TFX's cache.

CorpusIngest's ``corpus_fingerprint`` parameter (``dpbert.data.fingerprint``: keyed, its salt in
the pipeline root's private state) is in the local runner's TFX cache key: the appended-notes case
re-reads the corpus (a real LocalDagRunner over the real CorpusIngest, ≈ 1 s after TFX's import),
an unchanged corpus stays cached, and the fingerprint is never on an artifact. Also the ingest's
own pre-pass and its count-free progress log (item 10).
"""
import json
import logging
import os

import pytest

from dpbert.config import load_config
from dpbert.data.readers import CorpusError


def _write(path, start, count, mode="w"):
    with open(path, mode) as handle:
        for i in range(start, start + count):
            handle.write(json.dumps({"text": f"the patient was seen on day {i} and sent home " * 3,
                                     "note_id": f"n{i}", "patient_id": f"p{i % 12}"}) + "\n")


def _ingest_parameters(config, root):
    from pipeline.pipeline import create_pipeline

    pipeline = create_pipeline(config, str(root), metadata_path=str(root / "metadata.sqlite"))
    (ingest,) = [c for c in pipeline.components if c.id == "CorpusIngest"]
    return ingest.exec_properties


def test_create_pipeline_fingerprints_the_corpus(tmp_path):
    """Fails on the previous main: CorpusIngest had no parameter that changes with the corpus."""
    corpus = tmp_path / "notes.jsonl"
    _write(corpus, 0, 48)
    config = load_config(None, [f"corpus.path={corpus}"])
    root = tmp_path / "root"
    before = _ingest_parameters(config, root)
    assert before["corpus_fingerprint"].startswith("content:") and before["privacy_unit"] == "tuple"
    assert _ingest_parameters(config, root) == before  # unchanged: the same cache key (the same salt)
    _write(corpus, 48, 12, mode="a")
    after = _ingest_parameters(config, root)
    assert after["corpus_fingerprint"] != before["corpus_fingerprint"]
    assert {k: v for k, v in after.items() if k != "corpus_fingerprint"} == \
        {k: v for k, v in before.items() if k != "corpus_fingerprint"}


def test_appended_notes_are_re_read_and_an_unchanged_corpus_stays_cached(tmp_path):
    """The real CorpusIngest under LocalDagRunner: 48 notes, the same again (cached), 12 notes
    appended (re-read: 60 documents, a new artifact), and a bad line appended (CorpusError from
    the ingest's pre-pass, nothing published)."""
    from tfx import v1 as tfx

    from dpbert import metadata
    from dpbert.report import build_report
    from dpbert.release import released_view
    from pipeline.pipeline import ingest_component

    corpus = tmp_path / "notes.jsonl"
    _write(corpus, 0, 48)
    store = str(tmp_path / "metadata.sqlite")

    def run():
        config = load_config(None, [f"corpus.path={corpus}", "privacy.tuple_words=16"])
        component = ingest_component(config, str(tmp_path / "root"))
        tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
            pipeline_name="corpus-cache", pipeline_root=str(tmp_path / "root"), components=[component],
            enable_cache=True,
            metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(store)))
        return component.exec_properties["corpus_fingerprint"]

    def tuples():
        (ingest,) = metadata.get_run(metadata.open_store(store)).components
        return ingest.state, ingest.outputs

    first = run()
    state, (a,) = tuples()
    assert state == "COMPLETE" and a.properties["num_documents"] == 48
    assert run() == first
    state, (b,) = tuples()
    assert state == "CACHED" and b.uri == a.uri
    _write(corpus, 48, 12, mode="a")
    assert run() != first
    state, (c,) = tuples()
    assert state == "COMPLETE" and c.uri != a.uri and c.properties["num_documents"] == 60
    # Operator-only: on the execution record, never on an artifact nor in the released report.
    fingerprint = first.split(":", 1)[1]
    assert not any(fingerprint in json.dumps(x.properties, default=str) for x in (a, b, c))
    released = json.dumps(released_view(build_report(metadata.get_run(metadata.open_store(store)))), default=str)
    assert fingerprint not in released
    with open(corpus, "a") as handle:
        handle.write('{"text": "never quoted\n')
    with pytest.raises(CorpusError, match=r"notes\.jsonl:61:\d+: not valid JSON"):
        run()
    root = tmp_path / "root" / "CorpusIngest" / "tuples"
    new = [d for d in os.listdir(root) if str(root / d) not in (a.uri, c.uri)]
    assert all(not os.listdir(root / d) for d in new), new  # the failed ingest wrote no shard


def test_ingest_checks_every_record_before_it_writes(tmp_path):
    """Fails on the previous main: the ingest wrote shards, then failed in Beam at line 40."""
    from dpbert.stages.ingest import ingest

    corpus = tmp_path / "notes.jsonl"
    _write(corpus, 0, 40)
    lines = corpus.read_text().splitlines()
    record = json.loads(lines[39])
    del record["patient_id"]
    lines[39] = json.dumps(record)
    corpus.write_text("\n".join(lines) + "\n")
    config = load_config(None, [f"corpus.path={corpus}"]).corpus
    out = tmp_path / "tuples"
    with pytest.raises(CorpusError, match=rf"{corpus}:40: privacy.unit = patient needs a patient id"):
        ingest(config, str(out), tuple_words=16, num_shards=1, unit="patient")
    assert not out.exists()


def test_ingest_progress_is_on_a_timer_without_counts(caplog):
    """Fails on the previous main: a line every 5,000 tuples with a words/s rate."""
    from dpbert.stages import ingest

    now = [0.0]

    def clock():
        now[0] += 7.0  # seconds per tuple
        return now[0]

    with caplog.at_level(logging.INFO, logger="dpbert.ingest"):
        assert list(ingest._with_progress(range(10), interval=30.0, clock=clock)) == list(range(10))
    lines = [r.getMessage() for r in caplog.records if r.name == "dpbert.ingest"]
    assert lines == ["ingest: still reading (35 s elapsed)", "ingest: still reading (70 s elapsed)"]
    assert ingest.PROGRESS_INTERVAL_S == 30.0
