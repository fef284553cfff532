"""Run-time integrity checks of what the audit canaries cannot see (issue 22 item 6): per check,
an honest run passes and a deliberately broken mechanism (positive control) fails.

event check (``dpbert.privacy.event_check``), realised units per step, brute-force clipping and
the noise on the real step (``dpbert.model.integrity``)."""
import json
import math
import re
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert.config import ModelConfig, TrainingConfig
from dpbert.model import bert as bert_lib
from dpbert.model import dpsgd, ghost, integrity, sampling
from dpbert.model.train import make_mlm_functions, mlm_patient_rounds, mlm_rounds, train_mlm
from dpbert.privacy import diagnostics, event_check, events
from dpbert.privacy.event_check import IntegrityCheckFailed, check_event
from dpbert.privacy.plan import plan_training
from dpbert.stages.pretrain import training_record

from .conftest import SPECIALS, repetitive_corpus

VOCAB = 40


# ------------------------------------------------------------------------------ 1. event check
def _observed(**overrides):
    out = dict(sampling="poisson", sampling_probability=16 / 80, sampling_unit="tuple", sampler_k=None, group_size=1,
               steps_executed=40, base_noise_multiplier=0.3, gradient_noise_multiplier=0.3, noise_mode="once",
               replicas=1, accumulation_steps=1, diagnostic_noise_multipliers={}, expected_batch_size=16.0)
    out.update(overrides)
    return out


def test_event_check_passes_an_honest_record_and_catches_q_steps_sigma_k_and_mode():
    honest = events.dpsgd_event(0.3, 16, 80, 40, "poisson")
    assert check_event(honest, _observed()) == []
    # With the DP diagnostics: σ_eff composed from the gradient σ and each diagnostic's σ_j.
    stds = diagnostics.noise_stds(0.3, diagnostics.DiagnosticsConfig())
    with_diag = events.dpsgd_event(diagnostics.effective_noise_multiplier(0.3, diagnostics.DiagnosticsConfig()),
                                   16, 80, 40, "poisson")
    multipliers = {p: s / (12.0 if p == "loss" else 1.0) for p, s in stds.items()}
    assert check_event(with_diag, _observed(diagnostic_noise_multipliers=multipliers)) == []
    assert check_event(honest, _observed(diagnostic_noise_multipliers=multipliers))  # σ_eff ≠ σ
    # Positive controls: a record whose q or step count is off by 4×, σ or k wrong, paper-mode noise.
    assert any("sampling_probability" in m for m in check_event(events.dpsgd_event(0.3, 16, 320, 40), _observed()))
    assert any("steps" in m for m in check_event(events.dpsgd_event(0.3, 16, 80, 10), _observed()))
    assert any("noise_multiplier" in m for m in check_event(events.dpsgd_event(0.6, 16, 80, 40), _observed()))
    patient = events.dpsgd_event(0.3, 16, 80, 40, "poisson", 4, unit="patient")
    assert check_event(patient, _observed(sampling_unit="patient", sampler_k=4, group_size=4)) == []
    assert any("max_contributions" in m for m in
               check_event(patient, _observed(sampling_unit="patient", sampler_k=4, group_size=2)))
    assert any("sampling unit" in m for m in check_event(patient, _observed(group_size=4)))
    paper = _observed(noise_mode="paper", replicas=2, accumulation_steps=2, gradient_noise_multiplier=0.3)
    assert any("gradient noise multiplier" in m for m in check_event(honest, paper))


