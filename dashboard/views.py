"""What the pages show, built from a ``RunInfo`` and its report: plain data, no I/O, no web code.

The report is ``dpbert.report_model.RunReport`` (read once from the run's properties, older runs
included: absent data is ``None`` / empty and the templates say "not in this run"); the
functions here render its attributes. A report document (its ``to_json()``) is accepted too.

Privacy rules applied here (the templates only escape and lay out):
- an artifact is private when its ``private`` custom property is set, or its type is a known
  private type; of a private artifact only the type, the output key, the URI and the counts of
  units (numeric ``num_*`` properties) are shown in the artifact list;
- no artifact file is ever opened: everything comes from ML Metadata custom properties;
- the release boundary (``dpbert.release``): every value shown is either released (DP: the ledger,
  the DP vocabulary, the DP model's diagnostics and NER F1, the audit bound) or marked
  operator-only (computed on private data without noise: the non-private model's losses and NER
  rows, canary exposures, membership inference, values of a ``private = 1`` report, the raw
  artifact properties). ``run_page`` says which (``*_operator_only`` flags, separate sections).
"""
from __future__ import annotations

import datetime
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from dpbert import schema
from dpbert.metadata import ArtifactInfo, RunInfo
from dpbert.report_model import (NER_TASK_LABELS, NerSection, RunReport, as_report, baseline_curve, ner_seeds_words,
                                 privacy_of)

# Types whose files hold raw text or secrets even if an older run did not set `private`.
KNOWN_PRIVATE_TYPES = frozenset({schema.type_name(schema.WORD_TUPLES)})
PRIVATE_SHOWN_PREFIX = schema.COUNT_PREFIX  # counts of units (tuples, documents, patients)
SHORT_VALUE = 160
BOOLEAN_KEYS = schema.BOOLEAN_PROPERTIES  # stored as ints

LEDGER_ROWS = (
    (schema.EPSILON_VOCAB, "ε_V (vocabulary)"),
    (schema.EPSILON_TRAIN, "ε_T (DP-SGD)"),
    (schema.EPSILON_TOTAL_BASIC, "ε total, basic composition"),
    (schema.EPSILON_TOTAL_PLD, "ε total, PLD"),
    (schema.EPSILON_TOTAL_RDP, "ε total, RDP"),
    (schema.DELTA, "δ total"),
    (schema.DELTA_VOCAB, "δ_V"),
    (schema.DELTA_TRAIN, "δ_T"),
    (schema.UNIT, "unit of privacy"),
    ("adjacency", "adjacency"),
    (schema.SAMPLING, "sampling mode"),
    (schema.STEPS, "training steps"),
    (schema.EPSILON_BUDGET, "ε budget (configured)"),
    (schema.WITHIN_BUDGET, "within budget"),
)
LEDGER_BARS = ((schema.EPSILON_VOCAB, "ε_V"), (schema.EPSILON_TRAIN, "ε_T"),
               (schema.EPSILON_TOTAL_BASIC, "total (basic)"), (schema.EPSILON_TOTAL_PLD, "total (PLD)"),
               (schema.EPSILON_TOTAL_RDP, "total (RDP)"))
VOCAB_ROWS = (("size", "vocabulary size"), ("words_kept", "words kept"), ("sigma", "σ (noise per count)"),
              ("threshold", "threshold C"), ("epsilon", "ε_V"), ("non_private", "non-private baseline"))
PRETRAINING_ROWS = (("steps", "steps taken"), ("workers", "worker processes"),
                    ("initial_mlm_loss", "initial MLM loss (DP estimate)"),
                    ("final_mlm_loss", "final MLM loss (DP estimate)"),
                    ("final_mlm_accuracy", "final MLM accuracy (DP estimate)"),
                    ("clipped_fraction", "clipped fraction (DP estimate)"), ("diagnostics", "diagnostics released as"),
                    ("diagnostics_window", "initial / final: mean over the first / last N steps"))
#: Operator-only: the non-private baseline, trained on the private data without noise.
BASELINE_ROWS = (("non_dp_final_mlm_loss", "final MLM loss (non-DP baseline)"),)


# --- values ---------------------------------------------------------------------------------

def number(value: Any) -> Optional[float]:
    """A float from a property value (``"inf"``, a summary dict's ``mean``), else None."""
    if isinstance(value, dict):
        value = value.get("mean")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity"):
        return math.inf
    return None


