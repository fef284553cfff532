"""The artifact contract: type names, property names, file names and ONE value encoding.

Every component writes, and every reader (``dpbert.metadata``, ``dpbert.report``, the dashboard,
the CLI's ``--json`` output) reads, through the names and the codec below, so the contract is in
one place instead of living by convention.

Encoding (strict JSON and ML Metadata custom properties):

* non-finite floats become the strings ``"inf"``, ``"-inf"``, ``"nan"`` (JSON has no infinity and
  MLMD's double property cannot tell a missing value from NaN);
* numpy scalars and arrays become Python scalars and lists, tuples become lists; a type a layer
  above registers (``register_encoder``) becomes what its encoder returns — dp-accounting
  ``DpEvent`` objects their dict form, registered by ``dpbert.privacy.events``: this contract
  knows no privacy event and imports nothing of dpbert;
* in MLMD (``property_value``), dicts and lists are stored as JSON strings; bools as ints.

``decode`` inverts ``encode`` (the three strings become floats again); ``decode_property`` reads
one MLMD value (string / int / double / bool / struct) back, whatever its stored type, and
``properties`` every custom property of an artifact: the one way properties are decoded
(``dpbert.properties`` then types them per artifact kind).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

# --------------------------------------------------------------------------- artifact type names
TYPE_PREFIX = "components."
WORD_TUPLES = "WordTuples"
DP_VOCABULARY = "DPVocabulary"
PRETRAINED_MODEL = "PretrainedModel"
PRIVACY_REPORT = "PrivacyReport"
CANARY_LIST = "CanaryList"
CANARY_REPORT = "CanaryReport"
NER_REPORT = "NerReport"
MEMBERSHIP_REPORT = "MembershipReport"
AUDIT_REPORT = "AuditReport"
#: AuditReport: the white-box one-run audit's result (dpbert.stages.audit), a released file.
WHITEBOX_AUDIT_FILE = "whitebox_audit.json"


def type_name(short: str) -> str:
    """The MLMD type name of an artifact class (``components.<Class>``)."""
    return TYPE_PREFIX + short


def short_type_name(name: str) -> str:
    """Inverse of ``type_name`` (other type names unchanged)."""
    return name[len(TYPE_PREFIX):] if name.startswith(TYPE_PREFIX) else name


# --------------------------------------------------------------------------- property names
#: 1 on an artifact whose files hold private data (tuples, canary secrets, non-private models and
#: every report computed on private data without noise): never opened by the report/dashboard.
PRIVATE = "private"
CODE_VERSION = "code_version"
NUM_TUPLES = "num_tuples"
TUPLE_WORDS = "tuple_words"
DP_EVENT = "dp_event"            # DPVocabulary: one record
DP_EVENTS = "dp_events"          # PretrainedModel: a list of records
NON_PRIVATE = "non_private"
STEPS_TAKEN_TOTAL = "steps_taken_total"
STEPS_PLANNED = "steps_planned"
MAX_SEQ_LENGTH = "max_seq_length"
EPSILON_TRAIN = "epsilon_train"
DELTA_TRAIN = "delta_train"
HOLDOUT_FRACTION = "holdout_patient_fraction"
#: Properties named ``num_*`` count units (tuples, documents, patients): the only properties of a
#: private artifact the dashboard shows.
COUNT_PREFIX = "num_"

# PrivacyReport (the ledger; also EPSILON_TRAIN, DELTA_TRAIN above)
EPSILON_VOCAB = "epsilon_vocab"
EPSILON_TOTAL_BASIC = "epsilon_total_basic"
EPSILON_TOTAL_PLD = "epsilon_total_pld"
EPSILON_TOTAL_RDP = "epsilon_total_rdp"
DELTA = "delta"
DELTA_VOCAB = "delta_vocab"
UNIT = "unit"
SAMPLING = "sampling"
STEPS = "steps"
EPSILON_BUDGET = "epsilon_budget"
WITHIN_BUDGET = "within_budget"    # stored as an int
STATEMENT = "statement"

# DPVocabulary (also NON_PRIVATE, DP_EVENT)
VOCAB_SIZE = "vocab_size"
WORDS_KEPT = "words_kept"
SIGMA = "sigma"
THRESHOLD = "threshold"
EPSILON = "epsilon"
#: ``vocab.source`` (dp | public | public+dp) and where the tokens came from (``dpbert.vocab.public``):
#: counts of public-checkpoint tokens and of appended DP-released words (DP post-processing).
VOCAB_SOURCE = "vocab_source"
PUBLIC_TOKENS = "public_tokens"
DP_TOKENS = "dp_tokens"

# PretrainedModel (also NON_PRIVATE, STEPS_TAKEN_TOTAL, DP_EVENTS, ...)
INITIAL_MLM_LOSS = "initial_mlm_loss"
#: The true training step of each point of ``loss_curve`` (the curve is subsampled).
LOSS_CURVE_STEPS = "loss_curve_steps"
FINAL_MLM_LOSS = "final_mlm_loss"
#: Pass/fail per run-time integrity check of the training run and of its DP event
#: (``dpbert.mechanism.integrity``, ``dpbert.privacy.event_check``): no statistic, no count.
INTEGRITY_CHECKS = "integrity_checks"
LOSS_CURVE = "loss_curve"
#: The public start (no ε, outside the ledger; ``dpbert.engine.public_warmup``): the checkpoint,
#: the encoder layers kept, the non-private warm-up on shipped public text and its source.
PUBLIC_INIT = "public_init"
PUBLIC_LAYERS = "public_layers"
PUBLIC_WARMUP_STEPS = "public_warmup_steps"
PUBLIC_WARMUP_SOURCE = "public_warmup_source"

# NerReport
F1 = "f1"
PER_TYPE = "per_type"
TABLE = "table"
#: NerReport's ``utility`` property (``dpbert.evaluate.utility.utility_table``; issues 16, 23): its
#: rows, in order; each row's columns — the held-out MLM loss / accuracy, the PRIMARY NER task's F1
#: (``ner.task``, named by the table's ``ner_task``: bc5cdr, synthetic or user data) and the
#: in-domain synthetic task's F1 (``ner.synthetic_column``; None when not evaluated); the gains kept
#: (each with ``<gain>_std`` and ``<gain>_reason``: why the value is None, e.g. "non-private gain
#: not significant"). ``ner_mode``: probe | finetune (what the NER seeds are).
UTILITY_ROWS = ("random", "public", "dp", "non_private")
UTILITY_COLUMNS = ("heldout_mlm_loss", "heldout_mlm_accuracy", "ner_f1_mean", "ner_f1_std",
                   "ner_synthetic_f1_mean", "ner_synthetic_f1_std")
UTILITY_GAINS = ("gain_kept_mlm_loss", "gain_kept_ner_f1", "gain_kept_ner_synthetic_f1")

# CanaryReport
GROUPS = "groups"
AUDIT_EPSILON_LOWER_BOUND = "audit_epsilon_lower_bound"

# MembershipReport
ATTACKS = "attacks"
ROC_CURVES = "roc_curves"

#: Flags stored as ints (MLMD has no bool property before schema v10).
BOOLEAN_PROPERTIES = frozenset({PRIVATE, NON_PRIVATE, WITHIN_BUDGET})

# --------------------------------------------------------------------------- file names
RUN_CONFIG_FILE = "run_config.json"
TRAIN_RESULT_FILE = "train_result.json"
# Three ledgers, named apart: the training chain's write-ahead count of DP steps executed is the
# STEP LOG (``dpbert.engine.chain``); the accountant's ε composition is the PRIVACY LEDGER
# (``dpbert.accounting.accountant.ledger``, the PrivacyReport); the per-dataset record of what was
# charged against one dataset is the DATASET LEDGER.
STEP_LOG_FILE = "dp_steps.json"
#: The step log's name in state directories written before it was renamed: read when present
#: (so they resume), migrated into ``STEP_LOG_FILE`` by the next run.
STEP_LOG_LEGACY_FILE = "dp_ledger.json"
DATASET_LEDGER_FILE = "dataset_ledger.json"
#: The training chain's lease lock, shuffle-stream key, checkpoints and DP count (private).
STATE_LOCK_FILE = ".lock"
SHUFFLE_KEY_FILE = "shuffle_key.json"
CHECKPOINTS_DIR = "checkpoints"
DP_COUNT_FILE = "dp_count.json"
SAVED_MODEL_DIR = "saved_model"
#: Written into the trainer's (private) state directory when the privacy budget refused a step:
#: the ε already charged by the chain (``dpbert.stages.pretrain``), read by the local runner.
BUDGET_REFUSAL_FILE = "budget_refusal.json"
#: The trainer state directory's records that, with its write-ahead ledger, give the ε the chain has
#: spent after any stop (``dpbert.engine.charges.chain_charged``).
CHARGE_BASIS_FILE = "charge_basis.json"
#: The trainer state directory's configuration key (``dpbert.engine.charges.resume_key``): the
#: budget guard finds the chains a run would resume by it before the DAG starts.
RESUME_KEY_FILE = "resume_key.json"
DP_EVENTS_FILE = "dp_events.json"
#: Next to the model: the vocabulary's DP record (its ``dp_event.json``) and δ_T, so that
#: ``dpbert export MODEL`` checks the vocabulary was DP and recomputes the ledger from the artifact.
VOCAB_DP_EVENT_FILE = "vocab_dp_event.json"
CANARY_COUNTS_FILE = "canary_counts.json"
#: DPVocabulary with vocab.source public or public+dp: which ids came from where.
TOKEN_SOURCES_FILE = "token_sources.json"
MODEL_DIR = "model"
TOKENIZER_DIR = "tokenizer"
TENSORBOARD_DIR = "tensorboard"

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
#: TFX's key for a non-dict JSON value in a struct custom property.
STRUCT_VALUE_KEY = "__value__"


# --------------------------------------------------------------------------- the codec
def _plain(obj: Any) -> Any:
    """A numpy scalar or array as Python values; anything else unchanged."""
    if isinstance(obj, (str, bytes)):
        return obj
    if type(obj).__module__ == "numpy" and callable(getattr(obj, "tolist", None)):
        return obj.tolist()
    if callable(getattr(obj, "item", None)):          # other array-likes' scalars
        return obj.item()
    return obj


#: type -> its JSON-able form; registered by the module that owns the type (``register_encoder``).
_ENCODERS: Dict[type, Callable[[Any], Any]] = {}


def register_encoder(cls: type, to_plain: Callable[[Any], Any]) -> None:
    """``encode`` (and so ``dumps`` and ``property_value``) writes an instance of ``cls`` (or of a
    subclass) as ``encode(to_plain(obj))``. The module that defines the type registers it at import
    (``dpbert.privacy.events``: dp-accounting's ``DpEvent``), so this module imports none of them."""
    _ENCODERS[cls] = to_plain


def _encoder(obj: Any) -> Optional[Callable[[Any], Any]]:
    for cls, to_plain in _ENCODERS.items():
        if isinstance(obj, cls):
            return to_plain
    return None


def encode(obj: Any) -> Any:
    """``obj`` as strict-JSON-able Python values (see the module docstring)."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    to_plain = _encoder(obj)
    if to_plain is not None:
        return encode(to_plain(obj))
    plain = _plain(obj)
    return obj if plain is obj else encode(plain)


def decode(obj: Any) -> Any:
    """Inverse of ``encode``: ``"inf"`` / ``"-inf"`` / ``"nan"`` become floats again."""
    if isinstance(obj, str) and obj in _NON_FINITE:
        return _NON_FINITE[obj]
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs) -> str:
    """Strict JSON text of ``encode(obj)`` (never ``Infinity``/``NaN`` tokens); ``kwargs`` go to
    ``json.dumps`` (``indent``, ``sort_keys``, ``ensure_ascii``...)."""
    return json.dumps(encode(obj), allow_nan=False, **kwargs)


def loads(text: Union[str, bytes]) -> Any:
    """Inverse of ``dumps``."""
    return decode(json.loads(text))


def property_value(value: Any) -> Optional[Tuple[str, Any]]:
    """(kind, value) to store one Python value as an MLMD custom property; kind is
    ``"int"``, ``"float"`` or ``"string"``; None for a missing value."""
    if value is None:
        return None
    value = _plain(value)
    if isinstance(value, bool):
        return "int", int(value)
    if isinstance(value, int):
        return "int", value
    if isinstance(value, float):
        return ("float", value) if math.isfinite(value) else ("string", encode(value))
    if isinstance(value, (dict, list, tuple)) or _encoder(value) is not None:
        return "string", dumps(value, sort_keys=True)
    return "string", str(value)


def decode_string_property(text: str) -> Any:
    """An MLMD string property back to its value: non-finite floats and JSON containers decoded."""
    if text in _NON_FINITE:
        return _NON_FINITE[text]
    if text[:1] in "[{":
        try:
            return loads(text)
        except ValueError:
            return text
    return text


def decode_property(value) -> Any:
    """One ``metadata_store_pb2.Value`` back to Python (string/int/double/bool/struct); None for
    an unset value.

    A struct value is what Kubeflow V2 / Vertex AI rebuild custom properties as (TFX's JSON
    values: a non-dict wrapped as ``{"__value__": ...}``, ints arriving as floats); a string in
    it is decoded like a string property.
    """
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return decode_string_property(value.string_value)
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        from google.protobuf import json_format

        decoded = json_format.MessageToDict(value.struct_value)
        if isinstance(decoded, dict) and STRUCT_VALUE_KEY in decoded:
            decoded = decoded[STRUCT_VALUE_KEY]
        return decode_string_property(decoded) if isinstance(decoded, str) else decode(decoded)
    return None


def properties(message) -> Dict[str, Any]:
    """Every custom property of an MLMD artifact (or execution) message, decoded."""
    return {key: decode_property(value) for key, value in message.custom_properties.items()}


# --------------------------------------------------------------------------- exact privacy numbers
#: ML Metadata 1.16 stores a double property rounded to 6 decimals: δ_V = 1e-9 reads back 0 (a
#: Gaussian mechanism shown as pure DP) and δ = 1.0001e-05 reads back 1e-05. So every finite float
#: privacy number (``is_privacy_number``: ε, δ, q, σ) is written twice — the double (MLMD's own
#: UIs, older readers) and ``<name>EXACT_SUFFIX``, the string ``repr(value)`` (``exact_companions``)
#: — and ``exact_properties`` reads the string back in the double's place. A finite float privacy
#: number without its string (a run written before) is returned as read, with
#: ``<name>APPROX_SUFFIX`` = True: the reader shows it as approximate ("≈"). The double of an ε or
#: a δ is rounded UP to 6 decimals when written (``rounds_up``): whoever reads the double alone
#: sees no less than was spent.
EXACT_SUFFIX = "__exact"
APPROX_SUFFIX = "_approx"
_PRIVACY_NUMBER = re.compile(
    r"(?:^|_)(?:epsilon|delta|q|sigma|noise_multiplier|sampling_rate|sampling_probability)(?:_|$)")


def is_privacy_number(key: str) -> bool:
    """Whether property ``key`` holds an ε, a δ, a sampling rate q or a noise multiplier σ."""
    return not key.endswith((EXACT_SUFFIX, APPROX_SUFFIX)) and _PRIVACY_NUMBER.search(key) is not None


_BOUND = re.compile(r"(?:^|_)(?:epsilon|delta)(?:_|$)")


def rounds_up(key: str) -> bool:
    """Whether the DOUBLE stored for ``key`` must never be below its exact value: an ε or a δ a
    run spent or guarantees (MLMD's 6 decimals would show δ_V = 1e-9 as 0, pure DP). Not a budget:
    rounding a limit up would overstate what may be spent. The writer stores
    ``dpbert.privacy.numbers.double_at_least`` (components/common.py); readers use the string."""
    return is_privacy_number(key) and _BOUND.search(key) is not None and "budget" not in key


def exact_companions(values: Mapping[str, Any]) -> Dict[str, str]:
    """``{name + EXACT_SUFFIX: repr(value)}`` for each finite float privacy number of ``values``
    (what a writer stores next to the doubles)."""
    out = {}
    for key, value in values.items():
        value = _plain(value)
        if is_privacy_number(key) and isinstance(value, float) and math.isfinite(value):
            out[key + EXACT_SUFFIX] = repr(value)
    return out


def merge_exact(props: Mapping[str, Any]) -> Dict[str, Any]:
    """Decoded custom properties with each privacy number replaced by its exact string (dropped
    from the result), or flagged ``<name>APPROX_SUFFIX`` when it has none (module section above)."""
    out = {k: v for k, v in props.items() if not k.endswith(EXACT_SUFFIX)}
    for key, value in list(out.items()):
        if not is_privacy_number(key) or isinstance(value, bool) or not isinstance(value, float) \
                or not math.isfinite(value):
            continue
        exact = _exact_float(props.get(key + EXACT_SUFFIX))
        if exact is None:  # no (valid) exact string: the rounded double, marked approximate
            out[key + APPROX_SUFFIX] = True
        else:
            out[key] = exact
    return out


def _exact_float(text: Any) -> Optional[float]:
    try:
        value = float(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def exact_properties(message) -> Dict[str, Any]:
    """``properties(message)`` with exact privacy numbers (``merge_exact``): what every reader of a
    run (``dpbert.metadata``, the components' ``get_property``) uses."""
    return merge_exact(properties(message))


def approx_flags(values: Mapping[str, Any], keys) -> Dict[str, bool]:
    """``{key + APPROX_SUFFIX: True}`` for each of ``keys`` that ``values`` flags approximate (to
    carry the flags into a section built from some of the properties)."""
    return {k + APPROX_SUFFIX: True for k in keys if values.get(k + APPROX_SUFFIX)}


def privacy_number_text(values: Mapping[str, Any], key: str, fmt: Callable[[Any], str],
                        delta_fmt: Optional[Callable[[float], str]] = None) -> str:
    """How a reader shows ``values[key]`` as text: a δ by ``delta_fmt`` (readers above the privacy
    layer pass ``dpbert.privacy.numbers.fmt_delta``: 6 significant digits rounded up), else to 6
    significant digits (1.0001e-05, 1e-09: the 3- or 4-digit format of the other numbers shows
    δ = 1e-9 + 1e-5 as 1e-05, below the truth; JSON output carries the float itself), anything
    else by ``fmt``; with "≈" in front when ``values`` flags it approximate (``APPROX_SUFFIX``)."""
    value = values.get(key)
    delta = "delta" in key and isinstance(value, float) and math.isfinite(value)
    text = (delta_fmt(value) if delta_fmt else format(value, ".6g")) if delta else fmt(value)
    return "≈" + text if values.get(key + APPROX_SUFFIX) else text
