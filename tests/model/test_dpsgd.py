"""DP-SGD core: per-example clipping vs brute force, noise placement and size, seeds, baseline."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert.mechanism import clipping, gaussian
from dpbert.mechanism import step as step_lib
from dpbert.network import bert as bert_lib
from dpbert.mechanism import ghost
from dpbert.engine.build import GHOST
from dpbert.engine.masking import mask_with_seed
from dpbert.diagnostics.noise_check import noise_check

from .conftest import eagerly

ROOT = Path(__file__).resolve().parents[2]
#: One worker runs the module under ``make test``'s xdist (``--dist loadgroup``): its fixtures run once.
pytestmark = pytest.mark.xdist_group("dpsgd")


def _mlm_batch(spec, n=6, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, spec.vocab_size, (n, spec.max_seq_length)).astype(np.int32)
    ids[:, 0] = 2
    ids[:, 9:] = 0
    ids[0, 2] = ids[0, 3] = ids[0, 4]  # repeated tokens in one example (embedding rows summed)
    batch = mask_with_seed(ids, 3, 4, special_token_ids=[1, 2, 3, 4], mask_token_id=4,
                        vocab_size=spec.vocab_size, max_predictions=spec.max_predictions)
    inputs = {"input_ids": batch["input_ids"], "masked_positions": batch["masked_positions"]}
    loss_fn = lambda out: clipping.per_example_mlm_loss(batch["masked_labels"], out, batch["masked_weights"])  # noqa
    return batch, inputs, loss_fn


def _per_example(model, batch, inputs):
    """Per-example gradients one example at a time (numpy, one array per variable) and their norms."""
    per_example, norms = [], []
    for i in range(inputs["input_ids"].shape[0]):
        with tf.GradientTape() as tape:
            out = model({k: v[i:i + 1] for k, v in inputs.items()}, training=True)
            loss = clipping.per_example_mlm_loss(batch["masked_labels"][i:i + 1], out, batch["masked_weights"][i:i + 1])[0]
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
        per_example.append(grads)
        norms.append(float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))))
    return np.array(norms), per_example


def _clipped(per_example, norms, mask, clip):
    """(clipped sum Σ_i mask_i·min(1, C/‖g_i‖)·g_i, each example's contribution norm)."""
    weights = [min(1.0, clip / norm) * float(m) for norm, m in zip(norms, mask)]
    total = [sum(w * grads[j] for w, grads in zip(weights, per_example)) for j in range(len(per_example[0]))]
    return total, np.array(weights) * norms


@pytest.fixture(scope="module")
def brute_force():
    """``get(geometry)``: the model of that geometry, its batch and per-example gradients by brute
    force, made once for both clipping paths (neither changes the model)."""
    made = {}

    def get(geometry):
        if geometry not in made:
            length, hidden, inter = geometry
            spec = bert_lib.BertSpec(vocab_size=50, hidden_size=hidden, num_layers=2, num_heads=2,
                                     intermediate_size=inter, max_seq_length=length, max_predictions=4,
                                     dropout=0.0, attention_dropout=0.0)
            model = bert_lib.build_bert(spec, seed=1).mlm
            batch, inputs, loss_fn = _mlm_batch(spec)
            made[geometry] = (model, inputs, loss_fn, *_per_example(model, batch, inputs))
        return made[geometry]

    return get


@pytest.mark.parametrize("path", ["ghost", "tfp_two_pass"])
@pytest.mark.parametrize("geometry", [(12, 16, 32), (40, 8, 16)])  # ghost-norm and instantiation branches
def test_clipping_matches_brute_force(brute_force, path, geometry):
    model, inputs, loss_fn, ref_norms, per_example = brute_force(geometry)
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)  # last row is padding
    clip = float(np.median(ref_norms[:5]))  # some examples clipped, some not
    if path == "ghost":
        grads, losses, norms, _ = ghost.clipped_gradient_sum(model, inputs, loss_fn, mask, clip)
    else:
        grads, losses, norms, _ = clipping.tfp_two_pass_clipped_gradients(
            model, clipping.make_layer_registry(), inputs, loss_fn, mask, clip)
    expected, contributions = _clipped(per_example, ref_norms, mask, clip)
    np.testing.assert_allclose(norms.numpy()[:5], ref_norms[:5], rtol=1e-4)
    assert norms.numpy()[5] == 0 and losses.numpy()[5] == 0  # padded row: no loss, no gradient
    assert np.all(contributions <= clip * (1 + 1e-5))  # each example's contribution ≤ C
    scale = max(float(np.max(np.abs(e))) for e in expected)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), want, atol=2e-6 * scale)


