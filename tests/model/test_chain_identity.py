"""A chain's identity does not depend on the number of worker processes: a re-run with another
``training.workers`` resumes the chain (its step log charges every executed step)."""
import dataclasses

from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig
from dpbert.engine.charges import chain_training_config, resume_key, stage_state_dir
from dpbert.engine.workers import process_config


def test_chain_identity_is_the_same_for_any_number_of_workers():
    mc, pc, membership = ModelConfig(), PrivacyConfig(), MembershipConfig()
    one = TrainingConfig()
    keys, dirs = set(), set()
    for workers in (1, 2, 4):
        configured = dataclasses.replace(one, workers=workers)
        for tc in (configured, process_config(configured)):  # as the guard sees it, as each process trains
            keys.add(resume_key(mc, tc, pc, 0.0, False))
            dirs.add(stage_state_dir("/root", "/t", "/v", mc, tc, pc, membership, None))
    assert len(keys) == 1 and len(dirs) == 1
    # What changes the mechanism still makes another chain (positive control).
    assert resume_key(mc, dataclasses.replace(one, noise_multiplier=one.noise_multiplier * 2), pc, 0.0, False) \
        not in keys
    assert chain_training_config(process_config(dataclasses.replace(one, workers=2))) == chain_training_config(one)


def test_writing_a_saved_model_too_is_no_part_of_the_chain():
    from dpbert.config import TrainingConfig

    one = TrainingConfig()
    assert one.export_saved_model is False  # off unless asked for: nothing in the DAG reads it
    assert chain_training_config(dataclasses.replace(one, export_saved_model=True)) == chain_training_config(one)
