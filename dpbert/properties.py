"""Typed artifact properties: one frozen dataclass per artifact kind and ONE versioned reader.

Every component writes its output artifact's custom properties through ``to_write(kind, values)``
(checked by the kind's dataclass, stamped ``schema_version`` = ``SCHEMA_VERSION``), and every
reader of a run (``dpbert.report_model``, ``dpbert.release``, the dashboard, through
``ArtifactInfo.typed`` of ``dpbert.metadata`` and ``dpbert.pipeline_root``) gets the same object
from ``read_properties(kind, raw, artifact)``: ``raw`` is the decoded custom properties as
``schema.exact_properties`` (ML Metadata) or ``pipeline_root.artifact_properties`` (executor
outputs) give them, privacy numbers exact and ``<name>_approx`` flags set.

Fields: the properties a reader uses, typed — a number (int or float as stored; ``"inf"``,
``"-inf"``, ``"nan"`` decoded), a flag (stored as an int; a bool or "1"/"true"/"yes" also read), a
text, or a JSON value kept as stored (lists, dicts: the sections of ``dpbert.report_model`` parse
their shapes). Every other property stays in ``extra`` as stored (TFX's own, and those no reader
uses), so ``to_properties()`` gives back what was written. ``approximate``: the keys read from a
rounded double without its exact string.

Versions (``schema_version``): 1, the fields below; a run written without the property
(``LEGACY_VERSION`` = 0, before it existed) reads the same fields, each missing one None — so an
older run's report shows "n/a" where a newer property would stand, never a guessed default. A
version above ``SCHEMA_VERSION`` (newer code wrote it) is read the same way, unknown keys in
``extra``. A value of the wrong type (text where a number belongs, a dict for a flag) is a
``PropertyError`` naming the artifact and the key. docs/development.md ("How a component is built").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, Dict, FrozenSet, Mapping, Optional, Type, Union

from dpbert import schema

#: The version every writer stamps (``to_write``); runs written without one read as ``LEGACY_VERSION``.
SCHEMA_VERSION = 1
LEGACY_VERSION = 0
VERSION_KEY = "schema_version"
Number = Union[int, float]


class PropertyError(ValueError):
    """A custom property of the wrong type: the message names the artifact, the key and the value's
    type — never the value, which may be an operator-only exact number."""


def _malformed(what: str, key: str, value: Any, artifact: str) -> PropertyError:
    return PropertyError(f"{artifact}: property {key!r} (a {type(value).__name__}) is not {what}")


def _parse_number(value: Any, key: str, artifact: str) -> Optional[Number]:
    if isinstance(value, str):
        value = schema.decode(value)
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise _malformed("a number", key, value, artifact)


def _parse_flag(value: Any, key: str, artifact: str) -> Optional[bool]:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    if isinstance(value, (int, float)):
        return bool(value)
    raise _malformed("a flag (0 or 1)", key, value, artifact)


def _parse_text(value: Any, key: str, artifact: str) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    raise _malformed("a text", key, value, artifact)


def _parse_json(value: Any, key: str, artifact: str) -> Any:
    return value


_PARSERS: Dict[str, Callable[[Any, str, str], Any]] = {
    "number": _parse_number, "flag": _parse_flag, "text": _parse_text, "json": _parse_json}


def _field(kind: str):
    return dataclasses.field(default=None, metadata={"parse": kind})


def number():
    return _field("number")


def flag():
    return _field("flag")


def text():
    return _field("text")


def json_value():
    return _field("json")


@dataclasses.dataclass(frozen=True)
class ArtifactProperties:
    """What every artifact carries; a kind's class adds its fields (module docstring)."""

    KIND: ClassVar[str] = ""
    schema_version: int = LEGACY_VERSION
    private: Optional[bool] = flag()
    non_private: Optional[bool] = flag()
    code_version: Optional[str] = text()
    approximate: FrozenSet[str] = frozenset()
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def typed_fields(cls):
        """The fields read from a property of the same name (all but version, approximate, extra)."""
        return [f for f in dataclasses.fields(cls) if "parse" in f.metadata]

    def to_properties(self) -> Dict[str, Any]:
        """The custom properties to store: the typed fields set, ``extra``, the version."""
        out = {f.name: getattr(self, f.name) for f in self.typed_fields() if getattr(self, f.name) is not None}
        out.update(self.extra)
        out[VERSION_KEY] = self.schema_version
        return out


@dataclasses.dataclass(frozen=True)
class WordTuplesProperties(ArtifactProperties):
    """The corpus's tuples (PRIVATE): exact counts, operator-only."""

    KIND: ClassVar[str] = schema.WORD_TUPLES
    num_tuples: Optional[Number] = number()
    num_documents: Optional[Number] = number()
    num_patients: Optional[Number] = number()
    num_words: Optional[Number] = number()
    tuple_words: Optional[Number] = number()
    replaced_bytes: Optional[Number] = number()
    corpus_bytes: Optional[Number] = number()
    skipped_error_rows: Optional[Number] = number()
    skipped_empty_documents: Optional[Number] = number()
    corpus: Optional[str] = text()


