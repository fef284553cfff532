import pytest

from dpbert.config import CorpusConfig
from dpbert.data.corpus import PartitionStats, count_tuples, iter_tuples
from dpbert.data.readers import CorpusError, Document
from dpbert.data.tuples import corpus_tuples, distinct_words, document_tuples, partition_words
from dpbert.data.words import split_words


def test_word_definition_lowercases_strips_accents_and_splits_punctuation():
    assert split_words("Pt. JOHNSON,  café\tBP 120/80") == ["pt", ".", "johnson", ",", "cafe", "bp", "120", "/", "80"]


@pytest.mark.parametrize("n_words,n,expected", [
    (0, 4, []), (3, 4, [3]), (4, 4, [4]), (5, 4, [4, 1]), (9, 4, [4, 4, 1]), (7, 1, [1] * 7)])
def test_partition_boundaries_and_short_tail(n_words, n, expected):
    words = [f"w{i}" for i in range(n_words)]
    chunks = partition_words(words, n)
    assert [len(c) for c in chunks] == expected
    assert [w for c in chunks for w in c] == words  # consecutive, nothing lost or repeated


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_partition_rejects_bad_tuple_words(bad):
    with pytest.raises(ValueError, match="tuple_words"):
        partition_words(["a"], bad)


def test_tuples_carry_provenance_and_are_deterministic():
    doc = Document("d1", "a b c d e f g", patient_id="p", admission_id="h")
    first = list(document_tuples(doc, 3))
    assert [t.words for t in first] == [("a", "b", "c"), ("d", "e", "f"), ("g",)]
    assert [t.tuple_id for t in first] == ["d1#0", "d1#1", "d1#2"]
    assert all(t.patient_id == "p" and t.admission_id == "h" for t in first)
    assert first == list(document_tuples(doc, 3))


def test_tuples_never_cross_documents():
    docs = [Document("a", "x y z"), Document("b", "u v")]
    assert [t.words for t in corpus_tuples(docs, 2)] == [("x", "y"), ("z",), ("u", "v")]


def test_distinct_words_counts_each_word_once():
    t = next(document_tuples(Document("d", "the cat the hat the"), 256))
    assert distinct_words(t) == {"the", "cat", "hat"}


def test_synthetic_corpus_partition_stats_and_determinism():
    config = CorpusConfig()
    config.synthetic.patients = 3
    stats = PartitionStats()
    tuples = list(iter_tuples(config, 256, stats))
    assert stats.tuples == len(tuples) == count_tuples(config, 256)
    assert stats.documents == 3 * 2 * 2 and stats.patients == 3
    assert stats.words == sum(len(t.words) for t in tuples)
    assert all(1 <= len(t.words) <= 256 for t in tuples)
    assert tuples == list(iter_tuples(config, 256))


def test_zero_tuples_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("\x00\x01\x02")  # control characters only: no words
    config = CorpusConfig(path=str(tmp_path))
    with pytest.raises(CorpusError, match="zero tuples"):
        list(iter_tuples(config, 256))


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "notes.jsonl").write_text("\n")
    with pytest.raises(CorpusError, match=r"notes\.jsonl: corpus is empty"):
        list(iter_tuples(CorpusConfig(path=str(tmp_path / "notes.jsonl")), 256))
