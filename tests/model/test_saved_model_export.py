"""The exported SavedModel gives the Keras model's outputs (slow tier: ``-m slow``)."""
from pathlib import Path

import numpy as np
import pytest


@pytest.mark.slow
def test_saved_model_export_matches_keras_weights(tmp_path):
    import tensorflow as tf

    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.engine.train import load_models, train_mlm

    from .conftest import SPECIALS, repetitive_corpus

    result = train_mlm(repetitive_corpus(), SPECIALS, 40, ModelConfig(preset="tiny", num_layers=1, max_seq_length=16),
                       TrainingConfig(batch_size=8, steps=2), tmp_path, progress=True, export_saved_model=True)
    assert result.saved_model_dir and Path(result.saved_model_dir, "saved_model.pb").exists()
    ids = repetitive_corpus()[:2]
    saved = tf.saved_model.load(result.saved_model_dir)(tf.constant(ids), training=False)
    keras = load_models(tmp_path).encoder(ids)
    np.testing.assert_allclose(saved["sequence_output"].numpy(), keras["sequence_output"].numpy(), atol=1e-5)
    assert len(saved["attention_probs"]) == 1  # one per layer
