"""``DPSGDTrainStep``: one logical DP-SGD step — the Gaussian sum mechanism
(``dpbert.mechanism.gaussian``) run by the replica executor (``dpbert.mechanism.replicas``), its
released update handed to the optimizer — and the run-time probes on it.

``run_step(rounds)``: ``rounds`` is a list of R ≥ 1 dicts ``{"features": [P, m, ...],
"example_mask": [P, m]}``; round r goes to replica p as ``features[p]``. Each round adds its
replica's clipped sum to replica-local accumulators (one traced function); then one traced apply
SUMs them over the replicas, adds the mechanism's one draw, divides by B (non-private: by the
real count), applies the optimizer to the trained pieces, zeroes the accumulators and counts the
DP step. A ``DPAdamBC`` optimizer is handed the mechanism's Φ (``update_noise_variance``). Statistics stay on the device until read (``read=False``, ``read_stats``: several
steps' in one transfer, ``training.stats_every``).

``prepare_fn(features) -> (model_inputs, targets)`` runs inside the replica and is deterministic:
an example's randomness (MLM masks) is drawn on the host keyed by its own id
(``dpbert.engine.masking``), never by its batch slot. ``loss_fn(targets, outputs) -> [b]``;
``metrics_fn(targets, outputs, example_mask[, group_size]) -> dict of scalar sums``.

What is trained (``selection``, ``dpbert.network.trainable``): ``variables`` is aligned with the
pieces — a whole variable, or for a sliced piece a SHADOW variable of the slice's shape gathered
before every apply and scattered back after it; frozen coordinates get no gradient, noise,
optimizer state or weight decay and stay bit-identical.

Run-time hooks (``dpbert.mechanism.integrity``): ``clip`` is the mechanism's clipping path (the
brute-force check calls the same one), ``replay_accumulate`` the step's own accumulate on one
round, ``last_unit_norms`` the norms the last step used; a ``NoiseProbe`` keeps S and (S + z)/B
on a few coordinates, an ``AuditProbe`` (the white-box audit) adds canaries to S before the draw.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from dpbert.mechanism import adam_bc
from dpbert.mechanism import clipping as clipping_lib
from dpbert.mechanism import gaussian
from dpbert.mechanism.clipping import ClippingPath
from dpbert.mechanism.replicas import ReplicaExecutor


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
    """Run-time noise check hook (``dpbert.mechanism.integrity``): flat ``coordinates`` per trainable
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


