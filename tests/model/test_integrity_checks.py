"""Run-time integrity checks of what the audit canaries cannot see: per check, an honest run
passes and deliberately broken mechanisms (positive controls, ``broken_mechanisms``) fail.

event check (``dpbert.privacy.event_check``); units per step and per-unit participation, brute-
force clipping, the noise handed to the optimizer per trained piece, the released diagnostics'
noise (``dpbert.mechanism.integrity``)."""
import json
import math
import re
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert.config import TrainingConfig
from dpbert.mechanism import adam_bc, clipping, gaussian
from dpbert.mechanism import step as step_lib
from dpbert.network import bert as bert_lib
from dpbert.mechanism import ghost, integrity, sampling
from dpbert.network import trainable as trainable_lib
from dpbert.engine.build import GHOST
from dpbert.engine.train import make_mlm_functions, mlm_patient_rounds, mlm_rounds, train_mlm
from dpbert.privacy import diagnostics, event_check, events
from dpbert.privacy.event_check import IntegrityCheckFailed, check_event
from dpbert.privacy.plan import plan_training
from dpbert.stages.pretrain import training_record

from . import broken_mechanisms as broken
from .conftest import SPECIALS, repetitive_corpus, tiny_model

VOCAB = 40
#: One worker runs the module under ``make test``'s xdist (``--dist loadgroup``): its rigs are built once.
pytestmark = pytest.mark.xdist_group("integrity_rigs")


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
    config = gaussian.DPSGDConfig(clip_norm=1.0, noise_multiplier=0.3, expected_batch_size=16.0)
    stepper = types.SimpleNamespace(config=config, strategy=tf.distribute.get_strategy())
    record = events.dpsgd_event(0.3, 16, 80, 40, "poisson")  # the plan: q = 16/80
    assert check_event(record, integrity.observe(sampling.PoissonSampler(64, 16 / 80), stepper, ledger, {})) == []
    four_q = sampling.PoissonSampler(64, 4 * 16 / 80)  # positive control: the sampler runs at 4q
    assert any("sampling_probability" in m for m in check_event(record, integrity.observe(four_q, stepper, ledger, {})))
    ledger.write_text(json.dumps({"steps_executed": 41}))  # one more step executed than recorded
    assert any("steps" in m for m in check_event(record, integrity.observe(
        sampling.PoissonSampler(64, 16 / 80), stepper, ledger, {})))


# ------------------------------------------------------------------------------ 2. the sampler
def test_units_per_step_passes_honest_draws_and_catches_4q_fixed_size_and_shuffle_sizes():
    rng = np.random.default_rng(0)
    honest, four_q, fixed = (integrity.UnitsCheck("poisson", 64, 0.25, 16) for _ in range(3))
    assert honest.result()["ran"] is False and honest.result()["reason"] == "not enough draws"
    for _ in range(20):
        honest.add(rng.binomial(64, 0.25))
        four_q.add(rng.binomial(64, 1.0))  # positive control: a sampler at 4q
        fixed.add(16)  # positive control: fixed-size batches of nq that claim Poisson
    result = honest.result()
    assert result["passed"] and min(result["p_values"].values()) >= result["level"]
    assert not four_q.result()["passed"] and "total" in four_q.result()["failed"]
    assert not fixed.result()["passed"] and fixed.result()["failed"] == ["dispersion_low"]
    assert "fixed-size" in integrity.UnitsCheck.message(fixed.result())
    shuffle = integrity.UnitsCheck("shuffle", 64, 0.25, 16)
    shuffle.add(16)
    assert shuffle.result()["passed"]
    shuffle.add(15)
    assert not shuffle.result()["passed"]


def test_participation_passes_honest_poisson_and_catches_a_unit_in_every_batch():
    rng = np.random.default_rng(1)
    honest, broken = (integrity.ParticipationCheck("poisson", 64, 0.25, 16) for _ in range(2))
    assert honest.result()["ran"] is False
    for _ in range(16):
        drawn = np.nonzero(rng.random(64) < 0.25)[0]
        honest.add(drawn)
        broken.add(np.union1d(drawn, [0]))  # positive control: unit 0 in every batch
    assert honest.result()["passed"] and honest.result()["p_value"] >= honest.result()["level"]
    result = broken.result()
    assert not result["passed"] and result["max_participation"] == 16
    assert not re.search(r"\b16\b|\b64\b", integrity.ParticipationCheck.message(result))  # no exact count
    shuffle = integrity.ParticipationCheck("shuffle", 64, 0.25, 16)
    sampler = sampling.ShuffleSampler(64, 16, key=3)
    for w in range(10):
        shuffle.add(sampler.sample(w))
    assert shuffle.result()["passed"]
    for _ in range(4):  # positive control: the same window four more times
        shuffle.add(np.arange(16))
    assert not shuffle.result()["passed"]


# ------------------------------------------------------------------------------ 4. released diagnostics
def _released(check, rng, steps, factor=1.0, exact_too=False):
    stds = diagnostics.noise_stds(0.5, diagnostics.DiagnosticsConfig())
    for _ in range(steps):
        exact = {"loss": rng.uniform(0, 200), "accuracy": rng.uniform(0, 16), "clipped": 4.0, "batch_size": 16.0}
        noisy = {k: v + (0.0 if exact_too else factor * rng.normal(0, stds[k])) for k, v in exact.items()}
        check.add(exact, noisy, stds)


