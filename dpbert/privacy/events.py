r"""DP events recorded on artifacts, so that the accountant can recompute every ε.

dp-accounting 0.4.3's ``DpEvent`` classes are ``attrs`` classes with ``to_named_tuple()`` /
``DpEvent.from_named_tuple()`` but no JSON codec (and ``from_named_tuple`` imports whatever
module the data names). This module adds a small JSON codec restricted to the known event classes,
and records of our own for the pipeline's mechanisms: the vocabulary (``histogram_event``),
DP-SGD (``dpsgd_event``, its event from ``dpsgd_dp_event``), the DP count and a non-private stage
(``non_private_event``, ε = ∞).

Contract (``SCHEMA = "dpbert.privacy/1"``): every record is a JSON object written through
``dpbert.schema``'s codec (non-finite floats as the strings "inf", "-inf", "nan"); a DP-SGD
record's ``event`` is rebuilt from its parameters when read and must match, so a record cannot
claim an event its parameters do not give. The records' fields and the derivation of each DP-SGD
event (Poisson, user-level Poisson, shuffle under zero-out adjacency): docs/privacy.md ("DP event
records and their derivations").
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Union

import attr
import dp_accounting
from dp_accounting import dp_event as _dpe

from dpbert import schema
from dpbert.privacy import _checks
from dpbert.privacy import histogram as _histogram

SCHEMA = "dpbert.privacy/1"
SAMPLING = ("poisson", "shuffle")

_EVENT_CLASSES = {cls.__name__: cls for cls in (
    _dpe.NoOpDpEvent, _dpe.NonPrivateDpEvent, _dpe.GaussianDpEvent, _dpe.LaplaceDpEvent,
    _dpe.SelfComposedDpEvent, _dpe.ComposedDpEvent, _dpe.PoissonSampledDpEvent,
    _dpe.SampledWithReplacementDpEvent, _dpe.SampledWithoutReplacementDpEvent)}


# ------------------------------------------------------------------------------ JSON codec

def dp_event_to_dict(event: dp_accounting.DpEvent) -> Dict[str, Any]:
    """A dp-accounting event as a JSON-ready dict ``{"type": ..., fields...}``."""
    name = type(event).__name__
    if _EVENT_CLASSES.get(name) is not type(event):
        raise ValueError(f"event must be one of {', '.join(sorted(_EVENT_CLASSES))}, "
                         f"got {type(event).__name__}")
    out: Dict[str, Any] = {"type": name}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_accounting.DpEvent):
            value = dp_event_to_dict(value)
        elif isinstance(value, (list, tuple)):
            value = [dp_event_to_dict(v) if isinstance(v, dp_accounting.DpEvent) else v for v in value]
        out[field.name] = value
    return out


# The artifact codec writes a DpEvent in this form (dpbert.schema knows no privacy event).
schema.register_encoder(dp_accounting.DpEvent, dp_event_to_dict)


def dp_event_from_dict(data: Mapping[str, Any]) -> dp_accounting.DpEvent:
    """Inverse of ``dp_event_to_dict`` (only the known event classes; unknown fields rejected)."""
    if not isinstance(data, Mapping) or "type" not in data:
        raise ValueError(f"event must be a mapping with a 'type', got {data!r}")
    cls = _EVENT_CLASSES.get(data["type"])
    if cls is None:
        raise ValueError(f"event type must be one of {', '.join(sorted(_EVENT_CLASSES))}, "
                         f"got {data['type']!r}")
    names = {f.name for f in attr.fields(cls)}
    extra = set(data) - names - {"type"}
    if extra:
        raise ValueError(f"event fields {sorted(extra)} are not fields of {cls.__name__}")
    kwargs = {}
    for name in names:
        if name not in data:
            raise ValueError(f"event field {cls.__name__}.{name} is missing")
        value = data[name]
        if isinstance(value, Mapping):
            value = dp_event_from_dict(value)
        elif isinstance(value, list):
            value = [dp_event_from_dict(v) if isinstance(v, Mapping) else v for v in value]
        kwargs[name] = value
    return cls(**kwargs)


def to_json(obj, **kwargs) -> str:
    """Strict JSON of a record, a list of records or a ledger (``dpbert.schema.dumps``: non-finite
    floats become "inf" / "-inf" / "nan", DpEvents become dicts)."""
    return schema.dumps(obj, **kwargs)


def from_json(text: Union[str, bytes]) -> Any:
    """Inverse of ``to_json`` (``dpbert.schema.loads``: "inf", "-inf", "nan" become floats)."""
    return schema.loads(text)


def _as_record(record) -> Dict[str, Any]:
    if isinstance(record, (str, bytes)):
        record = from_json(record)
    if not isinstance(record, Mapping):
        raise ValueError(f"event record must be a JSON object or a mapping, got {type(record).__name__}")
    record = schema.decode(schema.encode(dict(record)))      # a plain, JSON-equivalent copy
    if record.get("schema") != SCHEMA:
        raise ValueError(f"event record schema must be {SCHEMA!r}, got {record.get('schema')!r}")
    return record


# ------------------------------------------------------------------------------ vocabulary

def histogram_event(report: Mapping[str, Any]) -> Dict[str, Any]:
    """The vocabulary record, from ``histogram.histogram_report(...)``."""
    if not isinstance(report, Mapping) or report.get("mechanism") != "dp_histogram":
        raise ValueError("report must be a histogram_report(...) dict (mechanism dp_histogram)")
    record = {
        "schema": SCHEMA,
        "mechanism": "dp_histogram",
        "stage": "vocab",
        "gaussian": dp_event_to_dict(dp_accounting.GaussianDpEvent(
            report["sigma"] / report["sensitivity_l2"])),
    }
    for key in ("sigma", "sensitivity_l2", "tuple_words", "unit", "max_contributions", "threshold",
                "threshold_mode", "delta", "epsilon"):
        record[key] = report[key]
    record["threshold_delta"] = report["delta_threshold"]
    return validate_record(record)


def non_private_event(stage: str) -> Dict[str, Any]:
    """A stage that used exact data (ε = ∞): ``stage`` is ``vocab`` or ``train``."""
    _checks.choice("stage", stage, ("vocab", "train"))
    return {"schema": SCHEMA, "mechanism": "non_private", "stage": stage,
            "event": dp_event_to_dict(dp_accounting.NonPrivateDpEvent())}


# -------------------------------------------------------------------------------- training

def shuffle_participations(steps: int, sampling_probability: float):
    """(E, straddling) for shuffled fixed-size batches with q = B/n: E = ceil(s·B/n) occurrences
    of one example in s steps; straddling = a batch can span two permutations (n/B not an
    integer). See docs/privacy.md."""
    steps = _checks.integer("steps", steps, 1)
    q = _checks.fraction("sampling_probability", sampling_probability)
    x = steps * q
    exact = _checks.nearest_integer(x)
    occurrences = exact if exact is not None else math.ceil(x)
    straddling = _checks.nearest_integer(1.0 / q) is None
    return int(occurrences), bool(straddling)


#: The neighbouring relation each sampler is accounted under (docs/privacy.md).
ADJACENCY = {"poisson": "add_or_remove_one", "shuffle": "zero_out"}


def dpsgd_dp_event(noise_multiplier: float, sampling_probability: float, steps: int,
                   sampling: str = "poisson", max_contributions: int = 1,
                   user_level: bool = False) -> dp_accounting.DpEvent:
    """The dp-accounting event of ``steps`` DP-SGD steps (derivations in docs/privacy.md).

    ``sampling_probability`` is q = B/n (for shuffle it fixes n/B; q ≤ 1, i.e. B ≤ n).
    ``user_level``: the patients themselves are Poisson-sampled at rate q and each patient's
    summed gradient is clipped to C: PoissonSampled(q, Gaussian(σ)) per patient, k does not enter.
    """
    sigma = _checks.positive("noise_multiplier", noise_multiplier)
    q = _checks.fraction("sampling_probability", sampling_probability)
    steps = _checks.integer("steps", steps, 1)
    _checks.choice("sampling", sampling, SAMPLING)
    k = _checks.integer("max_contributions", max_contributions, 1)
    if user_level:
        if sampling != "poisson":
            raise ValueError("user-level DP-SGD samples patients with Poisson sampling only")
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    if sampling == "poisson":
        q_k = -math.expm1(k * math.log1p(-q)) if q < 1 else 1.0   # 1 − (1 − q)^k
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q_k, dp_accounting.GaussianDpEvent(sigma / k)), steps)
    occurrences, straddling = shuffle_participations(steps, q)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(sigma / k), occurrences * (2 if straddling else 1))


def accounted_dataset_size(sampling: str, planned: int, trained: int) -> int:
    """The n a training record must carry for the sampler that actually ran.

    poisson: the trainer samples with the PLANNED q = B/n_planned whatever the actual n, so the
    record's q (= B/dataset_size) must be the planned one. shuffle: each epoch is a permutation of
    the rows actually trained on (held-out patients removed, canary rows added), so an example
    takes part ceil(steps·B/n_trained) times; recording the larger planned n would undercount.
    """
    _checks.choice("sampling", sampling, SAMPLING)
    return int(planned) if sampling == "poisson" else int(trained)


def dpsgd_event(noise_multiplier: float, batch_size: int, dataset_size: int, steps: int,
                sampling: str = "poisson", max_contributions: int = 1,
                unit: Optional[str] = None) -> Dict[str, Any]:
    """The training record of ``steps`` steps with expected batch B over n examples (q = B/n).

    ``unit="patient"``: user-level DP-SGD — B and n count PATIENTS (q = B/n the patient rate),
    each bringing ≤ k = ``max_contributions`` tuples; the record says ``sampling_unit: patient``
    and its event is PoissonSampled(q, Gaussian(σ)) per patient. Without ``unit`` (legacy), k > 1
    means example-level sampling with the group-privacy bound."""
    noise_multiplier = _checks.positive("noise_multiplier", noise_multiplier)
    batch_size = _checks.integer("batch_size", batch_size, 1)
    dataset_size = _checks.integer("dataset_size", dataset_size, 1)
    steps = _checks.integer("steps", steps, 1)
    _checks.choice("sampling", sampling, SAMPLING)
    k = _checks.integer("max_contributions", max_contributions, 1)
    if batch_size > dataset_size:
        raise ValueError(f"batch_size must be <= dataset_size ({dataset_size}), got {batch_size}")
    if unit is not None:
        _checks.choice("unit", unit, ("tuple", "patient"))
    user_level = unit == "patient"
    if unit == "tuple" and k != 1:
        raise ValueError(f"unit tuple has max_contributions 1, got {k}")
    q = batch_size / dataset_size
    record = {
        "schema": SCHEMA, "mechanism": "dp_sgd", "stage": "train",
        "event": dp_event_to_dict(dpsgd_dp_event(noise_multiplier, q, steps, sampling, k, user_level)),
        "sampling": sampling, "steps": steps, "noise_multiplier": noise_multiplier,
        "sampling_probability": q, "batch_size": batch_size, "dataset_size": dataset_size,
        "unit": "tuple" if (k == 1 and not user_level) else "patient", "max_contributions": k,
        "adjacency": ADJACENCY[sampling],
    }
    if user_level:
        record["sampling_unit"] = "patient"
    if sampling == "shuffle":
        record["participations"], record["straddling"] = shuffle_participations(steps, q)
    return validate_record(record)


# ------------------------------------------------------------------------------ validation

def validate_record(record) -> Dict[str, Any]:
    """Parse (JSON text or mapping) and check a record; returns a plain dict.

    The accountable parts are recomputed from the parameters: a histogram record's threshold δ₂
    from σ and C (a record may not understate it), a training record's event from
    (σ, q, steps, sampling, k).
    """
    record = _as_record(record)
    mechanism = record.get("mechanism")
    _checks.choice("mechanism", mechanism, ("dp_histogram", "dp_sgd", "dp_count", "non_private"))
    try:
        if mechanism == "non_private":
            _checks.choice("stage", record.get("stage"), ("vocab", "train"))
            if not isinstance(dp_event_from_dict(record["event"]), dp_accounting.NonPrivateDpEvent):
                raise ValueError("event of a non_private record must be NonPrivateDpEvent")
        elif mechanism == "dp_count":  # dpbert.privacy.count: Gaussian count, sensitivity k
            sigma = _checks.positive("noise_multiplier", record["noise_multiplier"])
            _checks.integer("max_contributions", record["max_contributions"], 1)
            if dp_event_from_dict(record["event"]) != dp_accounting.GaussianDpEvent(sigma):
                raise ValueError(f"event of a dp_count record must be GaussianDpEvent({sigma})")
        elif mechanism == "dp_histogram":
            m = _checks.integer("max_contributions", record["max_contributions"], 1)
            n = _checks.integer("tuple_words", record["tuple_words"], 1)
            sigma = _checks.positive("sigma", record["sigma"])
            _checks.probability("delta", record["delta"])
            expected = _histogram.sensitivity_l2(n, m)
            if not math.isclose(record["sensitivity_l2"], expected, rel_tol=1e-12):
                raise ValueError(f"sensitivity_l2 must be m√N = {expected}, got {record['sensitivity_l2']!r}")
            gaussian = dp_event_from_dict(record["gaussian"])
            if gaussian != dp_accounting.GaussianDpEvent(sigma / expected):
                raise ValueError(f"gaussian must be GaussianDpEvent(σ/(m√N) = {sigma / expected}), "
                                 f"got {record['gaussian']!r}")
            actual = _histogram.actual_threshold_delta(sigma, record["threshold"], n, m)
            if not record["threshold_delta"] >= actual * (1 - 1e-9):
                raise ValueError(f"threshold_delta must be >= mN·P[Z ≥ C − m] = {actual:.6g}, "
                                 f"got {record['threshold_delta']!r}")
            record["threshold_delta"] = max(record["threshold_delta"], actual)
            _checks.choice("unit", record["unit"], _histogram.UNITS)
        else:
            user_level = record.get("sampling_unit", "tuple") == "patient"
            if user_level and record["unit"] != "patient":
                raise ValueError("a record with sampling_unit patient must have unit patient")
            _checks.choice("sampling_unit", record.get("sampling_unit", "tuple"), ("tuple", "patient"))
            expected = dpsgd_dp_event(record["noise_multiplier"], record["sampling_probability"],
                                      record["steps"], record["sampling"], record["max_contributions"],
                                      user_level)
            q = record["batch_size"] / record["dataset_size"]
            if not math.isclose(record["sampling_probability"], q, rel_tol=1e-12):
                raise ValueError(f"sampling_probability must be batch_size/dataset_size = {q}, "
                                 f"got {record['sampling_probability']!r}")
            if dp_event_from_dict(record["event"]) != expected:
                raise ValueError(f"event does not match its parameters: expected "
                                 f"{dp_event_to_dict(expected)}, got {record['event']!r}")
    except KeyError as err:
        raise ValueError(f"{mechanism} record is missing field {err.args[0]!r}") from None
    return record


def accountable_event(record) -> dp_accounting.DpEvent:
    """The part of a record a PLD/RDP accountant composes: the histogram's Gaussian event, the
    training event, or NonPrivateDpEvent."""
    record = validate_record(record)
    if record["mechanism"] == "dp_histogram":
        return dp_event_from_dict(record["gaussian"])
    return dp_event_from_dict(record["event"])
