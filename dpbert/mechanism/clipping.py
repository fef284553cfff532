"""Per-unit clipping for the Gaussian sum mechanism (``dpbert.mechanism.gaussian``).

A clipping path returns, for one replica's micro-batch, Σ_u w_u·∇ℓ_u per trained piece (w_u =
min(1, C/‖∇ℓ_u‖), or the mechanism's ``clip_factors`` of the same norms under normalized
clipping), the per-row losses, the unclipped per-unit norms and the model's outputs:

* ``ghost`` (the default, the trainer's): ``dpbert.mechanism.ghost`` — one forward pass, ONE
  backward pass, ghost norms and book-keeping. The model layer hands it in as a
  :class:`ClippingPath` (this package sits below ``dpbert.engine``).
* ``tfp_two_pass``: the same norms from tensorflow-privacy's registry functions
  (``make_layer_registry``: Dense, Embedding, EinsumDense, LayerNormalization and
  MultiHeadAttention), then a second backward pass of Σ w_i ℓ_i on the same persistent tape; a
  single forward pass, so the clip bound holds for the gradient applied. An independent
  cross-check; slower; every variable trained.

A model with a trained layer outside the registry, or a variable shared by two layers (per-layer
norms would miss the cross term 2⟨g_a, g_b⟩), is refused (``check_model_supported``); there is no
silent slow fallback. ``plain_gradients``: the non-private baseline's unclipped sum.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf
import tf_keras
from tensorflow_privacy.privacy.fast_gradient_clipping import gradient_clipping_utils
from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry as lr
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import dense as dense_fn
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import einsum_dense
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import embedding as embedding_fn
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import layer_normalization
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import multi_head_attention

CLIPPING_PATHS = ("ghost", "tfp_two_pass")


@dataclasses.dataclass(frozen=True)
class ClippingPath:
    """The ghost-norm clipping of the model layer, as the mechanism calls it.

    ``clipped_sum(model, inputs, loss_fn, example_mask, clip_norm, *, training, group_size,
    selection, static_shapes[, clip_factors]) -> (grads, losses, norms, outputs)``
    (``ghost.clipped_gradient_sum``);
    ``is_registered(layer) -> bool``: the layer has an exact per-unit norm; ``whole(variables)``:
    the selection that trains every variable (``trainable.Selection.whole``)."""

    clipped_sum: Callable
    is_registered: Callable
    whole: Callable


def make_layer_registry() -> lr.LayerRegistry:
    """tensorflow-privacy registry with every layer type ``dpbert.network.bert`` uses."""
    registry = lr.LayerRegistry()
    registry.insert(tf_keras.layers.Dense, dense_fn.dense_layer_computation)
    registry.insert(tf_keras.layers.Embedding, embedding_fn.embedding_layer_computation)
    registry.insert(tf_keras.layers.EinsumDense, einsum_dense.einsum_layer_computation)
    registry.insert(tf_keras.layers.LayerNormalization, layer_normalization.layer_normalization_computation)
    registry.insert(tf_keras.layers.MultiHeadAttention, multi_head_attention.multi_head_attention_layer_computation)
    return registry


def check_model_supported(model: tf_keras.Model, is_registered: Callable, selection=None):
    """Raise unless per-layer clipping is exact for ``model``: every layer with a TRAINED variable
    (``selection``; default every trainable variable) has ``is_registered(layer)``, no nested
    model, no variable owned by two layers. A frozen layer is only called, whatever its type."""
    def trained(layer):
        return [v for v in layer.trainable_variables if selection is None or selection.piece(v) is not None]

    calls = {}
    for nodes in model._nodes_by_depth.values():  # pylint: disable=protected-access
        for node in nodes:
            if not node.is_input and trained(node.layer):
                calls[node.layer.name] = calls.get(node.layer.name, 0) + 1
    shared = sorted(name for name, count in calls.items() if count > 1)
    if shared:
        raise NotImplementedError(f"layers {shared} are called more than once in the model (shared "
                                  f"weights): ghost norms would miss the cross terms")
    owners = {}
    for layer in model.layers:
        if not trained(layer):
            continue
        if isinstance(layer, tf_keras.Model):
            raise NotImplementedError(f"nested model {layer.name!r}: flatten it for ghost clipping")
        if not is_registered(layer):
            raise NotImplementedError(
                f"layer {layer.name!r} ({type(layer).__name__}) has trainable weights but no fast "
                f"clipping registry function; refusing to fall back to a slow path")
        for var in trained(layer):
            other = owners.setdefault(var.ref(), layer.name)
            if other != layer.name:
                raise NotImplementedError(
                    f"variable {var.name} is shared by layers {other!r} and {layer.name!r} (tied "
                    f"weights): ghost norms would be wrong")


def per_example_mlm_loss(masked_labels, logits, masked_weights) -> tf.Tensor:
    """Mean cross-entropy over each example's masked positions: shape ``[b]`` (0 if none)."""
    labels = tf.where(masked_weights > 0, masked_labels, tf.zeros_like(masked_labels))
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    weights = tf.cast(masked_weights, xent.dtype)
    return tf.math.divide_no_nan(tf.reduce_sum(xent * weights, axis=1), tf.reduce_sum(weights, axis=1))