def test_release_check_passes_the_claimed_noise_and_catches_exact_values_and_half_sigma():
    rng = np.random.default_rng(2)
    honest, exact, half = (integrity.ReleaseCheck() for _ in range(3))
    assert honest.result()["ran"] is False
    _released(honest, rng, 100)
    _released(exact, rng, 3, exact_too=True)  # positive control: the exact sums released
    _released(half, rng, 100, factor=0.5)  # positive control: noise at σ/2
    assert honest.result()["passed"]
    assert not exact.result()["passed"] and set(exact.result()["failed"]) >= set(diagnostics.PARTS)
    assert not half.result()["passed"] and "all parts" in half.result()["failed"]
    assert "does not carry the noise" in integrity.ReleaseCheck.message(half.result())
    zero = integrity.ReleaseCheck()
    zero.add({"loss": 1.0}, {"loss": 1.0}, {"loss": 0.0})  # a claimed std of 0
    assert not zero.result()["passed"] and zero.result()["failed"] == ["loss"]
    with pytest.raises(ValueError, match="'accuracy' has a noise std but no released value"):
        zero.add({"accuracy": 1.0}, {}, {"accuracy": 1.0})


def test_observe_takes_the_diagnostics_noise_the_release_check_tested(tmp_path):
    ledger = tmp_path / "dp_ledger.json"
    ledger.write_text(json.dumps({"steps_executed": 40}))
    config = gaussian.DPSGDConfig(clip_norm=1.0, noise_multiplier=0.3, expected_batch_size=16.0, loss_bound=12.0)
    stepper = types.SimpleNamespace(config=config, strategy=tf.distribute.get_strategy(), noise_probe=None)
    diag = diagnostics.DiagnosticsConfig()
    configured = diagnostics.noise_stds(0.3, diag)
    record = events.dpsgd_event(diagnostics.effective_noise_multiplier(0.3, diag), 16, 80, 40, "poisson")
    sampler = sampling.PoissonSampler(64, 16 / 80)
    rng = np.random.default_rng(5)
    for claimed, agrees in ((configured, True), ({k: v / 2 for k, v in configured.items()}, False)):
        checks = integrity.RunChecks(stepper, sampling_mode="poisson", units=80, q=0.2, batch_size=16, every=0,
                                     output_dir=None)
        for step in range(5):  # what the loop reports: the release at the std it claims
            exact = {"loss": 90.0, "accuracy": 8.0, "clipped": 4.0, "batch_size": 16.0}
            checks.released(step, exact, {k: v + rng.normal(0, claimed[k]) for k, v in exact.items()}, claimed)
        observed = integrity.observe(sampler, stepper, ledger, configured, checks=checks)
        assert (check_event(record, observed) == []) is agrees
    changed = integrity.ReleaseCheck()
    changed.add({"loss": 1.0}, {"loss": 2.0}, {"loss": 1.0})
    changed.add({"loss": 1.0}, {"loss": 2.0}, {"loss": 0.5})  # positive control: the claim moves
    assert not changed.result()["passed"] and "changed" in integrity.ReleaseCheck.message(changed.result())


# ------------------------------------------------------------------------------ false alarms at the unit level
@pytest.mark.parametrize("alpha", [0.2])
def test_honest_repeats_fail_at_most_at_the_stated_rate(alpha):
    """Many honest repeats of each statistical check at a large α: the false-alarm frequency is
    at most α (Bonferroni is conservative); at the production α (1e-6) none fails."""
    rng = np.random.default_rng(3)
    repeats = 150
    fails = {"units": 0, "participation": 0, "noise": 0, "release": 0}
    for _ in range(repeats):
        units = integrity.UnitsCheck("poisson", 64, 0.25, 16, alpha=alpha)
        part = integrity.ParticipationCheck("poisson", 64, 0.25, 16, alpha=alpha)
        noise = integrity.NoiseCheck(0.5, 1.0, 8.0, [("a", 16), ("b", 128), ("c", 3)], alpha=alpha)
        release = integrity.ReleaseCheck(alpha=alpha)
        for _ in range(12):
            drawn = np.nonzero(rng.random(64) < 0.25)[0]
            units.add(drawn.size)
            part.add(drawn)
            clean = rng.normal(size=147)
            noise.add(clean, (clean + 0.5 * rng.normal(size=147)) / 8.0)
        _released(release, rng, 12)
        for name, check in (("units", units), ("participation", part), ("noise", noise), ("release", release)):
            result = check.result(1)
            fails[name] += not result["passed"]
            assert result["ran"]
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / repeats)
    assert all(count / repeats <= bound for count in fails.values()), fails


def test_no_false_alarm_at_the_production_level_over_many_honest_looks():
    rng = np.random.default_rng(4)
    noise = integrity.NoiseCheck(1.0, 0.1, 16.0, [(f"v{i}", 128) for i in range(20)])
    for look in range(1, 60):
        clean = rng.normal(size=2560)
        noise.add(clean, (clean + 0.1 * rng.normal(size=2560)) / 16.0)
        assert noise.result(look)["passed"]
    assert integrity.FALSE_ALARM == 1e-6