def fmt(value: Any) -> str:
    """A short readable text for a value (the template escapes it)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        return f"{value:.4g}"
    if isinstance(value, (dict, list, tuple)):
        return schema.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_time(ms: Optional[int]) -> str:
    if not ms:
        return "—"
    return datetime.datetime.fromtimestamp(ms / 1000.0, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bool_flag(value: Any) -> Optional[bool]:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


# --- artifacts and the DAG ------------------------------------------------------------------

def is_private(artifact: ArtifactInfo) -> bool:
    return artifact.private or artifact.type in KNOWN_PRIVATE_TYPES


def visible_properties(artifact: ArtifactInfo) -> Tuple[List[Dict[str, Any]], int]:
    """The rows of an artifact's property table and how many properties are withheld."""
    private = is_private(artifact)
    rows, hidden = [], 0
    for key in sorted(artifact.properties):
        value = artifact.properties[key]
        if private and not (key.startswith(PRIVATE_SHOWN_PREFIX) and isinstance(value, (int, float))
                            and not isinstance(value, bool)):
            hidden += 1  # of a private artifact only numeric counts of units are shown
            continue
        text = _fmt_key(key, value)
        rows.append({"key": key, "short": text if len(text) <= SHORT_VALUE else text[:SHORT_VALUE] + "…",
                     "full": text, "truncated": len(text) > SHORT_VALUE})
    return rows, hidden


def short_type(type_name: str) -> str:
    return schema.short_type_name(type_name)


def run_summary(run: RunInfo) -> Dict[str, Any]:
    """One row of the runs list: status (CANCELLED for an interrupted run) and what the run spent
    (``privacy_summary``: released ledger values)."""
    states: Dict[str, int] = {}
    for c in run.components:
        states[c.state] = states.get(c.state, 0) + 1
    return {"run_id": run.run_id, "pipeline": run.pipeline, "status": run.status,
            "duration_s": round(run.duration_s, 1), "duration": fmt_duration(run.duration_s),
            "created": fmt_time(run.created_ms), "created_ms": run.created_ms,
            "components": len(run.components), "states": states, "privacy": privacy_summary(run)}




def dag(run: RunInfo) -> Dict[str, Any]:
    """Components (nodes), edges producer → consumer through artifacts, and the artifacts."""
    producers: Dict[int, str] = {}
    artifacts: Dict[int, Dict[str, Any]] = {}

    def entry(a: ArtifactInfo) -> Dict[str, Any]:
        if a.id not in artifacts:
            rows, hidden = visible_properties(a)
            artifacts[a.id] = {"id": a.id, "type": a.type, "short_type": short_type(a.type), "key": a.name,
                               "uri": a.uri, "private": is_private(a), "properties": rows,
                               "hidden": hidden, "producer": None, "consumers": []}
        return artifacts[a.id]

    for c in run.components:
        for a in c.outputs:
            entry(a)["producer"] = c.node_id
            producers[a.id] = c.node_id
    nodes, edges = [], []
    for c in run.components:
        for a in c.inputs:
            consumers = entry(a)["consumers"]
            if c.node_id not in consumers:
                consumers.append(c.node_id)
            if a.id in producers and (producers[a.id], c.node_id) not in edges:
                edges.append((producers[a.id], c.node_id))
        nodes.append({"id": c.node_id, "execution_id": c.execution_id, "state": c.state,
                      "started": fmt_time(c.started_ms), "duration_s": round(c.duration_s, 1),
                      "duration": fmt_duration(c.duration_s),
                      "inputs": [{"id": a.id, "key": a.name, "short_type": short_type(a.type)} for a in c.inputs],
                      "outputs": [{"id": a.id, "key": a.name, "short_type": short_type(a.type)} for a in c.outputs]})
    return {"nodes": nodes, "edges": edges, "artifacts": sorted(artifacts.values(), key=lambda a: a["id"])}


def dag_layers(nodes: Sequence[str], edges: Sequence[Tuple[str, str]]) -> Dict[str, int]:
    """Longest-path layer of every node (sources at 0); cycles cannot occur in a TFX DAG but are
    cut rather than looped on."""
    layer = {n: 0 for n in nodes}
    for _ in range(len(layer)):
        changed = False
        for a, b in edges:
            if a in layer and b in layer and layer[b] < layer[a] + 1:
                layer[b] = layer[a] + 1
                changed = True
        if not changed:
            break
    return layer



