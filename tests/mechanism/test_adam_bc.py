"""DP-AdamBC (Tang et al. 2024): θ ← θ − η·m̂ / √max(v̂ − Φ, γ′), AdamW's decoupled weight decay first.

A hand-computed 3-step update equals the optimizer's (≤ 1e-6); Φ is the variance of the noise the
MECHANISM adds over its divisor, (σ·Δ/B)² — with the DP diagnostics on it differs from the
accounted σ_eff's, and a mechanism whose draw is scaled hands the optimizer that scale (it is
read, not recomputed); v̂/Φ ≈ 1 on pure noise, ≈ 1 + μ²/Φ with a signal μ (the logged
statistic); the hook logs it per trained piece; the keys are validated. Positive controls: plain
AdamW's update differs from the hand-computed BC update; an update before Φ is set is refused.
"""
from __future__ import annotations

import json
import logging
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert import schema
from dpbert.accounting.sigma import accounted_sigma
from dpbert.config import ConfigError, TrainingConfig
from dpbert.mechanism import adam_bc, gaussian
from dpbert.mechanism import step as step_lib
from dpbert.engine import optimizers
from dpbert.engine.build import GHOST
from dpbert.engine.hooks import Hook
from dpbert.engine.train import train_mlm
from dpbert.privacy.diagnostics import DiagnosticsConfig
from dpbert.privacy.plan import plan_training
from tests.model.conftest import SPECIALS, repetitive_corpus, tiny_model

LR, DECAY, B1, B2, GAMMA, PHI = 0.1, 0.05, 0.9, 0.999, 1e-4, 0.01
GRADS = [np.array([0.3, -0.01, 1.2, 0.0]), np.array([0.25, 0.02, -1.0, 0.05]), np.array([0.35, -0.015, 1.1, 0.2])]


def _by_hand(theta0: np.ndarray) -> np.ndarray:
    """The paper's update in float64, decoupled weight decay θ ← θ − η·λ·θ before each step."""
    theta, m, v = theta0.astype(np.float64), np.zeros(4), np.zeros(4)
    for t, g in enumerate(GRADS, start=1):
        theta = theta - LR * DECAY * theta
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        m_hat, v_hat = m / (1 - B1 ** t), v / (1 - B2 ** t)
        theta = theta - LR * m_hat / np.sqrt(np.maximum(v_hat - PHI, GAMMA))
    return theta


def _optimizer(**kwargs):
    params = dict(learning_rate=LR, weight_decay=DECAY, beta_1=B1, beta_2=B2, gamma=GAMMA, jit_compile=False)
    params.update(kwargs)
    return adam_bc.DPAdamBC(**params)


def _apply(optimizer, theta0, dtype=tf.float64):
    variable = tf.Variable(tf.constant(theta0, dtype), name="kernel")
    for g in GRADS:
        optimizer.apply_gradients([(tf.constant(g, dtype), variable)])
    return variable.numpy()


