"""The trainer stage's loop seen through a hook: the white-box audit, the noise check and the
benchmarks attach probes to THIS loop (``dpbert.engine``), so a hook passed to the stage
must see every step the stage runs, the units each step sampled, and each step's write-ahead
step-log entry already on storage when the step ran."""
import pytest

from dpbert import schema, storage


@pytest.mark.xdist_group("public_n_run")
def test_a_hook_observes_the_stage_steps_and_their_write_ahead_entries(public_n_run):
    # The shared run (conftest.PUBLIC_N_RUN: 11 steps) was given conftest.step_probe() as a hook.
    probe, result = public_n_run.probe, public_n_run.result
    planned = result.plan.steps
    assert planned == 11 and probe.started == (0, planned, True) and probe.ended
    assert [s[0] for s in probe.steps] == list(range(1, planned + 1))
    # Step s was charged (written ahead) before it ran: the log counts s when the hook sees it.
    assert [s[1] for s in probe.steps] == list(range(1, planned + 1))
    # The units the sampler drew are the units the step processed (tuples: one row each).
    assert all(sampled == units for _, _, sampled, units in probe.steps)
    assert storage.read_json(storage.join(result.state_dir, schema.STEP_LOG_FILE))["steps_executed"] == planned
    assert result.properties[schema.STEPS_TAKEN_TOTAL] == planned
