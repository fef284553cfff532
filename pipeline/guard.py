"""The budget guard: the planned ε is computed from the configuration before any component runs.

If it exceeds ``privacy.epsilon_budget`` the run stops (exit 3) and nothing is written: the
guard runs in the CLI process before the DAG is built, and reads the corpus only to check every
record (``preflight_corpus``: under ``privacy.unit: patient``, patients more than 2× off the
declared number are WARNED about on the operator's terminal before anything trains; never a
refusal, which would make whether a model exists a function of the exact count). n (which fixes q = B/n
and the steps) is the PUBLIC ``training.dataset_size`` (required with a budget, ``dpbert.config``)
or ``dpbert budget --examples N``: the guard never plans from a count of the private corpus (an
exact count is a data-dependent choice and would reach the terminal). Without
a budget and without a public n there is nothing to check before the run: the trainer plans from
a DP count and the accountant charges it.

``privacy.unit: patient`` (user-level DP-SGD): n is the PUBLIC number of PATIENTS
(``training.dataset_patients``, or ``--examples N`` read as patients), B = ``training.batch_size``
patients per step, and the planned ledger is per patient. A corpus with a document without a
patient id is refused here (exit 2, naming file:line) before anything runs.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Optional

from dpbert.config import Config, ConfigError
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon


def preflight_corpus(config: Config):
    """Read and check EVERY record of the corpus (``dpbert.data.validate.validate_corpus``: JSONL
    syntax, CSV quoting, a patient id on every record under ``privacy.unit: patient``, unique
    record ids, not empty), so a bad corpus fails (exit 2, ``file:line``) before the output
    directory or ML Metadata exist."""
    from dpbert.data.validate import validate_corpus

    summary = validate_corpus(config.corpus, config.privacy.unit)
    problem = patients_mismatch(config, summary.patients)
    if problem is not None:  # a warning, not a refusal: the run's existence must not depend on the count
        print(f"dpbert run: warning (operator-only, not released): {problem}", file=sys.stderr)


def patients_mismatch(config: Config, patients: int) -> Optional[str]:
    """Why the pre-pass's ``patients`` are worth a warning (``privacy.unit: patient`` and a declared
    ``training.dataset_patients``), or None: more than ``dpbert.report.PUBLIC_SIZE_FACTOR`` (2×)
    either way, the test ``dpbert budget --corpus`` and the report apply after the run — q = B/n
    is planned on the declared n, so a corpus r× the size draws batches r× the planned B. The
    message gives the ratio to 2 significant digits, never the count: operator-only (the
    terminal of who holds the corpus), like ``--corpus``'s exact count; nothing is written."""
    from dpbert.report import PUBLIC_SIZE_FACTOR, significant

    declared = config.training.dataset_patients
    if config.privacy.unit != "patient" or not declared or not patients:
        return None
    ratio = patients / declared
    if 1 / PUBLIC_SIZE_FACTOR <= ratio <= PUBLIC_SIZE_FACTOR:
        return None
    return (f"the corpus holds about {significant(ratio)}× the patients declared by training.dataset_patients = "
            f"{declared:,} (more than {PUBLIC_SIZE_FACTOR:g}× off): q = B/n would be planned on the wrong n, "
            f"Poisson batches about {significant(ratio)}× the planned B. Set training.dataset_patients to "
            f"(a public bound on) your corpus's number of patients; dpbert budget --corpus PATH checks it")