# --- the report's sections ------------------------------------------------------------------
# Each function takes the run's ``RunReport`` (``dpbert.report_model.read_report``) or a report
# document (``RunReport.to_json()``'s shape, read by ``as_report``) and renders its attributes.
Report = Union[RunReport, Mapping[str, Any]]


def privacy_summary(run: RunInfo) -> Optional[Dict[str, Any]]:
    """What a run spent, from its ledger (released values): ε total (PLD) with its unit and
    adjacency, δ, the budget and within/over (``within``: True / False / None without a budget).
    None when the run has no (non-private) privacy report; numbers as ``*_value``, texts for the page."""
    privacy = privacy_of(run)
    if privacy is None:
        return None
    epsilon, delta = number(privacy.epsilon_total_pld), number(privacy.delta)
    budget = number(privacy.epsilon_budget)
    within = privacy.within_budget if budget is not None else None
    if within is None and epsilon is not None and budget is not None:
        within = epsilon <= budget
    return {"epsilon": privacy.text(schema.EPSILON_TOTAL_PLD, lambda v: fmt(epsilon)),
            "epsilon_value": epsilon, "unit": privacy.unit, "adjacency": privacy.adjacency,
            "delta": privacy.text(schema.DELTA, str) if delta is not None else "—",
            "delta_value": delta,
            "budget": fmt(budget) if budget is not None else None, "budget_value": budget,
            "within": within,
            "verdict": "no budget" if budget is None else ("within budget" if within else "OVER BUDGET")}


def ledger(run: RunInfo) -> Optional[Dict[str, Any]]:
    """The privacy ledger (``components.PrivacyReport`` properties), or None when not in the run."""
    privacy = privacy_of(run)
    if privacy is None:
        return None
    rows = [{"key": key, "label": label, "value": privacy.text(key, lambda v, k=key: _fmt_key(k, v))}
            for key, label in LEDGER_ROWS if getattr(privacy, key) is not None]
    total, budget = number(privacy.epsilon_total_pld), number(privacy.epsilon_budget)
    within = privacy.within_budget
    if within is None and total is not None and budget is not None:
        within = total <= budget
    return {"rows": rows, "total": fmt(total) if total is not None else None,
            "budget": fmt(budget) if budget is not None else None, "within": within,
            "statement": privacy.statement,
            "chart": any(number(getattr(privacy, k)) is not None for k in (
                schema.EPSILON_VOCAB, schema.EPSILON_TRAIN, schema.EPSILON_TOTAL_BASIC, schema.EPSILON_TOTAL_PLD))}


def ledger_bars(run: RunInfo) -> Optional[Dict[str, Any]]:
    privacy = privacy_of(run)
    if privacy is None:
        return None
    bars = [(label, number(getattr(privacy, key))) for key, label in LEDGER_BARS]
    bars = [(label, v) for label, v in bars if v is not None]
    if not bars:
        return None
    return {"bars": bars, "budget": number(privacy.epsilon_budget)}


def _fmt_key(key: str, value: Any) -> str:
    return fmt(_bool_flag(value)) if key in BOOLEAN_KEYS else fmt(value)


def _rows(section: Any, spec) -> List[Dict[str, str]]:
    """``{label, value}`` of each of the section's attributes in ``spec`` that has a value."""
    return [{"label": label, "value": fmt(getattr(section, key))} for key, label in spec
            if getattr(section, key) is not None]


def released_loss_curve(report: Report) -> Dict[str, List[float]]:
    """``{"DP": [...]}``: the DP model's loss curve as reported (released), or ``{}``."""
    dp = as_report(report).pretraining.loss_points
    return {"DP": list(dp)} if dp else {}


def released_loss_steps(report: Report) -> Dict[str, List[int]]:
    """``{"DP": [...]}``: the true training step of each point of ``released_loss_curve`` (the
    curve is subsampled to ~200 points and a resumed run starts at its checkpoint), or ``{}`` when
    the report does not know them (the plot then falls back to point indices)."""
    steps = as_report(report).pretraining.loss_steps
    return {"DP": list(steps)} if steps else {}


