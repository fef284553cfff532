"""What DP-SGD trains: ``training.trainable`` → the trainable pieces of the MLM model.

``training.trainable`` is a list of sets whose UNION is trained; everything else is frozen:

* ``all``: every weight (the default; cannot be combined with another set).
* ``lora``: the LoRA adapters (``dpbert.network.bert``: rank ``training.lora_rank``, scale
  ``training.lora_alpha / lora_rank``) on the attention query / key / value / output projections
  and the two FFN dense layers of every encoder layer; the base weights are frozen.
* ``bias``: every bias and every LayerNorm γ / β (BiTFiT).
* ``head``: the MLM transform dense (kernel + bias), its LayerNorm, and the output bias.
* ``new_tokens``: only the input-embedding ROWS and the output-layer COLUMNS (kernel column and
  output-bias entry) of the tokens the DP vocabulary appended to the public one (``token_sources.json``
  ``ranges.dp``); the public rows stay frozen.

A :class:`Piece` is one trainable variable, WHOLE, or the slice of it along one axis at the
trainable indices (``new_tokens``: axis 0 of the word embedding, axis 1 of the output kernel,
axis 0 of the output bias). Frozen parameters get no gradient, take no part in the per-unit
norm (``dpbert.mechanism.ghost`` sums only the trainable pieces' terms), get no noise (the one draw
of ``dpbert.mechanism.step`` has the pieces' shapes) and no weight decay (the optimizer is given the
pieces only: a sliced piece as a small "shadow" variable gathered from and scattered back into
its variable, so frozen coordinates stay bit-identical). The accountant is unchanged: σ, q and
the steps do not depend on the set (the sensitivity of the released sum is C whatever
coordinates it has).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from dpbert.config import TRAINABLE_SETS  # noqa: F401  (the names training.trainable accepts)

#: The layers of the ``head`` set (the whole layer; ``mlm_output``: its bias only).
HEAD_LAYERS = ("mlm_transform", "mlm_layer_norm")
OUTPUT_LAYER = "mlm_output"
WORD_EMBEDDINGS = "word_embeddings"


def validate_names(names: Sequence[str]) -> List[str]:
    """The sorted set of names; ValueError on an unknown, empty, or ``all`` with another."""
    names = list(names)
    unknown = [n for n in names if n not in TRAINABLE_SETS]
    if unknown:
        raise ValueError(f"unknown trainable set(s) {unknown}; choose from {', '.join(TRAINABLE_SETS)}")
    if not names:
        raise ValueError("the trainable list is empty")
    if "all" in names and len(set(names)) > 1:
        raise ValueError("'all' cannot be combined with another trainable set")
    return sorted(set(names))


def needs_lora(names: Sequence[str]) -> bool:
    return "lora" in names


@dataclasses.dataclass(frozen=True, eq=False)
class Piece:
    """One trainable variable (``axis is None``) or its slice at ``indices`` along ``axis``."""

    variable: tf.Variable
    axis: Optional[int] = None
    indices: Optional[np.ndarray] = None

    @property
    def shape(self) -> tf.TensorShape:
        shape = self.variable.shape
        if self.axis is None:
            return shape
        dims = list(shape)
        dims[self.axis] = int(len(self.indices))
        return tf.TensorShape(dims)

    @property
    def size(self) -> int:
        return int(self.shape.num_elements())

    @property
    def name(self) -> str:
        return self.variable.name if self.axis is None else f"{self.variable.name}[rows {len(self.indices)} of axis {self.axis}]"

    def local_index(self) -> np.ndarray:
        """[dim along axis] int32: the position of each index in ``indices``, −1 where frozen."""
        out = np.full(int(self.variable.shape[self.axis]), -1, np.int32)
        out[np.asarray(self.indices, np.int64)] = np.arange(len(self.indices), dtype=np.int32)
        return out

    def nd_indices(self) -> np.ndarray:
        """[size, rank] int64: the variable coordinates of the piece, in the piece's row-major order."""
        grids = [np.arange(int(d)) for d in self.variable.shape]
        grids[self.axis] = np.asarray(self.indices, np.int64)
        mesh = np.meshgrid(*grids, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1).astype(np.int64)

    def slice_gradient(self, grad) -> tf.Tensor:
        """The piece's part of a gradient of the WHOLE variable (dense or ``IndexedSlices``)."""
        if self.axis is None:
            return tf.convert_to_tensor(grad)
        if isinstance(grad, tf.IndexedSlices) and self.axis == 0:
            local = tf.gather(tf.constant(self.local_index()), grad.indices)
            keep = local >= 0
            n = int(len(self.indices))
            return tf.math.unsorted_segment_sum(grad.values * tf.cast(keep, grad.values.dtype)[:, tf.newaxis],
                                                tf.where(keep, local, n), n + 1)[:n]
        return tf.gather(tf.convert_to_tensor(grad), tf.constant(np.asarray(self.indices, np.int64)), axis=self.axis)


