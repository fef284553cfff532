"""Shared fixtures for the model tests: a tiny BERT spec and a repetitive synthetic corpus."""
import numpy as np
import pytest

SPECIALS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}


def repetitive_corpus(n=64, length=16, vocab=40, seed=0):
    """n sequences [CLS] w1..w10 [SEP] [PAD]...: three rotations of one 10-token sentence."""
    rng = np.random.default_rng(seed)
    base = rng.integers(5, vocab, 10)
    ids = np.zeros((n, length), np.int32)
    for i in range(n):
        ids[i, 0] = SPECIALS["[CLS]"]
        ids[i, 1:11] = np.roll(base, i % 3)
        ids[i, 11] = SPECIALS["[SEP]"]
    return ids


@pytest.fixture
def corpus():
    return repetitive_corpus()


@pytest.fixture
def tiny_spec():
    from dpbert.model.bert import BertSpec

    return BertSpec(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                    max_seq_length=12, max_predictions=4, dropout=0.0, attention_dropout=0.0)
