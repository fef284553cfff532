"""A shuffle-sampled run charges the dataset's ledger too: its reservation is finalized to the
records of the steps it executed (a shuffled record's epochs depend on the trained n, which the
ledger does not hold, so the stage gives them; re-planning a Poisson record from a step count
does not apply), whether it completes or crashes."""
import pytest

from .conftest import SHUFFLED_CRASH_AFTER


@pytest.mark.xdist_group("shuffled_chain")
def test_a_shuffled_run_is_finalized_to_its_executed_steps(shuffled_chain):
    # The shared chain (conftest.shuffled_chain): a crash after 2 of 3 planned steps, then the resume.
    status, (crashed,) = shuffled_chain.crashed
    assert status == "finalized" and crashed["sampling"] == "shuffle" and crashed["steps"] == SHUFFLED_CRASH_AFTER
    result = shuffled_chain.result  # the resume, to completion
    status, (done,) = shuffled_chain.finalized
    # the stage's own record of the run (the model's DP event) is what the ledger holds
    assert status == "finalized" and done["steps"] == result.dp_event["steps"] >= 3
    assert done["event"] == result.dp_event["event"] and done["sampling"] == "shuffle"