def loss_steps(run: RunInfo, report: Report) -> Dict[str, List[int]]:
    """The steps of every curve of ``loss_curves`` that knows them (the baseline's: its
    ``loss_curve_steps`` property, else derived as the report derives the DP model's)."""
    out = released_loss_steps(report)
    _, steps = baseline_curve(run)
    if steps:
        out["non-DP"] = list(steps)
    return out


def loss_curves(run: RunInfo, report: Report) -> Dict[str, List[float]]:
    """``{"DP": [...], "non-DP": [...]}`` with only the curves that exist (finite points kept).
    The non-DP curve is the baseline's (``private = 1``: trained without noise): operator-only."""
    curves = released_loss_curve(report)
    points, _ = baseline_curve(run)
    if points:
        curves["non-DP"] = list(points)
    return curves


def exposure_groups(report: Report) -> List[Dict[str, Any]]:
    """Canary groups as ``{label, occurrences, dp, non_dp}`` (exposures may be summaries)."""
    return [{"label": g.label, "pattern": g.pattern, "occurrences": g.occurrences, "dp": g.dp, "non_dp": g.non_dp,
             "occurrences_text": fmt(g.occurrences_value), "dp_text": fmt(g.dp), "non_dp_text": fmt(g.non_dp)}
            for g in as_report(report).canary.exposure_groups()]


def membership_attacks(report: Report) -> List[Dict[str, Any]]:
    """Membership-inference attacks as ``{name, fpr, tpr, stats: [(key, text)]}``."""
    membership = as_report(report).membership
    if membership is None:
        return []
    return [{"name": a.name, "fpr": list(a.fpr), "tpr": list(a.tpr), "stats": [(k, fmt(v)) for k, v in a.stats]}
            for a in membership.attacks()]


def membership_bound_note(report: Report) -> Optional[str]:
    """Why no attack row carries an advantage bound (``dpbert.report.NO_BOUND_NOTE``), or None when
    one does or there is no attack."""
    from dpbert.report import NO_BOUND_NOTE

    report = as_report(report)
    attacks = report.membership.attacks() if report.membership is not None else ()
    if not attacks or any(a.advantage_bound is not None for a in attacks):
        return None
    return NO_BOUND_NOTE.format(unit=report.privacy.unit or "unit")


def ner_view(report: Report) -> Optional[Dict[str, Any]]:
    ner = as_report(report).ner
    if ner.f1 is None and not ner.per_type and not ner.table:
        return None
    per_type_rows = [{"type": s.type, "precision": fmt(s.precision), "recall": fmt(s.recall), "f1": fmt(s.f1),
                      "support": fmt(s.support)} for s in ner.entity_scores()]
    return {"f1": fmt(ner.f1) if ner.f1 is not None else None, "per_type": per_type_rows,
            "table": labelled_table(generic_table(ner.table), NER_COLUMN_LABELS, ner_column_label),
            "heading": ner.heading}


#: The "every model" NER table's column keys (``dpbert.stages.ner``'s ``table`` property) as headings.
NER_COLUMN_LABELS = {"model": "model", "f1_mean": "NER F1 (mean)", "f1_std": "NER F1 (std)",
                     "precision": "precision", "recall": "recall", "heldout_mlm_loss": "held-out MLM loss",
                     "heldout_mlm_accuracy": "held-out MLM accuracy", "ner_seconds": "NER time (s)",
                     "mlm_seconds": "MLM eval time (s)"}


def ner_column_label(key: str) -> str:
    """A heading for a column ``NER_COLUMN_LABELS`` does not name: ``f1_<Type>`` (per entity type),
    ``<task>_f1_mean`` (another NER task), else the key with spaces."""
    if key.endswith("_f1_mean"):
        task = key[: -len("_f1_mean")]
        return f"NER F1, {NER_TASK_LABELS.get(task, task)} (mean)"
    if key.startswith("f1_"):
        return f"F1 {key[3:]}"
    return key.replace("_", " ")


def labelled_table(table: Optional[Dict[str, Any]], labels: Dict[str, str], fallback) -> Optional[Dict[str, Any]]:
    """``generic_table``'s ``{columns, rows}`` with each column key replaced by its human heading
    (``labels``, else ``fallback(key)``); the keys stay in ``column_keys`` (the headings' tooltips)."""
    if table is None:
        return None
    return dict(table, column_keys=list(table["columns"]),
                columns=[labels.get(c) or (fallback(c) if c else c) for c in table["columns"]])


