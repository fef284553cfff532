"""The run report as typed, frozen objects, read once from a run's ML Metadata properties.

``read_report(run)`` is THE reader of a run's artifacts for the report: every section is built
here from the typed custom properties (``dpbert.properties``; never from artifact files, so it holds no raw text or canary
secret). ``RunReport.to_json()`` is the document ``dpbert report --json`` prints and the
dashboard's JSON API serves; ``RunReport.from_json`` reads such a document back (a renderer given
one: a test, the API's consumer). The text report (``dpbert.report``) and the dashboard's views
render the object by attribute.

Versions: the properties grew with the DAG, and a run keeps the properties of the code that wrote
it. Each field reads the newest property and falls back for runs written before it: a ledger
without the exact strings (``<name>__exact``) reads the rounded double flagged approximate
(``PrivacySection.approximate``); a model without ``loss_curve_steps`` gets them derived from
``steps_this_run`` and ``resumed_from_step`` (else none); without ``workers``,
``diagnostics_batch_size_mean`` or ``trainable``, None; a PrivacyReport without
``dataset_ledger`` has its dataset's ledger resolved from the component's ``ledger_target``; a
MembershipReport of another shape than ``{"dp"|"non_dp": {attack: {...}}}`` is kept as stored
(``MembershipSection.legacy``) and shown by ``attacks()``.

Exact counts of the private corpus appear in ONE section, ``corpus`` (operator-only), with the
warnings computed from them; ``dpbert.release.released_view`` (an allow-list of the JSON
document) never carries either.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

from dpbert import schema
from dpbert.properties import (AuditReportProperties, CanaryReportProperties, ModelProperties, NerReportProperties,
                               PrivacyReportProperties, VocabularyProperties, WordTuplesProperties, read_properties)
from dpbert.metadata import (BUDGET_REFUSED_PROPERTY, DELTA_CHARGED, EPSILON_BUDGET, EPSILON_CHARGED,
                             INTERRUPTED_CHECKPOINT_STEP, INTERRUPTED_COMPONENT, INTERRUPTED_PROPERTY,
                             INTERRUPTED_STEP, STEPS_CHARGED, RunInfo)

Number = Union[int, float]
_frozen = dataclasses.dataclass(frozen=True)


# --------------------------------------------------------------------------- property values
def _number(value: Any) -> Optional[Number]:
    """An int or float as stored ("inf" / "-inf" / "nan" decoded), else None (a bool is no number)."""
    if isinstance(value, str):
        value = schema.decode(value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> Optional[float]:
    value = _number(value)
    return None if value is None else float(value)


def _flag(value: Any) -> Optional[bool]:
    """A flag stored as an int (MLMD has no bool), a bool or a string; None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def _int_flag(value: Optional[bool]) -> Optional[int]:
    """A flag as the JSON document writes it: MLMD's int."""
    return None if value is None else int(value)


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        value = schema.decode_string_property(value)
    return value if isinstance(value, Mapping) else {}


def _numbers(value: Any) -> Optional[Dict[str, Number]]:
    """``{part: number}`` of a dict property (non-numbers dropped); None when not a dict."""
    if not isinstance(value, Mapping):
        return None
    return {str(k): v for k, v in ((k, _number(v)) for k, v in value.items()) if v is not None}


def summary_number(value: Any) -> Optional[float]:
    """A number, or a summary's ``mean`` (``{"n", "mean", "std"}``: canary exposures)."""
    if isinstance(value, Mapping):
        value = value.get("mean")
    return _float(value)


# --------------------------------------------------------------------------- privacy
#: The ledger properties the ``privacy`` section shows (same keys).
LEDGER_KEYS = (schema.EPSILON_VOCAB, schema.EPSILON_TRAIN, schema.EPSILON_TOTAL_BASIC,
               schema.EPSILON_TOTAL_PLD, schema.EPSILON_TOTAL_RDP, schema.DELTA, schema.DELTA_VOCAB,
               schema.DELTA_TRAIN, schema.UNIT, "adjacency", schema.SAMPLING, schema.STEPS,
               schema.EPSILON_BUDGET, schema.WITHIN_BUDGET)
#: The dataset's figures the accountant stores on the PrivacyReport (``dpbert.stages.accountant``):
#: the budget gate's verdict over EVERY run on the dataset, this one included. Kept in the
#: ``privacy`` section (released with it: functions of public parameters and DP events).
DATASET_KEYS = ("dataset_epsilon_spent", "dataset_epsilon_rdp", "dataset_epsilon_pld", "dataset_delta",
                "dataset_epsilon_budget", "dataset_rule")
_LEDGER_TEXTS = (schema.UNIT, "adjacency", schema.SAMPLING)


@_frozen
class PrivacySection:
    """The privacy ledger (the PrivacyReport's properties; released)."""

    epsilon_vocab: Optional[Number] = None
    epsilon_train: Optional[Number] = None
    epsilon_total_basic: Optional[Number] = None
    epsilon_total_pld: Optional[Number] = None
    epsilon_total_rdp: Optional[Number] = None
    delta: Optional[Number] = None
    delta_vocab: Optional[Number] = None
    delta_train: Optional[Number] = None
    unit: Optional[str] = None
    adjacency: Optional[str] = None
    sampling: Optional[str] = None
    steps: Optional[Number] = None
    epsilon_budget: Optional[Number] = None
    within_budget: Optional[bool] = None
    #: The keys read from a rounded double without its exact string (a run written before them).
    approximate: FrozenSet[str] = frozenset()
    dataset_epsilon_spent: Optional[Number] = None
    dataset_epsilon_rdp: Optional[Number] = None
    dataset_epsilon_pld: Optional[Number] = None
    dataset_delta: Optional[Number] = None
    dataset_epsilon_budget: Optional[Number] = None
    dataset_rule: Optional[str] = None
    #: The privacy statement (the dashboard's ledger shows it; not in the JSON document).
    statement: Optional[str] = None

    @classmethod
    def from_json(cls, values: Any) -> "PrivacySection":
        """From the PrivacyReport's properties or the document's ``privacy`` section (same keys)."""
        values = _mapping(values)
        numbers = [k for k in LEDGER_KEYS + DATASET_KEYS if k not in _LEDGER_TEXTS + (schema.WITHIN_BUDGET,
                                                                                       "dataset_rule")]
        return cls(**{k: _number(values.get(k)) for k in numbers},
                   **{k: _text(values.get(k)) for k in _LEDGER_TEXTS + ("dataset_rule", schema.STATEMENT)},
                   within_budget=_flag(values.get(schema.WITHIN_BUDGET)),
                   approximate=frozenset(k for k in LEDGER_KEYS if values.get(k + schema.APPROX_SUFFIX)))

    @classmethod
    def from_properties(cls, ledger: PrivacyReportProperties) -> "PrivacySection":
        """From the PrivacyReport's typed properties (``dpbert.properties``)."""
        return cls(**{k: getattr(ledger, k) for k in LEDGER_KEYS + DATASET_KEYS}, statement=ledger.statement,
                   approximate=ledger.approximate & frozenset(LEDGER_KEYS))

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {k: getattr(self, k) for k in LEDGER_KEYS}
        out[schema.WITHIN_BUDGET] = _int_flag(self.within_budget)
        out.update({k + schema.APPROX_SUFFIX: True for k in LEDGER_KEYS if k in self.approximate})
        out.update({k: getattr(self, k) for k in DATASET_KEYS if getattr(self, k) is not None})
        return out

    def text(self, key: str, fmt, delta_fmt=None) -> str:
        """``schema.privacy_number_text`` of one ledger value ("≈" in front when approximate)."""
        return schema.privacy_number_text(self.to_json(), key, fmt, delta_fmt)


