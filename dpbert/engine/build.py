"""``build_training``: the composed objects of one training run — strategy, plan, models, trainable
selection, optimizer, DP-SGD stepper, batch source, chain, integrity checks and loop — so that the
trainer (``train_mlm``), the white-box audit, the noise check and the benchmarks build the SAME
loop, each with its own extra hooks. ``finish`` saves the released model and returns the
``TrainResult``.

Its inputs are typed: the rows (``TrainingRows``), the model and where it starts
(``ModelStart``), ``training_config`` and the sampling plan, the chain and what it writes
(``ChainOutputs``), the mechanism's spec beyond the configuration (``NoiseSpec``), the caller's
hooks (``RunHooks``) and the strategy.

The chief (rank 0) takes the chain's lease before it reads anything of the state directory and
holds it until :meth:`Training.close` (``with build_training(...) as training``); a caller that
locked first (the trainer stage, which plans under the lock) passes its ``ChainOutputs.held_lock``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import secrets
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from dpbert import schema, storage
from dpbert.accounting.sigma import accounted_sigma
from dpbert.mechanism import gaussian, replicas
from dpbert.mechanism import step as step_lib
from dpbert.mechanism.clipping import ClippingPath
from dpbert.network import bert as bert_lib
from dpbert.mechanism import ghost, integrity, sampling
from dpbert.engine import optimizers
from dpbert.network import trainable as trainable_lib
from dpbert.engine import hooks as hooks_lib
from dpbert.engine.chain import HeldStateLock, TrainingChain, _norm, state_lock
from dpbert.engine.devices import make_strategy
from dpbert.engine.loop import TrainLoop
from dpbert.engine.mlm import make_mlm_functions, make_optimizer, mask_token_id_of
from dpbert.engine.result import TrainResult
from dpbert.engine.source import BatchSource, SamplerFactory, SamplerSpec, default_sampler
from dpbert.privacy import diagnostics
from dpbert.privacy.plan import TrainingPlan, plan_training

log = logging.getLogger("dpbert.engine.train")

#: The trainer's per-unit clipping: ``dpbert.mechanism.ghost`` handed to the mechanism (which sits
#: below the model layer), looked up at each call so that a test's patch of ghost reaches it.
GHOST = ClippingPath(clipped_sum=lambda *args, **kwargs: ghost.clipped_gradient_sum(*args, **kwargs),
                     is_registered=lambda layer: ghost.is_registered(layer),
                     whole=trainable_lib.Selection.whole)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingRows:
    """The rows to train on: ``token_ids`` ``[n, L]`` (pad id 0); ``special_token_ids``: mapping
    name → id (with ``[MASK]``) or a sequence of ids plus ``mask_token_id``; ``example_ids`` ``[n]``:
    each row's own record id (default the row index), which keys its MLM masks; ``patient_keys``
    ``[n]``: each row's patient, required by a plan with ``unit == "patient"``."""

    token_ids: np.ndarray
    special_token_ids: Union[Mapping[str, int], Sequence[int]]
    mask_token_id: Optional[int] = None
    example_ids: Optional[np.ndarray] = None
    patient_keys: Optional[Sequence[str]] = None


@dataclasses.dataclass(frozen=True, eq=False)
class ModelStart:
    """The model and where it starts: ``config`` (``ModelConfig``) and ``vocab_size``;
    ``vocab_tokens`` and ``public_checkpoint_dir`` for ``model.init: minilm``; ``initial_weights``:
    the MLM model's starting weights (a public start; a resumed run restores its checkpoint over
    them); ``new_token_ids``: the ids the DP vocabulary appended (``training.trainable`` new_tokens)."""

    config: Any
    vocab_size: int
    vocab_tokens: Optional[Sequence[str]] = None
    public_checkpoint_dir: Any = None
    initial_weights: Optional[list] = None
    new_token_ids: Optional[Sequence[int]] = None


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
    """The mechanism's specification beyond ``training_config``: ``mode`` once | paper
    (``DPSGDConfig.noise_mode``); ``audit_probe(selection) -> AuditProbe``: the white-box audit's
    probe on a trained piece (``dpbert.evaluate.whitebox``); ``probe_coordinates``: the run-time
    noise check's probe coordinates per trained piece (the noise check takes them all)."""

    mode: str = "once"
    audit_probe: Optional[Callable[[Any], step_lib.AuditProbe]] = None
    probe_coordinates: int = integrity.NOISE_COORDINATES_PER_VARIABLE