#: The utility table's rows and which of them are released (``dpbert.release``).
UTILITY_LABELS = (("random", "random init"), ("public", "public start"), ("dp", "DP in-domain"),
                  ("non_private", "non-private in-domain"))
_GAIN_LABELS = (("gain_kept_mlm_loss", "gain kept, held-out MLM loss"), ("gain_kept_ner_f1", "gain kept, NER F1"),
                ("gain_kept_ner_synthetic_f1", "gain kept, NER F1 (in-domain)"))


def _f1(mean: Optional[float], std: Optional[float]) -> str:
    return "—" if mean is None else f"{mean:.4f} ± {(std or 0.0):.4f}"


def utility_view(report: Report) -> Optional[Dict[str, Any]]:
    """The report's ``utility`` section for the run page: one row per model that ran (held-out MLM
    loss and accuracy, NER F1 mean ± std of the primary task and of the in-domain synthetic task),
    each marked released or operator-only (the non-private row), and the gains kept
    (operator-only: they use the non-private row; ``n/a (<reason>)`` without a value)."""
    from dpbert.evaluate.utility import format_gain
    from dpbert.release import RELEASED_UTILITY_ROWS

    utility = as_report(report).utility
    if utility is None or not utility.rows:
        return None
    synthetic = any(r.ner_synthetic_f1_mean is not None for r in utility.rows.values())
    rows = [{"key": key, "label": label, "loss": fmt(r.heldout_mlm_loss), "accuracy": fmt(r.heldout_mlm_accuracy),
             "f1": _f1(r.ner_f1_mean, r.ner_f1_std), "f1_synthetic": _f1(r.ner_synthetic_f1_mean, r.ner_synthetic_f1_std),
             "released": key in RELEASED_UTILITY_ROWS}
            for key, label in UTILITY_LABELS for r in [utility.rows.get(key)] if r is not None]
    primary = NER_TASK_LABELS.get(utility.ner_task, utility.ner_task) if utility.ner_task else None
    gains = [{"label": label + (f" ({primary})" if key == "gain_kept_ner_f1" and primary else ""),
              "value": format_gain(utility.gains[key], utility.gains[key + "_std"], utility.reasons.get(key), ".4g")}
             for key, label in _GAIN_LABELS if key != "gain_kept_ner_synthetic_f1" or synthetic]
    return {"rows": rows, "gains": gains, "seeds": fmt(utility.ner_seeds), "seeds_words": ner_seeds_words(utility.ner_mode),
            "primary": primary or "NER", "synthetic": synthetic, "reference": utility.reference or "—",
            "no_public_row": "public" not in utility.rows, "uncertainty": utility.uncertainty}


def generic_table(value: Any) -> Optional[Dict[str, Any]]:
    """A list of dicts, a dict of dicts or a list of lists (a stored table of any of these shapes)
    as ``{columns, rows}`` of texts."""
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        value = [dict({"": k}, **v) for k, v in value.items()]
    if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
        columns: List[str] = []
        for r in value:
            columns += [str(k) for k in r if str(k) not in columns]
        return {"columns": columns, "rows": [[fmt(r.get(c)) for c in columns] for r in value]}
    if isinstance(value, list) and value and all(isinstance(r, list) for r in value):
        width = max(len(r) for r in value)
        return {"columns": [str(x) for x in value[0]] + [""] * (width - len(value[0])),
                "rows": [[fmt(x) for x in r] + [""] * (width - len(r)) for r in value[1:]]}
    return None


def vocab_rows(report: Report) -> List[Dict[str, str]]:
    return _rows(as_report(report).vocab, VOCAB_ROWS)


