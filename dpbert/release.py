"""The release boundary: what leaves the trust boundary, and the ε that covers each file.

ONE explicit list (``RELEASED``). Everything else a run writes stays with the operator:

released (DP-covered)                                     covered by
  DPVocabulary       vocab.txt, tokenizer.json, the noisy  ε_V (vocabulary record)
                     histogram of kept words, dp_event.json
  PretrainedModel    model/ (weights), tokenizer/,         ε_total (vocabulary + training: the
  (the DP model)     tensorboard/ (DP diagnostics only),   weights are trained on the DP vocabulary)
                     dp_events.json
  PrivacyReport      privacy_report.json,                  ε_total (it is a function of the
                     privacy_statement.txt                 records above and public parameters)
  CanaryReport       audit.json: the one-run audit of the  ε_total (computed from the released DP
                     DP model (written by ``write_bundle``  model and public canaries; the non-private
                     from the report's audit fields only)  baseline's exposures are NOT included)

operator-only (``private = 1`` on the artifact, never in a bundle): WordTuples (raw text), CanaryList
(canary secrets and insertion key), the non-private baseline model, MembershipReport (attack
scores on private rows), NerReport rows of the non-private model, the trainer's state directory
(exact training curves, checkpoints, keys), and any file of a released artifact not in the list
(``train_result.json``: exact diagnostics; ``run_config.json``).

``write_bundle`` copies the released files of one run into a directory with ``manifest.json``:
for every file its path, size, sha256 and the ε, δ, unit and adjacency that cover it — the ε of
the run's PrivacyReport (the accountant's), never a recomputed or planned value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from typing import Any, Dict, List, Optional

from dpbert import schema

MANIFEST_FILE = "manifest.json"


@dataclasses.dataclass(frozen=True)
class ReleasedPart:
    artifact_type: str       # short type name, e.g. "DPVocabulary"
    paths: tuple             # files or directories inside the artifact
    covered_by: str          # "epsilon_vocab" | "epsilon_total"
    bundle_dir: str          # where it goes in the bundle


#: The one list of what is released.
RELEASED = (
    ReleasedPart(schema.DP_VOCABULARY, ("vocab.txt", "tokenizer.json", "histogram.jsonl", "dp_event.json"),
                 "epsilon_vocab", "vocabulary"),
    ReleasedPart(schema.PRETRAINED_MODEL, (schema.MODEL_DIR, schema.TOKENIZER_DIR, schema.TENSORBOARD_DIR,
                                           schema.DP_EVENTS_FILE), "epsilon_total", "model"),
    ReleasedPart(schema.PRIVACY_REPORT, ("privacy_report.json", "privacy_statement.txt"), "epsilon_total",
                 "privacy"),
)
AUDIT_FIELDS = ("audit", "audit_epsilon_lower_bound", "audit_epsilon_upper_bound")


class ReleaseError(RuntimeError):
    """The run cannot be released (incomplete, non-private, or over budget)."""


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _released_artifact(run, short_type: str):
    for artifact in run.artifacts(schema.type_name(short_type)):
        if not artifact.private and not artifact.properties.get(schema.NON_PRIVATE):
            return artifact
    return None


def write_bundle(run, bundle_dir: str) -> Dict[str, Any]:
    """Copy the released files of ``run`` (a ``dpbert.metadata.RunInfo``) into ``bundle_dir`` and
    write the manifest. Returns the manifest. Refuses a run without a privacy report, a
    non-private run and a run over its budget."""
    report = _released_artifact(run, schema.PRIVACY_REPORT)
    if report is None:
        raise ReleaseError(f"run {run.run_id} has no privacy report: nothing can be released")
    ledger = report.properties
    if ledger.get("non_private") or ledger.get("epsilon_total_pld") in (None, float("inf")):
        raise ReleaseError(f"run {run.run_id} is not differentially private (ε = ∞): nothing to release")
    if ledger.get("within_budget") is False:
        raise ReleaseError(f"run {run.run_id} is over its privacy budget: refused")
    coverage = {
        "epsilon_vocab": {"epsilon": ledger.get("epsilon_vocab"), "delta": ledger.get("delta_vocab")},
        "epsilon_total": {"epsilon": ledger.get("epsilon_total_pld"), "delta": ledger.get("delta")},
    }
    unit, adjacency = ledger.get("unit", "tuple"), ledger.get("adjacency", "add_or_remove_one")
    if os.path.exists(bundle_dir) and os.listdir(bundle_dir):
        raise ReleaseError(f"{bundle_dir} exists and is not empty; choose a new bundle directory")
    os.makedirs(bundle_dir, exist_ok=True)
    files: List[Dict[str, Any]] = []

    def add(source: str, relative: str, covered_by: str):
        target = os.path.join(bundle_dir, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)
        files.append({"path": relative, "bytes": os.path.getsize(target), "sha256": _sha256(target),
                      "covered_by": covered_by, **coverage[covered_by], "unit": unit, "adjacency": adjacency})

    for part in RELEASED:
        artifact = _released_artifact(run, part.artifact_type)
        if artifact is None:
            continue
        for rel in part.paths:
            source = os.path.join(artifact.uri, rel)
            if os.path.isfile(source):
                add(source, os.path.join(part.bundle_dir, rel), part.covered_by)
            elif os.path.isdir(source):
                for root, _, names in os.walk(source):
                    for name in sorted(names):
                        path = os.path.join(root, name)
                        add(path, os.path.join(part.bundle_dir, os.path.relpath(path, artifact.uri)),
                            part.covered_by)
    canary = _released_artifact(run, schema.CANARY_REPORT)
    if canary is not None and canary.properties.get("audit") is not None:
        audit_path = os.path.join(bundle_dir, "audit", "audit.json")
        os.makedirs(os.path.dirname(audit_path), exist_ok=True)
        with open(audit_path, "w", encoding="utf-8") as f:
            f.write(schema.dumps({k: canary.properties.get(k) for k in AUDIT_FIELDS}, indent=2, sort_keys=True))
        files.append({"path": "audit/audit.json", "bytes": os.path.getsize(audit_path),
                      "sha256": _sha256(audit_path), "covered_by": "epsilon_total", **coverage["epsilon_total"],
                      "unit": unit, "adjacency": adjacency})
    manifest = {"run_id": run.run_id, "pipeline": run.pipeline, "unit": unit, "adjacency": adjacency,
                "epsilon": ledger.get("epsilon_total_pld"), "delta": ledger.get("delta"),
                "epsilon_vocab": ledger.get("epsilon_vocab"), "epsilon_train": ledger.get("epsilon_train"),
                "files": files}
    with open(os.path.join(bundle_dir, MANIFEST_FILE), "w", encoding="utf-8") as f:
        f.write(schema.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def released_view(report: Dict[str, Any]) -> Dict[str, Any]:
    """``dpbert report --released``: the report without operator-only sections."""
    out = {k: v for k, v in report.items() if k not in ("membership_inference", "membership_inference_rows")}
    if "pretraining" in out:
        out["pretraining"] = {k: v for k, v in out["pretraining"].items() if not k.startswith("non_dp")}
    if "canary" in out:
        out["canary"] = {"audit_epsilon_lower_bound": out["canary"].get("audit_epsilon_lower_bound")}
    if "ner" in out and isinstance(out["ner"], dict):
        out["ner"] = {k: v for k, v in out["ner"].items() if k != "table"}
    return out


def bundle_files(bundle_dir: str) -> Optional[List[str]]:
    """Every file under a bundle (for tests and the CLI's summary)."""
    out = []
    for root, _, names in os.walk(bundle_dir):
        out.extend(os.path.relpath(os.path.join(root, n), bundle_dir) for n in names)
    return sorted(out)
