"""The run report: one JSON object built from ML Metadata custom properties.

`dpbert report --json` prints it; the dashboard's JSON API serves the same object. Only
properties are read (never private artifact files), so the report can hold no raw text, exact
count or canary secret.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from dpbert import schema
from dpbert.metadata import RunInfo

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


def build_report(run: RunInfo) -> Dict[str, Any]:
    ledger = _props(run, schema.PRIVACY_REPORT)
    vocab = _props(run, schema.DP_VOCABULARY)
    dp_model = _props(run, schema.PRETRAINED_MODEL, where=lambda p: not p.get(schema.NON_PRIVATE))
    non_dp_model = _props(run, schema.PRETRAINED_MODEL, where=lambda p: bool(p.get(schema.NON_PRIVATE)))
    ner = _props(run, schema.NER_REPORT)
    canary = _props(run, schema.CANARY_REPORT)
    mia = _props(run, schema.MEMBERSHIP_REPORT)
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
                        "final_mlm_accuracy": dp_model.get("final_mlm_accuracy"),
                        "clipped_fraction": dp_model.get("clipped_fraction"),
                        "diagnostics": dp_model.get("diagnostics"),
                        "non_dp_final_mlm_loss": non_dp_model.get(schema.FINAL_MLM_LOSS)},
        "ner": {"f1": ner.get(schema.F1), "per_type": ner.get(schema.PER_TYPE), "table": ner.get(schema.TABLE)},
        "canary": {"groups": canary.get(schema.GROUPS, []),
                   "audit_epsilon_lower_bound": canary.get(schema.AUDIT_EPSILON_LOWER_BOUND)},
    }
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
    if "components" in report:
        lines += ["", "components:"]
        for c in report["components"]:
            lines.append(f"  {c['id']:<28} {c['state']:<9} {c['duration_s']:>8.1f} s")
    for section in ("privacy", "vocab", "pretraining"):
        if not isinstance(report.get(section), dict):
            continue
        lines += ["", f"{section}:"]
        for k, v in report[section].items():
            if k != "loss_curve" and v is not None:
                lines.append(f"  {k:<24} {fmt(v)}")
    ner = report.get("ner") or {}
    if ner.get("f1") is not None:
        lines += ["", "ner:", f"  {'f1':<24} {fmt(ner['f1'])}"]
        for t, f1 in (ner.get("per_type") or {}).items():
            if isinstance(f1, dict):
                f1 = f1.get("f1")
            lines.append(f"  f1[{t}]{'':<{max(0, 19 - len(t))}} {fmt(f1)}")
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
    attacks = report.get("membership_inference_rows")
    if isinstance(attacks, list) and attacks:
        lines += ["", "membership inference:", "  attack                advantage    auc  bound"]
        for a in attacks:
            if isinstance(a, dict):
                lines.append(f"  {str(a.get('name', '')):<20} {fmt(a.get('advantage')):>9} {fmt(a.get('auc')):>6}"
                             f"  {fmt(a.get('advantage_bound'))}")
    return "\n".join(lines)