def pretraining_rows(report: Report) -> List[Dict[str, str]]:
    """What DP-SGD trained (``training.trainable``; LoRA merged) and the DP model's released
    diagnostics: DP estimates (ratios of noisy sums, clamped; ``dpbert.privacy.diagnostics``), with
    the noise std on each released per-step SUM and the std it implies for one step's ratio at the
    expected (planned) batch size."""
    section = as_report(report).pretraining
    rows = []
    if section.trainable is not None:
        rows.append({"label": "trained by DP-SGD (training.trainable)", "value": section.trainable.text()})
    rows += _rows(section, PRETRAINING_ROWS)
    parts = (("loss", "loss", "loss"), ("accuracy", "accuracy", "accuracy"),
             ("clipped", "clipped_fraction", "clipped fraction"))
    sums = section.diagnostics_sum_noise_std
    if sums:
        text = ", ".join(f"{label} {fmt(number(sums[key]))}" for key, _, label in parts if key in sums)
        rows.append({"label": "noise std on each released per-step SUM", "value": text})
    noise = section.diagnostics_step_noise_std
    if noise:
        batch = number(section.expected_batch_size)
        text = ", ".join(f"{label} {fmt(number(noise[key]))}" for _, key, label in parts if key in noise)
        where = f"the expected batch size B = {fmt(batch)}" if batch is not None else "the expected batch size"
        rows.append({"label": f"implied noise std of one step's ratio at {where}", "value": text})
    released = number(section.released_batch_size_mean)
    if released is not None:
        rows.append({"label": "released (noisy) batch size, mean per step", "value": fmt(released)})
    return rows


def baseline_rows(report: Report) -> List[Dict[str, str]]:
    """Operator-only: the non-private baseline's values."""
    return _rows(as_report(report).pretraining, BASELINE_ROWS)


def marked_private(run: RunInfo, short: str) -> bool:
    """Whether the run's artifact of that type (the one the report reads) is marked private."""
    artifacts = [a for a in run.artifacts(schema.type_name(short))
                 if short != schema.PRETRAINED_MODEL or not a.typed.non_private]
    return bool(artifacts) and is_private(artifacts[0])


def vocab_operator_only(run: RunInfo, report: Report) -> bool:
    """The vocabulary is operator-only when it is the non-private baseline (exact counts) or its
    artifact is marked private."""
    return bool(as_report(report).vocab.non_private) or marked_private(run, schema.DP_VOCABULARY)


def plots_available(run: RunInfo, report: Report) -> Dict[str, bool]:
    report = as_report(report)
    groups = exposure_groups(report)
    return {
        "dag": bool(run.components),
        "budget": ledger_bars(run) is not None,
        "loss": bool(released_loss_curve(report)),
        "loss_comparison": "non-DP" in loss_curves(run, report)
        or number(report.pretraining.non_dp_final_mlm_loss) is not None,
        "exposure": any(g["dp"] is not None or g["non_dp"] is not None for g in groups),
        "roc": any(a["fpr"] for a in membership_attacks(report)),
    }


#: The corpus section's rows (OPERATOR-ONLY: exact counts of the private data).
CORPUS_ROWS = (("documents", "documents"), ("patients", "patients"), ("tuples", "tuples (privacy units)"),
               ("words", "words"), ("words_per_document", "words per document"),
               ("tuple_words", "words per tuple N"), ("skipped_error_rows", "skipped rows (ISERROR)"),
               ("skipped_empty_documents", "skipped empty documents"), ("replaced_bytes", "replaced bytes (not UTF-8)"),
               ("corpus_bytes", "corpus bytes"), ("replaced_fraction", "replaced fraction"))


def corpus_rows(report: Report) -> List[Dict[str, str]]:
    """Operator-only: the report's ``corpus`` section (counts, never the corpus's location)."""
    corpus = as_report(report).corpus
    return _rows(corpus, CORPUS_ROWS) if corpus is not None else []


def warnings_view(report: Report) -> List[Dict[str, Any]]:
    """The report's warnings; the corpus ones are operator-only (computed from exact counts)."""
    return [{"section": w.section, "message": w.message, "operator_only": w.operator_only}
            for w in as_report(report).warnings]


def charged_view(report: Report) -> Optional[str]:
    """A sentence for a run that stopped before its accountant: the ε already spent."""
    from dpbert.report import charged_sentence

    charged = as_report(report).charged
    return charged_sentence(charged.to_json()) if charged is not None else None


def interrupted_view(report: Report) -> Optional[str]:
    """A sentence for an interrupted run (``dpbert run`` marked it cancelled), else None."""
    interrupted = as_report(report).interrupted
    if interrupted is None:
        return None
    text = "Interrupted (SIGINT/SIGTERM)"
    if interrupted.component:
        text += f" in {interrupted.component}"
    if interrupted.step is not None:
        text += f" at training step {fmt(interrupted.step)}"
    return text + "; re-running the same command resumes it (from the trainer's last checkpoint)."