def test_event_check_reads_the_running_sampler_a_sampler_with_another_q_is_caught(tmp_path):
    ledger = tmp_path / "dp_ledger.json"
    ledger.write_text(json.dumps({"steps_executed": 40}))
    config = dpsgd.DPSGDConfig(clip_norm=1.0, noise_multiplier=0.3, expected_batch_size=16.0)
    stepper = types.SimpleNamespace(config=config, strategy=tf.distribute.get_strategy())
    record = events.dpsgd_event(0.3, 16, 80, 40, "poisson")  # the plan: q = 16/80
    assert check_event(record, integrity.observe(sampling.PoissonSampler(64, 16 / 80), stepper, ledger, {})) == []
    four_q = sampling.PoissonSampler(64, 4 * 16 / 80)  # positive control: the sampler runs at 4q
    assert any("sampling_probability" in m for m in check_event(record, integrity.observe(four_q, stepper, ledger, {})))
    ledger.write_text(json.dumps({"steps_executed": 41}))  # one more step executed than recorded
    assert any("steps" in m for m in check_event(record, integrity.observe(
        sampling.PoissonSampler(64, 16 / 80), stepper, ledger, {})))


# ------------------------------------------------------------------------------ 2. units per step
def test_units_per_step_poisson_passes_honest_draws_and_catches_4q_and_shuffle_sizes():
    rng = np.random.default_rng(0)
    honest, broken = integrity.UnitsCheck("poisson", 500, 0.02, 10), integrity.UnitsCheck("poisson", 500, 0.02, 10)
    assert honest.result()["ran"] is False and honest.result()["reason"] == "not enough draws"
    for _ in range(20):
        honest.add(rng.binomial(500, 0.02))
        broken.add(rng.binomial(500, 0.08))  # positive control: a sampler at 4q
    assert honest.result()["passed"] and abs(honest.result()["z"]) < 6
    assert broken.result()["ran"] and not broken.result()["passed"] and broken.result()["z"] > 6
    shuffle = integrity.UnitsCheck("shuffle", 64, 0.25, 16)
    shuffle.add(16)
    assert shuffle.result()["passed"]
    shuffle.add(15)
    assert not shuffle.result()["passed"]


# ------------------------------------------------------------------------------ 3 + 4 on the real step
class _BrokenNoiseStep(dpsgd.DPSGDTrainStep):
    """Positive controls of the noise check, switched by variables so one trace serves all: the
    draw scaled by ``noise_scale`` (σ/2) and the seed's step counter stuck at 0 (``stuck``)."""

    def __init__(self, *args, **kwargs):
        self.noise_scale = tf.Variable(1.0, trainable=False)
        self.stuck = tf.Variable(False, trainable=False)
        super().__init__(*args, **kwargs)

    def _noise(self):
        step = tf.where(self.stuck, tf.constant(0, tf.int64), self.dp_step.read_value())
        step_seed = tf.random.experimental.stateless_fold_in(self._noise_seed, step)
        std = self.noise_scale * self.config.effective_noise_multiplier * self.config.clip_norm
        return [std * tf.random.stateless_normal(v.shape, tf.random.experimental.stateless_fold_in(step_seed, i),
                                                 dtype=v.dtype, alg="philox")
                for i, v in enumerate(self.variables)]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """One tiny dropout-free BERT and one real step (ghost clipping) whose ghost norms can be
    broken on purpose: ``ln_keep`` = 0 drops every LayerNorm's term from the norm (the clip
    factor uses the wrong norm), ``norm_scale`` scales the norms the path returns."""
    ln_keep, norm_scale = tf.Variable(1.0, trainable=False), tf.Variable(1.0, trainable=False)
    real_ln = ghost.REGISTRY[tf_keras.layers.LayerNormalization]
    real_sum = ghost.clipped_gradient_sum

    def ln(layer, args, kwargs, tape, cache):
        out, entry = real_ln(layer, args, kwargs, tape, cache)
        entry.sqr_norm_fn = lambda grads, fn=entry.sqr_norm_fn: ln_keep * fn(grads)
        return out, entry

    def scaled(*args, **kwargs):
        grads, losses, norms, outputs = real_sum(*args, **kwargs)
        return grads, losses, norms * norm_scale, outputs

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ghost.REGISTRY, tf_keras.layers.LayerNormalization, ln)
        mp.setattr(ghost, "clipped_gradient_sum", scaled)
        spec = bert_lib.BertSpec(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                 max_seq_length=16, max_predictions=3, dropout=0.0, attention_dropout=0.0)
        models = bert_lib.build_bert(spec, seed=0)
        mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, sorted(SPECIALS.values()), 4, 0.15)
        config = dpsgd.DPSGDConfig(clip_norm=1.0, noise_multiplier=0.5, expected_batch_size=8.0, noise_seed=3)
        stepper = _BrokenNoiseStep(models.mlm, tf_keras.optimizers.SGD(0.01), config, prepare_fn=prepare_fn,
                                   loss_fn=loss_fn, metrics_fn=metrics_fn,
                                   noise_probe=integrity.make_noise_probe(models.mlm.trainable_variables, seed=3))
        out = types.SimpleNamespace(stepper=stepper, mask_fn=mask_fn, data=repetitive_corpus(32, 16, VOCAB),
                                    ln_keep=ln_keep, norm_scale=norm_scale)
        _run(out, tmp_path_factory.mktemp("trace"), 1)  # traces the step and the check with the patches
    return out  # the traced functions keep the switchable ghost; the module's ghost is restored


