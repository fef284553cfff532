"""Deliberately BROKEN mechanisms: the positive controls of the run-time integrity checks
(``dpbert.mechanism.integrity``) and of ``dpbert.diagnostics.noise_check``, as TEST FIXTURES.

A noise or clipping fault is a SUBCLASS of the mechanism (``dpbert.mechanism.gaussian
.GaussianSumMechanism``) or, for a replica fault, of the executor (``dpbert.mechanism.replicas
.ReplicaExecutor``), made on top of whatever class is installed and installed as the step's
``mechanism_class`` / ``executor_class`` for the duration of a ``with`` block (a step built, and a
tf.function traced, inside the block keeps it). Samplers, diagnostics, the step log and the
patient grouping are patched the same way. Nothing in ``dpbert`` can select them. Worker processes
get them from the test worker script (``tests/model/multi_worker_worker.py``), which imports this
module by its file path.

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
Clipping (a factor may be a tf.Variable: 1.0 honest, switched later without a new trace; under
normalized clipping "at f·C" reads "f·g/(‖g‖ + r)", a bound of f·Δ):
  ``piece_clipped_at(f, match)``  the clipping path (``clip()``, so the step too) clips the pieces
                            whose name matches at f·C, the others at C
  ``step_clips_at(f)``      the step's accumulate (``clipped_sum``) clips at f·C; ``clip()`` itself
                            is honest
Step log and patients:
  ``LostUpdateStepLog``     the step log loses one write-ahead update (the file one short)
  ``PlainWriteStepLog``     the step log written by a plain write (a stale holder can lower it)
  ``split_patient``         the patient grouping splits one patient's rows into two groups
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable

import numpy as np
import tensorflow as tf

from dpbert import storage
from dpbert.mechanism import step as step_lib
from dpbert.mechanism import ghost, sampling
from dpbert.engine import chain as chain_lib
from dpbert.privacy import diagnostics

Step = step_lib.DPSGDTrainStep


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


@contextlib.contextmanager
def install(mechanism: Callable = None, executor: Callable = None):
    """Inside the block the step builds ``mechanism(installed mechanism class)`` and
    ``executor(installed executor class)``: broken subclasses, stacked on any installed before."""
    attributes = {}
    if mechanism is not None:
        attributes["mechanism_class"] = mechanism(Step.mechanism_class)
    if executor is not None:
        attributes["executor_class"] = executor(Step.executor_class)
    with patched(Step, **attributes):
        yield


def piece_names(holder):
    """The trained pieces' names of a step or of its mechanism."""
    return [p.name for p in holder.selection.pieces]


# --------------------------------------------------------------------------- noise
class SwitchableNoise:
    """Installs, while its ``install()`` block builds and traces the step, a mechanism whose draw
    and add are broken as chosen later by variables: ``scale[i]`` multiplies piece i's draw (0: no
    noise there, 0.5: σ/2), ``added`` False draws the noise and does not add it, ``stuck`` True
    keys the draw on step 0 (the same z every step). Honest, it draws one stream per piece (the
    same distribution as the real single draw). ``reset()`` restores the honest state."""

    def __init__(self, pieces: int):
        self.scale = tf.Variable(tf.ones([pieces]), trainable=False)
        self.added = tf.Variable(True, trainable=False)
        self.stuck = tf.Variable(False, trainable=False)

    def reset(self):
        self.scale.assign(tf.ones_like(self.scale))
        self.added.assign(True)
        self.stuck.assign(False)

    def silence(self, step, match: Callable[[str], bool]) -> list:
        """No noise on the pieces whose name ``match``es; returns their names."""
        names = piece_names(step)
        hit = [match(n) for n in names]
        self.scale.assign(np.where(hit, 0.0, 1.0).astype(np.float32))
        return [n for n, h in zip(names, hit) if h]

    def install(self):
        switch = self

        def make(base):
            class Switchable(base):
                def draw_noise(self):
                    counter = tf.where(switch.stuck, tf.constant(0, tf.int64), self.dp_step.read_value())
                    seed = tf.random.experimental.stateless_fold_in(self.noise_seed, counter)
                    std = self.sum_noise_std  # σ·Δ, the honest draw's (Δ = C, or 1 when normalized)
                    return [switch.scale[i] * std * tf.random.stateless_normal(
                                v.shape, tf.random.experimental.stateless_fold_in(seed, i), dtype=v.dtype,
                                alg="philox") for i, v in enumerate(self.variables)]

                def add_noise(self, grads, noise):
                    return [tf.where(switch.added, g + z, g) for g, z in zip(grads, noise)]

            return Switchable

        return install(mechanism=make)