def ner_released(report: Report) -> bool:
    """Whether the NER F1 is in the released view (``dpbert.release.released_view``: one definition
    of what is released; a run that is not DP or is over its budget releases no NER value)."""
    from dpbert.release import released_view

    ner = NerSection.from_json(released_view(as_report(report).to_json()).get("ner"))
    return ner.f1 is not None or bool(ner.per_type)


def canary_audit_view(report: Report) -> Optional[Dict[str, str]]:
    """The canary (black-box) one-run audit's line: its bound, its power (the bound with every guess
    right) and whether it could refute the ledger's ε_T at all."""
    report = as_report(report)
    lower = number(report.canary.audit_epsilon_lower_bound)
    if lower is None:
        return None
    reach = number(report.canary.audit_max_reachable_lower_bound)
    claimed = number(report.privacy.epsilon_train)
    verdict = None
    if reach is not None and claimed is not None:
        verdict = (f"it could refute ε_T = {fmt(claimed)}" if reach > claimed else
                   f"ε_T = {fmt(claimed)} is above what it can refute")
    return {"epsilon": fmt(lower), "power": fmt(reach) if reach is not None else None, "verdict": verdict}


def audit_view(report: Report) -> Optional[Dict[str, Any]]:
    """The white-box audit next to the ledger: rows, and the verdict (consistent, and whether the
    audit had the power to refute the claimed ε at all)."""
    audit = as_report(report).audit
    if audit is None or audit.epsilon_lower_bound is None:
        return None
    rows = [("ε lower bound (audit)", audit.epsilon_lower_bound),
            ("ε upper bound (accountant, gradient release)", audit.epsilon_upper_bound),
            ("ε_T in the ledger", audit.epsilon_train_ledger),
            ("power: bound with every guess right", audit.max_reachable_lower_bound),
            ("positive control: same run, noise off", audit.positive_control_lower_bound),
            ("gradient canaries", audit.canaries), ("confidence", audit.confidence),
            ("δ", audit.delta), ("steps", audit.steps), ("q", audit.q)]
    return {"rows": [{"label": k, "value": fmt(v)} for k, v in rows if v is not None],
            "consistent": audit.consistent, "powerful": audit.powerful,
            "control_detected": audit.positive_control_exceeds_upper_bound}


def dataset_summary(report: Report) -> Optional[Dict[str, Any]]:
    """The run's dataset on its page: the dataset's composed total against its pinned budget (the
    gate's figure over every run on it, ``dpbert.report.dataset_text``) and what the dataset page
    needs (its id, its ledger's URI); None when the run names no dataset."""
    from dpbert.report import dataset_text

    report = as_report(report)
    dataset = report.dataset
    if dataset is None:
        return None
    return {"dataset_id": dataset.dataset_id, "ledger": dataset.ledger,
            "text": dataset_text(report.privacy.to_json(), dataset.dataset_id),
            "within": dataset.within_budget if dataset.epsilon_spent is not None else None}


def run_page(run: RunInfo, report: Report) -> Dict[str, Any]:
    """The context of the run page."""
    report = as_report(report)
    audit_epsilon = report.canary.audit_epsilon_lower_bound
    return {
        "run": run_summary(run),
        "interrupted": interrupted_view(report),
        "charged": charged_view(report),
        "corpus": corpus_rows(report),
        "warnings": warnings_view(report),
        "dag": dag(run),
        "ledger": ledger(run),
        "dataset": dataset_summary(report),
        "whitebox_audit": audit_view(report),
        "vocab": vocab_rows(report),
        "vocab_operator_only": vocab_operator_only(run, report),
        "pretraining": pretraining_rows(report),
        "baseline": baseline_rows(report),
        "loss_curves": sorted(loss_curves(run, report)),
        "ner": ner_view(report),
        "utility": utility_view(report),
        # The badge says what `dpbert report --released` says: the DP model's F1 is released with a
        # releasable run (dpbert.release.released_view), the every-model table stays operator-only.
        "ner_operator_only": not ner_released(report),
        "canary_groups": exposure_groups(report),
        "audit_epsilon": fmt(audit_epsilon) if audit_epsilon is not None else None,
        "canary_audit": canary_audit_view(report),
        "attacks": membership_attacks(report),
        "membership_bound_note": membership_bound_note(report),
        "membership_present": report.membership is not None,
        "plots": plots_available(run, report),
    }