def vocabulary_threshold(config: Config) -> Optional[dict]:
    """Whether the DP vocabulary's threshold C can be passed at the DECLARED public size, before
    anything runs; None when no DP vocabulary is built (``vocab.source: public``, or the
    non-private baseline, which has no threshold).

    Derivation: the histogram counts each word once per tuple, each patient contributing at most
    k = ``privacy.max_tuples_per_patient`` tuples (k = 1 and n tuples for ``privacy.unit: tuple``),
    so no word's exact count exceeds the number of tuples, m = n·k (n: ``training.dataset_patients``
    or ``training.dataset_size``; the vocabulary reads every patient, held-out ones included). The
    released count is that count + N(0, σ²) and is kept when ≥ C: the word most likely to pass —
    one in every tuple of every patient — passes with probability Φ((m − C)/σ). When even its
    EXPECTED noisy count m is below C (probability < ½, and the same for every other word, whose
    count is smaller), the run would end with no word kept. Returns ``{"threshold", "max_count",
    "passable" (m ≥ C; None without a public size), "probability", "size", "message"}``."""
    from scipy.stats import norm

    from dpbert.privacy.histogram import histogram_report

    vc, pc = config.vocab, config.privacy
    if vc.source == "public" or vc.non_private:
        return None
    patient = pc.unit == "patient"
    k = pc.max_tuples_per_patient if patient else 1
    threshold = float(histogram_report(vc.sigma, vc.delta, pc.tuple_words, vc.threshold_mode, k,
                                       unit=pc.unit)["threshold"])
    n = public_dataset_size(config)
    size = (f"training.dataset_patients = {n} × privacy.max_tuples_per_patient = {k}" if patient
            else f"training.dataset_size = {n}")
    out = {"threshold": threshold, "max_count": None, "passable": None, "probability": None, "size": None,
           "message": f"vocabulary threshold C = {threshold:.1f}: no public size declared to check it against"}
    if n is None:
        return out
    m = n * k
    out.update(max_count=m, passable=m >= threshold, probability=float(norm.cdf((m - threshold) / vc.sigma)),
               size=size)
    if m >= threshold:
        out["message"] = (f"vocabulary threshold C = {threshold:.1f} can be passed: a word in every tuple is "
                          f"counted up to {m:,} times ({size})")
    else:
        out["message"] = (f"no word can pass the vocabulary threshold C = {threshold:.1f} (vocab.sigma = {vc.sigma:g}, "
                          f"vocab.delta = {fmt_delta(vc.delta)}, vocab.threshold_mode = {vc.threshold_mode}): a word in every "
                          f"tuple of every patient is counted at most {m:,} times ({size}), so the DP vocabulary would "
                          f"be empty. Lower vocab.sigma, use vocab.source = public, or a larger corpus")
    return out


def prechecks(config: Config) -> None:
    """The configuration against its declared public sizes, before any component runs or anything
    is written (``ConfigError``, exit 2, naming the keys): the DP vocabulary's threshold can be
    passed (:func:`vocabulary_threshold`), the canary groups fit the declared training rows
    (``dpbert.stages.canary.occurrences_problem``)."""
    from dpbert.stages.canary import occurrences_problem

    vocabulary = vocabulary_threshold(config)
    if vocabulary is not None and vocabulary["passable"] is False:
        raise ConfigError(vocabulary["message"])
    problem = occurrences_problem(config)
    if problem is not None:
        raise ConfigError(problem)


def remaining_budget(config: Optional[Config]) -> Optional[dict]:
    """What the dataset's budget gate still admits, for ``dpbert budget`` and ``dpbert ledger``:
    ``{"steps", "needed", "epsilon_train"}`` — the most DP-SGD steps of this configuration's plan
    the gate admits after every entry of the dataset's ledger (its vocabulary included unless
    cached), and that run's own ε_T. Never a subtraction: RDP composition has none. None without a
    dataset identity or without a budget (configured or pinned). Reads only."""
    if config is None or config.training.non_private:
        return None
    from dpbert.accounting import gate
    from dpbert.accounting.accountant import planned_ledger
    from dpbert.accounting.epsilon import epsilon
    from dpbert.ledger import composition

    found = _dataset_entries(config)
    if found is None:
        return None
    target, doc, entries = found
    if not doc.get("budget") and target.epsilon_budget is None:
        return None
    plan = planned_ledger(config, public_dataset_size(config)) if public_dataset_size(config) else None
    if plan is None:
        return None
    train = plan["train_events"][-1]
    vocab_entries = gate.planned_entries(plan["vocab_event"], [], target.vocab_key, "planned",
                                         with_vocab=not _vocab_cached(config, entries, target))

    def record_at(steps: int):
        return composition.with_steps(composition.ledger_record(train), steps)

    def admits(steps: int, planned_run_rule: bool = False) -> bool:
        planned = entries + vocab_entries + ([gate.planned_entries(None, [record_at(steps)], target.vocab_key)[-1]]
                                             if steps else [])
        return gate.decide(doc, planned, gate.request_for(target), planned_run_rule=planned_run_rule).admitted

    # The filter alone (cheap: RDP); a first run the filter does not cover may still be admitted whole
    # as one planned run (its PLD total, one evaluation).
    ceiling = 8 * max(int(plan["steps"]), 1)  # "at least 8× the plan" is enough to read (each look costs an RDP curve)
    steps, rule = gate.largest_admitted(admits, ceiling), "rdp_filter"
    if steps < plan["steps"] and admits(plan["steps"], planned_run_rule=True):
        steps, rule = plan["steps"], "one_planned_run_pld"
    eps = epsilon(composition.composed_event([record_at(steps)]), config.training.delta, "pld") if steps else 0.0
    return {"steps": steps, "planned_steps": plan["steps"], "epsilon_train": eps, "delta_train": config.training.delta,
            "rule": rule, "at_least": steps == ceiling}


