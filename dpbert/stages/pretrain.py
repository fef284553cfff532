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
   never the exact count; inserts the canaries row by row
   (``dpbert.evaluate.canary_insertion.apply_canaries``) and hands the plan to ``train_mlm``:
   nothing else here computes n, q or the number of steps;
4. trains in a *stable* training chain ``<pipeline_root>/_trainer_state/<key>`` keyed by the inputs
   and the configuration (``dpbert.engine.chain.state_dir``), not in the execution's output
   directory, so a re-run after a crash or preemption resumes from the last checkpoint and the
   write-ahead step log keeps counting every step ever executed on the private data;
5. copies the model, its records and the tokenizer into the model directory and records the DP
   event built from the plan plus what actually ran (``steps_taken_total``, the σ applied), from
   which the accountant recomputes ε.

``privacy.unit: patient`` (user-level DP-SGD): every trained-on tuple must carry a patient id
(:class:`PatientIdsMissing` otherwise); the rows are grouped by patient, the plan is over the
PUBLIC number of patients (``training.dataset_patients`` · (1 − holdout), else a DP count of the
trained-on patients, sensitivity 1), ``training.batch_size`` patients per step, each bringing
≤ k = ``privacy.max_tuples_per_patient`` tuples, and the DP event is per patient
(``sampling_unit: patient``). Appended audit canaries are one patient each.

With ``model.init: minilm`` the model starts from the PUBLIC start
(``dpbert.engine.public_warmup.public_start_weights``): the checkpoint's first
``model.public_layers`` layers and a non-private MLM warm-up on text shipped in the repository —
no private input, outside the ledger — recorded as ``public_init`` / ``public_layers`` /
``public_warmup_steps`` / ``public_warmup_source``.

Every state and artifact file is read and written through ``dpbert.storage`` (local or remote).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from os import environ
from typing import Any, Callable, Optional, Sequence

from dpbert import schema, storage
from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig
# The chain's helpers live in the training engine; re-exported for the guard, the runner and tests.
from dpbert.engine.chain import (PRIVATE_MARKER, STATE_ROOT, chain_state, chains,  # noqa: F401
                                       copy_artifact_files, mark_state_root_private, state_dir, write_resume_key)
from dpbert.engine.charges import (TrainingBudgetRefused, budget_step_limit, chain_charged, run_step_limit,  # noqa: F401
                                         charged_ledger, refuse, resume_key, stage_state_dir, training_record,
                                         write_charge_basis)
from dpbert.diagnostics.loss_curve import curve_steps, loss_curve
from dpbert.engine.public_warmup import public_start_weights  # noqa: F401  (re-exported)
from dpbert.privacy import diagnostics as _diagnostics
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.trainer")

#: Fault injection for the resume test (``tests/e2e/test_resume.py``): an integer k makes the
#: trainer crash (``SimulatedCrash``) after k steps of the run (a ``CrashAfter(k)`` hook).
CRASH_AFTER_STEPS_ENV = "DPBERT_TEST_CRASH_AFTER_STEPS"
DP_COUNT_FILE = schema.DP_COUNT_FILE


def crash_after_steps_from_env() -> Optional[int]:
    """``$DPBERT_TEST_CRASH_AFTER_STEPS`` as an int (tests only), None when unset."""
    value = environ.get(CRASH_AFTER_STEPS_ENV)
    return int(value) if value else None


def _hooks_from_env() -> list:
    from dpbert.engine.hooks import CrashAfter

    steps = crash_after_steps_from_env()
    return [] if steps is None else [CrashAfter(steps)]


#: PretrainedModel property: the training step of each ``loss_curve`` point (``curve_steps``).
LOSS_CURVE_STEPS = schema.LOSS_CURVE_STEPS


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


