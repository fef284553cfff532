"""MLM pre-training with DP-SGD (or the non-private baseline): ``train_mlm``.

One call trains (or resumes) a BERT MLM on already tokenized, padded tuples ``token_ids``
``[n, L]`` (pad id 0) and writes to ``output_dir``::

    checkpoints/        tf.train.CheckpointManager: model, optimizer (its step counter), dp_step
    dp_ledger.json      DP steps EXECUTED in this run chain, written BEFORE each step runs
    run_config.json     the privacy-relevant parameters; a resume with different ones is refused
    model/              model_config.json + Keras weights (``dpbert.model.bert.load_bert``)
    saved_model/        SavedModel of the encoder (optional, ``export_saved_model=True``)
    tensorboard/        loss, MLM accuracy, fraction of clipped examples, batch size, lr
    train_result.json   ``TrainResult``

Step counting across crashes: the checkpoint holds the optimizer's ``iterations`` and the
``dp_step`` counter, so a resumed run continues at the checkpoint's step and stops at the planned
total. Steps executed after the last checkpoint and lost in a crash were still computed on private
data; the write-ahead ledger counts them, and ``TrainResult.steps_taken_total`` (what the
accountant must charge) is the ledger's count, ≥ ``model_step`` (the step of the saved model).

Diagnostics: the per-step loss, MLM accuracy, clipped fraction and batch size are RELEASED only as
DP estimates (``dpbert.privacy.diagnostics``: Gaussian noise on each bounded per-step sum, charged
in the same per-step event, σ_eff); ``TensorBoard`` and ``TrainResult.released_diagnostics`` hold
those. The exact values (``TrainResult.losses`` / ``final_mlm_*`` / ``clipped_fraction``,
``train_result.json``) are computed on the private examples without noise: operator-only, they
stay in the private state directory.

Distribution: ``training.strategy`` default (one device) | mirrored (``MirroredStrategy`` over
the first P devices: GPUs, or logical CPUs made with ``configure_logical_cpus(P)`` BEFORE
TensorFlow initialises its devices — which is how P = 2 is tested on a CPU machine) | tpu
(``TPUClusterResolver(tpu=$TPU_NAME)``, ``experimental_connect_to_cluster``,
``initialize_tpu_system``, ``TPUStrategy`` — the same host loop; untested here, there is no TPU).
multi_worker (``MultiWorkerMirroredStrategy`` over the cluster in ``$TF_CONFIG``, as Vertex AI
custom jobs and Kubeflow's TFJob set it; every worker process calls ``train_mlm`` with the same
inputs and the same shared ``output_dir``): worker w keeps the units with
``sampling.shard_of(id, W) == w`` (a patient's tuples on one worker) and Poisson-samples its own
units at q with a fresh key per process; the noise seed is the chief's, shared by an all-reduce,
and the one draw is added after the SUM (``dpbert.model.dpsgd``: identical parameters on every
worker). Only the CHIEF (rank 0) locks and writes the state directory (ledger, run_config,
TensorBoard, model/, train_result.json, integrity_checks.json, checkpoints); non-chief workers
save their checkpoints to a temporary directory removed at once (TF's MWMS rule: every worker
saves) and restore from the chief's. Each step: the chief checks the budget and writes its
write-ahead ledger entry, then every worker enters ``DPSGDTrainStep.sync_step`` (the max round
count and the chief's go flag, an all-reduce: the barrier), so no worker computes a step the
chief has not charged. A resume with another W is allowed and charges every executed step (the
ledger counts steps, whoever ran them; keys are fresh per process, so no batch is re-drawn).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import math
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tf_keras

from dpbert.model import bert as bert_lib
from dpbert.model import dpsgd, integrity, masking, sampling
from dpbert.model import trainable as trainable_lib
from dpbert.privacy import diagnostics
from dpbert.privacy.plan import TrainingPlan, plan_training

log = logging.getLogger(__name__)

LEDGER_FILE = "dp_ledger.json"
RUN_CONFIG_FILE = "run_config.json"
RESULT_FILE = "train_result.json"
MASK_TOKEN_NAMES = ("[MASK]", "<mask>", "MASK")


class StateDirectoryBusy(RuntimeError):
    """Another training run holds the state directory (its checkpoints and step ledger)."""


LOCK_FILE = ".lock"


class HeldStateLock:
    """What ``state_lock`` yields: proof that this caller holds a state directory's lock, passed on
    to ``train_mlm(held_lock=...)`` by a caller (the trainer stage) that locks before it plans."""

    def __init__(self, path: Path):
        self.path = path
        self.held = True


@contextlib.contextmanager
def state_lock(output_dir):
    """Exclusive lock on a trainer state directory for the whole run.

    Two runs started into the same output used to share one checkpoint directory and one
    write-ahead ledger: both trained on the private data and the ledger ended at the count of
    one (10 steps ran, 5 charged). With the lock, the second run is refused before it reads
    anything, so every executed step is in the ledger of the run that executed it. ``flock`` is
    released by the kernel when the process dies, so a crashed run never leaves a stale lock.
    Yields a :class:`HeldStateLock`; not re-entrant (a second ``state_lock`` of the same directory
    is refused even in this process): hand the held lock to ``train_mlm`` instead.
    """
    import fcntl

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    handle = open(output_dir / LOCK_FILE, "a+")
    held = HeldStateLock(output_dir.resolve())
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateDirectoryBusy(
                f"another training run is using {output_dir} (its checkpoints and DP step ledger); "
                f"wait for it to finish, or train into another output directory") from None
        yield held
    finally:
        held.held = False
        handle.close()


class BudgetExhausted(RuntimeError):
    """The next step would charge more than ``privacy.epsilon_budget`` covers: refused BEFORE the
    step's write-ahead ledger entry, so no step beyond the budget ever runs. ``steps_executed``:
    the steps charged so far (this chain), ``limit``: the most the budget covers, ``sigma``: the
    accounted σ per step."""

    def __init__(self, steps_executed: int, limit: int, sigma: float):
        self.steps_executed, self.limit, self.sigma = int(steps_executed), int(limit), float(sigma)
        super().__init__(f"the privacy budget covers {self.limit} DP-SGD steps and {self.steps_executed} "
                         f"have been charged; the next step was refused")


class SimulatedCrash(RuntimeError):
    """Raised by ``train_mlm(..., stop_after_steps=k)`` (tests): stops like a crash, no final save."""


@dataclasses.dataclass
class TrainResult:
    steps_taken_total: int
    steps_this_run: int
    model_step: int
    resumed_from_step: int
    steps_planned: int
    losses: List[float]
    final_mlm_loss: float
    final_mlm_accuracy: float
    clipped_fraction: float
    sampling_mode: str
    sampling_rate: float
    expected_batch_size: float
    logical_batch: int
    replicas: int
    accumulation: int
    micro_batch: int
    noise_multiplier: float
    #: σ the accountant must charge per step: the gradient's σ combined with the DP diagnostics
    #: (``dpbert.privacy.diagnostics``); equals ``gradient_noise_multiplier`` without diagnostics.
    effective_noise_multiplier: float
    #: σ of the gradient noise actually applied (σ, or σ√(P·T) in the paper's noise mode).
    gradient_noise_multiplier: float
    #: The RELEASED per-step diagnostics (noisy for a DP run; exact for the private baseline):
    #: lists ``loss``, ``accuracy``, ``clipped_fraction``, ``batch_size`` for this run's steps.
    released_diagnostics: dict
    #: Std of the noise on each released diagnostic sum (empty without DP diagnostics).
    diagnostics_noise_std: dict
    #: PRIVATE: the exact per-step sums the released diagnostics were computed from.
    exact_diagnostic_sums: list
    noise_mode: str
    clip_norm: float
    non_private: bool
    epsilon: Optional[float]
    delta: Optional[float]
    dataset_size: int
    planned_dataset_size: int
    clipping_path: str
    strategy: str
    seconds: float
    model_dir: str
    checkpoint_dir: str
    saved_model_dir: Optional[str]
    tensorboard_dir: str
    ledger_path: str
    #: The values the DP event must agree with, read from the running sampler, step and ledger
    #: (``integrity.observe``; ``dpbert.privacy.event_check``). PRIVATE (shuffle: the exact n).
    observed: dict = dataclasses.field(default_factory=dict)
    #: PRIVATE: the run-time integrity checks (``dpbert.model.integrity``): which ran, statistic,
    #: tolerance, passed — with exact counts.
    integrity_checks: dict = dataclasses.field(default_factory=dict)
    #: What DP-SGD trained (``training.trainable``): the sets and the trained parameter count.
    trainable: dict = dataclasses.field(default_factory=dict)
    #: Worker processes of the run (``training.strategy: multi_worker``) and this one's rank (0: chief).
    workers: int = 1
    worker_rank: int = 0
    #: sha256 of the released (merged) MLM weights: every worker of a run must hold the same.
    parameter_digest: str = ""

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if data["epsilon"] is not None and math.isinf(data["epsilon"]):
            data["epsilon"] = "inf"
        return data


# --------------------------------------------------------------------------- devices / strategy
def configure_logical_cpus(count: int):
    """Split the first CPU into ``count`` logical devices. Must run before TF initialises devices
    (i.e. before any op runs); raises RuntimeError otherwise."""
    cpus = tf.config.list_physical_devices("CPU")
    existing = tf.config.get_logical_device_configuration(cpus[0])
    if existing is not None and len(existing) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError as err:
        raise RuntimeError(
            f"cannot split the CPU into {count} logical devices after TensorFlow has initialised; "
            f"call configure_logical_cpus({count}) first thing in the process") from err


def mirrored_strategy(replicas: int) -> tf.distribute.MirroredStrategy:
    """``MirroredStrategy`` over the first ``replicas`` GPUs, else logical CPUs.

    On CPUs the all-reduce is ``ReductionToOneDevice``: TF's collective all-reduce keys its
    collective instances per process, and a second MirroredStrategy in the same process (e.g. a
    noise check, then a training run) then fails with a collective shape mismatch.
    """
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) >= replicas:
        return tf.distribute.MirroredStrategy(devices=[d.name for d in gpus[:replicas]])
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < replicas:
        raise ValueError(
            f"mirrored strategy with {replicas} replicas needs {replicas} devices, found {len(cpus)}; "
            f"on a CPU machine call configure_logical_cpus({replicas}) before TensorFlow starts")
    return tf.distribute.MirroredStrategy(devices=[d.name for d in cpus[:replicas]],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


def make_strategy(name: str, replicas: int) -> tf.distribute.Strategy:
    if name == "default":
        if replicas != 1:
            raise ValueError(f"training.replicas={replicas} needs training.strategy mirrored or tpu")
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return mirrored_strategy(replicas)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        if strategy.num_replicas_in_sync != replicas:
            raise ValueError(f"TPU has {strategy.num_replicas_in_sync} replicas, config says {replicas}")
        return strategy
    if name == "multi_worker":
        return multi_worker_strategy(replicas)
    raise ValueError(f"unknown strategy {name!r}")


def multi_worker_strategy(replicas: int) -> tf.distribute.MultiWorkerMirroredStrategy:
    """``MultiWorkerMirroredStrategy`` over the cluster in ``$TF_CONFIG`` (Vertex AI custom jobs and
    Kubeflow's TFJob set it): every process of the job calls this, with the same ``replicas`` = R,
    the replicas of all workers together. Must run before TensorFlow executes its first op in the
    process (the collectives are configured then). Ring all-reduce on CPUs; NCCL picked by TF on GPUs."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().jobs:
        raise ValueError("training.strategy multi_worker needs the cluster in $TF_CONFIG (set by Vertex AI "
                         "custom jobs and Kubeflow's TFJob; see README 'Scaling out')")
    gpus = tf.config.list_physical_devices("GPU")
    implementation = tf.distribute.experimental.CommunicationImplementation.AUTO if gpus else \
        tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
    if strategy.num_replicas_in_sync != replicas:
        raise ValueError(f"the TF_CONFIG cluster has {strategy.num_replicas_in_sync} replicas in sync, "
                         f"training.replicas says {replicas}")
    return strategy


# --------------------------------------------------------------------------- schedule
class WarmupLinearDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """BERT's schedule: linear warmup 0 → peak over ``warmup_steps``, then linear decay to 0 at
    ``total_steps``."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak, self.warmup_steps, self.total_steps = float(peak), int(warmup_steps), int(total_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        total = tf.cast(max(self.total_steps, self.warmup_steps + 1), tf.float32)
        up = self.peak * (step + 1.0) / warmup
        down = self.peak * tf.maximum(total - step, 0.0) / tf.maximum(total - float(self.warmup_steps), 1.0)
        return tf.where(step < float(self.warmup_steps), up, down)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


def make_optimizer(training_config, total_steps: int):
    """AdamW (decoupled weight decay, not on LayerNorm or biases) with ``WarmupLinearDecay``."""
    schedule = WarmupLinearDecay(training_config.learning_rate, training_config.warmup_steps, total_steps)
    optimizer = tf_keras.optimizers.AdamW(learning_rate=schedule, weight_decay=training_config.weight_decay,
                                          beta_1=0.9, beta_2=0.999, epsilon=1e-6, jit_compile=False)
    optimizer.exclude_from_weight_decay(var_names=["layer_norm", "bias"])
    optimizer.dpbert_schedule = schedule
    return optimizer


# --------------------------------------------------------------------------- MLM functions
def _mask_token_id(special_token_ids, mask_token_id):
    if mask_token_id is not None:
        return int(mask_token_id)
    if isinstance(special_token_ids, Mapping):
        for name in MASK_TOKEN_NAMES:
            if name in special_token_ids:
                return int(special_token_ids[name])
    raise ValueError("pass special_token_ids as a mapping with '[MASK]', or mask_token_id=")


def make_mlm_functions(spec: bert_lib.BertSpec, special_ids: Sequence[int], mask_token_id: int,
                       mask_probability: float):
    """(mask_fn, prepare_fn, loss_fn, metrics_fn) for ``dpsgd.DPSGDTrainStep`` on the MLM model.

    ``mask_fn(token_ids [b, L], keys [b]) -> features`` masks on the host (``dpbert.model.masking``,
    keys from ``masking.example_keys(secret key, step, example ids)``); ``prepare_fn(features)``
    splits them into model inputs and targets inside the step.
    """

    def mask_fn(token_ids, keys):
        masked = masking.mask_tokens(
            token_ids, keys, special_token_ids=special_ids, mask_token_id=mask_token_id,
            vocab_size=spec.vocab_size, max_predictions=spec.max_predictions,
            mask_probability=mask_probability, pad_id=spec.pad_id)
        return {k: masked[k] for k in ("input_ids", "masked_positions", "masked_labels", "masked_weights")}

    def prepare_fn(features):
        inputs = {"input_ids": features["input_ids"], "masked_positions": features["masked_positions"]}
        return inputs, (features["masked_labels"], features["masked_weights"])

    def loss_fn(targets, logits):
        labels, weights = targets
        return dpsgd.per_example_mlm_loss(labels, logits, weights)

    def metrics_fn(targets, logits, example_mask, group_size: int = 1):
        labels, weights = targets
        weights = weights * example_mask[:, tf.newaxis]
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
        per_example = tf.math.divide_no_nan(tf.reduce_sum(correct * weights, axis=1), tf.reduce_sum(weights, axis=1))
        if group_size > 1:  # per patient: the mean accuracy of its own tuples, still in [0, 1]
            accuracy_sum = tf.reduce_sum(dpsgd._group_mean(per_example * example_mask, example_mask, group_size))  # pylint: disable=protected-access
        else:
            accuracy_sum = tf.reduce_sum(per_example * example_mask)
        return {"correct": tf.reduce_sum(correct * weights), "predictions": tf.reduce_sum(weights),
                # Σ_i accuracy_i ∈ [0, 1] per unit: sensitivity 1 (dpbert.model.diagnostics).
                "accuracy_sum": accuracy_sum}

    return mask_fn, prepare_fn, loss_fn, metrics_fn


def mlm_rounds(mask_fn, token_ids: np.ndarray, example_ids: np.ndarray, indices: np.ndarray, mask_key: int,
               step: int, micro_batch: int, replicas: int):
    """The rounds of one logical MLM step: the sampled rows masked by (key, step, their own ids),
    then packed (``sampling.pack_rounds``)."""
    indices = np.asarray(indices, dtype=np.int64)
    features = mask_fn(token_ids[indices], masking.example_keys(mask_key, step, example_ids[indices]))
    return sampling.pack_rounds(features, np.arange(indices.size), micro_batch, replicas)


def mlm_patient_rounds(mask_fn, token_ids: np.ndarray, example_ids: np.ndarray, patients, mask_key: int,
                       step: int, k: int, micro_patients: int, replicas: int):
    """The rounds of one user-level MLM step: each sampled patient's ≤ k rows masked by (key,
    step, their own ids), packed k slots per patient (``sampling.pack_patient_rounds``)."""
    rows = np.concatenate([np.asarray(p, dtype=np.int64) for p in patients]) if patients else \
        np.zeros(0, np.int64)
    features = mask_fn(token_ids[rows], masking.example_keys(mask_key, step, example_ids[rows])) if rows.size \
        else mask_fn(token_ids[:1], masking.example_keys(mask_key, step, example_ids[:1]))
    local, start = [], 0
    for p in patients:  # positions of each patient's rows in ``features``
        local.append(np.arange(start, start + len(p)))
        start += len(p)
    return sampling.pack_patient_rounds(features, local, k, micro_patients, replicas)


# --------------------------------------------------------------------------- ledger
def _read_json(path: Path, default):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


def _write_json_atomic(path: Path, data):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


SHUFFLE_KEY_FILE = "shuffle_key.json"


def _shuffle_key(output_dir: Path, test_seed: Optional[int]) -> int:
    """The secret key of the shuffle stream, kept in the (private) state directory so a resumed
    run continues the same permutations (``sampling.ShuffleSampler``)."""
    path = output_dir / SHUFFLE_KEY_FILE
    stored = _read_json(path, None)
    if stored is not None:
        return int(stored["key"])
    key = secrets.randbits(63) if test_seed is None else int(test_seed)
    _write_json_atomic(path, {"key": key})
    os.chmod(path, 0o600)
    return key


def _holding_state_lock(train):
    """Run ``train`` holding ``state_lock(output_dir)`` for its whole duration."""
    signature = inspect.signature(train)

    @functools.wraps(train)
    def locked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        output_dir = Path(bound["output_dir"])
        held = kwargs.get("held_lock")
        if _non_chief_worker(bound.get("training_config"), bound.get("strategy")):
            # A non-chief worker of a multi-worker job writes nothing to the state directory; the
            # chief (rank 0) holds its lock.
            return train(*args, **kwargs)
        if held is not None:  # the caller locked before planning (dpbert.stages.pretrain)
            if not (held.held and held.path == output_dir.resolve()):
                raise ValueError(f"held_lock is not a held lock of {output_dir}")
            return train(*args, **kwargs)
        with state_lock(output_dir):
            return train(*args, **kwargs)

    return locked


def _non_chief_worker(training_config, strategy) -> bool:
    """True in a worker process of rank > 0 of a multi-worker job (decided from the given
    strategy, else from ``$TF_CONFIG`` when ``training.strategy`` is multi_worker)."""
    if strategy is not None:
        return dpsgd.worker_layout(strategy)[1] > 0
    if getattr(training_config, "strategy", None) != "multi_worker":
        return False
    from tensorflow.python.distribute import multi_worker_util  # pylint: disable=import-outside-toplevel

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    if not spec.jobs or resolver.task_type is None:
        return False
    return multi_worker_util.id_in_cluster(spec, resolver.task_type, resolver.task_id) > 0


# --------------------------------------------------------------------------- main entry point
@_holding_state_lock
def train_mlm(token_ids: np.ndarray, special_token_ids: Union[Mapping[str, int], Sequence[int]],
              vocab_size: int, model_config, training_config, output_dir,
              plan: Optional[TrainingPlan] = None, resume: bool = True, progress: bool = True,
              *, mask_token_id: Optional[int] = None, noise_mode: str = "once",
              export_saved_model: bool = True, stop_after_steps: Optional[int] = None,
              strategy: Optional[tf.distribute.Strategy] = None,
              vocab_tokens: Optional[Sequence[str]] = None, public_checkpoint_dir=None,
              example_ids: Optional[np.ndarray] = None, initial_weights: Optional[list] = None,
              patient_keys: Optional[Sequence[str]] = None,
              charge_limit: Optional[Callable[[float, int], int]] = None,
              held_lock: Optional[HeldStateLock] = None,
              new_token_ids: Optional[Sequence[int]] = None,
              prf_sampling_key: Optional[int] = None) -> TrainResult:
    """Pre-train (or resume) a BERT MLM with DP-SGD; see the module docstring for the outputs.

    ``plan``: the ``dpbert.privacy.plan.TrainingPlan`` the budget was checked against (q, steps,
    P, T); default (library use, tests): planned from ``training.dataset_size`` or, without it,
    the exact n — the pipeline always passes a public or DP-counted plan. Its q is used
    exactly whatever the actual n.
    ``special_token_ids``: mapping name → id (must contain ``[MASK]``) or a sequence of ids plus
    ``mask_token_id``. ``stop_after_steps`` (tests): raise ``SimulatedCrash`` after that many steps
    of this run, without saving, like a crash. ``model.init: minilm`` takes the sizes from the public
    checkpoint (``dpbert.model.init_public``) and needs ``vocab_tokens`` (the token strings of the
    new vocabulary, index = id) to copy the shared rows. ``example_ids`` ``[n]``: each row's own
    record id (integers, e.g. ``WordTuple.record_id``; default the row index), which keys its MLM
    masks. Two records with one id get correlated masks — harmless to privacy (no other record's
    mask depends on them). ``initial_weights``: the MLM model's starting weights (``get_weights()``
    order), e.g. the public start of ``dpbert.model.public_warmup``, instead of
    ``init_from_checkpoint``; a resumed run restores its checkpoint over them.
    ``patient_keys`` ``[n]``: each row's patient (``dpbert.data.splits.patient_key``), required by a
    plan with ``unit == "patient"`` (user-level DP-SGD: patients Poisson-sampled at the plan's q,
    ≤ k rows each chosen by a secret PRF of (key, patient, step), the patient's summed gradient
    clipped to C; ``dpbert.model.dpsgd``).
    ``charge_limit(σ_accounted, steps_needed) -> L``: the most DP steps the privacy budget covers
    for this chain (``dpbert.stages.pretrain.budget_step_limit``), asked once with the σ the
    accountant will charge and the ledger's count once this run finishes; a step that would make
    the ledger exceed L is refused (:class:`BudgetExhausted`) BEFORE its write-ahead entry.
    ``held_lock``: ``state_lock(output_dir)``'s value when the caller already holds the lock;
    otherwise ``train_mlm`` takes it for its whole duration.
    ``new_token_ids``: the ids the DP vocabulary appended to the public one (``token_sources.json``
    ``ranges.dp``, ``trainable.new_token_ids_from_sources``); required by ``training.trainable``
    ``new_tokens``. What DP-SGD trains is ``training.trainable`` (``dpbert.model.trainable``):
    the model is built with LoRA adapters when the set has ``lora`` (base weights from the public
    start), only the selected pieces get gradients, noise and optimizer state, and the released
    ``model/`` holds the MERGED weights (a plain BERT).
    ``strategy``: with ``MultiWorkerMirroredStrategy`` (``training.strategy: multi_worker``) every
    worker calls ``train_mlm`` with the same arguments (module docstring).
    ``prf_sampling_key`` (TESTS ONLY; refused with OS-entropy noise): the Poisson coins are
    ``sampling.prf_uniform(key, unit id, step) < q``, the same units in every worker layout.
    """
    t0 = time.time()
    tc = training_config
    trainable_names = trainable_lib.validate_names(list(getattr(tc, "trainable", ["all"])))
    lora_spec = bert_lib.LoRASpec(int(tc.lora_rank), float(tc.lora_alpha)) \
        if trainable_lib.needs_lora(trainable_names) else None
    if "new_tokens" in trainable_names and new_token_ids is None:
        raise ValueError("training.trainable new_tokens needs a public or public+dp vocabulary (its "
                         "token_sources.json says which token ids the DP vocabulary appended)")
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer):
        raise ValueError(f"token_ids must be an integer array [n, L], got {token_ids.dtype} {token_ids.shape}")
    n, length = token_ids.shape
    if n < 1:
        raise ValueError("token_ids is empty")
    if length > model_config.max_seq_length:
        raise ValueError(f"sequences of length {length} exceed model.max_seq_length {model_config.max_seq_length}")
    if length < model_config.max_seq_length:
        token_ids = np.pad(token_ids, [(0, 0), (0, model_config.max_seq_length - length)])
    token_ids = token_ids.astype(np.int32)
    if example_ids is None:
        example_ids = np.arange(n, dtype=np.int64)
    example_ids = np.asarray(example_ids)
    if example_ids.shape != (n,):
        raise ValueError(f"example_ids must have shape ({n},), got {example_ids.shape}")
    if token_ids.max() >= vocab_size or token_ids.min() < 0:
        raise ValueError(f"token ids must be in [0, {vocab_size})")
    mask_id = _mask_token_id(special_token_ids, mask_token_id)
    specials = sorted(set(int(v) for v in (special_token_ids.values() if isinstance(special_token_ids, Mapping)
                                            else special_token_ids)) | {mask_id, 0})

    if prf_sampling_key is not None and tc.noise_seed is None:
        raise ValueError("prf_sampling_key is for tests only (with training.noise_seed)")
    # The strategy first: MultiWorkerMirroredStrategy must exist before TensorFlow runs an op.
    strategy = strategy or make_strategy(tc.strategy, tc.replicas)
    workers, worker_rank = dpsgd.worker_layout(strategy)
    chief = worker_rank == 0
    if workers > 1 and tc.sampling != "poisson":
        raise ValueError("training.sampling must be poisson with several worker processes")
    if plan is None:
        plan = plan_training(tc, tc.dataset_size if tc.dataset_size is not None else n)
    elif (plan.sampling, plan.batch_size, plan.replicas, plan.accumulation_steps) != \
            (tc.sampling, tc.batch_size, tc.replicas, tc.accumulation_steps):
        raise ValueError(f"the plan {plan.to_dict()} was not made from this training configuration")
    n_planned, q, expected_batch = plan.dataset_size, plan.sampling_probability, plan.expected_batch_size
    steps_planned = plan.steps
    P, T, m = plan.replicas, plan.accumulation_steps, plan.micro_batch
    patient_unit = getattr(plan, "unit", "tuple") == "patient"
    k = plan.max_contributions if patient_unit else 1
    groups = None
    if patient_unit:
        if patient_keys is None or len(patient_keys) != n:
            raise ValueError(f"a patient-unit plan needs patient_keys for each of the {n} rows")
        groups = sampling.group_rows(patient_keys)

    output_dir = Path(output_dir)
    if chief:
        output_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = output_dir / "checkpoints"
    tb_dir = output_dir / "tensorboard"
    ledger_path = output_dir / LEDGER_FILE
    if model_config.init == "minilm":
        from dpbert.model import init_public
        if vocab_tokens is None:
            raise ValueError("model.init=minilm needs vocab_tokens (the new vocabulary's token strings)")
        spec = init_public.spec_for_public(model_config, vocab_size, tc.mask_probability, public_checkpoint_dir)
    else:
        spec = bert_lib.spec_from_config(model_config, vocab_size, tc.mask_probability)
    run_config = {
        "spec": spec.to_dict(), "batch_size": tc.batch_size, "sampling": tc.sampling, "q": q,
        "noise_multiplier": 0.0 if tc.non_private else tc.noise_multiplier, "clip_norm": tc.clip_norm,
        "non_private": tc.non_private, "noise_mode": noise_mode, "mask_probability": tc.mask_probability,
        "specials": specials, "mask_token_id": mask_id, "init": model_config.init,
        # The accounted σ depends on the diagnostics: a resume must not change them.
        "diagnostics": dataclasses.asdict(diagnostics.config_of(tc)),
    }
    if patient_unit:  # only then: a tuple-level state directory resumes as before
        run_config.update(unit="patient", max_contributions=k)
    if trainable_names != ["all"]:  # only then: an existing state directory resumes as before
        run_config["trainable"] = {"sets": trainable_names,
                                   "lora_rank": None if lora_spec is None else lora_spec.rank,
                                   "lora_alpha": None if lora_spec is None else lora_spec.alpha}
    if chief and not resume and (ckpt_dir.exists() or ledger_path.exists()):
        old = _read_json(ledger_path, {})
        log.warning("resume=False: discarding checkpoints in %s (previous chain executed %s DP steps)",
                    ckpt_dir, old.get("steps_executed"))
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        (output_dir / SHUFFLE_KEY_FILE).unlink(missing_ok=True)  # a new chain, a new stream
        history = old.get("history", []) + ([{"steps_executed": old["steps_executed"]}] if old else [])
        _write_json_atomic(ledger_path, {"steps_executed": 0, "history": history})
    previous = _read_json(output_dir / RUN_CONFIG_FILE, None)
    if resume and previous is not None and (ckpt_dir.exists() and tf.train.latest_checkpoint(str(ckpt_dir))):
        if previous != json.loads(json.dumps(run_config)):
            current = json.loads(json.dumps(run_config))
            diff = sorted(k for k in set(current) | set(previous) if previous.get(k) != current.get(k))
            raise ValueError(f"cannot resume {output_dir}: parameters changed ({', '.join(diff)}); "
                             f"use a new output_dir or resume=False")
    if chief:
        _write_json_atomic(output_dir / RUN_CONFIG_FILE, run_config)
    diag = diagnostics.config_of(tc)
    release_diagnostics = diag.enabled and not tc.non_private
    dp_config = dpsgd.DPSGDConfig(
        clip_norm=tc.clip_norm, noise_multiplier=tc.noise_multiplier, expected_batch_size=expected_batch,
        non_private=tc.non_private, noise_mode=noise_mode, noise_seed=tc.noise_seed, replicas=P,
        accumulation_steps=T, loss_bound=diag.loss_bound if release_diagnostics else None, group_size=k)
    gradient_sigma = dp_config.effective_noise_multiplier
    # What the accountant must charge per step: the gradient and the released diagnostics together.
    accounted_sigma = diagnostics.effective_noise_multiplier(gradient_sigma, diag) if release_diagnostics \
        else gradient_sigma
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, specials, mask_id, tc.mask_probability)
    if tc.noise_seed is None:
        # Dropout draws its masks per batch SLOT from TensorFlow's global RNG. Keyed by a public
        # seed (another stage may have called set_random_seed in this process) that would be the
        # slot-keyed-mask bug again; from secret entropy the masks are i.i.d. across slots and
        # independent of the data, so an example's mask is exchangeable whatever its slot and
        # adding/removing one example leaves the others' mask distribution unchanged (the
        # clipped-sum sensitivity C holds conditionally on the masks, then by joint convexity).
        # The initialisation keeps its own explicit seeds (training.seed).
        tf.random.set_seed(secrets.randbits(31))
    with strategy.scope():
        models = bert_lib.build_bert(spec, seed=tc.seed)
        if initial_weights is not None:
            models.mlm.set_weights(initial_weights)
            log.info("initialised from the given (public) weights")
        elif model_config.init == "minilm":
            init_stats = init_public.init_from_checkpoint(models, vocab_tokens, public_checkpoint_dir, tc.seed)
            log.info("initialised from the public checkpoint: %s", init_stats)
        if lora_spec is not None:  # adapters (B = 0) on the start above, which becomes the frozen base
            models = bert_lib.add_lora(models, lora_spec, seed=tc.seed)
        selection = trainable_lib.select(models, trainable_names, new_token_ids)
        optimizer = make_optimizer(tc, steps_planned)
    log.info("training.trainable %s: %d trained parameters of %d", ",".join(trainable_names), selection.size,
             bert_lib.count_parameters(spec))
    stepper = dpsgd.DPSGDTrainStep(models.mlm, optimizer, dp_config, prepare_fn=prepare_fn,
                                   loss_fn=loss_fn, metrics_fn=metrics_fn, strategy=strategy,
                                   noise_probe=None if tc.non_private else integrity.make_noise_probe(
                                       selection.pieces, seed=tc.noise_seed), selection=selection)
    checkpoint = tf.train.Checkpoint(model=models.mlm, optimizer=optimizer, dp_step=stepper.dp_step)
    if workers > 1:
        stepper.sync_step(0)  # the chief's set-up of the state directory (discard, run_config) is done
    latest = tf.train.latest_checkpoint(str(ckpt_dir)) if resume else None
    manager = tf.train.CheckpointManager(checkpoint, str(ckpt_dir), max_to_keep=3) if chief else None
    start_step = 0
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        start_step = int(stepper.dp_step.numpy())
        if int(optimizer.iterations.numpy()) != start_step:
            raise RuntimeError("checkpoint's optimizer step and DP step disagree")
        log.info("resumed from %s at step %d", latest, start_step)
    last_saved = start_step if latest else None

    def save_checkpoint(number: int):
        # Every worker saves (TF's multi-worker rule); a non-chief to a temporary directory, removed at once.
        if chief:
            manager.save(checkpoint_number=number)
            return
        import tempfile  # pylint: disable=import-outside-toplevel

        tmp = tempfile.mkdtemp(prefix=f"dpbert-worker{worker_rank}-ckpt-")
        try:
            checkpoint.write(os.path.join(tmp, "ckpt"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    if chief:
        ledger = _read_json(ledger_path, {"steps_executed": 0})
        ledger["steps_executed"] = max(int(ledger.get("steps_executed", 0)), start_step)
        if not tc.non_private:
            # The σ every executed step is charged at (a resume with another σ is refused above), so
            # the ε a chain has spent can be read off its state directory after any stop.
            ledger["noise_multiplier_accounted"] = accounted_sigma
        _write_json_atomic(ledger_path, ledger)
    else:  # the chief's ledger is the record; a non-chief only counts what it ran
        ledger = {"steps_executed": start_step}

    step_limit = None
    if chief and charge_limit is not None and not tc.non_private:
        # Asked with what this chain will have charged when the run completes (earlier runs'
        # executed steps, lost ones included, plus the steps from the checkpoint to the plan's end).
        step_limit = int(charge_limit(accounted_sigma, int(ledger["steps_executed"]) + steps_planned - start_step))

    sampling_seed = None if tc.noise_seed is None else [int(tc.noise_seed), start_step] + \
        ([workers, worker_rank] if workers > 1 else [])
    diag_rng = np.random.default_rng(None if tc.noise_seed is None else [int(tc.noise_seed), 0xD1A6, start_step])
    # The MLM masks' key: secret (OS entropy), fresh for every process; a test seed makes it fixed.
    mask_key = secrets.randbits(64) if tc.noise_seed is None else (int(tc.noise_seed) * 7919 + 17)
    if patient_unit:
        # The secret key of each patient's choice of ≤ k tuples (OS entropy; a test seed fixes it).
        choice_key = secrets.randbits(63) if tc.noise_seed is None else int(tc.noise_seed) * 104729 + 3
        shard = None if workers == 1 else np.nonzero(sampling.shard_of(groups.ids, workers) == worker_rank)[0]
        sampler = sampling.PatientPoissonSampler(groups, q, k, choice_key, seed=sampling_seed, shard=shard,
                                                 prf_key=prf_sampling_key)
    elif tc.sampling == "poisson":
        # Worker w holds the rows whose record id hashes to w (module docstring of sampling.py).
        shard = None if workers == 1 else np.nonzero(sampling.shard_of(example_ids, workers) == worker_rank)[0]
        sampler = sampling.PoissonSampler(n, q, seed=sampling_seed, shard=shard, prf_key=prf_sampling_key,
                                          prf_ids=example_ids if prf_sampling_key is not None else None)
    else:
        sampler = sampling.ShuffleSampler(n, tc.batch_size, key=_shuffle_key(output_dir, tc.noise_seed))
    # Run-time integrity checks (sampler vs the plan's q over the EXACT n, brute-force clipping, noise).
    checks = integrity.RunChecks(stepper, sampling_mode=tc.sampling, units=len(groups) if patient_unit else n, q=q,
                                 batch_size=tc.batch_size, every=tc.integrity_check_every,
                                 output_dir=output_dir if chief else None, seed=tc.noise_seed)
    # The planned n only: the exact number of rows is a private count and never goes to a log line.
    log.info("train_mlm: planned n=%d %s, %s sampling q=%.6g, E[batch]=%.2f, P=%d, T=%d, m=%d, "
             "sigma=%s, C=%s, non_private=%s, steps %d→%d", n_planned,
             f"patients (<= {k} tuples each, user-level)" if patient_unit else "tuples", tc.sampling, q,
             expected_batch, P, T, m, tc.noise_multiplier, tc.clip_norm, tc.non_private, start_step, steps_planned)

    writer = tf.summary.create_file_writer(str(tb_dir)) if chief else tf.summary.create_noop_writer()
    # A progress bar on a terminal; elsewhere (TFX logs, CI, a pipe) one log line every 30 s.
    bar = _Progress(steps_planned, start_step, "DP-SGD" if not tc.non_private else "SGD (non-private)",
                    label="exact (private)" if tc.non_private else "DP estimate",
                    step_noise_std=diagnostics.step_noise_stds(
                        diagnostics.noise_stds(gradient_sigma, diag), expected_batch).get("loss")
                    if release_diagnostics else None) if progress and chief else None
    losses: List[float] = []
    released: dict = {"loss": [], "accuracy": [], "clipped_fraction": [], "batch_size": []}
    exact_sums: List[dict] = []
    last_accuracy = float("nan")
    clipped_total = examples_total = 0.0
    steps_this_run = 0
    step = start_step
    try:
        while step < steps_planned:
            if stop_after_steps is not None and steps_this_run >= stop_after_steps:
                raise SimulatedCrash(f"simulated crash after {steps_this_run} steps (at step {step})")
            go = not (step_limit is not None and ledger["steps_executed"] + 1 > step_limit)
            if workers == 1 and not go:
                raise BudgetExhausted(ledger["steps_executed"], step_limit, accounted_sigma)
            # The shuffle stream's window: the ledger's count of steps ever executed in this chain,
            # not the checkpoint's step, so steps replayed after a crash read NEW windows and every
            # row takes part ceil(executed·B/n) times at most — what the record charges.
            window = ledger["steps_executed"]
            if go:
                ledger["steps_executed"] += 1  # write-ahead: a step that starts is charged
                if chief:
                    _write_json_atomic(ledger_path, ledger)
            # This process's replicas (all of them in one process; P_w of a worker).
            local_p = stepper.local_replicas
            if patient_unit:
                rounds = mlm_patient_rounds(mask_fn, token_ids, example_ids, sampler.sample_patients(step),
                                            mask_key, step, k, m, local_p)
            else:
                indices = sampler.sample(window if tc.sampling == "shuffle" else step)
                rounds = mlm_rounds(mask_fn, token_ids, example_ids, indices, mask_key, step, m, local_p)
            if workers > 1:
                # The barrier behind the chief's ledger entry, the max round count, the chief's go.
                count, go = stepper.sync_step(len(rounds), go)
                if not go:
                    raise BudgetExhausted(ledger["steps_executed"], step_limit if chief else ledger["steps_executed"],
                                          accounted_sigma)
                rounds = rounds + [stepper.padding_round(rounds[0])] * (count - len(rounds))
            stats = checks.step(rounds, step)
            step += 1
            steps_this_run += 1
            examples = stats["examples"]
            loss = stats["loss_sum"] / examples if examples > 0 else float("nan")
            last_accuracy = stats["correct"] / stats["predictions"] if stats["predictions"] > 0 else float("nan")
            losses.append(loss)
            clipped_total += stats["clipped"]
            examples_total += examples
            if release_diagnostics:
                exact_sums.append({k: float(stats[k]) for k in ("loss_clipped_sum", "accuracy_sum", "clipped",
                                                                "examples")})
                # Per unit: a patient counts once in the batch size (its loss/accuracy are its means).
                shown = diagnostics.release(dict(stats, examples=stats["units"]) if patient_unit else stats,
                                            gradient_sigma, expected_batch, diag, diag_rng)
            elif tc.non_private:  # the baseline's artifact is private: its exact curve is what it shows
                shown = {"loss": loss, "accuracy": last_accuracy, "batch_size": examples,
                         "clipped_fraction": stats["clipped"] / examples if examples else 0.0}
            else:
                shown = None  # DP run without DP diagnostics: nothing about the batches is released
            if shown is not None:
                for key, value in shown.items():
                    released[key].append(float(value))
                with writer.as_default(step=step):
                    tf.summary.scalar("mlm_loss", shown["loss"])
                    tf.summary.scalar("mlm_accuracy", shown["accuracy"])
                    tf.summary.scalar("clipped_fraction", shown["clipped_fraction"])
                    tf.summary.scalar("batch_size", shown["batch_size"])
                    tf.summary.scalar("learning_rate", float(optimizer.dpbert_schedule(step - 1)))
            if bar is not None:
                bar.update(step, shown)
            if step % tc.checkpoint_every == 0:
                save_checkpoint(step)
                last_saved = step
    finally:
        if bar is not None:
            bar.close()
        writer.flush()
    integrity_checks = checks.finish()
    if last_saved != step:
        save_checkpoint(step)
    model_dir = output_dir / "model"
    released_models = bert_lib.merge_lora(models)  # a plain BERT: adapters folded into the kernels
    if chief:
        bert_lib.save_bert(released_models, model_dir)
    saved_model_dir = None
    if export_saved_model and chief:
        saved_model_dir = output_dir / "saved_model"
        released_models.encoder.save(str(saved_model_dir), include_optimizer=False, save_format="tf")
        saved_model_dir = str(saved_model_dir)

    result = TrainResult(
        steps_taken_total=int(ledger["steps_executed"]), steps_this_run=steps_this_run,
        model_step=int(stepper.dp_step.numpy()), resumed_from_step=start_step, steps_planned=steps_planned,
        losses=losses, final_mlm_loss=float(np.mean(losses[-min(len(losses), 5):])) if losses else float("nan"),
        final_mlm_accuracy=last_accuracy,
        clipped_fraction=clipped_total / examples_total if examples_total else 0.0,
        sampling_mode=tc.sampling, sampling_rate=q, expected_batch_size=expected_batch,
        logical_batch=tc.batch_size, replicas=P, accumulation=T, micro_batch=m,
        noise_multiplier=0.0 if tc.non_private else tc.noise_multiplier,
        effective_noise_multiplier=0.0 if tc.non_private else accounted_sigma,
        gradient_noise_multiplier=gradient_sigma, released_diagnostics=released, exact_diagnostic_sums=exact_sums,
        diagnostics_noise_std=diagnostics.noise_stds(gradient_sigma, diag) if release_diagnostics else {},
        noise_mode=noise_mode,
        clip_norm=tc.clip_norm, non_private=tc.non_private,
        epsilon=math.inf if tc.non_private else None, delta=None if tc.non_private else tc.delta,
        dataset_size=n, planned_dataset_size=n_planned, clipping_path=stepper.clipping_path,
        strategy=dpsgd.strategy_name(strategy), seconds=time.time() - t0, model_dir=str(model_dir),
        checkpoint_dir=str(ckpt_dir), saved_model_dir=saved_model_dir, tensorboard_dir=str(tb_dir),
        ledger_path=str(ledger_path), integrity_checks=integrity_checks,
        trainable=dict(selection.describe(), total_parameters=bert_lib.count_parameters(spec)),
        observed=integrity.observe(sampler, stepper, ledger_path if chief else None,
                                   diagnostics.noise_stds(gradient_sigma, diag) if release_diagnostics else {},
                                   steps_executed=None if chief else int(ledger["steps_executed"])),
        workers=workers, worker_rank=worker_rank,
        parameter_digest=_digest(released_models.mlm.get_weights()))
    if chief:
        _write_json_atomic(output_dir / RESULT_FILE, result.to_dict())
    return result


def _digest(weights) -> str:
    import hashlib  # pylint: disable=import-outside-toplevel

    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def load_models(output_dir) -> bert_lib.BertModels:
    """Rebuild the trained models from ``output_dir/model`` (config + weights)."""
    return bert_lib.load_bert(Path(output_dir) / "model")


class _Progress:
    """Training progress: a tqdm bar when stderr is a terminal; otherwise one log line every
    ``interval`` seconds (step, rate, ETA) and one at the end, never ``\\r`` redraws in a file."""

    def __init__(self, total: int, initial: int, desc: str, interval: float = 30.0, stream=None,
                 label: str = "DP estimate", step_noise_std: Optional[float] = None):
        import collections
        import sys

        #: What the shown loss/accuracy are: "DP estimate" (noisy diagnostics) or, for the
        #: non-private baseline, "exact (private)" — never to be read as a released figure.
        self.label = label
        #: Lines show the mean over the last 10 % of the steps (one DP estimate is too noisy to
        #: read: ``step_noise_std``, the per-step loss noise std, is printed with it).
        self.step_noise_std = step_noise_std
        self.recent = collections.deque(maxlen=diagnostics.window(total))
        stream = stream if stream is not None else sys.stderr
        self.total, self.initial, self.desc, self.interval = total, initial, desc, interval
        self.step = initial
        self.shown: Optional[dict] = None
        self.started = self.last = time.monotonic()
        self.bar = None
        if getattr(stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", file=stream)

    def update(self, step: int, shown: Optional[dict] = None):
        done, self.step = step - self.step, step
        if shown is not None:
            self.shown = shown
            self.recent.append((float(shown["loss"]), float(shown["accuracy"])))
        if self.bar is not None:
            if shown is not None:  # refresh=False: the bar redraws at its own pace, not every step
                loss, accuracy = (sum(v) / len(self.recent) for v in zip(*self.recent))
                self.bar.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.3f}", shown=f"{self.label}, mean of "
                                     f"{len(self.recent)} steps", refresh=False)
            self.bar.update(done)
            return
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._log(now)

    def _log(self, now: float):
        elapsed = now - self.started
        rate = (self.step - self.initial) / elapsed if elapsed > 0 else float("nan")
        left = self.total - self.step
        eta = f"{_duration(left / rate)}" if rate > 0 else "?"
        extra = ""
        if self.recent:
            loss, accuracy = (sum(v) / len(self.recent) for v in zip(*self.recent))
            noise = f", per-step loss noise std {self.step_noise_std:.3g}" if self.step_noise_std else ""
            extra = (f", loss {loss:.3f}, accuracy {accuracy:.3f} ({self.label}: mean of the last "
                     f"{len(self.recent)} steps{noise})")
        log.info("%s: step %d/%d, %.3g steps/s, ETA %s%s", self.desc, self.step, self.total, rate, eta, extra)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.step > self.initial:
            self._log(time.monotonic())


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
