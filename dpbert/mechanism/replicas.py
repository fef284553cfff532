"""THE REPLICA EXECUTOR of the DP-SGD step: where the mechanism (``dpbert.mechanism.gaussian``) runs.

* Strategy and layout: one process (default or ``MirroredStrategy``, P replicas) or W worker
  processes (``MultiWorkerMirroredStrategy``, R replicas in sync over all of them;
  ``worker_layout``). Round arrays ``[P_local, m, ...]`` go to the replicas by ``distribute``.
* The SUM: each replica's clipped sum (replica-local SyncOnRead accumulators) is all-reduced with
  SUM (``sum_replicas``), bit-identical on every replica; the mechanism adds its one draw after it.
* The noise seed: the chief's (global replica 0), shared by an all-reduce in which every other
  replica contributes 0 (``share_seed``); held in a tensor only.
* Rounds: every worker runs as many collective rounds per step (``sync_step``: the MAX of the
  local round counts, and the chief's go flag — the barrier behind its write-ahead step-log
  entry); a worker with fewer sampled units runs all-padding rounds (``padding_round``: add 0).
* XLA staging (``training.jit_compile``): the per-replica accumulate and the release compiled per
  replica (``xla``); collectives and THE DRAW stay outside (XLA's ``stateless_normal`` is another
  stream), the draw is handed to the compiled release as an input (``staged``). Dropout under
  XLA gets a secret generator per layer (``secret_dropout``).
* The draw made ahead (``noise_ahead``): z depends on (seed, DP step) only, so right after step
  t's apply the draw of step t + 1 goes into device buffers (one replica: on a background thread)
  and is used only if it was keyed on the running DP step. Never checkpointed or written.

Why the noise goes after the SUM and not per replica or per worker: docs/privacy.md, "Where the
noise goes".
"""
from __future__ import annotations

import contextlib
import secrets
import threading
from concurrent import futures
from typing import Dict, Optional

import numpy as np
import tensorflow as tf
import tf_keras

#: Trained coordinates from which the uncompiled step draws its noise ahead by default (a draw of
#: 2²² normals takes ≈ 20 ms on one CPU core; BERT-base's 1.1·10⁸ take 0.8 s: docs/benchmarks.md).
NOISE_AHEAD_MIN_COORDINATES = 1 << 22


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


@tf.__internal__.tracking.no_automatic_dependency_tracking
def _use_generator(rng, generator):
    """A Keras layer's random generator switched to ``generator`` (untracked: never in a checkpoint)."""
    rng._generator = generator  # pylint: disable=protected-access
    rng._rng_type = rng.RNG_STATEFUL  # pylint: disable=protected-access
    rng._built = True  # pylint: disable=protected-access


class _Staged(threading.local):
    """The draw handed to the compiled release, per thread (None: the release draws it)."""

    noise = None


