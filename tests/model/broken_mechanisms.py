"""Deliberately BROKEN mechanisms: the positive controls of the run-time integrity checks
(``dpbert.model.integrity``) and of ``dpbert.model.noise_check``, as TEST FIXTURES.

Each one patches internals of ``dpbert.model.dpsgd`` / ``sampling`` / ``privacy.diagnostics`` for
the duration of a ``with`` block (a tf.function traced inside the block keeps the broken code);
nothing in ``dpbert`` can select them. Worker processes get them from the test worker script
(``tests/model/multi_worker_worker.py``), which imports this module by its file path.

Noise (what the optimizer is handed):
  ``SwitchableNoise``       no noise on chosen pieces, σ scaled, noise drawn but not added, the
                            seed's step counter stuck — switched by tf.Variables (one trace)
  ``no_noise_on``           the draw zeroed on the pieces whose name matches
  ``noise_drawn_not_added`` the draw computed, the sum returned without it
Noise placement across replicas / workers (``PLACEMENTS``):
  ``per_replica_full``      each replica its own full N(0, σ²C²) draw BEFORE the SUM (std √R·σC)
  ``same_before_sum``       the one draw added on every replica before the SUM (R·σC)
  ``own_seed``              each worker its own seed, after the SUM (parameters diverge)
Sampler (claims Poisson at q):
  ``FixedSizeSampler``      exactly round(n·q) units every step
  ``OneUnitAlwaysSampler``  Poisson at q, plus unit 0 in every batch
Released diagnostics:
  ``exact_release``         the exact sums released (no noise)
  ``scaled_release(f)``     noise at f × the claimed std
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable

import numpy as np
import tensorflow as tf

from dpbert.model import dpsgd, sampling
from dpbert.privacy import diagnostics

Step = dpsgd.DPSGDTrainStep


@contextlib.contextmanager
def patched(owner, **attributes):
    """``owner.name = value`` for each keyword inside the block, restored after it."""
    saved = {name: owner.__dict__[name] for name in attributes if name in owner.__dict__}
    try:
        for name, value in attributes.items():
            setattr(owner, name, value)
        yield
    finally:
        for name in attributes:
            if name in saved:
                setattr(owner, name, saved[name])
            else:
                delattr(owner, name)


def piece_names(step: Step):
    return [p.name for p in step.selection.pieces]


# --------------------------------------------------------------------------- noise
class SwitchableNoise:
    """Installs, while its ``install()`` block traces the step, a draw and an add whose breakage
    is chosen later by variables: ``scale[i]`` multiplies piece i's draw (0: no noise there, 0.5:
    σ/2), ``added`` False draws the noise and does not add it, ``stuck`` True keys the draw on
    step 0 (the same z every step). ``reset()`` restores the honest mechanism."""

    def __init__(self, pieces: int):
        self.scale = tf.Variable(tf.ones([pieces]), trainable=False)
        self.added = tf.Variable(True, trainable=False)
        self.stuck = tf.Variable(False, trainable=False)

    def reset(self):
        self.scale.assign(tf.ones_like(self.scale))
        self.added.assign(True)
        self.stuck.assign(False)

    def silence(self, step: Step, match: Callable[[str], bool]) -> list:
        """No noise on the pieces whose name ``match``es; returns their names."""
        names = piece_names(step)
        hit = [match(n) for n in names]
        self.scale.assign(np.where(hit, 0.0, 1.0).astype(np.float32))
        return [n for n, h in zip(names, hit) if h]

    def install(self):
        switch = self

        def draw(step):
            counter = tf.where(switch.stuck, tf.constant(0, tf.int64), step.dp_step.read_value())
            seed = tf.random.experimental.stateless_fold_in(step._noise_seed, counter)
            std = step.config.effective_noise_multiplier * step.config.clip_norm
            return [switch.scale[i] * std * tf.random.stateless_normal(
                        v.shape, tf.random.experimental.stateless_fold_in(seed, i), dtype=v.dtype, alg="philox")
                    for i, v in enumerate(step.variables)]

        def add(step, grads):
            return [tf.where(switch.added, g + z, g) for g, z in zip(grads, step._draw_noise())]

        return patched(Step, _draw_noise=draw, _add_noise=add)


def no_noise_on(match: Callable[[str], bool]):
    """The draw zeroed on every trained piece whose name ``match``es."""
    real = Step._draw_noise

    def draw(step):
        return [tf.zeros_like(z) if match(name) else z for z, name in zip(real(step), piece_names(step))]

    return patched(Step, _draw_noise=draw)


def noise_drawn_not_added():
    """The draw is computed (and discarded): the optimizer is handed S/B."""
    def add(step, grads):
        step._draw_noise()
        return list(grads)

    return patched(Step, _add_noise=add)


def _replica_draw(step):
    """A full σC draw of this replica's own (its global replica id folded into the seed)."""
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    seed = tf.random.experimental.stateless_fold_in(step._noise_seed, step.dp_step.read_value())
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica, tf.int64) + 1)
    std = step.config.effective_noise_multiplier * step.config.clip_norm
    return [std * tf.random.stateless_normal(v.shape, tf.random.experimental.stateless_fold_in(seed, i),
                                             dtype=v.dtype, alg="philox") for i, v in enumerate(step.variables)]


