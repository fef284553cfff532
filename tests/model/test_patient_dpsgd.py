"""User-level (patient) DP-SGD: patient sampling, ≤ k tuples per patient, packing, noise std per
update for P ∈ {1, 2} replicas and T ∈ {1, 4} accumulation, training and resume charging."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpbert.config import ModelConfig, TrainingConfig
from dpbert.mechanism import sampling
from dpbert.diagnostics.noise_check import noise_check
from dpbert.engine.train import CrashAfter, SimulatedCrash, train_mlm
from dpbert.privacy.plan import plan_training

from .conftest import SPECIALS, repetitive_corpus

ROOT = Path(__file__).resolve().parents[2]


def _keys(sizes):
    return [f"P{p}" for p, size in enumerate(sizes) for _ in range(size)]


def test_patient_sampler_rate_cap_and_own_randomness():
    sizes = [1, 2, 5, 9] * 50  # 200 patients, some with fewer than k = 4 tuples
    groups = sampling.group_rows(_keys(sizes))
    assert len(groups) == 200
    sampler = sampling.PatientPoissonSampler(groups, q=0.1, k=4, key=7, seed=0)
    counts = []
    for step in range(200):
        patients = sampler.sample_patients(step)
        counts.append(len(patients))
        for rows in patients:
            patient = int(np.searchsorted(np.cumsum(sizes), rows[0], side="right"))
            assert len(rows) == min(4, sizes[patient]) and len(set(rows.tolist())) == len(rows)
            assert set(rows.tolist()) <= set(groups.members[patient].tolist())  # its own rows only
    assert abs(np.mean(counts) - 20) <= sampling.poisson_size_tolerance(200, 0.1, draws=200)
    # A patient's choice depends on (key, its own id, its own rows, step) only: not on the others.
    other = sampling.group_rows(["X"] * 3 + _keys([9]))  # patient "P0" with 9 rows, after 3 rows of X
    mine = sampling.group_rows(_keys([9]))
    for step in range(5):
        a = sampling.patient_rows(mine, 0, 4, key=11, step=step)
        b = sampling.patient_rows(other, 1, 4, key=11, step=step) - 3
        np.testing.assert_array_equal(a, b)
    choices = {tuple(sampling.patient_rows(mine, 0, 4, key=11, step=s)) for s in range(30)}
    assert len(choices) > 10  # fresh choice per step: the patient's tuples are cycled through
    assert {r for c in choices for r in c} == set(range(9))


def test_pack_patient_rounds_layout():
    data = np.arange(20)[:, None] * np.ones((1, 3), np.int32)
    patients = [np.array([4, 5, 6]), np.array([9]), np.array([1, 2]), np.array([7, 8, 10])]
    rounds = sampling.pack_patient_rounds(data, patients, k=3, micro_patients=1, replicas=2)
    assert len(rounds) == 2
    assert rounds[0]["features"].shape == (2, 3, 3) and rounds[0]["example_mask"].shape == (2, 3)
    np.testing.assert_array_equal(rounds[0]["features"][0, :, 0], [4, 5, 6])
    np.testing.assert_array_equal(rounds[0]["features"][1, :, 0], [9, 0, 0])
    np.testing.assert_array_equal(rounds[0]["example_mask"][1], [1, 0, 0])
    np.testing.assert_array_equal(rounds[1]["example_mask"][0], [1, 1, 0])
    empty = sampling.pack_patient_rounds(data, [], k=3, micro_patients=2, replicas=1)
    assert len(empty) == 1 and not empty[0]["example_mask"].any()
    with pytest.raises(ValueError, match="k = 2"):
        sampling.pack_patient_rounds(data, patients, k=2, micro_patients=1, replicas=1)


def _assert_noise(result, replicas, accumulation):
    assert result["passed"], result
    assert result["group_size"] == 4
    assert abs(result["measured_std"] / result["expected_std"] - 1) <= result["tolerance"]  # σC/B_patients
    if replicas * accumulation > 1:  # one draw per logical batch
        assert abs(result["measured_std"] / result["paper_std"] - 1) > 10 * result["tolerance"]


# T = 1 (the same patient clipping, draw and add, one micro-batch): the slow tier; T = 4 here
@pytest.mark.parametrize("accumulation", [pytest.param(1, marks=pytest.mark.slow), 4])
def test_patient_mode_noise_std_single_replica(accumulation, eager_steps):
    """Two eager steps (as tests/model/test_dpsgd.py's checks): m = 2 × ~4,000 coordinates, the
    tolerance z/√(2m) from m (z = 4), ≈ 3.2 %; noise per shard (T = 4: 2× the std) 15 tolerances off."""
    result = noise_check(1, accumulation, noise_multiplier=1.3, clip=0.01, batch_size=8, steps=2, group_size=4)
    _assert_noise(result, 1, accumulation)


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_patient_mode_two_replicas_noise_and_training_in_subprocess(tmp_path):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("patient_replicas_worker.py")),
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for result in out["noise"]:
        assert result["strategy"] == "MirroredStrategy"
        _assert_noise(result, 2, result["accumulation"])
    train = out["train"]
    assert train["replicas"] == 2 and train["accumulation"] == 2 and train["model_step"] == 4
    assert train["expected_batch_size"] == pytest.approx(8.0)  # B_patients: the divisor of the noisy sum
    assert np.isfinite(train["final_mlm_loss"])


def _patient_run(out, steps=5, stop_after=None, resume=True):
    ids = repetitive_corpus(n=48)
    keys = [f"P{i % 16}" for i in range(48)]  # 16 patients of 3 tuples, k = 2
    tc = TrainingConfig(batch_size=4, steps=steps, noise_multiplier=0.8, clip_norm=1.0, checkpoint_every=2,
                        warmup_steps=1)
    plan = plan_training(tc, 16, unit="patient", max_contributions=2)
    return train_mlm(ids, SPECIALS, 40, ModelConfig(preset="tiny", num_layers=1, max_seq_length=16), tc, out, plan=plan,
                     resume=resume, progress=False, export_saved_model=False, patient_keys=keys,
                     hooks=[CrashAfter(stop_after)] if stop_after is not None else ())


@pytest.mark.slow  # make test-all; covered in make test by crash and resume of the loop: tests/model/test_engine_loop.py
def test_patient_run_resumed_after_a_crash_charges_every_step(tmp_path):
    out = tmp_path / "state"
    with pytest.raises(SimulatedCrash):
        _patient_run(out, stop_after=3)  # checkpoint at step 2; step 3 ran and is lost
    ledger = json.loads((out / "dp_steps.json").read_text())
    assert ledger["steps_executed"] == 3
    assert json.loads((out / "run_config.json").read_text())["unit"] == "patient"
    result = _patient_run(out)
    assert result.resumed_from_step == 2 and result.model_step == 5 and result.steps_this_run == 3
    assert result.steps_taken_total == 6  # 3 before the crash (one lost) + 3 after: every step charged
    assert result.expected_batch_size == pytest.approx(4.0) and result.sampling_rate == pytest.approx(0.25)
    assert result.clipping_path == "ghost"
    # The released batch size counts patients (noisy around q·n_patients = 4), not tuples.
    assert len(result.released_diagnostics["batch_size"]) == 3


def test_patient_plan_needs_patient_keys(tmp_path):
    tc = TrainingConfig(batch_size=4, steps=1, noise_multiplier=0.8, clip_norm=1.0)
    plan = plan_training(tc, 16, unit="patient", max_contributions=2)
    with pytest.raises(ValueError, match="patient_keys"):
        train_mlm(repetitive_corpus(n=8), SPECIALS, 40, ModelConfig(preset="tiny", num_layers=1, max_seq_length=16), tc,
                  tmp_path / "s", plan=plan, progress=False, export_saved_model=False)
