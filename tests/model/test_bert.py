import numpy as np
import pytest
import tensorflow as tf

from dpbert.config import ModelConfig
from dpbert.mechanism import clipping
from dpbert.network import bert as bert_lib
from dpbert.engine.build import GHOST


@pytest.mark.parametrize("preset,sizes", [
    ("tiny", (64, 2, 2, 128)), ("mini", (256, 4, 4, 1024)), ("small", (512, 4, 8, 2048)),
    ("base", (768, 12, 12, 3072)), ("large", (1024, 24, 16, 4096))])
def test_presets(preset, sizes):
    spec = bert_lib.spec_from_config(ModelConfig(preset=preset), vocab_size=30522)
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.intermediate_size) == sizes
    assert spec.max_predictions == 20  # ceil(0.15 · 128)


def test_overrides_and_custom():
    spec = bert_lib.spec_from_config(ModelConfig(preset="tiny", num_layers=3, max_seq_length=32), 100)
    assert (spec.hidden_size, spec.num_layers, spec.max_seq_length) == (64, 3, 32)
    with pytest.raises(ValueError, match="custom"):
        bert_lib.spec_from_config(ModelConfig(preset="custom", hidden_size=32), 100)
    spec = bert_lib.spec_from_config(ModelConfig(preset="custom", hidden_size=32, num_layers=1, num_heads=4,
                                                 intermediate_size=64), 100)
    assert spec.head_size == 8
    with pytest.raises(ValueError, match="divisible"):
        bert_lib.BertSpec(vocab_size=10, hidden_size=30, num_heads=4)


def test_encoder_outputs_shared_layers_untied_head(tiny_spec):
    models = bert_lib.build_bert(tiny_spec, seed=0)
    assert models.mlm.count_params() == bert_lib.count_parameters(tiny_spec)
    ids = np.array([[2, 7, 8, 9, 3, 0, 0, 0, 0, 0, 0, 0]] * 2, np.int32)
    out = models.encoder(ids)
    assert out["sequence_output"].shape == (2, 12, 16)
    assert len(out["hidden_states"]) == tiny_spec.num_layers + 1
    assert len(out["attention_probs"]) == tiny_spec.num_layers
    probs = out["attention_probs"][0].numpy()
    assert probs.shape == (2, 2, 12, 12)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert np.all(probs[..., 5:] < 1e-6)  # padding keys get no attention
    logits = models.mlm({"input_ids": ids, "masked_positions": np.array([[1, 2, 3, 0]] * 2, np.int32)})
    assert logits.shape == (2, 4, tiny_spec.vocab_size)
    # Shared layers: the encoder's variables are a subset of the MLM model's.
    mlm_vars = {v.ref() for v in models.mlm.trainable_variables}
    assert all(v.ref() in mlm_vars for v in models.encoder.trainable_variables)
    # Untied: the output projection is its own [H, V] kernel, not the [V, H] input table.
    word = models.mlm.get_layer("word_embeddings").embeddings
    out_kernel = models.mlm.get_layer("mlm_output").kernel
    assert out_kernel.shape == (16, tiny_spec.vocab_size) and out_kernel is not word
    clipping.check_model_supported(models.mlm, GHOST.is_registered)  # every trainable layer has a fast clipping function


def test_save_load_roundtrip(tiny_spec, tmp_path):
    models = bert_lib.build_bert(tiny_spec, seed=3)
    paths = bert_lib.save_bert(models, tmp_path / "model")
    assert (tmp_path / "model" / "model_config.json").exists() and paths["weights"]
    loaded = bert_lib.load_bert(tmp_path / "model")
    assert loaded.spec == tiny_spec
    ids = np.array([[2, 7, 8, 9, 3, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    np.testing.assert_allclose(loaded.encoder(ids)["sequence_output"], models.encoder(ids)["sequence_output"],
                               atol=1e-6)


def test_unsupported_models_are_refused():
    import tf_keras

    class Custom(tf_keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight("w", shape=(shape[-1], 2))

        def call(self, x):
            return tf.matmul(x, self.w)

    x = tf_keras.Input((3,))
    with pytest.raises(NotImplementedError, match="no fast"):
        clipping.check_model_supported(tf_keras.Model(x, Custom()(x)), GHOST.is_registered)
    shared = tf_keras.layers.Dense(3)
    with pytest.raises(NotImplementedError, match="more than once"):
        clipping.check_model_supported(tf_keras.Model(x, shared(shared(x))), GHOST.is_registered)