def no_noise_on(match: Callable[[str], bool]):
    """The draw zeroed on every trained piece whose name ``match``es."""
    def make(base):
        class NoNoiseOn(base):
            def draw_noise(self):
                return [tf.zeros_like(z) if match(name) else z for z, name in zip(super().draw_noise(),
                                                                                   piece_names(self))]

        return NoNoiseOn

    return install(mechanism=make)


def _not_added(base):
    class NoiseNotAdded(base):
        """The draw is computed (by the caller) and not added: the optimizer is handed S/B."""

        def add_noise(self, grads, noise):
            return list(grads)

    return NoiseNotAdded


def noise_drawn_not_added():
    """The draw is computed (and discarded): the optimizer is handed S/B."""
    return install(mechanism=_not_added)


def _replica_draw(mechanism):
    """A full σC draw of this replica's own (its global replica id folded into the seed)."""
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    seed = tf.random.experimental.stateless_fold_in(mechanism.noise_seed, mechanism.dp_step.read_value())
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica, tf.int64) + 1)
    std = mechanism.sum_noise_std
    return [std * tf.random.stateless_normal(v.shape, tf.random.experimental.stateless_fold_in(seed, i),
                                             dtype=v.dtype, alg="philox") for i, v in enumerate(mechanism.variables)]


def per_replica_full():
    """Each replica adds its own N(0, σ²C²) before the SUM (tensorflow-privacy's placement): the
    executor noises before its SUM, the mechanism adds nothing after it."""
    def make(base):
        class NoiseBeforeSum(base):
            def sum_replicas(self, grads):
                return self.all_reduce_sum([g + z for g, z in zip(grads, _replica_draw(self.mechanism))])

        return NoiseBeforeSum

    return install(mechanism=_not_added, executor=make)


def same_before_sum():
    """The one shared draw added on every replica BEFORE the SUM: R copies of it."""
    def make(base):
        class SharedDrawBeforeSum(base):
            def sum_replicas(self, grads):
                return self.all_reduce_sum([g + z for g, z in zip(grads, self.mechanism.draw_noise())])

        return SharedDrawBeforeSum

    return install(mechanism=_not_added, executor=make)


def own_seed():
    """Each worker its own noise seed (not the chief's), added after the SUM."""
    def make(base):
        class OwnSeed(base):
            def share_seed(self, seed):
                return seed + tf.constant([0, 7919], tf.int64) * self.worker_index

        return OwnSeed

    return install(executor=make)


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


# --------------------------------------------------------------------------- clipping
def _ghost_sum(mechanism, inputs, loss_fn, example_mask, factor, training):
    """The ghost clipped sum with each unit's bound at factor·Δ: clipped at factor·C (flat), or
    factor·g/(‖g‖ + r) (normalized clipping); factor 1 is the honest mechanism's."""
    extra = {}
    if mechanism.config.clip_rule == "normalized":
        extra["clip_factors"] = lambda norms: factor * mechanism.clip_factors(norms)
    grads, losses, norms, outputs = ghost.clipped_gradient_sum(
        mechanism.model, inputs, loss_fn, example_mask, factor * mechanism.config.clip_norm, training=training,
        group_size=int(mechanism.config.group_size), selection=mechanism.selection,
        static_shapes=mechanism.config.jit_compile, **extra)
    return [tf.convert_to_tensor(g) for g in grads], losses, norms, outputs


