import json

import pytest

from dpbert.data.readers import CorpusError, DecodeStats, read_corpus, read_csv, read_jsonl, read_text_dir

MIMIC_HEADER = "ROW_ID,SUBJECT_ID,HADM_ID,CHARTDATE,CHARTTIME,STORETIME,CATEGORY,DESCRIPTION,CGID,ISERROR,TEXT\n"


def test_text_dir_one_document_per_file_sorted_and_hidden_skipped(tmp_path):
    (tmp_path / "b.txt").write_text("second note")
    (tmp_path / "a.txt").write_text("first note")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("third")
    (tmp_path / ".hidden").write_text("never")
    (tmp_path / "empty.txt").write_text("   \n")
    stats = DecodeStats()
    docs = list(read_text_dir(tmp_path, stats))
    assert [d.doc_id for d in docs] == ["a.txt", "b.txt", "sub/c.txt"]
    assert [d.text for d in docs] == ["first note", "second note", "third"]
    assert stats.skipped_empty == 1 and stats.documents == 3


def test_jsonl_fields_and_ids(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"text": "a b", "patient_id": 7, "admission_id": "A1", "note_id": "n1"}) + "\n\n"
        + json.dumps({"text": "c"}) + "\n")
    docs = list(read_jsonl(path))
    assert docs[0].patient_id == "7" and docs[0].admission_id == "A1" and docs[0].doc_id == "n1"
    assert docs[1].patient_id is None and docs[1].doc_id == "c.jsonl:3"


@pytest.mark.parametrize("line,message", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"body": "x"}', "no 'text' field"),
    ('{"text": 3}', "'text' must be a string"),
])
def test_jsonl_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(CorpusError) as err:
        list(read_jsonl(path))
    assert f"{path}:2:" in str(err.value) and message in str(err.value)


def test_mimic_csv_multiline_quoted_text_and_iserror(tmp_path):
    path = tmp_path / "NOTEEVENTS.csv"
    path.write_text(
        MIMIC_HEADER
        + '1,10,100,2100-01-01,,,Discharge summary,Report,,,"Admission Date:  [**2100-1-1**]\n\n'
          'HISTORY: ""chest pain"", 3 days,\nsecond line"\n'
        + '2,10,100,2100-01-02,,,Nursing,Note,5,1,"erroneous note"\n'
        + '3,11,,2100-01-03,,,Radiology,CXR,,,"single line"\n')
    stats = DecodeStats()
    docs = list(read_csv(path, stats))
    assert [d.note_id for d in docs] == ["1", "3"]
    assert docs[0].text.startswith("Admission Date:") and '"chest pain", 3 days,\nsecond line' in docs[0].text
    assert docs[0].patient_id == "10" and docs[0].admission_id == "100"
    assert docs[1].admission_id is None  # empty HADM_ID
    assert stats.skipped_error_rows == 1


def test_csv_without_text_column_names_file_and_columns(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("ROW_ID,NOTE\n1,abc\n")
    with pytest.raises(CorpusError, match=r"x\.csv:1: CSV header has no TEXT column"):
        list(read_csv(path))


def test_csv_row_with_wrong_field_count_names_its_line(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text('ROW_ID,TEXT\n1,"multi\nline"\n2,b,extra\n')
    with pytest.raises(CorpusError, match=r"x\.csv:4: row has 3 fields"):
        list(read_csv(path))


def test_undecodable_bytes_are_replaced_and_counted(tmp_path):
    (tmp_path / "n.txt").write_bytes(b"caf\xe9 ok \xff\xfe end")
    stats = DecodeStats()
    docs = list(read_text_dir(tmp_path, stats))
    assert docs[0].text == "caf\ufffd ok \ufffd\ufffd end"
    assert stats.replaced_bytes == 3
    jl = tmp_path / "j.jsonl"
    jl.write_bytes(b'{"text": "a \xff b"}\n')
    stats = DecodeStats()
    assert list(read_jsonl(jl, stats))[0].text == "a \ufffd b" and stats.replaced_bytes == 1


def test_missing_path_and_unknown_format(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        list(read_corpus(tmp_path / "nope.csv"))
    (tmp_path / "x.parquet").write_text("")
    with pytest.raises(CorpusError, match="cannot tell the corpus format"):
        list(read_corpus(tmp_path / "x.parquet"))
    with pytest.raises(CorpusError, match="unknown corpus format"):
        list(read_corpus(tmp_path / "x.parquet", "xml"))


def test_readers_stream(tmp_path):
    """A reader yields the first document before reading the rest of the file."""
    path = tmp_path / "big.jsonl"
    path.write_text('{"text": "first"}\n{broken\n')
    it = read_jsonl(path)
    assert next(it).text == "first"
    with pytest.raises(CorpusError):
        next(it)


@pytest.mark.parametrize("body, line, message", [
    # The quote opened on line 2 never closes: the later rows must not end up inside the note.
    ('ROW_ID,ISERROR,TEXT\n1,0,"first note\n2,0,second note\n3,0,third\n', 2, "unterminated quote"),
    # ... nor when a later row's quote happens to close it.
    ('ROW_ID,ISERROR,TEXT\n1,0,"first note\n2,0,"second"\n', 2, "detected at line 3"),
    ('ROW_ID,ISERROR,TEXT\n1,0,ok\n2,0,"a "quoted" word"\n', 3, "malformed quote"),
    ('ROW_ID,"TEXT\n', 1, "unterminated quote"),
])
def test_csv_malformed_quote_names_file_and_line(tmp_path, body, line, message):
    path = tmp_path / "notes.csv"
    path.write_text(body)
    with pytest.raises(CorpusError) as err:
        list(read_csv(path))
    assert str(err.value).startswith(f"{path}:{line}: ") and message in str(err.value)
    assert "second note" not in str(err.value)  # never quotes a note


def test_csv_literal_quote_inside_an_unquoted_field_is_kept(tmp_path):
    path = tmp_path / "notes.csv"
    path.write_text('ROW_ID,TEXT\n1,he said "no\n2,next\n')
    assert [d.text for d in read_csv(path)] == ['he said "no', "next"]