def _run(rig, tmp_path, steps, every=1):
    checks = integrity.RunChecks(rig.stepper, sampling_mode="poisson", units=32, q=0.25, batch_size=8, every=every,
                                 output_dir=tmp_path, seed=5)
    rng = np.random.default_rng(7)
    for s in range(steps):
        rows = np.sort(rng.choice(32, size=rng.binomial(32, 0.25), replace=False))
        checks.step(mlm_rounds(rig.mask_fn, rig.data, np.arange(32), rows, 11, s, 8, 1), s)
    return checks


def test_clipping_check_passes_the_real_ghost_path_and_catches_broken_norms(rig, tmp_path):
    results = _run(rig, tmp_path, 2).finish()
    clip = results["clipping"]
    assert clip["ran"] and clip["passed"] and clip["checks"] == 2 and clip["compared_with_step_norm"]
    assert max(clip["max_relative_error"].values()) < 1e-5
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())
    assert saved["clipping"]["passed"]
    # Positive controls: a ghost norm without the LayerNorm terms; a norm scaled by 1.001.
    for variable, value in ((rig.ln_keep, 0.0), (rig.norm_scale, 1.001)):
        variable.assign(value)
        try:
            with pytest.raises(IntegrityCheckFailed, match="clipping"):
                _run(rig, tmp_path, 1)
        finally:
            variable.assign(1.0)
    assert not json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["clipping"]["passed"]


def test_noise_check_passes_the_real_draw_and_catches_half_sigma_and_a_stuck_step(rig, tmp_path):
    results = _run(rig, tmp_path, 4, every=2).finish()
    noise = results["noise"]
    assert noise["ran"] and noise["passed"] and noise["values"] == 4 * integrity.NOISE_COORDINATES
    assert abs(noise["std_ratio"] - 1) <= noise["std_tolerance"] and noise["lag1"] is not None
    assert results["units_per_step"]["ran"] is False  # 4 steps · 8 expected units < 50: not enough draws
    rig.stepper.noise_scale.assign(0.5)  # positive control: σ/2
    try:
        with pytest.raises(IntegrityCheckFailed, match=r"noise std 0\.[45]"):
            _run(rig, tmp_path, 1)
    finally:
        rig.stepper.noise_scale.assign(1.0)
    rig.stepper.stuck.assign(True)  # positive control: the noise seed's step counter is stuck
    try:
        with pytest.raises(IntegrityCheckFailed, match="lag-1 correlation 1.000"):
            _run(rig, tmp_path, 2)
    finally:
        rig.stepper.stuck.assign(False)


