"""Per-example clipped gradient sums with ghost norms and book-keeping (one forward, one backward).

For a flat Keras functional model whose trainable layers are ``Dense``, ``EinsumDense``,
``Embedding``, ``LayerNormalization`` and ``MultiHeadAttention``, ``clipped_gradient_sum``
returns S = Σ_i mask_i · min(1, C/‖∇ℓ_i‖) · ∇ℓ_i without materialising per-example gradients of
the whole model: one forward pass exposing every trainable layer's pre-activation, ONE backward
pass, per-layer squared norms from (X, G) alone (ghost or instantiated, whichever is cheaper:
Bu et al. 2022's mixed rule), and book-kept clipped sums (Bu et al. 2023) instead of a second
backward pass.

Contract: the clipped unit is one example, or with ``group_size = k`` a group of k consecutive
rows (one patient's tuples) whose SUMMED gradient is clipped, so a unit's clipped contribution
has norm ≤ C; only the variables (and rows / columns) selected by ``training.trainable`` get
terms and gradients; variables must not be shared by two layers. Every result is exact: the
tests compare the norms and S with per-example gradients computed one example at a time. The
four steps, per-group norms, partial trainability and the cost: docs/training.md ("Per-example
clipping in one backward pass").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf
import tf_keras
from tensorflow_privacy.privacy.fast_gradient_clipping import gradient_clipping_utils
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import einsum_utils
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import registry_function_utils

from dpbert.network import bert as bert_lib
from dpbert.network import trainable as trainable_lib


@dataclasses.dataclass
class LayerEntry:
    """What one trainable layer contributes: watched tensors, norm and weighted-gradient fns."""

    base: list  # tensors / variables watched on the tape (their gradients feed the fns below)
    variables: list  # the layer's SELECTED variables, in the order grad_fn returns them
    sqr_norm_fn: Callable  # (base_grads) -> [b]
    grad_fn: Callable  # (base_grads, weights [b]) -> list aligned with ``variables`` (piece shapes)


#: cache key of the group size k (rows per clipped group)
GROUP = "group_size"
#: cache key of the selection: variable -> ``trainable.Piece`` or None (frozen)
SELECT = "select"
#: cache key: True = only fixed-shape ops (an XLA-compiled step; a TPU compiles nothing else)
STATIC = "static_shapes"


def _select(cache: Dict, variable):
    """The trainable piece of ``variable`` (None: frozen, no gradient, no part in the norm)."""
    if variable is None:
        return None
    fn = cache.get(SELECT)
    return trainable_lib.Piece(variable) if fn is None else fn(variable)


def _group_sum(t, k: int):
    """[b, ...] → [b/k, ...]: the sum over each group of k consecutive rows."""
    if k == 1:
        return t
    shape = tf.shape(t)
    return tf.reduce_sum(tf.reshape(t, tf.concat([[-1, k], shape[1:]], axis=0)), axis=1)


def embedding_sqr_norm_static(values, ids):
    """Per-row squared norms of an embedding table's gradient with fixed shapes only (no
    ``UniqueV2``, whose output size depends on the data): ``values`` [b·n, d] are the gathered
    rows' gradients g_t in the row-major order of ``ids`` [b, n]. Row i's gradient has, for
    each token v, the table row Σ_{t: x_t = v} g_t, so its squared norm is

        Σ_v ‖Σ_{t: x_t = v} g_t‖² = Σ_v Σ_{t,s: x_t = x_s = v} ⟨g_t, g_s⟩ = Σ_{t,s} [x_t = x_s]·⟨g_t, g_s⟩,

    the same-token mask times the Gram matrix of the row's g_t, summed (cost n²·d per row)."""
    n = _prod(ids.shape[1:])
    g = tf.reshape(values, [-1, n, values.shape[-1]])
    flat = tf.reshape(ids, [-1, n])
    same = tf.cast(tf.equal(flat[:, :, tf.newaxis], flat[:, tf.newaxis, :]), values.dtype)
    return tf.reduce_sum(same * tf.matmul(g, g, transpose_b=True), axis=[1, 2])


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


