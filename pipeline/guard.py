"""The budget guard: the planned ε is computed from the configuration before any component runs.

If it exceeds ``privacy.epsilon_budget`` the run stops (exit 3) and nothing is written: the
guard runs in the CLI process before the DAG is built, and reads the corpus only to check every
record (``preflight_corpus``; it counts nothing it prints). n (which fixes q = B/n and the steps) is the PUBLIC ``training.dataset_size`` (required
with a budget, ``dpbert.config``) or ``dpbert budget --examples N``: the guard never counts the
private corpus (an exact count is a data-dependent choice and would reach the terminal). Without
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
from typing import Optional

from dpbert.config import Config, ConfigError


def preflight_corpus(config: Config):
    """Read and check EVERY record of the corpus (``dpbert.data.validate.validate_corpus``: JSONL
    syntax, CSV quoting, a patient id on every record under ``privacy.unit: patient``, unique
    record ids, not empty), so a bad corpus fails (exit 2, ``file:line``) before the output
    directory or ML Metadata exist."""
    from dpbert.data.validate import validate_corpus

    validate_corpus(config.corpus, config.privacy.unit)


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
                          f"vocab.delta = {vc.delta:g}, vocab.threshold_mode = {vc.threshold_mode}): a word in every "
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


def remaining_budget(config: Optional[Config]) -> Optional[float]:
    """The ε the dataset has left to spend, for ``dpbert budget``: ``privacy.epsilon_budget`` minus
    what its ledger (``dpbert.ledger``) has charged, composed as the budget is enforced (the RDP
    filter; one planned run: its PLD total). None without a budget or a dataset identity. Reads only."""
    from dpbert.ledger import dataset, identity
    from dpbert.ledger import target as ledger_target

    budget = None if config is None else config.privacy.epsilon_budget
    target = None if budget is None else ledger_target.ledger_target(config)
    if target is None:
        return None
    doc = dataset.read_ledger(identity.ledger_uri(identity.location_for(config), target.dataset_id), target.dataset_id)
    entries = dataset.entries_of(doc)
    if not entries or not doc.get("delta"):
        return float(budget)
    return max(float(budget) - dataset.spent(dataset.within(entries, budget, doc["delta"], pld=True)), 0.0)


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
    """The planned ledger (``dpbert.privacy.accountant.planned_ledger``, whose ``"plan"`` is the
    ``TrainingPlan``) for ``config`` over ``public_dataset_size(config, dataset_size)``."""
    from dpbert.privacy.accountant import planned_ledger

    return planned_ledger(config, _require_public_n(config, dataset_size))


def charged_chain(config: Config) -> Optional[dict]:
    """The DP training chain under ``pipeline.output_dir`` that a run of ``config`` could resume,
    with the most DP steps it would have charged once the run completes:
    ``dpbert.stages.pretrain.chain_state`` plus ``steps_after`` = the ledger's executed steps +
    (the plan's steps − the checkpoint's step). Chains are matched by configuration
    (``pretrain.resume_key``, no artifact URIs: they are not known before the DAG runs), so a chain
    of another corpus with the same configuration counts too — conservative. None without one."""
    from dpbert.model.engine.chain import chains
    from dpbert.model.engine.charges import resume_key
    from pipeline.paths import output_paths

    tc = config.training
    if tc.non_private:
        return None
    key = resume_key(config.model, tc, config.privacy, config.membership.holdout_patient_fraction, False)
    steps = training_plan(config).steps
    found = [c for c in chains(output_paths(config.pipeline.output_dir)[0])
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
        ledger["within_budget"] = bool(ledger["within_budget"] and dataset["within_budget"])
    return ledger


def _planned_entries(config: Config, ledger: dict, entries, target, pipeline_root: str):
    """The entries this run will add: its vocabulary (unless TFX will answer it from its cache: an
    entry of this pipeline root with the same vocabulary configuration, cache on; if it does run,
    its own reservation still checks the budget) and its training records."""
    from dpbert.privacy.accountant import is_public_vocab_record

    planned = []
    vocab = ledger["vocab_event"]
    cached = config.pipeline.enable_cache and any(
        e.get("stage") == "vocab" and e.get("config_key") == target.vocab_key
        and os.path.abspath(str(e.get("pipeline_root"))) == pipeline_root for e in entries)
    if vocab is not None and not is_public_vocab_record(vocab) and not cached:
        planned.append({"id": "planned-vocab", "mechanism": vocab["mechanism"], "stage": "vocab",
                        "status": "reserved", "planned": [vocab], "plan_key": target.vocab_key,
                        "pipeline_root": pipeline_root})
    trains = ledger["train_events"]
    if trains:
        mechanism = "non_private" if any(r["mechanism"] == "non_private" for r in trains) else "dp_sgd"
        planned.append({"id": "planned-train", "mechanism": mechanism, "stage": "train", "status": "reserved",
                        "planned": trains, "plan_key": target.vocab_key, "pipeline_root": pipeline_root})
    return planned, cached


def dataset_budget(config: Config, ledger: dict, chain: Optional[dict]) -> Optional[dict]:
    """The dataset's ledger (``dpbert.ledger``) composed with this run (with a budget only):
    every entry of every earlier run on the dataset — other output folders, other configurations,
    interrupted runs at their reserved size — plus the planned vocabulary and training, by the RDP
    filter; the resumed chain's own entry (``charged_chain``) is replaced by its planned
    ``steps_after``, not added. ConfigError when the dataset's ledger is of another privacy unit.
    Reads the ledger only: nothing is written."""
    from dpbert.ledger import composition, dataset, identity, target as ledger_target
    from pipeline.paths import output_paths

    budget = config.privacy.epsilon_budget
    target = ledger_target.ledger_target(config)
    if budget is None or target is None:
        return None
    uri = identity.ledger_uri(identity.location_for(config), target.dataset_id)
    doc = dataset.read_ledger(uri, target.dataset_id)
    if doc.get("unit") not in (None, config.privacy.unit):
        raise ConfigError(f"privacy.unit = {config.privacy.unit}, but dataset {target.dataset_id} is accounted per "
                          f"{doc['unit']} ({uri}): one privacy unit per dataset")
    entries = dataset.entries_of(doc)
    if chain is not None:  # the resumed chain's own entry: its steps are in steps_after already
        own = os.path.basename(os.path.normpath(chain["state"]))
        entries = [e for e in entries if not (e.get("chain") and os.path.basename(os.path.normpath(e["chain"])) == own)]
    pipeline_root = output_paths(config.pipeline.output_dir)[0]
    planned, cached = _planned_entries(config, ledger, entries, target, pipeline_root)
    delta = doc.get("delta") or target.delta
    spent = composition.compose(dataset.entries_of(doc), delta, pld=False)
    total = dataset.within(entries + [composition_entry(e) for e in planned], budget, delta, pld=True)
    return {"dataset_id": target.dataset_id, "ledger": uri, "runs": len({e.get("run_id") for e in entries}),
            "entries": len(doc.get("entries", {})), "epsilon_spent_rdp": spent["epsilon_rdp"],
            "epsilon_total_rdp": total["epsilon_rdp"], "epsilon_total_pld": total["epsilon_pld"],
            "delta": delta, "epsilon_budget": budget, "vocab_cached": cached, "rule": total["rule"],
            "within_budget": total["within_budget"]}


def composition_entry(entry: dict) -> dict:
    """A planned entry with its records in the ledger's count-free form."""
    from dpbert.ledger.composition import ledger_record

    return {**entry, "planned": [ledger_record(r) for r in entry["planned"]]}