# ------------------------------------------------------------------------------ 3 + 4 on the real step
def _query_bias(name: str) -> bool:
    return "attention/query/bias" in name


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """One tiny dropout-free BERT and one real step (ghost clipping) whose ghost norms can be
    broken on purpose: ``ln_keep`` = 0 drops every LayerNorm's term from the norm (the clip
    factor uses the wrong norm), ``norm_scale`` scales the norms the path returns, ``piece_clip``
    clips the attention query bias at that many C in ``clip()`` (``broken.piece_clipped_at``),
    ``step_clip`` clips at that many C in the step's accumulate only (``broken.step_clips_at``)."""
    ln_keep, norm_scale = tf.Variable(1.0, trainable=False), tf.Variable(1.0, trainable=False)
    piece_clip, step_clip = tf.Variable(1.0, trainable=False), tf.Variable(1.0, trainable=False)
    real_ln = ghost.REGISTRY[tf_keras.layers.LayerNormalization]
    real_sum = ghost.clipped_gradient_sum

    def ln(layer, args, kwargs, tape, cache):
        out, entry = real_ln(layer, args, kwargs, tape, cache)
        entry.sqr_norm_fn = lambda grads, fn=entry.sqr_norm_fn: ln_keep * fn(grads)
        return out, entry

    def scaled(*args, **kwargs):
        grads, losses, norms, outputs = real_sum(*args, **kwargs)
        return grads, losses, norms * norm_scale, outputs

    with pytest.MonkeyPatch.context() as mp, broken.piece_clipped_at(piece_clip, _query_bias), \
            broken.step_clips_at(step_clip):
        mp.setitem(ghost.REGISTRY, tf_keras.layers.LayerNormalization, ln)
        mp.setattr(ghost, "clipped_gradient_sum", scaled)
        spec = bert_lib.BertSpec(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                 max_seq_length=16, max_predictions=3, dropout=0.0, attention_dropout=0.0)
        models = bert_lib.build_bert(spec, seed=0)
        mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, sorted(SPECIALS.values()), 4, 0.15)
        config = gaussian.DPSGDConfig(clip_norm=1.0, noise_multiplier=0.5, expected_batch_size=8.0, noise_seed=3)
        stepper = step_lib.DPSGDTrainStep(models.mlm, tf_keras.optimizers.SGD(0.01), config, prepare_fn=prepare_fn,
                                          loss_fn=loss_fn, metrics_fn=metrics_fn,
                                          noise_probe=integrity.make_noise_probe(models.mlm.trainable_variables, seed=3),
                                          clipping=GHOST)
        out = types.SimpleNamespace(stepper=stepper, mask_fn=mask_fn, data=repetitive_corpus(32, 16, VOCAB),
                                    ln_keep=ln_keep, norm_scale=norm_scale, piece_clip=piece_clip,
                                    step_clip=step_clip)
        _run(out, tmp_path_factory.mktemp("trace"), 1)  # traces the step and the check with the patches
    return out  # the traced functions keep the switchable ghost; the module's ghost is restored


#: The appended tokens of the noise rig (``new_tokens``: a sliced piece of the word embedding).
NEW_IDS = [35, 36, 37, 38, 39]


@pytest.fixture(scope="module")
def noise_rig(tmp_path_factory):
    """The real step training [bias, head, new_tokens] (every LayerNorm γ/β and bias, the
    mlm_transform kernel, the appended tokens' rows), its draw and add replaced, while it traces,
    by ``broken_mechanisms.SwitchableNoise`` (honest until switched)."""
    spec = bert_lib.BertSpec(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=16, max_predictions=3, dropout=0.0, attention_dropout=0.0)
    models = bert_lib.build_bert(spec, seed=0)
    selection = trainable_lib.select(models, ["bias", "head", "new_tokens"], NEW_IDS)
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, sorted(SPECIALS.values()), 4, 0.15)
    config = gaussian.DPSGDConfig(clip_norm=1.0, noise_multiplier=0.5, expected_batch_size=8.0, noise_seed=3)
    switch = broken.SwitchableNoise(len(selection.pieces))
    with switch.install():
        stepper = step_lib.DPSGDTrainStep(models.mlm, tf_keras.optimizers.SGD(0.01), config, prepare_fn=prepare_fn,
                                          loss_fn=loss_fn, metrics_fn=metrics_fn, selection=selection,
                                          noise_probe=integrity.make_noise_probe(selection.pieces, seed=3),
                                          clipping=GHOST)
        out = types.SimpleNamespace(stepper=stepper, mask_fn=mask_fn, data=repetitive_corpus(32, 16, VOCAB),
                                    switch=switch)
        _run(out, tmp_path_factory.mktemp("trace"), 1, every=0)
    return out


def _run(rig, tmp_path, steps, every=1):
    checks = integrity.RunChecks(rig.stepper, sampling_mode="poisson", units=32, q=0.25, batch_size=8, every=every,
                                 output_dir=tmp_path, seed=5)
    rng = np.random.default_rng(7)
    for s in range(steps):
        rows = np.sort(rng.choice(32, size=rng.binomial(32, 0.25), replace=False))
        checks.step(mlm_rounds(rig.mask_fn, rig.data, np.arange(32), rows, 11, s, 8, 1), s)
    return checks


