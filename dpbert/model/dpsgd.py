"""DP-SGD for Keras functional models: fast per-example clipping, ONE noise draw per logical batch.

Mechanism (one optimizer step, logical batch β sampled by ``dpbert.model.sampling``)::

    g_i   = ∇θ ℓ_i · min(1, C / ‖∇θ ℓ_i‖)                 (per-example clipping, ‖g_i‖ ≤ C)
    S     = Σ_{i∈β} g_i                                     (sum of clipped gradients)
    ĝ     = (S + z) / B,   z ~ N(0, σ² C² I)                (one Gaussian draw; B = E|β| public)
    θ    ← AdamW(θ, ĝ)

``ℓ_i`` is example i's own loss (for MLM: the mean cross-entropy over ITS masked positions, so the
per-example loss vector has shape ``[b]``). Padded rows (example mask 0) have ℓ_i = 0, hence
g_i = 0, and are not counted. Adding or removing one example changes S by at most C in L2, so
S + z is the Gaussian mechanism with noise multiplier σ, and the accountant charges σ per step.

Where the noise goes — derivation (P replicas, T accumulation micro-steps)
--------------------------------------------------------------------------
The logical batch is split into P·T shards (p, t); S = Σ_p Σ_t S_{p,t}.

1. tensorflow-privacy's Keras optimizers (and the paper's code) add z_{p,t} ~ N(0, σ²C²I) in
   every shard. The z_{p,t} are independent, so Σ z_{p,t} ~ N(0, P·T·σ²C²I): the released sum
   carries noise multiplier σ√(P·T) (their docstring's ``noise_multiplier *
   sqrt(gradient_accumulation_steps)``), i.e. √(P·T) times the noise the accountant is told: the
   reported ε is then pessimistic, and the model pays √(P·T)× the noise in utility.
2. Here no shard adds noise. Each replica accumulates Σ_t S_{p,t} in a replica-local
   (SyncOnRead) buffer, the buffers are all-reduced with SUM (S on every replica), and then every
   replica adds THE SAME draw z ~ N(0, σ²C²I): ``tf.random.stateless_normal`` with a seed that
   depends only on (secret base seed, DP step counter): one draw over every trained coordinate,
   split into the variables in order (``_draw_noise``), identical on all replicas. The released
   sum is S + z: one draw per logical batch, std σC per coordinate.
3. Divided by the public constant B, the update's per-coordinate noise std is σC/B (measured by
   ``dpbert.model.noise_check``), not σC√(P·T)/B.
4. Equivalent formulation (not used): each shard adds an independent N(0, σ²C²/(P·T)) draw; the
   sum of P·T of them is again N(0, σ²C²).
5. ``noise_mode="paper"`` reproduces (1) on purpose for comparison: the single draw is scaled by
   √(P·T) (same distribution as P·T independent σC draws) and ``effective_noise_multiplier``
   reports σ√(P·T), which is what an accountant must then be given.

Across worker processes (``training.strategy: multi_worker``, ``MultiWorkerMirroredStrategy``)
------------------------------------------------------------------------------------------
W processes (R = Σ_w P_w replicas in sync, the all-reduce spans all of them). Worker w holds the
units u with h(u) mod W = w (``sampling.shard_of``: a stable hash of the record id, or of the
patient's own id, so a patient's ≤ k tuples are all on one worker and its ghost norm is the
norm of its whole summed gradient), flips its own units' Poisson coins with q, clips them and
accumulates S_w = Σ_{u∈β_w} g_u. Coins are independent across units whatever worker flips
them, so β = ∪_w β_w is the Poisson sample of the whole dataset at q: the DP event is that of
one process. The SUM all-reduce gives every replica S = Σ_w S_w exactly (bit-identical on all
workers: a ring all-reduce reduces each chunk once and broadcasts it).

Choice made here: the SAME draw z ~ N(0, σ²C²I) added AFTER the SUM on every replica, as in one
process. The workers agree on the noise seed by an all-reduce at construction: replica 0 (on the
chief) contributes its OS-entropy seed, every other replica 0, so the SUM is the chief's seed on
every worker; it lives in a tensor only (never logged, never checkpointed; a resumed run draws a
new one). Then every worker computes z from (seed, dp_step), adds it to the
identical S, divides by B and applies the identical optimizer update: parameters stay
bit-identical on every worker after every step, and the update's noise std is σC/B — not
σC√W/B (each worker its own full-σ draw before the SUM), not WσC/B (the same draw added before
the SUM: Σ_w z = W·z), and with each worker's own seed after the SUM the workers' parameters
would silently diverge. Those three broken placements are the positive controls of the noise
check: test fixtures (``tests/model/broken_mechanisms.py``) that replace the step's hooks
``_sum_replicas`` / ``_add_noise`` / ``_share_noise_seed``; no flag of this module selects them.
The equivalent alternative (independent N(0, σ²C²/R) per replica before the SUM, no shared
secret) was not chosen: it would make a run's noise depend on R, so the same test seed could not
give the same released parameters in every layout, and the run-time noise probe (z = (S+z) − S,
``dpbert.model.integrity``) would need the per-replica parts.

Every worker runs the same number of accumulation rounds per step (``sync_step`` all-reduces the
local round counts and takes the max; a worker with fewer sampled units runs all-padding rounds,
which add exactly 0), because every round and the apply are collective. The same all-reduce is
the write-ahead barrier: the chief enters it only after its ledger entry for the step is on
disk and carries its go/stop flag (budget), so no worker computes a step the chief has not
charged (``dpbert.model.train``). Non-chief workers write nothing to the state directory except
through the chief: their checkpoints go to a temporary directory that is removed at once.

TPU pods (``TPUStrategy``): the step is compiled with a static number of rounds, so the batch
needs a cap (``sampling.poisson_batch_cap``); the guarantee becomes (ε, δ + steps·p_fail). The
noise placement (one seeded draw after the cross-replica SUM) is the same; untested here.

Because a Poisson batch has a random size, the number of micro-steps of a logical step is
whatever the batch needs (``sampling.py``); the noise is still drawn once, at the end.

Per-example clipping path
-------------------------
``clipping="ghost"`` (default; logged once with ``logging.info``): ``dpbert.model.ghost`` — one
forward pass walked with tensorflow-privacy 0.9.0's ``model_forward_pass``, ONE backward pass to
every layer's pre-activation, per-example norms by the ghost-norm trick (or per-layer
instantiation when cheaper), and the clipped sum by book-keeping from the same quantities; no
second backward pass. ``training=True`` is passed to every layer that takes it, so the norms are
those of the very function (dropout masks included) whose gradient is applied.

``clipping="tfp_two_pass"``: the same ghost norms from tensorflow-privacy's own registry
functions for ``Dense``, ``Embedding``, ``EinsumDense``, ``LayerNormalization`` and
``MultiHeadAttention`` (``make_layer_registry``; 0.9.0's ``make_default_layer_registry`` only
registers Dense and Embedding), then a second backward pass of Σ w_i ℓ_i on the same persistent
tape. Kept as an independent cross-check; slower. Unlike
``clip_grads.compute_clipped_gradients_and_outputs`` (two forward passes, the first without
dropout, so the clip bound does not hold for the second) it also uses a single forward pass.

A model with a trainable layer outside the registry, or a variable shared by two layers (tied
weights: per-layer norms would miss the cross term 2⟨g_a, g_b⟩), is refused with an error;
there is no silent slow fallback. ``non_private`` mode (baseline, ε = ∞) skips clipping and
noise and averages over the real examples of the batch.

User-level (patient) DP-SGD (``group_size = k``, ``privacy.unit: patient``)
--------------------------------------------------------------------------
The sampled unit is a patient (Poisson with q = B_patients / n_patients, ``sampling.py``); a
sampled patient contributes up to k of its tuples (rows g·k … g·k + k − 1 of a micro-batch,
missing ones padded with mask 0). The clipped unit is the patient's SUMMED gradient::

    g_u = (Σ_{j≤k} ∇ℓ_{u,j}) · min(1, C / ‖Σ_j ∇ℓ_{u,j}‖)     (‖g_u‖ ≤ C, sum not mean)
    ĝ   = (Σ_{u∈β} g_u + z) / B_patients,   z ~ N(0, σ²C²I)   (the same single draw)

so adding or removing one patient changes the released sum by ≤ C: the step is
PoissonSampled(q_patients, Gaussian(σ)) per patient. Norms come from ``ghost`` per GROUP
(``clipped_gradient_sum(..., group_size=k)``). The per-step diagnostics are per patient too:
loss and accuracy are the patient's mean over its tuples (∈ [0, bound], [0, 1]), ``clipped``
counts patients, ``units`` the patients in the batch — each sensitivity 1 unit, as per tuple.

What is trained (``training.trainable``, ``dpbert.model.trainable``)
--------------------------------------------------------------------
``DPSGDTrainStep(..., selection=)``: only the selection's pieces are trained. ``self.variables``
(accumulators, the noise draw, the optimizer) is aligned with the pieces: a whole variable, or for
a sliced piece (``new_tokens``: the appended rows of the word embedding, the matching columns of
the output layer) a SHADOW variable of the slice's shape, gathered from the model variable
before every apply and scattered back after it. So z ~ N(0, σ²C²I) is drawn over the trained
coordinates only (d = the selection's size), frozen coordinates get no gradient, no noise, no
optimizer state and no weight decay and stay bit-identical, and the per-unit norm is that of the
trained pieces' gradient (``ghost.clipped_gradient_sum(selection=)``). The mechanism per step is
the same Gaussian mechanism with sensitivity C and multiplier σ whatever the set: the accountant
is unchanged.

Compiled step (``jit_compile``, ``training.jit_compile``)
--------------------------------------------------------
The per-replica accumulate (forward, backward, ghost norms, book-keeping, the accumulators'
update) and the release (audit canaries, S + z, division by B, the noise probe, the optimizer,
zeroing the accumulators) are XLA-compiled at the round's fixed shapes; the embedding norm takes
its static-shape form (``ghost.embedding_sqr_norm_static``: no ``UniqueV2``, which a TPU cannot
compile). Outside the compiled functions: every collective (the SUM all-reduce, the probe's
all-reduce, several workers' statistics), with several replicas the optimizer (its apply may
``merge_call``), and THE NOISE DRAW: XLA's ``stateless_normal`` yields another stream for the
same key, so z is drawn by TensorFlow's own kernel from the same (seed, DP step) as the
uncompiled step and handed to the compiled release as an input. The compiled step therefore
releases the same S + z as the uncompiled one (to float rounding), one draw per logical batch.

Dropout under XLA: a stateful random op compiled by XLA ignores TensorFlow's seed and starts
from the same state in every process, so dropout masks would be a PUBLIC function of the batch
slot and of the call count — the slot-keyed mask that one added or removed example shifts for
every later example. The compiled step therefore gives every active ``Dropout`` of the model its
own ``tf.random.Generator`` seeded from OS entropy (a test noise seed: from it), made in the
strategy's scope (a stream per replica) and never checkpointed; the masks are again i.i.d. across
slots and independent of the data, as with the uncompiled step's secret global seed.

Noise drawn ahead (the compiled step, and the uncompiled one on one replica from 2²² trained
coordinates: ``DPSGDConfig.noise_ahead``; private): z depends on (seed, DP step) only,
never on the data, so right after step t's apply the draw of step t + 1 is made into device
buffers (one replica: on a background thread, so it overlaps the host's sampling and masking and
the next rounds; several replicas, compiled: enqueued after the apply). The apply of step t + 1
uses the buffer only when the DP step it was keyed on is the running one (a restore or a replayed step draws inline):
the same z, the same single placement after the SUM, and the noise probe still measures what the
optimizer is handed. The buffers hold the next step's noise: they are never checkpointed or
written anywhere (whoever held them could subtract the next update's noise). They cost one more
copy of the trained pieces in device memory.

Statistics: each round's sums stay on the device and are added there; the training loop reads
them every ``training.stats_every`` steps, several steps' in one transfer (``run_step(read=False)``,
``read_stats``), and the per-unit norms only when asked for (``last_unit_norms``: the run-time
clipping check's steps). Nothing private is decided from them between reads: the step log, the
budget and the noise do not depend on them.

Noise RNG: the base seed comes from OS entropy (``secrets``) unless an explicit test seed is
given (several worker processes: the chief's, shared by an all-reduce, above). The base seed is never logged or checkpointed (a resumed run draws a new one).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import threading
from concurrent import futures
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from tensorflow_privacy.privacy.fast_gradient_clipping import gradient_clipping_utils
from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry as lr
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import dense as dense_fn
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import einsum_dense
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import embedding as embedding_fn
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import layer_normalization
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import multi_head_attention

from dpbert.model import ghost
from dpbert.model import trainable as trainable_lib

log = logging.getLogger(__name__)

NOISE_MODES = ("once", "paper")
CLIPPING_PATHS = ("ghost", "tfp_two_pass")
_LOGGED_PATHS = set()


def _log_path_once(message: str):
    if message not in _LOGGED_PATHS:
        _LOGGED_PATHS.add(message)
        log.info(message)


def make_layer_registry() -> lr.LayerRegistry:
    """Ghost-norm registry with every layer type ``dpbert.model.bert`` uses."""
    registry = lr.LayerRegistry()
    registry.insert(tf_keras.layers.Dense, dense_fn.dense_layer_computation)
    registry.insert(tf_keras.layers.Embedding, embedding_fn.embedding_layer_computation)
    registry.insert(tf_keras.layers.EinsumDense, einsum_dense.einsum_layer_computation)
    registry.insert(tf_keras.layers.LayerNormalization, layer_normalization.layer_normalization_computation)
    registry.insert(tf_keras.layers.MultiHeadAttention, multi_head_attention.multi_head_attention_layer_computation)
    return registry


def check_model_supported(model: tf_keras.Model, registry: Optional[lr.LayerRegistry] = None,
                          selection: Optional[trainable_lib.Selection] = None):
    """Raise unless ghost clipping is exact for ``model``: every layer with a TRAINED variable
    (``selection``; default every trainable variable) registered, no nested model, no variable
    owned by two layers. A frozen layer (no selected variable) is only called, whatever its type."""
    registered = registry.is_elem if registry is not None else ghost.is_registered
    if selection is None:
        selection = trainable_lib.Selection.whole(model.trainable_variables)

    def trained(layer):
        return [v for v in layer.trainable_variables if selection.piece(v) is not None]

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
        if not registered(layer):
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


def _dense(grad):
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def tfp_two_pass_clipped_gradients(model: tf_keras.Model, registry: lr.LayerRegistry, inputs,
                            loss_fn: Callable, example_mask, clip_norm: float, training: bool = True):
    """Sum of per-example clipped gradients for one (micro-)batch, via ghost norms.

    ``loss_fn(model_outputs) -> [b]`` per-example losses. ``example_mask`` ``[b]`` (1 real, 0
    padding). Returns ``(grads, per_example_loss, norms, outputs)``: ``grads`` is the list (in
    ``model.trainable_variables`` order) of Σ_i mask_i·min(1, C/‖∇ℓ_i‖)·∇ℓ_i, ``norms`` the
    unclipped per-example gradient norms ``[b]``.
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
    weights = tf.stop_gradient(clip_norm / tf.maximum(norms, clip_norm) * example_mask)
    with tape:
        weighted = tf.reduce_sum(weights * losses)
    grads = tape.gradient(weighted, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    del tape
    return [_dense(g) for g in grads], losses, norms, outputs


def plain_gradients(model: tf_keras.Model, inputs, loss_fn: Callable, example_mask, training: bool = True,
                    selection: Optional[trainable_lib.Selection] = None):
    """Non-private: Σ_i mask_i ∇ℓ_i (no clipping). Returns ``(grads, per_example_loss, outputs)``,
    ``grads`` aligned with ``selection.pieces`` (default: every trainable variable)."""
    example_mask = tf.cast(example_mask, tf.float32)
    if selection is None:
        selection = trainable_lib.Selection.whole(model.trainable_variables)
    with tf.GradientTape() as tape:
        outputs = model(inputs, training=training)
        losses = loss_fn(outputs) * example_mask
        summed = tf.reduce_sum(losses)
    return selection.gradients(tape, summed), losses, outputs


#: Trained coordinates from which the uncompiled step draws its noise ahead by default (a draw of
#: 2²² normals takes ≈ 20 ms on one CPU core; BERT-base's 1.1·10⁸ take 0.8 s: docs/benchmarks.md).
NOISE_AHEAD_MIN_COORDINATES = 1 << 22


@dataclasses.dataclass(frozen=True)
class DeviceStats:
    """One step's summed statistics, still on the device: ``values[i]`` is ``keys[i]`` (float64)."""

    keys: Tuple[str, ...]
    values: tf.Tensor


def read_stats(steps: Sequence[DeviceStats], extra: Sequence[tf.Tensor] = ()) -> list:
    """Every step's statistics as python floats, and ``extra`` tensors as float64 numpy arrays, in
    ONE device-to-host transfer (one concatenated vector): ``[stats dict per step] + [arrays]``."""
    parts = [s.values for s in steps] + [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in extra]
    if not parts:
        return []
    host = tf.concat(parts, axis=0).numpy()
    out, at = [], 0
    for s in steps:
        n = len(s.keys)
        out.append({k: float(v) for k, v in zip(s.keys, host[at:at + n])})
        at += n
    for t in extra:
        n = int(np.prod(t.shape))
        out.append(host[at:at + n].reshape(t.shape))
        at += n
    return out


@dataclasses.dataclass
class DPSGDConfig:
    """Parameters of the DP-SGD aggregate. ``expected_batch_size`` is the public divisor B."""

    clip_norm: float = 0.01
    noise_multiplier: float = 1.0
    expected_batch_size: float = 64.0
    non_private: bool = False
    #: once (correct: one N(0, σ²C²) draw per logical batch) | paper (σ√(P·T), reported).
    noise_mode: str = "once"
    #: Fixed noise seed: tests only. None = OS entropy.
    noise_seed: Optional[int] = None
    replicas: int = 1
    accumulation_steps: int = 1
    #: ghost (one backward, book-keeping) | tfp_two_pass (tensorflow-privacy registry, 2 backward)
    clipping: str = "ghost"
    #: If set, also sum min(max(ℓ_i, 0), loss_bound) ("loss_clipped_sum"): the bounded-sensitivity
    #: loss that ``dpbert.model.diagnostics`` releases with noise.
    loss_bound: Optional[float] = None
    #: k: rows per clipped unit (user-level DP-SGD: one patient's ≤ k tuples, summed gradient
    #: clipped as one vector). 1 = per-example clipping.
    group_size: int = 1
    #: XLA-compile the per-replica accumulate and the release at fixed shapes (module docstring).
    jit_compile: bool = False
    #: Draw the next step's noise ahead (module docstring). None: always when compiled; uncompiled,
    #: on one replica when the trained pieces hold >= ``NOISE_AHEAD_MIN_COORDINATES`` (below that the
    #: draw costs less than the extra traced function and buffers).
    noise_ahead: Optional[bool] = None

    def __post_init__(self):
        if int(self.group_size) < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.group_size > 1 and self.clipping != "ghost" and not self.non_private:
            raise ValueError("group_size > 1 (user-level clipping) needs clipping = ghost")
        if self.noise_mode not in NOISE_MODES:
            raise ValueError(f"noise_mode must be one of {NOISE_MODES}, got {self.noise_mode!r}")
        if self.clipping not in CLIPPING_PATHS:
            raise ValueError(f"clipping must be one of {CLIPPING_PATHS}, got {self.clipping!r}")
        if self.jit_compile and self.clipping != "ghost" and not self.non_private:
            raise ValueError("jit_compile needs clipping = ghost (tensorflow-privacy's embedding norm is not "
                             "fixed-shape)")
        if not self.non_private:
            if not self.clip_norm > 0:
                raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
            if not self.noise_multiplier > 0:
                raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier}")
        if not self.expected_batch_size > 0:
            raise ValueError(f"expected_batch_size must be > 0, got {self.expected_batch_size}")

    @property
    def effective_noise_multiplier(self) -> float:
        """σ actually carried by the released sum (what an accountant must be given)."""
        if self.non_private:
            return 0.0
        if self.noise_mode == "paper":
            return self.noise_multiplier * math.sqrt(self.replicas * self.accumulation_steps)
        return self.noise_multiplier

    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the noise in the averaged update: σ_eff · C / B."""
        return self.effective_noise_multiplier * self.clip_norm / self.expected_batch_size


@dataclasses.dataclass
class AuditProbe:
    """White-box audit hook (``dpbert.privacy.whitebox_audit``): gradient canaries live on
    ``coordinates`` (flat indices) of trainable variable ``variable_index``. Each step the caller
    passes the sum of the canaries sampled in that step (``run_step(..., canary_sum=...)``); it is
    added to the all-reduced CLIPPED SUM exactly where a real example's clipped gradient goes,
    before the single noise draw and the division by B, and the noisy sum g̃_t on those
    coordinates is kept in ``observed`` for the auditor (before the optimizer, which would
    transform it). ``observed_noiseless`` keeps the same coordinates of the sum BEFORE the noise:
    the noise-off positive control reads it from the same run (a deliberately broken release,
    never the model's update), so the control costs no second training run."""

    variable_index: int
    coordinates: np.ndarray


@dataclasses.dataclass
class NoiseProbe:
    """Run-time noise check hook (``dpbert.model.integrity``): flat ``coordinates`` per trainable
    variable index (a sliced piece's index is that of its shadow). Every step the apply keeps, on
    those coordinates, the clean clipped sum S (``noise_probe_clean``: read from the replica-local
    accumulators and summed over the replicas by a separate all-reduce, audit canaries included)
    and the gradient HANDED TO THE OPTIMIZER (``noise_probe_update``, (S + z)/B), so B·update − S
    is the noise the released update really carried (std σ·C, σ = ``effective_noise_multiplier``)
    wherever and however it was (or was not) added: a bug in the draw, in its scale, its
    placement, its seed (a stuck step counter) or in the divisor shows."""

    coordinates: Dict[int, np.ndarray]

    @property
    def size(self) -> int:
        return int(sum(np.asarray(c).size for c in self.coordinates.values()))

    def groups(self):
        """``[(variable index, int64 coordinates)]`` in the order of the kept vectors (by index)."""
        return [(int(i), np.asarray(c, np.int64).ravel()) for i, c in sorted(self.coordinates.items())
                if np.asarray(c).size]


def _group_mean(values, mask, k: int):
    """[b] per-row values (already × mask) → [b/k] the mean over each group's present rows."""
    return tf.math.divide_no_nan(tf.reduce_sum(tf.reshape(values, [-1, k]), axis=1),
                                 tf.reduce_sum(tf.reshape(mask, [-1, k]), axis=1))


@tf.__internal__.tracking.no_automatic_dependency_tracking
def _use_generator(rng, generator):
    """A Keras layer's random generator switched to ``generator`` (untracked: never in a checkpoint)."""
    rng._generator = generator  # pylint: disable=protected-access
    rng._rng_type = rng.RNG_STATEFUL  # pylint: disable=protected-access
    rng._built = True  # pylint: disable=protected-access


def _entropy_seed() -> int:
    return secrets.randbits(62)


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The strategy's public name (TF's MultiWorkerMirroredStrategy is a CollectiveAllReduceStrategy)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def worker_layout(strategy: Optional[tf.distribute.Strategy] = None):
    """``(W, w)``: the number of worker processes of ``strategy`` and this process's rank in it
    (the chief is rank 0; the rank orders the replicas: global replica id = w·P_local + local id).
    ``(1, 0)`` for every single-process strategy."""
    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return 1, 0
    from tensorflow.python.distribute import multi_worker_util  # pylint: disable=import-outside-toplevel

    spec = resolver.cluster_spec()
    if not spec.jobs:
        return 1, 0
    count = sum(len(spec.job_tasks(job)) for job in ("chief", "worker") if job in spec.jobs)
    return count, int(multi_worker_util.id_in_cluster(spec, resolver.task_type, resolver.task_id))


