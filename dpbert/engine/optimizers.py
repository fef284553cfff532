"""The trainer's optimizer (``training.optimizer``) and what it logs.

``make(training_config, schedule)``: tf_keras AdamW (``adamw``) or DP-AdamBC (``adamw_bc``,
``dpbert.mechanism.adam_bc``; its Φ is set by the DP step from the mechanism), both with decoupled
weight decay (not on LayerNorm or biases), β = (0.9, 0.999), AdamW's ε = 1e-6.

``NoiseDominance``: the training loop's hook that, under adamw_bc, logs the mean over each trained
piece's coordinates of v̂ / Φ at the run-time checks' looks (the run's first step, every
``training.integrity_check_every`` steps, the end): ≈ 1 means the second moment is the DP noise's
variance (DP-Adam would be DP-SGD). Per piece to TensorBoard (``adam_bc/`` beside the run's other
scalars, chief only), a summary to the log. v̂ is a function of the released noisy updates alone
(post-processing): nothing here reads a private value. docs/training.md, "Optimizer and clipping
options".
"""
from __future__ import annotations

import logging
import math
from typing import List, Optional

import numpy as np
import tensorflow as tf
import tf_keras

from dpbert import storage
from dpbert.config import OptimizerSettings
from dpbert.mechanism import adam_bc
from dpbert.engine.hooks import Hook

log = logging.getLogger("dpbert.engine.train")


def make(training_config: OptimizerSettings, schedule):
    """The optimizer ``training.optimizer`` names, on ``schedule`` (a learning-rate schedule); reads
    only the ``OptimizerSettings`` section of a ``TrainingConfig``."""
    kwargs = dict(learning_rate=schedule, weight_decay=training_config.weight_decay, beta_1=0.9, beta_2=0.999,
                  epsilon=1e-6, jit_compile=False)
    if training_config.optimizer == "adamw_bc":
        optimizer = adam_bc.DPAdamBC(gamma=float(training_config.adam_bc_gamma), **kwargs)
    else:
        optimizer = tf_keras.optimizers.AdamW(**kwargs)
    optimizer.exclude_from_weight_decay(var_names=["layer_norm", "bias"])
    return optimizer


class NoiseDominance(Hook):
    """v̂ / Φ per trained piece (module docstring). ``every``: the checks' cadence (0: first and
    last step only); ``logdir``: the run's TensorBoard folder (None: no TensorBoard, e.g. not the
    chief). ``latest``: {piece name: mean v̂ / Φ} at the last look."""

    def __init__(self, optimizer: adam_bc.DPAdamBC, variables, names: List[str], every: int, logdir: Optional[str]):
        self.optimizer, self.variables, self.names = optimizer, list(variables), list(names)
        self.every = int(every)
        self.writer = tf.summary.create_file_writer(storage.join(logdir, "adam_bc")) if logdir else None
        self.latest: dict = {}
        self.looks = 0

    def _due(self, loop, step: int) -> bool:
        return self.looks == 0 or step >= loop.steps_planned or (self.every > 0 and step % self.every == 0)

    def on_step(self, loop, step, rounds, stats, sampled):
        if not self._due(loop, step):
            return
        self.looks += 1
        ratios = self.optimizer.noise_dominance(self.variables).numpy()
        self.latest = {name: float(r) for name, r in zip(self.names, ratios)}
        finite = ratios[np.isfinite(ratios)]
        if finite.size:
            low, high = int(np.argmin(np.where(np.isfinite(ratios), ratios, np.inf))), \
                int(np.argmax(np.where(np.isfinite(ratios), ratios, -np.inf)))
            log.info("DP-AdamBC at step %d: mean v_hat/Phi per trained piece (1 = noise-dominated), median %.4g, "
                     "min %.4g (%s), max %.4g (%s); Phi = %.4g", step, float(np.median(finite)), ratios[low],
                     self.names[low], ratios[high], self.names[high], self.optimizer.noise_variance)
        if self.writer is not None:
            with self.writer.as_default(step=step):
                for name, value in self.latest.items():
                    if math.isfinite(value):
                        tf.summary.scalar("vhat_over_phi/" + name.replace(":", "_"), value)

    def close(self, loop):
        if self.writer is not None:
            self.writer.flush()


def hooks(training_config, optimizer, stepper, logdir: Optional[str]) -> list:
    """The optimizer's hooks for the training loop: ``NoiseDominance`` under adamw_bc with noise
    (a private run), else none."""
    if not isinstance(optimizer, adam_bc.DPAdamBC) or not optimizer.noise_variance:
        return []
    names = [p.name for p in stepper.selection.pieces]
    return [NoiseDominance(optimizer, stepper.variables, names, int(training_config.integrity_check_every), logdir)]
