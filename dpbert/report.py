"""The run report: one JSON object built from ML Metadata custom properties.

`dpbert report --json` prints it; the dashboard's JSON API serves the same object. Only
properties are read (never private artifact files), so the report can hold no raw text or canary
secret. Exact counts appear in ONE section, ``corpus`` (documents, tuples, words, skipped rows,
replaced bytes: the private WordTuples artifact's count properties), marked
``"operator_only": true``; ``dpbert.release.released_view`` (an allow-list) never carries it, nor
the ``warnings`` computed from it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from dpbert import schema
from dpbert.metadata import (BUDGET_REFUSED_PROPERTY, DELTA_CHARGED, EPSILON_BUDGET, EPSILON_CHARGED,
                             INTERRUPTED_CHECKPOINT_STEP, INTERRUPTED_COMPONENT, INTERRUPTED_PROPERTY,
                             INTERRUPTED_STEP, STEPS_CHARGED, RunInfo)

#: The ledger properties the report's ``privacy`` section shows (same keys).
LEDGER_KEYS = (schema.EPSILON_VOCAB, schema.EPSILON_TRAIN, schema.EPSILON_TOTAL_BASIC,
               schema.EPSILON_TOTAL_PLD, schema.EPSILON_TOTAL_RDP, schema.DELTA, schema.DELTA_VOCAB,
               schema.DELTA_TRAIN, schema.UNIT, "adjacency", schema.SAMPLING, schema.STEPS,
               schema.EPSILON_BUDGET, schema.WITHIN_BUDGET)


def _props(run: RunInfo, short_type: str, key: Optional[str] = None, where=None) -> Dict[str, Any]:
    for artifact in run.artifacts(schema.type_name(short_type), key):
        if where is None or where(artifact.properties):
            return artifact.properties
    return {}


#: The report's ``corpus`` section: (key, WordTuples property). Exact counts of the private data:
#: OPERATOR-ONLY (never released, never logged). ``replaced_fraction`` and ``words_per_document``
#: are derived. The corpus's location (``corpus`` property) is not shown.
CORPUS_KEYS = (("documents", "num_documents"), ("patients", "num_patients"), ("tuples", schema.NUM_TUPLES),
               ("words", "num_words"), ("tuple_words", schema.TUPLE_WORDS),
               ("skipped_error_rows", "skipped_error_rows"), ("skipped_empty_documents", "skipped_empty_documents"),
               ("replaced_bytes", "replaced_bytes"), ("corpus_bytes", "corpus_bytes"))


def corpus_section(run: RunInfo) -> Optional[Dict[str, Any]]:
    """The operator-only ``corpus`` section (None when the run has no WordTuples artifact)."""
    artifacts = run.artifacts(schema.type_name(schema.WORD_TUPLES))
    if not artifacts:
        return None
    props = artifacts[0].properties
    out: Dict[str, Any] = {"operator_only": True}
    for key, prop in CORPUS_KEYS:
        value = props.get(prop)
        out[key] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    replaced, size = out["replaced_bytes"], out["corpus_bytes"]
    out["replaced_fraction"] = round(replaced / size, 6) if replaced is not None and size else None
    words, documents = out["words"], out["documents"]
    out["words_per_document"] = round(words / documents, 2) if words is not None and documents else None
    return out


#: The corpus's training units may differ from the configured public n by this factor before the
#: report warns (``public_size_warning``).
PUBLIC_SIZE_FACTOR = 2.0


def public_size_warning(tuples: Dict[str, Any], model: Dict[str, Any]) -> Optional[Dict[str, str]]:
    """OPERATOR-ONLY (the corpus's exact count): a warning when the units the trainer sampled from
    differ from the plan's n by more than ``PUBLIC_SIZE_FACTOR``. The plan's n is the configured
    public size (``training.dataset_size``, ``dataset_patients`` for the patient unit) after the
    holdout, or the DP count when the run drew one instead — then the count is the corpus's size up
    to its noise and nothing is compared. q = B/n comes from that n, so a corpus r× larger gives
    Poisson batches r× the planned B. Never logged: only the report (and the dashboard's
    operator-only warnings) carry it; ``released_view`` drops every warning."""
    def num(props, key):
        value = props.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    planned = num(model, "planned_dataset_size")
    if model.get("dataset_size_source") != "public" or not planned:
        return None
    patient = model.get("privacy_unit") == "patient"
    units = num(tuples, "num_patients" if patient else schema.NUM_TUPLES)
    if not units:
        return None
    holdout = num(model, schema.HOLDOUT_FRACTION) or 0.0
    ratio = units * (1.0 - holdout) / planned
    if 1.0 / PUBLIC_SIZE_FACTOR <= ratio <= PUBLIC_SIZE_FACTOR:
        return None
    field = "training.dataset_patients" if patient else "training.dataset_size"
    unit = "patients" if patient else "tuples"
    batch = num(model, "logical_batch")
    planned_b = f" = {batch:g} {unit}" if batch is not None else ""
    effect = ("more memory and time per step; the DP diagnostics, normalised by the planned B, read "
              f"about {ratio:.1f}× too high (a clipped fraction above 1)" if ratio > 1 else
              "the noise, scaled for the planned B, swamps the smaller clipped sums")
    return {"section": "corpus", "code": "public_size_mismatch", "message": (
        f"the corpus holds about {ratio:.1f}× the {unit} of the configured public size ({field}, the n of "
        f"q = B/n): Poisson batches average about {ratio:.1f}× the planned B{planned_b} per step — {effect}. "
        f"The ε is that of the configured n; set {field} to (a public bound on) your corpus's size, or null "
        f"to plan from a DP count")}


def report_warnings(run: RunInfo) -> List[Dict[str, str]]:
    """``[{"section", "code", "message"}]``: heavy byte replacement, short documents, a tiny corpus,
    a corpus far from the configured public size (operator-only: computed from the corpus's exact
    counts), a tiny DP vocabulary."""
    from dpbert.stages.ingest import corpus_warnings

    tuples = run.artifacts(schema.type_name(schema.WORD_TUPLES))
    tuple_props = tuples[0].properties if tuples else {}
    vocab = _props(run, schema.DP_VOCABULARY)
    out = []
    for w in corpus_warnings(tuple_props, vocab.get(schema.WORDS_KEPT)):
        out.append({"section": "vocab" if w["code"] == "tiny_vocabulary" else "corpus", **w})
    mismatch = public_size_warning(tuple_props, _props(run, schema.PRETRAINED_MODEL,
                                                       where=lambda p: not p.get(schema.NON_PRIVATE)))
    if mismatch is not None:
        out.append(mismatch)
    return out


def loss_curve_steps(model: Dict[str, Any]) -> Optional[List[int]]:
    """The true training step of each point of the model's ``loss_curve``: its
    ``loss_curve_steps`` property, else (older runs) derived as ``dpbert.stages.pretrain.loss_curve``
    strides this run's steps (``resumed_from_step`` + 1 … + ``steps_this_run``); None when unknown."""
    curve = model.get(schema.LOSS_CURVE)
    if not isinstance(curve, list) or not curve:
        return None
    from dpbert.stages.pretrain import LOSS_CURVE_STEPS, curve_steps

    steps = model.get(LOSS_CURVE_STEPS)
    if isinstance(steps, list) and len(steps) == len(curve):
        return steps
    first = model.get("resumed_from_step") or 0
    n = model.get("steps_this_run")
    if not isinstance(n, int) or not isinstance(first, int):
        return None
    derived = curve_steps(n, first)
    return derived if len(derived) == len(curve) else None


#: The white-box audit's fields in the report (``dpbert.stages.audit.REPORT_FIELDS`` and the
#: ledger's ε_T it is shown next to).
AUDIT_KEYS = ("epsilon_lower_bound", "epsilon_upper_bound", "epsilon_train_ledger", "max_reachable_lower_bound",
              "consistent", "canaries", "confidence", "delta", "steps", "q", "positive_control_lower_bound",
              "positive_control_exceeds_upper_bound", "seconds")


#: The ``utility`` section (the NerReport's ``utility`` property, ``dpbert.evaluate.utility``):
#: its rows (in this order, those that ran), their columns and the gains with their uncertainty
#: and, when a gain has no value, its reason (``dpbert.schema.UTILITY_*``: one definition).
UTILITY_ROWS = schema.UTILITY_ROWS
UTILITY_COLUMNS = schema.UTILITY_COLUMNS
UTILITY_GAINS = tuple(g + suffix for g in schema.UTILITY_GAINS for suffix in ("", "_std"))
#: What the NER seeds are, by ``ner.mode`` (the headings name it).
NER_MODE_WORDS = {"probe": "probe seeds (a linear head on the frozen encoder)", "finetune": "fine-tuning seeds"}
#: The primary NER column's heading, by the table's ``ner_task``.
NER_TASK_LABELS = {"bc5cdr": "BC5CDR", "synthetic": "in-domain", "user data": "user data"}


def ner_seeds_words(mode) -> str:
    """``probe seeds (…)`` / ``fine-tuning seeds`` / ``seeds`` (mode unknown: an older report)."""
    return NER_MODE_WORDS.get(mode, "seeds")


def utility_section(ner: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """``{"rows": {name: {column: number|None}}, "reference", "ner_seeds", "ner_mode", "ner_task",
    gains…, "<gain>_reason"…, "uncertainty"}`` from the NerReport's properties; None when the run
    has no utility table."""
    def number(v):
        if isinstance(v, str):
            v = schema.decode(v)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    table = ner.get("utility")
    if isinstance(table, str):
        table = schema.decode(table)
    if not isinstance(table, dict) or not isinstance(table.get("rows"), dict):
        return None
    rows = table["rows"]
    out: Dict[str, Any] = {"rows": {name: {c: number(rows[name].get(c)) for c in UTILITY_COLUMNS}
                                    for name in UTILITY_ROWS if isinstance(rows.get(name), dict)}}
    out["reference"] = table.get("reference") if table.get("reference") in UTILITY_ROWS else None
    out["ner_seeds"] = number(table.get("ner_seeds"))
    out["ner_mode"] = table.get("ner_mode") if table.get("ner_mode") in NER_MODE_WORDS else None
    out["ner_task"] = table.get("ner_task") if isinstance(table.get("ner_task"), str) else None
    out.update({k: number(table.get(k)) for k in UTILITY_GAINS})
    out.update({g + "_reason": table.get(g + "_reason") for g in schema.UTILITY_GAINS
                if isinstance(table.get(g + "_reason"), str)})
    out["uncertainty"] = table.get("uncertainty") if isinstance(table.get("uncertainty"), str) else None
    return out


def build_report(run: RunInfo) -> Dict[str, Any]:
    ledger = _props(run, schema.PRIVACY_REPORT)
    vocab = _props(run, schema.DP_VOCABULARY)
    dp_model = _props(run, schema.PRETRAINED_MODEL, where=lambda p: not p.get(schema.NON_PRIVATE))
    non_dp_model = _props(run, schema.PRETRAINED_MODEL, where=lambda p: bool(p.get(schema.NON_PRIVATE)))
    ner = _props(run, schema.NER_REPORT)
    canary = _props(run, schema.CANARY_REPORT)
    mia = _props(run, schema.MEMBERSHIP_REPORT)
    audit = _props(run, schema.AUDIT_REPORT)
    report: Dict[str, Any] = {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": run.status,
        "duration_s": round(run.duration_s, 1),
        "components": [{"id": c.node_id, "state": c.state, "duration_s": round(c.duration_s, 1)}
                       for c in run.components],
        "privacy": {k: ledger.get(k) for k in LEDGER_KEYS},
        "vocab": {"size": vocab.get(schema.VOCAB_SIZE), "words_kept": vocab.get(schema.WORDS_KEPT),
                  "sigma": vocab.get(schema.SIGMA), "threshold": vocab.get(schema.THRESHOLD),
                  "epsilon": vocab.get(schema.EPSILON), "non_private": vocab.get(schema.NON_PRIVATE)},
        "pretraining": {"steps": dp_model.get(schema.STEPS_TAKEN_TOTAL),
                        "final_mlm_loss": dp_model.get(schema.FINAL_MLM_LOSS),
                        "initial_mlm_loss": dp_model.get(schema.INITIAL_MLM_LOSS),
                        "loss_curve": dp_model.get(schema.LOSS_CURVE),
                        "loss_curve_steps": loss_curve_steps(dp_model),
                        "final_mlm_accuracy": dp_model.get("final_mlm_accuracy"),
                        "clipped_fraction": dp_model.get("clipped_fraction"),
                        "diagnostics": dp_model.get("diagnostics"),
                        # DP estimates (ratios of noisy sums, dpbert.privacy.diagnostics): the noise
                        # std of one step's value and the window of the initial / final means.
                        "diagnostics_step_noise_std": dp_model.get("diagnostics_step_noise_std"),
                        "diagnostics_window": dp_model.get("diagnostics_window"),
                        "non_dp_final_mlm_loss": non_dp_model.get(schema.FINAL_MLM_LOSS)},
        "ner": {"f1": ner.get(schema.F1), "per_type": ner.get(schema.PER_TYPE), "table": ner.get(schema.TABLE),
                "mode": ner.get("mode"), "task": ner.get("task"), "seeds": ner.get("seeds")},
        "canary": {"groups": canary.get(schema.GROUPS, []),
                   "audit_epsilon_lower_bound": canary.get(schema.AUDIT_EPSILON_LOWER_BOUND),
                   "audit_max_reachable_lower_bound": canary.get("audit_max_reachable_lower_bound"),
                   # the non-private baseline audited with the same canaries (operator-only)
                   "baseline_audit_epsilon_lower_bound": canary.get("baseline_audit_epsilon_lower_bound")},
        # OPERATOR-ONLY: exact counts of the private corpus (never in released_view or a bundle).
        "corpus": corpus_section(run),
        "warnings": report_warnings(run),
    }
    utility = utility_section(ner)
    if utility is not None:
        # Issue 16: random / public / dp / non_private rows and the gain kept (released_view keeps
        # the public and DP rows only: the non-private row and the gains use the private baseline).
        report["utility"] = utility
    if audit:
        # The white-box one-run audit (dpbert.stages.audit): released next to the ledger's ε.
        report["audit"] = {k: audit.get(k) for k in AUDIT_KEYS}
    if run.properties.get(EPSILON_CHARGED) is not None:
        # The run stopped before its accountant (interrupted, failed, or refused by the trainer over
        # the budget): the ε its training chain has already spent (dpbert.stages.pretrain.chain_charged).
        report["charged"] = {"epsilon_charged": run.properties.get(EPSILON_CHARGED),
                             "delta": run.properties.get(DELTA_CHARGED),
                             "steps_charged": run.properties.get(STEPS_CHARGED),
                             "budget_refused": bool(run.properties.get(BUDGET_REFUSED_PROPERTY)),
                             "epsilon_budget": run.properties.get(EPSILON_BUDGET)}
    if run.properties.get(INTERRUPTED_PROPERTY):
        report["interrupted"] = {"component": run.properties.get(INTERRUPTED_COMPONENT),
                                 "step": run.properties.get(INTERRUPTED_STEP),
                                 "checkpoint_step": run.properties.get(INTERRUPTED_CHECKPOINT_STEP)}
    if mia:
        # The contract: {"dp"|"non_dp": {attack: {"advantage", "auc"}}}; rows (with ROC curves and
        # the advantage bound) for tables and the dashboard.
        attacks_by_model = mia.get(schema.ATTACKS)
        report["membership_inference"] = {
            model: {name: {"advantage": m.get("advantage"), "auc": m.get("auc")}
                    for name, m in attacks.items() if isinstance(m, dict)}
            for model, attacks in attacks_by_model.items() if isinstance(attacks, dict)
        } if isinstance(attacks_by_model, dict) else attacks_by_model
        report["membership_inference_rows"] = membership_rows(mia.get(schema.ATTACKS),
                                                              mia.get(schema.ROC_CURVES), ledger)
    return report


def resume_hint(checkpoint_step) -> str:
    """What a re-run of an interrupted run does: resume from the trainer's checkpoint when there is
    one, else say there is none (``pipeline.local_runner.RunInterrupted.message`` says the same)."""
    if isinstance(checkpoint_step, int) and not isinstance(checkpoint_step, bool) and checkpoint_step > 0:
        return f"re-run the same command to resume from the checkpoint at step {checkpoint_step}"
    return "no training checkpoint to resume from"


def charged_sentence(charged: Dict[str, Any]) -> str:
    """One line for a run that stopped before its accountant: the ε already spent, and whether the
    trainer refused a step over ``privacy.epsilon_budget``."""
    def num(x, spec):
        return format(x, spec) if isinstance(x, (int, float)) else "?"

    spent = (f"ε = {num(charged.get('epsilon_charged'), '.4g')} (δ = {num(charged.get('delta'), '.3g')}) "
             f"already spent by {charged.get('steps_charged')} DP-SGD steps")
    if charged.get("budget_refused"):
        return (f"REFUSED over privacy.epsilon_budget = {num(charged.get('epsilon_budget'), '.4g')}: {spent}; "
                f"no further step was run and no model was published")
    return f"stopped before the accountant: {spent} (vocabulary and DP count included)"


MODEL_LABELS = {"dp": "DP", "non_dp": "non-DP"}


def membership_rows(attacks, roc_curves=None, ledger: Optional[Dict[str, Any]] = None):
    """``MembershipReport.attacks`` (``{"dp"|"non_dp": {attack: {"advantage", "auc"}}}``) as one
    row per (model, attack): ``{"name": "S-BBA (DP)", "advantage", "auc", "fpr", "tpr"}``, the
    ROC from ``roc_curves`` (same shape, ``{"fpr", "tpr"}``). On the DP model's sample-level
    attacks, ``advantage_bound``: the most any attack can reach against the run's (ε, δ) at the
    tuple level, (e^ε − 1 + 2δ)/(e^ε + 1) (group-level attacks: see
    ``dpbert.evaluate.membership.group_privacy``). Any other shape is returned unchanged."""
    if not isinstance(attacks, dict) or not all(isinstance(v, dict) for v in attacks.values()) \
            or not set(attacks) <= set(MODEL_LABELS):
        return attacks
    from dpbert.evaluate.membership import ATTACKS, advantage_bound

    ledger = ledger or {}
    bound = None
    eps, delta = ledger.get(schema.EPSILON_TOTAL_PLD), ledger.get(schema.DELTA)
    if isinstance(eps, (int, float)) and isinstance(delta, (int, float)) and ledger.get(schema.UNIT) == "tuple":
        bound = advantage_bound(float(eps), float(delta))
    rows = []
    for label in [m for m in MODEL_LABELS if m in attacks]:
        by_attack = attacks[label]
        order = [a for a in ATTACKS if a in by_attack] + sorted(a for a in by_attack if a not in ATTACKS)
        for name in order:
            metrics = by_attack[name]
            if not isinstance(metrics, dict):
                continue
            curve = ((roc_curves or {}).get(label) or {}).get(name) or {}
            row = {"name": f"{name} ({MODEL_LABELS[label]})", "advantage": metrics.get("advantage"),
                   "auc": metrics.get("auc"), "fpr": curve.get("fpr", []), "tpr": curve.get("tpr", [])}
            if label == "dp" and name.startswith("S-") and bound is not None:
                row["advantage_bound"] = bound
            rows.append(row)
    return rows


def format_report(report: Dict[str, Any]) -> str:
    """A readable table of the report, or of its released view (``dpbert.release.released_view``:
    sections it dropped are not printed)."""
    def fmt(v):
        if isinstance(v, float):
            return "inf" if v == float("inf") else f"{v:.4g}"
        return "-" if v is None else str(v)

    released = report.get("view") == "released"
    head = f"run {report['run_id']}  ({report['pipeline']}, {report['status']}"
    head += ", released view)" if released else f", {report['duration_s']} s)"
    lines = [head]
    if released:
        lines.append("  operator-only sections omitted: " + ", ".join(report.get("operator_only_omitted") or []))
        if not report.get("releasable"):
            lines.append("  NOT RELEASABLE: the run is not differentially private or is over its budget")
    charged = report.get("charged")
    if isinstance(charged, dict):
        lines.append("  " + charged_sentence(charged))
    interrupted = report.get("interrupted")
    if isinstance(interrupted, dict):
        where = interrupted.get("component") or "between components"
        step = interrupted.get("step")
        lines.append(f"  interrupted (SIGINT/SIGTERM) in {where}" + (f" at step {step}" if step is not None else "")
                     + "; " + resume_hint(interrupted.get("checkpoint_step")))
    if "components" in report:
        lines += ["", "components:"]
        for c in report["components"]:
            lines.append(f"  {c['id']:<28} {c['state']:<9} {c['duration_s']:>8.1f} s")
    for section in ("privacy", "vocab", "pretraining"):
        if not isinstance(report.get(section), dict):
            continue
        shown = [(k, v) for k, v in report[section].items()
                 if v is not None and k not in ("loss_curve", "loss_curve_steps")]
        if not shown:
            continue  # a run that stopped before the stage: no empty heading (the ε charged is above)
        if section == "pretraining":
            lines += format_pretraining(report[section], fmt)
            continue
        lines += ["", f"{section}:"]
        lines += [f"  {k:<24} {fmt(v)}" for k, v in shown]
    corpus = report.get("corpus")
    if isinstance(corpus, dict):
        lines += ["", "corpus (OPERATOR-ONLY: exact counts of the private data, never release):"]
        for k, v in corpus.items():
            if k != "operator_only" and v is not None:
                lines.append(f"  {k:<24} {fmt(v)}")
    warnings = report.get("warnings")
    if isinstance(warnings, list) and warnings:
        lines += ["", "warnings:"]
        for w in warnings:
            if isinstance(w, dict):
                lines.append(f"  [{w.get('section', '')}] {w.get('message', '')}")
    ner = report.get("ner") or {}
    if ner.get("f1") is not None:
        lines += ["", ner_heading(ner), f"  {'f1':<24} {fmt(ner['f1'])}"]
        for t, f1 in (ner.get("per_type") or {}).items():
            if isinstance(f1, dict):
                f1 = f1.get("f1")
            lines.append(f"  f1[{t}]{'':<{max(0, 19 - len(t))}} {fmt(f1)}")
    utility = report.get("utility")
    if isinstance(utility, dict) and isinstance(utility.get("rows"), dict) and utility["rows"]:
        lines += format_utility(utility, fmt)
    canary = report.get("canary") or {}
    if canary.get("groups"):
        lines += ["", "canary exposure:", "  pattern  occurrences  exposure_dp  exposure_non_dp"]
        for g in canary["groups"]:
            lines.append(f"  {g.get('pattern', ''):<8} {fmt(g.get('occurrences')):>11}  "
                         f"{fmt(g.get('exposure_dp')):>11}  {fmt(g.get('exposure_non_dp')):>15}")
    if canary.get("groups") or canary.get("audit_epsilon_lower_bound") is not None:
        if not canary.get("groups"):
            lines += ["", "canary audit:"]
        lines.append(f"  audit ε lower bound: {fmt(canary.get('audit_epsilon_lower_bound'))}")
    if canary.get("audit_max_reachable_lower_bound") is not None:
        lines.append(f"  audit power (every guess right): {fmt(canary.get('audit_max_reachable_lower_bound'))}")
    if canary.get("baseline_audit_epsilon_lower_bound") is not None:
        lines.append(f"  positive control, non-private baseline: ε ≥ "
                     f"{fmt(canary.get('baseline_audit_epsilon_lower_bound'))}")
    audit = report.get("audit")
    if isinstance(audit, dict):
        lines += ["", f"white-box audit ({fmt(audit.get('canaries'))} gradient canaries, "
                      f"{fmt(audit.get('confidence'))} confidence):",
                  f"  ε lower bound (audit)      {fmt(audit.get('epsilon_lower_bound'))}",
                  f"  ε upper bound (gradients)  {fmt(audit.get('epsilon_upper_bound'))}"
                  f"   (ledger ε_T {fmt(audit.get('epsilon_train_ledger'))})",
                  f"  power (every guess right)  {fmt(audit.get('max_reachable_lower_bound'))}",
                  f"  positive control (no noise) {fmt(audit.get('positive_control_lower_bound'))}",
                  f"  consistent                 {fmt(audit.get('consistent'))}"]
    attacks = report.get("membership_inference_rows")
    if isinstance(attacks, list) and attacks:
        lines += ["", "membership inference:", "  attack                advantage    auc  bound"]
        for a in attacks:
            if isinstance(a, dict):
                lines.append(f"  {str(a.get('name', '')):<20} {fmt(a.get('advantage')):>9} {fmt(a.get('auc')):>6}"
                             f"  {fmt(a.get('advantage_bound'))}")
    return "\n".join(lines)


#: The pretraining keys that are DP estimates when the diagnostics are released with noise.
DP_ESTIMATE_KEYS = ("initial_mlm_loss", "final_mlm_loss", "final_mlm_accuracy", "clipped_fraction")


def format_pretraining(pretraining: Dict[str, Any], fmt) -> List[str]:
    """The pretraining section; for a DP run the diagnostics are labelled "DP estimate" and
    explained: ratios of noisy sums, windowed means, the per-step noise std."""
    dp = pretraining.get("diagnostics") == "dp"
    noise = pretraining.get("diagnostics_step_noise_std")
    noise = noise if isinstance(noise, dict) else {}
    window = pretraining.get("diagnostics_window")
    lines = ["", "pretraining:"]
    for k, v in pretraining.items():
        if k in ("loss_curve", "loss_curve_steps", "diagnostics_step_noise_std", "diagnostics_window") or v is None:
            continue
        label = k
        if dp and k in DP_ESTIMATE_KEYS:
            std = noise.get("loss" if "loss" in k else ("accuracy" if "accuracy" in k else "clipped_fraction"))
            label = f"{k} (DP estimate)"
            text = fmt(v) + (f"  (per-step noise std {fmt(std)})" if isinstance(std, (int, float)) else "")
            lines.append(f"  {label:<37} {text}")
            continue
        lines.append(f"  {label:<37} {fmt(v)}")
    if dp:
        loss_std = noise.get("loss")
        lines.append("  DP estimates: each step releases noisy sums (loss, accuracy, clipped count, batch size); a value is "
                     "noisy sum ÷ noisy batch size, clamped to its range")
        if isinstance(window, (int, float)) and window:
            lines.append(f"  initial / final = means over the first / last {int(window)} steps (10 % of the run); "
                         f"clipped fraction = mean over the run")
        if isinstance(loss_std, (int, float)):
            std_of_mean = loss_std / (float(window) ** 0.5) if isinstance(window, (int, float)) and window else None
            lines.append(f"  one step's loss carries noise of std {fmt(loss_std)} nats"
                         + (f" (a {int(window)}-step mean: ≈ {fmt(std_of_mean)})" if std_of_mean is not None else "")
                         + ": a final loss above the initial one by less than that is noise, not divergence")
    return lines


def ner_heading(ner: Dict[str, Any]) -> str:
    """The NER section's heading, naming the task and what the seeds were (probe or fine-tuning)."""
    parts = []
    task = ner.get("task")
    if isinstance(task, str):
        parts.append(NER_TASK_LABELS.get(task, task))
    if ner.get("mode") in NER_MODE_WORDS:
        seeds = ner.get("seeds")
        parts.append((f"{seeds} " if isinstance(seeds, int) else "") + ner_seeds_words(ner["mode"]))
    return "ner (DP model" + "".join(f", {p}" for p in parts) + "):"


def format_utility(utility: Dict[str, Any], fmt=None) -> List[str]:
    """The utility table as text lines (rows, then the gains kept when present; a gain without a
    value prints ``n/a (<reason>)``)."""
    from dpbert.evaluate.utility import format_gain

    fmt = fmt or (lambda v: "-" if v is None else f"{v:.4g}")
    rows = utility["rows"]
    reference = utility.get("reference")
    task = utility.get("ner_task")
    primary = NER_TASK_LABELS.get(task, task) if isinstance(task, str) else ""
    synthetic = any(isinstance(r, dict) and r.get("ner_synthetic_f1_mean") is not None for r in rows.values())
    lines = ["", f"utility (NER F1 over {fmt(utility.get('ner_seeds'))} {ner_seeds_words(utility.get('ner_mode'))}; "
                 f"gains from the {reference or '-'} row):",
             f"  {'model':<12} {'MLM loss':>9} {'MLM acc':>8} {('NER F1 ' + primary).strip():>17}"
             + (f" {'NER F1 in-domain':>17}" if synthetic else "")]

    def f1(r, column):
        mean = r.get(column + "_mean")
        return "-" if mean is None else f"{mean:.4f} ± {(r.get(column + '_std') or 0):.4f}"

    for name in UTILITY_ROWS:
        r = rows.get(name)
        if not isinstance(r, dict):
            continue
        lines.append(f"  {name:<12} {fmt(r.get('heldout_mlm_loss')):>9} {fmt(r.get('heldout_mlm_accuracy')):>8} "
                     f"{f1(r, 'ner_f1'):>17}" + (f" {f1(r, 'ner_synthetic_f1'):>17}" if synthetic else ""))
    if reference != "public" and "public" not in rows:
        lines.append("  (model.init = random: the public start is the random row)")
    for key, label in (("gain_kept_mlm_loss", "gain kept, MLM loss"), ("gain_kept_ner_f1", f"gain kept, NER F1 {primary}".strip()),
                       ("gain_kept_ner_synthetic_f1", "gain kept, NER F1 in-domain")):
        if key in utility and (key != "gain_kept_ner_synthetic_f1" or synthetic):
            lines.append(f"  {label:<28} " + format_gain(utility.get(key), utility.get(key + "_std"),
                                                         utility.get(key + "_reason"), ".4g"))
    return lines


def epsilon_summary(report: Dict[str, Any]) -> List[str]:
    """What ``dpbert run`` prints at the end (cached or not): the ε the run spent — ε total (PLD)
    per unit and adjacency, δ, ε_V and ε_T, the budget and within/over — and the run's status when
    it is not COMPLETE. Released values only (the ledger)."""
    def num(v):
        if isinstance(v, str):
            v = schema.decode(v)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def fmt(v):
        return "∞" if v == float("inf") else f"{v:.4g}"

    privacy = report.get("privacy") or {}
    total = num(privacy.get(schema.EPSILON_TOTAL_PLD))
    lines = []
    if total is None:
        lines.append("ε: no privacy report in this run (the accountant did not run)")
    else:
        unit, adjacency = privacy.get(schema.UNIT), privacy.get("adjacency")
        delta = num(privacy.get(schema.DELTA))
        line = f"ε = {fmt(total)} (PLD)"
        if unit:
            line += f" per {unit}" + (f" ({adjacency})" if adjacency else "")
        line += f", δ = {delta:.3g}" if delta is not None else ""
        parts = [f"{label} = {fmt(v)}" for label, v in (("ε_V", num(privacy.get(schema.EPSILON_VOCAB))),
                                                         ("ε_T", num(privacy.get(schema.EPSILON_TRAIN))))
                 if v is not None]
        if parts:
            line += " [" + ", ".join(parts) + "]"
        lines.append(line)
        budget = num(privacy.get(schema.EPSILON_BUDGET))
        within = privacy.get(schema.WITHIN_BUDGET)
        if budget is None:
            lines.append("budget: none configured (privacy.epsilon_budget)")
        else:
            ok = bool(within) if within is not None else total <= budget
            lines.append(f"budget: ε ≤ {fmt(budget)}: " + ("within budget" if ok else "OVER BUDGET"))
    if report.get("status") not in (None, "COMPLETE"):
        lines.append(f"status: {report['status']}")
    return lines


def run_summary(run: RunInfo):
    """What ``dpbert run`` prints when the run ends: (stdout lines, warning messages). The lines:
    ``epsilon_summary`` and, when TFX's cache re-used components, ``cached: N components reused``."""
    built = build_report(run)
    lines = epsilon_summary(built)
    cached = [c.node_id for c in run.components if c.state == "CACHED"]
    if cached:
        lines.append(f"cached: {len(cached)} components reused ({', '.join(cached)})")
    return lines, [w["message"] for w in built.get("warnings") or []]