def test_clipping_check_passes_the_real_ghost_path_and_catches_broken_norms(rig, tmp_path):
    # every = 2: a step object's first check runs eagerly, the next one traced (every = 1: traced at once)
    rig.stepper._integrity_checks_made = 0
    results = _run(rig, tmp_path, 2, every=2).finish()
    clip = results["clipping"]
    assert clip["ran"] and clip["passed"] and clip["checks"] == 2 and clip["compared_with_step_norm"]
    assert max(clip["max_relative_error"].values()) < 1e-5
    assert rig.stepper._integrity_clip_fn is not None  # the second check was the traced function
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())
    assert saved["clipping"]["passed"]
    # Positive controls: a ghost norm without the LayerNorm terms; a norm scaled by 1.001; each
    # caught by the eager first check and by the traced one.
    for variable, value in ((rig.ln_keep, 0.0), (rig.norm_scale, 1.001)):
        variable.assign(value)
        try:
            for eager in (True, False):
                rig.stepper._integrity_checks_made = 0
                with pytest.raises(IntegrityCheckFailed, match="clipping"):
                    _run(rig, tmp_path, 1, every=2 if eager else 1)
        finally:
            variable.assign(1.0)
    assert not json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["clipping"]["passed"]


@pytest.mark.parametrize("control", ["2C_on_one_piece", "2C_in_the_step_only"])
def test_clipping_check_catches_2c_on_one_small_piece_and_2c_in_the_step_only(rig, tmp_path, control):
    """Positive controls that the whole-vector comparison of ``clip()`` passes: 2C on the attention
    query bias alone (a few 1e-6 of the unit's norm: caught per piece), and 2C in the step's own
    accumulate while ``clip()`` is honest (caught by the replay of the step's accumulate)."""
    variable, key = (rig.piece_clip, "clipped_piece") if control == "2C_on_one_piece" else (rig.step_clip, "summed")
    variable.assign(2.0)
    try:
        # The rig's clip() is broken in its traced check only (an eager check calls today's clip());
        # the step's replay runs the traced step, eager check or not. train_mlm below: both paths.
        for eager in (True, False) if control == "2C_in_the_step_only" else (False,):
            rig.stepper._integrity_checks_made = 0
            with pytest.raises(IntegrityCheckFailed, match=rf"clipping.*{key} relative error") as failure:
                _run(rig, tmp_path, 1, every=2 if eager else 1)
    finally:
        variable.assign(1.0)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["clipping"]
    errors = saved["max_relative_error"]
    assert errors["clipped"] < integrity.CLIP_RTOL  # what the whole-vector comparison of clip() saw
    if control == "2C_on_one_piece":
        # Measured against PIECE_FLOOR of the unit (the query bias is 1.8e-6 of it): 1.8e-2, 180x the tolerance.
        assert errors["clipped_piece"] > 100 * integrity.CLIP_RTOL and _query_bias(saved["worst_piece"]["clipped_piece"])
        assert _query_bias(str(failure.value))
    else:
        # summed_norm: |2C − C| / 2C = 0.5 exactly, up to float32 rounding (either side of 0.5)
        assert errors["clipped_piece"] < 1e-5 and errors["summed"] > 0.5 and errors["summed_norm"] > 0.5 - 1e-5


def test_clipping_check_per_patient_with_dropout_on(tmp_path, eager_steps):
    """k = 2 rows per patient, dropout on: the brute force sums the patient's rows' gradients and
    both sides run without dropout (the step's own masks cannot be replayed). Eagerly: the check's
    values are tested (traced: the rig above)."""
    spec = bert_lib.BertSpec(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=16, max_predictions=3, dropout=0.1, attention_dropout=0.1)
    models = bert_lib.build_bert(spec, seed=1)
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, sorted(SPECIALS.values()), 4, 0.15)
    config = gaussian.DPSGDConfig(clip_norm=0.5, noise_multiplier=0.5, expected_batch_size=4.0, noise_seed=2, group_size=2)
    stepper = step_lib.DPSGDTrainStep(models.mlm, tf_keras.optimizers.SGD(0.01), config, prepare_fn=prepare_fn,
                                      loss_fn=loss_fn, metrics_fn=metrics_fn, clipping=GHOST)
    data = repetitive_corpus(24, 16, VOCAB)
    patients = [np.array([0, 1]), np.array([5]), np.array([7, 9]), np.array([12, 13])]
    checks = integrity.RunChecks(stepper, sampling_mode="poisson", units=12, q=1 / 3, batch_size=4, every=1,
                                 output_dir=tmp_path, seed=1)
    for s in range(2):
        checks.step(mlm_patient_rounds(mask_fn, data, np.arange(24), patients, 3, s, 2, 4, 1), s)
    clip = checks.finish()["clipping"]
    assert clip["passed"] and clip["checks"] == 2 and not clip["compared_with_step_norm"]
    assert clip["max_relative_error"]["norm"] < 1e-5


def test_noise_check_passes_the_real_draw_per_variable(noise_rig, tmp_path):
    # The noise rig's runs (this one and its controls below): every = 0, the noise check's one look
    # at the run's end (the brute-force clipping check of the real ghost path: the rig's tests
    # above; of a trained subset: tests/model/test_trainable.py)
    results = _run(noise_rig, tmp_path, 4, every=0).finish()
    noise = results["noise"]
    names = [p.name for p in noise_rig.stepper.selection.pieces]
    assert noise["ran"] and noise["passed"] and set(noise["per_variable"]) == set(names)
    assert any("rows" in n for n in names) and any("mlm_transform" in n and "kernel" in n for n in names)
    assert all(abs(r["std_ratio"] - 1) < 0.5 for r in noise["per_variable"].values())
    assert abs(noise["std_ratio"] - 1) < 0.1 and noise["lag1"] is not None and noise["level"] < 1e-7
    assert results["units_per_step"]["ran"] is False  # 4 steps · 8 expected units < 50: not enough draws


