"""Issue 18, report: the corpus section (exact counts: operator-only, never released, never in a
bundle), its warnings, the ε summary `dpbert run` prints, and the ingest stage's counts."""
import json
import os

import pytest

from dpbert import metadata
from dpbert.config import CorpusConfig
from dpbert.data.readers import CorpusError
from dpbert.release import bundle_files, released_view, write_bundle
from dpbert.report import build_report, epsilon_summary, format_report, run_summary
from tests.dashboard import fakestore

COUNT = 4811  # the release store's exact tuple count


@pytest.fixture(scope="module")
def release_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("release_store")
    fakestore.build_release_store(str(base / "metadata.sqlite"), str(base / "pipeline_root"))
    return str(base / "metadata.sqlite")


def test_corpus_section_is_private_and_never_released(release_store, tmp_path):
    run = metadata.get_run(metadata.open_store(release_store), fakestore.RELEASE_RUN)
    report = build_report(run)
    assert report["corpus"]["operator_only"] is True and report["corpus"]["tuples"] == COUNT
    assert "OPERATOR-ONLY" in format_report(report) and str(COUNT) in format_report(report)

    view = released_view(report)
    assert "corpus" not in view and "warnings" not in view and "corpus counts" in view["operator_only_omitted"]
    assert str(COUNT) not in json.dumps(view) and str(COUNT) not in format_report(view)
    assert "OPERATOR-ONLY" not in format_report(view)

    bundle = tmp_path / "bundle"
    write_bundle(run, str(bundle))
    for rel in bundle_files(str(bundle)):
        with open(os.path.join(bundle, *rel.split("/")), "rb") as f:
            data = f.read()
        assert str(COUNT).encode() not in data and b"num_tuples" not in data and b"operator_only" not in data


def test_epsilon_summary_lines():
    report = {"status": "COMPLETE", "privacy": {
        "epsilon_total_pld": 9.7, "delta": 1.1e-5, "unit": "tuple", "adjacency": "add_or_remove_one",
        "epsilon_vocab": 1.2, "epsilon_train": 8.9, "epsilon_budget": 10.0, "within_budget": 1}}
    assert epsilon_summary(report) == [
        "ε = 9.7 (PLD) per tuple (add_or_remove_one), δ = 1.1e-05 [ε_V = 1.2, ε_T = 8.9]",
        "budget: ε ≤ 10: within budget"]
    report["privacy"].update(epsilon_budget=8.0, within_budget=0)
    assert epsilon_summary(report)[1] == "budget: ε ≤ 8: OVER BUDGET"
    report["privacy"].update(epsilon_budget=None, within_budget=None, epsilon_total_pld="inf")
    assert epsilon_summary(report) [0].startswith("ε = ∞ (PLD)")
    assert epsilon_summary(report)[1] == "budget: none configured (privacy.epsilon_budget)"
    assert epsilon_summary({"status": "CANCELLED", "privacy": {}}) == [
        "ε: no privacy report in this run (the accountant did not run)", "status: CANCELLED"]


def test_run_summary_counts_cached_components(tmp_path):
    path = str(tmp_path / "metadata.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    run = b.run("cached-run")
    b.execute(run, "CorpusIngest", "CACHED")
    b.execute(run, "DPVocabularyGen", "CACHED")
    b.execute(run, "PrivacyAccountant", "CACHED", outputs=[("report", "components.PrivacyReport", {
        "private": 0, "epsilon_total_pld": 3.0, "delta": 1e-5, "unit": "patient"})])
    del b
    lines, warnings = run_summary(metadata.get_run(metadata.open_store(path)))
    assert lines[0] == "ε = 3 (PLD) per patient, δ = 1e-05"
    assert lines[-1] == "cached: 3 components reused (CorpusIngest, DPVocabularyGen, PrivacyAccountant)"
    assert warnings == []


def _ingest(tmp_path, name, content: bytes, encoding: str = "utf-8"):
    from dpbert.stages.ingest import ingest

    corpus = tmp_path / name
    corpus.mkdir()
    for i, text in enumerate(content if isinstance(content, list) else [content]):
        (corpus / f"doc{i}.txt").write_bytes(text)
    return ingest(CorpusConfig(path=str(corpus), encoding=encoding), str(tmp_path / (name + "-tuples")), 8,
                  num_shards=1)


def test_ingest_records_counts_and_warns_on_random_bytes(tmp_path, caplog):
    import random

    from dpbert.data.corpus_warnings import corpus_warnings

    # a binary-ish file: letters, spaces and bytes that are not UTF-8
    rng = random.Random(0)
    data = bytes(rng.choice(b"abcdefghij   \x80\x9f\xc3\xff\xfe") for _ in range(20_000))
    with pytest.raises(CorpusError, match=r"doc0\.txt:1: byte 0x.. at column \d+ is not valid utf-8"):
        _ingest(tmp_path, "strict", data)  # corpus.encoding = utf-8: refused, naming the file and line
    with caplog.at_level("INFO", logger="dpbert.ingest"):
        props = _ingest(tmp_path, "random", data, encoding="utf-8:replace").properties
    assert props["corpus_bytes"] == 20_000 and props["replaced_bytes"] > 200 and props["num_words"] > 0
    codes = [w["code"] for w in corpus_warnings(props)]
    assert "replaced_bytes" in codes and "tiny_corpus" in codes
    logged = [r.getMessage() for r in caplog.records]
    assert any("% of the corpus's bytes are not UTF-8" in m for m in logged)
    # the new warning lines give rounded fractions, never the exact counts
    assert not any(str(props["num_words"]) in m for m in logged if "not UTF-8 and were" in m)


def test_ingest_warns_on_three_word_documents_and_not_on_clean_text(tmp_path):
    from dpbert.data.corpus_warnings import corpus_warnings

    short = _ingest(tmp_path, "short", [b"fever and cough"] * 30).properties
    assert short["num_documents"] == 30 and short["num_words"] == 90 and short["replaced_bytes"] == 0
    assert [w["code"] for w in corpus_warnings(short)] == ["short_documents", "tiny_corpus"]
    clean = {"num_documents": 100, "num_words": 50_000, "replaced_bytes": 3, "corpus_bytes": 300_000}
    assert corpus_warnings(clean) == []
    assert [w["code"] for w in corpus_warnings(clean, words_kept=12)] == ["tiny_vocabulary"]
    assert corpus_warnings({}) == []  # an older run: no warning
