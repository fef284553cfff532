"""BERT encoder and masked-language-model head in tf_keras (Keras 2).

The network is ONE flat Keras functional graph built only from layers that ghost-norm
per-example clipping has registry functions for — ``Embedding``, ``Dense``, ``EinsumDense``
(inside ``MultiHeadAttention``), ``LayerNormalization``, ``MultiHeadAttention`` — plus
parameter-free layers. No custom layer subclass carries trainable weights, so
``dpbert.mechanism.ghost`` computes every example's gradient norm without materialising per-example
gradients; the MLM output projection is untied from the input embedding (a variable used by two
layers would be clipped to a wrong norm).

Contract: ``build_bert`` gives ``BertModels.mlm`` (logits at the masked positions) and
``BertModels.encoder`` (hidden states and attention probabilities), sharing every weight;
``save_bert`` / ``load_bert`` write and read Keras weights plus ``model_config.json``;
``save_bert`` always writes a plain BERT (LoRA adapters merged by :func:`merge_lora`). The
architecture, the two models' inputs and outputs, and the LoRA adapters: docs/training.md ("The
BERT model").
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


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """Rank r and scale α of the LoRA adapters (update (α/r)·A·B)."""

    rank: int = 16
    alpha: float = 32.0

    def __post_init__(self):
        if int(self.rank) < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank!r}")
        if not float(self.alpha) > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")

    @property
    def scale(self) -> float:
        return float(self.alpha) / int(self.rank)


@dataclasses.dataclass
class BertModels:
    """The encoder and the MLM model; they share every layer and weight. ``lora``: the adapters'
    spec when the model carries LoRA adapters (``merge_lora`` gives the plain model)."""

    spec: BertSpec
    encoder: tf_keras.Model
    mlm: tf_keras.Model
    lora: Optional[LoRASpec] = None
    #: ``build_bert(masked_last_layer=...)``: the MLM model's last layer at the masked positions only
    masked_last_layer: bool = False


#: The LoRA-adapted projections of an encoder layer: the four attention projections (inside the
#: attention layer) and the two FFN dense layers.
ATTENTION_PROJECTIONS = ("_query_dense", "_key_dense", "_value_dense", "_output_dense")
FFN_LAYERS = ("intermediate", "output")


def _lora_a_initializer(seed):
    # LoRA / peft: A ~ U(−1/√fan_in, 1/√fan_in) (kaiming_uniform with a = √5); B = 0.
    return tf_keras.initializers.VarianceScaling(scale=1.0 / 3.0, mode="fan_in", distribution="uniform", seed=seed)


class LoRAProjection(tf_keras.layers.Layer):
    """base(x) + scale·B(A(x)) for one attention projection (``EinsumDense`` base, A, B).

    Only the two einsum forms of ``MultiHeadAttention`` over rank-3 inputs are supported:
    query/key/value ``abc,cde->abde`` (A: ``abc,cr->abr`` written as ``...b,bc->...c``, B:
    ``abr,rde->abde``) and output ``abcd,cde->abe`` (A: ``abcd,cdr->abr``, B: ``...b,bc->...c``)."""

    def __init__(self, base, rank: int, scale: float, seed=None, **kwargs):
        super().__init__(name=base.name + "_lora", **kwargs)
        self.base, self.rank, self.scale = base, int(rank), float(scale)
        out_shape = list(base.partial_output_shape)  # the base is not built yet
        if base.equation == "abc,cde->abde":
            self.lora_a = tf_keras.layers.EinsumDense("...b,bc->...c", output_shape=[self.rank],
                                                      kernel_initializer=_lora_a_initializer(seed),
                                                      name=base.name + "_lora_a")
            self.lora_b = tf_keras.layers.EinsumDense("abc,cde->abde", output_shape=out_shape,
                                                      kernel_initializer="zeros", name=base.name + "_lora_b")
            self.form = "qkv"
        elif base.equation == "abcd,cde->abe":
            self.lora_a = tf_keras.layers.EinsumDense("abcd,cde->abe", output_shape=[None, self.rank],
                                                      kernel_initializer=_lora_a_initializer(seed),
                                                      name=base.name + "_lora_a")
            self.lora_b = tf_keras.layers.EinsumDense("...b,bc->...c", output_shape=out_shape[-1:],
                                                      kernel_initializer="zeros", name=base.name + "_lora_b")
            self.form = "output"
        else:
            raise NotImplementedError(f"LoRA on the attention projection {base.equation!r} (rank-3 inputs only)")

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent control flow (see below)
    def call(self, x, training=None):  # (Keras reads the wrapper's signature as taking `training`)
        del training
        return self.base(x) + self.scale * self.lora_b(self.lora_a(x))

    def delta(self) -> tf.Tensor:
        """(α/r)·A·B in the base kernel's shape."""
        if self.form == "qkv":
            return self.scale * tf.einsum("cr,rde->cde", self.lora_a.kernel, self.lora_b.kernel)
        return self.scale * tf.einsum("cdr,re->cde", self.lora_a.kernel, self.lora_b.kernel)


