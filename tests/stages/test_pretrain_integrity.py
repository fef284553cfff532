"""Issue 22 (integrity, round two) at the trainer stage, without TFX: the budget bounds every step
a chain ever executes (resumes included), the DP count is drawn behind the state lock, and a
shuffle resume charges the windows it replays. Each test fails on the main before the fix."""
import json
import os

import numpy as np
import pytest

from dpbert import schema
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.stages import pretrain as stage

from .conftest import tiny_model_config, tiny_training_config


def _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, pc=None, name="model", **kwargs):
    root = tmp_path / "root"
    model_dir = root / "MLMPretrainer" / "model" / name
    model_dir.mkdir(parents=True, exist_ok=True)
    return stage.pretrain(tuples_dir, vocabulary_dir, str(model_dir), model_config=tiny_model_config(),
                          training_config=tc, privacy_config=pc or PrivacyConfig(tuple_words=24),
                          membership_config=MembershipConfig(), pipeline_root=str(root),
                          export_saved_model=False, **kwargs)


def _epsilon(tc, steps, n):
    plan = stage.plan_for(tc, MembershipConfig(), n, "/nonexistent")[0]
    return stage.charged_ledger(None, None, tc.noise_multiplier, plan, n, steps, tc.delta)["epsilon_total_pld"]


@pytest.mark.slow  # make test-all; make test covers it: tests/model/test_engine_loop.py (budget)
def test_a_resume_never_executes_a_step_the_budget_does_not_cover(tmp_path, tuples_dir, vocabulary_dir, raw_tuples):
    """Budget = ε of 4 steps (the plan); a crash after 3 steps with no checkpoint; the resume would
    run 4 more (7 in the chain): it runs 1, is refused before the 5th, and records ε of 4."""
    from dpbert.model.train import CrashAfter, SimulatedCrash

    n = len(raw_tuples)
    tc = tiny_training_config(steps=4, checkpoint_every=50, dataset_size=n, dp_diagnostics=False)
    budget = _epsilon(tc, 4, n) * (1 + 1e-9)
    pc = PrivacyConfig(tuple_words=24, epsilon_budget=budget)
    with pytest.raises(SimulatedCrash):
        _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, pc, name="1", hooks=[CrashAfter(3)])
    # What `dpbert run` records on the crashed run: the ε its chain already spent (3 steps).
    (crashed,) = stage.chains(str(tmp_path / "root"))
    charged = stage.chain_charged(crashed["state"])
    assert charged["steps_charged"] == 3
    assert charged["epsilon_charged"] == pytest.approx(_epsilon(tc, 3, n), rel=1e-6)
    with pytest.raises(stage.TrainingBudgetRefused) as refused:
        _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, pc, name="2")
    (chain,) = stage.chains(str(tmp_path / "root"))
    assert chain["steps_executed"] == 4  # 3 + 1, never 5
    with open(os.path.join(chain["state"], schema.BUDGET_REFUSAL_FILE), encoding="utf-8") as f:
        refusal = json.load(f)
    assert refusal == refused.value.refusal
    assert refusal["steps_charged"] == 4 and refusal["step_limit"] == 4
    assert refusal["epsilon_charged"] <= budget
    assert refusal["epsilon_charged"] == pytest.approx(_epsilon(tc, 4, n), rel=1e-6)
    # The resume key the budget guard matches chains by is stored with the chain.
    assert chain["key"] == stage.resume_key(tiny_model_config(), tc, pc, 0.0, False)


def test_a_run_refused_by_the_state_lock_draws_no_dp_count(tmp_path, tuples_dir, vocabulary_dir):
    """Two runs into one state directory: the one refused by the lock must not draw (or overwrite)
    the DP count — it used to draw it before the lock, logging and charging a second count."""
    from dpbert import storage
    from dpbert.model.train import StateDirectoryBusy

    tc = tiny_training_config(steps=1)  # no dataset_size: the plan is over a DP count
    state = _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, name="1").state_dir
    count_file = os.path.join(state, stage.DP_COUNT_FILE)
    os.remove(count_file)  # as if the run holding the lock had not drawn yet
    with storage.LeaseLock(os.path.join(state, schema.STATE_LOCK_FILE), owner="another-run"):  # its live lease
        with pytest.raises(StateDirectoryBusy):
            _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, name="2")
    assert not os.path.exists(count_file)


def test_plan_for_creates_the_count_file_exclusively(tmp_path):
    tc = tiny_training_config(steps=1)
    state = str(tmp_path / "state")
    plan1, record1 = stage.plan_for(tc, MembershipConfig(), 40, state)
    plan2, record2 = stage.plan_for(tc, MembershipConfig(), 40, state)  # read back, not redrawn
    assert plan1.dataset_size == plan2.dataset_size and record1 == record2


def test_shuffle_resume_charges_the_windows_it_replays(tmp_path):
    """The issue's case: n = 20, B = 4, 7 steps, checkpoint at 5, crash after 6. Executed steps
    [0–5] then [5, 6] on resume: with windows indexed by the ledger, no row takes part more than
    E = ceil(8·4/20) = 2 times (it was 3 for 4 rows with the checkpoint's step)."""
    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.model import sampling
    from dpbert.model import train as train_lib
    from dpbert.privacy import events

    seen = []
    real_sample = sampling.ShuffleSampler.sample

    def spy(self, step):
        rows = real_sample(self, step)
        seen.append(rows)
        return rows

    n, B = 20, 4
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, 60, size=(n, 8))
    mc = ModelConfig(preset="custom", hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                     max_seq_length=8, dropout=0.0)
    tc = TrainingConfig(batch_size=B, steps=7, warmup_steps=0, clip_norm=1.0, noise_multiplier=1.0,
                        checkpoint_every=5, delta=1e-5, sampling="shuffle", dataset_size=n)
    specials = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    out = tmp_path / "state"
    try:
        sampling.ShuffleSampler.sample = spy
        with pytest.raises(train_lib.SimulatedCrash):
            train_lib.train_mlm(token_ids, specials, 64, mc, tc, out, progress=False, export_saved_model=False,
                                hooks=[train_lib.CrashAfter(6)])
        result = train_lib.train_mlm(token_ids, specials, 64, mc, tc, out, progress=False, export_saved_model=False)
    finally:
        sampling.ShuffleSampler.sample = real_sample
    assert result.steps_taken_total == 8 and len(seen) == 8
    counts = np.bincount(np.concatenate(seen), minlength=n)
    occurrences, straddling = events.shuffle_participations(8, B / n)
    assert occurrences == 2 and not straddling
    assert counts.max() <= occurrences
