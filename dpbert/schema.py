"""The artifact contract: type names, property names, file names and ONE value encoding.

Every component writes, and every reader (``dpbert.metadata``, ``dpbert.report``, the dashboard,
the CLI's ``--json`` output) reads, through the names and the codec below, so the contract is in
one place instead of living by convention.

Encoding (strict JSON and ML Metadata custom properties):

* non-finite floats become the strings ``"inf"``, ``"-inf"``, ``"nan"`` (JSON has no infinity and
  MLMD's double property cannot tell a missing value from NaN);
* numpy scalars become Python scalars, tuples become lists, dp-accounting ``DpEvent`` objects
  become their dict form (``dpbert.privacy.events.dp_event_to_dict``);
* in MLMD, dicts and lists are stored as JSON strings; bools as ints.

``decode`` inverts ``encode`` (the three strings become floats again); ``decode_property`` reads
one MLMD value (string / int / double / struct) back, whatever its stored type.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

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


def type_name(short: str) -> str:
    """The MLMD type name of an artifact class (``components.<Class>``)."""
    return TYPE_PREFIX + short


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

# --------------------------------------------------------------------------- file names
RUN_CONFIG_FILE = "run_config.json"
TRAIN_RESULT_FILE = "train_result.json"
DP_LEDGER_FILE = "dp_ledger.json"
DP_EVENTS_FILE = "dp_events.json"
CANARY_COUNTS_FILE = "canary_counts.json"
MODEL_DIR = "model"
TOKENIZER_DIR = "tokenizer"
TENSORBOARD_DIR = "tensorboard"

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# --------------------------------------------------------------------------- the codec
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
    if type(obj).__module__.startswith("dp_accounting"):
        from dpbert.privacy.events import dp_event_to_dict

        return dp_event_to_dict(obj)
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):  # numpy
        return encode(obj.item())
    return obj


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
    """Strict JSON text of ``encode(obj)`` (never ``Infinity``/``NaN`` tokens)."""
    return json.dumps(encode(obj), allow_nan=False, **kwargs)


def loads(text) -> Any:
    """Inverse of ``dumps``."""
    return decode(json.loads(text))


def property_value(value: Any):
    """(kind, value) to store one Python value as an MLMD custom property; kind is
    ``"int"``, ``"float"`` or ``"string"``; None for a missing value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "int", int(value)
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, int):
        return "int", value
    if isinstance(value, float):
        return ("float", value) if math.isfinite(value) else ("string", encode(value))
    if isinstance(value, (dict, list, tuple)):
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
    """One ``metadata_store_pb2.Value`` back to Python (string/int/double/bool/struct)."""
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
        # Kubeflow V2 / Vertex AI rebuild custom properties as JSON values (ints arrive as floats).
        from google.protobuf import json_format

        decoded = json_format.MessageToDict(value.struct_value)
        return decode(decoded.get("__value__", decoded)) if isinstance(decoded, dict) else decode(decoded)
    return None