# --------------------------------------------------------------------------- vocabulary
@_frozen
class VocabSection:
    """The DP vocabulary's size, ε and its histogram's σ and threshold (released unless non-private)."""

    size: Optional[Number] = None
    words_kept: Optional[Number] = None
    sigma: Optional[Number] = None
    threshold: Optional[Number] = None
    epsilon: Optional[Number] = None
    non_private: Optional[bool] = None
    #: ``vocab.source`` of the run (dp | public | public+dp); not in the JSON document.
    source: Optional[str] = None

    @classmethod
    def from_properties(cls, vocab: VocabularyProperties) -> "VocabSection":
        return cls(size=vocab.vocab_size, words_kept=vocab.words_kept, sigma=vocab.sigma, threshold=vocab.threshold,
                   epsilon=vocab.epsilon, non_private=vocab.non_private, source=vocab.vocab_source)

    @classmethod
    def from_json(cls, values: Any) -> "VocabSection":
        values = _mapping(values)
        return cls(**{k: _number(values.get(k)) for k in ("size", "words_kept", "sigma", "threshold", "epsilon")},
                   non_private=_flag(values.get("non_private")), source=_text(values.get("source")))

    def to_json(self) -> Dict[str, Any]:
        return {"size": self.size, "words_kept": self.words_kept, "sigma": self.sigma, "threshold": self.threshold,
                "epsilon": self.epsilon, "non_private": _int_flag(self.non_private)}


# --------------------------------------------------------------------------- pretraining
#: The model artifact's property with the mean of the RELEASED (noisy) per-step batch sizes (a DP
#: value: post-processing of the released sums). Written by the trainer stage; absent in older runs.
RELEASED_BATCH_SIZE = "diagnostics_batch_size_mean"
#: The model artifact's property saying what DP-SGD trained (``TrainResult.trainable``: ``sets``,
#: ``parameters``, ``total_parameters``; public: the configuration and the model's shape).
TRAINABLE = "trainable"


