"""train_mlm end to end on a tiny model: learning, records, resume, ledger."""
import json
import math

import numpy as np
import pytest

from dpbert.config import ModelConfig, TrainingConfig
from dpbert.engine.train import CrashAfter, SimulatedCrash, load_models, train_mlm
from dpbert.privacy.plan import plan_training

from .conftest import SPECIALS, tiny_model

VOCAB = 40
MODEL = ModelConfig(preset="tiny", num_layers=1, max_seq_length=16, dropout=0.0)


def _train(corpus, out, resume=True, model=MODEL, **overrides):
    params = dict(batch_size=16, steps=40, learning_rate=3e-3, warmup_steps=3, clip_norm=1.0,
                  noise_multiplier=0.3, checkpoint_every=20, noise_seed=1)
    stop = overrides.pop("stop_after_steps", None)
    planned_n = overrides.pop("planned_dataset_size", None)
    params.update(overrides)
    tc = TrainingConfig(**params)
    plan = plan_training(tc, planned_n) if planned_n is not None else None
    return train_mlm(corpus, SPECIALS, VOCAB, model, tc, out, plan=plan, resume=resume, progress=False,
                     export_saved_model=False, hooks=[CrashAfter(stop)] if stop is not None else ())


def _first_last(losses, k=5):
    return float(np.mean(losses[:k])), float(np.mean(losses[-k:]))


def test_non_private_baseline_learns_and_records_infinite_epsilon(corpus, tmp_path):
    result = _train(corpus, tmp_path, non_private=True, sampling="shuffle")
    first, last = _first_last(result.losses)
    assert last < first - 1.0, result.losses  # repetitive corpus: loss clearly goes down
    assert result.non_private and math.isinf(result.epsilon) and result.noise_multiplier == 0.0
    assert result.clipping_path == "none" and result.clipped_fraction == 0.0
    # Shuffled fixed-size batches are recorded as such (no Poisson amplification for the accountant).
    assert result.sampling_mode == "shuffle" and result.expected_batch_size == 16 and result.sampling_rate == 0.25
    saved = json.loads((tmp_path / "train_result.json").read_text())
    assert saved["epsilon"] == "inf" and saved["non_private"] is True
    assert (tmp_path / "tensorboard").is_dir() and any((tmp_path / "tensorboard").iterdir())
    models = load_models(tmp_path)  # evaluators reload the encoder from model_config.json + weights
    assert models.spec.vocab_size == VOCAB and models.spec.max_seq_length == 16


