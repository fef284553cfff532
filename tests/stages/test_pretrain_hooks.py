"""The trainer stage's loop seen through a hook: the white-box audit, the noise check and the
benchmarks attach probes to THIS loop (``dpbert.model.engine``), so a hook passed to the stage
must see every step the stage runs, the units each step sampled, and each step's write-ahead
step-log entry already on storage when the step ran."""
import numpy as np

from dpbert import schema, storage
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.model.engine.hooks import Hook
from dpbert.stages import pretrain as stage

from .conftest import tiny_model_config, tiny_training_config


class _Probe(Hook):
    def __init__(self):
        self.started, self.ended, self.steps = None, False, []

    def on_start(self, loop):
        self.started = (loop.start_step, loop.steps_planned, loop.source.units > 0)

    def on_step(self, loop, step, rounds, stats, sampled):
        logged = loop.step_log.read()["steps_executed"]
        self.steps.append((step, logged, np.asarray(sampled).size, int(stats["units"])))

    def on_end(self, loop):
        self.ended = True


def test_a_hook_observes_the_stage_steps_and_their_write_ahead_entries(tmp_path, tuples_dir, vocabulary_dir,
                                                                       raw_tuples):
    probe = _Probe()
    tc = tiny_training_config(steps=3, dataset_size=len(raw_tuples))
    root = tmp_path / "root"
    result = stage.pretrain(tuples_dir, vocabulary_dir, str(root / "model"), model_config=tiny_model_config(),
                            training_config=tc, privacy_config=PrivacyConfig(tuple_words=24),
                            membership_config=MembershipConfig(), pipeline_root=str(root),
                            export_saved_model=False, hooks=[probe])
    assert probe.started == (0, 3, True) and probe.ended
    assert [s[0] for s in probe.steps] == [1, 2, 3]
    # Step s was charged (written ahead) before it ran: the log counts s when the hook sees it.
    assert [s[1] for s in probe.steps] == [1, 2, 3]
    # The units the sampler drew are the units the step processed (tuples: one row each).
    assert all(sampled == units for _, _, sampled, units in probe.steps)
    assert storage.read_json(storage.join(result.state_dir, schema.STEP_LOG_FILE))["steps_executed"] == 3
    assert result.properties[schema.STEPS_TAKEN_TOTAL] == 3
