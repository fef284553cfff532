"""Tiny inputs for the stage tests: tuples of a small synthetic corpus, a WordPiece vocabulary
learnt from them, tiny model and training configurations. No TFX anywhere."""
from collections import Counter

import pytest

TUPLE_WORDS = 24
PATIENTS = 10
HOLDOUT_KEY = bytes(range(32))


@pytest.fixture(scope="session")
def raw_tuples():
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples

    return list(corpus_tuples(generate_notes(patients=PATIENTS, admissions_per_patient=1, notes_per_admission=1,
                                             seed=4), tuple_words=TUPLE_WORDS))


@pytest.fixture(scope="session")
def tuples_dir(tmp_path_factory, raw_tuples):
    from dpbert.data.tfrecord import write_tuples

    from dpbert.data.splits import write_holdout_key

    path = tmp_path_factory.mktemp("stages") / "tuples"
    write_tuples(raw_tuples, str(path), num_shards=2)
    write_holdout_key(str(path), HOLDOUT_KEY)  # what the ingestion writes (a fixed key for the tests)
    return str(path)


@pytest.fixture(scope="session")
def vocabulary_dir(tmp_path_factory, raw_tuples):
    from dpbert.vocab.wordpiece import save_vocabulary, train_wordpiece

    path = tmp_path_factory.mktemp("stages") / "vocabulary"
    save_vocabulary(train_wordpiece(Counter(w for t in raw_tuples for w in t.words).items(), vocab_size=120), path)
    return str(path)


def tiny_model_config(max_seq_length=16):
    from dpbert.config import ModelConfig

    return ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_seq_length=max_seq_length, dropout=0.0)


def tiny_training_config(**overrides):
    from dpbert.config import TrainingConfig

    # No noise seed: a seeded run is recorded as ε = ∞ (predictable noise).
    params = dict(batch_size=4, steps=2, warmup_steps=0, clip_norm=1.0, noise_multiplier=1.0, checkpoint_every=50,
                  delta=1e-5)
    params.update(overrides)
    return TrainingConfig(**params)