def plan_for(tc: TrainingConfig, membership: MembershipConfig, rows: int, state: str, unit_cap: int = 1,
             privacy: Optional[PrivacyConfig] = None):
    """(TrainingPlan, count record or None): over the public ``training.dataset_size`` with the
    holdout fraction, else over a DP count of the ``rows`` trained on (``dpbert.privacy.count``).
    ``privacy.unit == "patient"``: ``rows`` is the number of trained-on PATIENTS and the public n
    ``training.dataset_patients`` (the DP count of patients has sensitivity 1).

    The DP count is drawn ONCE per state directory and kept there (private): a resumed run plans
    with the same released n̂ (same q, so the checkpoint resumes) and the count is charged once.
    Call it holding ``state_lock(state)`` (:func:`pretrain` does): a run refused by the lock draws
    no count, and the file is created exclusively (``if_generation_match=0``).
    """
    from dpbert.privacy import count
    from dpbert.privacy.plan import plan_training

    patient_unit = privacy is not None and privacy.unit == "patient"
    unit = "patient" if patient_unit else "tuple"
    k = privacy.max_tuples_per_patient if patient_unit else 1
    public_n = tc.dataset_patients if patient_unit else tc.dataset_size
    if public_n is not None:
        return plan_training(tc, public_n, membership.holdout_patient_fraction, unit=unit, max_contributions=k), None
    path = storage.join(state, schema.DP_COUNT_FILE)
    stored = storage.read_json(path, default=None)
    if stored is not None:
        n_hat = int(stored["released"])
    else:
        import numpy as np

        rng = None if tc.noise_seed is None else np.random.default_rng([int(tc.noise_seed), 0xC0DE])
        n_hat = count.dp_count(rows, tc.count_noise_multiplier, unit_cap, rng=rng)
        # Created exclusively: a second count is never drawn over the first, which the chain's
        # checkpoints and step log were planned with.
        storage.write_json(path, {"released": n_hat}, if_generation_match=0)
    if patient_unit:  # a count of patients: sensitivity 1; the record names the ledger's unit (k)
        return (plan_training(tc, n_hat, unit=unit, max_contributions=k),
                count.count_event(tc.count_noise_multiplier, n_hat, unit="patient", max_contributions=k))
    return plan_training(tc, n_hat), count.count_event(tc.count_noise_multiplier, n_hat)


def _new_token_ids(vocabulary_dir):
    """The ids the DP vocabulary appended to the public one (training.trainable new_tokens); None
    for a DP vocabulary (no token_sources.json)."""
    from dpbert.network.trainable import new_token_ids_from_sources
    from dpbert.vocab.public import read_token_sources

    return new_token_ids_from_sources(read_token_sources(vocabulary_dir))


@dataclasses.dataclass
class PretrainResult(StageResult):
    train: Any = None           # dpbert.engine.train.TrainResult
    plan: Any = None            # dpbert.privacy.plan.TrainingPlan
    dp_event: Optional[dict] = None
    epsilon: float = float("inf")
    state_dir: str = ""


@dataclasses.dataclass(frozen=True)
class PretrainInputs:
    """What the stage reads: the WordTuples under ``tuples_dir``, the DP vocabulary in
    ``vocabulary_dir`` and its DP record ``vocab_event`` (JSON text or dict; None: none), the
    canaries to insert from ``canaries_dir`` (None: none)."""
    tuples_dir: str
    vocabulary_dir: str
    canaries_dir: Optional[str] = None
    vocab_event: Any = None


@dataclasses.dataclass(frozen=True)
class PretrainOptions:
    """How this run trains and where it is charged. ``non_private``: the baseline (no clipping, no
    noise, ε = ∞) whatever ``training.non_private`` says. ``export_saved_model``: as ``train_mlm``'s
    (None: its default). ``hooks``: extra hooks of the training loop (``dpbert.engine.hooks``).
    ``ledger_target``: the dataset ledger's ``LedgerTarget`` JSON (``dpbert.ledger``; empty: no
    dataset identity, nothing reserved)."""
    non_private: bool = False
    export_saved_model: Optional[bool] = None
    hooks: Sequence = ()
    ledger_target: str = ""


@dataclasses.dataclass
class _Rows:
    """The trained-on rows: token ids, record ids, each row's patient (patient unit), the patients
    kept (None without a holdout) and the holdout key's id; canary counts once inserted."""

    token_ids: Any
    row_ids: Any
    patient_keys: Optional[list]
    train_patients: Optional[frozenset]
    holdout_key_id: Optional[str]
    canary_counts: Optional[dict] = None

    @property
    def units(self) -> int:
        """The EXACT number of trained-on units (private: planning uses it only for a DP count)."""
        return len(set(self.patient_keys)) if self.patient_keys is not None else int(self.token_ids.shape[0])