def test_a_three_step_update_equals_the_formula():
    theta0 = np.array([0.5, -0.2, 0.1, 1.0])
    optimizer = _optimizer()
    optimizer.set_noise_variance(PHI)
    got, want = _apply(optimizer, theta0), _by_hand(theta0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # float64: the formula itself
    float32 = _optimizer()
    float32.set_noise_variance(PHI)
    np.testing.assert_allclose(_apply(float32, theta0, tf.float32), want, rtol=0, atol=1e-5)  # + float32 rounding
    # Both branches of the max ran: coordinate 1 sits on the floor γ′, coordinate 2 above it.
    t = 3
    v_hat = sum((1 - B2) * B2 ** (t - i) * g * g for i, g in enumerate(GRADS, start=1)) / (1 - B2 ** t)
    assert v_hat[1] - PHI < GAMMA < v_hat[2] - PHI
    # Positive control: AdamW's own update (√v̂ + ε, no Φ) is another point.
    adamw = tf_keras.optimizers.AdamW(learning_rate=LR, weight_decay=DECAY, beta_1=B1, beta_2=B2, jit_compile=False)
    assert np.max(np.abs(_apply(adamw, theta0) - want)) > 1e-2


def test_an_update_before_phi_is_set_is_refused_and_bad_settings_are():
    with pytest.raises(ValueError, match="needs Φ from the mechanism"):
        _apply(_optimizer(), np.zeros(4))
    with pytest.raises(ValueError, match="gamma"):
        _optimizer(gamma=0.0)
    with pytest.raises(ValueError, match="amsgrad"):
        _optimizer(amsgrad=True)
    with pytest.raises(ValueError, match=">= 0"):
        _optimizer().set_noise_variance(-1.0)


def _tiny_model():
    inputs = tf_keras.Input((3,), name="x")
    return tf_keras.Model(inputs, tf_keras.layers.Dense(2, name="dense")(inputs))


def _stepper(optimizer, **config):
    params = dict(clip_norm=0.5, noise_multiplier=0.8, expected_batch_size=16.0, noise_seed=1, loss_bound=12.0)
    params.update(config)
    return step_lib.DPSGDTrainStep(_tiny_model(), optimizer, gaussian.DPSGDConfig(**params),
                                   prepare_fn=lambda f: (f, None), loss_fn=None, clipping=GHOST)


class _DoubledDraw(gaussian.GaussianSumMechanism):
    """A mechanism whose draw is 2σΔ (a broken scale): what the optimizer must then be handed."""

    @property
    def sum_noise_std(self):
        return 2 * super().sum_noise_std


def test_phi_is_the_mechanisms_noise_variance_not_the_accounted_sigmas(monkeypatch):
    optimizer = _optimizer()
    stepper = _stepper(optimizer)  # loss_bound set: the DP diagnostics are released beside the gradient
    phi = (0.8 * 0.5 / 16.0) ** 2
    assert optimizer.noise_variance == stepper.mechanism.update_noise_variance == pytest.approx(phi, rel=1e-12)
    assert stepper.mechanism.noise_std ** 2 == pytest.approx(phi, rel=1e-12)
    sigma_eff = accounted_sigma(0.8, diagnostics=DiagnosticsConfig())
    assert sigma_eff < 0.8 and abs((sigma_eff * 0.5 / 16.0) ** 2 / phi - 1) > 1e-3  # not the accounted σ_eff's
    normalized = _optimizer()
    _stepper(normalized, clip_rule="normalized")
    assert normalized.noise_variance == pytest.approx((0.8 * 1.0 / 16.0) ** 2, rel=1e-12)  # Δ = 1, not C
    baseline = _optimizer()
    _stepper(baseline, non_private=True)
    assert baseline.noise_variance == 0.0
    # Positive control: a mechanism that adds 2σΔ hands the optimizer 4Φ (Φ is read from it).
    monkeypatch.setattr(step_lib.DPSGDTrainStep, "mechanism_class", _DoubledDraw)
    doubled = _optimizer()
    _stepper(doubled)
    assert doubled.noise_variance == pytest.approx(4 * phi, rel=1e-12)


@pytest.mark.parametrize("signal", [0.0, 3.0])
def test_noise_dominance_is_one_on_pure_noise_and_one_plus_the_signal_ratio_otherwise(signal):
    rng = np.random.default_rng(0)
    phi = 1e-4
    optimizer = _optimizer(weight_decay=0.0)
    optimizer.set_noise_variance(phi)
    variable = tf.Variable(tf.zeros([20000]))
    mean = np.sqrt(signal * phi)  # μ² = signal·Φ
    assert np.isnan(optimizer.noise_dominance([variable]).numpy()).all()  # before a step: no v̂
    for _ in range(20):
        optimizer.apply_gradients([(tf.constant(mean + rng.normal(0, np.sqrt(phi), 20000), tf.float32), variable)])
    ratio = float(optimizer.noise_dominance([variable]).numpy()[0])
    assert abs(ratio - (1 + signal)) < 0.03 * (1 + signal)


def test_the_hook_logs_vhat_over_phi_per_trained_piece(tmp_path, caplog):
    optimizer = optimizers.make(TrainingConfig(optimizer="adamw_bc", adam_bc_gamma=GAMMA), 1e-3)
    assert isinstance(optimizer, adam_bc.DPAdamBC) and optimizer.gamma == GAMMA
    stepper = _stepper(optimizer)
    tc = TrainingConfig(optimizer="adamw_bc", integrity_check_every=2)
    (hook,) = optimizers.hooks(tc, optimizer, stepper, str(tmp_path))
    optimizer.apply_gradients([(tf.constant(np.full(v.shape, 0.02), tf.float32), v) for v in stepper.variables])
    loop = types.SimpleNamespace(steps_planned=4)
    with caplog.at_level(logging.INFO, logger="dpbert.engine.train"):
        for step in (1, 2, 3):
            hook.on_step(loop, step, [], {}, None)
    hook.close(loop)
    assert hook.looks == 2 and set(hook.latest) == {p.name for p in stepper.selection.pieces}
    phi = optimizer.noise_variance
    expected = 0.02 ** 2 / phi  # one step: v̂ = g²
    assert all(abs(r / expected - 1) < 1e-5 for r in hook.latest.values()), (hook.latest, expected)
    assert "v_hat/Phi per trained piece" in caplog.text
    assert list((tmp_path / "adam_bc").iterdir())  # TensorBoard events, per piece
    assert optimizers.hooks(TrainingConfig(), optimizers.make(TrainingConfig(), 1e-3), stepper, None) == []


def test_the_configuration_keys_are_validated():
    TrainingConfig(optimizer="adamw_bc", adam_bc_gamma=1e-6).validate("training")
    assert TrainingConfig().optimizer == "adamw"  # the default is unchanged
    for bad, field in ((dict(optimizer="adam"), "training.optimizer"), (dict(adam_bc_gamma=0.0), "training.adam_bc_gamma"),
                       (dict(adam_bc_gamma=float("nan")), "training.adam_bc_gamma")):
        with pytest.raises(ConfigError, match=field):
            TrainingConfig(**bad).validate("training")


class _Spy(Hook):
    """Keeps, at the end of the run, the loop's step and its DP-AdamBC hook."""

    def on_end(self, loop):
        self.stepper = loop.stepper
        self.dominance = next(h for h in loop.hooks if isinstance(h, optimizers.NoiseDominance))


def test_the_shipped_loop_runs_dp_adambc_under_normalized_clipping(tmp_path, caplog):
    """``training.optimizer: adamw_bc`` and ``training.clipping: normalized`` through ``train_mlm``
    (1 step, eagerly: the claim is the wiring, not the traced graph): every run-time check that
    ran passes, the step's mechanism has Δ = 1 (C = 0.5 unused), the optimizer's Φ = (σ/B)², v̂/Φ is
    logged per trained piece, the state directory records the rule (a resume must not change it)."""
    tc = TrainingConfig(batch_size=16, steps=1, learning_rate=3e-3, warmup_steps=1, clip_norm=0.5, noise_multiplier=0.3,
                        checkpoint_every=1, noise_seed=1, integrity_check_every=1, optimizer="adamw_bc",
                        clipping="normalized")
    spy = _Spy()
    eager = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        with caplog.at_level(logging.INFO, logger="dpbert.engine.train"):
            result = train_mlm(repetitive_corpus(), SPECIALS, 40, tiny_model(), tc, str(tmp_path),
                               plan=plan_training(tc, 64), progress=False, export_saved_model=False, hooks=[spy])
    finally:
        tf.config.run_functions_eagerly(eager)
    checks = result.integrity_checks
    assert checks["clipping"]["passed"] and checks["noise"]["passed"], checks
    assert not any(r.get("passed") is False for r in checks.values())
    mechanism, optimizer = spy.stepper.mechanism, spy.stepper.optimizer
    assert isinstance(optimizer, adam_bc.DPAdamBC) and mechanism.sensitivity == 1.0
    assert optimizer.noise_variance == pytest.approx((0.3 / 16.0) ** 2, rel=1e-12)
    assert set(spy.dominance.latest) == {p.name for p in spy.stepper.selection.pieces}
    assert "v_hat/Phi per trained piece" in caplog.text
    run_config = json.loads((tmp_path / schema.RUN_CONFIG_FILE).read_text())
    assert run_config["clipping"] == {"rule": "normalized", "stability": 0.01}
