"""dpbert.vocab.wordpiece and dpbert.vocab.histogram_file."""
import collections

import numpy as np
import pytest

from dpbert.data.synthetic import generate_notes
from dpbert.data.tuples import corpus_tuples, distinct_words
from dpbert.data.words import split_words
from dpbert.vocab import histogram_file, wordpiece as wp


@pytest.fixture(scope="module")
def tuples():
    return list(corpus_tuples(generate_notes(patients=40, admissions_per_patient=1, notes_per_admission=2,
                                             seed=3)))


@pytest.fixture(scope="module")
def histogram(tuples):
    """A DP-like histogram: tuple counts + N(0, 2²) noise, kept if >= 8 (floats, like the job's)."""
    counts = collections.Counter()
    for t in tuples:
        counts.update(distinct_words(t))
    rng = np.random.default_rng(0)
    noisy = [(w, c + rng.normal(0, 2.0)) for w, c in sorted(counts.items())]
    return [(w, c) for w, c in noisy if c >= 8]


@pytest.fixture(scope="module")
def tokenizer(histogram):
    return wp.train_wordpiece(histogram, vocab_size=600)


def test_vocab_txt_starts_with_bert_special_tokens(tmp_path, tokenizer):
    vocab_path, tokenizer_path = wp.save_vocabulary(tokenizer, tmp_path / "vocab")
    tokens = wp.read_vocab_txt(vocab_path)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(tokens) == tokenizer.get_vocab_size() == len(set(tokens))
    assert all(tokenizer.token_to_id(t) == i for i, t in enumerate(tokens))
    assert any(t.startswith("##") for t in tokens)


def test_special_ids_are_found_by_name(tmp_path, tokenizer):
    assert wp.special_ids(tokenizer) == wp.SPECIAL_IDS == wp.special_ids() == (0, 1, 2, 3, 4)
    assert wp.SPECIAL_IDS.mask == wp.MASK_ID == 4 and wp.SPECIAL_IDS.pad == wp.PAD_ID == 0
    assert wp.SPECIAL_IDS.by_token() == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    wp.save_vocabulary(tokenizer, tmp_path)
    assert wp.special_ids(wp.read_vocab_txt(tmp_path / wp.VOCAB_FILE)) == wp.SPECIAL_IDS
    # a BERT checkpoint's vocabulary: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103
    bert = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"]
    ids = wp.special_ids(bert)
    assert ids == (0, 100, 101, 102, 103) and ids.mask == 103 and ids.cls == 101
    assert wp.special_ids({t: i for i, t in enumerate(bert)}) == ids
    with pytest.raises(ValueError, match=r"no \[MASK\] token"):
        wp.special_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])


def test_evaluators_use_the_vocabulary_special_ids():
    from dpbert.evaluate import canary, membership, ner

    for module in (canary, membership):
        assert module.SPECIAL_IDS is wp.SPECIAL_IDS and module.MASK_ID == wp.MASK_ID
    assert (ner.PAD_ID, ner.UNK_ID, ner.CLS_ID, ner.SEP_ID, ner.MASK_ID) == wp.SPECIAL_IDS


def test_size_is_at_most_the_target(histogram, tokenizer):
    assert 100 < tokenizer.get_vocab_size() <= 600
    small = wp.train_wordpiece(histogram, vocab_size=40)
    assert small.get_vocab_size() <= 40
    assert small.token_to_id("[PAD]") == 0


def test_frequent_words_are_whole_tokens(histogram, tokenizer):
    top = [w for w, _ in sorted(histogram, key=lambda wc: -wc[1])[:40]]
    for word in top:
        assert tokenizer.encode([word], is_pretokenized=True, add_special_tokens=False).tokens == [word]


def test_tokenizer_normalization_is_dpbert_word_definition(tokenizer):
    texts = ["Pt. c/o CHEST-pain x3 days; BP 120/80, HR 88.", "Émile Zoë naïve café",
             "日本語 text\twith\ttabs\nand\x00control", "  leading and trailing  ", "[**Name**] 2150-01-01"]
    for text in texts:
        normalized = tokenizer.normalizer.normalize_str(text)
        assert [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)] == split_words(text)


def test_post_processor_decoder_and_roundtrip(tmp_path, tokenizer):
    encoding = tokenizer.encode("the patient was discharged")
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    assert tokenizer.decode(encoding.ids) == "the patient was discharged"
    wp.save_vocabulary(tokenizer, tmp_path)
    loaded = wp.load_tokenizer(tmp_path)
    assert loaded.encode("the patient was discharged").ids == encoding.ids
    (tmp_path / wp.TOKENIZER_FILE).unlink()
    from_vocab = wp.load_tokenizer(tmp_path)  # a BERT checkpoint's vocab.txt alone
    assert from_vocab.encode("the patient was discharged, unknownword!").ids == \
        tokenizer.encode("the patient was discharged, unknownword!").ids


