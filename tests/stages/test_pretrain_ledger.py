"""The trainer stage charges the DATASET's ledger (``dpbert.ledger``): it reserves the run's whole
planned charge before the first step reads the data, finalizes it to the steps its write-ahead
step log counts however it stops, and a run the dataset's budget cannot cover trains nothing."""
import pytest

from dpbert import schema, storage
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.accounting.gate import BudgetRefused
from dpbert.accounting.target import LedgerTarget
from dpbert.ledger.dataset import read_ledger
from dpbert.model.engine.hooks import CrashAfter, SimulatedCrash
from dpbert.stages import pretrain as stage

from .conftest import tiny_model_config, tiny_training_config


def _target(tmp_path, budget):
    return LedgerTarget(dataset_id="ward-7", unit="tuple", delta=1e-5, epsilon_budget=budget,
                        location=str(tmp_path / "ledgers")).to_json()


def _train(tmp_path, name, tuples_dir, vocabulary_dir, raw_tuples, target, hooks=(), lr=None):
    overrides = dict(steps=3, dataset_size=len(raw_tuples), noise_multiplier=1.0)
    if lr is not None:
        overrides["learning_rate"] = lr
    tc = tiny_training_config(**overrides)
    root = tmp_path / name
    return stage.pretrain(tuples_dir, vocabulary_dir, str(root / "model"), model_config=tiny_model_config(),
                          training_config=tc, privacy_config=PrivacyConfig(tuple_words=24),
                          membership_config=MembershipConfig(), pipeline_root=str(root),
                          export_saved_model=False, hooks=list(hooks), ledger_target=target)


def _entries(tmp_path):
    return list(read_ledger(LedgerTarget.from_json(_target(tmp_path, None)).uri())["entries"].values())


def test_trainer_reserves_then_finalizes_to_the_executed_steps(tmp_path, tuples_dir, vocabulary_dir, raw_tuples):
    target = _target(tmp_path, None)
    with pytest.raises(SimulatedCrash):
        _train(tmp_path, "a", tuples_dir, vocabulary_dir, raw_tuples, target, hooks=[CrashAfter(2)])
    (entry,) = _entries(tmp_path)
    assert entry["mechanism"] == "dp_sgd" and entry["status"] == "finalized"
    assert [r["steps"] for r in entry["executed"] if r["mechanism"] == "dp_sgd"] == [2]  # the crash's 2 steps
    result = _train(tmp_path, "a", tuples_dir, vocabulary_dir, raw_tuples, target)  # the resume: same chain
    (entry,) = _entries(tmp_path)  # replaced, not a second full charge
    executed = [r["steps"] for r in entry["executed"] if r["mechanism"] == "dp_sgd"]
    assert executed == [result.properties[schema.STEPS_TAKEN_TOTAL]] and executed[0] >= 3


def test_a_second_folder_or_learning_rate_spends_the_same_dataset_budget(tmp_path, tuples_dir, vocabulary_dir,
                                                                         raw_tuples):
    first = _train(tmp_path, "a", tuples_dir, vocabulary_dir, raw_tuples, _target(tmp_path, None))
    budget = first.epsilon * 1.5  # room for the first run, not for two
    with pytest.raises(BudgetRefused):  # another output folder and another learning rate: same patients
        _train(tmp_path, "b", tuples_dir, vocabulary_dir, raw_tuples, _target(tmp_path, budget), lr=3e-3)
    assert len(_entries(tmp_path)) == 1
    # Nothing ran: no step log in the refused run's state directory.
    state_root = storage.join(str(tmp_path / "b"), "_trainer_state")
    assert not storage.storage_for(state_root).glob(storage.join(state_root, "*", schema.STEP_LOG_FILE))
