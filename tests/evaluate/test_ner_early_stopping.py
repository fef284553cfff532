"""NER recipe: early stopping on a dev split keeps the best dev epoch and restores its
weights; patience; the dev split comes from the training sentences; shorter batches change no
prediction; the linear probe (ner.mode = probe) runs the encoder once for every seed."""
import numpy as np
import pytest
import tensorflow as tf

from dpbert.evaluate import ner
from tests.evaluate.test_ner_finetune import VOCAB_SIZE, synthetic_sentences, tiny_encoder_builder, tokenizer


def test_early_stopping_restores_the_best_dev_epoch():
    """A learning rate high enough that the dev F1 goes up and down: the tested weights are the
    best dev epoch's (their dev F1, measured again after the restore, equals the best)."""
    rng = np.random.default_rng(0)
    train, dev, test = synthetic_sentences(60, rng), synthetic_sentences(30, rng), synthetic_sentences(20, rng)
    settings = ner.NERSettings(epochs=6, max_seq_length=16, batch_size=8, learning_rate=2.0, seed=1, patience=None)
    result = ner.finetune_and_score(tiny_encoder_builder(16), tokenizer, train, test, settings, dev_sentences=dev)
    history = result["dev_f1_history"]
    assert len(history) == result["epochs_run"] == 6
    assert result["best_epoch"] == 1 + int(np.argmax(history))  # the first best on ties
    assert result["best_dev_f1"] == max(history)
    # this seed and rate: the best is epoch 3 (dev F1 0.94, 0.76, 1.0, 0.96, 1.0, 0.68), not the
    # first nor the last (the task saturates at 1.0: re-pick them when the dropout stream changes)
    assert 1 < result["best_epoch"] < 6 and history[-1] < max(history)
    assert result["restored_dev_f1"] == pytest.approx(result["best_dev_f1"])


def test_patience_stops_and_the_best_epoch_is_kept(monkeypatch):
    """Scripted dev F1s 0.2, 0.8, 0.5, 0.4: patience 2 stops after epoch 4 and keeps epoch 2."""
    script = iter([0.2, 0.8, 0.5, 0.4, 0.8])
    real = ner.entity_scores
    dev_tags = []

    def scripted(gold, predicted):
        scores = real(gold, predicted)
        gold = list(gold)
        if gold == dev_tags:
            scores = dict(scores, f1=next(script))
        return scores

    rng = np.random.default_rng(1)
    train, dev, test = synthetic_sentences(30, rng), synthetic_sentences(10, rng), synthetic_sentences(10, rng)
    dev_tags.extend(s.tags for s in dev)
    monkeypatch.setattr(ner, "entity_scores", scripted)
    settings = ner.NERSettings(epochs=10, max_seq_length=16, batch_size=8, learning_rate=1e-2, seed=0, patience=2)
    result = ner.finetune_and_score(tiny_encoder_builder(16), tokenizer, train, test, settings, dev_sentences=dev)
    assert result["dev_f1_history"] == [0.2, 0.8, 0.5, 0.4]
    assert (result["best_epoch"], result["epochs_run"], result["best_dev_f1"]) == (2, 4, 0.8)
    assert result["restored_dev_f1"] == 0.8  # measured again after restoring epoch 2's weights


def test_without_a_dev_split_the_last_epoch_is_tested():
    rng = np.random.default_rng(2)
    train, test = synthetic_sentences(20, rng), synthetic_sentences(5, rng)
    result = ner.finetune_and_score(tiny_encoder_builder(16), tokenizer, train, test,
                                    ner.NERSettings(epochs=2, max_seq_length=16))
    assert result["best_epoch"] is None and result["dev_f1_history"] == [] and result["epochs_run"] == 2


def test_split_dev_is_a_fixed_part_of_the_training_sentences():
    rng = np.random.default_rng(3)
    sentences = synthetic_sentences(50, rng)
    train, dev = ner.split_dev(sentences, 0.2, seed=0)
    assert (len(train), len(dev)) == (40, 10)
    assert sorted(id(s) for s in train + dev) == sorted(id(s) for s in sentences)
    assert ner.split_dev(sentences, 0.2, seed=0) == (train, dev)
    assert ner.split_dev(sentences, 0.0) == (sentences, [])
    assert [len(x) for x in ner.split_dev(sentences[:2], 0.01)] == [1, 1]


def test_shorter_batches_predict_as_full_length_ones():
    """Cutting a batch to its longest window (padding is masked out of attention) changes nothing:
    the real BERT encoder, same weights, full-length vs trimmed batches."""
    from dpbert.network.bert import BertSpec, build_bert

    spec = BertSpec(vocab_size=VOCAB_SIZE, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                    max_seq_length=32, max_predictions=5, dropout=0.0, attention_dropout=0.0)
    rng = np.random.default_rng(4)
    train, test = synthetic_sentences(40, rng), synthetic_sentences(15, rng)
    runs = [ner.finetune_and_score(lambda: build_bert(spec, seed=0).encoder, tokenizer, train, test,
                                   ner.NERSettings(epochs=1, max_seq_length=32, batch_size=8, learning_rate=1e-3,
                                                   seed=0, dropout=0.0, dynamic_length=dynamic))
            for dynamic in (True, False)]
    assert runs[0]["loss_history"] == pytest.approx(runs[1]["loss_history"], rel=1e-4)
    assert runs[0]["predictions"] == runs[1]["predictions"]


def test_probe_runs_the_encoder_once_and_learns():
    rng = np.random.default_rng(5)
    train, dev, test = synthetic_sentences(150, rng), synthetic_sentences(30, rng), synthetic_sentences(40, rng)
    builds = []

    def build():
        builds.append(1)
        return tiny_encoder_builder(16, hidden=32)()

    cache = {}
    results = [ner.finetune_and_score(build, tokenizer, train, test,
                                      ner.NERSettings(epochs=40, max_seq_length=16, batch_size=4, learning_rate=0.2,
                                                      seed=seed, patience=5, train_encoder=False),
                                      dev_sentences=dev, features_cache=cache) for seed in (0, 1)]
    assert len(builds) == 1  # one encoder, one forward pass per window, for both seeds
    assert all(r["mode"] == "probe" and r["f1"] >= 0.9 for r in results)  # word identity suffices
    assert results[0]["restored_dev_f1"] == pytest.approx(results[0]["best_dev_f1"])
    assert cache["train"].shape == (sum(len(s.tokens) for s in train), 32)