@_frozen
class Trainable:
    """What DP-SGD trained. LoRA adapters are always folded into the released weights
    (``bert.merge_lora``), so ``lora_merged`` is whether the sets have ``lora``."""

    sets: Tuple[str, ...]
    parameters: Optional[int] = None
    total_parameters: Optional[int] = None

    @property
    def lora_merged(self) -> bool:
        return "lora" in self.sets

    @classmethod
    def from_json(cls, value: Any) -> Optional["Trainable"]:
        """From the ``trainable`` property (a dict, or its JSON text) or the document's; None when
        the trainer did not record it."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return None
        if not isinstance(value, Mapping) or not isinstance(value.get("sets"), list):
            return None

        def count(key):
            v = _number(value.get(key))
            return None if v is None else int(v)

        return cls(tuple(str(x) for x in value["sets"]), count("parameters"), count("total_parameters"))

    def to_json(self) -> Dict[str, Any]:
        return {"sets": list(self.sets), "parameters": self.parameters, "total_parameters": self.total_parameters,
                "lora_merged": self.lora_merged}

    def text(self) -> str:
        """``bias, head (190,000 of 27,000,000 parameters)``, and that LoRA adapters were merged."""
        text = ", ".join(self.sets)
        if self.parameters is not None:
            text += f" ({self.parameters:,}" + (f" of {self.total_parameters:,}" if self.total_parameters else "") \
                + " parameters)"
        if self.lora_merged:
            text += "; LoRA adapters merged into the released weights"
        return text


def _curve_point(point: Any) -> Optional[float]:
    return _float(point.get("loss") if isinstance(point, Mapping) else point)


def _curve(value: Any) -> Optional[Tuple[Optional[float], ...]]:
    """A loss curve (numbers, or ``{"step", "loss"}`` points): each point a float or None."""
    return tuple(_curve_point(p) for p in value) if isinstance(value, list) else None


def _steps(value: Any) -> Optional[Tuple[int, ...]]:
    if isinstance(value, list) and all(_number(x) is not None for x in value):
        return tuple(int(x) for x in value)
    return None


def finite_points(curve: Optional[Tuple[Optional[float], ...]]) -> Tuple[float, ...]:
    """The points to plot (NaN for a missing or non-finite one); empty without a finite point."""
    out = tuple(v if v is not None and math.isfinite(v) else math.nan for v in curve or ())
    return out if any(not math.isnan(v) for v in out) else ()


def curve_steps_of(points: Tuple[float, ...], steps: Optional[Tuple[int, ...]]) -> Optional[Tuple[int, ...]]:
    """The true step of each point when ``steps`` has one per point, else None (plotted by index)."""
    return steps if points and steps is not None and len(steps) == len(points) else None


def loss_curve_steps(model: Union[ModelProperties, Mapping[str, Any]]) -> Optional[List[int]]:
    """The true training step of each point of a model's ``loss_curve``: its ``loss_curve_steps``
    property, else (runs written before it) derived as ``dpbert.diagnostics.loss_curve.loss_curve``
    strides this run's steps (``resumed_from_step`` + 1 … + ``steps_this_run``); None when unknown.
    ``model``: the typed properties, or raw ones (read by ``dpbert.properties``)."""
    if isinstance(model, Mapping):
        model = read_properties(schema.PRETRAINED_MODEL, model)
    curve = model.loss_curve
    if not isinstance(curve, list) or not curve:
        return None
    from dpbert.diagnostics.loss_curve import curve_steps

    steps = model.loss_curve_steps
    if isinstance(steps, list) and len(steps) == len(curve):
        return steps
    first = model.resumed_from_step or 0
    n = model.steps_this_run
    if not isinstance(n, int) or not isinstance(first, int):
        return None
    derived = curve_steps(n, first)
    return derived if len(derived) == len(curve) else None


_PRETRAINING_NUMBERS = ("steps", "workers", "final_mlm_loss", "initial_mlm_loss", "final_mlm_accuracy",
                        "clipped_fraction", "diagnostics_window", "expected_batch_size", "steps_this_run",
                        "released_batch_size_mean", "non_dp_final_mlm_loss")


@_frozen
class PretrainingSection:
    """The DP model's training: steps, what was trained, its released diagnostics (DP estimates:
    ratios of noisy sums, ``dpbert.privacy.diagnostics``) and the baseline's final loss."""

    steps: Optional[Number] = None
    workers: Optional[Number] = None  # worker processes (training.workers)
    final_mlm_loss: Optional[Number] = None
    initial_mlm_loss: Optional[Number] = None
    loss_curve: Optional[Tuple[Optional[float], ...]] = None
    loss_curve_steps: Optional[Tuple[int, ...]] = None
    final_mlm_accuracy: Optional[Number] = None
    clipped_fraction: Optional[Number] = None
    diagnostics: Optional[str] = None  # how the diagnostics were released ("dp")
    #: the noise std of one step's DP estimate, per part, at the expected batch size
    diagnostics_step_noise_std: Optional[Dict[str, Number]] = None
    diagnostics_window: Optional[Number] = None  # steps of the initial / final means
    #: public: the noise std on each released per-step SUM
    diagnostics_sum_noise_std: Optional[Dict[str, Number]] = None
    expected_batch_size: Optional[Number] = None  # the planned B
    steps_this_run: Optional[Number] = None
    released_batch_size_mean: Optional[Number] = None  # DP: mean of the noisy batch sizes
    trainable: Optional[Trainable] = None
    non_dp_final_mlm_loss: Optional[Number] = None  # operator-only: the non-private baseline's

    @classmethod
    def from_properties(cls, dp_model: ModelProperties, baseline: ModelProperties) -> "PretrainingSection":
        """From the DP model's and the baseline's typed properties (their shapes parsed as ``from_json``)."""
        return cls.from_json({
            "steps": dp_model.steps_taken_total, "workers": dp_model.workers,
            "final_mlm_loss": dp_model.final_mlm_loss, "initial_mlm_loss": dp_model.initial_mlm_loss,
            "loss_curve": dp_model.loss_curve, "loss_curve_steps": loss_curve_steps(dp_model),
            "final_mlm_accuracy": dp_model.final_mlm_accuracy, "clipped_fraction": dp_model.clipped_fraction,
            "diagnostics": dp_model.diagnostics, "diagnostics_step_noise_std": dp_model.diagnostics_step_noise_std,
            "diagnostics_window": dp_model.diagnostics_window,
            "diagnostics_sum_noise_std": dp_model.diagnostics_noise_std,
            "expected_batch_size": dp_model.logical_batch, "steps_this_run": dp_model.steps_this_run,
            "released_batch_size_mean": dp_model.diagnostics_batch_size_mean, "trainable": dp_model.trainable,
            "non_dp_final_mlm_loss": baseline.final_mlm_loss})

    @classmethod
    def from_json(cls, values: Any) -> "PretrainingSection":
        values = _mapping(values)
        return cls(**{k: _number(values.get(k)) for k in _PRETRAINING_NUMBERS},
                   loss_curve=_curve(values.get("loss_curve")), loss_curve_steps=_steps(values.get("loss_curve_steps")),
                   diagnostics=_text(values.get("diagnostics")),
                   diagnostics_step_noise_std=_numbers(values.get("diagnostics_step_noise_std")),
                   diagnostics_sum_noise_std=_numbers(values.get("diagnostics_sum_noise_std")),
                   trainable=Trainable.from_json(values.get("trainable")))

    def to_json(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("loss_curve", "loss_curve_steps"):
            out[key] = None if out[key] is None else list(out[key])
        out["trainable"] = None if self.trainable is None else self.trainable.to_json()
        return out

    @property
    def loss_points(self) -> Tuple[float, ...]:
        return finite_points(self.loss_curve)

    @property
    def loss_steps(self) -> Optional[Tuple[int, ...]]:
        return curve_steps_of(self.loss_points, self.loss_curve_steps)


# --------------------------------------------------------------------------- NER
#: What the NER seeds are, by ``ner.mode`` (the headings name it).
NER_MODE_WORDS = {"probe": "probe seeds (a linear head on the frozen encoder)", "finetune": "fine-tuning seeds"}
#: The primary NER column's heading, by the table's ``ner_task``.
NER_TASK_LABELS = {"bc5cdr": "BC5CDR", "synthetic": "in-domain", "user data": "user data"}


@_frozen
class EntityScore:
    """One entity type's NER score (a bare F1, or precision / recall / F1 / support)."""

    type: str
    f1: Any = None
    precision: Any = None
    recall: Any = None
    support: Any = None


@_frozen
class NerSection:
    """The NerReport: the DP model's F1 (released with a releasable run), per entity type, and the
    every-model ``table`` as the stage stored it (any shape; operator-only)."""

    f1: Optional[Number] = None
    per_type: Any = None  # {type: f1 | {precision, recall, f1, support}} as stored
    table: Any = None     # the NerReport's ``table`` property as stored
    mode: Optional[str] = None
    task: Optional[str] = None
    seeds: Optional[Number] = None

    @classmethod
    def from_json(cls, values: Any) -> "NerSection":
        """From the NerReport's properties or the document's ``ner`` section (same keys)."""
        values = _mapping(values)
        return cls(f1=_number(values.get(schema.F1)), per_type=values.get(schema.PER_TYPE),
                   table=values.get(schema.TABLE), mode=_text(values.get("mode")), task=_text(values.get("task")),
                   seeds=_number(values.get("seeds")))

    @classmethod
    def from_properties(cls, ner: NerReportProperties) -> "NerSection":
        return cls(f1=ner.f1, per_type=ner.per_type, table=ner.table, mode=ner.mode, task=ner.task, seeds=ner.seeds)

    def to_json(self) -> Dict[str, Any]:
        return {"f1": self.f1, "per_type": self.per_type, "table": self.table, "mode": self.mode, "task": self.task,
                "seeds": self.seeds}

    def entity_scores(self) -> Tuple[EntityScore, ...]:
        """``per_type`` by type name."""
        if not isinstance(self.per_type, Mapping):
            return ()
        return tuple(EntityScore(str(t), v.get("f1"), v.get("precision"), v.get("recall"), v.get("support"))
                     if isinstance(v, Mapping) else EntityScore(str(t), v) for t, v in sorted(self.per_type.items()))

    @property
    def heading(self) -> Optional[str]:
        """The task and what the seeds were (probe or fine-tuning), e.g. ``BC5CDR, 3 probe seeds (…)``."""
        parts = [NER_TASK_LABELS.get(self.task, self.task) if self.task else None,
                 (f"{self.seeds} " if isinstance(self.seeds, int) else "") + ner_seeds_words(self.mode)
                 if self.mode else None]
        return ", ".join(p for p in parts if p) or None


def ner_seeds_words(mode) -> str:
    """``probe seeds (…)`` / ``fine-tuning seeds`` / ``seeds`` (mode unknown: an older report)."""
    return NER_MODE_WORDS.get(mode, "seeds")


# --------------------------------------------------------------------------- canaries
@_frozen
class ExposureGroup:
    """One canary group's exposure in the DP model and the non-private baseline (means of summaries)."""

    label: str
    pattern: Any
    occurrences: Optional[float]
    dp: Optional[float]
    non_dp: Optional[float]
    occurrences_value: Any  # as stored (the page prints it)


@_frozen
class CanarySection:
    """The CanaryReport: exposure per group (operator-only) and the one-run audit's bound."""

    groups: Any = dataclasses.field(default_factory=list)  # the ``groups`` property as stored
    audit_epsilon_lower_bound: Optional[Number] = None
    audit_max_reachable_lower_bound: Optional[Number] = None
    #: the non-private baseline audited with the same canaries (operator-only)
    baseline_audit_epsilon_lower_bound: Optional[Number] = None

    @classmethod
    def from_json(cls, values: Any) -> "CanarySection":
        """From the CanaryReport's properties or the document's ``canary`` section (same keys)."""
        values = _mapping(values)
        return cls(groups=values.get(schema.GROUPS, []),
                   **{k: _number(values.get(k)) for k in (schema.AUDIT_EPSILON_LOWER_BOUND, "audit_max_reachable_lower_bound",
                                                          "baseline_audit_epsilon_lower_bound")})

    @classmethod
    def from_properties(cls, canary: CanaryReportProperties) -> "CanarySection":
        return cls(groups=[] if canary.groups is None else canary.groups,
                   audit_epsilon_lower_bound=canary.audit_epsilon_lower_bound,
                   audit_max_reachable_lower_bound=canary.audit_max_reachable_lower_bound,
                   baseline_audit_epsilon_lower_bound=canary.baseline_audit_epsilon_lower_bound)

    def to_json(self) -> Dict[str, Any]:
        return {"groups": self.groups, "audit_epsilon_lower_bound": self.audit_epsilon_lower_bound,
                "audit_max_reachable_lower_bound": self.audit_max_reachable_lower_bound,
                "baseline_audit_epsilon_lower_bound": self.baseline_audit_epsilon_lower_bound}

    def exposure_groups(self) -> Tuple[ExposureGroup, ...]:
        """The groups (``exposure_dp``, or ``exposure`` in older reports; summaries by their mean)."""
        out = []
        for i, g in enumerate(self.groups if isinstance(self.groups, list) else []):
            if isinstance(g, Mapping):
                label = g.get("group", g.get("pattern", f"group {i + 1}"))
                out.append(ExposureGroup(str(label), g.get("pattern"), summary_number(g.get("occurrences")),
                                         summary_number(g.get("exposure_dp", g.get("exposure"))),
                                         summary_number(g.get("exposure_non_dp")), g.get("occurrences")))
        return tuple(out)


# --------------------------------------------------------------------------- corpus and warnings
#: The ``corpus`` section: (key, WordTuples property). Exact counts of the private data:
#: OPERATOR-ONLY (never released, never logged). ``replaced_fraction`` and ``words_per_document``
#: are derived. The corpus's location (``corpus`` property) is not shown.
CORPUS_KEYS = (("documents", "num_documents"), ("patients", "num_patients"), ("tuples", schema.NUM_TUPLES),
               ("words", "num_words"), ("tuple_words", schema.TUPLE_WORDS),
               ("skipped_error_rows", "skipped_error_rows"), ("skipped_empty_documents", "skipped_empty_documents"),
               ("replaced_bytes", "replaced_bytes"), ("corpus_bytes", "corpus_bytes"))


@_frozen
class CorpusSection:
    """OPERATOR-ONLY: the private WordTuples artifact's exact counts (never released)."""

    documents: Optional[Number] = None
    patients: Optional[Number] = None
    tuples: Optional[Number] = None
    words: Optional[Number] = None
    tuple_words: Optional[Number] = None
    skipped_error_rows: Optional[Number] = None
    skipped_empty_documents: Optional[Number] = None
    replaced_bytes: Optional[Number] = None
    corpus_bytes: Optional[Number] = None

    @classmethod
    def from_properties(cls, tuples: WordTuplesProperties) -> "CorpusSection":
        return cls(**{key: getattr(tuples, prop) for key, prop in CORPUS_KEYS})

    @classmethod
    def from_json(cls, values: Any) -> Optional["CorpusSection"]:
        if not isinstance(values, Mapping):
            return None
        return cls(**{key: _number(values.get(key)) for key, _ in CORPUS_KEYS})

    @property
    def replaced_fraction(self) -> Optional[float]:
        size = self.corpus_bytes
        return round(self.replaced_bytes / size, 6) if self.replaced_bytes is not None and size else None

    @property
    def words_per_document(self) -> Optional[float]:
        return round(self.words / self.documents, 2) if self.words is not None and self.documents else None

    def to_json(self) -> Dict[str, Any]:
        return {"operator_only": True, **{key: getattr(self, key) for key, _ in CORPUS_KEYS},
                "replaced_fraction": self.replaced_fraction, "words_per_document": self.words_per_document}


@_frozen
class ReportWarning:
    """A warning of the report. The ``corpus`` ones are operator-only (from the exact counts)."""

    section: str
    code: str
    message: str

    @property
    def operator_only(self) -> bool:
        return self.section == "corpus"

    @classmethod
    def list_from_json(cls, values: Any) -> Tuple["ReportWarning", ...]:
        return tuple(cls(str(w.get("section", "")), str(w.get("code", "")), w["message"])
                     for w in (values if isinstance(values, list) else [])
                     if isinstance(w, Mapping) and isinstance(w.get("message"), str))

    def to_json(self) -> Dict[str, str]:
        return {"section": self.section, "code": self.code, "message": self.message}


# --------------------------------------------------------------------------- the dataset's budget
#: What the figure the gate enforces (``Verdict.spent``) is, by the gate's rule.
DATASET_RULE_LABELS = {"rdp_filter": "Rényi filter at the committed order(s)",
                       "one_planned_run_pld": "one planned run (PLD)"}


@_frozen
class DatasetSection:
    """The run's dataset: its id and ledger URI, the gate's composed total over every run on it
    (``epsilon_spent`` under ``rule``), the pinned budget and this run's own ε beside them."""

    dataset_id: Optional[str] = None
    ledger: Optional[str] = None
    epsilon_spent: Optional[Number] = None
    epsilon_rdp: Optional[Number] = None
    epsilon_pld: Optional[Number] = None
    delta: Optional[Number] = None
    epsilon_budget: Optional[Number] = None
    rule: Optional[str] = None
    within_budget: Optional[bool] = None
    run_epsilon: Optional[Number] = None

    @property
    def rule_label(self) -> Optional[str]:
        return DATASET_RULE_LABELS.get(self.rule)

    @classmethod
    def from_json(cls, values: Any) -> Optional["DatasetSection"]:
        if not isinstance(values, Mapping):
            return None
        return cls(dataset_id=_text(values.get("dataset_id")), ledger=_text(values.get("ledger")),
                   **{k: _number(values.get(k)) for k in ("epsilon_spent", "epsilon_rdp", "epsilon_pld", "delta",
                                                          "epsilon_budget", "run_epsilon")},
                   rule=_text(values.get("rule")), within_budget=_flag(values.get("within_budget")))

    def to_json(self) -> Dict[str, Any]:
        return {"dataset_id": self.dataset_id, "ledger": self.ledger, "epsilon_spent": self.epsilon_spent,
                "epsilon_rdp": self.epsilon_rdp, "epsilon_pld": self.epsilon_pld, "delta": self.delta,
                "epsilon_budget": self.epsilon_budget, "rule": self.rule, "rule_label": self.rule_label,
                "within_budget": _int_flag(self.within_budget), "run_epsilon": self.run_epsilon}


def dataset_target(run: RunInfo):
    """The run's dataset (``dpbert.accounting.target.LedgerTarget``) from a component's
    ``ledger_target`` parameter (``dpbert.metadata.EXECUTION_PROPERTIES``), or None."""
    recorded = [c.properties["ledger_target"] for c in run.components if c.properties.get("ledger_target")]
    if not recorded:
        return None
    from dpbert.accounting.target import LedgerTarget

    for text in recorded:
        try:
            target = LedgerTarget.from_json(text)
        except (ValueError, TypeError):
            continue
        if target is not None:
            return target
    return None


def dataset_section(run: RunInfo, ledger: PrivacyReportProperties) -> Optional[DatasetSection]:
    """The dataset block from the PrivacyReport's properties: the ledger URI the accountant stage
    recorded (``dataset_ledger``; runs written before it: resolved here as the stage resolved it
    from the ``ledger_target``). None when the run names no dataset and stored no dataset figures."""
    target = dataset_target(run)
    privacy = PrivacySection.from_properties(ledger)
    if target is None and all(getattr(privacy, k) is None for k in DATASET_KEYS):
        return None
    uri = ledger.dataset_ledger
    if uri is None and target is not None:
        try:
            uri = target.uri()
        except Exception:  # noqa: BLE001 -- a folder this reader cannot resolve: shown as unknown
            uri = None
    spent = privacy.dataset_epsilon_spent
    return DatasetSection(
        dataset_id=ledger.dataset_id or (None if target is None else target.dataset_id), ledger=_text(uri),
        epsilon_spent=spent, epsilon_rdp=privacy.dataset_epsilon_rdp, epsilon_pld=privacy.dataset_epsilon_pld,
        delta=privacy.dataset_delta, epsilon_budget=privacy.dataset_epsilon_budget, rule=privacy.dataset_rule,
        within_budget=privacy.within_budget if spent is not None else None, run_epsilon=privacy.epsilon_total_pld)


# --------------------------------------------------------------------------- utility
#: The ``utility`` section (the NerReport's ``utility`` property, ``dpbert.evaluate.utility``):
#: its rows (in this order, those that ran), their columns and the gains with their uncertainty
#: and, when a gain has no value, its reason (``dpbert.schema.UTILITY_*``: one definition).
UTILITY_ROWS = schema.UTILITY_ROWS
UTILITY_COLUMNS = schema.UTILITY_COLUMNS
UTILITY_GAINS = tuple(g + suffix for g in schema.UTILITY_GAINS for suffix in ("", "_std"))


@_frozen
class UtilityRow:
    """One model's held-out MLM loss / accuracy and NER F1 mean ± std (primary and in-domain task)."""

    heldout_mlm_loss: Optional[float] = None
    heldout_mlm_accuracy: Optional[float] = None
    ner_f1_mean: Optional[float] = None
    ner_f1_std: Optional[float] = None
    ner_synthetic_f1_mean: Optional[float] = None
    ner_synthetic_f1_std: Optional[float] = None

    def to_json(self) -> Dict[str, Optional[float]]:
        return {c: getattr(self, c) for c in UTILITY_COLUMNS}


@_frozen
class UtilitySection:
    """The utility table: random / public / dp / non_private rows, the reference row of the gains,
    the gains kept with their std and, when one has no value, why."""

    rows: Dict[str, UtilityRow]
    reference: Optional[str] = None
    ner_seeds: Optional[float] = None
    ner_mode: Optional[str] = None
    ner_task: Optional[str] = None
    gains: Dict[str, Optional[float]] = dataclasses.field(default_factory=dict)  # UTILITY_GAINS
    reasons: Dict[str, str] = dataclasses.field(default_factory=dict)           # gain -> why n/a
    uncertainty: Optional[str] = None

    @classmethod
    def from_json(cls, table: Any) -> Optional["UtilitySection"]:
        """From the NerReport's ``utility`` property (``dpbert.evaluate.utility.utility_table``) or
        the document's ``utility`` section: the same keys. None without rows."""
        table = _mapping(table)
        rows = table.get("rows")
        if not isinstance(rows, Mapping):
            return None
        ner_mode, reference = table.get("ner_mode"), table.get("reference")
        return cls(
            rows={name: UtilityRow(**{c: _float(rows[name].get(c)) for c in UTILITY_COLUMNS})
                  for name in UTILITY_ROWS if isinstance(rows.get(name), Mapping)},
            reference=reference if reference in UTILITY_ROWS else None, ner_seeds=_float(table.get("ner_seeds")),
            ner_mode=ner_mode if ner_mode in NER_MODE_WORDS else None, ner_task=_text(table.get("ner_task")),
            gains={k: _float(table.get(k)) for k in UTILITY_GAINS},
            reasons={g: table[g + "_reason"] for g in schema.UTILITY_GAINS if isinstance(table.get(g + "_reason"), str)},
            uncertainty=_text(table.get("uncertainty")))

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"rows": {name: row.to_json() for name, row in self.rows.items()},
                               "reference": self.reference, "ner_seeds": self.ner_seeds, "ner_mode": self.ner_mode,
                               "ner_task": self.ner_task}
        out.update(self.gains)
        out.update({g + "_reason": r for g, r in self.reasons.items()})
        out["uncertainty"] = self.uncertainty
        return out