def public_dataset_size(config: Config, dataset_size: Optional[int] = None) -> Optional[int]:
    """The public n to plan with: ``dataset_size`` if given, else ``training.dataset_size``
    (``training.dataset_patients`` for the patient unit), else None (never a count of the private
    corpus)."""
    if config.privacy.unit == "patient":
        return dataset_size or config.training.dataset_patients or None
    return dataset_size or config.training.dataset_size or None


HOW_TO_GIVE_N = ("give the PUBLIC number of tuples of your dataset (a public figure or lower bound, "
                 "held-out patients included) with --examples N or --set training.dataset_size=N")


HOW_TO_GIVE_PATIENTS = ("give the PUBLIC number of patients of your dataset (held-out patients included) "
                        "with --examples N or --set training.dataset_patients=N (privacy.unit = patient)")


def _require_public_n(config: Config, dataset_size: Optional[int]) -> int:
    n = public_dataset_size(config, dataset_size)
    if config.privacy.unit == "patient":
        if n is None:
            raise ConfigError(f"training.dataset_patients is not set: {HOW_TO_GIVE_PATIENTS}")
        if n < config.training.batch_size:
            raise ConfigError(f"training.batch_size = {config.training.batch_size} patients per step is larger "
                              f"than the public number of patients n = {n}: {HOW_TO_GIVE_PATIENTS}")
        return n
    if n is None:
        raise ConfigError(f"training.dataset_size is not set: {HOW_TO_GIVE_N}; the pipeline itself plans "
                          f"from a DP count when it is unset and no budget is set")
    batch = config.training.batch_size
    if n < batch:
        source = "--examples" if dataset_size else "training.dataset_size"
        raise ConfigError(f"training.batch_size = {batch} is larger than the public number of tuples n = {n} "
                          f"({source}): {HOW_TO_GIVE_N} (N >= {batch}; the paper-scale "
                          f"dpbert/configs/default.yaml plans for MIMIC-III's ≈ 83M), or lower "
                          f"training.batch_size")
    return n


def training_plan(config: Config, dataset_size: Optional[int] = None):
    """The ``dpbert.privacy.plan.TrainingPlan`` (n, q, steps) of ``config`` over
    ``public_dataset_size(config, dataset_size)``."""
    from dpbert.privacy.plan import plan_for_config

    return plan_for_config(config, _require_public_n(config, dataset_size))


def planned(config: Config, dataset_size: Optional[int] = None) -> dict:
    """The planned ledger (``dpbert.accounting.accountant.planned_ledger``, whose ``"plan"`` is the
    ``TrainingPlan``) for ``config`` over ``public_dataset_size(config, dataset_size)``."""
    from dpbert.accounting.accountant import planned_ledger

    return planned_ledger(config, _require_public_n(config, dataset_size))


def charged_chain(config: Config) -> Optional[dict]:
    """The DP training chain under the run's pipeline root (``pipeline.paths.output_paths``) that
    a run of ``config`` could resume, with the most DP steps it would have charged once the run
    completes: ``dpbert.stages.pretrain.chain_state`` plus ``steps_after`` = the ledger's executed steps +
    (the plan's steps − the checkpoint's step). Chains are matched by configuration
    (``pretrain.resume_key``, no artifact URIs: they are not known before the DAG runs), so a chain
    of another corpus with the same configuration counts too — conservative. None without one."""
    from dpbert.stages.pretrain import chains, resume_key
    from pipeline.paths import output_paths

    tc = config.training
    if tc.non_private:
        return None
    key = resume_key(config.model, tc, config.privacy, config.membership.holdout_patient_fraction, False)
    steps = training_plan(config).steps
    found = [c for c in chains(output_paths(config.pipeline)[0])
             if c["key"] == key and not c["non_private"] and c["steps_executed"] > 0]
    for chain in found:
        chain["steps_after"] = chain["steps_executed"] + max(steps - chain["checkpoint_step"], 0)
    return max(found, key=lambda c: c["steps_after"], default=None)