class ReplicaExecutor:
    """Runs the step's per-replica functions on ``strategy`` (module docstring). ``config``: the
    step's ``DPSGDConfig`` (replicas, jit_compile, noise_ahead, non_private, noise_seed)."""

    def __init__(self, strategy: Optional[tf.distribute.Strategy], config):
        self.config = config
        self.strategy = strategy or tf.distribute.get_strategy()
        self._default_strategy = type(self.strategy).__name__ == "_DefaultDistributionStrategy"
        self.replicas = self.strategy.num_replicas_in_sync
        if self.replicas != config.replicas:
            raise ValueError(f"strategy has {self.replicas} replicas, config says {config.replicas}")
        #: Worker processes and this one's rank (``worker_layout``); the replicas of this process.
        self.workers, self.worker_index = worker_layout(self.strategy)
        self.local_replicas = len(self.strategy.extended.worker_devices) if self.workers > 1 else self.replicas
        if self.workers * self.local_replicas != self.replicas:
            raise ValueError(f"{self.workers} workers x {self.local_replicas} local replicas != {self.replicas}")
        self._staged = _Staged()
        self._compiled: Dict = {}
        self.mechanism = None
        self._noise_buffers = None
        self._noise_buffer_step = None
        self._draw_ahead_fn = None
        self._ahead_pool = None
        self._ahead: Optional[futures.Future] = None
        self._sync_fn = None

    # ------------------------------------------------------------------ collectives
    def share_seed(self, seed):
        """One seed for every worker: the chief's (replica 0), shared by an all-reduce in which every
        other replica contributes 0. Held in a tensor only, never logged or stored."""
        return self.from_replica_zero(seed) if self.workers > 1 else seed

    def from_replica_zero(self, value):
        """``value`` as held by global replica 0 (the chief), on every worker (an all-reduce SUM in
        which every other replica contributes zeros)."""
        def replica_fn(x):
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                  tf.where(tf.equal(ctx.replica_id_in_sync_group, 0), x, tf.zeros_like(x)))

        out = tf.function(lambda x: self.strategy.run(replica_fn, args=(x,)), autograph=False)(value)
        return tf.identity(self.strategy.experimental_local_results(out)[0])

    def all_reduce_sum(self, values):
        if self.replicas > 1:
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)
        return values

    def sum_replicas(self, grads):
        """S: the replica-local clipped sums, all-reduced with SUM (identical on every replica)."""
        return self.all_reduce_sum(grads)

    def run_accumulate(self, replica_accumulate, batch, round_index):
        """``replica_accumulate(batch, round_index) -> (stats, norms)`` on every replica (compiled
        with ``jit_compile``): ``(stats summed over every replica of every worker, [norms per
        local replica])``. Several workers: the statistics' all-reduce is a collective of the round."""
        def accumulate(batch, round_index):
            if self.config.jit_compile:
                return self.xla(replica_accumulate)(batch, round_index)
            return replica_accumulate(batch, round_index)

        if self.workers > 1:
            def replica_fn(batch, round_index):
                stats, norms = accumulate(batch, round_index)
                return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, stats), norms

            stats, norms = self.strategy.run(replica_fn, args=(batch, round_index))
            return (self.strategy.experimental_local_results(stats)[0],
                    self.strategy.experimental_local_results(norms))
        stats, norms = self.strategy.run(accumulate, args=(batch, round_index))
        return (self.strategy.reduce(tf.distribute.ReduceOp.SUM, stats, axis=None),
                self.strategy.experimental_local_results(norms))

    def sync_step(self, local_rounds: int, go: bool = True):
        """Agree across worker processes before a step: ``(rounds, go)`` — the MAX of every
        worker's round count (every worker must run as many collective rounds) and the chief's
        go flag (False: the chief refused the step, e.g. over budget). It is a collective all
        workers must enter, so it is also the barrier behind the chief's write-ahead ledger entry.
        One process: ``(local_rounds, go)``, nothing exchanged."""
        if self.workers == 1:
            return int(local_rounds), bool(go)
        if self._sync_fn is None:
            size = self.replicas + 1

            def replica_fn(rounds, flag):
                ctx = tf.distribute.get_replica_context()
                rid = tf.cast(ctx.replica_id_in_sync_group, tf.int64)
                vec = tf.one_hot(rid, size, dtype=tf.int64) * rounds + tf.one_hot(
                    size - 1, size, dtype=tf.int64) * tf.where(tf.equal(rid, 0), flag, tf.zeros_like(flag))
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, vec)

            self._sync_fn = tf.function(lambda r, f: self.strategy.run(replica_fn, args=(r, f)), autograph=False)
        out = self.strategy.experimental_local_results(self._sync_fn(
            tf.constant(int(local_rounds), tf.int64), tf.constant(int(bool(go)), tf.int64)))[0].numpy()
        return int(out[:-1].max()), bool(out[-1])

    @staticmethod
    def padding_round(like: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """An all-padding round shaped like ``like`` (zeros, example mask 0: adds exactly 0)."""
        return {"features": tf.nest.map_structure(lambda a: np.zeros_like(np.asarray(a)), like["features"]),
                "example_mask": np.zeros_like(np.asarray(like["example_mask"], np.float32))}

    def distribute(self, round_batch):
        """One round ``{"features": [P, m, ...], "example_mask": [P, m]}`` as the per-replica input
        (replica p gets ``[p]``)."""
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

    # ------------------------------------------------------------------ XLA staging
    def xla(self, fn):
        """``fn`` XLA-compiled, one function per replica: an XLA cluster runs on one device, so a
        trace capturing one replica's variables must not be shared with another replica."""
        replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        key = (fn.__name__, None if replica is None else int(replica))
        if key not in self._compiled:
            self._compiled[key] = tf.function(fn, jit_compile=True, autograph=False)
        return self._compiled[key]

    def secret_dropout(self, model):
        """Every active Dropout of ``model`` on its own generator, seeded from OS entropy (a test
        noise seed: from it), in the strategy's scope (a stream per replica), never checkpointed:
        compiled stateful ops ignore TensorFlow's seed and would make the masks a public function
        of the batch slot."""
        layers = [layer for layer in model._flatten_layers(include_self=False)  # pylint: disable=protected-access
                  if isinstance(layer, tf_keras.layers.Dropout) and float(layer.rate) > 0]
        for i, layer in enumerate(layers):
            seed = secrets.randbits(62) if self.config.noise_seed is None else int(self.config.noise_seed) * 7919 + i
            with self.strategy.scope():
                generator = tf.random.Generator.from_seed(seed, alg="philox")
            _use_generator(layer._random_generator, generator)  # pylint: disable=protected-access

    @contextlib.contextmanager
    def staged(self, noise):
        """Inside the block, :meth:`noise` is ``noise`` (drawn outside the compiled release)."""
        self._staged.noise = list(noise) if noise else None
        try:
            yield
        finally:
            self._staged.noise = None

    def noise(self):
        """This step's z: the draw staged for the compiled release, else drawn here."""
        staged = self._staged.noise
        return staged if staged is not None else self.mechanism.draw_noise()

    # ------------------------------------------------------------------ the draw made ahead
    def setup(self, model, variables, mechanism):
        """Compiled: secret dropout generators. The draw ahead (compiled, or uncompiled on one
        replica from ``NOISE_AHEAD_MIN_COORDINATES``; ``config.noise_ahead`` decides when set):
        its buffers, of the trained pieces' shapes, replica-local."""
        self.mechanism = mechanism
        if self.config.jit_compile:
            self.secret_dropout(model)
        ahead = self.config.noise_ahead
        if ahead is None:
            ahead = self.config.jit_compile or sum(
                v.shape.num_elements() for v in variables) >= NOISE_AHEAD_MIN_COORDINATES
        if self.config.non_private or not ahead or not (self.config.jit_compile or self.replicas == 1):
            return
        local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        with self.strategy.scope():
            self._noise_buffers = [tf.Variable(tf.zeros(v.shape, v.dtype), name=f"noise_ahead_{i}", **local)
                                   for i, v in enumerate(variables)]
            self._noise_buffer_step = tf.Variable(tf.constant(-1, tf.int64), name="noise_ahead_step", **local)
        self._draw_ahead_fn = tf.function(lambda: self.strategy.run(self._replica_draw_ahead), autograph=False)
        # One replica: a thread (the draw overlaps the host's work); several: enqueued in order.
        self._ahead_pool = futures.ThreadPoolExecutor(1, thread_name_prefix="dpbert-noise") \
            if self.replicas == 1 else None

    def _replica_draw_ahead(self):
        """The draw of the step ``dp_step`` holds now (after an apply: the next one), into the buffers."""
        for buffer, z in zip(self._noise_buffers, self.mechanism.draw_noise()):
            buffer.assign(z)
        self._noise_buffer_step.assign(self.mechanism.dp_step.read_value())

    def _noise_for_apply(self):
        """The buffers when they were drawn for this very DP step, else a draw now (same z)."""
        fresh = tf.equal(self._noise_buffer_step.read_value(), self.mechanism.dp_step.read_value())
        return tf.cond(fresh, lambda: [b.read_value() for b in self._noise_buffers], self.mechanism.draw_noise)

    def noise_outside(self, compiled: bool):
        """The draw handed to the release from outside it: the buffers (if fresh, else drawn now);
        without buffers, drawn now when ``compiled`` (the compiled release must not draw), else
        None (the release draws it)."""
        if self._noise_buffers is not None:
            return self._noise_for_apply()
        return self.mechanism.draw_noise() if compiled else None

    def wait_ahead(self):
        """The next draw must be in its buffers before an apply reads them."""
        if self._ahead is not None:
            self._ahead.result()
            self._ahead = None

    def draw_ahead(self):
        """Start the next step's draw (after an apply)."""
        if self._noise_buffers is None:
            return
        if self._ahead_pool is not None:
            self._ahead = self._ahead_pool.submit(self._draw_ahead_fn)
        else:
            self._draw_ahead_fn()