def _fmt(x) -> str:
    return "inf" if isinstance(x, float) and math.isinf(x) else f"{x:.4g}"


def planned_statement(ledger: dict) -> str:
    budget = ledger.get("epsilon_budget")
    lines = [
        f"planned privacy ledger (n = {ledger['dataset_size']} "
        f"{'patients, ≤ %s tuples each' % ledger.get('max_contributions') if ledger.get('unit') == 'patient' else 'tuples'}"
        f", {ledger['steps']} steps, "
        f"{ledger['sampling']} sampling, q = {ledger['sampling_probability']:.4g}):",
        f"  ε_vocab             = {_fmt(ledger['epsilon_vocab'])}",
        f"  ε_train             = {_fmt(ledger['epsilon_train'])}",
        f"  ε_total (basic sum) = {_fmt(ledger['epsilon_total_basic'])}",
        f"  ε_total (PLD)       = {_fmt(ledger['epsilon_total_pld'])}   at δ = {ledger['delta']:.3g}",
        f"  budget              = {'none' if budget is None else _fmt(budget)}"
        f"  → {'within budget' if ledger['within_budget'] else 'OVER BUDGET'}",
    ]
    dataset = ledger.get("dataset")
    if dataset:
        lines += [
            f"dataset {dataset['dataset_id']} (every run on it, {dataset['ledger']}):",
            f"  ε spent before this run (RDP) = {_fmt(dataset['epsilon_spent_rdp'])}",
            f"  ε with this run (RDP filter)  = {_fmt(dataset['epsilon_total_rdp'])}"
            f"   (PLD {_fmt(dataset['epsilon_total_pld'])}) at δ = {dataset['delta']:.3g}"
            f"  → {'within budget' if dataset['within_budget'] else 'OVER BUDGET'}"
            + ("  (one run planned in advance: its PLD total is checked)"
               if dataset["rule"] == "one_planned_run_pld" else ""),
        ]
    return "\n".join(lines)


def over_budget_message(ledger: dict) -> str:
    charged = ledger.get("charged")
    resume = ""
    if charged:
        resume = (f" (resuming a training chain that has already executed {charged['steps_executed']} DP steps, "
                  f"last checkpoint at step {charged['checkpoint_step']}: {charged['steps_after_run']} steps charged "
                  f"once this run completes)")
    dataset = ledger.get("dataset")
    if dataset and not dataset["within_budget"] and ledger["epsilon_total_pld"] <= ledger["epsilon_budget"]:
        return (f"dataset {dataset['dataset_id']}: the ε of every run on it with this one is "
                f"{_fmt(dataset['epsilon_total_rdp'])} (RDP filter; PLD {_fmt(dataset['epsilon_total_pld'])}) at "
                f"δ = {dataset['delta']:.3g}{resume}, over privacy.epsilon_budget = {_fmt(dataset['epsilon_budget'])} "
                f"(already spent: {_fmt(dataset['epsilon_spent_rdp'])}; this run alone: "
                f"{_fmt(ledger['epsilon_total_pld'])}); nothing was run or written. The budget is the dataset's, "
                f"across output folders and configurations: see dpbert ledger --dataset {dataset['dataset_id']}.")
    return (f"planned ε = {_fmt(ledger['epsilon_total_pld'])} (δ = {ledger['delta']:.3g}){resume} exceeds "
            f"privacy.epsilon_budget = {_fmt(ledger['epsilon_budget'])}; nothing was run or written. "
            f"Raise vocab.sigma or training.noise_multiplier, or lower training.steps.")