def check_budget(config: Config) -> Optional[dict]:
    """Preflight the corpus, then compute the planned ledger; None when there is no public n
    (then there is no budget either: ``Config.validate`` requires one with a budget).

    A resume counts what its chain has already charged: when the output directory holds a
    training chain of this configuration (:func:`charged_chain`), the ledger is planned for the
    steps that chain will have EXECUTED once this run completes (steps lost in a crash after the
    last checkpoint were charged and are re-run), ``"charged"`` says so, and a total over the
    budget is refused before anything runs. The trainer enforces the same bound step by step."""
    if config.training.strategy == "multi_worker" and not os.environ.get("TF_CONFIG"):
        # Before anything is written, not at the trainer step: the local DAG starts no workers.
        raise ConfigError("training.strategy = multi_worker joins a cluster given in $TF_CONFIG, and there is "
                          "none; to have the trainer start W worker processes itself, set training.workers = W "
                          "and leave training.strategy default (docs/scaling-out.md)")
    preflight_corpus(config)
    if public_dataset_size(config) is None:
        return None
    ledger = planned(config)
    chain = charged_chain(config)
    if chain is not None and chain["steps_after"] > ledger["steps"]:
        import dataclasses

        resumed = dataclasses.replace(config, training=dataclasses.replace(config.training,
                                                                            steps=chain["steps_after"]))
        ledger = planned(resumed)
    if chain is not None:
        ledger["charged"] = {"steps_executed": chain["steps_executed"], "checkpoint_step": chain["checkpoint_step"],
                             "steps_after_run": chain["steps_after"]}
    dataset = dataset_budget(config, ledger, chain)
    if dataset is not None:
        ledger["dataset"] = dataset
        ledger["within_budget"] = dataset["within_budget"]  # the gate over the dataset decides
    return ledger


def _dataset_entries(config: Config):
    """(target, ledger document, entries) of ``config``'s dataset, or None without an identity."""
    from dpbert.accounting.target import ledger_target
    from dpbert.ledger import dataset, identity

    target = ledger_target(config)
    if target is None:
        return None
    uri = identity.ledger_uri(identity.location_for(config), target.dataset_id)
    doc = dataset.read_ledger(uri, target.dataset_id)
    if doc.get("unit") not in (None, config.privacy.unit):
        raise ConfigError(f"privacy.unit = {config.privacy.unit}, but dataset {target.dataset_id} is accounted per "
                          f"{doc['unit']} ({uri}): one privacy unit per dataset")
    return target, doc, dataset.entries_of(doc)


def _vocab_cached(config: Config, entries, target) -> bool:
    """TFX will answer the vocabulary from its cache: an entry of this pipeline root with the same
    vocabulary configuration, cache on (if it does run, its own reservation still asks the gate)."""
    from pipeline.paths import output_paths, root_key

    pipeline_root = output_paths(config.pipeline)[0]
    return config.pipeline.enable_cache and any(
        e.get("stage") == "vocab" and e.get("config_key") == target.vocab_key
        and root_key(str(e.get("pipeline_root"))) == pipeline_root for e in entries)


def dataset_budget(config: Config, ledger: dict, chain: Optional[dict]) -> Optional[dict]:
    """The budget gate's verdict (``dpbert.accounting.gate``) on the dataset's ledger with this run:
    every entry of every earlier run on the dataset — other output folders, other configurations,
    interrupted runs at their reserved size — plus the planned vocabulary (unless cached) and
    training; the resumed chain's own entry (``charged_chain``) is replaced by its planned
    ``steps_after``, not added. The same call the reservation makes inside its compare-and-swap,
    so ``dpbert budget``, ``dpbert run`` and the trainer cannot disagree. None without a dataset
    identity, or without a budget configured or pinned. Reads the ledger only."""
    from dpbert.accounting import gate
    from pipeline.paths import output_paths

    found = _dataset_entries(config)
    if found is None:
        return None
    target, doc, entries = found
    if not doc.get("budget") and target.epsilon_budget is None:
        return None
    if chain is not None:  # the resumed chain's own entry: its steps are in steps_after already
        own = os.path.basename(os.path.normpath(chain["state"]))
        entries = [e for e in entries if not (e.get("chain") and os.path.basename(os.path.normpath(e["chain"])) == own)]
    pipeline_root = output_paths(config.pipeline)[0]
    cached = _vocab_cached(config, entries, target)
    planned = gate.planned_entries(ledger["vocab_event"], ledger["train_events"], target.vocab_key, pipeline_root,
                                   with_vocab=not cached)
    request = gate.request_for(target)
    before = gate.decide(doc, entries, gate.Request(), pld=True)
    verdict = gate.decide(doc, entries + planned, request, pld=True)
    return {"dataset_id": target.dataset_id, "ledger": _uri_of(config, target), "runs": len({e.get("run_id") for e in entries}),
            "entries": len(doc.get("entries", {})), "epsilon_spent": before.spent,
            "epsilon_spent_rdp": before.epsilon_rdp, "epsilon_total_rdp": verdict.epsilon_rdp,
            "epsilon_total_pld": verdict.epsilon_pld, "delta": verdict.delta, "epsilon_budget": verdict.budget,
            "vocab_cached": cached, "rule": verdict.rule, "within_budget": verdict.admitted,
            "reason": verdict.reason, "pinned": not verdict.new_pin, "odometer": verdict.odometer,
            "message": None if verdict.admitted else verdict.message(target.dataset_id)}