class LoRAMultiHeadAttention(tf_keras.layers.MultiHeadAttention):
    """``MultiHeadAttention`` whose four projections carry LoRA adapters (:class:`LoRAProjection`)."""

    def __init__(self, *args, lora: LoRASpec, lora_seed=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._lora, self._lora_seed = lora, lora_seed

    # Keras hands a user-defined layer's call to AutoGraph, which converted MultiHeadAttention's
    # whole call chain (≈ 10 s per LoRA model built); it has no tensor-dependent control flow.
    @tf.autograph.experimental.do_not_convert
    def call(self, *args, **kwargs):
        return super().call(*args, **kwargs)

    def _build_from_signature(self, query, value, key=None):
        super()._build_from_signature(query, value, key=key)
        for i, name in enumerate(ATTENTION_PROJECTIONS):
            base = getattr(self, name)
            delattr(self, name)
            seed = None if self._lora_seed is None else self._lora_seed + i
            setattr(self, name, LoRAProjection(base, self._lora.rank, self._lora.scale, seed=seed))


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


def build_bert(spec: BertSpec, seed: Optional[int] = None, lora: Optional[LoRASpec] = None,
               masked_last_layer: bool = False) -> BertModels:
    """Build the encoder and MLM models (shared layers). ``seed`` fixes the initialisation.
    ``lora``: add LoRA adapters (docs/training.md); the base layers' initialisation does not
    depend on it (the adapters draw from their own seeds). ``masked_last_layer``: the MLM model
    runs its last encoder layer's queries at the masked positions only (keys and values at every
    position): the same function and weights, about a third less work for two layers at L = 32,
    gradients equal up to float rounding (the backward sums in another order)."""
    init = _Init(spec.initializer_range, seed)
    lora_seed = None if seed is None else seed * 1000 + 500  # after the ≤ 500 base initializers
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

    hidden_states, attention_probs, layers = [x], [], []
    for i in range(spec.num_layers):
        layers.append(_EncoderLayer(spec, i, init, lora, lora_seed))
        x, probs = layers[-1](x, x, attention_mask)
        hidden_states.append(x)
        attention_probs.append(probs)

    encoder = tf_keras.Model(
        inputs=input_ids,
        outputs={"sequence_output": x, "hidden_states": hidden_states,
                 "attention_probs": attention_probs},
        name="bert_encoder")

    # The MLM head reads the last layer at the masked positions only: with masked_last_layer that
    # layer's queries (and what follows them: residual, LayerNorms, FFN) are computed there only,
    # its keys and values at every position — the same function, at M of L positions' cost.
    if layers and masked_last_layer:
        before = hidden_states[-2]
        query = tf_keras.layers.Lambda(_gather_positions, name="gather_masked")([before, masked_positions])
        gathered, _ = layers[-1](query, before, attention_mask)
    else:
        gathered = tf_keras.layers.Lambda(_gather_positions, name="gather_masked")([x, masked_positions])
    t = tf_keras.layers.Dense(H, activation="gelu", kernel_initializer=init(),
                              name="mlm_transform")(gathered)
    t = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon, name="mlm_layer_norm")(t)
    logits = tf_keras.layers.Dense(spec.vocab_size, kernel_initializer=init(), name="mlm_output")(t)
    mlm = tf_keras.Model(inputs={"input_ids": input_ids, "masked_positions": masked_positions},
                         outputs=logits, name="bert_mlm")
    return BertModels(spec=spec, encoder=encoder, mlm=mlm, lora=lora, masked_last_layer=bool(masked_last_layer))