def test_clipping_check_per_patient_with_dropout_on(tmp_path):
    """k = 2 rows per patient, dropout on: the brute force sums the patient's rows' gradients and
    both sides run without dropout (the step's own masks cannot be replayed)."""
    spec = bert_lib.BertSpec(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=16, max_predictions=3, dropout=0.1, attention_dropout=0.1)
    models = bert_lib.build_bert(spec, seed=1)
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, sorted(SPECIALS.values()), 4, 0.15)
    config = dpsgd.DPSGDConfig(clip_norm=0.5, noise_multiplier=0.5, expected_batch_size=4.0, noise_seed=2, group_size=2)
    stepper = dpsgd.DPSGDTrainStep(models.mlm, tf_keras.optimizers.SGD(0.01), config, prepare_fn=prepare_fn,
                                   loss_fn=loss_fn, metrics_fn=metrics_fn)
    data = repetitive_corpus(24, 16, VOCAB)
    patients = [np.array([0, 1]), np.array([5]), np.array([7, 9]), np.array([12, 13])]
    checks = integrity.RunChecks(stepper, sampling_mode="poisson", units=12, q=1 / 3, batch_size=4, every=1,
                                 output_dir=tmp_path, seed=1)
    for s in range(2):
        checks.step(mlm_patient_rounds(mask_fn, data, np.arange(24), patients, 3, s, 2, 4, 1), s)
    clip = checks.finish()["clipping"]
    assert clip["passed"] and clip["checks"] == 2 and not clip["compared_with_step_norm"]
    assert clip["max_relative_error"]["norm"] < 1e-5


# ------------------------------------------------------------------------------ the real training run
def _train(out, **overrides):
    params = dict(batch_size=16, steps=8, learning_rate=3e-3, warmup_steps=2, clip_norm=1.0, noise_multiplier=0.3,
                  checkpoint_every=8, noise_seed=1, integrity_check_every=4)
    params.update(overrides)
    tc = TrainingConfig(**params)
    plan = plan_training(tc, 64)
    model = ModelConfig(preset="tiny", max_seq_length=16, dropout=0.0)
    return tc, plan, train_mlm(repetitive_corpus(), SPECIALS, VOCAB, model, tc, out, plan=plan, progress=False,
                               export_saved_model=False)


def test_train_mlm_honest_run_passes_every_check_and_its_event_matches_what_ran(tmp_path):
    tc, plan, result = _train(tmp_path)
    checks = result.integrity_checks
    assert checks["clipping"]["passed"] and checks["clipping"]["checks"] == 3  # steps 1, 4, 8
    assert checks["noise"]["passed"] and checks["units_per_step"]["passed"]
    assert json.loads((tmp_path / "train_result.json").read_text())["integrity_checks"]["noise"]["passed"]
    # The record the stage builds, against the values read from the running sampler, step and ledger.
    record = training_record(result.effective_noise_multiplier, plan, 64, result.steps_taken_total)
    assert check_event(record, result.observed) == []
    assert result.observed["steps_executed"] == 8 and result.observed["sampling_probability"] == 0.25
    assert check_event(training_record(result.effective_noise_multiplier, plan, 64, 2), result.observed)
    assert event_check.summary(checks) == {"units_per_step": "passed", "clipping": "passed", "noise": "passed"}


class _FourQSampler(sampling.PoissonSampler):
    """Positive control: says it samples at the plan's q, samples at 4q."""

    def sample(self, step=0):
        size = int(self.rng.binomial(self.n, min(1.0, 4 * self.q)))
        return np.sort(self.rng.choice(self.n, size=size, replace=False)).astype(np.int64)


def test_train_mlm_stops_when_the_sampler_runs_at_4q(tmp_path, monkeypatch):
    monkeypatch.setattr(sampling, "PoissonSampler", _FourQSampler)
    with pytest.raises(IntegrityCheckFailed, match="units per step") as failure:
        _train(tmp_path)  # q = 1/4, the sampler draws every row: enough draws and z ≈ 28 at step 4
    head = str(failure.value).split("the statistics")[0]
    assert re.findall(r"\d+", head) == ["6"]  # the tolerance; no exact count in the message
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["units_per_step"]
    assert saved["ran"] and not saved["passed"] and saved["z"] > 6 and saved["steps"] == 4
    assert not (tmp_path / "train_result.json").exists()
    assert math.isfinite(saved["z"])
