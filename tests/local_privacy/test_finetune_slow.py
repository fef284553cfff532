"""Fine-tuning on privatized input (BC5CDR "has a Chemical"), at toy scale: a random public-style
table over the corpus's own words. Slow: trains several small Keras models."""
import math

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def word_table():
    from dpbert.data.words import split_words
    from dpbert.evaluate.ner import bundled_bc5cdr
    from dpbert.local_privacy.embeddings import random_embeddings

    words = sorted({w for split in ("train", "test") for s in bundled_bc5cdr(split)
                    for token in s.tokens for w in split_words(token)})
    return random_embeddings(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words, dim=32, seed=0)


def test_original_beats_majority_and_small_eta_hurts(word_table):
    from dpbert.local_privacy import finetune
    from dpbert.local_privacy.pretrain import build_frozen_bert

    tokenizer = word_table.tokenizer
    task = finetune.chemical_sentence_task(tokenizer, max_seq_length=48)
    assert task["train_ids"].shape == (1000, 48) and set(np.unique(task["train_labels"])) == {0, 1}
    mechanism = word_table.mechanism()
    keep = [0, 2, 3]
    encoders = {"none": lambda eta: build_frozen_bert(mechanism.table, max_seq_length=48, num_layers=1,
                                                      num_heads=2, dropout=0.0, seed=0)}
    rows = finetune.classification_table(mechanism, task, [math.inf, 0.5], encoders, keep_ids=keep, epochs=4, seed=0)
    by_eta = {r["eta"]: r for r in rows}
    original, noisy = by_eta[math.inf], by_eta[0.5]
    assert original["tokens_changed"] == 0 and noisy["tokens_changed"] > 0.9
    assert original["accuracy"] > original["majority"] + 0.05
    assert noisy["accuracy"] < original["accuracy"]
    table = finetune.format_classification_table(rows)
    assert "original (η = ∞)" in table and "η = 0.5" in table


def test_pretrain_then_finetune_runs(word_table):
    from dpbert.local_privacy import finetune
    from dpbert.local_privacy.experiments import public_pretraining_ids
    from dpbert.local_privacy.pretrain import Encoder, Objective, pretrain

    tokenizer = word_table.tokenizer
    mechanism = word_table.mechanism()
    ids = public_pretraining_ids(tokenizer, 32, patients=4)
    assert ids.shape[1] == 32 and (ids[:, 0] == 2).all() and (ids[:, -1] == 3).all()
    result = pretrain(ids, mechanism, Objective("denoising", 4, [0, 2, 3]), 20.0, encoder=Encoder(num_layers=1),
                      steps=10, batch_size=8, seed=0)
    task = finetune.chemical_sentence_task(tokenizer, max_seq_length=32)
    small = {k: v[:200] for k, v in task.items()}
    scores = finetune.finetune_and_evaluate(result.models, small["train_ids"], small["train_labels"],
                                            small["test_ids"], small["test_labels"], epochs=1)
    assert 0 <= scores["accuracy"] <= 1