@dataclasses.dataclass(frozen=True)
class ChainOutputs:
    """The training chain and what the run writes: ``output_dir`` (local, ``gs://``, ``ram://``);
    ``resume`` from its checkpoint; ``held_lock``: ``state_lock(output_dir)``'s value when the
    caller already holds the lease; ``export_saved_model`` (None: ``training.export_saved_model``);
    ``progress`` on the console; ``charge_limit(σ_accounted, steps_needed) -> L``: the most DP steps
    the budget covers for this chain, asked once (a step past L is refused before its entry)."""

    output_dir: Any
    resume: bool = True
    held_lock: Optional[HeldStateLock] = None
    export_saved_model: Optional[bool] = None
    progress: bool = True
    charge_limit: Optional[Callable[[float, int], int]] = None


@dataclasses.dataclass(frozen=True)
class RunHooks:
    """The caller's extensions: loop ``hooks`` (run after the built-in ones) and the
    ``sampler_factory(SamplerSpec) -> sampler`` (tests inject PRF coins; the audit enrols canaries)."""

    hooks: Sequence[hooks_lib.Hook] = ()
    sampler_factory: SamplerFactory = default_sampler


@dataclasses.dataclass
class Inputs:
    """The validated training rows: ``token_ids`` ``[n, max_seq_length]`` int32, their record ids,
    each row's patient (patient unit) and the special token ids."""

    token_ids: np.ndarray
    example_ids: np.ndarray
    mask_id: int
    specials: list
    patient_keys: Optional[Sequence[str]] = None


def validate_inputs(token_ids, special_token_ids, vocab_size: int, model_config, example_ids=None,
                    mask_token_id: Optional[int] = None, patient_keys=None) -> Inputs:
    """Clear errors naming the parameter before anything is read or written."""
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
    example_ids = np.arange(n, dtype=np.int64) if example_ids is None else np.asarray(example_ids)
    if example_ids.shape != (n,):
        raise ValueError(f"example_ids must have shape ({n},), got {example_ids.shape}")
    if token_ids.max() >= vocab_size or token_ids.min() < 0:
        raise ValueError(f"token ids must be in [0, {vocab_size})")
    mask_id = mask_token_id_of(special_token_ids, mask_token_id)
    specials = sorted(set(int(v) for v in (special_token_ids.values() if isinstance(special_token_ids, Mapping)
                                            else special_token_ids)) | {mask_id, 0})
    return Inputs(token_ids, example_ids, mask_id, specials, patient_keys)


@dataclasses.dataclass
class Training:
    """What ``build_training`` composed. ``loop.run()`` trains; :func:`finish` saves and reports;
    :meth:`close` releases the chain's lease (when this build took it)."""

    tc: Any
    plan: TrainingPlan
    inputs: Inputs
    strategy: Any
    spec: bert_lib.BertSpec
    models: bert_lib.BertModels
    selection: Any
    optimizer: Any
    stepper: step_lib.DPSGDTrainStep
    chain: TrainingChain
    source: BatchSource
    checks: integrity.RunChecks
    loop: TrainLoop
    noise_mode: str
    gradient_sigma: float
    accounted_sigma: float
    release_diagnostics: bool
    export_saved_model: bool
    started: float
    stack: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)

    @property
    def chief(self) -> bool:
        return self.chain.chief

    def close(self):
        self.stack.close()

    def __enter__(self) -> "Training":
        return self

    def __exit__(self, *exc):
        self.close()


def _lock(stack: contextlib.ExitStack, output_dir, held_lock: Optional[HeldStateLock]) -> Optional[HeldStateLock]:
    if held_lock is None:
        return stack.enter_context(state_lock(output_dir))
    if not (held_lock.held and held_lock.uri == _norm(output_dir)):
        raise ValueError(f"held_lock is not a held lock of {output_dir}")
    return held_lock


def _check_plan(plan: Optional[TrainingPlan], tc, n: int) -> TrainingPlan:
    if plan is None:
        return plan_training(tc, tc.dataset_size if tc.dataset_size is not None else n)
    if (plan.sampling, plan.batch_size, plan.replicas, plan.accumulation_steps) != \
            (tc.sampling, tc.batch_size, tc.replicas, tc.accumulation_steps):
        raise ValueError(f"the plan {plan.to_dict()} was not made from this training configuration")
    return plan