def _one(names, word, exclude=()):
    return next(n for n in names if all(w in n for w in word) and not any(x in n for x in exclude))


@pytest.mark.parametrize("broken_piece", ["layer_norm_gamma", "bias", "new_token_rows", "mlm_transform_kernel"])
def test_noise_check_catches_no_noise_on_one_piece(noise_rig, tmp_path, broken_piece):
    """Positive controls: no noise on ONE LayerNorm γ, one bias (not the output bias), the appended
    tokens' rows, the mlm_transform kernel — each a few % of the trained coordinates."""
    names = [p.name for p in noise_rig.stepper.selection.pieces]
    target = {"layer_norm_gamma": _one(names, ["gamma"]),
              "bias": _one(names, ["bias"], exclude=["mlm_output", "rows"]),
              "new_token_rows": _one(names, ["word_embeddings", "rows"]),
              "mlm_transform_kernel": _one(names, ["mlm_transform", "kernel"])}[broken_piece]
    try:
        assert noise_rig.switch.silence(noise_rig.stepper, lambda n: n == target) == [target]
        with pytest.raises(IntegrityCheckFailed, match="noise") as failure:
            _run(noise_rig, tmp_path, 1, every=0).finish()
    finally:
        noise_rig.switch.reset()
    assert f"{target}: std 0.000" in str(failure.value)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["noise"]
    assert saved["failed"] == [target] and saved["per_variable"][target]["p"] < saved["level"]


@pytest.mark.parametrize("control", ["drawn_not_added", "half_sigma", "stuck_step"])
def test_noise_check_catches_noise_not_added_half_sigma_and_a_stuck_step(noise_rig, tmp_path, control):
    switch = noise_rig.switch
    try:
        if control == "drawn_not_added":
            switch.added.assign(False)
            with pytest.raises(IntegrityCheckFailed, match="all variables: std 0.000"):
                _run(noise_rig, tmp_path, 1, every=0).finish()
        elif control == "half_sigma":
            switch.scale.assign(tf.fill(switch.scale.shape, 0.5))
            with pytest.raises(IntegrityCheckFailed, match=r"all variables: std 0\.[45]"):
                _run(noise_rig, tmp_path, 1, every=0).finish()
        else:  # the noise seed's step counter stuck at 0: the same z every step
            switch.stuck.assign(True)
            with pytest.raises(IntegrityCheckFailed, match=r"lag-1 correlation (0\.9|1\.0)"):
                _run(noise_rig, tmp_path, 2, every=0).finish()
    finally:
        switch.reset()


def test_no_noise_on_the_new_token_rows_fails_the_real_train_mlm(tmp_path, eager_steps):
    """The real ``train_mlm`` ([bias, head, new_tokens], the demo's set): no noise on the appended
    tokens' rows (~10 % of the trained coordinates) stops the run at its first step."""
    with broken.no_noise_on(lambda name: "word_embeddings" in name and "rows" in name):
        with pytest.raises(IntegrityCheckFailed, match=r"word_embeddings.*rows.*std 0\.000"):
            _train(tmp_path, trainable=["bias", "head", "new_tokens"], new_token_ids=NEW_IDS)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["noise"]
    assert len(saved["failed"]) == 1 and not (tmp_path / "train_result.json").exists()


# ------------------------------------------------------------------------------ the real training run
# The honest run is traced (the shipped step and the check's traced function); each positive
# control below stops its run within 16 steps and runs eagerly (``eager_steps``): the verdict is
# tested, on the same loop, checks and broken mechanism, without a trace of its own.
def _train(out, new_token_ids=None, rows=64, **overrides):
    params = dict(batch_size=16, steps=8, learning_rate=3e-3, warmup_steps=2, clip_norm=1.0, noise_multiplier=0.3,
                  checkpoint_every=8, noise_seed=1, integrity_check_every=4)
    params.update(overrides)
    tc = TrainingConfig(**params)
    plan = plan_training(tc, rows)
    return tc, plan, train_mlm(repetitive_corpus(rows), SPECIALS, VOCAB, tiny_model(), tc, out, plan=plan,
                               progress=False, export_saved_model=False, new_token_ids=new_token_ids)