@dataclasses.dataclass(frozen=True)
class VocabularyProperties(ArtifactProperties):
    """The DP (or public) vocabulary: its size, ε, σ, threshold and DP record."""

    KIND: ClassVar[str] = schema.DP_VOCABULARY
    vocab_size: Optional[Number] = number()
    words_kept: Optional[Number] = number()
    sigma: Optional[Number] = number()
    threshold: Optional[Number] = number()
    epsilon: Optional[Number] = number()
    epsilon_classic: Optional[Number] = number()
    delta: Optional[Number] = number()
    delta_threshold: Optional[Number] = number()
    max_contributions: Optional[Number] = number()
    tuple_words: Optional[Number] = number()
    public_tokens: Optional[Number] = number()
    dp_tokens: Optional[Number] = number()
    vocab_source: Optional[str] = text()
    unit: Optional[str] = text()
    threshold_mode: Optional[str] = text()
    dp_event: Any = json_value()


@dataclasses.dataclass(frozen=True)
class ModelProperties(ArtifactProperties):
    """A pretrained model: its plan, steps, released diagnostics, DP records and what trained."""

    KIND: ClassVar[str] = schema.PRETRAINED_MODEL
    noise_multiplier: Optional[Number] = number()
    effective_noise_multiplier: Optional[Number] = number()
    clip_norm: Optional[Number] = number()
    sampling_rate: Optional[Number] = number()
    logical_batch: Optional[Number] = number()
    replicas: Optional[Number] = number()
    accumulation_steps: Optional[Number] = number()
    workers: Optional[Number] = number()
    steps_taken_total: Optional[Number] = number()
    steps_this_run: Optional[Number] = number()
    resumed_from_step: Optional[Number] = number()
    steps_planned: Optional[Number] = number()
    planned_dataset_size: Optional[Number] = number()
    max_tuples_per_patient: Optional[Number] = number()
    delta: Optional[Number] = number()
    epsilon_train: Optional[Number] = number()
    final_mlm_loss: Optional[Number] = number()
    final_mlm_accuracy: Optional[Number] = number()
    initial_mlm_loss: Optional[Number] = number()
    clipped_fraction: Optional[Number] = number()
    diagnostics_window: Optional[Number] = number()
    diagnostics_batch_size_mean: Optional[Number] = number()
    holdout_patient_fraction: Optional[Number] = number()
    max_seq_length: Optional[Number] = number()
    sampling_mode: Optional[str] = text()
    privacy_unit: Optional[str] = text()
    dataset_size_source: Optional[str] = text()
    diagnostics: Optional[str] = text()
    clipping_path: Optional[str] = text()
    model_preset: Optional[str] = text()
    loss_curve: Any = json_value()
    loss_curve_steps: Any = json_value()
    diagnostics_noise_std: Any = json_value()
    diagnostics_step_noise_std: Any = json_value()
    dp_events: Any = json_value()
    integrity_checks: Any = json_value()
    trainable: Any = json_value()  # a dict, or its JSON text


@dataclasses.dataclass(frozen=True)
class PrivacyReportProperties(ArtifactProperties):
    """The run's ε ledger and the dataset's budget figures (``dpbert.stages.accountant``)."""

    KIND: ClassVar[str] = schema.PRIVACY_REPORT
    epsilon_vocab: Optional[Number] = number()
    epsilon_train: Optional[Number] = number()
    epsilon_train_rdp: Optional[Number] = number()
    epsilon_total_basic: Optional[Number] = number()
    epsilon_total_pld: Optional[Number] = number()
    epsilon_total_rdp: Optional[Number] = number()
    delta: Optional[Number] = number()
    delta_vocab: Optional[Number] = number()
    delta_train: Optional[Number] = number()
    delta_threshold: Optional[Number] = number()
    steps: Optional[Number] = number()
    sampling_probability: Optional[Number] = number()
    noise_multiplier: Optional[Number] = number()
    epsilon_budget: Optional[Number] = number()
    max_contributions: Optional[Number] = number()
    within_budget: Optional[bool] = flag()
    unit: Optional[str] = text()
    adjacency: Optional[str] = text()
    sampling: Optional[str] = text()
    statement: Optional[str] = text()
    dataset_epsilon_spent: Optional[Number] = number()
    dataset_epsilon_rdp: Optional[Number] = number()
    dataset_epsilon_pld: Optional[Number] = number()
    dataset_delta: Optional[Number] = number()
    dataset_epsilon_budget: Optional[Number] = number()
    dataset_rule: Optional[str] = text()
    dataset_id: Optional[str] = text()
    dataset_ledger: Optional[str] = text()


@dataclasses.dataclass(frozen=True)
class CanaryListProperties(ArtifactProperties):
    """The canaries (PRIVATE: their secrets are in the files)."""

    KIND: ClassVar[str] = schema.CANARY_LIST
    num_canaries: Optional[Number] = number()
    num_audit_canaries: Optional[Number] = number()
    groups: Any = json_value()


