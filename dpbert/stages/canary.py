"""Canaries: CanaryGen's stage (before training), their insertion (the trainers) and
CanaryExposure's stage (after), with the one-run audit.

:func:`generate_canaries` draws the canaries from the DP vocabulary with the OS CSPRNG and writes
them, with a secret insertion seed, to a PRIVATE directory (never printed, logged or served). The
trainers read it (``dpbert.evaluate.canary_insertion.apply_canaries``) and insert the same canaries at the same places (the
seed), so the DP and the non-private model see the same canaried data. :func:`exposure_report`
computes exposure per group and the one-run audit's ε lower bound, and reports a failure if that
lower bound exceeds the accountant's ε.

Each canary is queried the way training saw it: the canaries inserted into training examples in
context — inserted, like in training, into held-out carrier rows (public synthetic notes from a
seed no training run uses, as NerEvaluator's held-out text) — and the audit canaries, trained as
examples of their own, standalone (``[CLS] canary [SEP]``).
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import secrets
from typing import Dict, List, Optional

from dpbert import schema, storage
from dpbert.config import CanaryConfig
# Insertion lives below the stages (the trainer stage reads it); re-exported for this stage's callers.
from dpbert.evaluate.canary_insertion import (AUDIT_FILE, CANARIES_FILE, SEED_FILE,  # noqa: F401
                                              apply_canaries, load_canaries)
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.canary")

#: Public held-out carrier text for the in-context exposure query (NerEvaluator uses 987654321).
CARRIER_SEED = 20240611
CARRIER_PATIENTS = 10
CONTEXTS_PER_CANARY = 16
MAX_REFERENCE = 5000
EXPOSURE_FILE = "exposure.json"
AUDIT_FIELDS = ("epsilon_lower_bound", "r", "v", "m", "k_plus", "k_minus", "beta_total")


# --------------------------------------------------------------------------- CanaryGen
#: Occurrence groups without ``canary.occurrences`` and without a public n.
DEFAULT_OCCURRENCES = (1, 10, 100)


def canary_rows(config) -> Optional[int]:
    """The PUBLIC number of training rows the trainer inserts the canaries into (the trainer's
    ``rows_planned``: a group of c occurrences is inserted with probability c / rows per row): the
    plan's trained-on n — ``training.dataset_size`` tuples, or ``training.dataset_patients`` ×
    ``privacy.max_tuples_per_patient`` for the patient unit — after the membership holdout. None
    without a public n (the trainer then plans from a DP count). Never a count of the corpus."""
    from dpbert.privacy.plan import plan_for_config

    patient = config.privacy.unit == "patient"
    n = config.training.dataset_patients if patient else config.training.dataset_size
    if not n:
        return None
    try:
        plan = plan_for_config(config, int(n))
    except ValueError:  # a plan the guard refuses with its own message
        return None
    return plan.dataset_size * (plan.max_contributions if patient else 1)


def planned_occurrences(config: CanaryConfig, public_rows: Optional[int]) -> List[int]:
    """The occurrence groups: ``canary.occurrences``, else 1, 10, 100, … up to
    ``canary.max_occurrence_fraction`` of the ``public_rows`` (:func:`canary_rows`: scaled to the
    corpus's declared size), else ``DEFAULT_OCCURRENCES``."""
    from dpbert.evaluate.canary import occurrence_groups

    if config.occurrences:
        return list(config.occurrences)
    if public_rows:
        return occurrence_groups(int(public_rows), max_fraction=config.max_occurrence_fraction)
    return list(DEFAULT_OCCURRENCES)


def occurrences_problem(config) -> Optional[str]:
    """Why the configured canaries cannot be inserted as planned into a corpus of the declared
    public size (a group expecting more occurrences than ``canary.max_occurrence_fraction`` of the
    training rows), naming the configuration keys; None when they can, or canaries are off."""
    if not config.canary.enabled:
        return None
    rows = canary_rows(config)
    if rows is None:
        return None
    cap = max(1, int(config.canary.max_occurrence_fraction * rows))
    groups = planned_occurrences(config.canary, rows)
    if max(groups) <= cap:
        return None
    unit = (f"training.dataset_patients = {config.training.dataset_patients} × privacy.max_tuples_per_patient "
            f"= {config.privacy.max_tuples_per_patient}" if config.privacy.unit == "patient"
            else f"training.dataset_size = {config.training.dataset_size}")
    return (f"canary.occurrences = {groups} expects up to {max(groups):,} occurrences of a canary, but the "
            f"declared corpus has about {rows:,} training rows ({unit}, after the membership holdout) and "
            f"canary.max_occurrence_fraction = {config.canary.max_occurrence_fraction:g} allows at most {cap:,}: "
            f"lower canary.occurrences (or leave it empty: groups scaled to the declared size), or set "
            f"canary.enabled = false")


def generate_canaries(vocabulary_dir: str, canaries_dir: str, config: CanaryConfig,
                      public_rows: Optional[int] = None) -> StageResult:
    """Write the canaries, the audit canaries and a secret insertion key into ``canaries_dir``.
    ``public_rows``: the PUBLIC number of training rows (:func:`canary_rows`), which bounds the
    occurrence groups when ``canary.occurrences`` is empty (:func:`planned_occurrences`); without
    one, ``DEFAULT_OCCURRENCES``. Never the exact count."""
    from dpbert.evaluate.canary import candidate_ids, make_audit_canaries, make_canary_set
    from dpbert.vocab.wordpiece import VOCAB_FILE

    vocab_path = storage.join(vocabulary_dir, VOCAB_FILE)
    candidates = candidate_ids(vocab_path)
    # Lines as a text-mode file iterates them (universal newlines).
    vocab_size = len(io.StringIO(storage.read_text(vocab_path), newline=None).readlines())
    occurrences = planned_occurrences(config, public_rows)
    canary_set = make_canary_set(candidates, vocab_size, occurrences=occurrences,
                                 canaries_per_group=config.canaries_per_group)
    storage.storage_for(canaries_dir).makedirs(canaries_dir)
    canary_set.save(storage.join(canaries_dir, CANARIES_FILE))
    audit = make_audit_canaries(candidates, vocab_size, config.audit_canaries) if config.audit_canaries else None
    if audit is not None:
        audit.save(storage.join(canaries_dir, AUDIT_FILE))
    storage.write_text(storage.join(canaries_dir, SEED_FILE), json.dumps({"insertion_seed": secrets.randbits(63)}),
                       private=True)
    num_audit = 0 if audit is None else len(audit)
    log.info("canaries: %d in %d occurrence groups, %d audit canaries (secrets in the private artifact)",
             len(canary_set), len(occurrences), num_audit)
    return StageResult(properties={
        schema.PRIVATE: 1, "num_canaries": len(canary_set), "groups": [str(o) for o in occurrences],
        "num_audit_canaries": num_audit})


# --------------------------------------------------------------------------- CanaryExposure
def carrier_rows(tokenizer_dir: str, max_seq_length: int, tuple_words: Optional[int] = None):
    """Held-out carrier rows ``[N, max_seq_length]`` for the in-context exposure query: public
    synthetic notes (``CARRIER_SEED``), cut into tuples and tokenized like the training data."""
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import DEFAULT_TUPLE_WORDS, corpus_tuples
    from dpbert.vocab.wordpiece import load_tokenizer, tokenize_tuples

    tokenizer = load_tokenizer(tokenizer_dir)
    tuples = corpus_tuples(generate_notes(patients=CARRIER_PATIENTS, seed=CARRIER_SEED),
                           tuple_words or DEFAULT_TUPLE_WORDS)
    return tokenize_tuples(tokenizer, (t.words for t in tuples), int(max_seq_length))


def _exposure_for(model_dir: str, canary_set, counts):
    """Exposure of the canaries inserted into training text: queried in context (carriers).
    Returns (exposure report, the model's score function, the models)."""
    from dpbert.evaluate.canary import InContext, evaluate_exposure, mlm_score_fn
    from dpbert.network.bert import load_bert

    models = load_bert(storage.join(model_dir, schema.MODEL_DIR))
    score_fn = mlm_score_fn(models.mlm, models.spec.max_predictions)
    contexts = carrier_rows(storage.join(model_dir, schema.TOKENIZER_DIR), models.spec.max_seq_length)
    return evaluate_exposure(canary_set, score_fn, models.spec.max_seq_length, counts=counts,
                             max_reference=MAX_REFERENCE,
                             in_context=InContext(contexts, CONTEXTS_PER_CANARY)), score_fn, models


def _plot(groups, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, marker in (("exposure_dp", "DP-SGD", "o"), ("exposure_non_dp", "non-private", "s")):
        pts = [(g["occurrences"], g[key]) for g in groups if g.get(key) is not None and g.get("occurrences")]
        if pts:
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("canary occurrences in the training data")
    ax.set_ylabel("exposure (bits, mean over canaries)")
    ax.set_title("Secret-sharer exposure")
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.rsplit(".", 1)[-1])
    plt.close(fig)
    storage.storage_for(path).write_bytes(path, buffer.getvalue())


def _counts(model_dir: str, canary_set) -> List[int]:
    """How many training rows of that model carried each canary (``canary_counts.json``)."""
    counts = storage.read_json(storage.join(model_dir, schema.CANARY_COUNTS_FILE))
    return [counts.get(str(c.canary_id), 0) for c in canary_set.canaries]


def _group_rows(dp: Dict, non_dp: Optional[Dict]) -> List[Dict]:
    """One row per group (pattern "all", DP vs non-DP) followed by its per-pattern rows (DP)."""
    rows = []
    for g in dp["groups"]:
        row = {"group": g["group"], "pattern": "all", "occurrences": g["occurrences"],
               "exposure_dp": g["exposure"]["mean"], "exposure_dp_std": g["exposure"]["std"],
               "n": g["exposure"]["n"]}
        if non_dp is not None:
            other = next((h for h in non_dp["groups"] if h["group"] == g["group"]), None)
            if other:
                row.update({"exposure_non_dp": other["exposure"]["mean"],
                            "exposure_non_dp_std": other["exposure"]["std"]})
        rows.append(row)
        for pattern, stats in sorted((g.get("by_pattern") or {}).items()):
            rows.append({"group": g["group"], "pattern": pattern, "occurrences": g["occurrences"],
                         "exposure_dp": stats["mean"], "n": stats["n"]})
    return rows


@dataclasses.dataclass
class ExposureResult(StageResult):
    report: Optional[Dict] = None   # what exposure.json holds


def exposure_report(canaries_dir: str, model_dir: str, report_dir: str, *, audit_beta: float,
                    max_seq_length: int, epsilon_train: Optional[float], delta_train: Optional[float],
                    baseline_model_dir: Optional[str] = None) -> ExposureResult:
    """Exposure (DP vs non-DP) per occurrence group; the audit ε lower bound vs the accountant's
    ``epsilon_train`` (at ``delta_train``). Writes ``exposure.json`` and the plot into
    ``report_dir``. ``max_seq_length``: the model's (the standalone audit query's length).
    ``failure``: an ``AuditInconsistencyError`` when the lower bound exceeds ``epsilon_train``."""
    from dpbert.evaluate.canary import evaluate_exposure
    from dpbert.privacy.one_run_audit import AuditInconsistencyError, assert_audit_consistent, audit_best_of
    from dpbert.privacy.whitebox_audit import max_reachable_lower_bound

    canary_set, audit, _ = load_canaries(canaries_dir)
    dp, score_fn, _ = _exposure_for(model_dir, canary_set, _counts(model_dir, canary_set))
    non_dp, baseline_score_fn, _ = _exposure_for(baseline_model_dir, canary_set,
                                                 _counts(baseline_model_dir, canary_set)) \
        if baseline_model_dir else (None, None, None)
    groups = _group_rows(dp, non_dp)
    out = {"log2_reference_size": dp["log2_reference_size"], "query": dp["query"], "groups": groups}
    if audit is not None and len(audit):
        # Standalone query: the audit canaries were trained as examples of their own.
        audit_exposure = evaluate_exposure(audit, score_fn, int(max_seq_length), max_reference=MAX_REFERENCE)
        out["audit_query"] = audit_exposure["query"]
        scores = [row["exposure_extrapolated"] for row in audit_exposure["canaries"]]
        included = [c.included for c in audit.canaries]
        result = audit_best_of(scores, included, beta=audit_beta, delta=float(delta_train or 0.0))
        out["audit"] = {k: result[k] for k in AUDIT_FIELDS}
        out["audit_epsilon_lower_bound"] = result["epsilon_lower_bound"]
        out["audit_epsilon_upper_bound"] = epsilon_train
        # Power: the bound with every guess right for this m, β, δ (2.87 at m = 100, δ = 1e-5):
        # a claimed ε above it cannot be refuted by this audit, whatever the model does.
        out["audit_max_reachable_lower_bound"] = max_reachable_lower_bound(
            len(included), audit_beta, float(delta_train or 0.0))
        if baseline_score_fn is not None:
            # Positive control in the same run: the non-private baseline, trained on the same
            # audit canaries, scored the same way (operator-only: a model without noise).
            base = evaluate_exposure(audit, baseline_score_fn, int(max_seq_length), max_reference=MAX_REFERENCE)
            base_result = audit_best_of([row["exposure_extrapolated"] for row in base["canaries"]], included,
                                        beta=audit_beta, delta=float(delta_train or 0.0))
            out["baseline_audit_epsilon_lower_bound"] = base_result["epsilon_lower_bound"]
    storage.storage_for(report_dir).makedirs(report_dir)
    storage.write_text(storage.join(report_dir, EXPOSURE_FILE), json.dumps(out, indent=2, default=float))
    overall = [g for g in groups if g["pattern"] == "all"]
    _plot(overall, storage.join(report_dir, "exposure.png"))
    _plot(overall, storage.join(report_dir, "exposure.svg"))
    failure = None
    if "audit_epsilon_lower_bound" in out and epsilon_train is not None:
        # A lower bound above the accountant's upper bound means the accounting or the DP-SGD
        # implementation is wrong: the run fails (after the evidence is recorded).
        try:
            assert_audit_consistent(out["audit_epsilon_lower_bound"], float(epsilon_train))
        except AuditInconsistencyError as err:  # raised by the adapter after recording
            failure = err
    log.info("canary: exposure per group %s; audit ε ≥ %s (accountant ε_T = %s)",
             [(g["occurrences"], round(g["exposure_dp"], 2)) for g in overall],
             out.get("audit_epsilon_lower_bound"), epsilon_train)
    return ExposureResult(properties={
        "groups": [g for g in overall if g["group"] != "held_out"],
        "groups_by_pattern": [g for g in groups if g["pattern"] != "all"],
        "audit_epsilon_lower_bound": out.get("audit_epsilon_lower_bound"),
        "audit_epsilon_upper_bound": epsilon_train,
        "audit": out.get("audit"),
        "audit_max_reachable_lower_bound": out.get("audit_max_reachable_lower_bound"),
        "baseline_audit_epsilon_lower_bound": out.get("baseline_audit_epsilon_lower_bound"),
        "log2_reference_size": dp["log2_reference_size"],
        # The non-private baseline's exposures are computed on a model trained without noise:
        # operator-only. (dpbert.release copies only the DP model's audit fields from here.)
        schema.PRIVATE: int(baseline_model_dir is not None),
    }, failure=failure, report=out)
