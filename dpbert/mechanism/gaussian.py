"""THE MECHANISM of one DP-SGD step: clip-and-sum, ONE Gaussian draw, divide by the public B.

One logical batch β (units Poisson-sampled at q by ``dpbert.model.sampling``)::

    g_u = ∇ℓ_u · min(1, C / ‖∇ℓ_u‖)           per-unit clipping, ‖g_u‖ ≤ C   (clipped_sum)
    S   = Σ_{u∈β} g_u                            summed over micro-rounds and replicas
    ĝ   = (S + z) / B,   z ~ N(0, σ²C²I)         one draw (draw_noise, add_noise), B public (normalise)

A unit is one tuple (ℓ_u: the mean cross-entropy over its masked positions) or one patient's
≤ k tuples (``group_size`` k: the SUMMED gradient of its rows is clipped as one vector). Padded
rows have ℓ = 0 and add exactly 0. Adding or removing one unit changes S by at most C in L2
(``sensitivity``), so S + z is the Gaussian mechanism with noise multiplier σ
(``noise_multiplier``: what the accountant charges per step) and the update's per-coordinate
noise std is σC/B (``noise_std``: what the run-time and the CLI noise checks measure).

z is drawn once per logical batch, AFTER the replicas' clipped sums are SUMmed
(``dpbert.mechanism.replicas``), by one stateless normal over every trained coordinate keyed by
(secret seed, DP step) only and split into the trained pieces in order: identical on every
replica and worker, never stored. Why there and not per shard (tensorflow-privacy's placement,
σ√(P·T)), the ``paper`` noise mode, the seed shared across workers and the draw made ahead:
docs/privacy.md, "Where the noise goes". Only the selected pieces are trained
(``dpbert.model.trainable``): z covers the trained coordinates only, and the mechanism is the
same Gaussian mechanism with sensitivity C and multiplier σ whatever the set.

``non_private`` (the baseline, ε = ∞): no clipping, no noise, divided by the real count.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import secrets
from typing import Optional

import numpy as np
import tensorflow as tf

from dpbert.mechanism import clipping as clipping_lib

log = logging.getLogger(__name__)

NOISE_MODES = ("once", "paper")
_LOGGED_PATHS = set()


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
    #: loss that ``dpbert.privacy.diagnostics`` releases with noise.
    loss_bound: Optional[float] = None
    #: k: rows per clipped unit (user-level DP-SGD: one patient's ≤ k tuples, summed gradient
    #: clipped as one vector). 1 = per-example clipping.
    group_size: int = 1
    #: XLA-compile the per-replica accumulate and the release at fixed shapes (docs/privacy.md).
    jit_compile: bool = False
    #: Draw the next step's noise ahead (``dpbert.mechanism.replicas``). None: always when
    #: compiled; uncompiled, on one replica when the trained pieces hold >=
    #: ``replicas.NOISE_AHEAD_MIN_COORDINATES``.
    noise_ahead: Optional[bool] = None

    def __post_init__(self):
        if int(self.group_size) < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.group_size > 1 and self.clipping != "ghost" and not self.non_private:
            raise ValueError("group_size > 1 (user-level clipping) needs clipping = ghost")
        if self.noise_mode not in NOISE_MODES:
            raise ValueError(f"noise_mode must be one of {NOISE_MODES}, got {self.noise_mode!r}")
        if self.clipping not in clipping_lib.CLIPPING_PATHS:
            raise ValueError(f"clipping must be one of {clipping_lib.CLIPPING_PATHS}, got {self.clipping!r}")
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


def initial_seed(noise_seed: Optional[int]) -> tf.Tensor:
    """The secret base seed ``[2]`` int64: OS entropy, or a test's fixed seed. Never logged or stored."""
    seed = noise_seed if noise_seed is not None else secrets.randbits(62)
    return tf.constant([seed >> 31, seed & 0x7FFFFFFF], dtype=tf.int64)


def _log_once(message: str):
    if message not in _LOGGED_PATHS:
        _LOGGED_PATHS.add(message)
        log.info(message)


def _log_path(config: DPSGDConfig):
    if config.non_private:
        _log_once("dpbert DP-SGD: NON-PRIVATE baseline (no clipping, no noise, epsilon = inf)")
        return
    detail = ("ghost norms + book-keeping (one forward, one backward)" if config.clipping == "ghost"
              else "tensorflow-privacy registry ghost norms + second backward pass")
    if config.group_size > 1:
        detail += f"; USER-LEVEL: per-patient clipping of the summed gradient of <= {config.group_size} tuples"
    _log_once(f"dpbert DP-SGD: per-example clipping path = {config.clipping}: {detail}; "
              f"noise mode = {config.noise_mode} (one draw per logical batch"
              f"{'' if config.noise_mode == 'once' else ', scaled by sqrt(P*T)'})")


