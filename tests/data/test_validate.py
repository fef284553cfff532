"""Issue 22 items 2 and 11: the whole corpus is checked before anything is written
(``dpbert.data.validate``), and the corpus fingerprint of TFX's cache key (``dpbert.data.fingerprint``).

Every error names ``file:line`` and the problem, never the record's text or its ids."""
import json
import os

import pytest

from dpbert.config import ConfigError, CorpusConfig, SyntheticCorpusConfig
from dpbert.data.fingerprint import corpus_fingerprint

SALT = bytes(range(32))  # the operator's key (dpbert.data.fingerprint.load_or_create_salt)
from dpbert.data.readers import CorpusError
from dpbert.data.validate import validate_corpus

SECRET = "Mr Zebulon Quackenbush"


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return CorpusConfig(path=str(path))


def _note(i, **fields):
    return {"text": f"{SECRET} was seen on day {i}", "note_id": f"n{i}", "patient_id": f"p{i % 3}", **fields}


def _error(config, unit="tuple", cls=CorpusError):
    with pytest.raises(cls) as info:
        validate_corpus(config, unit)
    message = str(info.value)
    assert SECRET not in message and "Zebulon" not in message
    return message


def test_patient_id_missing_on_one_record_names_its_line(tmp_path):
    """Fails on the previous main: preflight read the first document only (line 40 reached Beam)."""
    records = [_note(i) for i in range(40)]
    del records[38]["patient_id"]
    config = _jsonl(tmp_path / "c.jsonl", records)
    assert validate_corpus(config, "tuple").documents == 40  # the tuple unit needs no patient id
    message = _error(config, "patient")
    assert message.startswith(f"{tmp_path / 'c.jsonl'}:39: ") and "needs a patient id" in message
    records[38]["patient_id"] = "  "  # blank counts as missing
    assert _error(_jsonl(tmp_path / "c.jsonl", records), "patient").startswith(f"{tmp_path / 'c.jsonl'}:39: ")


def test_duplicate_record_ids_are_refused_naming_both_lines(tmp_path):
    """Fails on the previous main: duplicates were accepted silently."""
    records = [_note(i) for i in range(5)] + [_note(2)]
    message = _error(_jsonl(tmp_path / "d.jsonl", records))
    assert message.startswith(f"{tmp_path / 'd.jsonl'}:6: ") and "duplicate record id" in message
    assert "first at line 3" in message and "n2" not in message
    csv = tmp_path / "n.csv"
    csv.write_text('ROW_ID,SUBJECT_ID,TEXT\n7,1,"one\nline two"\n8,1,fine\n7,2,again\n')
    message = _error(CorpusConfig(path=str(csv)))
    assert message.startswith(f"{csv}:5: ") and "first at line 2" in message


def test_late_syntax_errors_are_found_before_anything_is_read_for_real(tmp_path):
    lines = [json.dumps(_note(i)) for i in range(30)]
    lines[24] = '{"text": "' + SECRET + '", '  # truncated JSON on line 25
    bad = tmp_path / "b.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert _error(CorpusConfig(path=str(bad))).startswith(f"{bad}:25:{len(lines[24]) + 1}: not valid JSON")
    csv = tmp_path / "q.csv"
    csv.write_text('ROW_ID,SUBJECT_ID,TEXT\n1,1,fine\n2,1,also fine\n3,1,"' + SECRET + '\n4,1,swallowed\n')
    assert "unterminated quote" in _error(CorpusConfig(path=str(csv))).split(f"{csv}:4: ", 1)[1]


def test_formats_without_patient_ids_and_valid_corpora(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text(SECRET)
    (notes / "b.txt").write_text("another note")
    assert validate_corpus(CorpusConfig(path=str(notes)), "tuple").documents == 2
    assert "needs a patient id" in _error(CorpusConfig(path=str(notes)), "patient", ConfigError)
    synthetic = CorpusConfig(synthetic=SyntheticCorpusConfig(patients=3, admissions_per_patient=1,
                                                             notes_per_admission=2))
    assert validate_corpus(synthetic, "patient").documents == 6
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    assert "corpus is empty" in _error(CorpusConfig(path=str(empty)))


# --- the fingerprint ------------------------------------------------------------------------------

def test_fingerprint_changes_with_the_corpus_and_only_then(tmp_path, monkeypatch):
    """Fails on the previous main (no fingerprint): an appended corpus was served from the cache."""
    config = _jsonl(tmp_path / "c.jsonl", [_note(i) for i in range(48)])
    first = corpus_fingerprint(config, SALT)
    assert first.startswith("content:") and first == corpus_fingerprint(config, SALT)
    os.utime(config.path, ns=(1, 1))  # a touch alone: the same content
    assert corpus_fingerprint(config, SALT) == first
    with open(config.path, "a") as handle:
        handle.write("".join(json.dumps(_note(100 + i)) + "\n" for i in range(12)))
    appended = corpus_fingerprint(config, SALT)
    assert appended != first and appended == corpus_fingerprint(config, SALT)
    # Above the content-hash limit: sizes and mtimes (stat only).
    from dpbert.data import fingerprint

    monkeypatch.setattr(fingerprint, "CONTENT_HASH_MAX_BYTES", 10)
    stat = corpus_fingerprint(config, SALT)
    assert stat.startswith("stat:") and stat == corpus_fingerprint(config, SALT)
    os.utime(config.path, ns=(2, 2))
    assert corpus_fingerprint(config, SALT) != stat
    # A directory: its files as the reader reads them (hidden files are not read, nor counted).
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("one")
    before = corpus_fingerprint(CorpusConfig(path=str(notes)), SALT)
    (notes / ".swp").write_text("editor state")
    assert corpus_fingerprint(CorpusConfig(path=str(notes)), SALT) == before
    (notes / "b.txt").write_text("two")
    assert corpus_fingerprint(CorpusConfig(path=str(notes)), SALT) != before


def test_fingerprint_of_synthetic_and_unreachable_corpora_is_deterministic():
    a = corpus_fingerprint(CorpusConfig(), SALT)
    assert a.startswith("synthetic:") and a == corpus_fingerprint(CorpusConfig(), SALT)
    assert a != corpus_fingerprint(CorpusConfig(synthetic=SyntheticCorpusConfig(seed=7)), SALT)
    remote = corpus_fingerprint(CorpusConfig(path="/gcs/my-bucket/notes.jsonl"), SALT)
    assert remote.startswith("path:") and remote == corpus_fingerprint(CorpusConfig(path="/gcs/my-bucket/notes.jsonl"), SALT)
    assert corpus_fingerprint(CorpusConfig(path="gs://b/notes.jsonl"), SALT).startswith("path:")