def _read_rows(tokenizer, tuples_dir: str, membership: MembershipConfig, mc: ModelConfig, patient_unit: bool):
    train_patients, holdout_key_id = training_patients(tuples_dir, membership)
    if patient_unit:  # user-level DP-SGD: rows grouped by patient (every tuple must have one)
        token_ids, row_ids, keys = training_rows(tokenizer, tuples_dir, train_patients, mc.max_seq_length,
                                                 with_patients=True)
        return _Rows(token_ids, row_ids, keys, train_patients, holdout_key_id)
    token_ids, row_ids = training_rows(tokenizer, tuples_dir, train_patients, mc.max_seq_length)
    return _Rows(token_ids, row_ids, None, train_patients, holdout_key_id)


def _insert_canaries(rows: _Rows, canaries_dir: str, plan, max_seq_length: int):
    """Canaries are test data inserted per row; they do not change the planned q."""
    from dpbert.evaluate.canary_insertion import apply_canaries

    patient_unit = rows.patient_keys is not None
    before = int(rows.token_ids.shape[0])
    rows.token_ids, rows.row_ids, rows.canary_counts = apply_canaries(
        rows.token_ids, rows.row_ids, canaries_dir, max_seq_length,
        rows_planned=plan.dataset_size * (plan.max_contributions if patient_unit else 1))
    if patient_unit:  # each appended audit canary is a patient of its own
        rows.patient_keys = list(rows.patient_keys) + [f"canary:{int(r)}" for r in rows.row_ids[before:]]


def _check_batch(plan, count_record, patient_unit: bool):
    if plan.batch_size > plan.dataset_size:
        what = "patients" if patient_unit else "tuples"
        public = "training.dataset_patients" if patient_unit else "training.dataset_size"
        raise ValueError(f"training.batch_size {plan.batch_size} exceeds the planned number of trained-on "
                         f"{what} {plan.dataset_size} "
                         f"({public + ' × (1 − holdout)' if count_record is None else 'a DP count'})")


@dataclasses.dataclass
class _Run:
    """One run of the stage, as its helpers share it."""

    mc: ModelConfig
    tc: TrainingConfig
    pc: PrivacyConfig
    membership: MembershipConfig
    state: str
    rows: Optional[_Rows] = None
    plan: Any = None
    count_record: Optional[dict] = None
    vocab_record: Any = None
    reservation: Any = None  # the dataset ledger's entry of this chain (dpbert.accounting.reserve)

    @property
    def patient_unit(self) -> bool:
        return self.pc.unit == "patient"

    @property
    def seeded(self) -> bool:
        """A fixed noise seed (tests only; refused with a budget) makes the noise predictable: ε = ∞."""
        return self.tc.noise_seed is not None and not self.tc.non_private

    @property
    def private(self) -> bool:
        """Not DP (the baseline, or predictable noise): never to be released."""
        return self.tc.non_private or self.seeded


def _train(run: _Run, tokenizer, vocabulary_dir: str, pipeline_root: str, held_lock, export_saved_model: Optional[bool],
           hooks: Sequence):
    """(TrainResult, the public start's properties): the public start (no ε) when configured, the
    chain's charge basis, the budget's per-step limit, then ``train_mlm`` in the chain."""
    from dpbert.engine.train import BudgetExhausted, train_mlm
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS

    mc, tc, plan, rows = run.mc, run.tc, run.plan, run.rows
    n = int(rows.token_ids.shape[0])
    specials = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    # No exact count in a log line: the plan's n is public (or a DP count).
    log.info("trainer: planned n = %d (%s), %d tokens, vocabulary %d, %s", plan.dataset_size,
             "public" if run.count_record is None else "DP count", mc.max_seq_length, tokenizer.get_vocab_size(),
             "NON-PRIVATE baseline" if tc.non_private else
             f"DP-SGD σ = {tc.noise_multiplier}, C = {tc.clip_norm}, q = {plan.sampling_probability:.4g}")
    vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())] \
        if mc.init == "minilm" else None
    initial_weights, public_properties, checkpoint = None, {schema.PUBLIC_INIT: None}, None
    if mc.init == "minilm":
        # The public start (no ε): a function of the checkpoint, the released vocabulary and the
        # shipped public text only — the tuples above are not passed to it.
        initial_weights, public_properties, checkpoint = public_start_weights(mc, tc, tokenizer, vocabulary_dir)
    mark_state_root_private(pipeline_root)
    write_charge_basis(run.state, run.vocab_record, run.count_record, plan, n, tc)
    budget = run.pc.epsilon_budget
    limit = None
    if run.reservation is not None and not tc.non_private and tc.noise_seed is None:
        limit = budget_step_limit(run.reservation, budget, plan, n)
    elif budget is not None and not tc.non_private and tc.noise_seed is None:
        limit = run_step_limit(budget, run.vocab_record, run.count_record, plan, n, tc.delta)
    try:
        result = train_mlm(rows.token_ids, specials, tokenizer.get_vocab_size(), mc, tc, run.state, plan=plan,
                           resume=True, progress=True, vocab_tokens=vocab_tokens,
                           export_saved_model=export_saved_model, example_ids=rows.row_ids,
                           public_checkpoint_dir=checkpoint, initial_weights=initial_weights,
                           patient_keys=rows.patient_keys, charge_limit=limit, held_lock=held_lock,
                           new_token_ids=_new_token_ids(vocabulary_dir), hooks=list(hooks) + _hooks_from_env())
    except BudgetExhausted as refused:
        refuse(run.state, refused, budget, run.vocab_record, run.count_record, plan, n, tc.delta)
    return result, public_properties


