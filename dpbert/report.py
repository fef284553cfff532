"""The run report's text: ``dpbert report`` (a readable table), the ε summary ``dpbert run`` prints.

The report itself is ``dpbert.report_model.RunReport``, read once from a run's ML Metadata
properties (``read_report``); ``build_report`` is its JSON document (``dpbert report --json``, the
dashboard's JSON API), which ``dpbert.release.released_view`` cuts down to what is released. The
functions here format that document or its released view. Exact counts appear in ONE section,
``corpus`` (operator-only); the released view never carries it, nor the warnings computed from it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from dpbert import schema
from dpbert.metadata import RunInfo
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
# The report's model and reader, and the names callers know from here (one definition each).
from dpbert.report_model import (AUDIT_KEYS, CORPUS_KEYS, DATASET_KEYS, DATASET_RULE_LABELS,  # noqa: F401
                                 LEDGER_KEYS, MODEL_LABELS, NER_MODE_WORDS, NER_TASK_LABELS, PUBLIC_SIZE_FACTOR,
                                 RELEASED_BATCH_SIZE, SMALL_BATCH_FACTOR, TRAINABLE, UTILITY_COLUMNS, UTILITY_GAINS,
                                 UTILITY_ROWS, RunReport, Trainable, dataset_target, loss_curve_steps,
                                 membership_rows, ner_seeds_words, read_report, significant)


def build_report(run: RunInfo) -> Dict[str, Any]:
    """The report document of ``run`` (``read_report(run).to_json()``)."""
    return read_report(run).to_json()


def trainable_text(trainable: Dict[str, Any]) -> str:
    """``bias, head (190,000 of 27,000,000 parameters)``, and that LoRA adapters were merged."""
    parsed = Trainable.from_json(trainable)
    return "" if parsed is None else parsed.text()


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
    report = read_report(run)
    lines = epsilon_summary(report.to_json())
    cached = [c.node_id for c in run.components if c.state == "CACHED"]
    if cached:
        lines.append(f"cached: {len(cached)} components reused ({', '.join(cached)})")
    return lines, [w.message for w in report.warnings]
