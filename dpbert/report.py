"""The run report: one JSON object built from ML Metadata custom properties.

`dpbert report --json` prints it; the dashboard's JSON API serves the same object. Only
properties are read (never private artifact files), so the report can hold no raw text, exact
count or canary secret.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from dpbert.metadata import RunInfo


def _props(run: RunInfo, type_name: str, key: Optional[str] = None, where=None) -> Dict[str, Any]:
    for artifact in run.artifacts(type_name, key):
        if where is None or where(artifact.properties):
            return artifact.properties
    return {}


def build_report(run: RunInfo) -> Dict[str, Any]:
    ledger = _props(run, "components.PrivacyReport")
    vocab = _props(run, "components.DPVocabulary")
    dp_model = _props(run, "components.PretrainedModel", where=lambda p: not p.get("non_private"))
    non_dp_model = _props(run, "components.PretrainedModel", where=lambda p: bool(p.get("non_private")))
    ner = _props(run, "components.NerReport")
    canary = _props(run, "components.CanaryReport")
    mia = _props(run, "components.MembershipReport")
    report: Dict[str, Any] = {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": run.status,
        "duration_s": round(run.duration_s, 1),
        "components": [{"id": c.node_id, "state": c.state, "duration_s": round(c.duration_s, 1)}
                       for c in run.components],
        "privacy": {k: ledger.get(k) for k in (
            "epsilon_vocab", "epsilon_train", "epsilon_total_basic", "epsilon_total_pld",
            "epsilon_total_rdp", "delta", "delta_vocab", "delta_train", "unit", "sampling", "steps",
            "epsilon_budget", "within_budget")},
        "vocab": {"size": vocab.get("vocab_size"), "words_kept": vocab.get("words_kept"),
                  "sigma": vocab.get("sigma"), "threshold": vocab.get("threshold"),
                  "epsilon": vocab.get("epsilon"), "non_private": vocab.get("non_private")},
        "pretraining": {"steps": dp_model.get("steps_taken_total"),
                        "final_mlm_loss": dp_model.get("final_mlm_loss"),
                        "initial_mlm_loss": dp_model.get("initial_mlm_loss"),
                        "loss_curve": dp_model.get("loss_curve"),
                        "non_dp_final_mlm_loss": non_dp_model.get("final_mlm_loss")},
        "ner": {"f1": ner.get("f1"), "per_type": ner.get("per_type"), "table": ner.get("table")},
        "canary": {"groups": canary.get("groups", []),
                   "audit_epsilon_lower_bound": canary.get("audit_epsilon_lower_bound")},
    }
    if mia:
        # The contract: {"dp"|"non_dp": {attack: {"advantage", "auc"}}}; rows (with ROC curves and
        # the advantage bound) for tables and the dashboard.
        attacks_by_model = mia.get("attacks")
        report["membership_inference"] = {
            model: {name: {"advantage": m.get("advantage"), "auc": m.get("auc")}
                    for name, m in attacks.items() if isinstance(m, dict)}
            for model, attacks in attacks_by_model.items() if isinstance(attacks, dict)
        } if isinstance(attacks_by_model, dict) else attacks_by_model
        report["membership_inference_rows"] = membership_rows(mia.get("attacks"), mia.get("roc_curves"), ledger)
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
    eps, delta = ledger.get("epsilon_total_pld"), ledger.get("delta")
    if isinstance(eps, (int, float)) and isinstance(delta, (int, float)) and ledger.get("unit") == "tuple":
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
    """A readable table of the report."""
    def fmt(v):
        if isinstance(v, float):
            return "inf" if v == float("inf") else f"{v:.4g}"
        return "-" if v is None else str(v)

    lines = [f"run {report['run_id']}  ({report['pipeline']}, {report['status']}, {report['duration_s']} s)", ""]
    lines.append("components:")
    for c in report["components"]:
        lines.append(f"  {c['id']:<28} {c['state']:<9} {c['duration_s']:>8.1f} s")
    for section in ("privacy", "vocab", "pretraining"):
        lines += ["", f"{section}:"]
        for k, v in report[section].items():
            if k != "loss_curve" and v is not None:
                lines.append(f"  {k:<24} {fmt(v)}")
    if report["ner"].get("f1") is not None:
        lines += ["", "ner:", f"  {'f1':<24} {fmt(report['ner']['f1'])}"]
        for t, f1 in (report["ner"].get("per_type") or {}).items():
            lines.append(f"  f1[{t}]{'':<{max(0, 19 - len(t))}} {fmt(f1)}")
    if report["canary"]["groups"]:
        lines += ["", "canary exposure:", "  pattern  occurrences  exposure_dp  exposure_non_dp"]
        for g in report["canary"]["groups"]:
            lines.append(f"  {g.get('pattern', ''):<8} {fmt(g.get('occurrences')):>11}  "
                         f"{fmt(g.get('exposure_dp')):>11}  {fmt(g.get('exposure_non_dp')):>15}")
        lines.append(f"  audit ε lower bound: {fmt(report['canary']['audit_epsilon_lower_bound'])}")
    attacks = report.get("membership_inference_rows")
    if isinstance(attacks, list) and attacks:
        lines += ["", "membership inference:", "  attack                advantage    auc  bound"]
        for a in attacks:
            if isinstance(a, dict):
                lines.append(f"  {str(a.get('name', '')):<20} {fmt(a.get('advantage')):>9} {fmt(a.get('auc')):>6}"
                             f"  {fmt(a.get('advantage_bound'))}")
    return "\n".join(lines)