def wire_hooks(monkeypatch):
    """Test plumbing for a training loop that does not call ``RunChecks.sampled`` / ``released``
    itself (the engine's loop does: then this adds nothing). The Poisson sampler (whatever class
    ``sampling.PoissonSampler`` is now: a broken fixture too) records its draws, reported to
    ``sampled`` before the step unless the loop reported the step itself; ``diagnostics.release``
    runs as its three steps (``exact_parts`` → ``noisy_sums``, whatever that is now → ``ratios``)
    and reports the exact and released sums with their claimed stds. The mechanisms are untouched."""
    holder = {}

    class Checks(integrity.RunChecks):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            holder["checks"] = self

        def sampled(self, step, unit_indices):
            holder["reported"] = step
            super().sampled(step, unit_indices)

        def launch(self, rounds, step):
            holder["step"] = step
            drawn = holder.pop("drawn", np.zeros(0, np.int64))
            if holder.get("reported") != step:
                integrity.RunChecks.sampled(self, step, drawn)
            return super().launch(rounds, step)

    class Recording(sampling.PoissonSampler):
        def sample(self, step=0):
            holder["drawn"] = super().sample(step)
            return holder["drawn"]

    def release(sums, sigma, expected_batch, config, rng=None):
        exact = diagnostics.exact_parts(sums)
        noisy = diagnostics.noisy_sums(exact, sigma, config, rng)
        holder["checks"].released(holder["step"], exact, noisy, diagnostics.noise_stds(sigma, config))
        return diagnostics.ratios(noisy, config)

    monkeypatch.setattr(integrity, "RunChecks", Checks)
    monkeypatch.setattr(sampling, "PoissonSampler", Recording)
    monkeypatch.setattr(diagnostics, "release", release)
    return holder


ALL_CHECKS = ("units_per_step", "participation", "clipping", "noise", "released_diagnostics")


def test_train_mlm_honest_run_passes_every_check_and_its_event_matches_what_ran(tmp_path, monkeypatch):
    wire_hooks(monkeypatch)
    tc, plan, result = _train(tmp_path)
    checks = result.integrity_checks
    assert checks["clipping"]["passed"] and checks["clipping"]["checks"] == 3  # steps 1, 4, 8
    assert all(checks[name]["ran"] and checks[name]["passed"] for name in ALL_CHECKS), checks
    assert checks["participation"]["steps"] == 8 and checks["released_diagnostics"]["steps"] == 8
    assert json.loads((tmp_path / "train_result.json").read_text())["integrity_checks"]["noise"]["passed"]
    # The record the stage builds, against the values read from the running sampler, step and ledger.
    record = training_record(result.effective_noise_multiplier, plan, 64, result.steps_taken_total)
    assert check_event(record, result.observed) == []
    assert result.observed["steps_executed"] == 8 and result.observed["sampling_probability"] == 0.25
    assert check_event(training_record(result.effective_noise_multiplier, plan, 64, 2), result.observed)
    # What the model artifact may carry: passed / failed per check, no statistic, no count.
    assert event_check.summary(checks) == {name: "passed" for name in ALL_CHECKS}


class _FourQSampler(sampling.PoissonSampler):
    """Positive control: says it samples at the plan's q, samples at 4q."""

    def sample(self, step=0):
        size = int(self.rng.binomial(self.n, min(1.0, 4 * self.q)))
        return np.sort(self.rng.choice(self.n, size=size, replace=False)).astype(np.int64)


def _no_exact_count(message: str, *counts):
    head = message.split("the statistics")[0]
    assert not any(re.search(rf"(?<![\d.e-]){c}(?![\d.])", head) for c in counts), head


def test_train_mlm_stops_when_the_sampler_runs_at_4q(tmp_path, monkeypatch, eager_steps):
    monkeypatch.setattr(sampling, "PoissonSampler", _FourQSampler)
    with pytest.raises(IntegrityCheckFailed, match="units per step") as failure:
        # q = 32/128 = 1/4, the sampler draws every row: enough draws (2 · 32 expected), p ≈ 0 at the run's end
        _train(tmp_path, rows=128, batch_size=32, steps=2, integrity_check_every=8)
    _no_exact_count(str(failure.value), 128, 256)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["units_per_step"]
    assert saved["ran"] and not saved["passed"] and saved["z"] > 6 and saved["steps"] == 2
    assert not (tmp_path / "train_result.json").exists()


# fixed size: the slow tier (make test: the units check on the real run, 4q above; its dispersion
# test, fixed-size control included, in test_units_per_step_passes_honest_draws_and_catches_4q_...)
@pytest.mark.parametrize("sampler", [pytest.param("fixed_size", marks=pytest.mark.slow), "one_unit_always"])
def test_train_mlm_stops_on_a_fixed_size_sampler_and_on_a_unit_in_every_batch(tmp_path, monkeypatch, sampler,
                                                                             request):
    """Positive controls that pass the mean test: batches of exactly nq = 16 units (dispersion 0),
    and Poisson at q plus one unit in every batch (its participation q^T = 2e-10 at T = 16). The
    fixed-size run stops at step 8, eagerly; the other takes its 16 steps traced (cheaper there)."""
    if sampler == "fixed_size":
        request.getfixturevalue("eager_steps")
    cls = {"fixed_size": broken.FixedSizeSampler, "one_unit_always": broken.OneUnitAlwaysSampler}[sampler]
    monkeypatch.setattr(sampling, "PoissonSampler", cls)
    wire_hooks(monkeypatch)
    with pytest.raises(IntegrityCheckFailed, match="spread is too small" if sampler == "fixed_size" else
                       "more steps than Binomial") as failure:
        # fixed size: caught at the look of step 8; one unit always: at the look of the run's end
        _train(tmp_path, steps=16, integrity_check_every=8 if sampler == "fixed_size" else 32)
    _no_exact_count(str(failure.value), 64, 16)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())
    if sampler == "fixed_size":
        assert saved["units_per_step"]["failed"] == ["dispersion_low"] and abs(saved["units_per_step"]["z"]) < 1e-9
        assert saved["participation"]["passed"]
    else:
        assert saved["participation"]["max_participation"] == saved["participation"]["steps"]
        assert saved["units_per_step"]["passed"]