# --------------------------------------------------------------------------- the white-box audit
#: The white-box audit's fields in the report (``dpbert.stages.audit.REPORT_FIELDS`` and the
#: ledger's ε_T it is shown next to).
AUDIT_KEYS = ("epsilon_lower_bound", "epsilon_upper_bound", "epsilon_train_ledger", "max_reachable_lower_bound",
              "consistent", "canaries", "confidence", "delta", "steps", "q", "positive_control_lower_bound",
              "positive_control_exceeds_upper_bound", "seconds")
_AUDIT_FLAGS = ("consistent", "positive_control_exceeds_upper_bound")


@_frozen
class AuditSection:
    """The white-box one-run audit (``dpbert.stages.audit``): its bound next to the ledger's ε."""

    epsilon_lower_bound: Optional[Number] = None
    epsilon_upper_bound: Optional[Number] = None
    epsilon_train_ledger: Optional[Number] = None
    max_reachable_lower_bound: Optional[Number] = None
    consistent: Optional[bool] = None
    canaries: Optional[Number] = None
    confidence: Optional[Number] = None
    delta: Optional[Number] = None
    steps: Optional[Number] = None
    q: Optional[Number] = None
    positive_control_lower_bound: Optional[Number] = None
    positive_control_exceeds_upper_bound: Optional[bool] = None
    seconds: Optional[Number] = None

    @classmethod
    def from_json(cls, values: Any) -> Optional["AuditSection"]:
        """From the AuditReport's properties or the document's ``audit`` section; None when empty."""
        if not isinstance(values, Mapping) or not values:
            return None
        return cls(**{k: (_flag if k in _AUDIT_FLAGS else _number)(values.get(k)) for k in AUDIT_KEYS})

    @classmethod
    def from_properties(cls, audit: Optional[AuditReportProperties]) -> Optional["AuditSection"]:
        """From the AuditReport's typed properties; None when the run has no AuditReport."""
        return None if audit is None else cls(**{k: getattr(audit, k) for k in AUDIT_KEYS})

    def to_json(self) -> Dict[str, Any]:
        return {k: _int_flag(getattr(self, k)) if k in _AUDIT_FLAGS else getattr(self, k) for k in AUDIT_KEYS}

    @property
    def powerful(self) -> bool:
        """Whether the audit could refute the claimed ε at all (its bound with every guess right above it)."""
        upper, reach = self.epsilon_upper_bound, self.max_reachable_lower_bound
        return upper is not None and reach is not None and reach > upper


