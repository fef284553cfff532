"""A user's corpus as `dpbert run` reads it: a JSONL line cut mid-record, a JSON error's column,
bytes that are not UTF-8 and ``corpus.encoding``, a folder's files and ``corpus.glob``. In-process
(``dpbert_cli.main.main``) on small files; nothing trains."""
import pytest

from dpbert import exit_codes
from tests.cli.test_user_errors import assert_user_error, in_process  # noqa: F401 (fixture)


NO_BUDGET = ("--set", "privacy.epsilon_budget=null")


# ------------------------------------------------------------------ JSONL

def test_a_jsonl_line_cut_mid_record_names_file_line_and_json_column(tmp_path, in_process):
    corpus = tmp_path / "notes.jsonl"
    cut = '{"patient_id": "p2", "text": "secret note text"'  # json's error is just past its end
    corpus.write_text('{"patient_id": "p1", "text": "first note"}\n' + cut + "\n", encoding="utf-8")
    result = in_process("run", "--corpus", corpus, "--output", tmp_path / "out", *NO_BUDGET)
    line = assert_user_error(result, exit_codes.BAD_INPUT, f"{corpus}:2:{len(cut) + 1}:", "cut mid-record")
    assert "column 1" not in line and "secret note" not in line
    assert not (tmp_path / "out").exists()


def test_a_json_error_inside_a_line_keeps_its_column(tmp_path):
    from dpbert.data.readers import CorpusError, read_jsonl

    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "abc" "x": 1}\n', encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        list(read_jsonl(path))
    assert str(err.value).startswith(f"{path}:1:16: not valid JSON: Expecting ',' delimiter")
    assert err.value.column == 16 and "cut mid-record" not in str(err.value)


# ------------------------------------------------------------------ the corpus's encoding

def _latin1_corpus(tmp_path):
    corpus = tmp_path / "latin.jsonl"
    corpus.write_bytes('{"patient_id": "p1", "text": "patient ok"}\n'.encode("utf-8")
                      + '{"patient_id": "p2", "text": "caf\u00e9 au lait"}\n'.encode("latin-1"))
    return corpus


def test_latin1_bytes_read_as_utf8_are_an_error_naming_file_line_and_corpus_encoding(tmp_path, in_process):
    corpus = _latin1_corpus(tmp_path)
    result = in_process("run", "--corpus", corpus, "--output", tmp_path / "out", *NO_BUDGET)
    line = assert_user_error(result, exit_codes.BAD_INPUT, f"{corpus}:2:", "0xe9", "corpus.encoding")
    assert "caf" not in line and not (tmp_path / "out").exists()


def test_corpus_encoding_reads_latin1_and_replace_keeps_the_count(tmp_path):
    from dpbert.config import ConfigError, load_config
    from dpbert.data.corpus import iter_documents
    from dpbert.data.readers import DecodeStats

    corpus = _latin1_corpus(tmp_path)
    latin = load_config(None, [f"corpus.path={corpus}", "corpus.encoding=latin-1"]).corpus
    assert [d.text for d in iter_documents(latin)][1] == "caf\u00e9 au lait"
    replace = load_config(None, [f"corpus.path={corpus}", "corpus.encoding=utf-8:replace"]).corpus
    stats = DecodeStats()
    assert [d.text for d in iter_documents(replace, stats)][1] == "caf\ufffd au lait" and stats.replaced_bytes == 1
    with pytest.raises(ConfigError, match="corpus.encoding"):
        load_config(None, ["corpus.encoding=klingon"])


# ------------------------------------------------------------------ a folder corpus

def test_a_folder_corpus_reads_txt_files_unless_corpus_glob_says_otherwise(tmp_path):
    from dpbert.config import ConfigError, load_config
    from dpbert.data.corpus import iter_documents
    from dpbert.data.fingerprint import corpus_files

    (tmp_path / "notes" / "a").mkdir(parents=True)
    (tmp_path / "notes" / "a" / "1.txt").write_text("first note text", encoding="utf-8")
    (tmp_path / "notes" / "2.txt").write_text("second note text", encoding="utf-8")
    (tmp_path / "notes" / "README.md").write_text("not a note", encoding="utf-8")
    corpus = f"corpus.path={tmp_path / 'notes'}"
    config = load_config(None, [corpus]).corpus
    assert [d.doc_id for d in iter_documents(config)] == ["2.txt", "a/1.txt"]  # *.txt only, sorted
    assert [rel for rel, _ in corpus_files(config)] == ["2.txt", "a/1.txt"]    # one definition of the list
    everything = load_config(None, [corpus, "corpus.glob=*"]).corpus
    assert sorted(d.doc_id for d in iter_documents(everything)) == ["2.txt", "README.md", "a/1.txt"]
    with pytest.raises(ConfigError, match="corpus.glob"):
        load_config(None, [corpus, "corpus.glob=../*.txt"])