def group_mean(values, mask, k: int):
    """[b] per-row values (already × mask) → [b/k] the mean over each group's present rows."""
    return tf.math.divide_no_nan(tf.reduce_sum(tf.reshape(values, [-1, k]), axis=1),
                                 tf.reduce_sum(tf.reshape(mask, [-1, k]), axis=1))


def dense(grad):
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _registry_generator(tape, registry, training):
    def generator(layer, args, kwargs):
        kwargs = dict(kwargs)
        if training is not None and getattr(layer, "_expects_training_arg", False):
            kwargs["training"] = training
        if layer.trainable_variables:
            if not registry.is_elem(layer):
                raise NotImplementedError(
                    f"layer {layer.name!r} ({type(layer).__name__}) is not in the fast clipping "
                    f"registry")
            base_vars, outputs, sqr_norm_fn = registry.lookup(layer)(layer, args, kwargs, tape, None)
            return outputs, (base_vars, sqr_norm_fn)
        return layer(*args, **kwargs), None
    return generator


def tfp_two_pass_clipped_gradients(model: tf_keras.Model, registry: lr.LayerRegistry, inputs,
                                   loss_fn: Callable, example_mask, clip_norm: float, training: bool = True,
                                   clip_factors: Optional[Callable] = None):
    """Sum of per-example clipped gradients for one (micro-)batch, via ghost norms.

    ``loss_fn(model_outputs) -> [b]`` per-example losses. ``example_mask`` ``[b]`` (1 real, 0
    padding). Returns ``(grads, per_example_loss, norms, outputs)``: ``grads`` is the list (in
    ``model.trainable_variables`` order) of Σ_i mask_i·w_i·∇ℓ_i, w_i = min(1, C/‖∇ℓ_i‖) or
    ``clip_factors(norms)`` (normalized clipping), ``norms`` the unclipped per-example gradient
    norms ``[b]``.
    """
    variables = model.trainable_variables
    example_mask = tf.cast(example_mask, tf.float32)
    tape = tf.GradientTape(persistent=True)
    with tape:
        outputs, generated = gradient_clipping_utils.model_forward_pass(
            model, inputs, generator_fn=_registry_generator(tape, registry, training))
        losses = loss_fn(outputs)
        if losses.shape.rank != 1:
            raise ValueError(f"per-example loss must have shape [b], got {losses.shape}")
        losses = losses * example_mask
        summed = tf.reduce_sum(losses)
    generated = [g for g in generated if g is not None]
    base_vars = [g[0] for g in generated]
    base_grads = tape.gradient(summed, base_vars, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    sqr_norms = tf.add_n([fn(grad) for (_, fn), grad in zip(generated, base_grads)])
    norms = tf.sqrt(tf.maximum(sqr_norms, 0.0))
    factors = clip_norm / tf.maximum(norms, clip_norm) if clip_factors is None else clip_factors(norms)
    weights = tf.stop_gradient(factors * example_mask)
    with tape:
        weighted = tf.reduce_sum(weights * losses)
    grads = tape.gradient(weighted, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    del tape
    return [dense(g) for g in grads], losses, norms, outputs


def plain_gradients(model: tf_keras.Model, inputs, loss_fn: Callable, example_mask, training: bool = True,
                    selection=None):
    """Non-private: Σ_i mask_i ∇ℓ_i (no clipping). Returns ``(grads, per_example_loss, outputs)``,
    ``grads`` aligned with ``selection.pieces`` (default: every trainable variable, densified)."""
    example_mask = tf.cast(example_mask, tf.float32)
    with tf.GradientTape() as tape:
        outputs = model(inputs, training=training)
        losses = loss_fn(outputs) * example_mask
        summed = tf.reduce_sum(losses)
    if selection is not None:
        return selection.gradients(tape, summed), losses, outputs
    grads = tape.gradient(summed, model.trainable_variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [tf.convert_to_tensor(g) for g in grads], losses, outputs


def checked_path(config, model: tf_keras.Model, selection, ghost: Optional[ClippingPath],
                 explicit_selection: bool) -> Optional[lr.LayerRegistry]:
    """Refuse a model the configured path cannot clip exactly; the two-pass path's registry (else None)."""
    if config.clipping == "ghost":
        check_model_supported(model, ghost.is_registered, selection=selection)
        return None
    if explicit_selection and [p.variable.ref() for p in selection.pieces] != \
            [v.ref() for v in model.trainable_variables]:
        raise ValueError("clipping = tfp_two_pass trains every variable; use ghost for training.trainable")
    registry = make_layer_registry()
    check_model_supported(model, registry.is_elem)
    return registry
