"""THE MECHANISM of one DP-SGD step: clip-and-sum, ONE Gaussian draw, divide by the public B.

One logical batch β (units Poisson-sampled at q by ``dpbert.mechanism.sampling``)::

    g_u = ∇ℓ_u · min(1, C / ‖∇ℓ_u‖)           per-unit clipping, ‖g_u‖ ≤ C = Δ   (clipped_sum)
    S   = Σ_{u∈β} g_u                            summed over micro-rounds and replicas
    ĝ   = (S + z) / B,   z ~ N(0, σ²Δ²I)         one draw (draw_noise, add_noise), B public (normalise)

A unit is one tuple (ℓ_u: the mean cross-entropy over its masked positions) or one patient's
≤ k tuples (``group_size`` k: the SUMMED gradient of its rows is clipped as one vector). Padded
rows have ℓ = 0 and add exactly 0. Adding or removing one unit changes S by at most Δ in L2
(``sensitivity``: C; Δ = 1 under ``clip_rule = normalized``, g_u = ∇ℓ_u / (‖∇ℓ_u‖ + r), Bu et al.
2023), so S + z is the Gaussian mechanism with noise multiplier σ (``noise_multiplier``: what the
accountant charges per step) and the update's per-coordinate noise std is σΔ/B (``noise_std``:
what the run-time and the CLI noise checks measure; its square Φ, ``update_noise_variance``, is
what DP-AdamBC subtracts: docs/training.md, "Optimizer and clipping options").

z is drawn once per logical batch, AFTER the replicas' clipped sums are SUMmed
(``dpbert.mechanism.replicas``), by one stateless normal over every trained coordinate keyed by
(secret seed, DP step) only and split into the trained pieces in order: identical on every
replica and worker, never stored. Why there and not per shard (tensorflow-privacy's placement,
σ√(P·T)), the ``paper`` noise mode, the seed shared across workers and the draw made ahead:
docs/privacy.md, "Where the noise goes". Only the selected pieces are trained
(``dpbert.network.trainable``): z covers the trained coordinates only, and the mechanism is the
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

from dpbert import config as config_lib
from dpbert.mechanism import clipping as clipping_lib

log = logging.getLogger(__name__)

NOISE_MODES = ("once", "paper")
#: flat: g·min(1, C/‖g‖), sensitivity C | normalized: g/(‖g‖ + r), sensitivity 1 (Bu et al. 2023).
CLIP_RULES = config_lib.CLIP_RULES
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
    #: ``CLIP_RULES``: flat (clip at C) | normalized (g/(‖g‖ + clip_stability): sensitivity 1, C unused).
    clip_rule: str = "flat"
    #: r of the normalized rule (> 0): a unit's weight 1/(‖g‖ + r) stays ≤ 1/r for a tiny gradient.
    clip_stability: float = 0.01

    def __post_init__(self):
        if int(self.group_size) < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.group_size > 1 and self.clipping != "ghost" and not self.non_private:
            raise ValueError("group_size > 1 (user-level clipping) needs clipping = ghost")
        if self.noise_mode not in NOISE_MODES:
            raise ValueError(f"noise_mode must be one of {NOISE_MODES}, got {self.noise_mode!r}")
        if self.clipping not in clipping_lib.CLIPPING_PATHS:
            raise ValueError(f"clipping must be one of {clipping_lib.CLIPPING_PATHS}, got {self.clipping!r}")
        if self.clip_rule not in CLIP_RULES:
            raise ValueError(f"clip_rule must be one of {CLIP_RULES}, got {self.clip_rule!r}")
        if self.clip_rule == "normalized" and not (self.clip_stability > 0 and math.isfinite(self.clip_stability)):
            raise ValueError(f"clip_stability must be > 0, got {self.clip_stability}")
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
    def sensitivity(self) -> float:
        """Δ: the L2 bound on one unit's clipped contribution — C (flat), or 1 (normalized:
        ‖g/(‖g‖ + r)‖ = ‖g‖/(‖g‖ + r) < 1 for every g, since r > 0)."""
        return 1.0 if self.clip_rule == "normalized" else float(self.clip_norm)

    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the noise in the averaged update: σ_eff · Δ / B."""
        return self.effective_noise_multiplier * self.sensitivity / self.expected_batch_size


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
    if config.clip_rule == "normalized":
        detail += f"; NORMALIZED clipping g/(||g|| + {config.clip_stability:g}), sensitivity 1 (clip_norm unused)"
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
        """Δ: L2 sensitivity of the released sum S to one unit — C, 1 under normalized clipping (∞
        for the non-private baseline). Every reader of the sensitivity (the noise and clipping
        checks, the white-box audit's canary norm) takes it from here."""
        return math.inf if self.config.non_private else self.config.sensitivity

    @property
    def noise_multiplier(self) -> float:
        """σ carried by the released sum (the accountant's per-step σ before the diagnostics)."""
        return self.config.effective_noise_multiplier

    @property
    def sum_noise_std(self) -> float:
        """Per-coordinate std of z: σ · Δ."""
        return self.noise_multiplier * self.config.sensitivity

    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the noise in the update (S + z)/B: σ · Δ / B."""
        return self.config.noise_std

    @property
    def update_noise_variance(self) -> float:
        """Φ = (σ·Δ / B)²: the per-coordinate variance of the noise in the update the optimizer is
        handed — the std of the draw this mechanism adds (``sum_noise_std``, σ the gradient's own,
        not the accounted σ_eff that also covers the released diagnostics) over the divisor its
        release uses (``divisor``, the public B). 0 for the non-private baseline (no noise)."""
        if self.config.non_private:
            return 0.0
        return (self.sum_noise_std / self.divisor([])) ** 2

    def clip_factors(self, norms):
        """Each unit's weight from its gradient norm: min(1, C/‖g‖) (flat), 1/(‖g‖ + r) (normalized)."""
        if self.config.clip_rule == "normalized":
            return 1.0 / (norms + float(self.config.clip_stability))
        clip = self.config.clip_norm
        return clip / tf.maximum(norms, clip)

    # ---------------------------------------------------------------- clip-and-sum (one replica)
    def clip(self, inputs, loss_fn, example_mask, training: bool = True):
        """The configured clipping path on one micro-batch: ``(grads, losses, norms, outputs)``."""
        if self.config.clipping == "ghost":
            grads, losses, norms, outputs = self.ghost.clipped_sum(
                self.model, inputs, loss_fn, example_mask, self.config.clip_norm, training=training,
                group_size=int(self.config.group_size), selection=self.selection,
                static_shapes=self.config.jit_compile, **self._factors_kwargs())
            return [clipping_lib.dense(g) for g in grads], losses, norms, outputs
        return clipping_lib.tfp_two_pass_clipped_gradients(self.model, self.registry, inputs, loss_fn, example_mask,
                                                           self.config.clip_norm, training=training,
                                                           **self._factors_kwargs())

    def _factors_kwargs(self) -> dict:
        """What the clipping paths are handed: flat, nothing (their own min(1, C/‖g‖), the same
        ops as ever); normalized, ``clip_factors`` (the same ghost norms, one backward pass)."""
        return {"clip_factors": self.clip_factors} if self.config.clip_rule == "normalized" else {}

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
            # A unit is clipped when its weight is < 1: ‖g‖ > C (flat), ‖g‖ + r > 1 (normalized).
            shrunk = self.config.clip_norm if self.config.clip_rule == "flat" else 1.0 - self.config.clip_stability
            clipped = tf.reduce_sum(tf.cast(norms > shrunk, tf.float32) * unit_mask)
        return grads, losses, norms, outputs, {"clipped": clipped, "units": tf.reduce_sum(unit_mask)}

    # ---------------------------------------------------------------- the one draw, after the SUM
    def draw_noise(self):
        """THE draw z ~ N(0, σ²Δ²I) of this DP step, one tensor per trained piece: ONE stateless
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
