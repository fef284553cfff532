"""Canaries: CanaryGen (before training) and CanaryExposure (after), with the one-run audit.

CanaryGen draws the canaries from the DP vocabulary with the OS CSPRNG and writes them, with a
secret insertion seed, to a PRIVATE artifact (never printed, logged or served). The trainers read
it and insert the same canaries at the same places (the seed), so the DP and the non-private
model see the same canaried data. CanaryExposure computes exposure per group and the one-run
audit's ε lower bound, and fails the run if that lower bound exceeds the accountant's ε.

Each canary is queried the way training saw it: the canaries inserted into training examples in
context — inserted, like in training, into held-out carrier rows (public synthetic notes from a
seed no training run uses, as NerEvaluator's held-out text) — and the audit canaries, trained as
examples of their own, standalone (``[CLS] canary [SEP]``).
"""
import json
import logging
import os
import secrets
from typing import Optional

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import (CanaryList, CanaryReport, DPVocabulary, PretrainedModel, PrivacyReport,
                                  WordTuples)
from components.common import get_property, section_from_json, set_properties
from dpbert.config import CanaryConfig

log = logging.getLogger("dpbert.canary")

#: Public held-out carrier text for the in-context exposure query (NerEvaluator uses 987654321).
CARRIER_SEED = 20240611
CARRIER_PATIENTS = 10
CONTEXTS_PER_CANARY = 16
CANARIES_FILE = "canaries.json"
AUDIT_FILE = "audit_canaries.json"
SEED_FILE = "insertion_seed.json"


@component
def CanaryGen(
    tuples: InputArtifact[WordTuples],
    vocabulary: InputArtifact[DPVocabulary],
    canaries: OutputArtifact[CanaryList],
    canary_config: Parameter[str],
    code_version: Parameter[str],
):
    from dpbert.evaluate.canary import candidate_ids, make_audit_canaries, make_canary_set, occurrence_groups

    cfg = section_from_json(CanaryConfig, canary_config)
    n = int(get_property(tuples, "num_tuples"))
    vocab_path = os.path.join(vocabulary.uri, "vocab.txt")
    candidates = candidate_ids(vocab_path)
    vocab_size = sum(1 for _ in open(vocab_path, encoding="utf-8"))
    occurrences = list(cfg.occurrences) or occurrence_groups(n, max_fraction=cfg.max_occurrence_fraction)
    canary_set = make_canary_set(candidates, vocab_size, occurrences=occurrences,
                                 canaries_per_group=cfg.canaries_per_group)
    os.makedirs(canaries.uri, exist_ok=True)
    canary_set.save(os.path.join(canaries.uri, CANARIES_FILE))
    audit = make_audit_canaries(candidates, vocab_size, cfg.audit_canaries) if cfg.audit_canaries else None
    if audit is not None:
        audit.save(os.path.join(canaries.uri, AUDIT_FILE))
    seed_path = os.path.join(canaries.uri, SEED_FILE)
    with open(seed_path, "w", encoding="utf-8") as f:
        json.dump({"insertion_seed": secrets.randbits(63)}, f)
    os.chmod(seed_path, 0o600)
    set_properties(canaries, {
        "private": 1, "num_canaries": len(canary_set), "groups": [str(o) for o in occurrences],
        "num_audit_canaries": 0 if audit is None else len(audit), "code_version": code_version,
    })
    log.info("canaries: %d in %d occurrence groups, %d audit canaries (secrets in the private artifact)",
             len(canary_set), len(occurrences), 0 if audit is None else len(audit))


def load_canaries(canaries_uri: str):
    """(CanarySet, audit CanarySet or None, insertion seed) from a CanaryList artifact."""
    from dpbert.evaluate.canary import CanarySet

    canary_set = CanarySet.load(os.path.join(canaries_uri, CANARIES_FILE))
    audit_path = os.path.join(canaries_uri, AUDIT_FILE)
    audit = CanarySet.load(audit_path) if os.path.exists(audit_path) else None
    with open(os.path.join(canaries_uri, SEED_FILE), encoding="utf-8") as f:
        seed = json.load(f)["insertion_seed"]
    return canary_set, audit, seed


def apply_canaries(token_ids, canaries_uri: str, max_seq_length: int):
    """Insert the canaries into the training examples (same places for every trainer) and append
    the included audit canaries as examples of their own (one privacy unit each).

    Returns (token ids, insertion counts per canary id). The counts are not secret.
    """
    import numpy as np

    from dpbert.evaluate.canary import canary_examples, insert_canaries

    canary_set, audit, seed = load_canaries(canaries_uri)
    rng = np.random.default_rng(seed)
    token_ids, counts = insert_canaries(token_ids, canary_set, rng)
    if audit is not None:
        included = [c for c in audit.canaries if c.included]
        if included:
            extra, _ = canary_examples(included, max_seq_length)
            token_ids = np.concatenate([token_ids, extra.astype(token_ids.dtype)])
    return token_ids, {str(c.canary_id): int(k) for c, k in zip(canary_set.canaries, counts)}


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


