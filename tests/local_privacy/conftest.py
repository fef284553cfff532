"""Toy vocabularies and tables for the local-privacy tests (no public checkpoint needed)."""
import numpy as np
import pytest

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]
WORDS = ["the", "patient", "was", "given", "aspirin", "for", "fever", "pain", "heart", "rate", "and", "a", "mg",
         ".", ",", "'", "blood", "pressure", "high", "low", "dose", "daily", "10", "20", "s", "##s", "##ing", "##ed"]
TOY_TOKENS = SPECIALS + WORDS


@pytest.fixture
def toy_embeddings():
    from dpbert.local_privacy.embeddings import random_embeddings

    return random_embeddings(TOY_TOKENS, dim=16, seed=3)


@pytest.fixture
def separated_embeddings():
    """One-hot rows: every pair of tokens at distance √2 (well separated)."""
    from dpbert.local_privacy.embeddings import TokenEmbeddings, tokenizer_from_vocab

    return TokenEmbeddings(list(TOY_TOKENS), np.eye(len(TOY_TOKENS), dtype=np.float32),
                           tokenizer_from_vocab(TOY_TOKENS), source="one-hot")


def many_tokens(n=200):
    return SPECIALS + [f"w{i}" for i in range(n)]