def _model_spec(start: ModelStart, tc):
    if start.config.init != "minilm":
        return bert_lib.spec_from_config(start.config, start.vocab_size, tc.mask_probability)
    from dpbert.network import init_public

    if start.vocab_tokens is None:
        raise ValueError("model.init=minilm needs vocab_tokens (the new vocabulary's token strings)")
    return init_public.spec_for_public(start.config, start.vocab_size, tc.mask_probability,
                                       start.public_checkpoint_dir)


def _run_config(spec, tc, plan: TrainingPlan, inputs: Inputs, model_config, noise_mode: str, names, lora_spec):
    """The privacy-relevant parameters a resume must not change."""
    run_config = {
        "spec": spec.to_dict(), "batch_size": tc.batch_size, "sampling": tc.sampling,
        "q": plan.sampling_probability, "noise_multiplier": 0.0 if tc.non_private else tc.noise_multiplier,
        "clip_norm": tc.clip_norm, "non_private": tc.non_private, "noise_mode": noise_mode,
        "mask_probability": tc.mask_probability, "specials": inputs.specials, "mask_token_id": inputs.mask_id,
        "init": model_config.init,
        # The accounted σ depends on the diagnostics: a resume must not change them.
        "diagnostics": dataclasses.asdict(diagnostics.config_of(tc)),
    }
    if plan.unit == "patient":  # only then: a tuple-level state directory resumes as before
        run_config.update(unit="patient", max_contributions=plan.max_contributions)
    if names != ["all"]:  # only then: an existing state directory resumes as before
        run_config["trainable"] = {"sets": names, "lora_rank": None if lora_spec is None else lora_spec.rank,
                                   "lora_alpha": None if lora_spec is None else lora_spec.alpha}
    if tc.clipping != "flat":  # the sensitivity changes: only then, so a flat state directory resumes as before
        run_config["clipping"] = {"rule": tc.clipping, "stability": tc.clip_stability}
    return run_config


def _trainable(tc, start: ModelStart):
    """(the trained sets' names, the LoRA spec or None), refused early when they cannot be built."""
    names = trainable_lib.validate_names(list(tc.trainable))
    lora_spec = bert_lib.LoRASpec(int(tc.lora_rank), float(tc.lora_alpha)) if trainable_lib.needs_lora(names) else None
    if "new_tokens" in names and start.new_token_ids is None:
        raise ValueError("training.trainable new_tokens needs a public or public+dp vocabulary (its "
                         "token_sources.json says which token ids the DP vocabulary appended)")
    return names, lora_spec


def _build_models(spec, tc, start: ModelStart, strategy, names, lora_spec, steps: int):
    """(models, selection, optimizer) in the strategy's scope."""
    with strategy.scope():
        # A trained subset (e.g. [bias, head]) runs the MLM model's last layer at the masked
        # positions only (bert.build_bert: the same function, ~1.4x fewer CPU seconds per tuple at
        # the demo's sizes, docs/benchmarks.md); `all` keeps the full graph, whose float rounding
        # the golden run (tests/mechanism/test_golden_step.py) pins bit for bit.
        models = bert_lib.build_bert(spec, seed=tc.seed, masked_last_layer=names != ["all"])
        if start.initial_weights is not None:
            models.mlm.set_weights(start.initial_weights)
            log.info("initialised from the given (public) weights")
        elif start.config.init == "minilm":
            from dpbert.network import init_public

            init_stats = init_public.init_from_checkpoint(models, start.vocab_tokens, start.public_checkpoint_dir,
                                                          tc.seed)
            log.info("initialised from the public checkpoint: %s", init_stats)
        if lora_spec is not None:  # adapters (B = 0) on the start above, which becomes the frozen base
            models = bert_lib.add_lora(models, lora_spec, seed=tc.seed)
        selection = trainable_lib.select(models, names, start.new_token_ids)
        optimizer = make_optimizer(tc, steps)
    log.info("training.trainable %s: %d trained parameters of %d", ",".join(names), selection.size,
             bert_lib.count_parameters(spec))
    return models, selection, optimizer