def test_norms_are_those_of_the_applied_gradient_under_dropout():
    """One forward pass: the norm used for clipping is the norm of the gradient actually applied,
    dropout masks included (tensorflow-privacy's two-forward-pass path does not guarantee this)."""
    spec = bert_lib.BertSpec(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=12, max_predictions=4, dropout=0.3, attention_dropout=0.3)
    model = bert_lib.build_bert(spec, seed=2).mlm
    batch, inputs, loss_fn = _mlm_batch(spec, n=1)
    for _ in range(3):
        grads, _, norms, _ = ghost.clipped_gradient_sum(model, inputs, loss_fn, np.ones(1, np.float32), 1e9)
        np.testing.assert_allclose(float(tf.linalg.global_norm([tf.convert_to_tensor(g) for g in grads])),
                                   float(norms[0]), rtol=1e-5)
        clip = float(norms[0]) / 3
        grads, _, _, _ = ghost.clipped_gradient_sum(model, inputs, loss_fn, np.ones(1, np.float32), clip)
        assert float(tf.linalg.global_norm([tf.convert_to_tensor(g) for g in grads])) <= clip * (1 + 1e-5)


def test_per_example_loss_is_mean_over_own_masked_positions():
    logits = tf.math.log(tf.constant([[[0.5, 0.5], [0.9, 0.1]], [[0.2, 0.8], [0.5, 0.5]]]))
    labels = tf.constant([[0, 1], [1, 0]])
    weights = tf.constant([[1.0, 1.0], [1.0, 0.0]])
    loss = clipping.per_example_mlm_loss(labels, logits, weights).numpy()
    assert loss.shape == (2,)
    np.testing.assert_allclose(loss, [(-math.log(0.5) - math.log(0.1)) / 2, -math.log(0.8)], rtol=1e-5)


# --------------------------------------------------------------------------- noise
# Each check measures m = steps × ~4,000 coordinates, its tolerance z/√(2m) computed from m (z = 4,
# false-failure rate ≈ 6e-5 whatever m): 2 steps give ≈ 3.2 %, and noise added per shard (√(P·T)
# off, ≥ 41 %) is still more than 10 tolerances away. The steps run eagerly (``eagerly``: a few
# steps cost less than the trace; the traced step's noise: tests/model/test_stats_every.py), the
# T = 4 check once for its test and the CLI's (``accumulation_4``).
NOISE_STEPS = 2


@pytest.fixture(scope="module")
def accumulation_4():
    """``(arguments, result)`` of ``noise_check`` with T = 4 (the call the CLI test makes)."""
    args, kwargs = (1, 4, 1.0, 0.01, 16), dict(steps=NOISE_STEPS, seed=None, noise_mode="once")
    with eagerly():
        return (args, kwargs), noise_check(*args, **kwargs)


def _assert_noise(result, replicas, accumulation):
    assert result["passed"], result
    # Tolerance from the sampling distribution of the std (z = 4 relative standard errors).
    assert abs(result["measured_std"] / result["expected_std"] - 1) <= result["tolerance"]
    variance_ratio = (result["measured_std"] / result["expected_std"]) ** 2
    if replicas * accumulation > 1:  # one draw per logical batch: σ²C²/B², not P·T times that
        assert variance_ratio < 1 + 0.5 * (replicas * accumulation - 1)
        assert abs(result["measured_std"] / result["paper_std"] - 1) > 10 * result["tolerance"]


# T = 1 (the same draw and add, one micro-batch): the slow tier; T = 4 here and in the CLI test below
@pytest.mark.parametrize("accumulation", [pytest.param(1, marks=pytest.mark.slow), 4])
def test_noise_std_single_replica(accumulation, request):
    if accumulation == 4:
        result = request.getfixturevalue("accumulation_4")[1]
    else:
        with eagerly():
            result = noise_check(1, accumulation, noise_multiplier=1.3, clip=0.01, batch_size=16, steps=NOISE_STEPS)
    _assert_noise(result, 1, accumulation)