def _kept(name: str, size: int) -> tf.Variable:
    """A probe's kept vector (written by the apply, read by the host)."""
    return tf.Variable(tf.zeros([size], tf.float32), trainable=False, name=name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def _trained_variables(selection):
    """``(slices, variables)``: the variable of each whole piece, a shadow of each sliced piece."""
    slices, variables = [], []
    for piece in selection.pieces:
        if piece.axis is None:
            variables.append(piece.variable)
            continue
        shadow = tf.Variable(tf.zeros(piece.shape, piece.variable.dtype), trainable=False,
                             name=piece.variable.name.split(":")[0].replace("/", "__") + "__trainable_slice",
                             aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        slices.append((piece.variable, shadow, tf.constant(piece.nd_indices())))
        variables.append(shadow)
    return slices, variables


def _canary_in_probe(noise_probe: NoiseProbe, audit_probe: Optional[AuditProbe]):
    """Where audit canaries land on noise-probe coordinates: (positions in the kept vector, in the
    canary vector), or None (the clean sum includes them)."""
    if audit_probe is None:
        return None
    groups = noise_probe.groups()
    offset = sum(c.size for i, c in groups if i < audit_probe.variable_index)
    coords = dict(groups).get(audit_probe.variable_index, np.zeros(0, np.int64))
    _, in_probe, in_canary = np.intersect1d(coords, np.asarray(audit_probe.coordinates, np.int64),
                                            return_indices=True)
    if not in_probe.size:
        return None
    return (tf.constant((offset + in_probe)[:, None].astype(np.int64)), tf.constant(in_canary.astype(np.int64)))


def _canary_vector(audit_probe: Optional[AuditProbe], canary_sum) -> np.ndarray:
    """A step's canary sum on the audit probe's coordinates (zeros when none was sampled)."""
    if audit_probe is None:
        if canary_sum is not None:
            raise ValueError("canary_sum needs an AuditProbe")
        return np.zeros(0, np.float32)
    size = int(np.asarray(audit_probe.coordinates).size)
    canary = np.zeros(size, np.float32) if canary_sum is None else np.asarray(canary_sum, np.float32)
    if canary.shape != (size,):
        raise ValueError(f"canary_sum must have shape ({size},), got {canary.shape}")
    return canary


class DPSGDTrainStep:
    """The distributed train step (module docstring). ``clipping``: the model layer's ghost
    clipping (``clipping.ClippingPath``). ``mechanism_class`` / ``executor_class``: the roles it
    composes (test fixtures install broken subclasses; nothing in dpbert selects another)."""

    mechanism_class = gaussian.GaussianSumMechanism
    executor_class = ReplicaExecutor

    def __init__(self, model, optimizer, config: gaussian.DPSGDConfig, *, prepare_fn: Callable, loss_fn: Callable,
                 clipping: ClippingPath, metrics_fn: Optional[Callable] = None,
                 strategy: Optional[tf.distribute.Strategy] = None, audit_probe: Optional[AuditProbe] = None,
                 noise_probe: Optional[NoiseProbe] = None, selection=None):
        self.model, self.optimizer, self.config = model, optimizer, config
        self.prepare_fn, self.loss_fn, self.metrics_fn = prepare_fn, loss_fn, metrics_fn
        self.executor = self.executor_class(strategy, config)
        self.strategy, self.replicas = self.executor.strategy, self.executor.replicas
        self.workers, self.worker_index = self.executor.workers, self.executor.worker_index
        self.local_replicas = self.executor.local_replicas
        self.selection = selection if selection is not None else clipping.whole(model.trainable_variables)
        seed = self.executor.share_seed(gaussian.initial_seed(config.noise_seed))
        with self.strategy.scope():
            self._slices, self.variables = _trained_variables(self.selection)
            self.mechanism = self.mechanism_class(config, model, self.selection, clipping, self.variables, seed,
                                                  explicit_selection=selection is not None)
            self.clipping_path, self.dp_step = self.mechanism.clipping_path, self.mechanism.dp_step
            if isinstance(optimizer, adam_bc.DPAdamBC):  # Φ: the noise THIS mechanism adds, ÷ its divisor
                optimizer.set_noise_variance(self.mechanism.update_noise_variance)
            self.accumulators = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"acc_{i}",
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
                for i, v in enumerate(self.variables)]
            self.optimizer.build(self.variables)  # the optimizer's slots now, not inside a replica function
            self._setup_probes(audit_probe, noise_probe)
        #: With an ``AuditProbe``: the canary sum of the NEXT ``run_step`` that is given none, set by
        #: the audit's sampler once it knows which canary units the step drew (consumed by ``run_step``).
        self.next_canary_sum: Optional[np.ndarray] = None
        self._device_norms: list = []
        self._unit_norms: Optional[list] = None
        self.executor.setup(model, self.variables, self.mechanism)
        self._accumulate_fn = tf.function(self._accumulate, autograph=False)
        self._apply_fn = tf.function(self._apply, autograph=False)

    def _setup_probes(self, audit_probe: Optional[AuditProbe], noise_probe: Optional[NoiseProbe]):
        """The audit probe's and the noise probe's gather indices and kept vectors."""
        self.audit_probe, self.noise_probe, self._canary_in_probe = audit_probe, noise_probe, None
        if audit_probe is not None:
            coords = np.asarray(audit_probe.coordinates, dtype=np.int64)
            self._probe_index = tf.constant(coords[:, None])
            self.observed = _kept("audit_observed", coords.size)
            self.observed_noiseless = _kept("audit_observed_noiseless", coords.size)
        if noise_probe is None:
            return
        for i, c in noise_probe.coordinates.items():
            if not 0 <= int(i) < len(self.variables) or (np.asarray(c).size and (
                    np.min(c) < 0 or np.max(c) >= self.variables[int(i)].shape.num_elements())):
                raise ValueError(f"noise probe coordinates out of range for variable {i}")
        self._noise_probe_index = [(i, tf.constant(c[:, None])) for i, c in noise_probe.groups()]
        self._canary_in_probe = _canary_in_probe(noise_probe, audit_probe)
        self.noise_probe_clean = _kept("noise_probe_clean", noise_probe.size)
        self.noise_probe_update = _kept("noise_probe_update", noise_probe.size)

    # ----------------------------------------------------------------- the executor's, for the loop
    def sync_step(self, local_rounds: int, go: bool = True):
        """``ReplicaExecutor.sync_step``: the workers' MAX round count and the chief's go flag."""
        return self.executor.sync_step(local_rounds, go)

    padding_round = staticmethod(ReplicaExecutor.padding_round)

    def distribute(self, round_batch):
        """One round as the step's per-replica input (``ReplicaExecutor.distribute``)."""
        return self.executor.distribute(round_batch)

    # ----------------------------------------------------------------- run-time checks
    def clip(self, inputs, loss_fn: Callable, example_mask, training: bool = True):
        """The mechanism's clipping path on one replica's micro-batch: ``(grads, losses, norms, outputs)``."""
        return self.mechanism.clip(inputs, loss_fn, example_mask, training)

    @property
    def last_unit_norms(self) -> list:
        """The per-unit gradient norms the clipping used in the last ``run_step``, one array
        ``[P, units per replica]`` per round (tuple: per row; patient: per group of k slots),
        read from the device on first use after the step."""
        if self._unit_norms is None:
            self._unit_norms = [np.stack([np.asarray(x) for x in norms]) for norms in self._device_norms]
        return self._unit_norms

    def replay_accumulate(self, round_batch, round_index: int = 0) -> np.ndarray:
        """The step's OWN accumulate (the function ``run_step`` calls: the mechanism's clipped sum,
        the accumulators) on one round, with no noise and no apply: the accumulators then hold the
        round's clipped sum, for the run-time check to read before :meth:`clear_accumulators`.
        Returns the unit norms ``[P, units]`` it used. Between steps only (the accumulators are
        zero there); several workers: every worker must call it (the statistics are a collective)."""
        _, norms = self._accumulate_fn(self.distribute(round_batch), tf.constant(int(round_index), tf.int64))
        return np.stack([np.asarray(x) for x in norms])

    def clear_accumulators(self):
        """Every replica's accumulators to zero (after :meth:`replay_accumulate`; no collective)."""
        for acc in self.accumulators:
            for part in self.strategy.experimental_local_results(acc):
                part.assign(tf.zeros_like(part))

    # ----------------------------------------------------------------- per replica
    def _compute(self, batch, round_index):
        example_mask = tf.cast(batch["example_mask"], tf.float32)
        inputs, targets = self.prepare_fn(batch["features"])
        loss_fn = lambda outputs: self.loss_fn(targets, outputs)  # noqa: E731
        k = int(self.config.group_size)
        grads, losses, norms, outputs, units = self.mechanism.clipped_sum(inputs, loss_fn, example_mask)
        stats = {"loss_sum": tf.reduce_sum(losses), "examples": tf.reduce_sum(example_mask), **units}
        if self.config.loss_bound is not None:
            bounded = tf.clip_by_value(losses, 0.0, float(self.config.loss_bound)) * example_mask
            # Per unit: a patient's mean over its own tuples (still in [0, bound]).
            stats["loss_clipped_sum"] = tf.reduce_sum(bounded) if k == 1 else tf.reduce_sum(
                clipping_lib.group_mean(bounded, example_mask, k))
        if self.metrics_fn is not None:
            extra = {} if k == 1 else {"group_size": k}
            stats.update(self.metrics_fn(targets, outputs, example_mask, **extra))
        return grads, stats, norms

    def _replica_accumulate(self, batch, round_index):
        grads, stats, norms = self._compute(batch, round_index)
        for acc, g in zip(self.accumulators, grads):
            acc.assign_add(g)
        return stats, norms

    def _replica_apply(self, denominator, canary_sum):
        grads = [acc.read_value() for acc in self.accumulators]
        clean = None
        if self.noise_probe is not None:
            # The clean clipped sum S on the probe's coordinates, summed over the replicas by its own
            # small all-reduce: whatever the release does to the sum, B·update − S is its noise.
            clean = self.executor.all_reduce_sum(self._noise_probe_gather(grads))
        grads = self.executor.sum_replicas(grads)
        if not self.config.jit_compile:
            self._release_staged(grads, self.executor.noise_outside(compiled=False), denominator, canary_sum,
                                 clean, apply=True)
            return tf.constant(0.0)
        noise = [] if self.config.non_private else self.executor.noise_outside(compiled=True)
        # One replica: the whole release is compiled. Several: writes to replica-synchronised
        # variables (probes, optimizer) merge_call, so the compiled part returns them instead.
        out = self.executor.xla(self._release_staged)(grads, noise, denominator, canary_sum, clean,
                                                      self.replicas == 1)
        if self.replicas > 1:
            grads, kept = out
            self._keep(kept)
            self._apply_update(grads)
        return tf.constant(0.0)

    def _release_staged(self, grads, noise, denominator, canary_sum, clean, apply: bool):
        """``_release`` with the noise drawn outside (the compiled release's body)."""
        with self.executor.staged(noise):
            return self._release(grads, denominator, canary_sum, clean, apply)

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
            grads = self.mechanism.add_noise(grads, self.executor.noise())
        if self.audit_probe is not None:
            kept["observed"] = tf.gather_nd(tf.reshape(grads[self.audit_probe.variable_index], [-1]),
                                            self._probe_index)
        grads = self.mechanism.normalise(grads, denominator)
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

    # ----------------------------------------------------------------- across replicas
    def _accumulate(self, batch, round_index):
        return self.executor.run_accumulate(self._replica_accumulate, batch, round_index)

    def _apply(self, denominator, canary_sum):
        for variable, shadow, index in self._slices:  # the slice's current values (e.g. after a restore)
            shadow.assign(tf.reshape(tf.gather_nd(variable, index), shadow.shape))
        self.strategy.run(self._replica_apply, args=(denominator, canary_sum))
        for variable, shadow, index in self._slices:  # only the slice's coordinates are written
            variable.scatter_nd_update(index, tf.reshape(shadow.read_value(), [-1]))
        self.dp_step.assign_add(1)

    # ----------------------------------------------------------------- host API
    def run_step(self, rounds: Sequence[Dict[str, np.ndarray]], num_examples: Optional[float] = None,
                 canary_sum: Optional[np.ndarray] = None, read: bool = True):
        """One logical DP-SGD step over ``rounds`` (R ≥ 1). Returns summed stats (python floats);
        ``read=False``: a :class:`DeviceStats` left on the device (``read_stats``).

        ``canary_sum``: with an ``AuditProbe``, the sum of this step's sampled audit canaries on
        the probe's coordinates (zeros when none was sampled); None takes ``next_canary_sum``."""
        if not rounds:
            raise ValueError("a logical step needs at least one (possibly all-padding) round")
        denominator = tf.constant(self.mechanism.divisor(rounds, num_examples), tf.float32)
        totals: Dict[str, tf.Tensor] = {}
        self._device_norms, self._unit_norms = [], None
        for r, round_batch in enumerate(rounds):
            stats, norms = self._accumulate_fn(self.distribute(round_batch), tf.constant(r, tf.int64))
            self._device_norms.append(norms)  # on the device until asked for (last_unit_norms)
            for key, value in stats.items():  # summed on the device, in float64 (as python floats were)
                value = tf.cast(value, tf.float64)
                totals[key] = totals[key] + value if key in totals else value
        if self.config.non_private and num_examples is None:
            # The baseline's real count is the cluster's (the statistics are summed over every
            # replica of every worker), not this process's rounds: each worker dividing the summed
            # gradient by its own shard's count would scale the update and split the workers' weights.
            denominator = tf.maximum(tf.cast(totals["examples"], tf.float32), 1.0)
        if canary_sum is None and self.next_canary_sum is not None:
            canary_sum, self.next_canary_sum = self.next_canary_sum, None
        canary = _canary_vector(self.audit_probe, canary_sum)
        self.executor.wait_ahead()  # the next draw must be in its buffers before this apply reads them
        self._apply_fn(denominator, tf.constant(canary))
        self.executor.draw_ahead()
        keys = tuple(sorted(totals))
        device = DeviceStats(keys, tf.stack([totals[k] for k in keys]) if keys else tf.zeros([0], tf.float64))
        return device if not read else read_stats([device])[0]
