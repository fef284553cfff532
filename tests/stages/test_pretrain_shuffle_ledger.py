"""A shuffle-sampled run charges the dataset's ledger too: its reservation is finalized to the
records of the steps it executed (a shuffled record's epochs depend on the trained n, which the
ledger does not hold, so the stage gives them; re-planning a Poisson record from a step count
does not apply), whether it completes or crashes."""
import pytest

from dpbert.accounting.target import LedgerTarget
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.ledger.dataset import read_ledger
from dpbert.model.engine.hooks import CrashAfter, SimulatedCrash
from dpbert.stages import pretrain as stage

from .conftest import tiny_model_config, tiny_training_config


def _target(tmp_path):
    return LedgerTarget(dataset_id="ward-7", unit="tuple", delta=1e-5, epsilon_budget=None,
                        location=str(tmp_path / "ledgers")).to_json()


def _train(tmp_path, tuples_dir, vocabulary_dir, raw_tuples, hooks=()):
    tc = tiny_training_config(steps=3, dataset_size=len(raw_tuples), sampling="shuffle")
    return stage.pretrain(tuples_dir, vocabulary_dir, str(tmp_path / "root" / "model"), model_config=tiny_model_config(),
                          training_config=tc, privacy_config=PrivacyConfig(tuple_words=24),
                          membership_config=MembershipConfig(), pipeline_root=str(tmp_path / "root"),
                          export_saved_model=False, hooks=list(hooks), ledger_target=_target(tmp_path))


def _training_records(tmp_path):
    (entry,) = read_ledger(LedgerTarget.from_json(_target(tmp_path)).uri())["entries"].values()
    assert entry["status"] == "finalized"
    return [r for r in entry["executed"] if r["mechanism"] == "dp_sgd"]


def test_a_shuffled_run_is_finalized_to_its_executed_steps(tmp_path, tuples_dir, vocabulary_dir, raw_tuples):
    with pytest.raises(SimulatedCrash):
        _train(tmp_path, tuples_dir, vocabulary_dir, raw_tuples, hooks=[CrashAfter(2)])
    (crashed,) = _training_records(tmp_path)
    assert crashed["sampling"] == "shuffle" and crashed["steps"] == 2
    result = _train(tmp_path, tuples_dir, vocabulary_dir, raw_tuples)  # the resume, to completion
    (done,) = _training_records(tmp_path)
    # the stage's own record of the run (the model's DP event) is what the ledger holds
    assert done["steps"] == result.dp_event["steps"] >= 3
    assert done["event"] == result.dp_event["event"] and done["sampling"] == "shuffle"
