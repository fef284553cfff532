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
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon

#: The ledger properties the report's ``privacy`` section shows (same keys).
LEDGER_KEYS = (schema.EPSILON_VOCAB, schema.EPSILON_TRAIN, schema.EPSILON_TOTAL_BASIC,
               schema.EPSILON_TOTAL_PLD, schema.EPSILON_TOTAL_RDP, schema.DELTA, schema.DELTA_VOCAB,
               schema.DELTA_TRAIN, schema.UNIT, "adjacency", schema.SAMPLING, schema.STEPS,
               schema.EPSILON_BUDGET, schema.WITHIN_BUDGET)


#: The dataset's figures the accountant stores on the PrivacyReport (``dpbert.stages.accountant``):
#: the budget gate's verdict over EVERY run on the dataset, this one included. Kept in the
#: ``privacy`` section (released with it: functions of public parameters and DP events).
DATASET_KEYS = ("dataset_epsilon_spent", "dataset_epsilon_rdp", "dataset_epsilon_pld", "dataset_delta",
                "dataset_epsilon_budget", "dataset_rule")
#: What the figure the gate enforces (``Verdict.spent``) is, by the gate's rule.
DATASET_RULE_LABELS = {"rdp_filter": "Rényi filter at the committed order(s)",
                       "one_planned_run_pld": "one planned run (PLD)"}


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
    times = significant(ratio)  # 2 significant digits: 0.012×, not 0.0×
    effect = ("more memory and time per step; the DP diagnostics, normalised by the planned B, read "
              f"about {times}× too high (a clipped fraction above 1)" if ratio > 1 else
              "the noise, scaled for the planned B, swamps the smaller clipped sums")
    return {"section": "corpus", "code": "public_size_mismatch", "message": (
        f"the corpus holds about {times}× the {unit} of the configured public size ({field}, the n of "
        f"q = B/n): Poisson batches average about {times}× the planned B{planned_b} per step — {effect}. "
        f"The ε is that of the configured n; set {field} to (a public bound on) your corpus's size, or null "
        f"to plan from a DP count")}