#: The einsum form of a ``Dense`` layer: the only one whose kernel / bias may be SLICED (output columns).
DENSE_EQUATION = "...b,bc->...c"


class _EinsumOp:
    """Z = einsum(equation, X, W) (+ bias) of one (Einsum)Dense, reshaped to [b, r, a]·[a, o].

    Only the SELECTED parts contribute: the kernel term and / or the bias term (per-variable
    contributions to the squared norm). A ``Dense`` kernel / bias selected as a slice of output
    columns (``new_tokens``: the output layer's columns of the appended tokens) uses only those
    columns of G: the per-example gradient of kernel column j is X_iᵀG_i[:, j], so the norm and
    the book-kept gradient of the slice are those of the full formulas on G[:, :, idx]."""

    def __init__(self, equation: str, kernel, bias, bias_axes: Optional[str], x, z, cache: Dict):
        self.equation, self.kernel, self.bias, self.bias_axes = equation, kernel, bias, bias_axes
        self.x, self.z = x, z
        self.kernel_piece = _select(cache, kernel)
        self.bias_piece = _select(cache, bias)
        for piece in (self.kernel_piece, self.bias_piece):
            if piece is not None and piece.axis is not None:
                want = len(piece.variable.shape) - 1
                if equation != DENSE_EQUATION or piece.axis != want:
                    raise NotImplementedError(f"a slice of {piece.variable.name} along axis {piece.axis}: only the "
                                              f"output columns of a Dense layer can be sliced")
        x_size, z_size, k_size = _prod(x.shape[1:]), _prod(z.shape[1:]), _prod(kernel.shape)
        rows = int(round(math.sqrt(x_size * z_size / k_size)))
        if rows < 1 or x_size % rows or z_size % rows or (x_size // rows) * (z_size // rows) != k_size:
            raise NotImplementedError(f"cannot factor einsum {equation} shapes {x.shape} {z.shape} {kernel.shape}")
        self.rows, self.a, self.o = rows, x_size // rows, z_size // rows
        self.kernel_cols = None if self.kernel_piece is None or self.kernel_piece.axis is None else \
            tf.constant(np.asarray(self.kernel_piece.indices, np.int64))
        self.bias_cols = None if self.bias_piece is None or self.bias_piece.axis is None else \
            tf.constant(np.asarray(self.bias_piece.indices, np.int64))
        self.o_sel = self.o if self.kernel_cols is None else int(self.kernel_cols.shape[0])
        self.use_ghost = rows * (self.a + self.o_sel) < self.a * self.o_sel
        if self.kernel_piece is not None:
            self.x3 = tf.reshape(einsum_utils._reshape_einsum_inputs(x, equation), [-1, rows, self.a])  # pylint: disable=protected-access

    @property
    def variables(self) -> list:
        return [p.variable for p in (self.kernel_piece, self.bias_piece) if p is not None]

    def g3(self, grad):
        g3 = tf.reshape(einsum_utils._reshape_einsum_outputs(grad, self.equation), [-1, self.rows, self.o])  # pylint: disable=protected-access
        return g3 if self.kernel_cols is None else tf.gather(g3, self.kernel_cols, axis=2)

    def _bias_axes(self):
        return einsum_utils._get_einsum_bias_adjoint_reduction_axes(  # pylint: disable=protected-access
            self.equation, self.bias_axes, len(self.z.shape))

    def _bias_rows(self, grad):
        """[b, bias size (or the selected entries)]: each row's bias gradient."""
        axes = self._bias_axes()
        qg = tf.reduce_sum(grad, axis=axes) if axes else grad
        qg = tf.reshape(qg, [tf.shape(qg)[0], -1])
        return qg if self.bias_cols is None else tf.gather(qg, self.bias_cols, axis=1)

    def sqr_norm(self, grad, cache: Dict) -> tf.Tensor:
        """Squared norms per group of k = ``cache[GROUP]`` rows (k = 1: per example), of the
        selected variables' gradients only."""
        k = int(cache.get(GROUP, 1))
        terms = []
        if self.kernel_piece is not None:
            g3 = self.g3(grad)
            o = self.o_sel
            if self.rows * k * (self.a + o) < self.a * o:  # ghost on the group's k·r rows
                key = ("xxt", id(self.x), k)
                xu = self.x3 if k == 1 else tf.reshape(self.x3, [-1, k * self.rows, self.a])
                gu = g3 if k == 1 else tf.reshape(g3, [-1, k * self.rows, o])
                if key not in cache:
                    cache[key] = tf.matmul(xu, xu, transpose_b=True)
                terms.append(tf.reduce_sum(cache[key] * tf.matmul(gu, gu, transpose_b=True), axis=[1, 2]))
            else:
                per_example = tf.matmul(self.x3, g3, transpose_a=True)  # [b, a, o]
                cache[("pe", id(self))] = per_example
                terms.append(tf.reduce_sum(tf.square(_group_sum(per_example, k)), axis=[1, 2]))
        if self.bias_piece is not None:
            terms.append(tf.reduce_sum(tf.square(_group_sum(self._bias_rows(grad), k)), axis=1))
        return tf.add_n(terms)

    def weighted_grads(self, grad, weights, cache: Dict) -> List[tf.Tensor]:
        out = []
        if self.kernel_piece is not None:
            per_example = cache.get(("pe", id(self)))
            if per_example is not None:
                kernel_grad = tf.tensordot(weights, per_example, axes=1)
            else:
                wg = self.g3(grad) * weights[:, tf.newaxis, tf.newaxis]
                kernel_grad = tf.matmul(tf.reshape(self.x3, [-1, self.a]), tf.reshape(wg, [-1, self.o_sel]),
                                        transpose_a=True)
            out.append(tf.reshape(kernel_grad, self.kernel_piece.shape))
        if self.bias_piece is not None:
            if self.bias_cols is None:
                wgrad = grad * tf.reshape(weights, [-1] + [1] * (len(grad.shape) - 1))
                axes = [0] + list(self._bias_axes())
                out.append(tf.reshape(tf.reduce_sum(wgrad, axis=axes), self.bias_piece.shape))
            else:
                out.append(tf.tensordot(weights, self._bias_rows(grad), axes=1))
        return out


def _call_linear(layer, x, tape):
    """Call an (Einsum)Dense without its activation; watch and return Z and the output."""
    activation = layer.activation
    layer.activation = None
    try:
        z = layer(x)
    finally:
        layer.activation = activation
    tape.watch(z)
    return z, (activation(z) if activation is not None else z)


def _einsum_entry(op: _EinsumOp, cache: Dict) -> LayerEntry:
    return LayerEntry(base=[op.z], variables=op.variables,
                      sqr_norm_fn=lambda grads: op.sqr_norm(grads[0], cache),
                      grad_fn=lambda grads, w: op.weighted_grads(grads[0], w, cache))


def _has_selected(layer, cache: Dict) -> bool:
    return any(_select(cache, v) is not None for v in layer.trainable_variables)


def _merge(entries: List[LayerEntry]) -> LayerEntry:
    """One entry for a layer made of several linear parts (sum of their squared norms)."""
    if len(entries) == 1:
        return entries[0]
    sizes = [len(e.base) for e in entries]

    def split(grads):
        out, start = [], 0
        for n in sizes:
            out.append(grads[start:start + n])
            start += n
        return out

    def sqr_norm_fn(grads):
        return tf.add_n([e.sqr_norm_fn(g) for e, g in zip(entries, split(grads))])

    def grad_fn(grads, weights):
        return [x for e, g in zip(entries, split(grads)) for x in e.grad_fn(g, weights)]

    return LayerEntry(base=[t for e in entries for t in e.base], variables=[v for e in entries for v in e.variables],
                      sqr_norm_fn=sqr_norm_fn, grad_fn=grad_fn)


def _linear(sub, x, equation, bias_axes, tape, cache, entries: List[LayerEntry]):
    """Call one (Einsum)Dense; registers its entry when it has a selected variable."""
    if not _has_selected(sub, cache):
        return sub(x)
    z, out = _call_linear(sub, x, tape)
    bias = getattr(sub, "bias", None)
    op = _EinsumOp(equation, sub.kernel, bias, bias_axes if bias is not None else None, x, z, cache)
    entries.append(_einsum_entry(op, cache))
    return out


def dense_computation(layer, args, kwargs, tape, cache):
    if kwargs or len(args) != 1:
        raise ValueError("Dense layer calls take exactly one positional input")
    entries: List[LayerEntry] = []
    out = _linear(layer, args[0], DENSE_EQUATION, "c", tape, cache, entries)
    return out, _merge(entries)


def einsum_dense_computation(layer, args, kwargs, tape, cache):
    if kwargs or len(args) != 1:
        raise ValueError("EinsumDense layer calls take exactly one positional input")
    entries: List[LayerEntry] = []
    out = _linear(layer, args[0], layer.equation, layer.bias_axes, tape, cache, entries)
    return out, _merge(entries)


def embedding_computation(layer, args, kwargs, tape, cache):
    if kwargs or len(args) != 1:
        raise ValueError("Embedding layer calls take exactly one positional input")
    if getattr(layer, "sparse", False) or getattr(layer, "_use_one_hot_matmul", False):
        raise NotImplementedError("sparse / one-hot Embedding is not supported")
    ids = tf.cast(args[0], tf.int32)
    table = layer.embeddings
    piece = _select(cache, table)
    tape.watch(table)
    out = tf.nn.embedding_lookup(table, ids)
    per_row = _prod(ids.shape[1:])
    if piece.axis not in (None, 0):
        raise NotImplementedError(f"embedding {table.name}: only whole rows can be selected")
    rows = None if piece.axis is None else int(len(piece.indices))
    local_index = None if piece.axis is None else tf.constant(piece.local_index())

    def kept(g):
        """(values with the frozen rows zeroed, local row of each value or ``rows``)."""
        if local_index is None:
            return g.values, g.indices
        local = tf.gather(local_index, g.indices)
        keep = local >= 0
        return g.values * tf.cast(keep, g.values.dtype)[:, tf.newaxis], tf.where(keep, local, rows)

    def sqr_norm_fn(grads):
        k = int(cache.get(GROUP, 1))
        # A group's rows of the same token (in any of its k sequences) are summed first; frozen
        # rows contribute zero vectors.
        group_ids = ids if k == 1 else tf.reshape(ids, [-1, k * per_row])
        if cache.get(STATIC):
            return embedding_sqr_norm_static(kept(grads[0])[0], group_ids)
        return registry_function_utils.embedding_sqr_norm_fn(kept(grads[0])[0], group_ids)

    def grad_fn(grads, weights):
        values, segments = kept(grads[0])
        values = values * tf.repeat(weights, per_row)[:, tf.newaxis]
        if rows is None:
            return [tf.math.unsorted_segment_sum(values, segments, table.shape[0])]
        return [tf.math.unsorted_segment_sum(values, segments, rows + 1)[:rows]]

    return out, LayerEntry(base=[table], variables=[table], sqr_norm_fn=sqr_norm_fn, grad_fn=grad_fn)


def layer_norm_computation(layer, args, kwargs, tape, cache):
    inputs = args[0]
    if not (layer.center and layer.scale):
        raise NotImplementedError("LayerNormalization needs center=True and scale=True")
    batch = tf.shape(inputs)[0]
    tiled, selected = [], []

    def expand(var):
        if _select(cache, var) is None:
            return var
        if _select(cache, var).axis is not None:
            raise NotImplementedError(f"LayerNorm {var.name}: only whole variables can be selected")
        t = tf.tile(var[tf.newaxis], [batch] + [1] * len(var.shape))
        tape.watch(t)
        tiled.append(t)
        selected.append(var)
        shape = [1] * len(inputs.shape)
        shape[0] = batch
        for d in layer.axis:
            shape[d] = inputs.shape[d]
        return tf.reshape(t, shape)

    gamma, beta = layer.gamma, layer.beta
    layer.gamma, layer.beta = expand(gamma), expand(beta)
    try:
        out = layer.call(inputs)
    finally:
        layer.gamma, layer.beta = gamma, beta

    def sqr_norm_fn(grads):
        k = int(cache.get(GROUP, 1))
        return tf.add_n([tf.reduce_sum(tf.square(_group_sum(tf.reshape(g, [tf.shape(g)[0], -1]), k)), axis=1)
                         for g in grads])

    def grad_fn(grads, weights):
        return [tf.tensordot(weights, g, axes=1) for g in grads]

    return out, LayerEntry(base=tiled, variables=selected, sqr_norm_fn=sqr_norm_fn, grad_fn=grad_fn)


def multi_head_attention_computation(layer, args, kwargs, tape, cache):
    """The four projections as (Einsum)Dense entries (selected variables only); a projection with
    LoRA adapters (``bert.LoRAProjection``) is base(x) + s·B(A(x)), each of base, A, B its own
    linear entry (A and B have the einsum forms of the base projections)."""
    query = kwargs.get("query", args[0] if args else None)
    value = kwargs.get("value", args[1] if len(args) > 1 else None)
    key = kwargs.get("key")
    if any(isinstance(t, tf.RaggedTensor) for t in (query, value, key) if t is not None):
        raise NotImplementedError("ragged attention inputs are not supported")
    attention_mask = layer._compute_attention_mask(  # pylint: disable=protected-access
        query, value, key=key, attention_mask=kwargs.get("attention_mask"),
        use_causal_mask=kwargs.get("use_causal_mask") or False)
    if not layer._built_from_signature:  # pylint: disable=protected-access
        layer._build_from_signature(query=query, value=value, key=key)  # pylint: disable=protected-access
    if key is None:
        key = value
    entries: List[LayerEntry] = []

    def project(sub, x):
        if isinstance(sub, bert_lib.LoRAProjection):
            base = project(sub.base, x)
            return base + sub.scale * project(sub.lora_b, project(sub.lora_a, x))
        return _linear(sub, x, sub.equation, sub.bias_axes, tape, cache, entries)

    q = project(layer._query_dense, query)  # pylint: disable=protected-access
    k = project(layer._key_dense, key)  # pylint: disable=protected-access
    v = project(layer._value_dense, value)  # pylint: disable=protected-access
    attended, scores = layer._compute_attention(q, k, v, attention_mask, kwargs.get("training"))  # pylint: disable=protected-access
    output = project(layer._output_dense, attended)  # pylint: disable=protected-access
    outputs = (output, scores) if kwargs.get("return_attention_scores") else output
    return outputs, _merge(entries)


#: layer class → computation(layer, args, kwargs, tape, cache) -> (outputs, LayerEntry)
REGISTRY = {
    tf_keras.layers.Dense: dense_computation,
    tf_keras.layers.EinsumDense: einsum_dense_computation,
    tf_keras.layers.Embedding: embedding_computation,
    tf_keras.layers.LayerNormalization: layer_norm_computation,
    tf_keras.layers.MultiHeadAttention: multi_head_attention_computation,
    bert_lib.LoRAMultiHeadAttention: multi_head_attention_computation,
}


def is_registered(layer) -> bool:
    return type(layer) in REGISTRY


def clipped_gradient_sum(model: tf_keras.Model, inputs, loss_fn: Callable, example_mask, clip_norm: float,
                         training: bool = True, group_size: int = 1,
                         selection: Optional["trainable_lib.Selection"] = None, static_shapes: bool = False,
                         clip_factors: Optional[Callable] = None):
    """S = Σ_i mask_i·min(1, C/‖∇ℓ_i‖)·∇ℓ_i in ``model.trainable_variables`` order.

    ``selection`` (``dpbert.network.trainable``): only its pieces are trained — the norms are those
    of the gradient of the selected pieces (frozen variables and frozen rows take no part) and
    the returned list is aligned with ``selection.pieces`` (a sliced piece's gradient has the
    slice's shape). Default: every trainable variable, whole.

    ``loss_fn(outputs) -> [b]`` per-example losses. Returns ``(grads, losses, norms, outputs)``
    with ``losses`` already multiplied by the mask and ``norms`` the unclipped gradient norms.

    ``group_size = k > 1``: rows i = g·k … g·k + k − 1 form group g (b divisible by k) and
    S = Σ_g min(1, C/‖Σ_{i∈g} mask_i ∇ℓ_i‖)·Σ_{i∈g} mask_i ∇ℓ_i; ``norms`` is then ``[b/k]``,
    the norm of each group's summed gradient (docs/training.md).

    ``static_shapes``: only ops whose output shapes are fixed by the input shapes (the embedding
    norm by :func:`embedding_sqr_norm_static`), as an XLA-compiled step on a TPU needs.

    ``clip_factors(norms) -> weights``: the mechanism's own per-unit weights from the same norms
    (normalized clipping, ``dpbert.mechanism.gaussian``); None: min(1, C/‖g‖).
    """
    example_mask = tf.cast(example_mask, tf.float32)
    k = int(group_size)
    if k < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if k > 1 and example_mask.shape[0] is not None and example_mask.shape[0] % k:
        raise ValueError(f"batch of {example_mask.shape[0]} rows is not a whole number of groups of {k}")
    if selection is None:
        selection = trainable_lib.Selection.whole(model.trainable_variables)
    cache: Dict = {GROUP: k, SELECT: selection.piece, STATIC: bool(static_shapes)}
    entries: List[LayerEntry] = []
    tape = tf.GradientTape(watch_accessed_variables=False)

    def generator(layer, args, kwargs):
        kwargs = dict(kwargs)
        if training is not None and getattr(layer, "_expects_training_arg", False):
            kwargs["training"] = training
        if _has_selected(layer, cache):
            fn = REGISTRY.get(type(layer))
            if fn is None:
                raise NotImplementedError(f"layer {layer.name!r} ({type(layer).__name__}) has no ghost "
                                          f"clipping function")
            outputs, entry = fn(layer, args, kwargs, tape, cache)
            entries.append(entry)
            return outputs, None
        return layer(*args, **kwargs), None

    with tape:
        outputs, _ = gradient_clipping_utils.model_forward_pass(model, inputs, generator_fn=generator)
        losses = loss_fn(outputs)
        if losses.shape.rank != 1:
            raise ValueError(f"per-example loss must have shape [b], got {losses.shape}")
        losses = losses * example_mask
        summed = tf.reduce_sum(losses)
    flat_base = [t for e in entries for t in e.base]
    flat_grads = tape.gradient(summed, flat_base, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    per_entry, start = [], 0
    for e in entries:
        per_entry.append(flat_grads[start:start + len(e.base)])
        start += len(e.base)
    sqr = tf.add_n([e.sqr_norm_fn(g) for e, g in zip(entries, per_entry)])
    norms = tf.sqrt(tf.maximum(sqr, 0.0))
    factors = clip_norm / tf.maximum(norms, clip_norm) if clip_factors is None else clip_factors(norms)
    if k > 1:  # every row of a group gets its group's clip factor
        factors = tf.repeat(factors, k)
    weights = tf.stop_gradient(factors * example_mask)
    by_var = {}
    for e, g in zip(entries, per_entry):
        for var, grad in zip(e.variables, e.grad_fn(g, weights)):
            if var.ref() in by_var:
                raise NotImplementedError(f"variable {var.name} is used by two layers (tied weights)")
            by_var[var.ref()] = grad
    missing = [p.variable.name for p in selection.pieces if p.variable.ref() not in by_var]
    if missing:
        raise NotImplementedError(f"no clipped gradient for variables {missing}")
    return [by_var[p.variable.ref()] for p in selection.pieces], losses, norms, outputs