class Selection:
    """The trainable pieces of a model, in the model's ``trainable_variables`` order."""

    def __init__(self, pieces: Iterable[Piece], names: Sequence[str] = ("all",)):
        self.pieces: List[Piece] = list(pieces)
        self.names = list(names)
        self._by_ref: Dict = {}
        for p in self.pieces:
            if p.variable.ref() in self._by_ref:
                raise ValueError(f"variable {p.variable.name} selected twice")
            self._by_ref[p.variable.ref()] = p
        if not self.pieces or not self.size:
            raise ValueError(f"training.trainable {self.names} selects no parameter of this model")

    @classmethod
    def whole(cls, variables: Sequence[tf.Variable]) -> "Selection":
        return cls([Piece(v) for v in variables], ("all",))

    def piece(self, variable) -> Optional[Piece]:
        return self._by_ref.get(variable.ref())

    def __len__(self):
        return len(self.pieces)

    @property
    def size(self) -> int:
        return int(sum(p.size for p in self.pieces))

    @property
    def is_whole(self) -> bool:
        return all(p.axis is None for p in self.pieces)

    def gradients(self, tape: tf.GradientTape, target) -> List[tf.Tensor]:
        """d target / d piece for every piece (brute force: one tape over the whole variables)."""
        grads = tape.gradient(target, [p.variable for p in self.pieces],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [p.slice_gradient(g) for p, g in zip(self.pieces, grads)]

    def describe(self) -> dict:
        """Public summary (set names, parameter counts): no data-dependent value."""
        return {"sets": list(self.names), "parameters": self.size, "variables": len(self.pieces)}


def _layer_variables(model, name: str):
    return list(model.get_layer(name).trainable_variables)


def _bias_like(model) -> List[tf.Variable]:
    """Every bias and LayerNorm γ / β of the model (BiTFiT), adapters excluded (they have none)."""
    from dpbert.network import bert as bert_lib
    import tf_keras

    out = []
    for layer in model.layers:
        if isinstance(layer, tf_keras.layers.LayerNormalization):
            out += [layer.gamma, layer.beta]
        elif isinstance(layer, tf_keras.layers.MultiHeadAttention):
            for attr in bert_lib.ATTENTION_PROJECTIONS:
                sub = getattr(layer, attr)
                sub = sub.base if isinstance(sub, bert_lib.LoRAProjection) else sub
                if sub.bias is not None:
                    out.append(sub.bias)
        elif isinstance(layer, (tf_keras.layers.Dense, tf_keras.layers.EinsumDense)) and \
                getattr(layer, "bias", None) is not None:
            out.append(layer.bias)
    return out


def lora_variables(model) -> List[tf.Variable]:
    """The LoRA adapter kernels of an adapted model (``dpbert.network.bert``)."""
    from dpbert.network import bert as bert_lib
    import tf_keras

    out = []
    for layer in model.layers:
        if isinstance(layer, tf_keras.layers.MultiHeadAttention):
            for attr in bert_lib.ATTENTION_PROJECTIONS:
                sub = getattr(layer, attr)
                if isinstance(sub, bert_lib.LoRAProjection):
                    out += [sub.lora_a.kernel, sub.lora_b.kernel]
        elif layer.name.endswith(("_lora_a", "_lora_b")):
            out += list(layer.trainable_variables)
    return out


def select(models, names: Sequence[str], new_token_ids: Optional[Sequence[int]] = None) -> Selection:
    """The :class:`Selection` of ``names`` (union) on ``models.mlm``.

    ``new_token_ids``: the ids the DP vocabulary appended (required by ``new_tokens``)."""
    names = validate_names(names)
    model = models.mlm
    variables = list(model.trainable_variables)
    if names == ["all"]:
        return Selection(Piece(v) for v in variables)
    if "lora" in names and getattr(models, "lora", None) is None:
        raise ValueError("training.trainable lora needs a model built with LoRA adapters (bert.add_lora)")
    whole = set()
    sliced: Dict = {}  # var ref → (axis, set of indices)
    if "lora" in names:
        whole |= {v.ref() for v in lora_variables(model)}
    if "bias" in names:
        whole |= {v.ref() for v in _bias_like(model)}
    if "head" in names:
        for name in HEAD_LAYERS:
            whole |= {v.ref() for v in _layer_variables(model, name)}
        whole.add(model.get_layer(OUTPUT_LAYER).bias.ref())
    if "new_tokens" in names:
        if new_token_ids is None:
            raise ValueError("training.trainable new_tokens needs the ids the DP vocabulary appended "
                             "(a public / public+dp vocabulary's token_sources.json)")
        ids = np.unique(np.asarray(list(new_token_ids), np.int64))
        vocab = int(models.spec.vocab_size)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"new token ids must lie in [0, {vocab})")
        if ids.size:
            output = model.get_layer(OUTPUT_LAYER)
            for var, axis in ((model.get_layer(WORD_EMBEDDINGS).embeddings, 0), (output.kernel, 1),
                              (output.bias, 0)):
                sliced[var.ref()] = (axis, ids)
    pieces = []
    for v in variables:
        if v.ref() in whole:
            pieces.append(Piece(v))
        elif v.ref() in sliced:
            axis, ids = sliced[v.ref()]
            pieces.append(Piece(v, axis, ids))
    return Selection(pieces, names)


def new_token_ids_from_sources(record: Optional[dict]) -> Optional[List[int]]:
    """The appended ids of a ``token_sources.json`` record (``ranges.dp``); None without one."""
    if record is None:
        return None
    start, stop = record["ranges"]["dp"]
    return list(range(int(start), int(stop)))
