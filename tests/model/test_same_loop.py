"""Same loop, observed: the DAG's trainer stage, the white-box audit, the step benchmark and the
noise check each run the SAME ``dpbert.engine.loop.TrainLoop`` class, built by
``build_training``. An observer hook (a ``Hook``) sees every step and the write-ahead step-log
entry as stored (``loop.step_log.read()``): entry k is on storage before step k's hook runs.

How the observer gets in: the trainer stage and the audit take ``hooks=`` (passed to
``build_training``); the benchmark's ``run_loop`` takes ``hooks=``; the noise check has no
keyword, so its sub-test adds the observer to every ``TrainLoop`` built meanwhile (monkeypatched
``TrainLoop.__init__``).

Each run is the smallest that shows it: two steps (entries 1 and 2 stored before their hooks) of
the one-layer H 16 model, eagerly (``eager_steps``: the loop is what is observed, not the traced
step), without the brute-force clipping check or the audit's power simulation.
"""
import importlib.util
import os

import numpy as np

from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.engine import loop as loop_lib
from dpbert.engine.hooks import Hook
from tests.stages.conftest import (raw_tuples, tiny_model_config, tiny_training_config,  # noqa: F401
                                   tuples_dir, vocabulary_dir)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Observer(Hook):
    """Records (loop class, step, step-log count as stored) at every step."""

    def __init__(self):
        self.seen = []

    def on_step(self, loop, step, rounds, stats, sampled):
        self.seen.append((type(loop), int(step), int(loop.step_log.read()["steps_executed"]), len(rounds)))


def assert_same_loop(observer: Observer, steps: int):
    assert len(observer.seen) == steps, observer.seen
    for k, (cls, step, logged, rounds) in enumerate(observer.seen, start=1):
        assert cls is loop_lib.TrainLoop
        # the write-ahead entry of step k is stored before the step's hooks run
        assert step == k and logged == k and rounds >= 1


def test_a_the_trainer_stage_runs_the_loop(tmp_path, tuples_dir, vocabulary_dir, eager_steps):  # noqa: F811
    from dpbert.stages import pretrain as stage

    observer = Observer()
    root = tmp_path / "root"
    stage.pretrain(stage.PretrainInputs(tuples_dir, vocabulary_dir), str(root / "MLMPretrainer" / "model" / "1"),
                   model_config=tiny_model_config(),
                   training_config=tiny_training_config(steps=2, integrity_check_every=0),
                   privacy_config=PrivacyConfig(tuple_words=24), membership_config=MembershipConfig(),
                   pipeline_root=str(root), options=stage.PretrainOptions(export_saved_model=False, hooks=[observer]))
    assert_same_loop(observer, 2)


def test_b_the_white_box_audit_runs_the_loop(eager_steps):
    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.evaluate import whitebox as wb

    ids, vocab = wb.demo_token_rows()
    observer = Observer()
    mc = ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     max_seq_length=16, dropout=0.0)
    tc = TrainingConfig(batch_size=8, steps=2, dataset_size=80, warmup_steps=0, clip_norm=1.0, noise_multiplier=1.0,
                        delta=1e-5, dp_diagnostics=False, integrity_check_every=0)
    res = wb.whitebox_audit(ids[:80], list(wb.SPECIAL_IDS), vocab, mc, tc, mask_token_id=wb.MASK_ID,
                            settings=wb.AuditSettings(canaries=16, seed=2, public=True, report_power=False),
                            hooks=[observer])
    assert res["steps_executed"] == 2
    assert_same_loop(observer, 2)


def test_c_the_step_benchmark_runs_the_loop(eager_steps):
    from dpbert.config import ModelConfig

    spec = importlib.util.spec_from_file_location("dpsgd_step_bench", os.path.join(REPO, "benchmarks", "dpsgd_step.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    observer = Observer()
    mc = ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     max_seq_length=16, dropout=0.0)
    timing, training = bench.run_loop(mc, 64, batch=8, accumulation=2, steps=2, mode="dp", hooks=[observer])
    assert_same_loop(observer, 2)
    assert len(timing.seconds) == 2 and all(t > 0 for t in timing.seconds) and timing.units == [8, 8]
    assert training.stepper.clipping_path == "ghost"


def test_d_the_noise_check_runs_the_loop(monkeypatch, eager_steps):
    from dpbert.diagnostics.noise_check import noise_check

    observer = Observer()
    real_init = loop_lib.TrainLoop.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.hooks.append(observer)

    monkeypatch.setattr(loop_lib.TrainLoop, "__init__", init)
    result = noise_check(replicas=1, accumulation=1, noise_multiplier=1.0, clip=0.01, batch_size=8, steps=2, seed=0)
    assert result["steps"] == 2
    assert_same_loop(observer, 2)
    assert np.isfinite(result["measured_std"]) and result["checks"]["every_step_measured"]
    assert result["loop"] == "dpbert.engine.loop.TrainLoop (build_training)"