def _sampler_spec(inputs: Inputs, plan: TrainingPlan, tc, groups, chain: TrainingChain, workers: int,
                  rank: int, start_step: int) -> SamplerSpec:
    """Seeds and keys: secret (OS entropy), fresh for every process; a test noise seed fixes them."""
    seed = None if tc.noise_seed is None else [int(tc.noise_seed), start_step] + ([workers, rank] if workers > 1 else [])
    ids = groups.ids if groups is not None else inputs.example_ids
    # Worker w holds the units whose own id hashes to w (module docstring of sampling.py).
    shard = None if workers == 1 else np.nonzero(sampling.shard_of(ids, workers) == rank)[0]
    if groups is not None:
        return SamplerSpec("patient", len(groups), plan.sampling_probability, tc.batch_size, ids, seed, shard,
                           groups, plan.max_contributions,
                           choice_key=secrets.randbits(63) if tc.noise_seed is None else int(tc.noise_seed) * 104729 + 3)
    if tc.sampling == "poisson":
        return SamplerSpec("poisson", len(ids), plan.sampling_probability, tc.batch_size, ids, seed, shard)
    return SamplerSpec("shuffle", len(ids), plan.sampling_probability, tc.batch_size, ids,
                       shuffle_key=chain.shuffle_key(tc.noise_seed))


def _patient_groups(plan: TrainingPlan, patient_keys, n: int):
    if plan.unit != "patient":
        return None
    if patient_keys is None or len(patient_keys) != n:
        raise ValueError(f"a patient-unit plan needs patient_keys for each of the {n} rows")
    return sampling.group_rows(patient_keys)


def _stepper(models, optimizer, selection, spec, inputs: Inputs, tc, plan: TrainingPlan, strategy, noise: NoiseSpec):
    """(DPSGDTrainStep, mask_fn, diagnostics config, whether DP diagnostics are released)."""
    diag = diagnostics.config_of(tc)
    release = diag.enabled and not tc.non_private
    k = plan.max_contributions if plan.unit == "patient" else 1
    dp_config = gaussian.DPSGDConfig(
        clip_norm=tc.clip_norm, noise_multiplier=tc.noise_multiplier, expected_batch_size=plan.expected_batch_size,
        non_private=tc.non_private, noise_mode=noise.mode, noise_seed=tc.noise_seed, replicas=plan.replicas,
        accumulation_steps=plan.accumulation_steps, loss_bound=diag.loss_bound if release else None, group_size=k,
        jit_compile=bool(tc.jit_compile), clip_rule=tc.clipping, clip_stability=tc.clip_stability)
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, inputs.specials, inputs.mask_id,
                                                                  tc.mask_probability)
    stepper = step_lib.DPSGDTrainStep(models.mlm, optimizer, dp_config, prepare_fn=prepare_fn, loss_fn=loss_fn,
                                      clipping=GHOST, metrics_fn=metrics_fn, strategy=strategy,
                                      noise_probe=None if tc.non_private else integrity.make_noise_probe(
                                          selection.pieces, noise.probe_coordinates, seed=tc.noise_seed),
                                      selection=selection,
                                      audit_probe=None if noise.audit_probe is None else noise.audit_probe(selection))
    return stepper, mask_fn, diag, release


def _restore(checkpoint: tf.train.Checkpoint, chain: TrainingChain, stepper, optimizer, resume: bool):
    """(the chief's CheckpointManager or None, the step restored, whether a checkpoint was found)."""
    if stepper.workers > 1:
        stepper.sync_step(0)  # the chief's set-up of the state directory (discard, run_config) is done
    latest = tf.train.latest_checkpoint(chain.checkpoint_dir) if resume else None
    manager = tf.train.CheckpointManager(checkpoint, chain.checkpoint_dir, max_to_keep=3) if chain.chief else None
    if not latest:
        return manager, 0, False
    checkpoint.restore(latest).assert_existing_objects_matched()
    start_step = int(stepper.dp_step.numpy())
    if int(optimizer.iterations.numpy()) != start_step:
        raise RuntimeError("checkpoint's optimizer step and DP step disagree")
    log.info("resumed from %s at step %d", latest, start_step)
    return manager, start_step, True