class _EncoderLayer:
    """The layers of encoder layer ``i``, made once (in the initialisers' order) and callable on
    (queries, keys/values): the encoder calls it on every position, the MLM head's last layer
    on the masked positions' queries only (``build_bert``)."""

    def __init__(self, spec: BertSpec, i: int, init, lora: Optional[LoRASpec], lora_seed):
        mha_kwargs = dict(num_heads=spec.num_heads, key_dim=spec.head_size, dropout=spec.attention_dropout,
                          kernel_initializer=init(), name=f"layer_{i}_attention")
        if lora is None:
            self.attention = tf_keras.layers.MultiHeadAttention(**mha_kwargs)
        else:
            self.attention = LoRAMultiHeadAttention(
                lora=lora, lora_seed=None if lora_seed is None else lora_seed + 10 * i, **mha_kwargs)
        self.attention_dropout = tf_keras.layers.Dropout(spec.dropout, name=f"layer_{i}_attention_dropout")
        self.attention_add = tf_keras.layers.Add(name=f"layer_{i}_attention_add")
        self.attention_norm = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon,
                                                                 name=f"layer_{i}_attention_layer_norm")
        if lora is None:
            self.intermediate = tf_keras.layers.Dense(spec.intermediate_size, activation="gelu",
                                                      kernel_initializer=init(), name=f"layer_{i}_intermediate")
            self.output = tf_keras.layers.Dense(spec.hidden_size, kernel_initializer=init(), name=f"layer_{i}_output")
        else:
            seeds = (None, None) if lora_seed is None else (lora_seed + 10 * i + 4, lora_seed + 10 * i + 5)
            inner = _LoRADense(spec.intermediate_size, init(), f"layer_{i}_intermediate", lora, seeds[0])
            gelu = tf_keras.layers.Activation("gelu", name=f"layer_{i}_intermediate_gelu")
            self.intermediate = lambda t: gelu(inner(t))
            self.output = _LoRADense(spec.hidden_size, init(), f"layer_{i}_output", lora, seeds[1])
        self.output_dropout = tf_keras.layers.Dropout(spec.dropout, name=f"layer_{i}_output_dropout")
        self.output_add = tf_keras.layers.Add(name=f"layer_{i}_output_add")
        self.output_norm = tf_keras.layers.LayerNormalization(epsilon=spec.layer_norm_epsilon,
                                                              name=f"layer_{i}_output_layer_norm")

    def __call__(self, query, value, attention_mask):
        """(the layer's output at the queries' positions, the attention probabilities)."""
        attended, probs = self.attention(query, value, attention_mask=attention_mask, return_attention_scores=True)
        x = self.attention_norm(self.attention_add([query, self.attention_dropout(attended)]))
        out = self.output_dropout(self.output(self.intermediate(x)))
        return self.output_norm(self.output_add([x, out])), probs


class _LoRADense:
    """Dense(units)(x) + (α/r)·B(A(x)): the base ``Dense`` (no activation) and two adapter
    ``Dense`` layers in parallel (no bias; B zero-initialised), made once, callable again."""

    def __init__(self, units: int, initializer, name: str, lora: LoRASpec, seed):
        self.base = tf_keras.layers.Dense(units, kernel_initializer=initializer, name=name)
        self.a = tf_keras.layers.Dense(lora.rank, use_bias=False, kernel_initializer=_lora_a_initializer(seed),
                                       name=f"{name}_lora_a")
        self.b = tf_keras.layers.Dense(units, use_bias=False, kernel_initializer="zeros", name=f"{name}_lora_b")
        scale = lora.scale
        self.scale = tf_keras.layers.Lambda(lambda t: t * scale, name=f"{name}_lora_scale")
        self.add = tf_keras.layers.Add(name=f"{name}_lora_add")

    def __call__(self, x):
        base = self.base(x)
        return self.add([base, self.scale(self.b(self.a(x)))])