def _uri_of(config: Config, target) -> str:
    from dpbert.ledger import identity

    return identity.ledger_uri(identity.location_for(config), target.dataset_id)


def _fmt(x) -> str:
    return fmt_epsilon(x)


def planned_statement(ledger: dict) -> str:
    budget = ledger.get("epsilon_budget")
    unit = ledger.get("unit") == "patient"
    lines = [
        f"planned privacy ledger (n = {ledger['dataset_size']} "
        f"{'patients, ≤ %s tuples each' % ledger.get('max_contributions') if unit else 'tuples'}"
        f", {ledger['steps']} steps, {ledger['sampling']} sampling, q = {ledger['sampling_probability']:.4g}):",
        f"  ε_vocab             = {_fmt(ledger['epsilon_vocab'])}",
        f"  ε_train             = {_fmt(ledger['epsilon_train'])}",
        f"  ε_total (basic sum) = {_fmt(ledger['epsilon_total_basic'])}",
        f"  ε_total (PLD)       = {_fmt(ledger['epsilon_total_pld'])}   at δ = {fmt_delta(ledger['delta'])}",
    ]
    dataset = ledger.get("dataset")
    if not dataset:
        lines.append(f"  budget              = {'none' if budget is None else _fmt(budget)}"
                     f"  → {'within budget' if ledger['within_budget'] else 'OVER BUDGET'}")
        return "\n".join(lines)
    pin = "pinned" if dataset.get("pinned") else "pinned by this run's first reservation"
    lines += [
        f"dataset {dataset['dataset_id']} (every run on it, {dataset['ledger']}), budget ε = "
        f"{_fmt(dataset['epsilon_budget'])} at δ = {fmt_delta(dataset['delta'])} ({pin}):",
        f"  spent before this run = {_fmt(dataset['epsilon_spent'])}",
        f"  with this run         = {_fmt(dataset['epsilon_total_rdp'])} (RDP at the committed orders; PLD "
        f"{_fmt(dataset['epsilon_total_pld'])})"
        + ("  (one run planned in advance: its PLD total is checked)" if dataset["rule"] == "one_planned_run_pld" else ""),
        f"  → {'within budget' if dataset['within_budget'] else 'OVER BUDGET'} (the dataset's budget gate)",
    ]
    if dataset.get("odometer"):
        odo = dataset["odometer"]
        lines.append(f"  odometer reading: level {odo['level']}, ε = {_fmt(odo['epsilon'])} at δ = {fmt_delta(odo['delta'])}")
    return "\n".join(lines)


def over_budget_message(ledger: dict) -> str:
    charged = ledger.get("charged")
    resume = ""
    if charged:
        resume = (f" (resuming a training chain that has already executed {charged['steps_executed']} DP steps, "
                  f"last checkpoint at step {charged['checkpoint_step']}: {charged['steps_after_run']} steps charged "
                  f"once this run completes)")
    dataset = ledger.get("dataset")
    if dataset and dataset.get("message"):
        return f"{dataset['message']}{resume}; nothing was run or written."
    return (f"planned ε = {_fmt(ledger['epsilon_total_pld'])} (δ = {fmt_delta(ledger['delta'])}){resume} exceeds "
            f"privacy.epsilon_budget = {_fmt(ledger['epsilon_budget'])}; nothing was run or written. "
            f"Raise vocab.sigma or training.noise_multiplier, or lower training.steps.")