def _standard_hooks(tc, plan, stepper, optimizer, checkpoint, manager, chain, start_step: int, found: bool,
                    diag, release: bool, gradient_sigma: float, progress: bool, patient_unit: bool):
    diag_rng = np.random.default_rng(None if tc.noise_seed is None else [int(tc.noise_seed), 0xD1A6, start_step])
    built = [hooks_lib.ReleaseDiagnostics(release, tc.non_private, gradient_sigma, plan.expected_batch_size, diag,
                                          diag_rng, patient_unit),
             hooks_lib.TensorBoard(chain.tensorboard_dir if chain.chief else None, optimizer.dpbert_schedule)]
    if progress and chain.chief:
        step_std = diagnostics.step_noise_stds(diagnostics.noise_stds(gradient_sigma, diag),
                                               plan.expected_batch_size).get("loss") if release else None
        built.append(hooks_lib.ProgressHook("DP-SGD" if not tc.non_private else "SGD (non-private)",
                                            "exact (private)" if tc.non_private else "DP estimate", step_std))
    built += optimizers.hooks(tc, optimizer, stepper, chain.tensorboard_dir if chain.chief else None)
    return built + [hooks_lib.IntegrityHook(),
                    hooks_lib.CheckpointHook(checkpoint, manager, tc.checkpoint_every, start_step if found else None)]


class _Composer:
    """One ``build_training`` call, composed in order: :meth:`validate` (nothing read or written
    yet), :meth:`step` (the lease, the chain, the models and the DP-SGD step), :meth:`loop`."""

    def __init__(self, rows: TrainingRows, start: ModelStart, tc, outputs: ChainOutputs, noise: NoiseSpec,
                 hooks: RunHooks):
        self.rows, self.start, self.tc, self.outputs, self.noise, self.hooks = rows, start, tc, outputs, noise, hooks
        self.started = time.time()
        self.stack = contextlib.ExitStack()

    def validate(self, plan: Optional[TrainingPlan], strategy):
        tc, rows = self.tc, self.rows
        self.names, self.lora_spec = _trainable(tc, self.start)
        self.inputs = validate_inputs(rows.token_ids, rows.special_token_ids, self.start.vocab_size, self.start.config,
                                      rows.example_ids, rows.mask_token_id, rows.patient_keys)
        # The strategy first: MultiWorkerMirroredStrategy must exist before TensorFlow runs an op.
        self.strategy = strategy or make_strategy(tc.strategy, tc.replicas)
        self.workers, self.rank = replicas.worker_layout(self.strategy)
        if self.workers > 1 and tc.sampling != "poisson":
            raise ValueError("training.sampling must be poisson with several worker processes")
        n = self.inputs.token_ids.shape[0]
        self.plan = _check_plan(plan, tc, n)
        self.groups = _patient_groups(self.plan, rows.patient_keys, n)

    def step(self):
        tc, out = self.tc, self.outputs
        # Only the chief writes the chain, under its lease.
        self.lease = _lock(self.stack, out.output_dir, out.held_lock) if self.rank == 0 else None
        self.chain = TrainingChain(str(out.output_dir), chief=self.rank == 0)
        self.spec = _model_spec(self.start, tc)
        self.chain.prepare(_run_config(self.spec, tc, self.plan, self.inputs, self.start.config, self.noise.mode,
                                       self.names, self.lora_spec), out.resume)
        if tc.noise_seed is None:
            # Dropout draws its masks per batch SLOT from TensorFlow's global RNG. Keyed by a public
            # seed (another stage may have called set_random_seed in this process) that would be the
            # slot-keyed-mask bug again; from secret entropy the masks are i.i.d. across slots and
            # independent of the data, so adding/removing one example leaves the others' mask
            # distribution unchanged. The initialisation keeps its own explicit seeds (training.seed).
            tf.random.set_seed(secrets.randbits(31))
        self.models, self.selection, self.optimizer = _build_models(
            self.spec, tc, self.start, self.strategy, self.names, self.lora_spec, self.plan.steps)
        self.stepper, self.mask_fn, self.diag, self.release = _stepper(
            self.models, self.optimizer, self.selection, self.spec, self.inputs, tc, self.plan, self.strategy,
            self.noise)

    def loop(self) -> Training:
        tc, plan, stepper, chain, out = self.tc, self.plan, self.stepper, self.chain, self.outputs
        gradient_sigma = stepper.mechanism.noise_multiplier  # σ of the released sum, as the mechanism adds it
        # What the accountant must charge per step: the gradient and the released diagnostics together.
        accounted = accounted_sigma(gradient_sigma, diagnostics=self.diag) if self.release else gradient_sigma
        checkpoint = tf.train.Checkpoint(model=self.models.mlm, optimizer=self.optimizer, dp_step=stepper.dp_step)
        manager, start_step, found = _restore(checkpoint, chain, stepper, self.optimizer, out.resume)
        step_log = chain.step_log(start_step, None if tc.non_private else accounted)
        step_limit = None
        if chain.chief and out.charge_limit is not None and not tc.non_private:
            # Asked with what this chain will have charged when the run completes (earlier runs'
            # executed steps, lost ones included, plus the steps from the checkpoint to the plan's end).
            step_limit = int(out.charge_limit(accounted, step_log.count + plan.steps - start_step))
        source = self._source(start_step)
        # Run-time integrity checks (sampler vs the plan's q over the EXACT n, brute-force clipping, noise).
        checks = integrity.RunChecks(stepper, sampling_mode=tc.sampling, units=source.units,
                                     q=plan.sampling_probability, batch_size=tc.batch_size,
                                     every=tc.integrity_check_every, seed=tc.noise_seed,
                                     output_dir=chain.uri if chain.chief else None)
        _log_plan(plan, tc, self.groups is not None, start_step)
        built = _standard_hooks(tc, plan, stepper, self.optimizer, checkpoint, manager, chain, start_step, found,
                                self.diag, self.release, gradient_sigma, out.progress, self.groups is not None)
        loop = TrainLoop(source, stepper, step_log, checks, built + list(self.hooks.hooks),
                         start_step=start_step, steps_planned=plan.steps, step_limit=step_limit,
                         accounted_sigma=accounted, lock_check=None if self.lease is None else self.lease.check,
                         stats_every=int(tc.stats_every))
        export = bool(tc.export_saved_model if out.export_saved_model is None else out.export_saved_model)
        return Training(tc, plan, self.inputs, self.strategy, self.spec, self.models, self.selection, self.optimizer,
                        stepper, chain, source, checks, loop, self.noise.mode, gradient_sigma, accounted,
                        self.release, export, self.started, self.stack)

    def _source(self, start_step: int) -> BatchSource:
        tc, plan, inputs, groups = self.tc, self.plan, self.inputs, self.groups
        sampler = self.hooks.sampler_factory(_sampler_spec(inputs, plan, tc, groups, self.chain, self.workers,
                                                           self.rank, start_step))
        return BatchSource(sampler, self.mask_fn, inputs.token_ids, inputs.example_ids,
                           secrets.randbits(64) if tc.noise_seed is None else int(tc.noise_seed) * 7919 + 17,
                           plan.micro_batch, groups, plan.max_contributions if groups is not None else 1)