def _dp_records(run: _Run, result):
    """(the training record, the records of the model artifact, ε_train): charged for every step
    executed on private data — resumed runs and lost steps included — with the σ actually applied
    and the DP diagnostics released with it (σ_eff); checked against the running mechanism."""
    from dpbert.privacy import event_check, events

    tc, plan = run.tc, run.plan
    if run.private:
        record = events.non_private_event("train")
        if run.seeded:
            record["reason"] = "training.noise_seed is set: the noise is predictable"
        return record, [record], float("inf")
    from dpbert.accounting.accountant import dpsgd_epsilon, ledger

    sigma, steps = result.effective_noise_multiplier, result.steps_taken_total
    # user-level: patients Poisson-sampled at the planned rate, per-patient event
    record = training_record(sigma, plan, int(run.rows.token_ids.shape[0]), steps)
    epsilon = dpsgd_epsilon(sigma, record["sampling_probability"], steps, tc.delta, plan.sampling,
                            user_level=run.patient_unit)
    # The record against the values the running sampler, step and step log USED (a record rebuilt
    # from the configuration proves nothing); a mismatch fails before any event is written.
    mismatches = event_check.check_event(record, result.observed)
    if mismatches:
        raise event_check.IntegrityCheckFailed(
            "the recorded DP event disagrees with the running training mechanism: " + "; ".join(mismatches))
    if run.count_record is None:
        return record, [record], epsilon
    records = [run.count_record, record]
    return record, records, ledger(None, records, tc.delta)["epsilon_train"]


VOCAB_DP_EVENT_FILE = schema.VOCAB_DP_EVENT_FILE


def _write_vocab_record(run: _Run, vocabulary_dir: str, model_dir: str):
    from dpbert.privacy import events

    record = storage.read_json(storage.join(vocabulary_dir, "dp_event.json"), default=None) or run.vocab_record
    storage.write_text(storage.join(model_dir, VOCAB_DP_EVENT_FILE),
                       events.to_json({"vocab_event": record, "training_delta": run.tc.delta}))


def _write_records(model_dir: str, canary_counts: Optional[dict], records: list):
    from dpbert.privacy import events

    if canary_counts is not None:
        storage.write_json(storage.join(model_dir, schema.CANARY_COUNTS_FILE), canary_counts)
    storage.write_text(storage.join(model_dir, schema.DP_EVENTS_FILE), events.to_json(records))


def _diagnostic_properties(result, private: bool) -> dict:
    """The diagnostics as released: DP estimates (``dpbert.privacy.diagnostics``) for a DP run —
    ratios of noisy sums, so their per-step noise std and the initial / final values as means over
    a window of 10 % of the steps — the exact curve only for the private baseline."""
    shown = result.released_diagnostics
    losses = shown.get("loss", [])
    window = _diagnostics.window(len(losses))
    return {
        "diagnostics": "dp" if result.diagnostics_noise_std else ("exact (private)" if private else "none"),
        "diagnostics_noise_std": result.diagnostics_noise_std or None,
        "diagnostics_step_noise_std": _diagnostics.step_noise_stds(result.diagnostics_noise_std,
                                                                   result.expected_batch_size) or None,
        "diagnostics_window": window,
        "final_mlm_loss": _tail_mean(losses, window),
        "final_mlm_accuracy": _tail_mean(shown.get("accuracy", []), _diagnostics.window(len(shown.get("accuracy", [])))),
        "initial_mlm_loss": _head_mean(losses, window),
        "loss_curve": loss_curve(losses),
        # The step of each point (the curve is subsampled and a resumed run starts at its checkpoint).
        LOSS_CURVE_STEPS: curve_steps(len(losses), result.resumed_from_step) if losses else None,
        "clipped_fraction": _tail_mean(shown.get("clipped_fraction", []), len(shown.get("clipped_fraction", []))),
        # The mean RELEASED (noisy, for a DP run) batch size: the report warns when it is far below B.
        "diagnostics_batch_size_mean": _tail_mean(shown.get("batch_size", []), len(shown.get("batch_size", []))),
    }