def per_replica_full():
    """Each replica adds its own N(0, σ²C²) before the SUM (tensorflow-privacy's placement)."""
    def sum_replicas(step, grads):
        return step._all_reduce_sum([g + z for g, z in zip(grads, _replica_draw(step))])

    return patched(Step, _sum_replicas=sum_replicas, _add_noise=lambda step, grads: list(grads))


def same_before_sum():
    """The one shared draw added on every replica BEFORE the SUM: R copies of it."""
    def sum_replicas(step, grads):
        return step._all_reduce_sum([g + z for g, z in zip(grads, step._draw_noise())])

    return patched(Step, _sum_replicas=sum_replicas, _add_noise=lambda step, grads: list(grads))


def own_seed():
    """Each worker its own noise seed (not the chief's), added after the SUM."""
    def share(step, seed):
        return seed + tf.constant([0, 7919], tf.int64) * step.worker_index

    return patched(Step, _share_noise_seed=share)


#: The broken placements across replicas / worker processes, by name.
PLACEMENTS = {"per_replica_full": per_replica_full, "same_before_sum": same_before_sum, "own_seed": own_seed}


# --------------------------------------------------------------------------- samplers
class FixedSizeSampler(sampling.PoissonSampler):
    """Says Poisson at q; draws exactly round(n·q) of its units every step."""

    def sample(self, step=0):
        units = self.shard if getattr(self, "shard", None) is not None else np.arange(self.n)
        size = int(round(len(units) * self.q))
        return np.sort(self.rng.choice(units, size=size, replace=False)).astype(np.int64)


class OneUnitAlwaysSampler(sampling.PoissonSampler):
    """Poisson at q, but unit 0 (of its units) is in every batch."""

    def sample(self, step=0):
        drawn = super().sample(step)
        first = int(self.shard[0]) if getattr(self, "shard", None) is not None else 0
        return np.union1d(drawn, [first]).astype(np.int64)


# --------------------------------------------------------------------------- released diagnostics
def scaled_release(factor: float):
    """Each released sum carries factor × its claimed noise std."""
    def noisy(exact, gradient_sigma, config, rng=None):
        rng = rng if rng is not None else np.random.default_rng()
        std = diagnostics.noise_stds(gradient_sigma, config)
        return {part: float(exact[part]) + factor * float(rng.normal(0.0, std[part])) for part in exact}

    return patched(diagnostics, noisy_sums=noisy)


def exact_release():
    """The exact sums released (no noise at all)."""
    return scaled_release(0.0)


def all_of(contexts: Iterable):
    """Several fixtures at once."""
    stack = contextlib.ExitStack()
    for context in contexts:
        stack.enter_context(context)
    return stack