# --------------------------------------------------------------------------- a run that stopped
@_frozen
class ChargedSection:
    """A run that stopped before its accountant (interrupted, failed, or refused by the trainer
    over the budget): the ε its training chain already spent (``dpbert.metadata.mark_charged``)."""

    epsilon_charged: Optional[Number] = None
    delta: Optional[Number] = None
    steps_charged: Optional[Number] = None
    budget_refused: bool = False
    epsilon_budget: Optional[Number] = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> Optional["ChargedSection"]:
        if props.get(EPSILON_CHARGED) is None:
            return None
        return cls.from_json({"epsilon_charged": props.get(EPSILON_CHARGED), "delta": props.get(DELTA_CHARGED),
                              "steps_charged": props.get(STEPS_CHARGED),
                              "budget_refused": props.get(BUDGET_REFUSED_PROPERTY),
                              "epsilon_budget": props.get(EPSILON_BUDGET)})

    @classmethod
    def from_json(cls, values: Any) -> Optional["ChargedSection"]:
        if not isinstance(values, Mapping):
            return None
        return cls(**{k: _number(values.get(k)) for k in ("epsilon_charged", "delta", "steps_charged", "epsilon_budget")},
                   budget_refused=bool(_flag(values.get("budget_refused"))))

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@_frozen
class InterruptedSection:
    """A run ``dpbert run`` marked cancelled after SIGINT/SIGTERM (``dpbert.metadata.mark_interrupted``)."""

    component: Optional[str] = None
    step: Optional[Number] = None
    checkpoint_step: Optional[Number] = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> Optional["InterruptedSection"]:
        if not props.get(INTERRUPTED_PROPERTY):
            return None
        return cls.from_json({"component": props.get(INTERRUPTED_COMPONENT), "step": props.get(INTERRUPTED_STEP),
                              "checkpoint_step": props.get(INTERRUPTED_CHECKPOINT_STEP)})

    @classmethod
    def from_json(cls, values: Any) -> Optional["InterruptedSection"]:
        if not isinstance(values, Mapping):
            return None
        return cls(_text(values.get("component")), _number(values.get("step")), _number(values.get("checkpoint_step")))

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- membership inference
MODEL_LABELS = {"dp": "DP", "non_dp": "non-DP"}


