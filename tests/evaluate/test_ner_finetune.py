"""finetune_and_score against a tiny tf_keras encoder built here (the real BERT plugs in the same
way: a builder returning a model input_ids -> {"sequence_output": [B, L, H]})."""
import numpy as np
import tensorflow as tf
import tf_keras

from dpbert.evaluate import ner
from dpbert.evaluate.ner import Sentence

# word -> pieces; multi-piece words check that only the first piece carries the label
PIECES = {"aspirin": [10, 11], "heparin": [12, 11], "ibuprofen": [13], "heart": [14],
          "renal": [15, 16], "failure": [17], "fever": [18, 19], "the": [20], "patient": [21],
          "had": [22], "after": [23], "and": [24], "with": [25], "given": [26], ".": [27]}
VOCAB_SIZE = 32
CHEMICALS = ["aspirin", "heparin", "ibuprofen"]
DISEASES = [["heart", "failure"], ["renal", "failure"], ["fever"]]
FILLER = ["the", "patient", "had", "after", "and", "with", "given"]


def tokenizer(word):
    return PIECES[word]


def synthetic_sentences(n, rng):
    sentences = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.integers(2, 5)):
            kind = rng.integers(0, 3)
            if kind == 0:
                tokens.append(CHEMICALS[rng.integers(len(CHEMICALS))])
                tags.append("B-Chemical")
            elif kind == 1:
                words = DISEASES[rng.integers(len(DISEASES))]
                tokens += words
                tags += ["B-Disease"] + ["I-Disease"] * (len(words) - 1)
            else:
                tokens.append(FILLER[rng.integers(len(FILLER))])
                tags.append("O")
        tokens.append(".")
        tags.append("O")
        sentences.append(Sentence(tuple(tokens), tuple(tags)))
    return sentences


def tiny_encoder_builder(max_seq_length, hidden=16):
    def build():
        ids = tf_keras.Input(shape=(max_seq_length,), dtype=tf.int32, name="input_ids")
        x = tf_keras.layers.Embedding(VOCAB_SIZE, hidden, name="word_embeddings")(ids)
        x = tf_keras.layers.Dense(hidden, activation="gelu", name="encoder_dense")(x)
        return tf_keras.Model(ids, {"sequence_output": x}, name="tiny_encoder")
    return build


def test_finetune_and_score_learns_a_separable_task():
    rng = np.random.default_rng(0)
    train, test = synthetic_sentences(150, rng), synthetic_sentences(60, rng)
    result = ner.finetune_and_score(tiny_encoder_builder(16), tokenizer, train, test,
                                    ner.NERSettings(epochs=6, max_seq_length=16, batch_size=16, learning_rate=1e-2,
                                                    seed=0))
    assert result["labels"] == ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    assert len(result["loss_history"]) == 6
    assert result["loss_history"][-1] < 0.25 * result["loss_history"][0]
    # word identity determines the tag, so a trained head must be (nearly) perfect
    assert result["f1"] >= 0.95
    assert result["per_type"]["Chemical"]["f1"] >= 0.95
    assert result["per_type"]["Disease"]["f1"] >= 0.95
    assert len(result["predictions"]) == 60
    assert all(len(p) == len(s.tokens) for p, s in zip(result["predictions"], test))
    # the reported numbers are entity_scores of the returned predictions
    rescored = ner.entity_scores([s.tags for s in test], result["predictions"])
    assert rescored["f1"] == result["f1"]


def test_finetune_zero_epochs_and_tensor_output_encoder():
    rng = np.random.default_rng(1)
    train, test = synthetic_sentences(20, rng), synthetic_sentences(5, rng)

    def build():  # an encoder returning a plain [B, L, H] tensor
        ids = tf_keras.Input(shape=(12,), dtype=tf.int32)
        return tf_keras.Model(ids, tf_keras.layers.Embedding(VOCAB_SIZE, 8)(ids))

    result = ner.finetune_and_score(build, tokenizer, train, test, ner.NERSettings(epochs=0, max_seq_length=12))
    assert result["loss_history"] == [] and result["epochs"] == 0
    assert 0.0 <= result["f1"] <= 1.0 and result["test_windows"] == 5