def _properties(run: _Run, result, record: dict, records: list, epsilon: float, public_properties: dict) -> dict:
    """The PretrainedModel's properties: released values only (the plan's public or DP-counted n,
    never an exact count; the integrity checks as pass/fail)."""
    from dpbert.privacy import event_check, events

    tc, plan, private = run.tc, run.plan, run.private
    return {
        schema.NON_PRIVATE: private,
        schema.PRIVATE: int(private),
        "noise_multiplier": 0.0 if tc.non_private else tc.noise_multiplier,
        "effective_noise_multiplier": result.effective_noise_multiplier,
        "clip_norm": tc.clip_norm,
        # Public provenance of the learning rate and clip norm (a public-proxy tuning file), or None.
        "tuned_from": tc.tuned_from,
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
        "privacy_unit": "patient" if run.patient_unit else "tuple",
        "max_tuples_per_patient": plan.max_contributions if run.patient_unit else None,
        "dataset_size_source": "public" if run.count_record is None else "dp_count",
        "delta": tc.delta,
        "epsilon_train": epsilon,
        schema.DP_EVENTS: events.to_json(records),
        **_diagnostic_properties(result, private),
        "clipping_path": result.clipping_path,
        # Pass/fail only (the statistics, with exact counts, stay in the private train_result.json).
        schema.INTEGRITY_CHECKS: dict(event="not run: no DP event" if private else "passed",
                                      **event_check.summary(result.integrity_checks)),
        schema.HOLDOUT_FRACTION: run.membership.holdout_patient_fraction if run.rows.train_patients is not None
        else None,
        "holdout_key_id": run.rows.holdout_key_id,
        "model_preset": run.mc.resolved_preset,
        # What DP-SGD trained (``training.trainable``; LoRA adapters merged into the released weights).
        "trainable": result.trainable or None,
        schema.MAX_SEQ_LENGTH: run.mc.max_seq_length,
        # The public start (outside the ledger: public checkpoint + shipped public text).
        **public_properties,
    }


def _accounted_sigma(tc: TrainingConfig) -> float:
    """The σ every step is charged at: the gradient's, composed with the DP diagnostics."""
    from dpbert.accounting.sigma import configured_sigma

    return configured_sigma(tc)


def _planned_records(run: _Run, count_record: Optional[dict]) -> list:
    """What this run will have charged once it completes, for the dataset ledger: [count,] the
    chain's DP-SGD record at the steps it will have EXECUTED (its step log + the plan's steps from
    the checkpoint on). Non-private or seeded: listed only."""
    from dpbert.engine.chain import chain_state
    from dpbert.privacy import events

    if run.private:
        return [events.non_private_event("train")]
    if run.plan is None:  # before a DP count: reserve the count alone first
        return [count_record]
    done = chain_state(run.state) or {"steps_executed": 0, "checkpoint_step": 0}
    steps_after = int(done["steps_executed"]) + max(run.plan.steps - int(done["checkpoint_step"]), 0)
    record = training_record(_accounted_sigma(run.tc), run.plan, run.rows.units, steps_after)
    return ([count_record] if count_record is not None else []) + [record]