def membership_rows(attacks, roc_curves=None, ledger: Union["PrivacySection", Mapping[str, Any], None] = None):
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

    privacy = ledger if isinstance(ledger, PrivacySection) else PrivacySection.from_json(ledger or {})
    bound = None
    eps, delta = privacy.epsilon_total_pld, privacy.delta
    if eps is not None and delta is not None and privacy.unit == "tuple":
        bound = advantage_bound(float(eps), float(delta))
    rows = []
    for label in [m for m in MODEL_LABELS if m in attacks]:
        by_attack = attacks[label]
        order = [a for a in ATTACKS if a in by_attack] + sorted(a for a in by_attack if a not in ATTACKS)
        for name in order:
            metrics = by_attack[name]
            if not isinstance(metrics, dict):
                continue
            curve = _mapping(_mapping(_mapping(roc_curves).get(label)).get(name))
            row = {"name": f"{name} ({MODEL_LABELS[label]})", "advantage": metrics.get("advantage"),
                   "auc": metrics.get("auc"), "fpr": curve.get("fpr", []), "tpr": curve.get("tpr", [])}
            if label == "dp" and name.startswith("S-") and bound is not None:
                row["advantage_bound"] = bound
            rows.append(row)
    return rows


@_frozen
class AttackScore:
    advantage: Any = None
    auc: Any = None


@_frozen
class MembershipAttack:
    """One attack to show: its name, ROC (empty when it has none) and its statistics (key, value)."""

    name: str
    fpr: Tuple[float, ...] = ()
    tpr: Tuple[float, ...] = ()
    stats: Tuple[Tuple[str, Any], ...] = ()
    advantage_bound: Optional[float] = None


_NOT_STATS = ("name", "attack", "roc", "fpr", "tpr", "thresholds")


def _roc(attack: Mapping[str, Any]) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """(fpr, tpr) of ``{"fpr", "tpr"}``, ``{"roc": {"fpr", "tpr"}}`` or ``{"roc": [[fpr, tpr], …]}``."""
    roc = attack.get("roc", attack)
    if isinstance(roc, Mapping):
        fpr, tpr = roc.get("fpr"), roc.get("tpr")
    elif isinstance(roc, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in roc):
        fpr, tpr = [p[0] for p in roc], [p[1] for p in roc]
    else:
        return (), ()
    if not (isinstance(fpr, list) and isinstance(tpr, list)) or len(fpr) != len(tpr) or not fpr:
        return (), ()
    f, t = [_float(v) for v in fpr], [_float(v) for v in tpr]
    return ((), ()) if any(v is None for v in f + t) else (tuple(f), tuple(t))


def _attack(key, attack: Any, index: int) -> Optional[MembershipAttack]:
    if not isinstance(attack, Mapping):  # {"loss": 0.53, ...}: name → AUC
        auc = _number(attack)
        return None if auc is None else MembershipAttack(str(key), stats=(("auc", auc),))
    name = attack.get("name", attack.get("attack", key if key is not None else f"attack {index + 1}"))
    fpr, tpr = _roc(attack)
    stats = tuple((k, v) for k, v in sorted(attack.items())
                  if k not in _NOT_STATS and (_number(v) is not None or isinstance(v, str)))
    return MembershipAttack(str(name), fpr, tpr, stats, _float(attack.get("advantage_bound")))


