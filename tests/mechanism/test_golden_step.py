"""Golden run of the DP-SGD step: a fixed-seed tiny ``train_mlm`` (5 steps of 2 rounds, the
trainer's own ``build_training`` loop) gives bit-identical noise draws, weights, ε, step log and
per-step statistics to the values in ``golden_step.json``. A refactoring of the step, its
mechanism or ``build_training`` must leave them unchanged; only a deliberate change of behaviour
regenerates the file (``DPBERT_WRITE_GOLDEN=1``, then review the diff).

Positive control (slow tier: a second run): the same Gaussian noise drawn piece by piece (one
stream per trained piece instead of one draw split into the pieces: the same distribution, which
no statistical check can tell apart) changes the recorded draws and weights."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dpbert.config import ModelConfig, TrainingConfig
from dpbert.engine.hooks import Hook
from dpbert.engine.train import train_mlm
from tests.model.conftest import SPECIALS, repetitive_corpus

GOLDEN = Path(__file__).with_name("golden_step.json")
STEPS = 5
VOCAB = 40
MODEL = ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                    max_seq_length=16, dropout=0.0)


def _sha(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


def noise_draw(stepper, dp_step: int) -> list:
    """The mechanism's own draw z for DP step ``dp_step`` (stateless: keyed by the seed and the step)."""
    saved = int(stepper.dp_step.numpy())
    stepper.dp_step.assign(dp_step)
    try:
        return [z.numpy() for z in stepper.mechanism.draw_noise()]
    finally:
        stepper.dp_step.assign(saved)


class Recorder(Hook):
    """Every step's exact statistics and the noise probe's two kept vectors (S and (S + z)/B)."""

    def __init__(self):
        self.steps, self.stepper = [], None

    def on_step(self, loop, step, rounds, stats, sampled):
        self.stepper = loop.stepper
        self.steps.append({"step": int(step), "rounds": len(rounds), "stats": {k: float(v) for k, v in stats.items()},
                           "probe": _sha([loop.stepper.noise_probe_clean.numpy(),
                                          loop.stepper.noise_probe_update.numpy()])})


def golden_run(tmp_path) -> dict:
    from dpbert import storage
    from dpbert.accounting.accountant import dpsgd_epsilon

    tc = TrainingConfig(batch_size=8, steps=STEPS, accumulation_steps=2, learning_rate=3e-3, warmup_steps=1,
                        clip_norm=1.0, noise_multiplier=0.7, checkpoint_every=3, noise_seed=7,
                        integrity_check_every=0, dataset_size=64)
    recorder = Recorder()
    result = train_mlm(repetitive_corpus(), SPECIALS, VOCAB, MODEL, tc, str(tmp_path / "chain"), progress=False,
                       export_saved_model=False, hooks=[recorder])
    step_log = storage.read_json(result.ledger_path)
    step_log.pop("writer", None)  # the writer's token is random by design
    epsilon = dpsgd_epsilon(result.effective_noise_multiplier, result.sampling_rate, result.steps_taken_total,
                            result.delta)
    return {
        "noise": [_sha(noise_draw(recorder.stepper, t)) for t in range(STEPS)],
        "weights": result.parameter_digest,
        "epsilon": repr(float(epsilon)),
        "sigma": [repr(result.gradient_noise_multiplier), repr(result.effective_noise_multiplier)],
        "step_log": step_log,
        "steps": recorder.steps,
        "released": json.loads(json.dumps(result.released_diagnostics)),
        "checks": sorted(k for k, v in result.integrity_checks.items() if isinstance(v, dict) and v.get("passed")),
    }


def differences(got: dict, want: dict) -> list:
    return [key for key in sorted(set(got) | set(want)) if got.get(key) != want.get(key)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return golden_run(tmp_path_factory.mktemp("golden"))


def test_the_step_is_bit_identical_to_the_golden_run(run):
    if os.environ.get("DPBERT_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert differences(run, want) == [], {k: (run.get(k), want.get(k)) for k in differences(run, want)}
    assert len(set(run["noise"])) == STEPS  # a fresh draw every step


@pytest.mark.slow
def test_control_a_reordered_noise_stream_is_caught(run, tmp_path):
    from tests.model import broken_mechanisms as broken

    per_piece = broken.SwitchableNoise(256)  # honest scale; one stream per piece (more slots than pieces)
    with per_piece.install():
        changed = golden_run(tmp_path)
    assert {"noise", "weights", "steps"} <= set(differences(changed, run))
    assert changed["step_log"] == run["step_log"] and changed["epsilon"] == run["epsilon"]
