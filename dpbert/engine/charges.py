"""What a training chain has charged, from its state directory: the configuration key the budget
guard finds chains by, the charge basis (vocabulary and count records, plan, accounted n) that
with the step log's count and σ gives the ε spent after any stop, the per-step budget limit, and
the refusal record written when the budget refuses a step. All I/O through ``dpbert.storage``."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Optional

from dpbert import schema, storage
from dpbert.engine.chain import chain_state, read_step_log


def chain_training_config(tc):
    """The training configuration a chain's identity is made of: the same whatever the number of
    worker processes, so a re-run with another ``training.workers`` resumes the chain (its step
    log charges every executed step, whoever ran it). A worker process trains with
    ``engine.workers.process_config`` (strategy multi_worker over W × replicas): mapped back."""
    workers = max(int(tc.workers or 1), 1)
    processed = workers > 1 and tc.strategy == "multi_worker"
    replicas = int(tc.replicas) // workers if processed else int(tc.replicas)
    strategy = "default" if processed and replicas == 1 else ("mirrored" if processed else tc.strategy)
    fields = {f.name for f in dataclasses.fields(tc)}
    # Whether a SavedModel is also written, and where the settings came from, are no part of it either.
    return dataclasses.replace(tc, replicas=replicas, strategy=strategy,
                               **({"workers": 1} if "workers" in fields else {}),
                               **({"tuned_from": None} if "tuned_from" in fields else {}),
                               **({"export_saved_model": False} if "export_saved_model" in fields else {}))


def stage_state_dir(pipeline_root: str, tuples_dir: str, vocabulary_dir: str, mc, tc, pc, membership,
                    canaries_dir) -> str:
    """The trainer stage's chain for these inputs and this configuration (any number of workers:
    :func:`chain_training_config`); one definition for the stage and its worker processes."""
    from dpbert.engine.chain import state_dir

    return state_dir(pipeline_root, json.dumps(
        [tuples_dir, vocabulary_dir, dataclasses.asdict(mc), dataclasses.asdict(chain_training_config(tc)),
         dataclasses.asdict(pc), dataclasses.asdict(membership), int(tc.non_private), canaries_dir], sort_keys=True))


def resume_key(mc, tc, pc, holdout_fraction: float, non_private: bool) -> str:
    """The configuration part of a trainer state directory's identity (no artifact URIs), stored in
    it as ``schema.RESUME_KEY_FILE``: the budget guard (``pipeline.guard``) finds, before the DAG
    starts, every chain a run with this configuration could resume and counts what it charged.
    Coarser than ``chain.state_dir`` on purpose: two chains with one key both count (conservative)."""
    material = json.dumps([dataclasses.asdict(mc), dataclasses.asdict(chain_training_config(tc)),
                           dataclasses.asdict(pc), float(holdout_fraction), bool(non_private)], sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def training_record(sigma: float, plan, rows: int, steps: int) -> dict:
    """The DP-SGD record of ``steps`` executed steps of ``plan`` with accounted σ: per patient
    (``sampling_unit: patient``) or per tuple (shuffle: over the ``rows`` actually trained on)."""
    from dpbert.privacy import events

    if plan.unit == "patient":
        return events.dpsgd_event(sigma, plan.batch_size, plan.dataset_size, steps, plan.sampling,
                                  plan.max_contributions, unit="patient")
    return events.dpsgd_event(sigma, plan.batch_size,
                              events.accounted_dataset_size(plan.sampling, plan.dataset_size, rows),
                              steps, plan.sampling)


def charged_ledger(vocab_record, count_record, sigma: float, plan, rows: int, steps: int, training_delta: float):
    """The run's privacy ledger (``dpbert.accounting.accountant.ledger``, as the PrivacyAccountant
    composes it) if the chain has executed ``steps`` DP-SGD steps: vocabulary + DP count + training."""
    from dpbert.accounting.accountant import ledger
    from dpbert.privacy.composition import ledger_delta

    records = ([count_record] if count_record is not None else []) + \
        ([training_record(sigma, plan, rows, steps)] if steps > 0 else [])
    return ledger(vocab_record, records, ledger_delta(vocab_record, training_delta))


def write_charge_basis(state: str, vocab_record, count_record, plan, rows: int, tc):
    """What, with the step log's count and σ, gives the ε the chain has spent (:func:`chain_charged`):
    the vocabulary and count records, the plan and the accounted n."""
    from dpbert.privacy import events

    if tc.non_private or tc.noise_seed is not None:
        return
    basis = {"vocab_record": vocab_record, "count_record": count_record, "plan": plan.to_dict(), "rows": int(rows),
             "training_delta": tc.delta}
    storage.write_text(storage.join(state, schema.CHARGE_BASIS_FILE), events.to_json(basis))


def chain_charged(state: str) -> Optional[dict]:
    """The ε a training chain has spent so far — vocabulary, DP count and every step its step log
    counts, composed as the PrivacyAccountant would — from its state directory alone:
    ``{"epsilon_charged", "delta", "steps_charged"}``; None for a non-private chain or one that
    has not started a DP step's bookkeeping. What ``dpbert run`` records on a run that stopped
    before the accountant (interrupted, failed, refused)."""
    from dpbert.privacy import events
    from dpbert.privacy.plan import TrainingPlan

    try:
        basis = events.from_json(storage.read_text(storage.join(state, schema.CHARGE_BASIS_FILE)))
        steps_log = read_step_log(state)
        sigma = float(steps_log["noise_multiplier_accounted"])
        executed = (chain_state(state) or {}).get("steps_executed", 0)  # never below the checkpoint's record
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fields = {f.name for f in dataclasses.fields(TrainingPlan)}
    plan = TrainingPlan(**{k: v for k, v in basis["plan"].items() if k in fields})
    steps = max(int(steps_log.get("steps_executed", 0)), int(executed))
    spent = charged_ledger(basis["vocab_record"], basis["count_record"], sigma, plan, basis["rows"], steps,
                           basis["training_delta"])
    return {"epsilon_charged": spent["epsilon_total_pld"], "delta": spent["delta"], "steps_charged": steps}


def budget_step_limit(reservation, epsilon_budget: Optional[float], plan, rows: int):
    """``limit(σ, needed) -> L`` for ``train_mlm(charge_limit=...)``: the largest number of executed
    steps L ≤ ``needed`` of this chain that the dataset's budget gate (``dpbert.accounting.gate``)
    admits with every other entry of the dataset's ledger — the same rule as the reservation, over
    the same entries, with this chain's entry at L steps of the accounted σ. One ledger read per
    call; ε grows with the steps, so a bisection over L (``gate.largest_admitted``)."""
    from dpbert.accounting import gate
    from dpbert.ledger import composition, dataset

    def limit(sigma: float, needed: int) -> int:
        doc = dataset.read_ledger(reservation.ledger_uri, reservation.dataset_id)
        own = doc["entries"][reservation.entry_id]
        others = [e for e in dataset.entries_of(doc) if e["id"] != reservation.entry_id]
        kept = [r for r in own["planned"] if r.get("mechanism") != "dp_sgd"]
        request = gate.Request(epsilon_budget)

        def admits(steps: int) -> bool:
            records = kept + ([composition.ledger_record(training_record(sigma, plan, rows, steps))] if steps else [])
            return gate.decide(doc, others + [{**own, "planned": records, "status": "reserved"}], request).admitted

        return gate.largest_admitted(admits, needed)

    return limit


def run_step_limit(epsilon_budget: float, vocab_record, count_record, plan, rows: int, training_delta: float):
    """``limit(σ, needed)`` without a dataset identity (the stage called directly: every command
    requires ``corpus.dataset_id`` with a budget): the same gate, asked about this run alone as the
    first on a fresh dataset (its vocabulary, DP count and L steps)."""
    from dpbert.accounting import gate
    from dpbert.privacy.composition import ledger_delta

    delta = ledger_delta(vocab_record, training_delta)
    histogram = isinstance(vocab_record, dict) and vocab_record.get("mechanism") == "dp_histogram"
    threshold = float(vocab_record.get("threshold_delta", 0.0)) if histogram else 0.0

    def limit(sigma: float, needed: int) -> int:
        def admits(steps: int) -> bool:
            trains = ([count_record] if count_record is not None else []) + \
                ([training_record(sigma, plan, rows, steps)] if steps else [])
            return gate.alone_of_records(vocab_record, trains, epsilon_budget, delta, threshold).admitted

        return gate.largest_admitted(admits, needed)

    return limit


class TrainingBudgetRefused(RuntimeError):
    """The trainer refused a step the privacy budget does not cover (exit 3 in ``dpbert run``).
    ``refusal``: what ``schema.BUDGET_REFUSAL_FILE`` holds (ε already charged, steps, budget)."""

    def __init__(self, message: str, refusal: dict):
        super().__init__(message)
        self.refusal = refusal


def refuse(state: str, refused, budget: float, vocab_record, count_record, plan, rows: int,
           training_delta: float):
    """Record what the chain has charged when the budget refused a step (``refused``: the loop's
    ``BudgetExhausted``), then raise :class:`TrainingBudgetRefused`: the ε spent is written
    (private state dir, read by the local runner into ML Metadata) before the run fails."""
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
    storage.write_json(storage.join(state, schema.BUDGET_REFUSAL_FILE), refusal)
    raise TrainingBudgetRefused(
        f"privacy.epsilon_budget = {budget:.4g} covers {refused.limit} DP-SGD steps of this training chain and "
        f"{refused.steps_executed} are already charged (ε = {spent['epsilon_total_pld']:.4g} at "
        f"δ = {spent['delta']:.3g} spent so far); no further step was run", refusal)