def _exposure_for(model_uri: str, canary_set, counts):
    """Exposure of the canaries inserted into training text: queried in context (carriers)."""
    from dpbert.evaluate.canary import evaluate_exposure, mlm_score_fn
    from dpbert.model.bert import load_bert

    models = load_bert(os.path.join(model_uri, "model"))
    score_fn = mlm_score_fn(models.mlm, models.spec.max_predictions)
    contexts = carrier_rows(os.path.join(model_uri, "tokenizer"), models.spec.max_seq_length)
    return evaluate_exposure(canary_set, score_fn, models.spec.max_seq_length, counts=counts,
                             max_reference=5000, contexts=contexts,
                             contexts_per_canary=CONTEXTS_PER_CANARY), score_fn, models


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
    fig.savefig(path)
    plt.close(fig)


@component
def CanaryExposure(
    canaries: InputArtifact[CanaryList],
    model: InputArtifact[PretrainedModel],
    privacy_report: InputArtifact[PrivacyReport],
    report: OutputArtifact[CanaryReport],
    audit_beta: Parameter[float],
    code_version: Parameter[str],
    baseline_model: InputArtifact[PretrainedModel] = None,
):
    """Exposure (DP vs non-DP) per occurrence group; audit ε lower bound vs the accountant's ε_T."""
    from dpbert.evaluate.audit import assert_audit_consistent, audit_best_of
    from dpbert.evaluate.canary import evaluate_exposure

    canary_set, audit, _ = load_canaries(canaries.uri)
    counts_of = {}
    for m in [model] + ([baseline_model] if baseline_model is not None else []):
        with open(os.path.join(m.uri, "canary_counts.json"), encoding="utf-8") as f:
            counts_of[m.uri] = json.load(f)

    def counts_for(m):
        return [counts_of[m.uri].get(str(c.canary_id), 0) for c in canary_set.canaries]

    dp, score_fn, _ = _exposure_for(model.uri, canary_set, counts_for(model))
    non_dp = _exposure_for(baseline_model.uri, canary_set, counts_for(baseline_model))[0] if baseline_model else None
    groups = []
    for g in dp["groups"]:
        row = {"group": g["group"], "pattern": "all", "occurrences": g["occurrences"],
               "exposure_dp": g["exposure"]["mean"], "exposure_dp_std": g["exposure"]["std"],
               "n": g["exposure"]["n"]}
        if non_dp is not None:
            other = next((h for h in non_dp["groups"] if h["group"] == g["group"]), None)
            if other:
                row.update({"exposure_non_dp": other["exposure"]["mean"],
                            "exposure_non_dp_std": other["exposure"]["std"]})
        groups.append(row)
        for pattern, stats in sorted((g.get("by_pattern") or {}).items()):
            groups.append({"group": g["group"], "pattern": pattern, "occurrences": g["occurrences"],
                           "exposure_dp": stats["mean"], "n": stats["n"]})

    out = {"log2_reference_size": dp["log2_reference_size"], "query": dp["query"], "groups": groups}
    epsilon_train = get_property(privacy_report, "epsilon_train")
    delta_train = get_property(privacy_report, "delta_train")
    if audit is not None and len(audit):
        # Standalone query: the audit canaries were trained as examples of their own.
        audit_exposure = evaluate_exposure(audit, score_fn, _models_len(model), max_reference=5000)
        out["audit_query"] = audit_exposure["query"]
        scores = [row["exposure_extrapolated"] for row in audit_exposure["canaries"]]
        included = [c.included for c in audit.canaries]
        result = audit_best_of(scores, included, beta=audit_beta, delta=float(delta_train or 0.0))
        out["audit"] = {k: result[k] for k in ("epsilon_lower_bound", "r", "v", "m", "k_plus", "k_minus",
                                                "beta_total")}
        out["audit_epsilon_lower_bound"] = result["epsilon_lower_bound"]
        out["audit_epsilon_upper_bound"] = epsilon_train
    os.makedirs(report.uri, exist_ok=True)
    with open(os.path.join(report.uri, "exposure.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, default=float)
    _plot([g for g in groups if g["pattern"] == "all"], os.path.join(report.uri, "exposure.png"))
    _plot([g for g in groups if g["pattern"] == "all"], os.path.join(report.uri, "exposure.svg"))
    set_properties(report, {
        "groups": [g for g in groups if g["pattern"] == "all" and g["group"] != "held_out"],
        "groups_by_pattern": [g for g in groups if g["pattern"] != "all"],
        "audit_epsilon_lower_bound": out.get("audit_epsilon_lower_bound"),
        "audit_epsilon_upper_bound": epsilon_train,
        "audit": out.get("audit"),
        "log2_reference_size": dp["log2_reference_size"],
        "code_version": code_version,
    })
    if "audit_epsilon_lower_bound" in out and epsilon_train is not None:
        # A lower bound above the accountant's upper bound means the accounting or the DP-SGD
        # implementation is wrong: fail the run (after recording the evidence).
        assert_audit_consistent(out["audit_epsilon_lower_bound"], float(epsilon_train))
    log.info("canary: exposure per group %s; audit ε ≥ %s (accountant ε_T = %s)",
             [(g["occurrences"], round(g["exposure_dp"], 2)) for g in groups if g["pattern"] == "all"],
             out.get("audit_epsilon_lower_bound"), epsilon_train)


def _models_len(model) -> int:
    return int(get_property(model, "max_seq_length"))
