"""BERT encoder and masked-language-model head in tf_keras (Keras 2).

The network is ONE flat Keras functional graph built only from layers that the fast (ghost-norm)
per-example clipping of tensorflow-privacy 0.9.0 has registry functions for — ``Embedding``,
``Dense``, ``EinsumDense`` (inside ``MultiHeadAttention``), ``LayerNormalization``,
``MultiHeadAttention`` — plus parameter-free layers (``Lambda``, ``Add``, ``Dropout``). No custom
layer subclass carries trainable weights, so ``dpbert.model.dpsgd`` can compute every example's
gradient norm without materialising per-example gradients (see that module).

Architecture (post-LayerNorm, as BERT):

* embeddings: word ``Embedding(V, H)`` + learned position ``Embedding(L, H)`` → LayerNorm →
  Dropout. There are no token-type (segment) embeddings: pre-training here uses single segments
  (a public checkpoint's segment-0 vector is folded into the position table, see
  ``init_public``). Padding (id ``pad_id``) is masked out of attention.
* ``num_layers`` × [MultiHeadAttention → Dropout → Add → LayerNorm → Dense(I, gelu) → Dense(H) →
  Dropout → Add → LayerNorm].
* MLM head: gather the hidden states at the masked positions → Dense(H, gelu) → LayerNorm →
  Dense(V). The output projection has its OWN weights, untied from the input embedding:
  tensorflow-privacy 0.9.0's ghost norms add the squared norms of each layer's gradient
  separately, which is wrong when one variable is used by two layers (the cross term
  2<g_in, g_out> is missing), so a tied output layer would be clipped to a wrong norm.

Two models share every layer (and so every weight):

* ``BertModels.mlm``: inputs ``{"input_ids": [B, L] int32, "masked_positions": [B, M] int32}``,
  output logits ``[B, M, V]`` at the ``M = max_predictions`` masked positions (computing the
  vocabulary projection only where there is a label is what BERT does; it is ~L/M times cheaper).
* ``BertModels.encoder``: input ``input_ids`` → dict with ``sequence_output`` ``[B, L, H]``,
  ``hidden_states`` (list of ``num_layers + 1`` tensors ``[B, L, H]``, embeddings first) and
  ``attention_probs`` (list of ``num_layers`` tensors ``[B, heads, L, L]``, before dropout).

``save_bert`` / ``load_bert`` write and read Keras weights plus ``model_config.json`` (the
``BertSpec``), which is all an evaluator needs to rebuild the encoder.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Dict, Optional

import tensorflow as tf
import tf_keras

#: (hidden_size, num_layers, num_heads, intermediate_size)
PRESETS: Dict[str, Dict[str, int]] = {
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
    "mini": dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "small": dict(hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048),
    "base": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}

MODEL_CONFIG_FILE = "model_config.json"
WEIGHTS_PREFIX = "weights"


def max_predictions_for(max_seq_length: int, mask_probability: float = 0.15) -> int:
    """M, the number of masked-position slots per sequence: ceil(p·L) (20 for L=128, p=0.15)."""
    return max(1, int(math.ceil(mask_probability * max_seq_length)))


@dataclasses.dataclass(frozen=True)
class BertSpec:
    """Every number needed to rebuild the network (written as ``model_config.json``)."""

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 128
    max_seq_length: int = 128
    max_predictions: int = 20
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_epsilon: float = 1e-12
    initializer_range: float = 0.02
    pad_id: int = 0
    preset: str = "custom"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_seq_length", "max_predictions"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"BertSpec.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads "
                             f"{self.num_heads}")
        if self.max_predictions > self.max_seq_length:
            raise ValueError("max_predictions cannot exceed max_seq_length")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "BertSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def spec_from_config(model_config, vocab_size: int, mask_probability: float = 0.15,
                     pad_id: int = 0) -> BertSpec:
    """``BertSpec`` from a ``dpbert.config.ModelConfig``: preset sizes, then explicit overrides.

    ``preset: custom`` needs all four sizes; with a named preset any size given explicitly
    overrides the preset's.
    """
    sizes = dict(PRESETS.get(model_config.preset, {}))
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        value = getattr(model_config, name)
        if value is not None:
            sizes[name] = int(value)
        elif name not in sizes:
            raise ValueError(f"model.{name} must be set with preset 'custom'")
    return BertSpec(
        vocab_size=int(vocab_size),
        max_seq_length=int(model_config.max_seq_length),
        max_predictions=max_predictions_for(model_config.max_seq_length, mask_probability),
        dropout=float(model_config.dropout),
        attention_dropout=float(model_config.dropout),
        pad_id=int(pad_id),
        preset=model_config.preset,
        **sizes,
    )


def count_parameters(spec: BertSpec) -> int:
    """Trainable parameters of ``build_bert(spec)`` (closed form, no model built)."""
    h, i, v, L = spec.hidden_size, spec.intermediate_size, spec.vocab_size, spec.max_seq_length
    emb = v * h + L * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    head = (h * h + h) + 2 * h + (h * v + v)
    return emb + spec.num_layers * layer + head


@dataclasses.dataclass
class BertModels:
    """The encoder and the MLM model; they share every layer and weight."""

    spec: BertSpec
    encoder: tf_keras.Model
    mlm: tf_keras.Model


class _Init:
    """Truncated-normal initializers with distinct, reproducible seeds (None = random)."""

    def __init__(self, stddev: float, seed: Optional[int]):
        self.stddev, self.seed, self.count = stddev, seed, 0

    def __call__(self):
        seed = None
        if self.seed is not None:
            seed = self.seed * 1000 + self.count
            self.count += 1
        return tf_keras.initializers.TruncatedNormal(stddev=self.stddev, seed=seed)


def _position_ids(input_ids):
    shape = tf.shape(input_ids)
    return tf.broadcast_to(tf.range(shape[1], dtype=tf.int32)[tf.newaxis, :], shape)


def _gather_positions(tensors):
    sequence, positions = tensors
    return tf.gather(sequence, positions, batch_dims=1)


def build_bert(spec: BertSpec, seed: Optional[int] = None) -> BertModels:
    """Build the encoder and MLM models (shared layers). ``seed`` fixes the initialisation."""
    init = _Init(spec.initializer_range, seed)
    L, H = spec.max_seq_length, spec.hidden_size
    pad_id = int(spec.pad_id)
    input_ids = tf_keras.Input(shape=(L,), dtype=tf.int32, name="input_ids")
    masked_positions = tf_keras.Input(shape=(spec.max_predictions,), dtype=tf.int32,
                                      name="masked_positions")

    position_ids = tf_keras.layers.Lambda(_position_ids, name="position_ids")(input_ids)
    # [B, 1, L]: 1 where the key is a real token; MultiHeadAttention broadcasts it over queries.
    attention_mask = tf_keras.layers.Lambda(
        lambda ids: tf.cast(tf.not_equal(ids, pad_id), tf.int32)[:, tf.newaxis, :],
        name="attention_mask")(input_ids)

    word = tf_keras.layers.Embedding(spec.vocab_size, H, embeddings_initializer=init(),
                                     name="word_embeddings")(input_ids)
    position = tf_keras.layers.Embedding(L, H, embeddings_initializer=init(),
                                         name="position_embeddings")(position_ids)
    x = tf_keras.layers.Add(name="embeddings_add")([word, position])
    x = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon,
                                           name="embeddings_layer_norm")(x)
    x = tf_keras.layers.Dropout(spec.dropout, name="embeddings_dropout")(x)

    hidden_states = [x]
    attention_probs = []
    for i in range(spec.num_layers):
        attention = tf_keras.layers.MultiHeadAttention(
            num_heads=spec.num_heads, key_dim=spec.head_size, dropout=spec.attention_dropout,
            kernel_initializer=init(), name=f"layer_{i}_attention")
        attended, probs = attention(x, x, attention_mask=attention_mask,
                                    return_attention_scores=True)
        attended = tf_keras.layers.Dropout(spec.dropout, name=f"layer_{i}_attention_dropout")(attended)
        x = tf_keras.layers.Add(name=f"layer_{i}_attention_add")([x, attended])
        x = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon,
                                               name=f"layer_{i}_attention_layer_norm")(x)
        inner = tf_keras.layers.Dense(spec.intermediate_size, activation="gelu",
                                      kernel_initializer=init(), name=f"layer_{i}_intermediate")(x)
        out = tf_keras.layers.Dense(H, kernel_initializer=init(), name=f"layer_{i}_output")(inner)
        out = tf_keras.layers.Dropout(spec.dropout, name=f"layer_{i}_output_dropout")(out)
        x = tf_keras.layers.Add(name=f"layer_{i}_output_add")([x, out])
        x = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon,
                                               name=f"layer_{i}_output_layer_norm")(x)
        hidden_states.append(x)
        attention_probs.append(probs)

    encoder = tf_keras.Model(
        inputs=input_ids,
        outputs={"sequence_output": x, "hidden_states": hidden_states,
                 "attention_probs": attention_probs},
        name="bert_encoder")

    gathered = tf_keras.layers.Lambda(_gather_positions, name="gather_masked")([x, masked_positions])
    t = tf_keras.layers.Dense(H, activation="gelu", kernel_initializer=init(),
                              name="mlm_transform")(gathered)
    t = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon, name="mlm_layer_norm")(t)
    logits = tf_keras.layers.Dense(spec.vocab_size, kernel_initializer=init(), name="mlm_output")(t)
    mlm = tf_keras.Model(inputs={"input_ids": input_ids, "masked_positions": masked_positions},
                         outputs=logits, name="bert_mlm")
    return BertModels(spec=spec, encoder=encoder, mlm=mlm)


def save_bert(models: BertModels, directory) -> Dict[str, str]:
    """Write ``model_config.json`` and the Keras weights (TF format) of the MLM model (which
    contains the encoder's). Returns the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MODEL_CONFIG_FILE).write_text(models.spec.to_json(), encoding="utf-8")
    weights = str(directory / WEIGHTS_PREFIX)
    models.mlm.save_weights(weights)
    return {"model_config": str(directory / MODEL_CONFIG_FILE), "weights": weights}


def load_bert(directory) -> BertModels:
    """Rebuild the models from ``model_config.json`` and load the weights saved by ``save_bert``."""
    directory = Path(directory)
    spec = BertSpec.from_dict(json.loads((directory / MODEL_CONFIG_FILE).read_text(encoding="utf-8")))
    models = build_bert(spec)
    models.mlm.load_weights(os.fspath(directory / WEIGHTS_PREFIX)).expect_partial()
    return models
