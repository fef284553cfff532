"""Normalized ("automatic") clipping (Bu et al. 2023): g_u ← g_u / (‖g_u‖ + r), sensitivity 1.

The mechanism's clipped sum (ghost norms, one backward pass) equals a brute-force per-unit
computation (per example; per patient of k rows and tensorflow-privacy's two-pass path in the
slow tier); the
sensitivity every reader takes is the mechanism's (1, not training.clip_norm) and the noise is
σ·1; the configuration keys are validated. Positive control: the flat rule's sum (the same
brute force at C) differs from the normalized one. The run-time checks' positive controls under
this rule: tests/model/test_integrity_checks.py (``mode_rig``)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert.config import ConfigError, TrainingConfig
from dpbert.mechanism import clipping, gaussian
from dpbert.mechanism import step as step_lib
from dpbert.network import bert as bert_lib
from dpbert.engine.build import GHOST
from dpbert.engine.masking import mask_with_seed

R = 0.01
SPEC = bert_lib.BertSpec(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                         max_seq_length=12, max_predictions=4, dropout=0.0, attention_dropout=0.0)


@pytest.fixture(scope="module")
def model():
    return bert_lib.build_bert(SPEC, seed=1).mlm


def _batch(n=6, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, SPEC.vocab_size, (n, SPEC.max_seq_length)).astype(np.int32)
    ids[:, 0], ids[:, 9:] = 2, 0
    batch = mask_with_seed(ids, 3, 4, special_token_ids=[1, 2, 3, 4], mask_token_id=4,
                           vocab_size=SPEC.vocab_size, max_predictions=SPEC.max_predictions)
    inputs = {"input_ids": batch["input_ids"], "masked_positions": batch["masked_positions"]}
    return batch, inputs


def _loss(batch, rows):
    return lambda out: clipping.per_example_mlm_loss(batch["masked_labels"][rows], out, batch["masked_weights"][rows])


def _per_unit(model, batch, inputs, mask, k: int):
    """(norms, gradients): g_u, the summed gradient of unit u's k rows, one unit at a time."""
    norms, grads = [], []
    for u in range(len(mask) // k):
        rows = slice(u * k, (u + 1) * k)
        with tf.GradientTape() as tape:
            out = model({name: v[rows] for name, v in inputs.items()}, training=False)
            loss = tf.reduce_sum(_loss(batch, rows)(out) * mask[rows])
        grads.append([tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)])
        norms.append(float(tf.linalg.global_norm(grads[-1])))
    return np.array(norms), grads


def _clipped_sum(norms, grads, weight_of):
    """Σ_u weight_of(‖g_u‖)·g_u (a unit with no gradient adds nothing)."""
    weights = [weight_of(n) if n > 0 else 0.0 for n in norms]
    return [sum(w * g[i] for w, g in zip(weights, grads)) for i in range(len(grads[0]))]


def _step(model, **config):
    params = dict(clip_norm=0.05, noise_multiplier=0.7, expected_batch_size=4.0, noise_seed=1, clip_rule="normalized",
                  clip_stability=R)
    params.update(config)
    return step_lib.DPSGDTrainStep(model, tf_keras.optimizers.SGD(0.1), gaussian.DPSGDConfig(**params),
                                   prepare_fn=lambda f: (f, None), loss_fn=None, clipping=GHOST)


@pytest.mark.parametrize("path,k", [("ghost", 1), pytest.param("tfp_two_pass", 1, marks=pytest.mark.slow),
                                    pytest.param("ghost", 2, marks=pytest.mark.slow)])
def test_the_clipped_sum_equals_a_brute_force_per_unit_computation(model, path, k):
    batch, inputs = _batch()
    mask = np.array([1, 1, 1, 0, 1, 0], np.float32)  # padded rows add nothing
    stepper = _step(model, clipping=path, group_size=k)
    grads, _, norms, _ = stepper.clip(inputs, _loss(batch, slice(None)), mask, training=False)
    want_norms, unit_grads = _per_unit(model, batch, inputs, mask, k)
    want = _clipped_sum(want_norms, unit_grads, lambda n: 1.0 / (n + R))
    np.testing.assert_allclose(norms.numpy(), want_norms, rtol=1e-4, atol=1e-7)
    scale = max(float(tf.reduce_max(tf.abs(w))) for w in want)
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), expected.numpy(), atol=2e-6 * scale)
    # Each unit's contribution has norm ‖g‖/(‖g‖ + r) < 1 = the sensitivity, whatever C is.
    assert np.all(want_norms / (want_norms + R) < 1.0) and stepper.mechanism.sensitivity == 1.0
    # Positive control: the flat rule at C (the same brute force) is another sum.
    flat = _clipped_sum(want_norms, unit_grads, lambda n: min(1.0, 0.05 / n))
    assert max(float(tf.reduce_max(tf.abs(f - w))) for f, w in zip(flat, want)) > 100 * 2e-6 * scale


def test_the_sensitivity_and_the_noise_come_from_the_rule_not_from_clip_norm(model):
    normalized, flat = _step(model), _step(model, clip_rule="flat")
    assert (normalized.mechanism.sensitivity, flat.mechanism.sensitivity) == (1.0, 0.05)
    assert normalized.mechanism.sum_noise_std == 0.7 and normalized.config.noise_std == 0.7 / 4.0
    assert flat.mechanism.sum_noise_std == 0.7 * 0.05
    z = np.concatenate([t.numpy().ravel() for t in normalized.mechanism.draw_noise()])
    assert abs(z.std() / 0.7 - 1) < 4 * np.sqrt(0.5 / z.size)  # the draw is σ·1, not σ·C
    # The 'clipped' statistic counts the units whose weight is < 1: ‖g‖ + r > 1.
    batch, inputs = _batch()
    mask = np.ones(6, np.float32)
    _, _, norms, _, units = normalized.mechanism.clipped_sum(inputs, _loss(batch, slice(None)), mask)
    assert float(units["clipped"]) == float(np.sum(norms.numpy() + R > 1.0))


def test_the_configuration_keys_are_validated():
    TrainingConfig(clipping="normalized", clip_stability=0.5).validate("training")
    for bad, field in ((dict(clipping="auto"), "training.clipping"), (dict(clip_stability=0.0), "training.clip_stability"),
                       (dict(clip_stability=float("inf")), "training.clip_stability")):
        with pytest.raises(ConfigError, match=field):
            TrainingConfig(**bad).validate("training")
    with pytest.raises(ValueError, match="clip_rule"):
        gaussian.DPSGDConfig(clip_rule="auto")
    with pytest.raises(ValueError, match="clip_stability"):
        gaussian.DPSGDConfig(clip_rule="normalized", clip_stability=0.0)
    assert gaussian.CLIP_RULES == ("flat", "normalized") and TrainingConfig().clipping == "flat"