@_frozen
class MembershipSection:
    """The MembershipReport: ``{"dp"|"non_dp": {attack: score}}`` and one row per (model, attack)
    (``membership_rows``); a report of another shape (older runs) is kept as stored in ``legacy``."""

    by_model: Dict[str, Dict[str, AttackScore]] = dataclasses.field(default_factory=dict)
    rows: Tuple[Dict[str, Any], ...] = ()
    is_legacy: bool = False
    legacy: Any = None  # the report as stored when ``is_legacy``

    @classmethod
    def from_json(cls, by_model: Any, rows: Any = None) -> "MembershipSection":
        """From the document's ``membership_inference`` and ``membership_inference_rows`` (rows as
        ``membership_rows`` writes them; other shapes are legacy)."""
        if isinstance(by_model, Mapping) and set(by_model) <= set(MODEL_LABELS) and isinstance(rows, list) \
                and all(isinstance(r, Mapping) for r in rows) \
                and all(isinstance(v, Mapping) for v in by_model.values()):
            return cls({m: {name: AttackScore(s.get("advantage"), s.get("auc")) for name, s in attacks.items()
                            if isinstance(s, Mapping)} for m, attacks in by_model.items()},
                       tuple(dict(r) for r in rows))
        return cls(is_legacy=True, legacy=rows if rows is not None else by_model)

    def to_json(self) -> Dict[str, Any]:
        if self.is_legacy:
            return {"membership_inference": self.legacy, "membership_inference_rows": self.legacy}
        return {"membership_inference": {m: {name: dataclasses.asdict(s) for name, s in attacks.items()}
                                         for m, attacks in self.by_model.items()},
                "membership_inference_rows": [dict(r) for r in self.rows]}

    def attacks(self) -> Tuple[MembershipAttack, ...]:
        """Every attack to show: the rows, else an older report's attacks (a list, a dict by name,
        or one attack)."""
        attacks: Any = list(self.rows) if self.rows else self.legacy
        if isinstance(attacks, Mapping):
            items = [("attack", attacks)] if any(k in attacks for k in ("auc", "roc", "fpr")) else list(attacks.items())
        elif isinstance(attacks, list):
            items = [(None, a) for a in attacks]
        else:
            return ()
        return tuple(a for a in (_attack(key, a, i) for i, (key, a) in enumerate(items)) if a is not None)


# --------------------------------------------------------------------------- warnings
#: The corpus's training units may differ from the configured public n by this factor before the
#: report warns (``public_size_warning``).
PUBLIC_SIZE_FACTOR = 2.0
#: The released mean noisy batch size may fall this far below the planned B before the report
#: warns (``small_batches_warning``).
SMALL_BATCH_FACTOR = 2.0