class GaussianSumMechanism:
    """Clip-and-sum, one Gaussian draw, ÷ B (module docstring) for the trained ``variables``
    (aligned with ``selection.pieces``). ``seed``: the secret base seed, already shared by the
    replica executor; the draw is keyed by it and ``dp_step`` (the DP step counter, made here in
    the strategy's scope: create the mechanism inside it). ``ghost``: the model layer's
    ``clipping.ClippingPath``."""

    def __init__(self, config: DPSGDConfig, model, selection, ghost: clipping_lib.ClippingPath, variables,
                 seed: tf.Tensor, explicit_selection: bool = True):
        self.config, self.model, self.selection, self.ghost = config, model, selection, ghost
        self.variables = list(variables)
        self.registry = None
        self.clipping_path = "none"
        if not config.non_private:
            self.registry = clipping_lib.checked_path(config, model, selection, ghost, explicit_selection)
            self.clipping_path = config.clipping
        _log_path(config)
        self.noise_seed = seed
        self.dp_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_step",
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    # ---------------------------------------------------------------- what the privacy argument uses
    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the released sum S to one unit: C (∞ for the non-private baseline)."""
        return math.inf if self.config.non_private else float(self.config.clip_norm)

    @property
    def noise_multiplier(self) -> float:
        """σ carried by the released sum (the accountant's per-step σ before the diagnostics)."""
        return self.config.effective_noise_multiplier

    @property
    def sum_noise_std(self) -> float:
        """Per-coordinate std of z: σ · C."""
        return self.noise_multiplier * float(self.config.clip_norm)

    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the noise in the update (S + z)/B: σ · C / B."""
        return self.config.noise_std

    # ---------------------------------------------------------------- clip-and-sum (one replica)
    def clip(self, inputs, loss_fn, example_mask, training: bool = True):
        """The configured clipping path on one micro-batch: ``(grads, losses, norms, outputs)``."""
        if self.config.clipping == "ghost":
            grads, losses, norms, outputs = self.ghost.clipped_sum(
                self.model, inputs, loss_fn, example_mask, self.config.clip_norm, training=training,
                group_size=int(self.config.group_size), selection=self.selection,
                static_shapes=self.config.jit_compile)
            return [clipping_lib.dense(g) for g in grads], losses, norms, outputs
        return clipping_lib.tfp_two_pass_clipped_gradients(self.model, self.registry, inputs, loss_fn, example_mask,
                                                           self.config.clip_norm, training=training)

    def clipped_sum(self, inputs, loss_fn, example_mask):
        """One replica's micro-batch: ``(Σ_u g_u per piece, per-row losses, per-unit norms, outputs,
        {"clipped": units clipped, "units": units present})``. A unit (a row, or a patient's k
        slots) is present when any of its slots is."""
        k = int(self.config.group_size)
        unit_mask = example_mask if k == 1 else tf.reduce_max(tf.reshape(example_mask, [-1, k]), axis=1)
        if self.config.non_private:
            grads, losses, outputs = clipping_lib.plain_gradients(self.model, inputs, loss_fn, example_mask,
                                                                  selection=self.selection)
            clipped = tf.constant(0.0)
            norms = tf.zeros_like(unit_mask)
        else:
            grads, losses, norms, outputs = self.clip(inputs, loss_fn, example_mask)
            clipped = tf.reduce_sum(tf.cast(norms > self.config.clip_norm, tf.float32) * unit_mask)
        return grads, losses, norms, outputs, {"clipped": clipped, "units": tf.reduce_sum(unit_mask)}

    # ---------------------------------------------------------------- the one draw, after the SUM
    def draw_noise(self):
        """THE draw z ~ N(0, σ²C²I) of this DP step, one tensor per trained piece: ONE stateless
        normal over every trained coordinate keyed by (seed, DP step) and split into the pieces in
        order (one kernel, not one per piece: each stateless draw traces ~50 graph ops)."""
        step_seed = tf.random.experimental.stateless_fold_in(self.noise_seed, self.dp_step.read_value())
        sizes = [int(np.prod(v.shape)) for v in self.variables]
        flat = tf.random.stateless_normal([sum(sizes)], step_seed, stddev=self.sum_noise_std, alg="philox")
        return [tf.cast(tf.reshape(z, v.shape), v.dtype) for z, v in zip(tf.split(flat, sizes), self.variables)]

    def add_noise(self, grads, noise):
        """S + z: ``grads`` is the SUM over every replica (the same on each), ``noise`` this step's draw."""
        return [g + z for g, z in zip(grads, noise)]

    def normalise(self, grads, denominator):
        """÷ the divisor: the public B (private), or the real count (non-private baseline)."""
        return [g / tf.cast(denominator, g.dtype) for g in grads]

    def divisor(self, rounds, num_examples: Optional[float] = None) -> float:
        """B, public (the plan's expected batch size); non-private: ``num_examples`` (default the
        rounds' real example count), at least 1."""
        if not self.config.non_private:
            return float(self.config.expected_batch_size)
        if num_examples is None:
            num_examples = float(sum(np.sum(r["example_mask"]) for r in rounds))
        return max(float(num_examples), 1.0)