def test_scaled_counts_give_the_same_top_tokens(histogram):
    unscaled = wp.train_wordpiece(histogram, vocab_size=400, count_scale=1.0)
    # Smallest count 8 × 2 = 16 copies: well above the rounding noise.
    scaled = wp.train_wordpiece(histogram, vocab_size=400, count_scale=2.0)
    shrunk = wp.train_wordpiece([(w, c * 1000.0) for w, c in histogram], vocab_size=400)  # auto scale
    top = [w for w, _ in sorted(histogram, key=lambda wc: -wc[1])[:60]]
    base = [unscaled.encode([w], is_pretokenized=True).tokens for w in top]
    for other in (scaled, shrunk):
        assert [other.encode([w], is_pretokenized=True).tokens for w in top] == base
        overlap = set(other.get_vocab()) & set(unscaled.get_vocab())
        assert len(overlap) >= 0.95 * unscaled.get_vocab_size()


def test_automatic_scale():
    exact = np.array([1.0, 5.0, 1e9])
    assert wp.choose_count_scale(exact) == 1.0  # an exact histogram is never scaled
    dp = np.full(1000, 1400.0)  # shrink until the smallest is MIN_SCALED_COUNT copies
    scale = wp.choose_count_scale(dp)
    assert scale < 1 and wp.scaled_counts(dp, scale).min() >= wp.MIN_SCALED_COUNT
    assert wp.scaled_counts(np.array([0.2, 2.6]), 1.0).tolist() == [1, 3]


def test_tokenize_tuples(tokenizer, tuples):
    batch = tuples[:5]
    ids = wp.tokenize_tuples(tokenizer, batch, max_seq_length=32, batch_size=2)
    assert ids.dtype == np.int32 and ids.shape == (5, 32)
    assert (ids[:, 0] == tokenizer.token_to_id("[CLS]")).all()
    for row, t in zip(ids, batch):
        single = tokenizer.encode(list(t.words), is_pretokenized=True).ids
        expected = single[:31] + [tokenizer.token_to_id("[SEP]")] if len(single) > 32 else single
        assert row[:len(expected)].tolist() == expected
        assert (row[len(expected):] == 0).all()
    short = wp.tokenize_tuples(tokenizer, [["pain"], []], max_seq_length=8)
    assert short[1].tolist() == [2, 3, 0, 0, 0, 0, 0, 0]
    assert wp.tokenize_tuples(tokenizer, [], 8).shape == (0, 8)


@pytest.mark.parametrize("call, name", [
    (lambda h: wp.train_wordpiece(h, vocab_size=9), "vocab_size"),
    (lambda h: wp.train_wordpiece([], vocab_size=100), "histogram is empty"),
    (lambda h: wp.train_wordpiece([("a", 0.0)], vocab_size=100), "count"),
    (lambda h: wp.train_wordpiece([("a", 3), ("a", 4)], vocab_size=100), "more than once"),
    (lambda h: wp.train_wordpiece(h, vocab_size=100, count_scale=0), "count_scale"),
    (lambda h: wp.train_wordpiece(h, vocab_size=100, min_frequency=-1), "min_frequency"),
])
def test_bad_parameters_are_rejected(histogram, call, name):
    with pytest.raises(ValueError, match=name):
        call(histogram)


def test_tokenize_tuples_rejects_bad_parameters(tokenizer):
    with pytest.raises(ValueError, match="max_seq_length"):
        wp.tokenize_tuples(tokenizer, [["a"]], max_seq_length=1)
    with pytest.raises(TypeError, match="pre-split"):
        wp.tokenize_tuples(tokenizer, ["not split"], max_seq_length=8)


def test_histogram_file_roundtrip_and_errors(tmp_path):
    path = str(tmp_path / "h.jsonl")
    pairs = [("b", 2.5), ("a", 2.5), ("tab\there", 10.0), ("é", 3)]
    assert histogram_file.write_histogram(pairs, path) == 4
    assert histogram_file.read_histogram(path) == [("tab\there", 10.0), ("é", 3), ("a", 2.5), ("b", 2.5)]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"word": "secret", "count": "x"}\n')
    with pytest.raises(ValueError, match=r"h\.jsonl:5") as info:
        histogram_file.read_histogram(path)
    assert "secret" not in str(info.value)