class DPSGDTrainStep:
    """The distributed train step: clipped sums accumulated over micro-rounds, one noise draw.

    ``prepare_fn(features) -> (model_inputs, targets)`` runs inside the replica; it is
    deterministic: any randomness an example needs (MLM masks) is drawn on the host, keyed by the
    example's own id (``dpbert.model.masking``), never by its slot in the batch — a slot-keyed
    draw would change every later example's input when one example is added or removed.
    ``features`` is an array or a dict of arrays. ``loss_fn(targets, outputs) -> [b]``;
    ``metrics_fn(targets, outputs, example_mask) -> dict of scalar sums`` (optional).

    A logical step is ``run_step(rounds, num_examples)``: ``rounds`` is a list of R ≥ 1 dicts
    ``{"features": array [P, m, ...], "example_mask": array [P, m]}``; round r goes to replica p
    as ``features[p]``. Each round adds its replica's clipped sum to the replica-local
    accumulators (one compiled function); then one compiled ``apply`` all-reduces them, adds the
    noise once, divides by B (private) or by ``num_examples`` (non-private), applies the
    optimizer, zeroes the accumulators and increments ``dp_step``.

    Run-time integrity hooks (``dpbert.model.integrity``): ``clip`` is the clipping path the step
    uses (the brute-force check calls the same one), ``last_unit_norms`` the per-unit norms the
    last step's clipping used, and a ``NoiseProbe`` keeps the sum before the noise and the update
    after it on a few coordinates (the noise the update really carried).
    """

    def __init__(self, model: tf_keras.Model, optimizer, config: DPSGDConfig, *,
                 prepare_fn: Callable, loss_fn: Callable, metrics_fn: Optional[Callable] = None,
                 strategy: Optional[tf.distribute.Strategy] = None, audit_probe: Optional[AuditProbe] = None,
                 noise_probe: Optional[NoiseProbe] = None, selection: Optional[trainable_lib.Selection] = None):
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.strategy = strategy or tf.distribute.get_strategy()
        self._default_strategy = type(self.strategy).__name__ == "_DefaultDistributionStrategy"
        self.prepare_fn = prepare_fn
        self.loss_fn = loss_fn
        self.metrics_fn = metrics_fn
        self.replicas = self.strategy.num_replicas_in_sync
        if self.replicas != config.replicas:
            raise ValueError(f"strategy has {self.replicas} replicas, config says {config.replicas}")
        #: Worker processes and this one's rank (``worker_layout``); the replicas of this process.
        self.workers, self.worker_index = worker_layout(self.strategy)
        self.local_replicas = len(self.strategy.extended.worker_devices) if self.workers > 1 else self.replicas
        if self.workers * self.local_replicas != self.replicas:
            raise ValueError(f"{self.workers} workers x {self.local_replicas} local replicas != {self.replicas}")
        self.registry = make_layer_registry()
        #: What the step trains (``dpbert.model.trainable``): ``self.variables`` is aligned with
        #: its pieces (a sliced piece is a shadow variable of the slice's shape).
        self.selection = selection if selection is not None else \
            trainable_lib.Selection.whole(model.trainable_variables)
        if config.non_private:
            self.clipping_path = "none"
            _log_path_once("dpbert DP-SGD: NON-PRIVATE baseline (no clipping, no noise, epsilon = inf)")
        else:
            self.clipping_path = config.clipping
            if config.clipping == "ghost":
                check_model_supported(model, selection=self.selection)
                detail = "ghost norms + book-keeping (one forward, one backward)"
            else:
                if selection is not None and [p.variable.ref() for p in self.selection.pieces] != \
                        [v.ref() for v in model.trainable_variables]:
                    raise ValueError("clipping = tfp_two_pass trains every variable; use ghost for training.trainable")
                check_model_supported(model, self.registry)
                detail = "tensorflow-privacy registry ghost norms + second backward pass"
            if config.group_size > 1:
                detail += f"; USER-LEVEL: per-patient clipping of the summed gradient of <= {config.group_size} tuples"
            _log_path_once(f"dpbert DP-SGD: per-example clipping path = {config.clipping}: {detail}; "
                           f"noise mode = {config.noise_mode} (one draw per logical batch"
                           f"{'' if config.noise_mode == 'once' else ', scaled by sqrt(P*T)'})")
        seed = config.noise_seed if config.noise_seed is not None else _entropy_seed()
        self._noise_seed = self._share_noise_seed(tf.constant([seed >> 31, seed & 0x7FFFFFFF], dtype=tf.int64))
        with self.strategy.scope():
            # A sliced piece (new_tokens' rows) is optimised as a SHADOW variable of the slice's
            # shape, gathered from its variable before every apply and scattered back after: the
            # optimizer (slots, weight decay) never sees a frozen coordinate, which stays bit-identical.
            self._slices = []
            self.variables = []
            for i, piece in enumerate(self.selection.pieces):
                if piece.axis is None:
                    self.variables.append(piece.variable)
                    continue
                shadow = tf.Variable(tf.zeros(piece.shape, piece.variable.dtype), trainable=False,
                                     name=piece.variable.name.split(":")[0].replace("/", "__") + "__trainable_slice",
                                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                self._slices.append((piece.variable, shadow, tf.constant(piece.nd_indices())))
                self.variables.append(shadow)
            self.dp_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_step",
                                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.accumulators = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"acc_{i}",
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
                for i, v in enumerate(self.variables)]
            # Build the optimizer's slots now (not inside a replica function).
            self.optimizer.build(self.variables)
            self.audit_probe = audit_probe
            if audit_probe is not None:
                coords = np.asarray(audit_probe.coordinates, dtype=np.int64)
                self._probe_index = tf.constant(coords[:, None])
                self.observed = tf.Variable(tf.zeros([coords.size], tf.float32), trainable=False,
                                            name="audit_observed",
                                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                self.observed_noiseless = tf.Variable(
                    tf.zeros([coords.size], tf.float32), trainable=False, name="audit_observed_noiseless",
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self._setup_noise_probe(noise_probe)
        #: With an ``AuditProbe``: the canary sum of the NEXT ``run_step`` that is given none, set by
        #: the audit's sampler once it knows which canary units the step drew (``run_step``
        #: consumes it and resets it to None).
        self.next_canary_sum: Optional[np.ndarray] = None
        self._device_norms: list = []
        self._unit_norms: Optional[list] = None
        self._staged = threading.local()
        self._ahead: Optional[futures.Future] = None
        self._setup_jit()
        self._accumulate_fn = tf.function(self._accumulate, autograph=False)
        self._apply_fn = tf.function(self._apply, autograph=False)

    def _secret_dropout(self):
        """Every active Dropout on its own secret generator (module docstring, dropout under XLA)."""
        layers = [layer for layer in self.model._flatten_layers(include_self=False)  # pylint: disable=protected-access
                  if isinstance(layer, tf_keras.layers.Dropout) and float(layer.rate) > 0]
        for i, layer in enumerate(layers):
            seed = _entropy_seed() if self.config.noise_seed is None else int(self.config.noise_seed) * 7919 + i
            with self.strategy.scope():
                generator = tf.random.Generator.from_seed(seed, alg="philox")
            _use_generator(layer._random_generator, generator)  # pylint: disable=protected-access

    @property
    def last_unit_norms(self) -> list:
        """The per-unit gradient norms the clipping used in the last ``run_step``, one array
        ``[P, units per replica]`` per round (tuple: per row; patient: per group of k slots),
        read from the device on first use after the step."""
        if self._unit_norms is None:
            self._unit_norms = [np.stack([np.asarray(x) for x in norms]) for norms in self._device_norms]
        return self._unit_norms

    def replay_accumulate(self, round_batch, round_index: int = 0) -> np.ndarray:
        """The step's OWN accumulate (the function ``run_step`` calls: ``_compute``, its clipping,
        the accumulators) on one round, with no noise and no apply: the accumulators then hold the
        round's clipped sum, for the run-time check (``dpbert.model.integrity``) to read before
        :meth:`clear_accumulators`. Returns the unit norms ``[P, units]`` it used. Call it between
        steps only (the accumulators are zero there); several workers: every worker must call it
        (the round's statistics are a collective)."""
        _, norms = self._accumulate_fn(self._distribute(round_batch), tf.constant(int(round_index), tf.int64))
        return np.stack([np.asarray(x) for x in norms])

    def clear_accumulators(self):
        """Every replica's accumulators to zero (after :meth:`replay_accumulate`; no collective)."""
        for acc in self.accumulators:
            for part in self.strategy.experimental_local_results(acc):
                part.assign(tf.zeros_like(part))

    def _setup_jit(self):
        """The compiled functions of ``jit_compile``, and the noise drawn ahead: compiled, or
        uncompiled on one replica (module docstring)."""
        self._noise_buffers = None
        if self.config.jit_compile:
            self._compiled = {}
            self._secret_dropout()
        ahead = self.config.noise_ahead
        if ahead is None:
            ahead = self.config.jit_compile or sum(
                v.shape.num_elements() for v in self.variables) >= NOISE_AHEAD_MIN_COORDINATES
        if self.config.non_private or not ahead or not (self.config.jit_compile or self.replicas == 1):
            return
        local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        with self.strategy.scope():
            self._noise_buffers = [tf.Variable(tf.zeros(v.shape, v.dtype), name=f"noise_ahead_{i}", **local)
                                   for i, v in enumerate(self.variables)]
            self._noise_buffer_step = tf.Variable(tf.constant(-1, tf.int64), name="noise_ahead_step", **local)
        self._draw_ahead_fn = tf.function(
            lambda: self.strategy.run(self._replica_draw_ahead), autograph=False)
        # One replica: a thread (the draw overlaps the host's work); several: enqueued in order.
        self._ahead_pool = futures.ThreadPoolExecutor(1, thread_name_prefix="dpbert-noise") \
            if self.replicas == 1 else None

    def _setup_noise_probe(self, noise_probe: Optional["NoiseProbe"]):
        """The probe's gather indices and its two kept vectors (``NoiseProbe``); where audit
        canaries land on probe coordinates, their positions (the clean sum includes them)."""
        self.noise_probe = noise_probe
        self._canary_in_probe = None
        if noise_probe is None:
            return
        for i, c in noise_probe.coordinates.items():
            if not 0 <= int(i) < len(self.variables) or (np.asarray(c).size and (
                    np.min(c) < 0 or np.max(c) >= self.variables[int(i)].shape.num_elements())):
                raise ValueError(f"noise probe coordinates out of range for variable {i}")
        groups = noise_probe.groups()
        self._noise_probe_index = [(i, tf.constant(c[:, None])) for i, c in groups]
        if self.audit_probe is not None:
            offset = sum(c.size for i, c in groups if i < self.audit_probe.variable_index)
            coords = dict(groups).get(self.audit_probe.variable_index, np.zeros(0, np.int64))
            canary = np.asarray(self.audit_probe.coordinates, np.int64)
            _, in_probe, in_canary = np.intersect1d(coords, canary, return_indices=True)
            if in_probe.size:
                self._canary_in_probe = (tf.constant((offset + in_probe)[:, None].astype(np.int64)),
                                         tf.constant(in_canary.astype(np.int64)))
        self.noise_probe_clean, self.noise_probe_update = (
            tf.Variable(tf.zeros([noise_probe.size], tf.float32), trainable=False, name=name,
                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            for name in ("noise_probe_clean", "noise_probe_update"))

    # ----------------------------------------------------------------- replica computations
    def clip(self, inputs, loss_fn: Callable, example_mask, training: bool = True):
        """The configured clipping path on one replica's micro-batch: ``(grads, losses, norms,
        outputs)`` (``ghost.clipped_gradient_sum`` or ``tfp_two_pass_clipped_gradients``). The
        step and the run-time clipping check (``dpbert.model.integrity``) both call this."""
        if self.config.clipping == "ghost":
            grads, losses, norms, outputs = ghost.clipped_gradient_sum(
                self.model, inputs, loss_fn, example_mask, self.config.clip_norm, training=training,
                group_size=int(self.config.group_size), selection=self.selection,
                static_shapes=self.config.jit_compile)
            return [_dense(g) for g in grads], losses, norms, outputs
        return tfp_two_pass_clipped_gradients(self.model, self.registry, inputs, loss_fn, example_mask,
                                              self.config.clip_norm, training=training)

    def _compute(self, batch, round_index):
        example_mask = tf.cast(batch["example_mask"], tf.float32)
        inputs, targets = self.prepare_fn(batch["features"])
        loss_fn = lambda outputs: self.loss_fn(targets, outputs)  # noqa: E731
        k = int(self.config.group_size)
        # A unit (tuple, or patient of k slots) is in the batch when any of its slots is.
        unit_mask = example_mask if k == 1 else tf.reduce_max(tf.reshape(example_mask, [-1, k]), axis=1)
        if self.config.non_private:
            grads, losses, outputs = plain_gradients(self.model, inputs, loss_fn, example_mask,
                                                     selection=self.selection)
            clipped = tf.constant(0.0)
            norms = tf.zeros_like(unit_mask)
        else:
            grads, losses, norms, outputs = self.clip(inputs, loss_fn, example_mask)
            clipped = tf.reduce_sum(tf.cast(norms > self.config.clip_norm, tf.float32) * unit_mask)
        stats = {"loss_sum": tf.reduce_sum(losses), "examples": tf.reduce_sum(example_mask),
                 "clipped": clipped, "units": tf.reduce_sum(unit_mask)}
        if self.config.loss_bound is not None:
            bounded = tf.clip_by_value(losses, 0.0, float(self.config.loss_bound)) * example_mask
            # Per unit: a patient's mean over its own tuples (still in [0, bound]).
            stats["loss_clipped_sum"] = tf.reduce_sum(bounded) if k == 1 else tf.reduce_sum(
                _group_mean(bounded, example_mask, k))
        if self.metrics_fn is not None:
            if k == 1:
                stats.update(self.metrics_fn(targets, outputs, example_mask))
            else:
                stats.update(self.metrics_fn(targets, outputs, example_mask, group_size=k))
        return grads, stats, norms

    def _replica_accumulate(self, batch, round_index):
        grads, stats, norms = self._compute(batch, round_index)
        for acc, g in zip(self.accumulators, grads):
            acc.assign_add(g)
        return stats, norms

    def _draw_noise(self):
        """THE draw z ~ N(0, σ²C²I) of this step, one tensor per trained piece: ONE stateless normal
        over every trained coordinate, keyed by (shared seed, DP step) only and split into the
        pieces in order, so identical on every replica and worker. One kernel, not one per piece:
        each stateless draw traces ~50 graph ops (Philox key scrambling), a second per 40 pieces."""
        step_seed = tf.random.experimental.stateless_fold_in(self._noise_seed, self.dp_step.read_value())
        std = self.config.effective_noise_multiplier * self.config.clip_norm
        sizes = [int(np.prod(v.shape)) for v in self.variables]
        flat = tf.random.stateless_normal([sum(sizes)], step_seed, stddev=std, alg="philox")
        return [tf.cast(tf.reshape(z, v.shape), v.dtype) for z, v in zip(tf.split(flat, sizes), self.variables)]

    def _share_noise_seed(self, seed):
        """One seed for every worker: the chief's (replica 0), shared by an all-reduce in which every
        other replica contributes 0. Held in a tensor only, never logged or stored."""
        return self._from_replica_zero(seed) if self.workers > 1 else seed

    def _all_reduce_sum(self, values):
        if self.replicas > 1:
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)
        return values

    def _sum_replicas(self, grads):
        """S: the replica-local clipped sums, all-reduced with SUM (identical on every replica)."""
        return self._all_reduce_sum(grads)

    def _noise(self):
        """This step's z: the draw staged for the compiled release (made outside it), else drawn here."""
        staged = getattr(self._staged, "noise", None)
        return staged if staged is not None else self._draw_noise()

    def _add_noise(self, grads):
        """S + z, after the SUM: the same single draw on every replica (module docstring)."""
        return [g + z for g, z in zip(grads, self._noise())]

    def _xla(self, fn):
        """``fn`` XLA-compiled, one function per replica: an XLA cluster runs on one device, so a
        trace capturing one replica's variables must not be shared with another replica."""
        replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        key = (fn.__name__, None if replica is None else int(replica))
        if key not in self._compiled:
            self._compiled[key] = tf.function(fn, jit_compile=True, autograph=False)
        return self._compiled[key]

    def _replica_draw_ahead(self):
        """The draw of the step ``dp_step`` holds now (after an apply: the next one), into the buffers."""
        for buffer, z in zip(self._noise_buffers, self._draw_noise()):
            buffer.assign(z)
        self._noise_buffer_step.assign(self.dp_step.read_value())

    def _noise_for_apply(self):
        """The buffers when they were drawn for this very DP step, else a draw now (same z)."""
        fresh = tf.equal(self._noise_buffer_step.read_value(), self.dp_step.read_value())
        return tf.cond(fresh, lambda: [b.read_value() for b in self._noise_buffers], self._draw_noise)

    def _replica_apply(self, denominator, canary_sum):
        grads = [acc.read_value() for acc in self.accumulators]
        clean = None
        if self.noise_probe is not None:
            # The clean clipped sum S on the probe's coordinates, read from the accumulators and
            # summed over the replicas by its own small all-reduce: whatever the step below does to
            # the sum (noise before the SUM, no noise, ...), B·update − S is the noise it carried.
            clean = self._all_reduce_sum(self._noise_probe_gather(grads))
        grads = self._sum_replicas(grads)
        if not self.config.jit_compile:  # one replica: the buffers drawn ahead, if fresh (else drawn now)
            noise = self._noise_for_apply() if self._noise_buffers is not None else None
            self._release_staged(grads, noise, denominator, canary_sum, clean, apply=True)
            return tf.constant(0.0)
        noise = [] if self.config.non_private else (
            self._noise_for_apply() if self._noise_buffers is not None else self._draw_noise())
        # One replica: the whole release is compiled. Several: writes to replica-synchronised
        # variables (probes, optimizer) merge_call, so the compiled part returns them instead.
        out = self._xla(self._release_staged)(grads, noise, denominator, canary_sum, clean, self.replicas == 1)
        if self.replicas > 1:
            grads, kept = out
            self._keep(kept)
            self._apply_update(grads)
        return tf.constant(0.0)

    def _release_staged(self, grads, noise, denominator, canary_sum, clean, apply: bool):
        """``_release`` with the noise drawn outside (the compiled release's body)."""
        self._staged.noise = list(noise) if noise else None
        try:
            return self._release(grads, denominator, canary_sum, clean, apply)
        finally:
            self._staged.noise = None

    def _release(self, grads, denominator, canary_sum, clean, apply: bool):
        """``apply``: the released update applied, the probes kept, the accumulators zeroed (returns
        0); else ``(update, probe values)`` returned (``_released``)."""
        grads, kept = self._released(grads, denominator, canary_sum, clean)
        if not apply:
            return grads, kept
        self._keep(kept)
        self._apply_update(grads)
        return tf.constant(0.0)

    def _released(self, grads, denominator, canary_sum, clean):
        """Audit canaries, S + z (private), ÷ the divisor: ``(update, {probe variable: value})``."""
        kept = {}
        if self.audit_probe is not None:
            # Audit canaries join the clipped sum like real examples (before the one noise draw).
            i = self.audit_probe.variable_index
            flat = tf.tensor_scatter_nd_add(tf.reshape(grads[i], [-1]), self._probe_index, canary_sum)
            grads[i] = tf.reshape(flat, tf.shape(grads[i]))
            kept["observed_noiseless"] = tf.gather_nd(flat, self._probe_index)
            if clean is not None and self._canary_in_probe is not None:
                clean = tf.tensor_scatter_nd_add(clean, self._canary_in_probe[0],
                                                 tf.gather(canary_sum, self._canary_in_probe[1]))
        if not self.config.non_private:
            grads = self._add_noise(grads)
        if self.audit_probe is not None:
            kept["observed"] = tf.gather_nd(tf.reshape(grads[self.audit_probe.variable_index], [-1]),
                                            self._probe_index)
        grads = [g / tf.cast(denominator, g.dtype) for g in grads]
        if clean is not None:  # what the optimizer is handed, on the probe's coordinates
            kept["noise_probe_clean"] = clean
            kept["noise_probe_update"] = self._noise_probe_gather(grads)
        return grads, kept

    def _keep(self, kept):
        for name in sorted(kept):
            getattr(self, name).assign(kept[name])

    def _apply_update(self, grads):
        self.optimizer.apply_gradients(zip(grads, self.variables), skip_gradients_aggregation=True)
        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))

    def _noise_probe_gather(self, grads):
        return tf.concat([tf.gather_nd(tf.reshape(grads[i], [-1]), index) for i, index in self._noise_probe_index],
                         axis=0)

    # ----------------------------------------------------------------- cross-replica functions
    def _accumulate(self, batch, round_index):
        def accumulate(batch, round_index):
            if self.config.jit_compile:
                return self._xla(self._replica_accumulate)(batch, round_index)
            return self._replica_accumulate(batch, round_index)

        if self.workers > 1:  # the stats summed over every worker's replicas (a collective in the round)
            def replica_fn(batch, round_index):
                stats, norms = accumulate(batch, round_index)
                return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, stats), norms

            stats, norms = self.strategy.run(replica_fn, args=(batch, round_index))
            return (self.strategy.experimental_local_results(stats)[0],
                    self.strategy.experimental_local_results(norms))
        stats, norms = self.strategy.run(accumulate, args=(batch, round_index))
        return (self.strategy.reduce(tf.distribute.ReduceOp.SUM, stats, axis=None),
                self.strategy.experimental_local_results(norms))

    def _apply(self, denominator, canary_sum):
        for variable, shadow, index in self._slices:  # the slice's current values (e.g. after a restore)
            shadow.assign(tf.reshape(tf.gather_nd(variable, index), shadow.shape))
        self.strategy.run(self._replica_apply, args=(denominator, canary_sum))
        for variable, shadow, index in self._slices:  # only the slice's coordinates are written
            variable.scatter_nd_update(index, tf.reshape(shadow.read_value(), [-1]))
        self.dp_step.assign_add(1)

    def _from_replica_zero(self, value):
        """``value`` as held by global replica 0 (the chief), on every worker (an all-reduce SUM in
        which every other replica contributes zeros)."""
        def replica_fn(x):
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                  tf.where(tf.equal(ctx.replica_id_in_sync_group, 0), x, tf.zeros_like(x)))

        out = tf.function(lambda x: self.strategy.run(replica_fn, args=(x,)), autograph=False)(value)
        return tf.identity(self.strategy.experimental_local_results(out)[0])

    def sync_step(self, local_rounds: int, go: bool = True):
        """Agree across worker processes before a step: ``(rounds, go)`` — the MAX of every
        worker's round count (every worker must run as many collective rounds) and the chief's
        go flag (False: the chief refused the step, e.g. over budget). It is a collective all
        workers must enter, so it is also the barrier behind the chief's write-ahead ledger entry.
        One process: ``(local_rounds, go)``, nothing exchanged."""
        if self.workers == 1:
            return int(local_rounds), bool(go)
        fn = getattr(self, "_sync_fn", None)
        if fn is None:
            size = self.replicas + 1

            def replica_fn(rounds, flag):
                ctx = tf.distribute.get_replica_context()
                rid = tf.cast(ctx.replica_id_in_sync_group, tf.int64)
                vec = tf.one_hot(rid, size, dtype=tf.int64) * rounds + tf.one_hot(
                    size - 1, size, dtype=tf.int64) * tf.where(tf.equal(rid, 0), flag, tf.zeros_like(flag))
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, vec)

            fn = self._sync_fn = tf.function(
                lambda r, f: self.strategy.run(replica_fn, args=(r, f)), autograph=False)
        out = self.strategy.experimental_local_results(
            fn(tf.constant(int(local_rounds), tf.int64), tf.constant(int(bool(go)), tf.int64)))[0].numpy()
        return int(out[:-1].max()), bool(out[-1])

    @staticmethod
    def padding_round(like: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """An all-padding round shaped like ``like`` (zeros, example mask 0: adds exactly 0)."""
        return {"features": tf.nest.map_structure(lambda a: np.zeros_like(np.asarray(a)), like["features"]),
                "example_mask": np.zeros_like(np.asarray(like["example_mask"], np.float32))}

    # ----------------------------------------------------------------- host API
    def _distribute(self, round_batch):
        features = tf.nest.map_structure(np.asarray, round_batch["features"])
        mask = np.asarray(round_batch["example_mask"], dtype=np.float32)
        local = self.local_replicas
        if any(a.shape[0] != local for a in tf.nest.flatten(features)) or mask.shape[0] != local:
            raise ValueError(f"round arrays must have a leading replica axis of {local} (this process's replicas)")

        def replica(p):
            return {"features": tf.nest.map_structure(lambda a: tf.constant(a[p]), features),
                    "example_mask": tf.constant(mask[p])}

        if self._default_strategy:
            return replica(0)
        # Global replica id = worker rank · local replicas + local id (one process: the id itself).
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: replica(ctx.replica_id_in_sync_group % local))

    def distribute(self, round_batch):
        """One round ``{"features": [P, m, ...], "example_mask": [P, m]}`` as the step's per-replica
        input (replica p gets ``[p]``)."""
        return self._distribute(round_batch)

    def run_step(self, rounds: Sequence[Dict[str, np.ndarray]], num_examples: Optional[float] = None,
                 canary_sum: Optional[np.ndarray] = None, read: bool = True):
        """One logical DP-SGD step over ``rounds`` (R ≥ 1). Returns summed stats (python floats);
        ``read=False``: a :class:`DeviceStats` left on the device (``read_stats`` reads several
        steps' at once: ``training.stats_every``).

        ``canary_sum``: with an ``AuditProbe``, the sum of this step's sampled audit canaries on
        the probe's coordinates (zeros when none was sampled); None takes ``next_canary_sum``."""
        if not rounds:
            raise ValueError("a logical step needs at least one (possibly all-padding) round")
        if self.config.non_private:
            if num_examples is None:
                num_examples = float(sum(np.sum(r["example_mask"]) for r in rounds))
            denominator = max(float(num_examples), 1.0)
        else:
            denominator = float(self.config.expected_batch_size)
        totals: Dict[str, tf.Tensor] = {}
        denominator_t = tf.constant(denominator, tf.float32)
        self._device_norms, self._unit_norms = [], None
        for r, round_batch in enumerate(rounds):
            stats, norms = self._accumulate_fn(self._distribute(round_batch), tf.constant(r, tf.int64))
            self._device_norms.append(norms)  # on the device until asked for (last_unit_norms)
            for key, value in stats.items():  # summed on the device, in float64 (as python floats were)
                value = tf.cast(value, tf.float64)
                totals[key] = totals[key] + value if key in totals else value
        if canary_sum is None and self.next_canary_sum is not None:
            canary_sum, self.next_canary_sum = self.next_canary_sum, None
        if self.audit_probe is not None:
            size = int(self._probe_index.shape[0])
            canary = np.zeros(size, np.float32) if canary_sum is None else np.asarray(canary_sum, np.float32)
            if canary.shape != (size,):
                raise ValueError(f"canary_sum must have shape ({size},), got {canary.shape}")
        elif canary_sum is not None:
            raise ValueError("canary_sum needs an AuditProbe")
        else:
            canary = np.zeros(0, np.float32)
        if self._ahead is not None:  # the next draw must be in its buffers before this apply reads them
            self._ahead.result()
            self._ahead = None
        self._apply_fn(denominator_t, tf.constant(canary))
        self._draw_ahead()
        keys = tuple(sorted(totals))
        device = DeviceStats(keys, tf.stack([totals[k] for k in keys]) if keys else tf.zeros([0], tf.float64))
        return device if not read else read_stats([device])[0]

    def _draw_ahead(self):
        """Start the next step's draw (compiled private step; module docstring)."""
        if self._noise_buffers is None:
            return
        if self._ahead_pool is not None:
            self._ahead = self._ahead_pool.submit(self._draw_ahead_fn)
        else:
            self._draw_ahead_fn()