@dataclasses.dataclass(frozen=True)
class CanaryReportProperties(ArtifactProperties):
    """Exposure per canary group and the one-run audit's bound."""

    KIND: ClassVar[str] = schema.CANARY_REPORT
    groups: Any = json_value()
    groups_by_pattern: Any = json_value()
    audit: Any = json_value()
    audit_epsilon_lower_bound: Optional[Number] = number()
    audit_epsilon_upper_bound: Optional[Number] = number()
    audit_max_reachable_lower_bound: Optional[Number] = number()
    baseline_audit_epsilon_lower_bound: Optional[Number] = number()
    log2_reference_size: Optional[Number] = number()


@dataclasses.dataclass(frozen=True)
class NerReportProperties(ArtifactProperties):
    """The NER evaluation and the utility table (``dpbert.stages.ner``)."""

    KIND: ClassVar[str] = schema.NER_REPORT
    f1: Optional[Number] = number()
    f1_std: Optional[Number] = number()
    seeds: Optional[Number] = number()
    epochs: Optional[Number] = number()
    seconds: Optional[Number] = number()
    mode: Optional[str] = text()
    task: Optional[str] = text()
    per_type: Any = json_value()
    table: Any = json_value()
    utility: Any = json_value()


@dataclasses.dataclass(frozen=True)
class MembershipReportProperties(ArtifactProperties):
    """Membership-inference attacks on the DP model and the baseline (operator-only)."""

    KIND: ClassVar[str] = schema.MEMBERSHIP_REPORT
    attacks: Any = json_value()
    roc_curves: Any = json_value()
    n_members: Optional[Number] = number()
    n_non_members: Optional[Number] = number()
    holdout_patient_fraction: Optional[Number] = number()
    roc_file: Optional[str] = text()


@dataclasses.dataclass(frozen=True)
class AuditReportProperties(ArtifactProperties):
    """The white-box one-run audit (``dpbert.stages.audit.REPORT_FIELDS`` and the ledger's ε_T)."""

    KIND: ClassVar[str] = schema.AUDIT_REPORT
    epsilon_lower_bound: Optional[Number] = number()
    epsilon_upper_bound: Optional[Number] = number()
    epsilon_train_ledger: Optional[Number] = number()
    max_reachable_lower_bound: Optional[Number] = number()
    consistent: Optional[bool] = flag()
    canaries: Optional[Number] = number()
    confidence: Optional[Number] = number()
    delta: Optional[Number] = number()
    steps: Optional[Number] = number()
    q: Optional[Number] = number()
    positive_control_lower_bound: Optional[Number] = number()
    positive_control_exceeds_upper_bound: Optional[bool] = flag()
    seconds: Optional[Number] = number()
    trainable: Optional[str] = text()  # the trainable sets, comma-joined


#: Short artifact type name → its properties' class.
KINDS: Dict[str, Type[ArtifactProperties]] = {cls.KIND: cls for cls in (
    WordTuplesProperties, VocabularyProperties, ModelProperties, PrivacyReportProperties, CanaryListProperties,
    CanaryReportProperties, NerReportProperties, MembershipReportProperties, AuditReportProperties)}


def kind_class(kind: str) -> Type[ArtifactProperties]:
    """The class of an artifact type (short ``DPVocabulary`` or ``components.DPVocabulary``);
    ``ArtifactProperties`` (every property in ``extra``) for a type this contract does not know."""
    return KINDS.get(schema.short_type_name(kind), ArtifactProperties)


def _version(value: Any, artifact: str) -> int:
    if value is None:
        return LEGACY_VERSION
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)  # Vertex AI records every number as a double
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _malformed("a schema version (an int ≥ 0)", VERSION_KEY, value, artifact)
    return value


def read_properties(kind: str, raw: Mapping[str, Any], artifact: str = "") -> ArtifactProperties:
    """THE reader: ``raw`` (decoded custom properties, module docstring) as ``kind``'s dataclass.
    ``artifact`` names it in a ``PropertyError`` (default: the kind)."""
    cls, where = kind_class(kind), artifact or f"{schema.short_type_name(kind)} artifact"
    plain = {k: schema.decode(schema.encode(v)) for k, v in raw.items()}  # numpy scalars → Python
    typed = {f.name: _PARSERS[f.metadata["parse"]](plain.get(f.name), f.name, where) for f in cls.typed_fields()}
    approx = frozenset(k[:-len(schema.APPROX_SUFFIX)] for k, v in plain.items()
                       if k.endswith(schema.APPROX_SUFFIX) and v is True)
    known = set(typed) | {VERSION_KEY} | {k + schema.APPROX_SUFFIX for k in approx}
    extra = {k: v for k, v in plain.items() if k not in known}
    return cls(schema_version=_version(plain.get(VERSION_KEY), where), approximate=approx, extra=extra, **typed)


def to_write(kind: str, values: Mapping[str, Any]) -> Dict[str, Any]:
    """What a component stores on its ``kind`` output: ``values`` checked by the kind's dataclass
    (``PropertyError`` before anything is written), stamped ``SCHEMA_VERSION``."""
    typed = read_properties(kind, {k: v for k, v in values.items() if k != VERSION_KEY}, f"the {kind} output")
    return dataclasses.replace(typed, schema_version=SCHEMA_VERSION).to_properties()
