"""Longer checks (``-m slow``): SavedModel export, the noise-check CLI in its own process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_saved_model_export_matches_keras_weights(tmp_path):
    import tensorflow as tf

    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.model.train import load_models, train_mlm

    from .conftest import SPECIALS, repetitive_corpus

    result = train_mlm(repetitive_corpus(), SPECIALS, 40, ModelConfig(preset="tiny", max_seq_length=16),
                       TrainingConfig(batch_size=8, steps=2), tmp_path, progress=True, export_saved_model=True)
    assert result.saved_model_dir and Path(result.saved_model_dir, "saved_model.pb").exists()
    ids = repetitive_corpus()[:2]
    saved = tf.saved_model.load(result.saved_model_dir)(tf.constant(ids), training=False)
    keras = load_models(tmp_path).encoder(ids)
    np.testing.assert_allclose(saved["sequence_output"].numpy(), keras["sequence_output"].numpy(), atol=1e-5)
    assert len(saved["attention_probs"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["once", "paper"])
def test_noise_check_cli_two_replicas(mode):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "dpbert.model.noise_check", "--replicas", "2", "--accumulation",
                           "1", "4", "--steps", "40", "--noise-mode", mode, "--json"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for r in results:
        assert r["passed"] and r["replicas"] == 2
        target = r["expected_std"] if mode == "once" else r["paper_std"]
        assert abs(r["measured_std"] / target - 1) <= r["tolerance"]


@pytest.mark.slow
def test_run_noise_check_cli_two_replicas_runs_in_a_subprocess(capsys):
    import argparse

    from dpbert.model.noise_check import run_noise_check_cli

    args = argparse.Namespace(replicas=2, accumulation=4, noise_multiplier=1.0, clip=0.01, batch_size=16,
                              steps=20, json=False)
    assert run_noise_check_cli(args) == 0
    assert "P=2 T=4 (MirroredStrategy, once)" in capsys.readouterr().out