def piece_clipped_at(factor, match: Callable[[str], bool]):
    """``clip()`` (which the step's accumulate calls too) clips the trained pieces whose name
    ``match``es at factor·C (a second ghost pass at factor·C supplies them), every other piece at C."""
    def make(base):
        class PieceClippedAt(base):
            def clip(self, inputs, loss_fn, example_mask, training=True):
                grads, losses, norms, outputs = super().clip(inputs, loss_fn, example_mask, training)
                loose = _ghost_sum(self, inputs, loss_fn, example_mask, factor, training)[0]
                return ([wide if match(name) else g for g, wide, name in zip(grads, loose, piece_names(self))],
                        losses, norms, outputs)

        return PieceClippedAt

    return install(mechanism=make)


def step_clips_at(factor):
    """The step's accumulate (``clipped_sum``) clips every unit at factor·C; ``clip()``, which the
    run-time check also calls on its own, is untouched."""
    def make(base):
        class StepClipsAt(base):
            def clipped_sum(self, inputs, loss_fn, example_mask):
                self.clip = lambda inputs, loss_fn, mask, training=True: _ghost_sum(
                    self, inputs, loss_fn, mask, factor, training)
                try:
                    return super().clipped_sum(inputs, loss_fn, example_mask)
                finally:
                    del self.clip

        return StepClipsAt

    return install(mechanism=make)


# --------------------------------------------------------------------------- step log
class LostUpdateStepLog(chain_lib.StepLog):
    """Loses the write-ahead update of its ``lose``-th charge (1-based): the file stays one short
    of the steps that ran (what a stale holder's write after a lease takeover does) until its next
    charge, whose compare-and-swap writes max(stored, its count) + 1."""

    lose = 3

    def __init__(self, *args, **kwargs):
        self.charges = 0
        super().__init__(*args, **kwargs)

    def charge(self):
        self.charges += 1
        if self.charges != self.lose:
            return super().charge()
        self.data["steps_executed"] = self.count + 1  # counted in memory, never written
        return None


class PlainWriteStepLog(chain_lib.StepLog):
    """Writes its count with a plain write (no compare-and-swap): whatever is stored is replaced."""

    def _write(self, steps: int) -> int:
        self.data["steps_executed"] = self.count + int(steps)
        storage.write_json(self.uri, self.data)
        return self.count - int(steps)  # never sees another writer


def use_step_log(cls):
    """The training chain hands out step logs of ``cls`` (a broken fixture above)."""
    def step_log(chain, start_step, accounted_sigma):
        return cls(chain.uri if chain.chief else None, start_step, accounted_sigma,
                   checkpoint_executed=chain.checkpoint_executed() if chain.chief else None)

    return patched(chain_lib.TrainingChain, step_log=step_log)


# --------------------------------------------------------------------------- patients
def split_patient():
    """The patient grouping (``PatientGroups.from_keys``) splits the first patient with two or more
    rows into two groups (two sampling units: that patient's sensitivity is 2C)."""
    real = sampling.PatientGroups.from_keys.__func__

    def from_keys(cls, patient_keys):
        groups = real(cls, patient_keys)
        members, ids = list(groups.members), list(groups.ids)
        at = next(i for i, rows in enumerate(members) if rows.size >= 2)
        members[at:at + 1] = [members[at][:1], members[at][1:]]
        ids[at:at + 1] = [ids[at], ids[at] ^ np.uint64(1)]
        return cls(members, np.asarray(ids, np.uint64))

    return patched(sampling.PatientGroups, from_keys=classmethod(from_keys))


def all_of(contexts: Iterable):
    """Several fixtures at once."""
    stack = contextlib.ExitStack()
    for context in contexts:
        stack.enter_context(context)
    return stack
