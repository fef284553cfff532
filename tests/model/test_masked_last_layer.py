"""``build_bert(masked_last_layer=True)``: the MLM model runs its last layer's queries at the masked
positions only. Same weights (order and values), same logits and the same ghost-clipped sums and
per-unit norms (up to float rounding) as the full model, plain and with LoRA adapters; the encoder
is untouched. Positive control: a last layer fed the WRONG positions' queries is caught by the
same comparison. ``make test``: weights and logits; the slow tier: the norms and sums of
``[bias, head]`` (the demo's set), ``all`` and LoRA."""
import numpy as np
import pytest
import tensorflow as tf

from dpbert.engine.masking import example_keys
from dpbert.engine.train import make_mlm_functions
from dpbert.mechanism import ghost
from dpbert.network import bert as bert_lib
from dpbert.network import trainable as trainable_lib

ROWS, K = 6, 2
#: two layers (the second is the masked one), the smallest sizes of tests/model/conftest.py
SPEC = bert_lib.BertSpec(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                         max_seq_length=12, max_predictions=4, dropout=0.0, attention_dropout=0.0)


def _models(spec, masked: bool, lora=None):
    models = bert_lib.build_bert(spec, seed=3, masked_last_layer=masked)
    return bert_lib.add_lora(models, lora, seed=5) if lora is not None else models


def _batch(spec):
    mask_fn, prepare_fn, loss_fn, _ = make_mlm_functions(spec, [0, 1, 2, 3, 4], 4, 0.15)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, spec.vocab_size, (ROWS, spec.max_seq_length)).astype(np.int32)
    ids[:, 0], ids[:2, -3:] = 2, 0  # [CLS]; two rows padded (keys masked out)
    inputs, targets = prepare_fn({k: tf.constant(v) for k, v in mask_fn(ids, example_keys(1, 0, np.arange(ROWS))).items()})
    return inputs, (lambda out: loss_fn(targets, out))


def _clipped(models, sets, spec):
    inputs, loss = _batch(spec)
    grads, _, norms, logits = ghost.clipped_gradient_sum(models.mlm, inputs, loss, tf.ones([ROWS]), 0.5, group_size=K,
                                                         selection=trainable_lib.select(models, sets))
    return logits.numpy(), norms.numpy(), [g.numpy() for g in grads]


def _assert_same(full, masked):
    np.testing.assert_allclose(masked[0], full[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(masked[1], full[1], rtol=1e-4, atol=1e-6)
    for a, b in zip(full[2], masked[2]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def _same_start(full, masked):
    assert [v.name for v in masked.mlm.weights] == [v.name for v in full.mlm.weights]
    assert all(np.array_equal(a, b) for a, b in zip(masked.mlm.get_weights(), full.mlm.get_weights()))
    assert masked.masked_last_layer and masked.encoder.count_params() == full.encoder.count_params()


@pytest.fixture(scope="module")
def full():
    """(the full model, its logits on the batch)."""
    models = _models(SPEC, False)
    return models, models.mlm(_batch(SPEC)[0]).numpy()


def test_same_weights_and_logits(full):
    masked = _models(SPEC, True)
    _same_start(full[0], masked)
    np.testing.assert_allclose(masked.mlm(_batch(SPEC)[0]).numpy(), full[1], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("sets,lora", [(["bias", "head"], None), (["all"], None),
                                       (["lora"], bert_lib.LoRASpec(rank=2, alpha=4.0))])
def test_same_norms_and_clipped_sums(sets, lora):
    full, masked = _models(SPEC, False, lora), _models(SPEC, True, lora)
    _same_start(full, masked)
    _assert_same(_clipped(full, sets, SPEC), _clipped(masked, sets, SPEC))


def test_control_wrong_positions_are_caught(full, monkeypatch):
    gather = bert_lib._gather_positions  # pylint: disable=protected-access
    monkeypatch.setattr(bert_lib, "_gather_positions", lambda t: gather([t[0], tf.reverse(t[1], axis=[1])]))
    broken = _models(SPEC, True)
    monkeypatch.setattr(bert_lib, "_gather_positions", gather)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(broken.mlm(_batch(SPEC)[0]).numpy(), full[1], rtol=1e-5, atol=1e-6)
