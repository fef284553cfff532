"""The integrity of the trainer stage's charge, without TFX: the budget bounds every step a chain
ever executes (resumes included), the DP count is drawn behind the state lock, and a shuffle
resume charges the windows it replays."""
import json
import os

import numpy as np
import pytest

from dpbert import schema
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.stages import pretrain as stage

from .conftest import SHUFFLED_CRASH_AFTER, tiny_model_config, tiny_training_config


def _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, pc=None, name="model", **options):
    root = tmp_path / "root"
    model_dir = root / "MLMPretrainer" / "model" / name
    model_dir.mkdir(parents=True, exist_ok=True)
    return stage.pretrain(stage.PretrainInputs(tuples_dir, vocabulary_dir), str(model_dir),
                          model_config=tiny_model_config(), training_config=tc,
                          privacy_config=pc or PrivacyConfig(tuple_words=24), membership_config=MembershipConfig(),
                          pipeline_root=str(root), options=stage.PretrainOptions(export_saved_model=False, **options))


def _epsilon(tc, steps, n):
    plan = stage.plan_for(tc, MembershipConfig(), n, "/nonexistent")[0]
    return stage.charged_ledger(None, None, tc.noise_multiplier, plan, n, steps, tc.delta)["epsilon_total_pld"]


@pytest.mark.slow  # make test-all; make test covers it: tests/model/test_engine_loop.py (budget)
def test_a_resume_never_executes_a_step_the_budget_does_not_cover(tmp_path, tuples_dir, vocabulary_dir, raw_tuples):
    """Budget = ε of 4 steps (the plan); a crash after 3 steps with no checkpoint; the resume would
    run 4 more (7 in the chain): it runs 1, is refused before the 5th, and records ε of 4."""
    from dpbert.engine.train import CrashAfter, SimulatedCrash

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


@pytest.mark.xdist_group("dp_count_run")
def test_a_run_refused_by_the_state_lock_draws_no_dp_count(tmp_path, tuples_dir, vocabulary_dir, dp_count_run):
    """Two runs into one state directory: the one refused by the lock must not draw (or overwrite)
    the DP count (drawing it before the lock would log and charge a second count). The first run
    is the shared one over a DP count (conftest.dp_count_run), in a copy of its pipeline root."""
    import shutil

    from dpbert import storage
    from dpbert.engine.train import StateDirectoryBusy

    tc = dp_count_run.training_config  # no dataset_size: the plan is over a DP count
    shutil.copytree(dp_count_run.root, tmp_path / "root")
    state = os.path.join(str(tmp_path / "root"), stage.STATE_ROOT, os.path.basename(dp_count_run.result.state_dir))
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


@pytest.mark.xdist_group("shuffled_chain")
def test_shuffle_resume_charges_the_windows_it_replays(shuffled_chain):
    """The shared shuffled chain (conftest.shuffled_chain): n rows, B = 4, 3 planned steps, a crash
    after 2 without a checkpoint, the resume from step 0. Executed windows [0, 1] then [2, 3, 4]:
    with windows indexed by the step log, no row takes part more than E = ceil(5·4/n) = 1 time.
    Windows indexed by the optimizer's step (the checkpoint's, 0) would replay windows 0 and 1:
    their 8 rows would take part twice."""
    from dpbert.privacy import events

    n, B = shuffled_chain.n, shuffled_chain.training_config.batch_size
    result, seen = shuffled_chain.result, shuffled_chain.sampled
    executed = SHUFFLED_CRASH_AFTER + result.train.steps_this_run
    assert result.train.resumed_from_step == 0 and result.train.steps_taken_total == executed == 5
    assert len(seen) == executed and all(len(rows) == B for rows in seen)
    counts = np.bincount(np.concatenate(seen), minlength=n)
    occurrences, _ = events.shuffle_participations(executed, B / n)
    assert occurrences == 1 and executed * B < n  # the windows lie in one permutation: none straddles
    assert counts.max() <= occurrences
