"""Shared fixtures for the model tests: a tiny BERT spec, a repetitive synthetic corpus, the
smallest model configuration a training run takes, and eager steps for short runs.

Cost (``make test``): a tiny run's price is tracing its step (≈ 5 s, whatever the model's size or
the number of steps), building the model and the brute-force clipping check, not its steps. A
run of a few steps whose claim is not about the traced step uses ``eager_steps`` (its steps,
about half a second each on ``tiny_model``, replace the trace); the traced step runs in the
tests that train for many steps (tests/model/test_train.py, test_stats_every.py) and in the
integrity checks' rigs (test_integrity_checks.py). Traced functions run without grappler's
graph rewrites (``_no_graph_rewrites``): optimising a graph that runs a few times costs more
than it saves. docs/development.md: the tiers.
"""
import contextlib
import warnings

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


def tiny_model(**overrides):
    """The smallest BERT a training run takes (H 16, 1 layer, 2 heads, I 32, L 16, no dropout):
    every layer kind of the real model, each step a fraction of a second even eagerly."""
    from dpbert.config import ModelConfig

    params = dict(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                  max_seq_length=16, dropout=0.0)
    params.update(overrides)
    return ModelConfig(**params)


@contextlib.contextmanager
def eagerly():
    """Inside the block ``tf.function``s run eagerly (``tf.config.run_functions_eagerly``): the
    same Python and the same ops, not traced (XLA's ``jit_compile`` is not applied either). For
    runs of a few steps whose claim is about the loop, the records, a check's verdict or the
    values a step computes, not about the traced graph."""
    import tensorflow as tf

    before = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        with warnings.catch_warnings():  # tf.data's functions stay traced: what its warning says
            warnings.filterwarnings("ignore", message="Even though the `tf.config.experimental_run_functions_eagerly`")
            yield
    finally:
        tf.config.run_functions_eagerly(before)


@pytest.fixture
def eager_steps():
    """The test runs inside :func:`eagerly`."""
    with eagerly():
        yield


@pytest.fixture(scope="module", autouse=True)
def _no_graph_rewrites():
    """Grappler's graph rewrites off while a model test module runs: a test's traced functions run
    a few times, so rewriting them costs more than it saves (the values are the same ops')."""
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


@pytest.fixture
def corpus():
    return repetitive_corpus()


@pytest.fixture
def tiny_spec():
    from dpbert.network.bert import BertSpec

    return BertSpec(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                    max_seq_length=12, max_predictions=4, dropout=0.0, attention_dropout=0.0)