def _reserve(run: _Run, target, model_dir: str, key: str):
    """Reserve in the dataset ledger (``dpbert.ledger``) BEFORE a DP mechanism reads the data:
    the DP count (when there is no public n) before it is drawn, then the count and the training.
    Over the dataset's budget: ``BudgetRefused`` (exit 3), nothing drawn or trained. None without
    a dataset identity."""
    from dpbert.accounting.target import reserve_training
    from dpbert.privacy import count

    tc, pc = run.tc, run.pc
    if target is None:
        run.plan, run.count_record = plan_for(tc, run.membership, run.rows.units, run.state, privacy=pc)
        _check_batch(run.plan, run.count_record, run.patient_unit)
        return None
    public_n = tc.dataset_patients if run.patient_unit else tc.dataset_size
    if public_n is None and not run.private:
        k = pc.max_tuples_per_patient if run.patient_unit else 1
        placeholder = count.count_event(tc.count_noise_multiplier, 0, unit=pc.unit, max_contributions=k) \
            if run.patient_unit else count.count_event(tc.count_noise_multiplier, 0)
        reserve_training(target, model_dir, chain=run.state, resume_key=key,
                         planned_records=_planned_records(run, placeholder))
    run.plan, run.count_record = plan_for(tc, run.membership, run.rows.units, run.state, privacy=pc)
    _check_batch(run.plan, run.count_record, run.patient_unit)
    return reserve_training(target, model_dir, chain=run.state, resume_key=key,
                            planned_records=_planned_records(run, run.count_record))


def _finalize(run: _Run, reservation):
    """The chain's executed steps (its write-ahead step log, never less), whatever stopped it."""
    from dpbert.accounting.target import finalize_training
    from dpbert.engine.chain import chain_state

    if reservation is None:
        return
    steps = int((chain_state(run.state) or {"steps_executed": 0})["steps_executed"])
    finalize_training(reservation, steps, _executed_shuffle_records(run, steps))


def _executed_shuffle_records(run: _Run, steps: int) -> Optional[list]:
    """A shuffled DP run's executed records: [count,] its DP-SGD record at ``steps`` over the rows
    it trains on (a shuffled record's epochs depend on that n, which the ledger does not hold; the
    record is built as the model's own, ``training_record``). None otherwise: the ledger re-plans
    a Poisson record from the step count itself, and lists a non-private one as reserved."""
    if run.private or run.plan is None or run.plan.sampling != "shuffle":
        return None
    record = training_record(_accounted_sigma(run.tc), run.plan, run.rows.units, steps) if steps > 0 else None
    return [r for r in (run.count_record, record) if r is not None]


def pretrain(inputs: PretrainInputs, model_dir: str, *, model_config: ModelConfig,
             training_config: TrainingConfig, privacy_config: PrivacyConfig, membership_config: MembershipConfig,
             pipeline_root: str, options: PretrainOptions = PretrainOptions()) -> PretrainResult:
    """Pre-train on ``inputs`` (:class:`PretrainInputs`); write the model artifact into ``model_dir``.

    With ``privacy.epsilon_budget`` the trainer never executes a step whose composed ε
    (vocabulary, DP count, every step the chain ever executed) exceeds the budget
    (:class:`TrainingBudgetRefused`, the ε charged so far recorded first). ``options``
    (:class:`PretrainOptions`): the non-private baseline, the SavedModel export, extra loop hooks
    (``$DPBERT_TEST_CRASH_AFTER_STEPS`` adds a ``CrashAfter``) and the dataset ledger's target:
    with one, the run's whole planned charge is reserved before the DP count or the first step
    reads the data, and finalized to the executed steps however the run stops.
    """
    from dpbert.accounting.target import LedgerTarget
    from dpbert.engine.train import state_lock
    from dpbert.privacy import events
    from dpbert.vocab.wordpiece import load_tokenizer

    mc, pc, membership, vocab_event = model_config, privacy_config, membership_config, inputs.vocab_event
    tc = dataclasses.replace(training_config, non_private=True) if options.non_private else training_config
    tokenizer = load_tokenizer(inputs.vocabulary_dir)
    state = stage_state_dir(pipeline_root, inputs.tuples_dir, inputs.vocabulary_dir, mc, tc, pc, membership,
                            inputs.canaries_dir)
    run = _Run(mc, tc, pc, membership, state,
               vocab_record=events.from_json(vocab_event) if isinstance(vocab_event, (str, bytes)) else vocab_event)
    run.rows = _read_rows(tokenizer, inputs.tuples_dir, membership, mc, run.patient_unit)
    with state_lock(state) as held_lock:  # held through training: a refused concurrent run draws no DP count
        key = resume_key(mc, tc, pc, membership.holdout_patient_fraction, tc.non_private)
        write_resume_key(state, key, tc.non_private)
        target = LedgerTarget.from_json(options.ledger_target) if options.ledger_target else None
        reservation = run.reservation = _reserve(run, target, model_dir, key)
        try:
            return _run_reserved(run, tokenizer, inputs, model_dir, pipeline_root, held_lock, options)
        finally:
            _finalize(run, reservation)