def test_train_mlm_stops_when_the_exact_diagnostics_are_released(tmp_path, monkeypatch, eager_steps):
    """Positive control of the release check on the real run: the exact batch sizes (and every
    other diagnostic sum) released. (Noise at σ/2: the unit-level test above.)"""
    wire_hooks(monkeypatch)
    with broken.exact_release(), pytest.raises(IntegrityCheckFailed, match="released_diagnostics") as failure:
        # caught at the run's end (the first step's look comes before its release)
        _train(tmp_path, steps=2, integrity_check_every=4)
    assert "batch_size: noise std 0.000 x the claimed std" in str(failure.value)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["released_diagnostics"]
    assert not saved["passed"] and set(saved["failed"]) == set(diagnostics.PARTS) | {"all parts"}


@pytest.mark.parametrize("control", ["2C_on_one_piece", pytest.param("2C_in_the_step_only", marks=pytest.mark.slow)])
def test_train_mlm_stops_on_2c_on_one_small_piece_and_on_2c_in_the_step_only(tmp_path, control, eager_steps):
    """The shipped loop, checked at its first step (eager check): 2C on the attention query bias in
    the clipping path (the step and ``clip()``), or 2C in the step's accumulate only. The honest
    run passes: ``test_train_mlm_honest_run_passes_every_check_and_its_event_matches_what_ran``.
    (Both controls on the rig, eager and traced: above; make test runs the first here.)"""
    fixture = broken.piece_clipped_at(2.0, _query_bias) if control == "2C_on_one_piece" else broken.step_clips_at(2.0)
    with fixture, pytest.raises(IntegrityCheckFailed, match="clipping") as failure:
        _train(tmp_path, steps=2, integrity_check_every=2)
    saved = json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())["clipping"]
    assert not saved["passed"] and saved["checks"] == 1
    if control == "2C_on_one_piece":
        assert _query_bias(saved["worst_piece"]["clipped_piece"]) and _query_bias(saved["worst_piece"]["summed_piece"])
        assert "clipped_piece relative error" in str(failure.value)
    else:
        assert saved["max_relative_error"]["clipped_piece"] < 1e-5 and saved["max_relative_error"]["summed"] > 0.5
    assert not (tmp_path / "train_result.json").exists()


# ------------------------------------------------------------------------------ the optimizer and clipping options
#: The DPSGDConfig of each option (training.clipping normalized; training.optimizer adamw_bc): the
#: positive controls above must still be caught under each. Normalized clipping at C = 0.5: a check
#: reading clip_norm instead of the mechanism's sensitivity (Δ = 1) would be off by 2. adamw_bc
#: clips at C = 0.1, below every unit's norm, so a bound of 2C changes the clipped sum.
MODES = {"normalized": dict(clip_rule="normalized", clip_stability=0.01, clip_norm=0.5), "adamw_bc": dict(clip_norm=0.1)}


@pytest.fixture(scope="module", params=list(MODES))
def mode_rig(request):
    """The real step on the tiny dropout-free BERT under one option (DP-AdamBC: its Φ from the
    mechanism), built with three switches installed (honest until switched): ``piece_clip`` (the
    attention query bias at that many Δ in ``clip()``, ``broken.piece_clipped_at``),
    ``step_clip`` (every unit at that many Δ in the step's accumulate only,
    ``broken.step_clips_at``) and ``switch`` (``broken.SwitchableNoise``). Not traced here: the
    tests run it eagerly (``eager_steps``), the traced step is the flat rig's concern above."""
    mode = request.param
    piece_clip, step_clip = tf.Variable(1.0, trainable=False), tf.Variable(1.0, trainable=False)
    spec = bert_lib.BertSpec(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=16, max_predictions=3, dropout=0.0, attention_dropout=0.0)
    models = bert_lib.build_bert(spec, seed=0)
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, sorted(SPECIALS.values()), 4, 0.15)
    config = gaussian.DPSGDConfig(noise_multiplier=0.5, expected_batch_size=8.0, noise_seed=3, **MODES[mode])
    optimizer = adam_bc.DPAdamBC(learning_rate=0.01, weight_decay=0.0, jit_compile=False) if mode == "adamw_bc" \
        else tf_keras.optimizers.SGD(0.01)
    switch = broken.SwitchableNoise(len(models.mlm.trainable_variables))
    with broken.piece_clipped_at(piece_clip, _query_bias), broken.step_clips_at(step_clip), switch.install():
        stepper = step_lib.DPSGDTrainStep(models.mlm, optimizer, config, prepare_fn=prepare_fn, loss_fn=loss_fn,
                                          metrics_fn=metrics_fn, clipping=GHOST,
                                          noise_probe=integrity.make_noise_probe(models.mlm.trainable_variables, seed=3))
    assert stepper.mechanism.sensitivity == (1.0 if mode == "normalized" else 0.1)  # normalized: Δ = 1 ≠ C = 0.5
    assert mode != "adamw_bc" or optimizer.noise_variance == stepper.mechanism.update_noise_variance > 0
    return types.SimpleNamespace(mode=mode, stepper=stepper, mask_fn=mask_fn, data=repetitive_corpus(32, 16, VOCAB),
                                 piece_clip=piece_clip, step_clip=step_clip, switch=switch)


