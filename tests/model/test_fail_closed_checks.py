"""Checks that refuse a run before (or instead of) a step, each on the shipped ``train_mlm`` with
its positive control (``broken_mechanisms``): a patient grouping that splits a patient, and a
resume whose step log lost an update (counts fewer steps than its checkpoint recorded)."""
import re
import uuid

import numpy as np
import pytest

from dpbert import schema, storage
from dpbert.config import TrainingConfig
from dpbert.mechanism import sampling
from dpbert.engine import chain as chain_lib
from dpbert.engine.train import CrashAfter, SimulatedCrash, train_mlm
from dpbert.privacy.plan import plan_training

from . import broken_mechanisms as broken
from .conftest import SPECIALS, repetitive_corpus, tiny_model

#: The smallest model: the refusals are tested, not the step (whose few steps run eagerly).
MODEL = tiny_model()


# ------------------------------------------------------------------------------ patient groups
def _keys():
    return [f"patient-{i % 16:03d}" for i in range(48)]  # 16 patients of 3 rows each


def test_patient_groups_are_checked_against_the_rows_keys():
    keys = _keys()
    honest = sampling.group_rows(keys)
    sampling.check_patient_groups(honest, keys)  # passes
    with broken.split_patient(), pytest.raises(sampling.PatientGroupingError, match="a patient key is in 2 groups") \
            as failure:
        sampling.group_rows(keys)  # positive control: one patient's rows in two groups
    message = str(failure.value)
    assert "patient-" not in message and not re.search(r"\b(3|16|48)\b", message)  # no key, no count
    two_keys = sampling.PatientGroups([np.array([0, 1])] + honest.members[1:], honest.ids)  # rows 0 and 1: 2 keys
    with pytest.raises(sampling.PatientGroupingError, match="rows of 2 or more patient keys"):
        sampling.check_patient_groups(two_keys, keys)
    twice = sampling.PatientGroups(honest.members + [honest.members[0][:1]], np.append(honest.ids, np.uint64(5)))
    with pytest.raises(sampling.PatientGroupingError, match="a patient key is in 2 groups"):
        sampling.check_patient_groups(twice, keys)


def test_train_mlm_refuses_a_grouping_that_splits_a_patient(tmp_path, eager_steps):
    tc = TrainingConfig(batch_size=4, steps=2, noise_multiplier=0.8, clip_norm=1.0, warmup_steps=1)
    plan = plan_training(tc, 16, unit="patient", max_contributions=2)
    with broken.split_patient(), pytest.raises(sampling.PatientGroupingError, match="a patient key is in 2 groups"):
        train_mlm(repetitive_corpus(n=48), SPECIALS, 40, MODEL, tc, tmp_path / "state", plan=plan, progress=False,
                  export_saved_model=False, patient_keys=_keys())
    assert not (tmp_path / "state" / schema.STEP_LOG_FILE).exists()  # refused before any step


# ------------------------------------------------------------------------------ the step log at resume
def _run(out, steps, checkpoint_every, crash_after=None):
    tc = TrainingConfig(batch_size=8, steps=steps, warmup_steps=1, clip_norm=1.0, noise_multiplier=0.5,
                        checkpoint_every=checkpoint_every, noise_seed=3, integrity_check_every=0)
    return train_mlm(repetitive_corpus(n=32), SPECIALS, 40, MODEL, tc, out, progress=False, export_saved_model=False,
                     hooks=[CrashAfter(crash_after)] if crash_after is not None else [])


def test_train_mlm_refuses_to_resume_from_a_step_log_one_short(tmp_path, eager_steps):
    """Positive control: the step log loses the write-ahead update of step 3, the checkpoint at 3
    is saved, the run crashes: the resume is refused (before, the log was silently raised to the
    checkpoint's step and the chain charged one step short). An honest crash and resume passes:
    ``test_engine_loop.test_train_mlm_crash_and_resume_in_a_chain_on_storage``."""
    out = f"ram://fail-closed/{uuid.uuid4().hex}"
    with broken.use_step_log(broken.LostUpdateStepLog), pytest.raises(SimulatedCrash):
        _run(out, steps=5, checkpoint_every=3, crash_after=3)
    assert chain_lib.read_step_log(out)["steps_executed"] == 2  # one short of the 3 steps that ran
    assert chain_lib.chain_state(out)["steps_executed"] == 3  # what the chain is charged: never less
    with pytest.raises(chain_lib.StepLogBehind, match="refusing to resume"):
        _run(out, steps=5, checkpoint_every=3)
    assert chain_lib.read_step_log(out)["steps_executed"] == 2  # nothing ran


@pytest.mark.slow  # three training runs
def test_train_mlm_refuses_a_step_log_behind_the_count_recorded_with_its_checkpoint(tmp_path):
    """A chain with a lost step (crash after 3, checkpoint at 2: 3 executed) resumes; the resumed
    run loses the update of its second step (step 4, the 5th executed) and is checkpointed at 4
    with 5 executed: the step log (4) is not below the checkpoint's step (4), only below the count
    recorded with it (5), and the third run is refused."""
    out = storage.join(str(tmp_path), "state")
    with pytest.raises(SimulatedCrash):
        _run(out, steps=8, checkpoint_every=2, crash_after=3)
    lose_second = type("LoseSecond", (broken.LostUpdateStepLog,), {"lose": 2})
    with broken.use_step_log(lose_second), pytest.raises(SimulatedCrash):
        _run(out, steps=8, checkpoint_every=2, crash_after=2)
    assert (chain_lib.read_step_log(out)["steps_executed"], chain_lib.checkpoint_executed(out)) == (4, 5)
    with pytest.raises(chain_lib.StepLogBehind, match="fewer than the 5"):
        _run(out, steps=8, checkpoint_every=2)
