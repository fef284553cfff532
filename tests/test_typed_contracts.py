"""Typed contracts: a field of a configuration or plan dataclass is read as an attribute, never as
``getattr(obj, "<field>", default)``.

A three-argument ``getattr`` on a dataclass hides two bugs: a default written a second time (it
drifts from the dataclass's own), and an object of the wrong type passing silently. So the scan
below (``ast`` over the shipped tree) forbids it for every field name of the dataclasses in
``dpbert/config.py``, of ``TrainingPlan`` and of ``DiagnosticsConfig``; every other
three-argument ``getattr`` (on objects that are not those dataclasses: argparse namespaces, Keras
layers, duck-typed tuples) is in ``ALLOWLIST`` with its reason, keyed by file and attribute. An
entry that no longer occurs fails, so the list stays true. Positive control: the scan flags a
synthetic ``getattr(plan, "unit", "tuple")``.
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Dict, FrozenSet, List, NamedTuple, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("dpbert", "dpbert_cli", "components", "pipeline", "kubeflow", "dashboard", "beam_jobs", "benchmarks")
#: An attribute name that is not a string literal (``getattr(obj, name, default)``).
DYNAMIC = "<dynamic>"

_ARGS = "argparse namespace shared by subcommands: not every subcommand defines the option"
#: (file, attribute) → why a three-argument getattr is right there. Not a config or plan object.
ALLOWLIST: Dict[Tuple[str, str], str] = {
    # argparse namespaces
    ("dpbert/diagnostics/noise_check.py", "seed"): _ARGS,
    ("dpbert/diagnostics/noise_check.py", "noise_mode"): _ARGS,
    ("dpbert/diagnostics/noise_check.py", "workers"): _ARGS,
    ("dpbert/diagnostics/noise_check.py", "timeout"): _ARGS,
    ("dpbert/diagnostics/noise_check.py", "json"): _ARGS,
    ("dpbert_cli/commands.py", "corpus"): _ARGS,
    ("dpbert_cli/commands.py", "output"): _ARGS,
    ("dpbert_cli/commands.py", "no_cache"): _ARGS,
    ("dpbert_cli/commands.py", "command"): _ARGS,
    ("dpbert_cli/commands.py", "same_corpus_as"): _ARGS,
    ("dpbert_cli/commands.py", "pipeline_root"): _ARGS,
    ("dpbert_cli/commands.py", "unit"): _ARGS,
    ("dpbert_cli/commands.py", "target"): _ARGS,
    ("dpbert_cli/commands.py", "check_corpus"): _ARGS,
    ("dpbert_cli/dashboard.py", "ledger"): _ARGS,
    ("dpbert_cli/privatize.py", "json"): _ARGS,
    ("dpbert_cli/export.py", "public_checkpoint"): _ARGS,
    ("dpbert_cli/export.py", "no_public_positions"): _ARGS,
    ("dpbert_cli/tune.py", "tuned_at"): _ARGS,
    ("dpbert_cli/tune.py", "overrides"): _ARGS,
    # the DP-SGD stepper (or a test's stand-in): its worker layout exists only once built
    ("dpbert/engine/loop.py", "workers"): "the stepper or a test's stand-in; one worker without a layout",
    ("dpbert/mechanism/integrity.py", "workers"): "the stepper or a test's stand-in; one worker without a layout",
    ("dpbert/mechanism/integrity.py", "selection"): "the stepper's trainable selection, absent on a stand-in",
    ("dpbert/mechanism/integrity.py", "pieces"): "the selection's pieces, absent when nothing is selected",
    ("dpbert/mechanism/integrity.py", "noise_probe"): "set on the stepper by the noise check only",
    ("dpbert/mechanism/integrity.py", "_integrity_checks_made"): "a counter the check sets on the stepper itself",
    ("dpbert/mechanism/integrity.py", "_integrity_clip_fn"): "a cached tf.function the check sets on the stepper",
    ("dpbert/mechanism/integrity.py", "_dropout"): "Keras MultiHeadAttention's private dropout rate",
    ("dpbert/mechanism/clipping.py", "_expects_training_arg"): "Keras layer internals (not every layer sets it)",
    ("dpbert/mechanism/replicas.py", "cluster_resolver"): "tf.distribute strategies without a cluster have none",
    ("dpbert/engine/progress.py", "isatty"): "any file-like stream",
    ("dpbert/engine/loop.py", "needs_read"): "a hook protocol method hooks may leave out",
    ("dpbert/mechanism/ghost.py", "bias"): "Keras layers with or without a bias",
    ("dpbert/mechanism/ghost.py", "sparse"): "Keras embedding internals",
    ("dpbert/mechanism/ghost.py", "_use_one_hot_matmul"): "Keras embedding internals (newer Keras only)",
    ("dpbert/mechanism/ghost.py", "_expects_training_arg"): "Keras layer internals (not every layer sets it)",
    ("dpbert/evaluate/membership.py", "_expects_training_arg"): "Keras layer internals (not every layer sets it)",
    ("dpbert/network/trainable.py", "bias"): "Keras layers with or without a bias",
    ("dpbert/network/trainable.py", "lora"): "the model set has LoRA adapters only when built with them",
    ("benchmarks/dpsgd_step.py", "_noise_buffers"): "the stepper's noise prefetch, absent in other noise modes",
    # duck-typed records: a WordTuple or a plain list of words / a tuple without patient ids
    ("dpbert/data/splits.py", "patient_id"): "WordTuple or a tuple-like record without patient ids",
    ("dpbert/data/splits.py", "admission_id"): "WordTuple or a tuple-like record without admission ids",
    ("dpbert/stages/pretrain.py", "patient_id"): "WordTuple read from a corpus without patient ids",
    ("dpbert/vocab/wordpiece.py", "words"): "a WordTuple or its plain list of words",
    ("dpbert/vocab/wordpiece.py", "encode_batch_fast"): "tokenizers >= 0.20 only",
    ("dpbert/vocab/beam_histogram.py", "words"): "a WordTuple or its plain list of words",
    ("dpbert/vocab/beam_histogram.py", "patient_id"): "a WordTuple or a plain element without one",
    ("dpbert/vocab/beam_histogram.py", "doc_id"): "a WordTuple or a plain element without one",
    ("dpbert/vocab/beam_histogram.py", "index"): "a WordTuple or a plain element without one",
    # other libraries' objects
    ("dpbert/config.py", "problem_mark"): "PyYAML errors carry a mark only when parsing got that far",
    ("dpbert/config.py", "problem"): "PyYAML error subclasses without a problem text",
    ("dpbert/storage/api.py", "pos"): "json.JSONDecodeError has pos, UnicodeDecodeError start",
    ("dpbert/storage/api.py", "start"): "json.JSONDecodeError has pos, UnicodeDecodeError start",
    ("dpbert/schema.py", "tolist"): "numpy values (duck-typed: schema imports no numpy)",
    ("dpbert/schema.py", "item"): "array-likes' scalars (duck-typed)",
    ("dashboard/app.py", "headers"): "Starlette HTTPException subclasses with or without headers",
}


class Hit(NamedTuple):
    path: str
    attr: str
    line: int
    obj: str


def three_argument_getattrs(source: str, path: str) -> List[Hit]:
    """Every ``getattr(obj, name, default)`` in ``source`` (attribute ``DYNAMIC`` when not a literal)."""
    hits = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) == 3:
            name = node.args[1]
            attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else DYNAMIC
            hits.append(Hit(path, attr, node.lineno, ast.unparse(node.args[0])))
    return hits


def forbidden(hits: List[Hit], fields: FrozenSet[str], allowlist=ALLOWLIST) -> List[Hit]:
    """The hits on a field name (or a dynamic name) that the allowlist does not excuse."""
    return [h for h in hits if (h.attr in fields or h.attr == DYNAMIC) and (h.path, h.attr) not in allowlist]


def _dataclass_names(path: Path) -> List[str]:
    """The classes of ``path`` decorated ``@dataclass`` / ``@dataclasses.dataclass(...)``."""
    def is_dataclass(d):
        d = d.func if isinstance(d, ast.Call) else d
        return (isinstance(d, ast.Name) and d.id == "dataclass") or \
            (isinstance(d, ast.Attribute) and d.attr == "dataclass")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, ast.ClassDef) and any(map(is_dataclass, n.decorator_list))]


def contract_fields() -> FrozenSet[str]:
    """The field names of every configuration dataclass, the training plan and the diagnostics settings."""
    from dpbert import config
    from dpbert.privacy import diagnostics, plan

    classes = [getattr(config, name) for name in _dataclass_names(ROOT / "dpbert/config.py")]
    classes += [plan.TrainingPlan, diagnostics.DiagnosticsConfig]
    assert config.TrainingConfig in classes and config.ModelConfig in classes and len(classes) > 10
    return frozenset(f.name for cls in classes for f in dataclasses.fields(cls))


@pytest.fixture(scope="module")
def shipped_hits() -> List[Hit]:
    hits = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "getattr" in text:
                hits += three_argument_getattrs(text, path.relative_to(ROOT).as_posix())
    return hits


def test_no_getattr_default_on_a_config_or_plan_field(shipped_hits):
    bad = forbidden(shipped_hits, contract_fields())
    assert bad == [], "read these fields as attributes (fix the type at the boundary): " + "; ".join(
        f"{h.path}:{h.line} getattr({h.obj}, {h.attr!r}, …)" for h in bad)


def test_every_other_three_argument_getattr_is_allowlisted_with_a_reason(shipped_hits):
    missing = sorted({(h.path, h.attr) for h in shipped_hits} - set(ALLOWLIST))
    assert missing == [], f"a three-argument getattr without an ALLOWLIST entry (file, attribute): {missing}"
    assert all(isinstance(r, str) and r.strip() for r in ALLOWLIST.values())


def test_every_allowlist_entry_still_occurs(shipped_hits):
    stale = sorted(set(ALLOWLIST) - {(h.path, h.attr) for h in shipped_hits})
    assert stale == [], f"remove these ALLOWLIST entries (the getattr is gone): {stale}"


def test_the_scan_flags_a_getattr_default_on_a_plan_field():
    hits = three_argument_getattrs('def f(plan):\n    return getattr(plan, "unit", "tuple") == "patient"\n', "x.py")
    assert hits == [Hit("x.py", "unit", 2, "plan")]
    assert forbidden(hits, contract_fields(), allowlist={}) == hits
    assert forbidden(hits, frozenset({"steps"}), allowlist={}) == []  # not a field: the other test's concern
    assert forbidden(three_argument_getattrs("getattr(o, name, 1)\ngetattr(o, 'unit')\n", "y.py"),
                     frozenset(), allowlist={}) == [Hit("y.py", DYNAMIC, 1, "o")]


# ------------------------------------------------------------------ the diagnostics' defaults
def test_the_diagnostics_defaults_are_the_training_configs():
    """One definition (``TrainingConfig``): ``DiagnosticsConfig`` derives its defaults from it, and
    the configuration reference documents the same values. No shipped YAML sets them."""
    import re

    from dpbert.config import TrainingConfig
    from dpbert.privacy.diagnostics import DiagnosticsConfig, config_of

    assert DiagnosticsConfig() == config_of(TrainingConfig()) == DiagnosticsConfig(True, 8.0, 12.0)
    docs = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    for field in ("dp_diagnostics", "diagnostics_noise_ratio", "diagnostics_loss_bound"):
        shown = re.search(rf"\| `training\.{field}` \| `([^`]+)` \|", docs)
        assert shown, f"docs/configuration.md documents training.{field}"
        default = getattr(TrainingConfig, field)
        assert shown.group(1) == (str(default).lower() if isinstance(default, bool) else repr(default))
    for path in sorted((ROOT / "dpbert/configs").glob("*.yaml")):
        assert "diagnostics" not in path.read_text(encoding="utf-8"), f"{path.name}: a second copy of a default"


# ------------------------------------------------------------------ the run report
#: A report document with every section (``RunReport.to_json``'s shape, key order included).
FULL_REPORT = {
    "run_id": "r1", "pipeline": "dpbert-demo", "status": "COMPLETE", "duration_s": 12.5,
    "components": [{"id": "MLMPretrainer", "state": "COMPLETE", "duration_s": 3.0}],
    "privacy": {"epsilon_vocab": 1.2, "epsilon_train": 6.5, "epsilon_total_basic": 7.7, "epsilon_total_pld": 7.1,
                "epsilon_total_rdp": 7.4, "delta": 2.000001e-06, "delta_vocab": 1e-09, "delta_train": 2e-06,
                "unit": "patient", "adjacency": "add_or_remove_one", "sampling": "poisson", "steps": 40,
                "epsilon_budget": 8.0, "within_budget": 1, "epsilon_vocab_approx": True,
                "dataset_epsilon_spent": 7.3, "dataset_rule": "rdp_filter"},
    "vocab": {"size": 900, "words_kept": 120, "sigma": 2.0, "threshold": 12.5, "epsilon": 1.2, "non_private": 0},
    "pretraining": {"steps": 40, "workers": 2, "final_mlm_loss": 6.9, "initial_mlm_loss": 8.9,
                    "loss_curve": [8.9, None, float("inf"), 6.9], "loss_curve_steps": [1, 2, 3, 40],
                    "final_mlm_accuracy": 0.1, "clipped_fraction": 0.9, "diagnostics": "dp",
                    "diagnostics_step_noise_std": {"loss": 4.8}, "diagnostics_window": 4,
                    "diagnostics_sum_noise_std": {"loss": 76.8}, "expected_batch_size": 16, "steps_this_run": 40,
                    "released_batch_size_mean": 15.2,
                    "trainable": {"sets": ["bias", "lora"], "parameters": 10, "total_parameters": 100,
                                  "lora_merged": True},
                    "non_dp_final_mlm_loss": 4.8},
    "ner": {"f1": 0.71, "per_type": {"Chemical": {"f1": 0.8, "support": 3}}, "table": [["model", "f1"], ["dp", 0.7]],
            "mode": "probe", "task": "bc5cdr", "seeds": 3},
    "canary": {"groups": [{"group": "x1", "occurrences": 1, "exposure_dp": {"n": 2, "mean": 1.5}}],
               "audit_epsilon_lower_bound": 0.3, "audit_max_reachable_lower_bound": 2.9,
               "baseline_audit_epsilon_lower_bound": None},
    "corpus": {"operator_only": True, "documents": 10, "patients": 4, "tuples": 480, "words": 5000, "tuple_words": 8,
               "skipped_error_rows": 0, "skipped_empty_documents": 1, "replaced_bytes": 5, "corpus_bytes": 1000,
               "replaced_fraction": 0.005, "words_per_document": 500.0},
    "warnings": [{"section": "corpus", "code": "tiny_corpus", "message": "the corpus holds few words"}],
    "dataset": {"dataset_id": "ds", "ledger": "/l/ds.json", "epsilon_spent": 7.3, "epsilon_rdp": 7.3,
                "epsilon_pld": 7.1, "delta": 2e-06, "epsilon_budget": 8.0, "rule": "rdp_filter",
                "rule_label": "Rényi filter at the committed order(s)", "within_budget": 1, "run_epsilon": 7.1},
    "utility": {"rows": {"dp": {"heldout_mlm_loss": 6.0, "heldout_mlm_accuracy": 0.2, "ner_f1_mean": 0.7,
                                "ner_f1_std": 0.01, "ner_synthetic_f1_mean": None, "ner_synthetic_f1_std": None}},
                "reference": "dp", "ner_seeds": 3.0, "ner_mode": "probe", "ner_task": "bc5cdr",
                "gain_kept_mlm_loss": None, "gain_kept_mlm_loss_std": None, "gain_kept_ner_f1": 0.5,
                "gain_kept_ner_f1_std": 0.1, "gain_kept_ner_synthetic_f1": None, "gain_kept_ner_synthetic_f1_std": None,
                "gain_kept_mlm_loss_reason": "no public row", "uncertainty": "std over seeds"},
    "audit": {"epsilon_lower_bound": 0.3, "epsilon_upper_bound": 5.0, "epsilon_train_ledger": 6.5,
              "max_reachable_lower_bound": 5.5, "consistent": 1, "canaries": 1000, "confidence": 0.95,
              "delta": 2e-06, "steps": 40, "q": 0.1, "positive_control_lower_bound": 5.5,
              "positive_control_exceeds_upper_bound": 1, "seconds": 12.0},
    "charged": {"epsilon_charged": 3.0, "delta": 1e-06, "steps_charged": 20, "budget_refused": True,
                "epsilon_budget": 8.0},
    "interrupted": {"component": "MLMPretrainer", "step": 21, "checkpoint_step": 20},
    "membership_inference": {"dp": {"S-BBA": {"advantage": 0.02, "auc": 0.51}}},
    "membership_inference_rows": [{"name": "S-BBA (DP)", "advantage": 0.02, "auc": 0.51, "fpr": [0, 1],
                                   "tpr": [0, 1]}],
}


def test_the_report_document_is_the_typed_reports_json_every_section_and_key_order():
    from dpbert import schema
    from dpbert.report_model import RunReport

    report = RunReport.from_json(FULL_REPORT)
    assert schema.dumps(report.to_json()) == schema.dumps(FULL_REPORT)  # the same document, key order included
    assert report.privacy.within_budget is True and report.privacy.approximate == {"epsilon_vocab"}
    assert report.pretraining.trainable.lora_merged and report.membership.attacks()[0].fpr == (0.0, 1.0)
    assert report.dataset.rule_label == FULL_REPORT["dataset"]["rule_label"] and report.audit.powerful
    # typed: a value of the wrong type is not carried (a string where a number belongs reads None)
    odd = RunReport.from_json(dict(FULL_REPORT, privacy={"epsilon_total_pld": "abc", "unit": 3}))
    assert odd.privacy.epsilon_total_pld is None and odd.privacy.unit is None
    assert RunReport.from_json({}).to_json()["corpus"] is None  # a partial document: absent sections


def test_the_reader_reads_a_legacy_run_with_its_older_properties(tmp_path):
    """tests/dashboard/data/tiny_run.sqlite was written before the exact strings, loss_curve_steps,
    workers, trainable and the dataset's ledger: each field falls back as report_model says."""
    import shutil

    from dpbert import metadata
    from dpbert.report_model import RunReport, read_report

    shutil.copy(ROOT / "tests/dashboard/data/tiny_run.sqlite", tmp_path / "metadata.sqlite")
    run = metadata.get_run(metadata.open_store(str(tmp_path / "metadata.sqlite")))
    report = read_report(run)
    model = next(a.properties for a in run.artifacts("components.PretrainedModel"))
    assert "loss_curve_steps" not in model and "workers" not in model
    first, n = model.get("resumed_from_step") or 0, model["steps_this_run"]
    assert report.pretraining.loss_curve_steps[-1] == first + n  # derived from the run's steps
    assert {"epsilon_total_pld", "delta"} <= report.privacy.approximate  # rounded doubles, flagged
    assert report.pretraining.workers is None and report.pretraining.trainable is None and report.dataset is None
    assert report.corpus.tuples == next(a.properties for a in run.artifacts("components.WordTuples"))["num_tuples"]
    doc = report.to_json()
    assert RunReport.from_json(doc).to_json() == doc


def report_lookups(source: str) -> List[int]:
    """Lines where ``source`` reads a report as a dict: ``report.get(…)``, ``report[…]``, or the
    same on one of its sections (``report.pretraining.get(…)``)."""
    def on_report(node) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id == "report"

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and on_report(node.func.value):
            out.append(node.lineno)
        elif isinstance(node, ast.Subscript) and on_report(node.value):
            out.append(node.lineno)
    return out


def test_the_dashboard_renders_the_typed_report_by_attribute():
    for path in ("dashboard/views.py", "dashboard/app.py"):
        assert report_lookups((ROOT / path).read_text(encoding="utf-8")) == [], path


def test_the_lookup_scan_flags_a_report_read_as_a_dict():
    assert report_lookups("def f(report):\n    return report.get('privacy')\n") == [2]
    assert report_lookups("def f(report):\n    return report.pretraining['steps']\n") == [2]
    assert report_lookups("def f(report):\n    return report.pretraining.steps\n") == []