def build_training(rows: TrainingRows, model: ModelStart, training_config, chain: ChainOutputs,
                   plan: Optional[TrainingPlan] = None, noise: NoiseSpec = NoiseSpec(), hooks: RunHooks = RunHooks(),
                   strategy: Optional[tf.distribute.Strategy] = None) -> Training:
    """Compose one training run (module docstring; the arguments' fields: the dataclasses above and
    ``dpbert.engine.train.train_mlm``). ``plan``: the ``TrainingPlan`` the budget was checked
    against (default planned from ``training.dataset_size`` or the exact n); ``strategy``: a ready
    strategy (default from ``training.strategy``). Use the result as a context manager."""
    composer = _Composer(rows, model, training_config, chain, noise, hooks)
    composer.validate(plan, strategy)
    try:
        composer.step()
        return composer.loop()
    except BaseException:
        composer.stack.close()
        raise


def _log_plan(plan: TrainingPlan, tc, patient_unit: bool, start_step: int):
    # The planned n only: the exact number of rows is a private count and never goes to a log line.
    log.info("train_mlm: planned n=%d %s, %s sampling q=%.6g, E[batch]=%.2f, P=%d, T=%d, m=%d, "
             "sigma=%s, C=%s, non_private=%s, steps %d→%d", plan.dataset_size,
             f"patients (<= {plan.max_contributions} tuples each, user-level)" if patient_unit else "tuples",
             tc.sampling, plan.sampling_probability, plan.expected_batch_size, plan.replicas,
             plan.accumulation_steps, plan.micro_batch, tc.noise_multiplier, tc.clip_norm, tc.non_private,
             start_step, plan.steps)


