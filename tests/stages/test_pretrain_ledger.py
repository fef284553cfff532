"""The trainer stage charges the DATASET's ledger (``dpbert.ledger``): it reserves the run's whole
planned charge before the first step reads the data, finalizes it to the steps its write-ahead
step log counts however it stops, and a run the dataset's budget cannot cover trains nothing."""
import pytest

from dpbert import schema, storage
from dpbert.accounting.gate import BudgetRefused

from .conftest import ledger_entries, ledger_target, run_stage


def _target(tmp_path, budget):
    return ledger_target(tmp_path / "ledgers", budget)


def _entries(tmp_path):
    return ledger_entries(tmp_path / "ledgers")


@pytest.mark.xdist_group("patient_chain")
def test_trainer_reserves_then_finalizes_to_the_executed_steps(patient_chain):
    # The shared chain (conftest.patient_chain): a crash after 2 of 3 planned steps, then the resume.
    (entry,) = patient_chain.crashed
    assert entry["mechanism"] == "dp_sgd" and entry["status"] == "finalized"
    assert [r["steps"] for r in entry["executed"] if r["mechanism"] == "dp_sgd"] == [2]  # the crash's 2 steps
    result = patient_chain.result  # the resume: same chain
    assert result.properties["resumed_from_step"] == 2
    (entry,) = patient_chain.entries  # replaced, not a second full charge
    executed = [r["steps"] for r in entry["executed"] if r["mechanism"] == "dp_sgd"]
    assert executed == [result.properties[schema.STEPS_TAKEN_TOTAL]] and executed[0] >= 3


@pytest.mark.xdist_group("public_n_run")
def test_a_second_folder_or_learning_rate_spends_the_same_dataset_budget(tmp_path, tuples_dir, vocabulary_dir,
                                                                         public_n_run):
    import dataclasses
    import shutil

    from dpbert.accounting.accountant import dpsgd_epsilon
    from dpbert.accounting.gate import alone_of_records

    # The first run: the shared one (conftest.public_n_run); its ledger copied, as this test adds to it.
    first = public_n_run.result
    shutil.copytree(public_n_run.ledgers, tmp_path / "ledgers")
    assert len(_entries(tmp_path)) == 1
    # Room for the first run, not for two: just below the PLD ε of two such runs (the gate's Rényi
    # figure for them is larger still), and the gate admits the first run alone.
    record, delta = first.dp_event, first.properties["delta"]
    budget = 0.99 * dpsgd_epsilon(record["noise_multiplier"], record["sampling_probability"], 2 * record["steps"],
                                  delta, "poisson")
    assert alone_of_records(None, [record], budget, delta).admitted
    tc = dataclasses.replace(public_n_run.training_config, learning_rate=3e-3)
    with pytest.raises(BudgetRefused):  # another output folder and another learning rate: same patients
        run_stage(tmp_path / "b", tuples_dir, vocabulary_dir, tc, ledger_target=_target(tmp_path, budget))
    assert len(_entries(tmp_path)) == 1
    # Nothing ran: no step log in the refused run's state directory.
    state_root = storage.join(str(tmp_path / "b"), "_trainer_state")
    assert not storage.storage_for(state_root).glob(storage.join(state_root, "*", schema.STEP_LOG_FILE))