def significant(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` significant digits, without an exponent for the ratios the warnings
    print (0.012, 0.5, 20, 1300)."""
    text = f"{x:.{digits}g}"
    if "e" in text:
        text = f"{float(text):f}".rstrip("0").rstrip(".")
    return text


def public_size_warning(tuples: WordTuplesProperties, model: ModelProperties) -> Optional[ReportWarning]:
    """OPERATOR-ONLY (the corpus's exact count): a warning when the units the trainer sampled from
    differ from the plan's n by more than ``PUBLIC_SIZE_FACTOR``. The plan's n is the configured
    public size (``training.dataset_size``, ``dataset_patients`` for the patient unit) after the
    holdout, or the DP count when the run drew one instead — then the count is the corpus's size up
    to its noise and nothing is compared. q = B/n comes from that n, so a corpus r× larger gives
    Poisson batches r× the planned B. Never logged: only the report (and the dashboard's
    operator-only warnings) carry it; ``released_view`` drops every warning."""
    planned = model.planned_dataset_size
    if model.dataset_size_source != "public" or not planned:
        return None
    patient = model.privacy_unit == "patient"
    units = tuples.num_patients if patient else tuples.num_tuples
    if not units:
        return None
    ratio = units * (1.0 - (model.holdout_patient_fraction or 0.0)) / planned
    if 1.0 / PUBLIC_SIZE_FACTOR <= ratio <= PUBLIC_SIZE_FACTOR:
        return None
    field = "training.dataset_patients" if patient else "training.dataset_size"
    unit = "patients" if patient else "tuples"
    batch = model.logical_batch
    planned_b = f" = {batch:g} {unit}" if batch is not None else ""
    times = significant(ratio)  # 2 significant digits: 0.012×, not 0.0×
    effect = ("more memory and time per step; the DP diagnostics, normalised by the planned B, read "
              f"about {times}× too high (a clipped fraction above 1)" if ratio > 1 else
              "the noise, scaled for the planned B, swamps the smaller clipped sums")
    return ReportWarning("corpus", "public_size_mismatch", (
        f"the corpus holds about {times}× the {unit} of the configured public size ({field}, the n of "
        f"q = B/n): Poisson batches average about {times}× the planned B{planned_b} per step — {effect}. "
        f"The ε is that of the configured n; set {field} to (a public bound on) your corpus's size, or null "
        f"to plan from a DP count"))


def small_batches_warning(model: ModelProperties) -> Optional[ReportWarning]:
    """A warning when the RELEASED (noisy, DP) batch sizes averaged far below the planned B: the
    Poisson batches held fewer units than planned (the corpus is smaller than the public n), so
    each DP estimate's noise, fixed on its SUM, is a larger share of it than the std stated at the
    expected B. From released values only (the model artifact's mean of the noisy batch sizes and
    the public plan): released, unlike the corpus counts' warnings."""
    released, planned = _float(model.diagnostics_batch_size_mean), _float(model.logical_batch)
    if released is None or not planned or released * SMALL_BATCH_FACTOR >= planned:
        return None
    unit = "patients" if model.privacy_unit == "patient" else "tuples"
    field = "training.dataset_patients" if unit == "patients" else "training.dataset_size"
    return ReportWarning("pretraining", "small_batches", (
        f"the released (noisy) batch size averaged about {significant(max(released, 0.0))} {unit} per step against "
        f"the planned B = {planned:g}: the DP estimates' noise, fixed on their sums, is about "
        f"{significant(planned / max(released, 1.0))}× the per-step std stated at the expected B, and the gradient "
        f"noise swamps the smaller clipped sums; is {field} (the public n of q = B/n) far above your corpus?"))


def report_warnings(tuples: WordTuplesProperties, vocab: VocabularyProperties,
                    model: ModelProperties) -> Tuple[ReportWarning, ...]:
    """Heavy byte replacement, short documents, a tiny corpus, a corpus far from the configured
    public size (operator-only: computed from the corpus's exact counts), a tiny DP vocabulary, and
    batches far smaller than planned; from the WordTuples, DPVocabulary and DP model properties."""
    from dpbert.data.corpus_warnings import corpus_warnings

    out = []
    # A public vocabulary (vocab.source: public) builds no DP vocabulary: no warning about one.
    for w in corpus_warnings(tuples.to_properties(), vocab.words_kept, vocab.vocab_source):
        out.append(ReportWarning("vocab" if w["code"] == "tiny_vocabulary" else "corpus", w["code"], w["message"]))
    out += [w for w in (public_size_warning(tuples, model), small_batches_warning(model)) if w is not None]
    return tuple(out)


# --------------------------------------------------------------------------- the report
@_frozen
class ComponentTiming:
    id: str
    state: str
    duration_s: float


@_frozen
class RunReport:
    """One run's report. Optional sections are None when the run has none (no stage, an older run)."""

    run_id: Optional[str] = None
    pipeline: Optional[str] = None
    status: Optional[str] = None
    duration_s: Optional[float] = None
    components: Tuple[ComponentTiming, ...] = ()
    privacy: PrivacySection = dataclasses.field(default_factory=PrivacySection)
    vocab: VocabSection = dataclasses.field(default_factory=VocabSection)
    pretraining: PretrainingSection = dataclasses.field(default_factory=PretrainingSection)
    ner: NerSection = dataclasses.field(default_factory=NerSection)
    canary: CanarySection = dataclasses.field(default_factory=CanarySection)
    corpus: Optional[CorpusSection] = None  # OPERATOR-ONLY
    warnings: Tuple[ReportWarning, ...] = ()
    dataset: Optional[DatasetSection] = None
    utility: Optional[UtilitySection] = None
    audit: Optional[AuditSection] = None
    charged: Optional[ChargedSection] = None
    interrupted: Optional[InterruptedSection] = None
    membership: Optional[MembershipSection] = None

    def to_json(self) -> Dict[str, Any]:
        """The document ``dpbert report --json`` prints (``dpbert.schema.dumps`` encodes it)."""
        out: Dict[str, Any] = {
            "run_id": self.run_id, "pipeline": self.pipeline, "status": self.status, "duration_s": self.duration_s,
            "components": [dataclasses.asdict(c) for c in self.components], "privacy": self.privacy.to_json(),
            "vocab": self.vocab.to_json(), "pretraining": self.pretraining.to_json(), "ner": self.ner.to_json(),
            "canary": self.canary.to_json(), "corpus": None if self.corpus is None else self.corpus.to_json(),
            "warnings": [w.to_json() for w in self.warnings]}
        for key in ("dataset", "utility", "audit", "charged", "interrupted"):
            section = getattr(self, key)
            if section is not None:
                out[key] = section.to_json()
        if self.membership is not None:
            out.update(self.membership.to_json())
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "RunReport":
        """A report document (``to_json``'s, or any part of one) as the object."""
        components = doc.get("components") if isinstance(doc.get("components"), list) else []
        return cls(
            run_id=_text(doc.get("run_id")), pipeline=_text(doc.get("pipeline")), status=_text(doc.get("status")),
            duration_s=_float(doc.get("duration_s")),
            components=tuple(ComponentTiming(str(c.get("id")), str(c.get("state")), _float(c.get("duration_s")) or 0.0)
                             for c in components if isinstance(c, Mapping)),
            privacy=PrivacySection.from_json(doc.get("privacy")), vocab=VocabSection.from_json(doc.get("vocab")),
            pretraining=PretrainingSection.from_json(doc.get("pretraining")), ner=NerSection.from_json(doc.get("ner")),
            canary=CanarySection.from_json(doc.get("canary")), corpus=CorpusSection.from_json(doc.get("corpus")),
            warnings=ReportWarning.list_from_json(doc.get("warnings")),
            dataset=DatasetSection.from_json(doc.get("dataset")), utility=UtilitySection.from_json(doc.get("utility")),
            audit=AuditSection.from_json(doc.get("audit")), charged=ChargedSection.from_json(doc.get("charged")),
            interrupted=InterruptedSection.from_json(doc.get("interrupted")),
            membership=MembershipSection.from_json(doc.get("membership_inference"), doc.get("membership_inference_rows"))
            if "membership_inference" in doc or "membership_inference_rows" in doc else None)


def as_report(report: Union[RunReport, Mapping[str, Any], None]) -> RunReport:
    """``report`` itself, or the object of a report document (``RunReport.from_json``)."""
    return report if isinstance(report, RunReport) else RunReport.from_json(report or {})


# --------------------------------------------------------------------------- the reader
def _dp_model(model: ModelProperties) -> bool:
    return not model.non_private


def _baseline_model(model: ModelProperties) -> bool:
    return bool(model.non_private)


def read_report(run: RunInfo) -> RunReport:
    """THE reader: the report of ``run`` from its artifacts' typed properties (``RunInfo.typed``,
    ``dpbert.properties``; a run without an artifact reads that kind's empty dataclass)."""
    def typed(short_type, cls, where=None):
        found = run.typed(short_type, where)
        return cls() if found is None else found

    ledger, tuples = typed(schema.PRIVACY_REPORT, PrivacyReportProperties), run.typed(schema.WORD_TUPLES)
    vocab, ner = typed(schema.DP_VOCABULARY, VocabularyProperties), typed(schema.NER_REPORT, NerReportProperties)
    dp_model = typed(schema.PRETRAINED_MODEL, ModelProperties, _dp_model)
    privacy, mia = PrivacySection.from_properties(ledger), run.typed(schema.MEMBERSHIP_REPORT)
    membership = None if mia is None else \
        MembershipSection.from_json(mia.attacks, membership_rows(mia.attacks, mia.roc_curves, privacy))
    return RunReport(
        run_id=run.run_id, pipeline=run.pipeline, status=run.status, duration_s=round(run.duration_s, 1),
        components=tuple(ComponentTiming(c.node_id, c.state, round(c.duration_s, 1)) for c in run.components),
        privacy=privacy, vocab=VocabSection.from_properties(vocab),
        pretraining=PretrainingSection.from_properties(
            dp_model, typed(schema.PRETRAINED_MODEL, ModelProperties, _baseline_model)),
        ner=NerSection.from_properties(ner),
        canary=CanarySection.from_properties(typed(schema.CANARY_REPORT, CanaryReportProperties)),
        corpus=None if tuples is None else CorpusSection.from_properties(tuples),
        warnings=report_warnings(tuples or WordTuplesProperties(), vocab, dp_model),
        dataset=dataset_section(run, ledger), utility=UtilitySection.from_json(ner.utility),
        audit=AuditSection.from_properties(run.typed(schema.AUDIT_REPORT)),
        charged=ChargedSection.from_properties(run.properties),
        interrupted=InterruptedSection.from_properties(run.properties), membership=membership)


def privacy_of(run: RunInfo) -> Optional[PrivacySection]:
    """The ledger of the run's first PrivacyReport not marked private (what the dashboard's ledger
    and runs list show), or None."""
    for artifact in run.artifacts(schema.type_name(schema.PRIVACY_REPORT)):
        if not artifact.private:
            return PrivacySection.from_properties(artifact.typed)
    return None


def baseline_curve(run: RunInfo) -> Tuple[Tuple[float, ...], Optional[Tuple[int, ...]]]:
    """Operator-only: the non-private baseline's loss curve (points, their steps or None), or ``((), None)``."""
    for artifact in run.artifacts(schema.type_name(schema.PRETRAINED_MODEL)):
        model = artifact.typed
        if model.non_private:
            points = finite_points(_curve(model.loss_curve))
            return points, curve_steps_of(points, _steps(loss_curve_steps(model)))
    return (), None
