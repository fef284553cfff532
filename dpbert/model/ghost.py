"""Per-example clipped gradient sums with ghost norms and book-keeping (one forward, one backward).

For a flat Keras functional model whose trainable layers are ``Dense``, ``EinsumDense``,
``Embedding``, ``LayerNormalization`` and ``MultiHeadAttention``, ``clipped_gradient_sum``
returns S = Σ_i mask_i · min(1, C/‖∇ℓ_i‖) · ∇ℓ_i without materialising per-example gradients of
the whole model:

1. One forward pass (tensorflow-privacy 0.9.0's ``gradient_clipping_utils.model_forward_pass``
   graph walk), in which every trainable layer exposes its linear pre-activation Z (Dense /
   EinsumDense: Z = X·W + b; Embedding: the table rows gathered; LayerNorm: γ, β tiled per
   example, as in tensorflow-privacy's registry function) on the tape, with ``training=True``
   given to every layer that takes it (dropout is on, and it is the SAME dropout for the norms
   and for the gradient, since there is a single pass).
2. ONE backward pass: G = ∂(Σ_i ℓ_i)/∂Z for every layer. Examples do not interact (no batch
   statistics), so the rows of G belonging to example i are ∂ℓ_i/∂Z.
3. Per-example squared norms per layer, from (X, G) alone: for Z = X·W with per-example
   X_i ∈ R^{r×a}, G_i ∈ R^{r×o}, ‖X_iᵀG_i‖²_F = ⟨X_iX_iᵀ, G_iG_iᵀ⟩ ("ghost norm", cost r²(a+o))
   or directly ‖X_iᵀG_i‖² by instantiating the [a, o] per-example gradient (cost r·a·o) —
   whichever is cheaper for that layer's static shapes (the "mixed" rule of Bu et al. 2022:
   ghost iff r(a+o) < a·o). Bias: ‖Σ_rows G_i‖². Embedding: tensorflow-privacy's
   ``embedding_sqr_norm_fn`` (rows of the same token in one example are summed first).
   The model's norm is the square root of the sum over layers (variables must not be shared by
   two layers, which ``dpsgd.check_model_supported`` enforces).
4. Book-keeping (Bu et al. 2023): with w_i = stop_gradient(min(1, C/‖∇ℓ_i‖))·mask_i, each
   weight's clipped gradient sum is computed from the same (X, G): ∂W = Σ_i w_i X_iᵀG_i =
   Xᵀ(w ⊙ G), bias Σ w ⊙ G, embedding rows scattered with weights, LayerNorm Σ_i w_i g_i. This
   replaces a second backward pass through the network.

Per-GROUP norms (user-level DP-SGD, ``group_size = k``): the batch is laid out as consecutive
groups of k rows (one patient's ≤ k tuples, padded slots masked out); each row is still its
OWN model input (its own forward pass: no attention across a group's sequences). The clipped
unit is the group's SUMMED gradient Σ_j ∇ℓ_j. For a linear layer its squared norm is
‖Σ_j X_jᵀG_j‖² = ‖X_Uᵀ G_U‖² with X_U, G_U the rows of all k sequences stacked ([k·r, a] and
[k·r, o]): ghost ⟨X_U X_Uᵀ, G_U G_Uᵀ⟩ = Σ_{t,s∈U}(a_t·a_s)(g_t·g_s) over all token pairs of
the group (cost (k·r)²(a+o)), or the instantiated per-example [a, o] gradients summed over the
group (cost k·r·a·o) — mixed rule ghost iff k·r(a+o) < a·o. Both are the reshape
[b, r, ·] → [b/k, k·r, ·] of the per-example tensors. Bias, LayerNorm: per-example gradient
vectors summed over the group. Embedding: rows of the same token anywhere in the group summed
(the ids reshaped to [b/k, k·L]). Every row of a group gets its group's clip factor
min(1, C/‖Σ_j ∇ℓ_j‖) (times its slot mask), so the group's clipped contribution has norm ≤ C.
``group_size = 1`` is per-example clipping.

Cost ≈ forward + activation backward + per-layer weight products (what a normal backward does)
+ the norms, so close to a non-private step. ``check_against_brute_force`` in the tests compares
both the norms and S with per-example gradients computed one example at a time.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional

import tensorflow as tf
import tf_keras
from tensorflow_privacy.privacy.fast_gradient_clipping import gradient_clipping_utils
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import einsum_utils
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import registry_function_utils


@dataclasses.dataclass
class LayerEntry:
    """What one trainable layer contributes: watched tensors, norm and weighted-gradient fns."""

    base: list  # tensors / variables watched on the tape (their gradients feed the fns below)
    variables: list  # the layer's trainable variables, in the order grad_fn returns them
    sqr_norm_fn: Callable  # (base_grads) -> [b]
    grad_fn: Callable  # (base_grads, weights [b]) -> list aligned with ``variables``


#: cache key of the group size k (rows per clipped group)
GROUP = "group_size"


def _group_sum(t, k: int):
    """[b, ...] → [b/k, ...]: the sum over each group of k consecutive rows."""
    if k == 1:
        return t
    shape = tf.shape(t)
    return tf.reduce_sum(tf.reshape(t, tf.concat([[-1, k], shape[1:]], axis=0)), axis=1)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


class _EinsumOp:
    """Z = einsum(equation, X, W) (+ bias) of one (Einsum)Dense, reshaped to [b, r, a]·[a, o]."""

    def __init__(self, equation: str, kernel, bias, bias_axes: Optional[str], x, z):
        self.equation, self.kernel, self.bias, self.bias_axes = equation, kernel, bias, bias_axes
        self.x, self.z = x, z
        x_size, z_size, k_size = _prod(x.shape[1:]), _prod(z.shape[1:]), _prod(kernel.shape)
        rows = int(round(math.sqrt(x_size * z_size / k_size)))
        if rows < 1 or x_size % rows or z_size % rows or (x_size // rows) * (z_size // rows) != k_size:
            raise NotImplementedError(f"cannot factor einsum {equation} shapes {x.shape} {z.shape} {kernel.shape}")
        self.rows, self.a, self.o = rows, x_size // rows, z_size // rows
        self.use_ghost = rows * (self.a + self.o) < self.a * self.o
        self.x3 = tf.reshape(einsum_utils._reshape_einsum_inputs(x, equation), [-1, rows, self.a])  # pylint: disable=protected-access

    def g3(self, grad):
        return tf.reshape(einsum_utils._reshape_einsum_outputs(grad, self.equation), [-1, self.rows, self.o])  # pylint: disable=protected-access

    def _bias_axes(self):
        return einsum_utils._get_einsum_bias_adjoint_reduction_axes(  # pylint: disable=protected-access
            self.equation, self.bias_axes, len(self.z.shape))

    def sqr_norm(self, grad, cache: Dict) -> tf.Tensor:
        """Squared norms per group of k = ``cache[GROUP]`` rows (k = 1: per example)."""
        k = int(cache.get(GROUP, 1))
        g3 = self.g3(grad)
        if self.rows * k * (self.a + self.o) < self.a * self.o:  # ghost on the group's k·r rows
            key = ("xxt", id(self.x), k)
            xu = self.x3 if k == 1 else tf.reshape(self.x3, [-1, k * self.rows, self.a])
            gu = g3 if k == 1 else tf.reshape(g3, [-1, k * self.rows, self.o])
            if key not in cache:
                cache[key] = tf.matmul(xu, xu, transpose_b=True)
            norms = tf.reduce_sum(cache[key] * tf.matmul(gu, gu, transpose_b=True), axis=[1, 2])
        else:
            per_example = tf.matmul(self.x3, g3, transpose_a=True)  # [b, a, o]
            cache[("pe", id(self))] = per_example
            norms = tf.reduce_sum(tf.square(_group_sum(per_example, k)), axis=[1, 2])
        if self.bias is not None:
            axes = self._bias_axes()
            qg = tf.reduce_sum(grad, axis=axes) if axes else grad
            qg = tf.reshape(qg, [tf.shape(qg)[0], -1])
            norms += tf.reduce_sum(tf.square(_group_sum(qg, k)), axis=1)
        return norms

    def weighted_grads(self, grad, weights, cache: Dict) -> List[tf.Tensor]:
        per_example = cache.get(("pe", id(self)))
        if per_example is not None:
            kernel_grad = tf.tensordot(weights, per_example, axes=1)
        else:
            wg = self.g3(grad) * weights[:, tf.newaxis, tf.newaxis]
            kernel_grad = tf.matmul(tf.reshape(self.x3, [-1, self.a]), tf.reshape(wg, [-1, self.o]),
                                    transpose_a=True)
        out = [tf.reshape(kernel_grad, self.kernel.shape)]
        if self.bias is not None:
            wgrad = grad * tf.reshape(weights, [-1] + [1] * (len(grad.shape) - 1))
            axes = [0] + list(self._bias_axes())
            out.append(tf.reshape(tf.reduce_sum(wgrad, axis=axes), self.bias.shape))
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
    variables = [op.kernel] + ([op.bias] if op.bias is not None else [])
    return LayerEntry(base=[op.z], variables=variables,
                      sqr_norm_fn=lambda grads: op.sqr_norm(grads[0], cache),
                      grad_fn=lambda grads, w: op.weighted_grads(grads[0], w, cache))


def dense_computation(layer, args, kwargs, tape, cache):
    if kwargs or len(args) != 1:
        raise ValueError("Dense layer calls take exactly one positional input")
    z, out = _call_linear(layer, args[0], tape)
    op = _EinsumOp("...b,bc->...c", layer.kernel, layer.bias if layer.use_bias else None,
                   "c" if layer.use_bias else None, args[0], z)
    return out, _einsum_entry(op, cache)


def einsum_dense_computation(layer, args, kwargs, tape, cache):
    if kwargs or len(args) != 1:
        raise ValueError("EinsumDense layer calls take exactly one positional input")
    z, out = _call_linear(layer, args[0], tape)
    op = _EinsumOp(layer.equation, layer.kernel, layer.bias, layer.bias_axes, args[0], z)
    return out, _einsum_entry(op, cache)


def embedding_computation(layer, args, kwargs, tape, cache):
    if kwargs or len(args) != 1:
        raise ValueError("Embedding layer calls take exactly one positional input")
    if getattr(layer, "sparse", False) or getattr(layer, "_use_one_hot_matmul", False):
        raise NotImplementedError("sparse / one-hot Embedding is not supported")
    ids = tf.cast(args[0], tf.int32)
    table = layer.embeddings
    tape.watch(table)
    out = tf.nn.embedding_lookup(table, ids)
    per_row = _prod(ids.shape[1:])

    def sqr_norm_fn(grads):
        k = int(cache.get(GROUP, 1))
        # A group's rows of the same token (in any of its k sequences) are summed first.
        group_ids = ids if k == 1 else tf.reshape(ids, [-1, k * per_row])
        return registry_function_utils.embedding_sqr_norm_fn(grads[0].values, group_ids)

    def grad_fn(grads, weights):
        g = grads[0]
        values = g.values * tf.repeat(weights, per_row)[:, tf.newaxis]
        return [tf.math.unsorted_segment_sum(values, g.indices, table.shape[0])]

    return out, LayerEntry(base=[table], variables=[table], sqr_norm_fn=sqr_norm_fn, grad_fn=grad_fn)


def layer_norm_computation(layer, args, kwargs, tape, cache):
    inputs = args[0]
    if not (layer.center and layer.scale):
        raise NotImplementedError("LayerNormalization needs center=True and scale=True")
    batch = tf.shape(inputs)[0]
    tiled = []

    def expand(var):
        t = tf.tile(var[tf.newaxis], [batch] + [1] * len(var.shape))
        tape.watch(t)
        tiled.append(t)
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

    return out, LayerEntry(base=tiled, variables=[gamma, beta], sqr_norm_fn=sqr_norm_fn, grad_fn=grad_fn)


def multi_head_attention_computation(layer, args, kwargs, tape, cache):
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
    entries = []

    def project(sub, x):
        z, out = _call_linear(sub, x, tape)
        op = _EinsumOp(sub.equation, sub.kernel, sub.bias, sub.bias_axes, x, z)
        entries.append(_einsum_entry(op, cache))
        return out

    q = project(layer._query_dense, query)  # pylint: disable=protected-access
    k = project(layer._key_dense, key)  # pylint: disable=protected-access
    v = project(layer._value_dense, value)  # pylint: disable=protected-access
    attended, scores = layer._compute_attention(q, k, v, attention_mask, kwargs.get("training"))  # pylint: disable=protected-access
    output = project(layer._output_dense, attended)  # pylint: disable=protected-access
    outputs = (output, scores) if kwargs.get("return_attention_scores") else output

    def sqr_norm_fn(grads):
        return tf.add_n([e.sqr_norm_fn([g]) for e, g in zip(entries, grads)])

    def grad_fn(grads, weights):
        return [x for e, g in zip(entries, grads) for x in e.grad_fn([g], weights)]

    variables = [var for e in entries for var in e.variables]
    return outputs, LayerEntry(base=[e.base[0] for e in entries], variables=variables,
                               sqr_norm_fn=sqr_norm_fn, grad_fn=grad_fn)


#: layer class → computation(layer, args, kwargs, tape, cache) -> (outputs, LayerEntry)
REGISTRY = {
    tf_keras.layers.Dense: dense_computation,
    tf_keras.layers.EinsumDense: einsum_dense_computation,
    tf_keras.layers.Embedding: embedding_computation,
    tf_keras.layers.LayerNormalization: layer_norm_computation,
    tf_keras.layers.MultiHeadAttention: multi_head_attention_computation,
}


def is_registered(layer) -> bool:
    return type(layer) in REGISTRY


def clipped_gradient_sum(model: tf_keras.Model, inputs, loss_fn: Callable, example_mask, clip_norm: float,
                         training: bool = True, group_size: int = 1):
    """S = Σ_i mask_i·min(1, C/‖∇ℓ_i‖)·∇ℓ_i in ``model.trainable_variables`` order.

    ``loss_fn(outputs) -> [b]`` per-example losses. Returns ``(grads, losses, norms, outputs)``
    with ``losses`` already multiplied by the mask and ``norms`` the unclipped gradient norms.

    ``group_size = k > 1``: rows i = g·k … g·k + k − 1 form group g (b divisible by k) and
    S = Σ_g min(1, C/‖Σ_{i∈g} mask_i ∇ℓ_i‖)·Σ_{i∈g} mask_i ∇ℓ_i; ``norms`` is then ``[b/k]``,
    the norm of each group's summed gradient (module docstring).
    """
    example_mask = tf.cast(example_mask, tf.float32)
    k = int(group_size)
    if k < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if k > 1 and example_mask.shape[0] is not None and example_mask.shape[0] % k:
        raise ValueError(f"batch of {example_mask.shape[0]} rows is not a whole number of groups of {k}")
    cache: Dict = {GROUP: k}
    entries: List[LayerEntry] = []
    tape = tf.GradientTape(watch_accessed_variables=False)

    def generator(layer, args, kwargs):
        kwargs = dict(kwargs)
        if training is not None and getattr(layer, "_expects_training_arg", False):
            kwargs["training"] = training
        if layer.trainable_variables:
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
    factors = clip_norm / tf.maximum(norms, clip_norm)
    if k > 1:  # every row of a group gets its group's clip factor
        factors = tf.repeat(factors, k)
    weights = tf.stop_gradient(factors * example_mask)
    by_var = {}
    for e, g in zip(entries, per_entry):
        for var, grad in zip(e.variables, e.grad_fn(g, weights)):
            if var.ref() in by_var:
                raise NotImplementedError(f"variable {var.name} is used by two layers (tied weights)")
            by_var[var.ref()] = grad
    missing = [v.name for v in model.trainable_variables if v.ref() not in by_var]
    if missing:
        raise NotImplementedError(f"no clipped gradient for variables {missing}")
    return [by_var[v.ref()] for v in model.trainable_variables], losses, norms, outputs