def test_dp_training_learns_with_small_noise_and_records(corpus, tmp_path):
    # q = 16/80 planned, 64 rows present; the brute-force check: tests/model/test_integrity_checks.py
    result = _train(corpus, tmp_path, planned_dataset_size=80, integrity_check_every=0)
    first, last = _first_last(result.losses)
    assert last < first - 0.5, result.losses
    assert not result.non_private and result.epsilon is None and result.delta == 1e-6
    assert result.sampling_mode == "poisson" and result.sampling_rate == 0.2
    assert result.expected_batch_size == pytest.approx(0.2 * 80)  # the noise divisor q·n_planned
    assert result.noise_multiplier == result.gradient_noise_multiplier == 0.3
    # The accountant charges the gradient and the 4 DP diagnostics together: σ / √(1 + 4/8²).
    assert result.effective_noise_multiplier == pytest.approx(0.3 / math.sqrt(1 + 4 / 64))
    # Released loss = (exact clipped loss sum + N(0, (8σL)²)) / noisy B (dpbert.privacy.diagnostics:
    # a ratio of noisy sums, clamped to [0, L]): × the released B, residuals of the stated scale.
    loss = np.array(result.released_diagnostics["loss"])
    inside = (loss > 0) & (loss < 12.0) & (np.array(result.released_diagnostics["batch_size"]) >= 1)
    residual = (loss * np.array(result.released_diagnostics["batch_size"])
                - np.array([s["loss_clipped_sum"] for s in result.exact_diagnostic_sums]))[inside]
    assert inside.sum() >= 30 and np.all((loss >= 0) & (loss <= 12.0))
    std = result.diagnostics_noise_std["loss"]
    assert std == pytest.approx(8 * 0.3 * 12.0)
    assert abs(residual.std(ddof=1) / std - 1) < 4 / math.sqrt(2 * len(residual))  # χ² tolerance, z = 4
    assert abs(residual.mean()) < 4 * std / math.sqrt(len(residual))
    sizes = np.array(result.released_diagnostics["batch_size"]) - [s["examples"] for s in result.exact_diagnostic_sums]
    assert not np.allclose(sizes, 0)  # exact batch sizes are never released
    assert result.clip_norm == 1.0 and result.clipping_path == "ghost" and 0.0 <= result.clipped_fraction <= 1.0
    assert result.steps_taken_total == result.model_step == 40
    assert json.loads((tmp_path / "dp_steps.json").read_text())["steps_executed"] == 40
    # The traced step's noise, per trained piece, by the run-time noise check at the run's end.
    assert result.integrity_checks["noise"]["ran"] and result.integrity_checks["noise"]["passed"]


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_resume_after_crash_keeps_every_step(corpus, tmp_path):
    kwargs = dict(steps=8, checkpoint_every=3, accumulation_steps=2)
    with pytest.raises(SimulatedCrash):
        _train(corpus, tmp_path, stop_after_steps=5, **kwargs)  # checkpoint at 3; steps 4, 5 lost
    assert json.loads((tmp_path / "dp_steps.json").read_text())["steps_executed"] == 5
    result = _train(corpus, tmp_path, **kwargs)
    assert result.resumed_from_step == 3 and result.steps_this_run == 5
    assert result.model_step == 8  # the model took the planned number of steps
    assert result.steps_taken_total == 10  # ledger: 5 before the crash + 5 after (steps 4, 5 ran twice)
    # A crash right after a checkpoint loses nothing: total = planned.
    other = tmp_path / "b"
    with pytest.raises(SimulatedCrash):
        _train(corpus, other, stop_after_steps=6, **kwargs)
    result = _train(corpus, other, **kwargs)
    assert (result.resumed_from_step, result.steps_this_run, result.model_step, result.steps_taken_total) == (6, 2, 8, 8)
    # Resuming a finished run takes no step; resuming with other privacy parameters is refused.
    again = _train(corpus, other, **kwargs)
    assert again.steps_this_run == 0 and again.steps_taken_total == 8
    with pytest.raises(ValueError, match="noise_multiplier"):
        _train(corpus, other, noise_multiplier=2.0, **kwargs)


def test_input_validation(corpus, tmp_path):
    with pytest.raises(ValueError, match="exceed"):
        _train(np.zeros((4, 32), np.int32), tmp_path)
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        train_mlm(corpus, [0, 1, 2, 3], VOCAB, MODEL, TrainingConfig(steps=1), tmp_path, progress=False)
    with pytest.raises(ValueError, match="replicas"):
        _train(corpus, tmp_path, replicas=2)  # default strategy cannot have 2 replicas


def test_a_second_run_into_a_held_state_directory_is_refused_before_any_step(corpus, tmp_path):
    from dpbert.engine.train import StateDirectoryBusy, state_lock

    with state_lock(tmp_path):
        with pytest.raises(StateDirectoryBusy, match="another training run is using"):
            _train(corpus, tmp_path, steps=2)
    assert not (tmp_path / "dp_steps.json").exists()  # nothing read, nothing run


def test_two_runs_started_at_once_never_under_charge(corpus, tmp_path, eager_steps):
    """Both runs start together on one output: every step executed by either is in the ledger.
    (Eager steps of the smallest model: the lock and the ledger are tested, not the step.)"""
    import threading

    results, errors = [], []
    barrier = threading.Barrier(2)

    def run():
        barrier.wait()
        try:
            results.append(_train(corpus, tmp_path, model=tiny_model(), steps=2, checkpoint_every=1,
                                  integrity_check_every=0))
        except Exception as err:  # noqa: BLE001 - the refused run
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    executed = sum(r.steps_this_run for r in results)
    ledger = json.loads((tmp_path / "dp_steps.json").read_text())["steps_executed"]
    assert executed >= 2 and ledger == executed, (executed, ledger, errors)
    assert all(type(e).__name__ == "StateDirectoryBusy" for e in errors)