def _run_reserved(run: _Run, tokenizer, inputs: PretrainInputs, model_dir: str, pipeline_root: str, held_lock,
                  options: PretrainOptions) -> PretrainResult:
    """The stage once the plan is made and the dataset ledger holds its reservation."""
    from dpbert.vocab.wordpiece import TOKENIZER_FILE, VOCAB_FILE

    if inputs.canaries_dir is not None:
        _insert_canaries(run.rows, inputs.canaries_dir, run.plan, run.mc.max_seq_length)
    result, public_properties = _train(run, tokenizer, inputs.vocabulary_dir, pipeline_root, held_lock,
                                       options.export_saved_model, options.hooks)
    copy_artifact_files(run.state, inputs.vocabulary_dir, model_dir, VOCAB_FILE, TOKENIZER_FILE)
    _write_vocab_record(run, inputs.vocabulary_dir, model_dir)
    record, records, epsilon = _dp_records(run, result)
    _write_records(model_dir, run.rows.canary_counts, records)
    properties = _properties(run, result, record, records, epsilon, public_properties)
    log.info("trainer: %d steps in total (%d this run), final MLM loss %s (%s)", result.steps_taken_total,
             result.steps_this_run, properties["final_mlm_loss"], properties["diagnostics"])
    return PretrainResult(properties=properties, train=result, plan=run.plan, dp_event=record, epsilon=epsilon,
                          state_dir=run.state)


def pretrain_worker(tuples_dir: str, vocabulary_dir: str, state: str, *, model_config: ModelConfig,
                    training_config: TrainingConfig, privacy_config: PrivacyConfig,
                    membership_config: MembershipConfig, canaries_dir: Optional[str] = None,
                    wait: Callable[[str, str], None]) -> None:
    """A worker of rank > 0 of ``pretrain`` (``dpbert.trainer_workers``): the chief's rows, plan,
    canaries and public start rebuilt from the same inputs, then ``train_mlm`` in the chief's chain
    ``state`` without its lock (``build_training`` writes nothing from rank > 0). ``wait(uri,
    what)``: returns once the chief has written ``uri`` (its resume key; the DP count it drew)."""
    from dpbert.engine.train import train_mlm
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer

    mc, tc, pc = model_config, training_config, privacy_config
    tokenizer = load_tokenizer(vocabulary_dir)
    rows = _read_rows(tokenizer, tuples_dir, membership_config, mc, pc.unit == "patient")
    wait(storage.join(state, schema.RESUME_KEY_FILE), "resume key of this chain")
    if (tc.dataset_patients if pc.unit == "patient" else tc.dataset_size) is None:
        wait(storage.join(state, schema.DP_COUNT_FILE), "DP count of this chain")  # the chief's n̂
    plan, _ = plan_for(tc, membership_config, rows.units, state, privacy=pc)
    if canaries_dir is not None:
        _insert_canaries(rows, canaries_dir, plan, mc.max_seq_length)
    initial_weights, checkpoint, vocab_tokens = None, None, None
    if mc.init == "minilm":
        initial_weights, _, checkpoint = public_start_weights(mc, tc, tokenizer, vocabulary_dir)
        vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    train_mlm(rows.token_ids, {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS},
              tokenizer.get_vocab_size(), mc, tc, state, plan=plan, resume=True, progress=False,
              vocab_tokens=vocab_tokens, export_saved_model=False, example_ids=rows.row_ids,
              public_checkpoint_dir=checkpoint, initial_weights=initial_weights, patient_keys=rows.patient_keys,
              new_token_ids=_new_token_ids(vocabulary_dir))


def _tail_mean(values, k: int = 5):
    """The mean of the last ``k`` steps' values that are numbers (a step whose logical batch held no
    example has NaN: 0/0, no loss to average; ``progress.finite_mean``); None when there is none."""
    return _finite_mean(values[-k:]) if values else None


def _head_mean(values, k: int = 5):
    """As :func:`_tail_mean`, over the first ``k`` steps."""
    return _finite_mean(values[:k]) if values else None


def _finite_mean(values):
    from dpbert.engine.progress import finite_mean

    mean, counted = finite_mean(values)
    return float(mean) if counted else None