def significant(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` significant digits, without an exponent for the ratios the warnings
    print (0.012, 0.5, 20, 1300)."""
    text = f"{x:.{digits}g}"
    if "e" in text:
        text = f"{float(text):f}".rstrip("0").rstrip(".")
    return text


#: The released mean noisy batch size may fall this far below the planned B before the report
#: warns (``small_batches_warning``).
SMALL_BATCH_FACTOR = 2.0


def small_batches_warning(model: Dict[str, Any]) -> Optional[Dict[str, str]]:
    """A warning when the RELEASED (noisy, DP) batch sizes averaged far below the planned B: the
    Poisson batches held fewer units than planned (the corpus is smaller than the public n), so
    each DP estimate's noise, fixed on its SUM, is a larger share of it than the std stated at the
    expected B. From released values only (the model artifact's mean of the noisy batch sizes and
    the public plan): released, unlike the corpus counts' warnings."""
    def num(key):
        value = model.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    released, planned = num(RELEASED_BATCH_SIZE), num("logical_batch")
    if released is None or not planned or released * SMALL_BATCH_FACTOR >= planned:
        return None
    unit = "patients" if model.get("privacy_unit") == "patient" else "tuples"
    field = "training.dataset_patients" if unit == "patients" else "training.dataset_size"
    return {"section": "pretraining", "code": "small_batches", "message": (
        f"the released (noisy) batch size averaged about {significant(max(released, 0.0))} {unit} per step against "
        f"the planned B = {planned:g}: the DP estimates' noise, fixed on their sums, is about "
        f"{significant(planned / max(released, 1.0))}× the per-step std stated at the expected B, and the gradient "
        f"noise swamps the smaller clipped sums; is {field} (the public n of q = B/n) far above your corpus?")}


def report_warnings(run: RunInfo) -> List[Dict[str, str]]:
    """``[{"section", "code", "message"}]``: heavy byte replacement, short documents, a tiny corpus,
    a corpus far from the configured public size (operator-only: computed from the corpus's exact
    counts), a tiny DP vocabulary."""
    from dpbert.data.corpus_warnings import corpus_warnings

    tuples = run.artifacts(schema.type_name(schema.WORD_TUPLES))
    tuple_props = tuples[0].properties if tuples else {}
    vocab = _props(run, schema.DP_VOCABULARY)
    out = []
    # A public vocabulary (vocab.source: public) builds no DP vocabulary: no warning about one.
    for w in corpus_warnings(tuple_props, vocab.get(schema.WORDS_KEPT), vocab.get(schema.VOCAB_SOURCE)):
        out.append({"section": "vocab" if w["code"] == "tiny_vocabulary" else "corpus", **w})
    model = _props(run, schema.PRETRAINED_MODEL, where=lambda p: not p.get(schema.NON_PRIVATE))
    for warning in (public_size_warning(tuple_props, model), small_batches_warning(model)):
        if warning is not None:
            out.append(warning)
    return out


def loss_curve_steps(model: Dict[str, Any]) -> Optional[List[int]]:
    """The true training step of each point of the model's ``loss_curve``: its
    ``loss_curve_steps`` property, else (older runs) derived as ``dpbert.model.loss_curve.loss_curve``
    strides this run's steps (``resumed_from_step`` + 1 … + ``steps_this_run``); None when unknown."""
    curve = model.get(schema.LOSS_CURVE)
    if not isinstance(curve, list) or not curve:
        return None
    from dpbert.model.loss_curve import curve_steps

    steps = model.get(schema.LOSS_CURVE_STEPS)
    if isinstance(steps, list) and len(steps) == len(curve):
        return steps
    first = model.get("resumed_from_step") or 0
    n = model.get("steps_this_run")
    if not isinstance(n, int) or not isinstance(first, int):
        return None
    derived = curve_steps(n, first)
    return derived if len(derived) == len(curve) else None


#: The model artifact's property with the mean of the RELEASED (noisy) per-step batch sizes (a DP
#: value: post-processing of the released sums). Written by the trainer stage; absent in older runs.
RELEASED_BATCH_SIZE = "diagnostics_batch_size_mean"
#: The model artifact's property saying what DP-SGD trained (``TrainResult.trainable``: ``sets``,
#: ``parameters``, ``total_parameters``; public: the configuration and the model's shape).
TRAINABLE = "trainable"


def trainable_of(model: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What DP-SGD trained, from the model artifact's ``trainable`` property (None when the trainer
    did not record it): ``{"sets", "parameters", "total_parameters", "lora_merged"}``. LoRA
    adapters are always folded into the released weights (``bert.merge_lora``), so
    ``lora_merged`` is whether the sets have ``lora``."""
    value = model.get(TRAINABLE)
    if isinstance(value, str):
        try:
            import json

            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or not isinstance(value.get("sets"), list):
        return None

    def count(key):
        v = value.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    sets = [str(x) for x in value["sets"]]
    return {"sets": sets, "parameters": count("parameters"), "total_parameters": count("total_parameters"),
            "lora_merged": "lora" in sets}


def trainable_text(trainable: Dict[str, Any]) -> str:
    """``bias, head (190,000 of 27,000,000 parameters)``, and that LoRA adapters were merged."""
    text = ", ".join(trainable.get("sets") or [])
    trained, total = trainable.get("parameters"), trainable.get("total_parameters")
    if trained is not None:
        text += f" ({trained:,}" + (f" of {total:,}" if total else "") + " parameters)"
    if trainable.get("lora_merged"):
        text += "; LoRA adapters merged into the released weights"
    return text


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
        "privacy": {**{k: ledger.get(k) for k in LEDGER_KEYS}, **schema.approx_flags(ledger, LEDGER_KEYS),
                    **{k: ledger.get(k) for k in DATASET_KEYS if ledger.get(k) is not None}},
        "vocab": {"size": vocab.get(schema.VOCAB_SIZE), "words_kept": vocab.get(schema.WORDS_KEPT),
                  "sigma": vocab.get(schema.SIGMA), "threshold": vocab.get(schema.THRESHOLD),
                  "epsilon": vocab.get(schema.EPSILON), "non_private": vocab.get(schema.NON_PRIVATE)},
        "pretraining": {"steps": dp_model.get(schema.STEPS_TAKEN_TOTAL),
                        # worker processes of the trainer (training.workers; absent before it existed)
                        "workers": dp_model.get("workers"),
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
                        # public: the noise std on each released per-step SUM, the planned B it is
                        # divided by, and the steps the window's fraction is of
                        "diagnostics_sum_noise_std": dp_model.get("diagnostics_noise_std"),
                        "expected_batch_size": dp_model.get("logical_batch"),
                        "steps_this_run": dp_model.get("steps_this_run"),
                        # released (DP): the mean of the noisy per-step batch sizes
                        "released_batch_size_mean": dp_model.get(RELEASED_BATCH_SIZE),
                        "trainable": trainable_of(dp_model),
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
    dataset = dataset_section(run, ledger)
    if dataset is not None:
        report["dataset"] = dataset
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


def dataset_target(run: RunInfo):
    """The run's dataset (``dpbert.accounting.target.LedgerTarget``) from a component's
    ``ledger_target`` parameter (``dpbert.metadata.EXECUTION_PROPERTIES``), or None."""
    from dpbert.accounting.target import LedgerTarget

    for component in run.components:
        try:
            target = LedgerTarget.from_json(component.properties.get("ledger_target") or "")
        except (ValueError, TypeError):
            continue
        if target is not None:
            return target
    return None


def dataset_section(run: RunInfo, ledger: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The ``dataset`` block: the dataset's id and ledger URI (the accountant stage's record of where
    it read the verdict; for older runs resolved here as the stage resolved it), the gate's composed
    total over every run on it (``epsilon_spent`` under ``rule``), the pinned budget, and this
    run's own ε beside them. None when the run names no dataset and stored no dataset figures."""
    target = dataset_target(run)
    figures = {k: ledger.get(k) for k in DATASET_KEYS}
    if target is None and all(v is None for v in figures.values()):
        return None
    uri = ledger.get("dataset_ledger")  # where the accountant stage read its verdict (runs since it records it)
    if uri is None and target is not None:
        try:
            uri = target.uri()
        except Exception:  # noqa: BLE001 -- a folder this reader cannot resolve: shown as unknown
            uri = None
    rule = figures["dataset_rule"]
    spent = figures["dataset_epsilon_spent"]
    dataset_id = ledger.get("dataset_id") or (None if target is None else target.dataset_id)
    return {"dataset_id": dataset_id, "ledger": uri,
            "epsilon_spent": spent, "epsilon_rdp": figures["dataset_epsilon_rdp"],
            "epsilon_pld": figures["dataset_epsilon_pld"], "delta": figures["dataset_delta"],
            "epsilon_budget": figures["dataset_epsilon_budget"], "rule": rule,
            "rule_label": DATASET_RULE_LABELS.get(rule), "within_budget": ledger.get(schema.WITHIN_BUDGET)
            if spent is not None else None, "run_epsilon": ledger.get(schema.EPSILON_TOTAL_PLD)}


def dataset_text(privacy: Dict[str, Any], dataset_id: Optional[str] = None) -> Optional[str]:
    """One line: the dataset's composed ε (what the budget gate enforces, with its rule; the PLD
    figure beside the filter's), its pinned budget at δ and the verdict. None without the figures."""
    spent = privacy.get("dataset_epsilon_spent")
    if not isinstance(spent, (int, float)) or isinstance(spent, bool):
        return None
    rule = privacy.get("dataset_rule")
    label = DATASET_RULE_LABELS.get(rule, str(rule))
    pld = privacy.get("dataset_epsilon_pld")
    if rule == "rdp_filter" and isinstance(pld, (int, float)):
        label += f"; PLD {fmt_epsilon(pld)}"
    text = f"dataset{' ' + dataset_id if dataset_id else ''}: composed ε = {fmt_epsilon(spent)} ({label}) over every run"
    budget, delta = privacy.get("dataset_epsilon_budget"), privacy.get("dataset_delta")
    if isinstance(budget, (int, float)):
        text += f", against its pinned budget ε = {fmt_epsilon(budget)}"
    if isinstance(delta, (int, float)):
        text += f" at δ = {fmt_delta(delta)}"
    within = privacy.get(schema.WITHIN_BUDGET)
    if within is not None:
        text += ": within budget" if within else ": OVER BUDGET"
    return text


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

    delta = charged.get("delta")
    spent = (f"ε = {num(charged.get('epsilon_charged'), '.4g')} "
             f"(δ = {fmt_delta(delta) if isinstance(delta, (int, float)) else '?'}) "
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
        if section == "privacy":
            lines += _dataset_lines(report)
            shown = [(k, v) for k, v in shown if k not in DATASET_KEYS]
        lines += [f"  {k:<24} {schema.privacy_number_text(report[section], k, fmt, fmt_delta)}" for k, v in shown
                  if not k.endswith(schema.APPROX_SUFFIX)]
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
        lines += format_membership([a for a in attacks if isinstance(a, dict)],
                                   (report.get("privacy") or {}).get(schema.UNIT), fmt)
    return "\n".join(lines)


def _dataset_lines(report: Dict[str, Any]) -> List[str]:
    """The privacy section's first lines: the dataset's composed total against its pinned budget,
    this run's own ε beside it, and where the dataset's ledger is (operator report only)."""
    privacy, dataset = report.get("privacy") or {}, report.get("dataset") or {}
    text = dataset_text(privacy, dataset.get("dataset_id"))
    if text is None:
        return []
    own = privacy.get(schema.EPSILON_TOTAL_PLD)
    lines = [f"  {text}", f"  this run's own ε = {fmt_epsilon(own)} (PLD)"]
    if dataset.get("ledger"):
        lines.append(f"  dataset ledger: {dataset['ledger']} (dpbert ledger --dataset {dataset.get('dataset_id')})")
    return lines


#: Why a membership table has no bound column (``membership_rows``: the bound is per tuple).
NO_BOUND_NOTE = ("no advantage bound: (e^ε − 1 + 2δ)/(e^ε + 1) bounds an attack on ONE privacy unit, and this "
                 "run's ε is per {unit} while the attacks score single tuples (a bound per tuple is given for "
                 "privacy.unit = tuple only)")


def format_membership(attacks: List[Dict[str, Any]], unit, fmt) -> List[str]:
    """The membership table; the ``bound`` column only when a row has one, else a note saying why."""
    bounded = any(a.get("advantage_bound") is not None for a in attacks)
    lines = ["", "membership inference:", "  attack                advantage    auc" + ("  bound" if bounded else "")]
    for a in attacks:
        lines.append(f"  {str(a.get('name', '')):<20} {fmt(a.get('advantage')):>9} {fmt(a.get('auc')):>6}"
                     + (f"  {fmt(a.get('advantage_bound'))}" if bounded else ""))
    if not bounded:
        lines.append("  (" + NO_BOUND_NOTE.format(unit=unit if isinstance(unit, str) else "unit") + ")")
    return lines


#: The pretraining keys that are DP estimates when the diagnostics are released with noise.
DP_ESTIMATE_KEYS = ("initial_mlm_loss", "final_mlm_loss", "final_mlm_accuracy", "clipped_fraction")
#: Pretraining keys printed by their own lines (or only used by them), not as ``key value``.
PRETRAINING_OWN_LINES = ("loss_curve", "loss_curve_steps", "diagnostics_step_noise_std", "diagnostics_window",
                         "diagnostics_sum_noise_std", "expected_batch_size", "steps_this_run",
                         "released_batch_size_mean", "trainable")
#: The sum each DP estimate is the ratio of (``diagnostics_sum_noise_std`` keys).
_SUM_OF = {"loss": "loss", "accuracy": "accuracy", "clipped_fraction": "clipped"}


def _estimate_kind(key: str) -> str:
    return "loss" if "loss" in key else ("accuracy" if "accuracy" in key else "clipped_fraction")


def format_pretraining(pretraining: Dict[str, Any], fmt) -> List[str]:
    """The pretraining section: what DP-SGD trained, and for a DP run the diagnostics labelled "DP
    estimate" and explained — ratios of noisy sums, windowed means, the noise std on each released
    SUM and the std it implies for one step's ratio at the expected (planned) batch size."""
    dp = pretraining.get("diagnostics") == "dp"
    noise = pretraining.get("diagnostics_step_noise_std")
    noise = noise if isinstance(noise, dict) else {}
    lines = ["", "pretraining:"]
    trainable = pretraining.get("trainable")
    if isinstance(trainable, dict):
        lines.append(f"  {'trained by DP-SGD':<37} {trainable_text(trainable)}")
    for k, v in pretraining.items():
        if k in PRETRAINING_OWN_LINES or v is None:
            continue
        if dp and k in DP_ESTIMATE_KEYS:
            std = noise.get(_estimate_kind(k))
            text = fmt(v) + (f"  (one step's ratio: noise std ≈ {fmt(std)} at the expected B)"
                             if isinstance(std, (int, float)) else "")
            lines.append(f"  {k + ' (DP estimate)':<37} {text}")
            continue
        lines.append(f"  {k:<37} {fmt(v)}")
    if dp:
        lines += _dp_estimate_lines(pretraining, noise, fmt)
    return lines


def _dp_estimate_lines(pretraining: Dict[str, Any], noise: Dict[str, Any], fmt) -> List[str]:
    """How to read the DP estimates: what is noised (each per-step SUM), the std that noise implies
    for a ratio at the expected batch size B (sum std ÷ B), the window's share of the run's steps."""
    def number(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    window, steps = number(pretraining.get("diagnostics_window")), number(pretraining.get("steps_this_run"))
    steps = steps or number(pretraining.get("steps"))
    sums = pretraining.get("diagnostics_sum_noise_std")
    sums = sums if isinstance(sums, dict) else {}
    batch, released = number(pretraining.get("expected_batch_size")), number(pretraining.get("released_batch_size_mean"))
    lines = ["  DP estimates: each step releases noisy SUMS (loss, accuracy, clipped count, batch size); a value is "
             "noisy sum ÷ noisy batch size, clamped to its range"]
    if window:
        share = f"{100 * window / steps:.0f} % of the run's {int(steps)} steps" if steps else "of the run's steps"
        lines.append(f"  initial / final = means over the first / last {int(window)} steps ({share}); "
                     f"clipped fraction = mean over the run")
    loss_sum = number(sums.get("loss"))
    if loss_sum is not None:
        line = f"  noise std on the released loss SUM of a step: {fmt(loss_sum)} nats"
        if batch:
            line += (f"; implied std of one step's loss ratio at the expected batch size B = {fmt(batch)}: "
                     f"{fmt(loss_sum / batch)} nats")
        if released is not None:
            line += (f"; the released noisy batch size averaged {fmt(released)}: at that size, "
                     f"{fmt(loss_sum / max(released, 1.0))} nats")
        lines.append(line)
    loss_std = number(noise.get("loss"))
    if loss_std is not None:
        std_of_mean = loss_std / window ** 0.5 if window else None
        lines.append(f"  a final loss above the initial one by less than ≈ "
                     f"{fmt(std_of_mean if std_of_mean is not None else loss_std)} nats "
                     f"({'a %d-step mean' % int(window) if window else 'one step'}, at the expected B) is noise, "
                     f"not divergence")
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
    per unit and adjacency, δ, ε_V and ε_T; then, when the run has a dataset, the dataset's composed
    total over every run on it against its pinned budget (``dataset_text``: what the gate enforces),
    else the configured budget and within/over; and the run's status when it is not COMPLETE.
    Released values only (the ledger)."""
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
        line += f", δ = {schema.privacy_number_text(privacy, schema.DELTA, str, fmt_delta)}" if delta is not None else ""
        parts = [f"{label} = {fmt(v)}" for label, v in (("ε_V", num(privacy.get(schema.EPSILON_VOCAB))),
                                                         ("ε_T", num(privacy.get(schema.EPSILON_TRAIN))))
                 if v is not None]
        if parts:
            line += " [" + ", ".join(parts) + "]"
        lines.append(line)
        budget = num(privacy.get(schema.EPSILON_BUDGET))
        within = privacy.get(schema.WITHIN_BUDGET)
        dataset = dataset_text(privacy, (report.get("dataset") or {}).get("dataset_id"))
        if dataset is not None:  # the gate's figure over every run on the dataset, not this run's
            lines[-1] = "this run: " + lines[-1]
            lines.append(dataset)
        elif budget is None:
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
