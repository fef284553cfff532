"""NER readers, conlleval entity semantics, entity-level scores and word-piece alignment."""
import numpy as np
import pytest

from dpbert.evaluate import ner
from dpbert.evaluate.ner import Entity, NerFormatError, Sentence


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------- readers

def test_read_conll_sentences_docstart_and_extra_columns(tmp_path):
    path = write(tmp_path / "a.tsv",
                 "-DOCSTART-\tO\n\n"
                 "Selegiline\tB-Chemical\n-\tO\ninduced\tO\nhypotension\tB-Disease\n\n\n"
                 "Heart\tNN\tB-Disease\r\nfailure\tNN\tI-Disease\r\n")
    sentences = ner.read_conll(path)
    assert sentences == [
        Sentence(("Selegiline", "-", "induced", "hypotension"), ("B-Chemical", "O", "O", "B-Disease")),
        Sentence(("Heart", "failure"), ("B-Disease", "I-Disease")),
    ]


@pytest.mark.parametrize("body,line,message", [
    ("a\tO\nb O\n", 2, "no tab"),
    ("a\tO\n\nb\tX-Foo\n", 3, "invalid tag 'X-Foo'"),
    ("a\tB-\n", 1, "invalid tag"),
    ("\tO\n", 1, "empty token"),
])
def test_read_conll_malformed_lines_name_file_and_line(tmp_path, body, line, message):
    path = write(tmp_path / "bad.tsv", body)
    with pytest.raises(NerFormatError) as info:
        ner.read_conll(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert message in str(info.value)
    assert info.value.line == line


I2B2_TXT = ("Patient denies chest pain today .\n"
            "\n"
            "Started on aspirin 81 mg for CAD .\n"
            "CT scan of the head was negative\n")
I2B2_CON = ('c="chest pain" 1:2 1:3||t="problem"\n'
            'c="aspirin 81 mg" 3:2 3:4||t="treatment"\n'
            'c="cad" 3:6 3:6||t="problem"\n'
            'c="ct scan of the head" 4:0 4:4||t="test"\n')


def test_read_i2b2_pair(tmp_path):
    txt = write(tmp_path / "r.txt", I2B2_TXT)
    con = write(tmp_path / "r.con", I2B2_CON)
    sentences = ner.read_i2b2(txt, con)
    assert [s.tokens for s in sentences] == [
        ("Patient", "denies", "chest", "pain", "today", "."),
        ("Started", "on", "aspirin", "81", "mg", "for", "CAD", "."),
        ("CT", "scan", "of", "the", "head", "was", "negative"),
    ]
    assert [s.tags for s in sentences] == [
        ("O", "O", "B-problem", "I-problem", "O", "O"),
        ("O", "O", "B-treatment", "I-treatment", "I-treatment", "O", "B-problem", "O"),
        ("B-test", "I-test", "I-test", "I-test", "I-test", "O", "O"),
    ]
    assert ner.extract_entities(sentences[1].tags) == [Entity("treatment", 2, 5), Entity("problem", 6, 7)]


@pytest.mark.parametrize("con,line,message", [
    ('c="chest pain" 1:2 1:3||t="problem"\nnonsense\n', 2, "expected"),
    ('c="chest pain" 9:2 9:3||t="problem"\n', 1, "outside r.txt"),
    ('c="chest pain" 1:5 1:7||t="problem"\n', 1, "outside line 1"),
    ('c="chest ache" 1:2 1:3||t="problem"\n', 1, "does not match"),
    ('c="chest pain" 1:2 1:3||t="problem"\nc="pain" 1:3 1:3||t="problem"\n', 2, "overlaps the concept on line 1"),
    ('c="chest pain" 1:2 3:0||t="problem"\n', 1, "several lines"),
])
def test_read_i2b2_errors_name_con_file_and_line(tmp_path, con, line, message):
    txt = write(tmp_path / "r.txt", I2B2_TXT)
    path = write(tmp_path / "r.con", con)
    with pytest.raises(NerFormatError) as info:
        ner.read_i2b2(txt, path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert message in str(info.value)


def test_bundled_bc5cdr_subset():
    train, test = ner.bundled_bc5cdr("train"), ner.bundled_bc5cdr("test")
    assert (len(train), len(test)) == (1000, 300)
    assert train[0].tokens[:4] == ("Selegiline", "-", "induced", "postural")
    assert train[0].tags[:5] == ("B-Chemical", "O", "O", "B-Disease", "I-Disease")
    assert test[0].tokens[:3] == ("Torsade", "de", "pointes")

    def count(sentences, etype):
        return sum(e.type == etype for s in sentences for e in ner.extract_entities(s.tags))
    # the numbers the resource README states
    assert (count(train, "Chemical"), count(train, "Disease")) == (1219, 988)
    assert (count(test, "Chemical"), count(test, "Disease")) == (333, 273)
    assert ner.label_list(train) == ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    with pytest.raises(ValueError):
        ner.bundled_bc5cdr_path("devel")


# ------------------------------------------------------------------- entities and scores

def test_extract_entities_conlleval_semantics():
    tags = ["B-A", "I-A", "O", "I-A", "I-B", "B-B", "I-B", "I-A", "B-A"]
    assert ner.extract_entities(tags) == [
        Entity("A", 0, 2),   # B-A I-A
        Entity("A", 3, 4),   # I-A after O starts an entity
        Entity("B", 4, 5),   # I-B after a different type starts an entity
        Entity("B", 5, 7),   # B-B closes the previous one
        Entity("A", 7, 8),   # I-A after I-B
        Entity("A", 8, 9),   # B-A after I-A of the same type: a new entity
    ]
    assert ner.extract_entities([]) == []
    assert ner.extract_entities(["O", "O"]) == []
    with pytest.raises(ValueError):
        ner.extract_entities(["E-A"])


def test_entity_scores_exact_span_and_type():
    gold = [["B-D", "I-D", "O", "B-C"],      # D[0,2) C[3,4)
            ["B-C", "I-C", "I-C", "O"],      # C[0,3)
            ["O", "O", "B-D", "O"]]          # D[2,3)
    pred = [["B-D", "I-D", "O", "B-D"],      # D[0,2) ok; D[3,4) wrong type
            ["B-C", "I-C", "O", "O"],        # C[0,2) partial: miss + false positive
            ["O", "O", "I-D", "O"]]          # I-D after O = D[2,3): ok (conlleval)
    result = ner.entity_scores(gold, pred)
    # gold: D 2, C 2 ; predicted: D 3, C 1 ; correct: D 2, C 0
    assert (result["tp"], result["fp"], result["fn"]) == (2, 2, 2)
    assert result["precision"] == pytest.approx(0.5)
    assert result["recall"] == pytest.approx(0.5)
    assert result["f1"] == pytest.approx(0.5)
    d, c = result["per_type"]["D"], result["per_type"]["C"]
    assert (d["precision"], d["recall"]) == (pytest.approx(2 / 3), pytest.approx(1.0))
    assert d["f1"] == pytest.approx(0.8)
    assert (c["precision"], c["recall"], c["f1"], c["support"]) == (0.0, 0.0, 0.0, 2)
    perfect = ner.entity_scores(gold, gold)
    assert perfect["f1"] == 1.0 and perfect["per_type"]["C"]["f1"] == 1.0
    empty = ner.entity_scores(gold, [["O"] * 4] * 3)
    assert (empty["precision"], empty["recall"], empty["f1"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="sentence 1"):
        ner.entity_scores(gold, [gold[0], ["O"], gold[2]])


# ------------------------------------------------------------------- word-piece alignment

PIECES = {"aspirin": [10, 11], "causes": [12], "heart": [13], "failure": [14, 15, 16], "x": []}


def piece_fn(word):
    return PIECES.get(word, [20])


def test_encode_sentences_labels_first_piece_only():
    labels = ner.label_list([], types=["C", "D"])
    assert labels == ["O", "B-C", "I-C", "B-D", "I-D"]
    label_to_id = {l: i for i, l in enumerate(labels)}
    s = Sentence(("aspirin", "causes", "heart", "failure", "x"), ("B-C", "O", "B-D", "I-D", "O"))
    enc = ner.encode_sentences([s], piece_fn, label_to_id, max_seq_length=12)
    I = ner.IGNORE_LABEL
    np.testing.assert_array_equal(enc.input_ids[0], [2, 10, 11, 12, 13, 14, 15, 16, 1, 3, 0, 0])
    np.testing.assert_array_equal(enc.labels[0], [I, 1, I, 0, 3, 4, I, I, 0, I, I, I])
    np.testing.assert_array_equal(enc.first_piece[0], [-1, 0, -1, 1, 2, 3, -1, -1, 4, -1, -1, -1])
    # predictions at first pieces map back to the words
    predicted = ner.decode_predictions(enc, np.where(enc.labels < 0, 0, enc.labels), labels, [s])
    assert predicted == [s.tags]


def test_encode_sentences_splits_long_sentences_at_word_boundaries():
    label_to_id = {"O": 0, "B-C": 1, "I-C": 2, "B-D": 3, "I-D": 4}
    s = Sentence(("aspirin", "causes", "heart", "failure", "causes", "aspirin"),
                 ("B-C", "O", "B-D", "I-D", "O", "B-C"))
    enc = ner.encode_sentences([s, Sentence(("heart",), ("B-D",))], piece_fn, label_to_id,
                               max_seq_length=6)  # room for 4 pieces per window
    np.testing.assert_array_equal(enc.input_ids, [
        [2, 10, 11, 12, 13, 3],   # aspirin causes heart
        [2, 14, 15, 16, 12, 3],   # failure causes
        [2, 10, 11, 3, 0, 0],     # aspirin
        [2, 13, 3, 0, 0, 0],      # second sentence
    ])
    np.testing.assert_array_equal(enc.sentence_index, [0, 0, 0, 1])
    predicted = ner.decode_predictions(enc, np.where(enc.labels < 0, 0, enc.labels),
                                       ["O", "B-C", "I-C", "B-D", "I-D"], [s, Sentence(("heart",), ("B-D",))])
    assert predicted[0] == s.tags and predicted[1] == ("B-D",)
    # one word longer than a window keeps its first pieces
    enc = ner.encode_sentences([Sentence(("failure",), ("B-D",))], piece_fn, label_to_id, 4)
    np.testing.assert_array_equal(enc.input_ids, [[2, 14, 15, 3]])


def test_word_piece_ids_with_a_wordpiece_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "sele": 5, "##gil": 6,
             "##ine": 7, "heart": 8, "failure": 9, "-": 10, "induced": 11, "s": 12, "'": 13}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pieces = ner.word_piece_ids(tokenizer, ["Selegiline", "-", "induced", "Parkinson's", "\x00"])
    # "Parkinson's" is pre-tokenized into three words, all pieces of the one NER token;
    # a token that normalizes to nothing becomes [UNK]
    assert pieces == [[5, 6, 7], [10], [11], [1, 13, 12], [1]]