def save_model(models: bert_lib.BertModels, uri: str):
    """``model_config.json`` and the Keras weights (TF format) of ``models`` (already merged), as
    ``bert_lib.load_bert`` reads them, on any storage TensorFlow writes to."""
    storage.write_text(storage.join(uri, bert_lib.MODEL_CONFIG_FILE), models.spec.to_json())
    models.mlm.save_weights(storage.join(uri, bert_lib.WEIGHTS_PREFIX))


def digest(weights) -> str:
    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def finish(training: Training) -> TrainResult:
    """After ``training.loop.run()``: save the released model (LoRA merged; chief only), and the
    ``TrainResult`` (written, chief only, as the PRIVATE ``train_result.json``)."""
    loop, chain, tc, plan, stepper = training.loop, training.chain, training.tc, training.plan, training.stepper
    record = loop.record
    released_models = bert_lib.merge_lora(training.models)  # a plain BERT: adapters folded into the kernels
    saved_model_dir = None
    if chain.chief:
        save_model(released_models, chain.model_dir)
        if training.export_saved_model:
            saved_model_dir = chain.path(schema.SAVED_MODEL_DIR)
            released_models.encoder.save(saved_model_dir, include_optimizer=False, save_format="tf")
    noise_std = diagnostics.noise_stds(training.gradient_sigma, diagnostics.config_of(tc)) \
        if training.release_diagnostics else {}
    # The steps the event must agree with: the chief's step log as stored (a non-chief: its count).
    observed = integrity.observe(loop.source.sampler, stepper, chain.step_log_path if chain.chief else None,
                                 noise_std, steps_executed=None if chain.chief else loop.step_log.count,
                                 checks=loop.checks)  # the diagnostics' noise as the checks tested it
    losses = record.losses
    result = TrainResult(
        steps_taken_total=loop.step_log.count, steps_this_run=loop.steps_this_run,
        model_step=int(stepper.dp_step.numpy()), resumed_from_step=loop.start_step, steps_planned=plan.steps,
        losses=losses, final_mlm_loss=float(np.mean(losses[-min(len(losses), 5):])) if losses else float("nan"),
        final_mlm_accuracy=record.last_accuracy,
        clipped_fraction=record.clipped_total / record.examples_total if record.examples_total else 0.0,
        sampling_mode=tc.sampling, sampling_rate=plan.sampling_probability,
        expected_batch_size=plan.expected_batch_size, logical_batch=tc.batch_size, replicas=plan.replicas,
        accumulation=plan.accumulation_steps, micro_batch=plan.micro_batch,
        noise_multiplier=0.0 if tc.non_private else tc.noise_multiplier,
        effective_noise_multiplier=0.0 if tc.non_private else training.accounted_sigma,
        gradient_noise_multiplier=training.gradient_sigma, released_diagnostics=record.released,
        exact_diagnostic_sums=record.exact_sums, diagnostics_noise_std=noise_std, noise_mode=training.noise_mode,
        clip_norm=tc.clip_norm, non_private=tc.non_private,
        epsilon=math.inf if tc.non_private else None, delta=None if tc.non_private else tc.delta,
        dataset_size=int(training.inputs.token_ids.shape[0]), planned_dataset_size=plan.dataset_size,
        clipping_path=stepper.clipping_path, strategy=replicas.strategy_name(training.strategy),
        seconds=time.time() - training.started, model_dir=chain.model_dir, checkpoint_dir=chain.checkpoint_dir,
        saved_model_dir=saved_model_dir, tensorboard_dir=chain.tensorboard_dir, ledger_path=chain.step_log_path,
        integrity_checks=loop.integrity_results, observed=observed,
        trainable=dict(training.selection.describe(), total_parameters=bert_lib.count_parameters(training.spec)),
        workers=stepper.workers, worker_rank=stepper.worker_index,
        parameter_digest=digest(released_models.mlm.get_weights()))
    chain.write_json(schema.TRAIN_RESULT_FILE, result.to_dict())
    return result
