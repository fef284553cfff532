"""The recorded DP-SGD event against the values the training run actually USED.

The white-box audit (``whitebox_audit``) scores its canaries at the CLAIMED σ and adds them after
the sampler and the clipping: a record whose q, step count or σ is wrong passes it whenever the
wrong claim is beyond the audit's reach. This check closes that gap for the record itself. The
trainer captures, from the running objects (``dpbert.mechanism.integrity.observe``)::

    sampling, sampling_probability   the running sampler's mode and q (what it sampled with)
    sampling_unit, group_size        patient sampler or not; k of the step's clipping groups
    sampler_k                        k of the patient sampler (None per tuple)
    steps_executed                   the write-ahead ledger's count, read back from disk
    base_noise_multiplier            σ given to the step
    gradient_noise_multiplier        σ of the one draw the step adds (σ, or σ√(P·T) in paper mode)
    noise_mode, replicas, accumulation_steps
                                     the step's mode, P from the running strategy, T
    diagnostic_noise_multipliers     noise std / sensitivity of each released diagnostic sum
    expected_batch_size              the step's public divisor B
    batch_size, units                shuffle only: the sampler's fixed B and n (PRIVATE: exact n)

and :func:`check_event` recomputes from them what the record must say — σ_eff (the gradient σ
and the diagnostics composed: docs/privacy.md), q, steps, sampling, k — rebuilds the
dp-accounting event from those values and compares it with the record's. A record rebuilt from
the configuration would prove nothing: every value here comes from the object that used it.

Pure (no TensorFlow, nothing above ``dpbert.privacy``): the stage calls it before it writes the
events, and a mismatch raises :class:`IntegrityCheckFailed` (the run fails, nothing is released).
Mismatch messages name the field and the recorded / running values of public parameters only
(never the exact number of units).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping

from dpbert.privacy import events


class IntegrityCheckFailed(RuntimeError):
    """A run-time integrity check of the training run failed (``dpbert.mechanism.integrity``) or the
    recorded DP event disagrees with the running mechanism (:func:`check_event`): the run fails
    and nothing is released. The message names the check, never raw text or an exact count."""


#: Keys :func:`check_event` reads from ``observed``.
OBSERVED_KEYS = ("sampling", "sampling_probability", "sampling_unit", "group_size", "sampler_k",
                 "steps_executed", "base_noise_multiplier", "gradient_noise_multiplier", "noise_mode",
                 "replicas", "accumulation_steps", "diagnostic_noise_multipliers", "expected_batch_size")

_REL = 1e-9


def _close(a, b, rel: float = _REL) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=0.0)


def accounted_noise_multiplier(gradient_sigma: float, diagnostic_multipliers: Mapping[str, float]) -> float:
    """σ_eff = (σ⁻² + Σ_j σ_j⁻²)^(−1/2): one Gaussian mechanism releasing the gradient and every
    diagnostic sum j whose noise std / sensitivity is σ_j (``dpbert.privacy.diagnostics``)."""
    inverse_sq = float(gradient_sigma) ** -2 + sum(float(s) ** -2 for s in diagnostic_multipliers.values())
    return 1.0 / math.sqrt(inverse_sq)


def check_event(record: Mapping[str, Any], observed: Mapping[str, Any]) -> List[str]:
    """Mismatches between a training record (``events.dpsgd_event``) and the running objects'
    values ``observed`` (module docstring); an empty list when they agree."""
    missing = [k for k in OBSERVED_KEYS if k not in observed]
    if missing:
        return [f"observed values missing: {', '.join(missing)}"]
    try:
        record = events.validate_record(record)
    except ValueError as err:
        return [f"the record is not a valid DP event ({err})"]
    if record["mechanism"] != "dp_sgd":
        return [f"the training record's mechanism is {record['mechanism']!r}, the run is DP-SGD"]
    out: List[str] = []
    sampling = observed["sampling"]
    if record["sampling"] != sampling:
        out.append(f"sampling: record {record['sampling']!r}, running sampler {sampling!r}")
    q = float(observed["sampling_probability"])
    if not _close(record["sampling_probability"], q):
        out.append(f"sampling_probability: record {record['sampling_probability']:.10g}, running sampler q {q:.10g}")
    steps = int(observed["steps_executed"])
    if int(record["steps"]) != steps:
        out.append(f"steps: record {record['steps']}, write-ahead ledger {steps} executed")

    mode = observed["noise_mode"]
    base = float(observed["base_noise_multiplier"])
    gradient = float(observed["gradient_noise_multiplier"])
    replicas, accumulation = int(observed["replicas"]), int(observed["accumulation_steps"])
    if mode == "once":
        applied = base
    elif mode == "paper":
        applied = base * math.sqrt(replicas * accumulation)
    else:
        applied = float("nan")
        out.append(f"noise_mode: unknown mode {mode!r} in the running step")
    if mode in ("once", "paper") and not _close(gradient, applied):
        out.append(f"gradient noise multiplier: the step adds {gradient:.10g}, its mode {mode!r} with "
                   f"P·T = {replicas * accumulation} gives {applied:.10g}")
    sigma = accounted_noise_multiplier(gradient, observed["diagnostic_noise_multipliers"] or {})
    if not _close(record["noise_multiplier"], sigma):
        out.append(f"noise_multiplier: record {record['noise_multiplier']:.10g}, running step σ_eff {sigma:.10g} "
                   f"(gradient σ {gradient:.10g} with {len(observed['diagnostic_noise_multipliers'] or {})} "
                   f"diagnostic sums)")

    user_level = observed["sampling_unit"] == "patient"
    k = int(observed["group_size"])
    if user_level != (record.get("sampling_unit", "tuple") == "patient"):
        out.append(f"sampling unit: record {record.get('sampling_unit', 'tuple')!r}, running sampler "
                   f"{observed['sampling_unit']!r}")
    if user_level and observed["sampler_k"] is not None and int(observed["sampler_k"]) != k:
        out.append(f"k: the sampler brings <= {observed['sampler_k']} rows per patient, the step clips groups of {k}")
    if int(record["max_contributions"]) != k:
        out.append(f"max_contributions: record {record['max_contributions']}, the step clips groups of {k}")

    divisor = float(observed["expected_batch_size"])
    recorded_b = float(record["batch_size"]) if sampling == "shuffle" else \
        float(record["sampling_probability"]) * float(record["dataset_size"])
    if not _close(divisor, recorded_b, 1e-6):
        out.append(f"normaliser: the step divides by {divisor:.10g}, the record's expected batch is {recorded_b:.10g}")
    if sampling == "shuffle":
        if observed.get("batch_size") is not None and int(observed["batch_size"]) != int(record["batch_size"]):
            out.append(f"batch_size: record {record['batch_size']}, running shuffle sampler {observed['batch_size']}")
        if observed.get("units") is not None and int(observed["units"]) != int(record["dataset_size"]):
            out.append("dataset_size: the record's n is not the number of rows the shuffle sampler permutes")

    if not out:  # the parameters agree: the event must be the one they give
        try:
            # σ was compared above at rel 1e-9 (σ_eff is computed two ways, equal to the last bits
            # only); the event's structure, q and steps must then match exactly.
            expected = events.dpsgd_dp_event(float(record["noise_multiplier"]), q, steps, sampling, k, user_level)
        except ValueError as err:
            return [f"the running values give no DP event ({err})"]
        if events.dp_event_from_dict(record["event"]) != expected:
            out.append(f"event: record {record['event']!r}, running values give {events.dp_event_to_dict(expected)!r}")
    return out


def summary(results: Mapping[str, Mapping[str, Any]]) -> Dict[str, str]:
    """Pass/fail per check of an ``integrity_checks`` dict, nothing else (no statistic, no count):
    what the model properties may carry."""
    out = {}
    for name, result in results.items():
        if not result.get("ran", False):
            out[name] = f"not run: {result.get('reason', 'off')}"
        else:
            out[name] = "passed" if result.get("passed") else "FAILED"
    return out