def _base_layers(models: BertModels):
    """name → the layer holding the base (non-adapter) weights of that name."""
    return {layer.name: layer for layer in models.mlm.layers if layer.weights}


def _copy_base(source: BertModels, target: BertModels, fold: bool):
    """Copy every base weight of ``source`` into ``target`` by layer name; with ``fold`` the
    source's adapters are folded into the copied kernels (source adapted, target plain)."""
    targets = _base_layers(target)
    for name, layer in _base_layers(source).items():
        if name.endswith(("_lora_a", "_lora_b")):
            continue
        dest = targets[name]
        if isinstance(layer, tf_keras.layers.MultiHeadAttention):
            for attr in ATTENTION_PROJECTIONS:
                src, dst = getattr(layer, attr), getattr(dest, attr)
                src_base = src.base if isinstance(src, LoRAProjection) else src
                dst_base = dst.base if isinstance(dst, LoRAProjection) else dst
                kernel = src_base.kernel + (src.delta() if fold and isinstance(src, LoRAProjection) else 0.0)
                dst_base.kernel.assign(kernel)
                dst_base.bias.assign(src_base.bias)
            continue
        values = [w.numpy() for w in layer.weights]
        if fold and _has_layer(source.mlm, name + "_lora_a"):
            a = source.mlm.get_layer(name + "_lora_a").kernel
            b = source.mlm.get_layer(name + "_lora_b").kernel
            values[0] = (layer.kernel + source.lora.scale * tf.matmul(a, b)).numpy()
        dest.set_weights(values)


def _has_layer(model, name: str) -> bool:
    try:
        model.get_layer(name)
        return True
    except ValueError:
        return False


def add_lora(models: BertModels, lora: LoRASpec, seed: Optional[int] = None) -> BertModels:
    """The LoRA-adapted model with ``models``' weights as its (frozen) base: B = 0, so its outputs
    equal ``models``' at the start. Build it under the same distribution strategy scope."""
    if models.lora is not None:
        raise ValueError("the model already carries LoRA adapters")
    adapted = build_bert(models.spec, seed=seed, lora=lora, masked_last_layer=models.masked_last_layer)
    _copy_base(models, adapted, fold=False)
    return adapted


def merge_lora(models: BertModels) -> BertModels:
    """The plain BERT with the adapters folded in (W + (α/r)·A·B); ``models`` itself if it has
    none."""
    if models.lora is None:
        return models
    plain = build_bert(models.spec)
    _copy_base(models, plain, fold=True)
    return plain


def save_bert(models: BertModels, directory) -> Dict[str, str]:
    """Write ``model_config.json`` and the Keras weights (TF format) of the MLM model (which
    contains the encoder's). Returns the paths written. A LoRA-adapted model is written MERGED
    (``merge_lora``): the files are those of a plain BERT."""
    models = merge_lora(models)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MODEL_CONFIG_FILE).write_text(models.spec.to_json(), encoding="utf-8")
    weights = str(directory / WEIGHTS_PREFIX)
    models.mlm.save_weights(weights)
    return {"model_config": str(directory / MODEL_CONFIG_FILE), "weights": weights}


def load_bert(directory) -> BertModels:
    """Rebuild the models from ``model_config.json`` and load the weights saved by ``save_bert``."""
    from dpbert import storage

    directory = os.fspath(directory)  # not Path: it folds a URI's "//" (ram://, gs://)
    spec = BertSpec.from_dict(storage.read_json(storage.join(directory, MODEL_CONFIG_FILE)))
    models = build_bert(spec)
    models.mlm.load_weights(storage.join(directory, WEIGHTS_PREFIX)).expect_partial()
    return models