#: Each control: (switch it on, what the failure says).
def _mode_switches(rig) -> dict:
    gamma = _one([p.name for p in rig.stepper.selection.pieces], ["gamma"])
    return {"2x_on_one_piece": (lambda: rig.piece_clip.assign(2.0), r"clipping.*clipped_piece relative error"),
            "2x_in_the_step_only": (lambda: rig.step_clip.assign(2.0), r"clipping.*summed relative error"),
            "no_noise_on_one_piece": (lambda: rig.switch.silence(rig.stepper, lambda n: n == gamma),
                                      rf"noise.*{re.escape(gamma)}: std 0\.000"),
            "drawn_not_added": (lambda: rig.switch.added.assign(False), "all variables: std 0.000"),
            "half_sigma": (lambda: rig.switch.scale.assign(tf.fill(rig.switch.scale.shape, 0.5)),
                           r"all variables: std 0\.[45]"),
            "stuck_step": (lambda: rig.switch.stuck.assign(True), r"lag-1 correlation (0\.9|1\.0)")}


def _mode_controls(rig, tmp_path, controls, match: str):
    """Switch ``controls`` on together, run (a failure matching ``match`` raised), switch them
    off; returns the checks' record (every check's verdict at the failing look)."""
    switches = _mode_switches(rig)
    clipping_control = any(c.startswith("2x") for c in controls)
    try:
        for control in controls:
            switches[control][0]()
        with pytest.raises(IntegrityCheckFailed, match=match):
            # A noise control needs no brute-force clipping check; the stuck step needs two steps.
            _run(rig, tmp_path, 2 if "stuck_step" in controls else 1, every=1 if clipping_control else 0).finish()
    finally:
        rig.piece_clip.assign(1.0)
        rig.step_clip.assign(1.0)
        rig.switch.reset()
    return json.loads((tmp_path / integrity.INTEGRITY_FILE).read_text())


def test_each_option_passes_honestly_and_catches_2x_on_one_piece_and_no_noise_on_one_piece(mode_rig, tmp_path,
                                                                                          eager_steps):
    """Normalized clipping: the honest step passes the brute-force clipping check (its own rule,
    g/(‖g‖ + r)) and the noise check (std σ·Δ/B, Δ = 1 the mechanism's); 2Δ on the query bias
    alone and no noise on one LayerNorm γ, switched on together, are each caught by its own check.
    DP-AdamBC (the flat mechanism, another optimizer): the honest noise check passes and no
    noise on one γ is caught. Each control alone, and the others: the slow tier below."""
    normalized = mode_rig.mode == "normalized"
    results = _run(mode_rig, tmp_path, 1, every=1 if normalized else 0).finish()
    assert results["noise"]["passed"] and abs(results["noise"]["std_ratio"] - 1) < 0.1, results["noise"]
    if normalized:
        assert results["clipping"]["passed"] and results["clipping"]["checks"] == 1, results["clipping"]
    gamma = _one([p.name for p in mode_rig.stepper.selection.pieces], ["gamma"])
    controls = ("2x_on_one_piece", "no_noise_on_one_piece") if normalized else ("no_noise_on_one_piece",)
    saved = _mode_controls(mode_rig, tmp_path, controls, "clipping" if normalized else "noise")
    assert saved["noise"]["failed"] == [gamma] and saved["noise"]["per_variable"][gamma]["std_ratio"] == 0.0
    if normalized:
        assert not saved["clipping"]["passed"] and _query_bias(saved["clipping"]["worst_piece"]["clipped_piece"])


@pytest.mark.slow
@pytest.mark.parametrize("control", ["2x_on_one_piece", "2x_in_the_step_only", "no_noise_on_one_piece",
                                     "drawn_not_added", "half_sigma", "stuck_step"])
def test_each_option_catches_each_clipping_and_noise_control_alone(mode_rig, tmp_path, eager_steps, control):
    _mode_controls(mode_rig, tmp_path, (control,), _mode_switches(mode_rig)[control][1])


#: The TrainingConfig keys of each option, for the shipped loop.
MODE_KEYS = {"normalized": dict(clipping="normalized", clip_norm=0.5), "adamw_bc": dict(optimizer="adamw_bc")}


@pytest.mark.slow
@pytest.mark.parametrize("control", ["honest", "4q_sampler", "exact_diagnostics"])
@pytest.mark.parametrize("mode", list(MODE_KEYS))
def test_train_mlm_under_each_option_passes_honestly_and_stops_on_4q_and_on_exact_diagnostics(
        tmp_path, monkeypatch, mode, control):
    wire_hooks(monkeypatch)
    if control == "honest":
        _, _, result = _train(tmp_path, **MODE_KEYS[mode])
        assert all(result.integrity_checks[name]["passed"] for name in ALL_CHECKS), result.integrity_checks
        return
    if control == "4q_sampler":
        monkeypatch.setattr(sampling, "PoissonSampler", _FourQSampler)
        with pytest.raises(IntegrityCheckFailed, match="units per step"):
            _train(tmp_path, **MODE_KEYS[mode])
        return
    with broken.exact_release(), pytest.raises(IntegrityCheckFailed, match="released_diagnostics"):
        _train(tmp_path, **MODE_KEYS[mode])
