"""MLMPretrainer's stage: DP-SGD (or, explicitly, non-private) BERT masked-LM pre-training.

:func:`pretrain` does, in order:

1. holds patients out (``membership.holdout_patient_fraction``), each independently by a keyed PRF
   whose secret key is in the private WordTuples artifact (``dpbert.data.splits``), the
   non-members MembershipInference recomputes with the same key;
2. tokenizes the remaining tuples with the DP vocabulary (one tuple = one example, keyed by its
   own record id);
3. builds the ONE ``TrainingPlan`` (``dpbert.privacy.plan``) over the PUBLIC n —
   ``training.dataset_size`` · (1 − holdout), what the budget guard planned with — or, without
   one, over a DP count of the trained-on rows (``dpbert.privacy.count``, charged in the ledger),
   never the exact count; inserts the canaries row by row (``apply_canaries``) and hands the plan
   to ``train_mlm``: nothing else here computes n, q or the number of steps;
4. trains in a *stable* state directory ``<pipeline_root>/_trainer_state/<key>`` keyed by the inputs
   and the configuration (:func:`state_dir`), not in the execution's output directory, so a re-run
   after a crash or preemption resumes from the last checkpoint and the write-ahead ledger keeps
   counting every step ever executed on the private data;
5. copies the model, its records and the tokenizer into the model directory and records the DP
   event built from the plan plus what actually ran (``steps_taken_total``, the σ applied), from
   which the accountant recomputes ε.

``privacy.unit: patient`` (user-level DP-SGD): every trained-on tuple must carry a patient id
(:class:`PatientIdsMissing` otherwise); the rows are grouped by patient, the plan is over the
PUBLIC number of patients (``training.dataset_patients`` · (1 − holdout), else a DP count of the
trained-on patients, sensitivity 1), ``training.batch_size`` patients per step, each bringing
≤ k = ``privacy.max_tuples_per_patient`` tuples, and the DP event is per patient
(``sampling_unit: patient``). Appended audit canaries are one patient each.

With ``model.init: minilm`` the model starts from the PUBLIC start (:func:`public_start_weights`,
``dpbert.model.public_warmup``): the checkpoint's first ``model.public_layers`` layers and a
non-private MLM warm-up of ``model.public_warmup_steps`` steps on text shipped in the repository
— built from the released vocabulary and that text only (no private input, outside the ledger),
recorded as ``public_init`` / ``public_layers`` / ``public_warmup_steps`` /
``public_warmup_source``. A public / public+dp vocabulary must come from the same checkpoint
(its ``token_sources.json`` sha256 is checked).
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
from dpbert.privacy import diagnostics as _diagnostics
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.trainer")

#: Where the resumable training state lives, under the pipeline root.
STATE_ROOT = "_trainer_state"
#: Fault injection for the resume test (``tests/e2e/test_resume.py``): an integer k makes the
#: trainer crash (``SimulatedCrash``) after k steps of the run. Read ONLY by
#: :func:`crash_after_steps_from_env`, which the MLMPretrainer adapter calls.
CRASH_AFTER_STEPS_ENV = "DPBERT_TEST_CRASH_AFTER_STEPS"
#: Files of the state directory copied into the model artifact (the ledger stays for resumes).
#: ``train_result.json`` is NOT copied: it holds the exact (un-noised) training curves.
_RECORD_FILES = (schema.DP_LEDGER_FILE, schema.RUN_CONFIG_FILE)
#: Marks the trainers' state root as operator-only (exact curves, checkpoints of the non-private
#: baseline, keys): nothing under it is ever released.
PRIVATE_MARKER = "PRIVATE-operator-only.txt"


def crash_after_steps_from_env() -> Optional[int]:
    """``$DPBERT_TEST_CRASH_AFTER_STEPS`` as an int (tests only), None when unset."""
    value = os.environ.get(CRASH_AFTER_STEPS_ENV)
    return int(value) if value else None


def state_dir(pipeline_root: str, key_material: str) -> str:
    """``<pipeline_root>/_trainer_state/<sha256(key_material)[:20]>``."""
    key = hashlib.sha256(key_material.encode()).hexdigest()[:20]
    return os.path.join(pipeline_root, STATE_ROOT, key)


#: PretrainedModel property: the training step of each ``loss_curve`` point (``curve_steps``).
LOSS_CURVE_STEPS = schema.LOSS_CURVE_STEPS


def _curve_indices(n: int, points: int) -> List[int]:
    """The indices ``loss_curve`` keeps of ``n`` values: all, or ``points`` evenly strided + the last."""
    if n <= points:
        return list(range(n))
    stride = n / points
    return [int(i * stride) for i in range(points)] + [n - 1]


def loss_curve(losses, points: int = 200) -> List[float]:
    """At most ``points`` (+ the last) losses, evenly strided, rounded for a property."""
    return [round(float(losses[i]), 5) for i in _curve_indices(len(losses), points)]


def curve_steps(n: int, first_step: int = 0, points: int = 200) -> List[int]:
    """The true training step of each point of ``loss_curve`` over ``n`` per-step values of a run
    that started at ``first_step`` (a resume's checkpoint step): value i is step first_step + i + 1.
    Stored as ``loss_curve_steps`` so the curve is plotted against steps, not point indices."""
    return [first_step + i + 1 for i in _curve_indices(n, points)]


def training_patients(tuples_dir: str, membership: MembershipConfig):
    """(patient keys trained on, key fingerprint), or (None, None) without a holdout."""
    if membership.holdout_patient_fraction <= 0:
        return None, None
    from dpbert.data.splits import patient_key, read_holdout_key, split_patients
    from dpbert.data.tfrecord import read_tuples

    # First pass over the tuples: the patient keys only.
    split = split_patients([patient_key(t) for t in read_tuples(tuples_dir)],
                           1.0 - membership.holdout_patient_fraction, read_holdout_key(tuples_dir))
    return split.train, split.key_id


class PatientIdsMissing(ValueError):
    """``privacy.unit: patient`` on a corpus whose tuples do not all carry a patient id."""


PATIENT_IDS_MISSING = ("privacy.unit = patient needs a patient id on every tuple, and {count} trained-on tuple(s) "
                       "have none: use JSONL with a patient_id field, a MIMIC NOTEEVENTS CSV (SUBJECT_ID) or the "
                       "synthetic corpus — or set privacy.unit = tuple")


def training_rows(tokenizer, tuples_dir: str, train_patients: Optional[frozenset], max_seq_length: int,
                  with_patients: bool = False):
    """(``[n, max_seq_length]`` token ids, ``[n]`` record ids) of the trained-on tuples, in file order;
    ``with_patients``: also each row's patient key (``splits.patient_key``), and every tuple must
    have a real patient id (:class:`PatientIdsMissing`)."""
    import numpy as np

    from dpbert.data.splits import patient_key
    from dpbert.data.tfrecord import read_tuples
    from dpbert.vocab.wordpiece import tokenize_tuples

    kept = [t for t in read_tuples(tuples_dir) if train_patients is None or patient_key(t) in train_patients]
    if not kept:
        raise ValueError("no training tuple left after holding patients out")
    token_ids = tokenize_tuples(tokenizer, (t.words for t in kept), max_seq_length)
    row_ids = np.array([t.record_id for t in kept], dtype=np.int64)
    if not with_patients:
        return token_ids, row_ids
    missing = sum(1 for t in kept if not getattr(t, "patient_id", None))
    if missing:
        raise PatientIdsMissing(PATIENT_IDS_MISSING.format(count=missing))
    return token_ids, row_ids, [patient_key(t) for t in kept]


DP_COUNT_FILE = "dp_count.json"


def plan_for(tc: TrainingConfig, membership: MembershipConfig, rows: int, state: str, unit_cap: int = 1,
             privacy: Optional[PrivacyConfig] = None):
    """(TrainingPlan, count record or None): over the public ``training.dataset_size`` with the
    holdout fraction, else over a DP count of the ``rows`` trained on (``dpbert.privacy.count``).
    ``privacy.unit == "patient"``: ``rows`` is the number of trained-on PATIENTS and the public n
    ``training.dataset_patients`` (the DP count of patients has sensitivity 1).

    The DP count is drawn ONCE per state directory and kept there (private): a resumed run plans
    with the same released n̂ (same q, so the checkpoint resumes) and the count is charged once.
    Call it holding ``state_lock(state)`` (:func:`pretrain` does): a run refused by the lock draws
    no count, and the file is created exclusively.
    """
    from dpbert.privacy import count
    from dpbert.privacy.plan import plan_training

    patient_unit = privacy is not None and privacy.unit == "patient"
    unit = "patient" if patient_unit else "tuple"
    k = privacy.max_tuples_per_patient if patient_unit else 1
    public_n = tc.dataset_patients if patient_unit else tc.dataset_size
    if public_n is not None:
        return plan_training(tc, public_n, membership.holdout_patient_fraction, unit=unit, max_contributions=k), None
    path = os.path.join(state, DP_COUNT_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            n_hat = int(json.load(f)["released"])
    else:
        import numpy as np

        rng = None if tc.noise_seed is None else np.random.default_rng([int(tc.noise_seed), 0xC0DE])
        n_hat = count.dp_count(rows, tc.count_noise_multiplier, unit_cap, rng=rng)
        os.makedirs(state, exist_ok=True)
        # Created exclusively (the caller holds the state lock too): a second count is never drawn
        # over the first, which the chain's checkpoints and ledger were planned with.
        with open(path, "x", encoding="utf-8") as f:
            json.dump({"released": n_hat}, f)
    if patient_unit:  # a count of patients: sensitivity 1; the record names the ledger's unit (k)
        return (plan_training(tc, n_hat, unit=unit, max_contributions=k),
                count.count_event(tc.count_noise_multiplier, n_hat, unit="patient", max_contributions=k))
    return plan_training(tc, n_hat), count.count_event(tc.count_noise_multiplier, n_hat)


def public_start_weights(mc: ModelConfig, tc: TrainingConfig, tokenizer, vocabulary_dir: str):
    """(initial MLM weights, properties) of the public start for ``model.init: minilm``; reads
    the public checkpoint, the released vocabulary and the shipped public text — nothing private."""
    from dpbert.model import init_public, public_warmup
    from dpbert.resources import checkpoint
    from dpbert.vocab import public

    directory = checkpoint.checkpoint_dir(mc.init_dir)
    sources = public.read_token_sources(vocabulary_dir)
    if sources is not None and sources.get("public_checkpoint_vocab_sha256") != \
            public.file_sha256(directory / "vocab.txt"):
        raise ValueError(f"the {sources.get('source')} vocabulary was built from another public checkpoint than "
                         f"model.init_dir ({directory}): use the same checkpoint for both")
    spec = init_public.spec_for_public(mc, tokenizer.get_vocab_size(), tc.mask_probability, directory)
    vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    weights, record = public_warmup.public_start(
        spec, tokenizer, vocab_tokens, steps=mc.public_warmup_steps, seed=tc.seed, checkpoint_dir=directory,
        batch_size=mc.public_warmup_batch_size, learning_rate=mc.public_warmup_learning_rate,
        mask_probability=tc.mask_probability)
    warm = record["warmup"]
    properties = {
        schema.PUBLIC_INIT: f"{checkpoint.PACKAGE}=={checkpoint.PACKAGE_VERSION}" if mc.init_dir is None
        and os.environ.get(checkpoint.ENV_DIR) is None else str(directory),
        schema.PUBLIC_LAYERS: spec.num_layers,
        schema.PUBLIC_WARMUP_STEPS: mc.public_warmup_steps,
        schema.PUBLIC_WARMUP_SOURCE: warm["source"] if mc.public_warmup_steps else None,
        "public_warmup_loss_first": warm.get("loss_first"),
        "public_warmup_loss_last": warm.get("loss_last"),
        "public_rows_copied": record["init"]["rows_exact"] + record["init"]["rows_lowercased"],
        "public_rows_piece_mean": record["init"]["rows_piece_mean"],
    }
    return weights, properties, directory


def resume_key(mc: ModelConfig, tc: TrainingConfig, pc: PrivacyConfig, holdout_fraction: float,
               non_private: bool) -> str:
    """The configuration part of a trainer state directory's identity (no artifact URIs), stored in
    it as ``schema.RESUME_KEY_FILE``: the budget guard (``pipeline.guard``) finds, before the DAG
    starts, every chain a run with this configuration could resume and counts what it charged.
    Coarser than :func:`state_dir` on purpose: two chains with one key both count (conservative)."""
    material = json.dumps([dataclasses.asdict(mc), dataclasses.asdict(tc), dataclasses.asdict(pc),
                           float(holdout_fraction), bool(non_private)], sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def _write_resume_key(state: str, key: str, non_private: bool):
    os.makedirs(state, exist_ok=True)
    path = os.path.join(state, schema.RESUME_KEY_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"key": key, "non_private": bool(non_private)}, f)
    os.replace(path + ".tmp", path)


def chain_state(state: str) -> Optional[dict]:
    """What a trainer state directory has done, from its files alone (no TensorFlow):
    ``{"state", "key", "non_private", "steps_executed", "checkpoint_step"}`` — the write-ahead
    ledger's count (every step ever started, lost ones included) and the step of the newest
    checkpoint (where a re-run resumes; 0 without one). None when ``state`` holds no ledger."""
    import re

    try:
        with open(os.path.join(state, schema.DP_LEDGER_FILE), encoding="utf-8") as f:
            executed = int(json.load(f).get("steps_executed", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    checkpoint = 0
    try:  # tf.train.CheckpointManager's index: model_checkpoint_path: "ckpt-250"
        with open(os.path.join(state, "checkpoints", "checkpoint"), encoding="utf-8") as f:
            match = re.search(r'^model_checkpoint_path:\s*"[^"]*-(\d+)"', f.read(), re.M)
        checkpoint = int(match.group(1)) if match else 0
    except OSError:
        pass
    key, non_private = None, None
    try:
        with open(os.path.join(state, schema.RESUME_KEY_FILE), encoding="utf-8") as f:
            stored = json.load(f)
        key, non_private = stored.get("key"), bool(stored.get("non_private"))
    except (OSError, ValueError, AttributeError):
        pass
    if non_private is None:
        try:
            with open(os.path.join(state, schema.RUN_CONFIG_FILE), encoding="utf-8") as f:
                non_private = bool(json.load(f).get("non_private"))
        except (OSError, ValueError, AttributeError):
            non_private = False
    return {"state": state, "key": key, "non_private": non_private, "steps_executed": executed,
            "checkpoint_step": checkpoint}


def _write_charge_basis(state: str, vocab_event, count_record, plan, rows: int, tc: TrainingConfig):
    """What, with the write-ahead ledger's step count and σ, gives the ε the chain has spent
    (:func:`chain_charged`): the vocabulary and count records, the plan and the accounted n."""
    from dpbert.privacy import events

    if tc.non_private or tc.noise_seed is not None:
        return
    vocab_record = events.from_json(vocab_event) if isinstance(vocab_event, (str, bytes)) else vocab_event
    basis = {"vocab_record": vocab_record, "count_record": count_record, "plan": plan.to_dict(), "rows": int(rows),
             "training_delta": tc.delta}
    path = os.path.join(state, schema.CHARGE_BASIS_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(events.to_json(basis))
    os.replace(path + ".tmp", path)


def chain_charged(state: str) -> Optional[dict]:
    """The ε a training chain has spent so far — vocabulary, DP count and every step its write-ahead
    ledger counts, composed as the PrivacyAccountant would — from its state directory alone:
    ``{"epsilon_charged", "delta", "steps_charged"}``; None for a non-private chain or one that
    has not started a DP step's bookkeeping. What ``dpbert run`` records on a run that stopped
    before the accountant (interrupted, failed, refused)."""
    from dpbert.privacy import events
    from dpbert.privacy.plan import TrainingPlan

    try:
        with open(os.path.join(state, schema.CHARGE_BASIS_FILE), encoding="utf-8") as f:
            basis = events.from_json(f.read())
        with open(os.path.join(state, schema.DP_LEDGER_FILE), encoding="utf-8") as f:
            ledger = json.load(f)
        sigma = float(ledger["noise_multiplier_accounted"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fields = {f.name for f in dataclasses.fields(TrainingPlan)}
    plan = TrainingPlan(**{k: v for k, v in basis["plan"].items() if k in fields})
    steps = int(ledger.get("steps_executed", 0))
    spent = charged_ledger(basis["vocab_record"], basis["count_record"], sigma, plan, basis["rows"], steps,
                           basis["training_delta"])
    return {"epsilon_charged": spent["epsilon_total_pld"], "delta": spent["delta"], "steps_charged": steps}


def chains(pipeline_root: str) -> List[dict]:
    """:func:`chain_state` of every trainer state directory under ``pipeline_root``."""
    import glob

    found = (chain_state(os.path.dirname(p))
             for p in glob.glob(os.path.join(pipeline_root, STATE_ROOT, "*", schema.DP_LEDGER_FILE)))
    return [c for c in found if c is not None]


def training_record(sigma: float, plan, rows: int, steps: int) -> dict:
    """The DP-SGD record of ``steps`` executed steps of ``plan`` with accounted σ: per patient
    (``sampling_unit: patient``) or per tuple (shuffle: over the ``rows`` actually trained on)."""
    from dpbert.privacy import events

    if getattr(plan, "unit", "tuple") == "patient":
        return events.dpsgd_event(sigma, plan.batch_size, plan.dataset_size, steps, plan.sampling,
                                  plan.max_contributions, unit="patient")
    return events.dpsgd_event(sigma, plan.batch_size,
                              events.accounted_dataset_size(plan.sampling, plan.dataset_size, rows),
                              steps, plan.sampling)


def charged_ledger(vocab_record, count_record, sigma: float, plan, rows: int, steps: int, training_delta: float):
    """The run's ledger (``dpbert.privacy.accountant.ledger``, as the PrivacyAccountant composes it)
    if the chain has executed ``steps`` DP-SGD steps: vocabulary + DP count + training."""
    from dpbert.privacy.accountant import ledger
    from dpbert.stages.accountant import ledger_delta

    records = ([count_record] if count_record is not None else []) + \
        ([training_record(sigma, plan, rows, steps)] if steps > 0 else [])
    return ledger(vocab_record, records, ledger_delta(vocab_record, training_delta))


def _new_token_ids(vocabulary_dir):
    """The ids the DP vocabulary appended to the public one (training.trainable new_tokens); None
    for a DP vocabulary (no token_sources.json)."""
    from dpbert.model.trainable import new_token_ids_from_sources
    from dpbert.vocab.public import read_token_sources

    return new_token_ids_from_sources(read_token_sources(vocabulary_dir))


def budget_step_limit(budget: float, vocab_record, count_record, plan, rows: int, training_delta: float):
    """``limit(σ, needed) -> L`` for ``train_mlm(charge_limit=...)``: the largest number of executed
    steps L ≤ ``needed`` whose composed ε (vocabulary, count and L steps at σ) is ≤ ``budget``.
    ε grows with the steps, so a bisection over L; one accountant call when ``needed`` fits."""

    def limit(sigma: float, needed: int) -> int:
        def fits(steps: int) -> bool:
            ledger = charged_ledger(vocab_record, count_record, sigma, plan, rows, steps, training_delta)
            return ledger["epsilon_total_pld"] <= budget

        if needed <= 0 or fits(needed):
            return max(int(needed), 0)
        lo, hi = 0, int(needed)  # fits(hi) is False; lo = 0 steps adds nothing to charge
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    return limit


class TrainingBudgetRefused(RuntimeError):
    """The trainer refused a step the privacy budget does not cover (exit 3 in ``dpbert run``).
    ``refusal``: what ``schema.BUDGET_REFUSAL_FILE`` holds (ε already charged, steps, budget)."""

    def __init__(self, message: str, refusal: dict):
        super().__init__(message)
        self.refusal = refusal


def _refuse(state: str, refused, budget: float, vocab_record, count_record, plan, rows: int,
            training_delta: float):
    """Record what the chain has charged when the budget refused a step, then raise
    :class:`TrainingBudgetRefused`: the ε spent is written (private state dir, read by the local
    runner into ML Metadata) before the run fails."""
    from dpbert.privacy import events

    spent = charged_ledger(vocab_record, count_record, refused.sigma, plan, rows, refused.steps_executed,
                           training_delta)
    refusal = {
        "epsilon_charged": spent["epsilon_total_pld"], "delta": spent["delta"],
        "epsilon_train_charged": spent.get("epsilon_train"), "steps_charged": refused.steps_executed,
        "step_limit": refused.limit, "epsilon_budget": budget,
        "train_events": json.loads(events.to_json(
            ([count_record] if count_record is not None else []) +
            ([training_record(refused.sigma, plan, rows, refused.steps_executed)] if refused.steps_executed else []))),
    }
    path = os.path.join(state, schema.BUDGET_REFUSAL_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(refusal, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
    raise TrainingBudgetRefused(
        f"privacy.epsilon_budget = {budget:.4g} covers {refused.limit} DP-SGD steps of this training chain and "
        f"{refused.steps_executed} are already charged (ε = {spent['epsilon_total_pld']:.4g} at "
        f"δ = {spent['delta']:.3g} spent so far); no further step was run", refusal)


@dataclasses.dataclass
class PretrainResult(StageResult):
    train: Any = None           # dpbert.model.train.TrainResult
    plan: Any = None            # dpbert.privacy.plan.TrainingPlan
    dp_event: Optional[dict] = None
    epsilon: float = float("inf")
    state_dir: str = ""


def pretrain(tuples_dir: str, vocabulary_dir: str, model_dir: str, *, model_config: ModelConfig,
             training_config: TrainingConfig, privacy_config: PrivacyConfig,
             membership_config: MembershipConfig, pipeline_root: str,
             canaries_dir: Optional[str] = None, non_private: bool = False,
             stop_after_steps: Optional[int] = None, export_saved_model: bool = True,
             vocab_event=None) -> PretrainResult:
    """Pre-train on the tuples under ``tuples_dir``; write the model artifact into ``model_dir``.

    ``non_private``: the baseline (no clipping, no noise, ε = ∞) whatever
    ``training.non_private`` says. ``stop_after_steps``: tests (see ``CRASH_AFTER_STEPS_ENV``).
    ``vocab_event``: the DPVocabulary's DP record (JSON text or dict); with
    ``privacy.epsilon_budget`` the trainer never executes a step whose composed ε (vocabulary,
    DP count, every step the chain ever executed) exceeds the budget
    (:class:`TrainingBudgetRefused`, the ε charged so far recorded first).
    """
    from dpbert.model.train import BudgetExhausted, state_lock, train_mlm
    from dpbert.privacy import event_check, events
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, TOKENIZER_FILE, VOCAB_FILE, load_tokenizer

    mc, pc, membership = model_config, privacy_config, membership_config
    tc = dataclasses.replace(training_config, non_private=True) if non_private else training_config
    patient_unit = pc.unit == "patient"

    tokenizer = load_tokenizer(vocabulary_dir)
    train_patients, holdout_key_id = training_patients(tuples_dir, membership)
    patient_keys = None
    if patient_unit:  # user-level DP-SGD: rows grouped by patient (every tuple must have one)
        token_ids, row_ids, patient_keys = training_rows(tokenizer, tuples_dir, train_patients, mc.max_seq_length,
                                                         with_patients=True)
    else:
        token_ids, row_ids = training_rows(tokenizer, tuples_dir, train_patients, mc.max_seq_length)
    state = state_dir(pipeline_root, json.dumps(
        [tuples_dir, vocabulary_dir, dataclasses.asdict(mc), dataclasses.asdict(tc), dataclasses.asdict(pc),
         dataclasses.asdict(membership), int(tc.non_private), canaries_dir], sort_keys=True))
    units = len(set(patient_keys)) if patient_unit else int(token_ids.shape[0])
    with state_lock(state) as held_lock:  # held through training: a refused concurrent run draws no DP count
        _write_resume_key(state, resume_key(mc, tc, pc, membership.holdout_patient_fraction, tc.non_private),
                          tc.non_private)
        plan, count_record = plan_for(tc, membership, units, state, privacy=pc)
        if plan.batch_size > plan.dataset_size:
            what = "patients" if patient_unit else "tuples"
            public = "training.dataset_patients" if patient_unit else "training.dataset_size"
            raise ValueError(f"training.batch_size {plan.batch_size} exceeds the planned number of trained-on "
                             f"{what} {plan.dataset_size} ({public + ' × (1 − holdout)' if count_record is None else 'a DP count'})")
        canary_counts = None
        if canaries_dir is not None:
            from dpbert.stages.canary import apply_canaries

            # Canaries are test data inserted per row; they do not change the planned q.
            rows_before = int(token_ids.shape[0])
            token_ids, row_ids, canary_counts = apply_canaries(
                token_ids, row_ids, canaries_dir, mc.max_seq_length,
                rows_planned=plan.dataset_size * (plan.max_contributions if patient_unit else 1))
            if patient_unit:  # each appended audit canary is a patient of its own
                patient_keys = list(patient_keys) + [f"canary:{int(r)}" for r in row_ids[rows_before:]]
        n = int(token_ids.shape[0])
        specials = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
        # No exact count in a log line: the plan's n is public (or a DP count).
        log.info("trainer: planned n = %d (%s), %d tokens, vocabulary %d, %s", plan.dataset_size,
                 "public" if count_record is None else "DP count", mc.max_seq_length, tokenizer.get_vocab_size(),
                 "NON-PRIVATE baseline" if tc.non_private else
                 f"DP-SGD σ = {tc.noise_multiplier}, C = {tc.clip_norm}, q = {plan.sampling_probability:.4g}")

        vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())] \
            if mc.init == "minilm" else None
        initial_weights, public_properties, checkpoint = None, {schema.PUBLIC_INIT: None}, None
        if mc.init == "minilm":
            # The public start (no ε): a function of the checkpoint, the released vocabulary and the
            # shipped public text only — the tuples above are not passed to it.
            initial_weights, public_properties, checkpoint = public_start_weights(mc, tc, tokenizer, vocabulary_dir)
        _mark_state_root_private(pipeline_root)
        _write_charge_basis(state, vocab_event, count_record, plan, n, tc)
        budget = pc.epsilon_budget
        vocab_record = events.from_json(vocab_event) if isinstance(vocab_event, (str, bytes)) else vocab_event
        limit = None
        if budget is not None and not tc.non_private and tc.noise_seed is None:
            limit = budget_step_limit(budget, vocab_record, count_record, plan, n, tc.delta)
        try:
            result = train_mlm(token_ids, specials, tokenizer.get_vocab_size(), mc, tc, state, plan=plan, resume=True,
                               progress=True, vocab_tokens=vocab_tokens, stop_after_steps=stop_after_steps,
                               export_saved_model=export_saved_model, example_ids=row_ids,
                               public_checkpoint_dir=checkpoint, initial_weights=initial_weights,
                               patient_keys=patient_keys, charge_limit=limit, held_lock=held_lock,
                               new_token_ids=_new_token_ids(vocabulary_dir))
        except BudgetExhausted as refused:
            _refuse(state, refused, budget, vocab_record, count_record, plan, n, tc.delta)
        _copy_artifact_files(state, vocabulary_dir, model_dir, VOCAB_FILE, TOKENIZER_FILE)

        seeded = tc.noise_seed is not None and not tc.non_private
        if tc.non_private or seeded:
            # A fixed noise seed (tests only; refused with a budget) makes the noise predictable: ε = ∞.
            record = events.non_private_event("train")
            if seeded:
                record["reason"] = "training.noise_seed is set: the noise is predictable"
            epsilon = float("inf")
        else:
            # Charged for every step executed on private data, resumed runs and lost steps included,
            # with the σ actually applied and the DP diagnostics released with it (σ_eff).
            from dpbert.privacy.accountant import dpsgd_epsilon

            sigma = result.effective_noise_multiplier
            # user-level: patients Poisson-sampled at the planned rate, per-patient event
            record = training_record(sigma, plan, n, result.steps_taken_total)
            epsilon = dpsgd_epsilon(sigma, record["sampling_probability"], result.steps_taken_total,
                                    tc.delta, plan.sampling, user_level=patient_unit)
            # The record against the values the running sampler, step and ledger USED (a record
            # rebuilt from the configuration proves nothing); a mismatch fails before any event is written.
            mismatches = event_check.check_event(record, result.observed)
            if mismatches:
                raise event_check.IntegrityCheckFailed(
                    "the recorded DP event disagrees with the running training mechanism: " + "; ".join(mismatches))
        records = ([count_record] if count_record is not None and not (tc.non_private or seeded) else []) + [record]
        if count_record is not None and not (tc.non_private or seeded):
            from dpbert.privacy.accountant import ledger

            epsilon = ledger(None, records, tc.delta)["epsilon_train"]
        if canary_counts is not None:
            with open(os.path.join(model_dir, schema.CANARY_COUNTS_FILE), "w", encoding="utf-8") as f:
                json.dump(canary_counts, f)
        with open(os.path.join(model_dir, schema.DP_EVENTS_FILE), "w", encoding="utf-8") as f:
            f.write(events.to_json(records))
        shown = result.released_diagnostics  # noisy for a DP run; exact only for the private baseline
        private = tc.non_private or seeded
        properties = {
            schema.NON_PRIVATE: private,
            # The baseline (or a run with predictable noise) is not DP: never to be released.
            schema.PRIVATE: int(private),
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
            # The plan's n: public (training.dataset_size·(1 − holdout)) or a DP count — never exact.
            "planned_dataset_size": plan.dataset_size,
            # What n, B and q count: tuples, or patients (user-level DP-SGD, ≤ k tuples each).
            "privacy_unit": "patient" if patient_unit else "tuple",
            "max_tuples_per_patient": plan.max_contributions if patient_unit else None,
            "dataset_size_source": "public" if count_record is None else "dp_count",
            "delta": tc.delta,
            "epsilon_train": epsilon,
            schema.DP_EVENTS: events.to_json(records),
            # Diagnostics as released: DP estimates (dpbert.privacy.diagnostics) for a DP run.
            "diagnostics": "dp" if result.diagnostics_noise_std else ("exact (private)" if private else "none"),
            "diagnostics_noise_std": result.diagnostics_noise_std or None,
            # DP estimates are ratios of noisy sums (dpbert.privacy.diagnostics): their per-step noise
            # std, and the initial / final values as means over a window of 10 % of the steps.
            "diagnostics_step_noise_std": _diagnostics.step_noise_stds(result.diagnostics_noise_std,
                                                                       result.expected_batch_size) or None,
            "diagnostics_window": _diagnostics.window(len(shown.get("loss", []))),
            "final_mlm_loss": _tail_mean(shown.get("loss", []), _diagnostics.window(len(shown.get("loss", [])))),
            "final_mlm_accuracy": _tail_mean(shown.get("accuracy", []),
                                             _diagnostics.window(len(shown.get("accuracy", [])))),
            "initial_mlm_loss": _head_mean(shown.get("loss", []), _diagnostics.window(len(shown.get("loss", [])))),
            "loss_curve": loss_curve(shown.get("loss", [])),
            # The step of each point (the curve is subsampled and a resumed run starts at its checkpoint).
            LOSS_CURVE_STEPS: curve_steps(len(shown.get("loss", [])), result.resumed_from_step)
            if shown.get("loss") else None,
            "clipped_fraction": _tail_mean(shown.get("clipped_fraction", []), len(shown.get("clipped_fraction", []))),
            "clipping_path": result.clipping_path,
            # Pass/fail only (the statistics, with exact counts, stay in the private train_result.json).
            schema.INTEGRITY_CHECKS: dict(event="not run: no DP event" if private else "passed",
                                          **event_check.summary(result.integrity_checks)),
            schema.HOLDOUT_FRACTION: membership.holdout_patient_fraction if train_patients is not None else None,
            "holdout_key_id": holdout_key_id,
            "model_preset": mc.preset,
            schema.MAX_SEQ_LENGTH: mc.max_seq_length,
            # The public start (outside the ledger: public checkpoint + shipped public text).
            **public_properties,
        }
        log.info("trainer: %d steps in total (%d this run), final MLM loss %s (%s)", result.steps_taken_total,
                 result.steps_this_run, properties["final_mlm_loss"], properties["diagnostics"])
        return PretrainResult(properties=properties, train=result, plan=plan, dp_event=record, epsilon=epsilon,
                              state_dir=state)


def _tail_mean(values, k: int = 5):
    return float(sum(values[-k:]) / len(values[-k:])) if values else None


def _head_mean(values, k: int = 5):
    return float(sum(values[:k]) / len(values[:k])) if values else None


def _mark_state_root_private(pipeline_root: str):
    root = os.path.join(pipeline_root, STATE_ROOT)
    os.makedirs(root, exist_ok=True)
    marker = os.path.join(root, PRIVATE_MARKER)
    if not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as f:
            f.write("Operator-only: trainer state computed on private data without noise (checkpoints, exact\n"
                    "training curves, the write-ahead DP ledger, sampling keys). Never release anything here;\n"
                    "`dpbert release` writes the released set (dpbert/release.py).\n")


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