def test_noise_paper_mode_reports_effective_sigma(eager_steps):
    # T = 2: paper mode's draw per micro-batch gives σ√T·C/B, √2 times the one draw's (T = 4: the config below)
    result = noise_check(1, 2, noise_multiplier=1.0, clip=0.01, batch_size=16, steps=NOISE_STEPS, seed=4,
                         noise_mode="paper")
    assert result["passed"]
    assert abs(result["measured_std"] / result["paper_std"] - 1) <= result["tolerance"]
    config = gaussian.DPSGDConfig(noise_multiplier=1.0, replicas=2, accumulation_steps=4, noise_mode="paper")
    assert config.effective_noise_multiplier == pytest.approx(math.sqrt(8))


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_two_replicas_training_in_subprocess(tmp_path):
    """P = 2 needs two logical CPUs configured before TensorFlow starts: its own process. The run
    passes its run-time noise check (the clean sum's own all-reduce on two replicas); the
    two-replica noise-check CLI runs once, in tests/model/test_noise_check_cli.py."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("replicas_worker.py")), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    train = out["train"]
    assert train["integrity_checks"]["noise"]["passed"] and train["integrity_checks"]["noise"]["ran"]
    assert train["replicas"] == 2 and train["accumulation"] == 2 and train["strategy"] == "MirroredStrategy"
    assert train["model_step"] == train["steps_planned"] == 6
    assert np.isfinite(train["final_mlm_loss"])


# --------------------------------------------------------------------------- step semantics
def _dense_stepper(noise_seed=None, non_private=False, sigma=1.0, clip=1.0, expected_batch=4.0):
    x = tf_keras.Input((3,))
    model = tf_keras.Model(x, tf_keras.layers.Dense(2, kernel_initializer=tf_keras.initializers.Constant(0.1))(x))
    config = gaussian.DPSGDConfig(clip_norm=clip, noise_multiplier=sigma, expected_batch_size=expected_batch,
                                  noise_seed=noise_seed, non_private=non_private)
    stepper = step_lib.DPSGDTrainStep(
        model, tf_keras.optimizers.SGD(1.0), config,
        prepare_fn=lambda f: (f[:, :3], f[:, 3]),
        loss_fn=lambda y, out: tf.reduce_sum(tf.square(out - y[:, None]), axis=1), clipping=GHOST)
    return model, stepper


def _delta(model, stepper, features, mask):
    before = [v.numpy().copy() for v in model.trainable_variables]
    stepper.run_step([{"features": features[None], "example_mask": mask[None]}])
    return np.concatenate([(b - v.numpy()).ravel() for b, v in zip(before, model.trainable_variables)])


def test_noise_seed_entropy_vs_explicit(eager_steps):
    zeros = np.zeros((4, 4), np.float32)
    off = np.zeros(4, np.float32)
    deltas = [_delta(*_dense_stepper(seed), zeros, off) for seed in (None, None, 7, 7)]
    assert not np.allclose(deltas[0], deltas[1])  # OS entropy: different noise
    np.testing.assert_array_equal(deltas[2], deltas[3])  # explicit test seed: reproducible
    model, stepper = _dense_stepper(7)
    first, second = _delta(model, stepper, zeros, off), _delta(model, stepper, zeros, off)
    assert not np.allclose(first, second)  # a fresh draw every step


def _grads(features, mask, clip=None):
    x = tf.constant(features[:, :3])
    per = []
    for i in range(len(features)):
        w = tf.Variable(np.full((3, 2), 0.1, np.float32))
        b = tf.Variable(np.zeros(2, np.float32))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x[i:i + 1], w) + b - features[i, 3]))
        g = np.concatenate([t.numpy().ravel() for t in tape.gradient(loss, [w, b])])
        if clip is not None:
            g = g * min(1.0, clip / np.linalg.norm(g))
        per.append(g * mask[i])
    return np.sum(per, axis=0)


def test_dp_update_divides_by_expected_batch_and_baseline_by_count():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(4, 4)).astype(np.float32)
    mask = np.array([1, 1, 1, 0], np.float32)
    # DP with negligible noise: update = S / B with B the public expected batch size (4), not 3.
    model, stepper = _dense_stepper(noise_seed=1, sigma=1e-9, clip=0.5, expected_batch=4.0)
    np.testing.assert_allclose(_delta(model, stepper, features, mask), _grads(features, mask, 0.5) / 4.0,
                               rtol=1e-4, atol=1e-7)
    assert stepper.clipping_path == "ghost"
    # Non-private baseline: plain mean over the 3 real examples, no clipping, no noise.
    model, stepper = _dense_stepper(non_private=True)
    np.testing.assert_allclose(_delta(model, stepper, features, mask), _grads(features, mask) / 3.0, rtol=1e-5)
    assert stepper.clipping_path == "none" and stepper.config.effective_noise_multiplier == 0.0


def test_clipping_path_is_logged(caplog):
    import logging

    gaussian._LOGGED_PATHS.clear()
    with caplog.at_level(logging.INFO, logger="dpbert.mechanism.gaussian"):
        _dense_stepper(noise_seed=1)
        _dense_stepper(noise_seed=1)
    messages = [r.getMessage() for r in caplog.records if "clipping path" in r.getMessage()]
    assert len(messages) == 1 and "ghost" in messages[0]  # logged once per process


def test_run_noise_check_cli_in_process(capsys, monkeypatch, accumulation_4):
    """The CLI's one noise check is the fixture's call (its arguments asserted), whose result it
    prints as JSON and turns into the exit code."""
    import argparse

    from dpbert.diagnostics import noise_check as module
    from dpbert.diagnostics.noise_check import run_noise_check_cli

    calls = []

    def the_fixtures_call(*args, **kwargs):
        calls.append((args, kwargs))
        return accumulation_4[1]

    monkeypatch.setattr(module, "noise_check", the_fixtures_call)
    args = argparse.Namespace(replicas=1, accumulation=4, noise_multiplier=1.0, clip=0.01, batch_size=16,
                              steps=NOISE_STEPS, json=True)
    assert run_noise_check_cli(args) == 0
    assert calls == [accumulation_4[0]]
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["accumulation"] == 4


def test_audit_probe_adds_canaries_to_the_clipped_sum_before_the_noise_and_observes_it():
    rng = np.random.default_rng(1)
    features = rng.normal(size=(4, 4)).astype(np.float32)
    mask = np.array([1, 1, 0, 0], np.float32)
    probe = step_lib.AuditProbe(variable_index=0, coordinates=np.array([0, 3, 5]))  # kernel [3, 2], flat
    x = tf_keras.Input((3,))
    model = tf_keras.Model(x, tf_keras.layers.Dense(2, kernel_initializer=tf_keras.initializers.Constant(0.1))(x))
    config = gaussian.DPSGDConfig(clip_norm=0.5, noise_multiplier=1e-9, expected_batch_size=4.0, noise_seed=3)
    stepper = step_lib.DPSGDTrainStep(model, tf_keras.optimizers.SGD(1.0), config,
                                      prepare_fn=lambda f: (f[:, :3], f[:, 3]),
                                      loss_fn=lambda y, out: tf.reduce_sum(tf.square(out - y[:, None]), axis=1),
                                      audit_probe=probe, clipping=GHOST)
    clipped = _grads(features, mask, 0.5)[:6]  # the kernel's part of the clipped sum
    canary = np.array([0.5, -0.25, 0.125], np.float32)
    before = model.trainable_variables[0].numpy().ravel().copy()
    stepper.run_step([{"features": features[None], "example_mask": mask[None]}], canary_sum=canary)
    expected = clipped[[0, 3, 5]] + canary
    np.testing.assert_allclose(stepper.observed.numpy(), expected, rtol=1e-4, atol=1e-6)
    delta = before - model.trainable_variables[0].numpy().ravel()
    np.testing.assert_allclose(delta[[0, 3, 5]], expected / 4.0, rtol=1e-4, atol=1e-6)  # then ÷ B, SGD
    with pytest.raises(ValueError, match="canary_sum must have shape"):
        stepper.run_step([{"features": features[None], "example_mask": mask[None]}], canary_sum=np.zeros(2))
