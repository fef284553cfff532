"""MLMPretrainer's stage: DP-SGD (or, explicitly, non-private) BERT masked-LM pre-training.

:func:`pretrain` does, in order:

1. holds the seeded fraction of the patients out (``membership.holdout_patient_fraction``;
   ``dpbert.data.splits``), the non-members MembershipInference recomputes from the recorded seed;
2. tokenizes the remaining tuples with the DP vocabulary (one tuple = one example) and inserts the
   canaries (``dpbert.stages.canary.apply_canaries``);
3. builds the ONE ``TrainingPlan`` (``dpbert.privacy.plan``) over the public n — ``training.dataset_size``,
   else the ``num_tuples`` the ingestion recorded (what the budget guard planned with) — and hands
   it to ``train_mlm``: nothing else here computes n, q or the number of steps;
4. trains in a *stable* state directory ``<pipeline_root>/_trainer_state/<key>`` keyed by the inputs
   and the configuration (:func:`state_dir`), not in the execution's output directory, so a re-run
   after a crash or preemption resumes from the last checkpoint and the write-ahead ledger keeps
   counting every step ever executed on the private data;
5. copies the model, its records and the tokenizer into the model directory and records the DP
   event built from the plan plus what actually ran (``steps_taken_total``, the σ applied), from
   which the accountant recomputes ε.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from typing import Any, List, Optional

from dpbert import schema
from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.trainer")

#: Where the resumable training state lives, under the pipeline root.
STATE_ROOT = "_trainer_state"
#: Fault injection for the resume test (``tests/e2e/test_resume.py``): an integer k makes the
#: trainer crash (``SimulatedCrash``) after k steps of the run. Read ONLY by
#: :func:`crash_after_steps_from_env`, which the MLMPretrainer adapter calls.
CRASH_AFTER_STEPS_ENV = "DPBERT_TEST_CRASH_AFTER_STEPS"
#: Files of the state directory copied into the model artifact (the ledger stays for resumes).
_RECORD_FILES = (schema.TRAIN_RESULT_FILE, schema.DP_LEDGER_FILE, schema.RUN_CONFIG_FILE)


def crash_after_steps_from_env() -> Optional[int]:
    """``$DPBERT_TEST_CRASH_AFTER_STEPS`` as an int (tests only), None when unset."""
    value = os.environ.get(CRASH_AFTER_STEPS_ENV)
    return int(value) if value else None


def state_dir(pipeline_root: str, key_material: str) -> str:
    """``<pipeline_root>/_trainer_state/<sha256(key_material)[:20]>``."""
    key = hashlib.sha256(key_material.encode()).hexdigest()[:20]
    return os.path.join(pipeline_root, STATE_ROOT, key)


def loss_curve(losses, points: int = 200) -> List[float]:
    """At most ``points`` (+ the last) losses, evenly strided, rounded for a property."""
    if len(losses) <= points:
        return [round(float(x), 5) for x in losses]
    stride = len(losses) / points
    return [round(float(losses[int(i * stride)]), 5) for i in range(points)] + [round(float(losses[-1]), 5)]


def training_patients(tuples_dir: str, membership: MembershipConfig) -> Optional[frozenset]:
    """The patient keys trained on, or None without a holdout (every patient)."""
    if membership.holdout_patient_fraction <= 0:
        return None
    from dpbert.data.splits import patient_key, split_patients
    from dpbert.data.tfrecord import read_tuples

    # First pass over the tuples: the patient keys only.
    return split_patients([patient_key(t) for t in read_tuples(tuples_dir)],
                          train_fraction=1.0 - membership.holdout_patient_fraction,
                          seed=membership.holdout_seed).train


def training_token_ids(tokenizer, tuples_dir: str, train_patients: Optional[frozenset], max_seq_length: int):
    """``[n, max_seq_length]`` token ids of the trained-on tuples, in file order."""
    from dpbert.data.splits import patient_key
    from dpbert.data.tfrecord import read_tuples
    from dpbert.vocab.wordpiece import tokenize_tuples

    token_ids = tokenize_tuples(tokenizer, (t.words for t in read_tuples(tuples_dir)
                                            if train_patients is None or patient_key(t) in train_patients),
                                max_seq_length)
    if token_ids.shape[0] == 0:
        raise ValueError("no training tuple left after holding patients out")
    return token_ids


@dataclasses.dataclass
class PretrainResult(StageResult):
    train: Any = None           # dpbert.model.train.TrainResult
    plan: Any = None            # dpbert.privacy.plan.TrainingPlan
    dp_event: Optional[dict] = None
    epsilon: float = float("inf")
    state_dir: str = ""


def pretrain(tuples_dir: str, vocabulary_dir: str, model_dir: str, *, model_config: ModelConfig,
             training_config: TrainingConfig, privacy_config: PrivacyConfig,
             membership_config: MembershipConfig, pipeline_root: str, num_tuples: Optional[int] = None,
             canaries_dir: Optional[str] = None, non_private: bool = False,
             stop_after_steps: Optional[int] = None, export_saved_model: bool = True) -> PretrainResult:
    """Pre-train on the tuples under ``tuples_dir``; write the model artifact into ``model_dir``.

    ``num_tuples``: the ingestion's recorded count (the public n when ``training.dataset_size``
    is unset). ``non_private``: the baseline (no clipping, no noise, ε = ∞) whatever
    ``training.non_private`` says. ``stop_after_steps``: tests (see ``CRASH_AFTER_STEPS_ENV``).
    """
    from dpbert.model.train import train_mlm
    from dpbert.privacy import events
    from dpbert.privacy.plan import plan_training
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, TOKENIZER_FILE, VOCAB_FILE, load_tokenizer

    mc, pc, membership = model_config, privacy_config, membership_config
    tc = dataclasses.replace(training_config, non_private=True) if non_private else training_config
    if pc.unit == "patient" and not tc.non_private:
        # The accountant would charge k-fold group privacy, but nothing here caps the examples
        # per patient at k: refuse rather than report an ε that does not hold.
        raise ValueError("privacy.unit = patient is supported by the vocabulary stage only; "
                         "DP-SGD pre-training needs privacy.unit = tuple")

    tokenizer = load_tokenizer(vocabulary_dir)
    train_patients = training_patients(tuples_dir, membership)
    token_ids = training_token_ids(tokenizer, tuples_dir, train_patients, mc.max_seq_length)
    canary_counts = None
    if canaries_dir is not None:
        from dpbert.stages.canary import apply_canaries

        # Canaries are public-by-construction test data; they enlarge n but not the planned q.
        token_ids, canary_counts = apply_canaries(token_ids, canaries_dir, mc.max_seq_length)
    n = int(token_ids.shape[0])
    # With held-out patients too, n stays the planned count of every tuple (the budget guard's).
    n_planned = tc.dataset_size or int(num_tuples if num_tuples is not None else n)
    plan = plan_training(tc, n_planned)
    specials = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    log.info("trainer: %d examples of %d tokens, vocabulary %d, %s", n, mc.max_seq_length,
             tokenizer.get_vocab_size(), "NON-PRIVATE baseline" if tc.non_private else
             f"DP-SGD σ = {tc.noise_multiplier}, C = {tc.clip_norm}, q = {plan.sampling_probability:.4g}")

    state = state_dir(pipeline_root, json.dumps(
        [tuples_dir, vocabulary_dir, dataclasses.asdict(mc), dataclasses.asdict(tc), dataclasses.asdict(pc),
         dataclasses.asdict(membership), int(tc.non_private), canaries_dir], sort_keys=True))
    vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())] \
        if mc.init == "minilm" else None
    result = train_mlm(token_ids, specials, tokenizer.get_vocab_size(), mc, tc, state, plan=plan, resume=True,
                       progress=True, vocab_tokens=vocab_tokens, stop_after_steps=stop_after_steps,
                       export_saved_model=export_saved_model)
    _copy_artifact_files(state, vocabulary_dir, model_dir, VOCAB_FILE, TOKENIZER_FILE)

    if tc.non_private:
        record = events.non_private_event("train")
        epsilon = float("inf")
    else:
        # Charged for every step executed on private data, resumed runs and lost steps included,
        # with the σ actually applied (σ√(P·T) only in the paper-compatible noise mode).
        from dpbert.privacy.accountant import dpsgd_epsilon

        sigma = result.effective_noise_multiplier
        record = events.dpsgd_event(sigma, plan.batch_size,
                                    events.accounted_dataset_size(plan.sampling, plan.dataset_size, n),
                                    result.steps_taken_total, plan.sampling)
        epsilon = dpsgd_epsilon(sigma, record["sampling_probability"], result.steps_taken_total,
                                tc.delta, plan.sampling)
    if canary_counts is not None:
        with open(os.path.join(model_dir, schema.CANARY_COUNTS_FILE), "w", encoding="utf-8") as f:
            json.dump(canary_counts, f)
    with open(os.path.join(model_dir, schema.DP_EVENTS_FILE), "w", encoding="utf-8") as f:
        f.write(events.to_json([record]))
    losses = list(result.losses)
    holdout = train_patients is not None
    properties = {
        schema.NON_PRIVATE: tc.non_private,
        # The baseline is trained without privacy on private data: never to be released.
        schema.PRIVATE: int(tc.non_private),
        "noise_multiplier": 0.0 if tc.non_private else tc.noise_multiplier,
        "effective_noise_multiplier": result.effective_noise_multiplier,
        "clip_norm": tc.clip_norm,
        "sampling_mode": plan.sampling,
        "sampling_rate": record.get("sampling_probability", plan.sampling_probability),
        "logical_batch": plan.batch_size,
        "replicas": result.replicas,
        "accumulation_steps": result.accumulation,
        schema.STEPS_TAKEN_TOTAL: result.steps_taken_total,
        "steps_this_run": result.steps_this_run,
        "resumed_from_step": result.resumed_from_step,
        schema.STEPS_PLANNED: result.steps_planned,
        "dataset_size": n,
        "planned_dataset_size": plan.dataset_size,
        "delta": tc.delta,
        "epsilon_train": epsilon,
        schema.DP_EVENTS: events.to_json([record]),
        "final_mlm_loss": result.final_mlm_loss,
        "final_mlm_accuracy": result.final_mlm_accuracy,
        "initial_mlm_loss": float(sum(losses[:5]) / max(1, len(losses[:5]))) if losses else None,
        "loss_curve": loss_curve(losses),
        "clipped_fraction": result.clipped_fraction,
        "clipping_path": result.clipping_path,
        schema.HOLDOUT_FRACTION: membership.holdout_patient_fraction if holdout else None,
        "holdout_seed": membership.holdout_seed if holdout else None,
        "model_preset": mc.preset,
        schema.MAX_SEQ_LENGTH: mc.max_seq_length,
    }
    log.info("trainer: %d steps in total (%d this run), final MLM loss %.4f", result.steps_taken_total,
             result.steps_this_run, result.final_mlm_loss)
    return PretrainResult(properties=properties, train=result, plan=plan, dp_event=record, epsilon=epsilon,
                          state_dir=state)


def _copy_artifact_files(state: str, vocabulary_dir: str, model_dir: str, *tokenizer_files: str):
    """The artifact holds a copy of the model and its records; the state directory keeps the ledger
    for later resumes. The tokenizer files go to ``<model_dir>/tokenizer``."""
    shutil.copytree(os.path.join(state, schema.MODEL_DIR), os.path.join(model_dir, schema.MODEL_DIR),
                    dirs_exist_ok=True)
    for name in _RECORD_FILES:
        if os.path.exists(os.path.join(state, name)):
            shutil.copy(os.path.join(state, name), os.path.join(model_dir, name))
    if os.path.isdir(os.path.join(state, schema.TENSORBOARD_DIR)):
        shutil.copytree(os.path.join(state, schema.TENSORBOARD_DIR), os.path.join(model_dir, schema.TENSORBOARD_DIR),
                        dirs_exist_ok=True)
    tokenizer_dir = os.path.join(model_dir, schema.TOKENIZER_DIR)
    os.makedirs(tokenizer_dir, exist_ok=True)
    for name in tokenizer_files:
        shutil.copy(os.path.join(vocabulary_dir, name), tokenizer_dir)
