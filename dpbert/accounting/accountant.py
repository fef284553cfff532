r"""The privacy ledger: ε of DP-SGD, of the vocabulary, and of the whole run.

Everything is recomputed from the events recorded on the artifacts (``dpbert.privacy.events``)
or, before a run, from the configuration alone (``planned_ledger``). The unit of privacy is one
N-word tuple (or one patient with ≤ k tuples, ``privacy.unit = patient``); every mechanism of a
ledger must use the same unit.

Contract: ``dpsgd_epsilon`` / ``dpsgd_report`` account DP-SGD with dp-accounting's RDP and PLD
accountants; ``ledger`` composes the vocabulary's Gaussian part with every training event in one
PLD at δ_c = δ_target − δ₂ (the threshold's δ₂ added outside: the split bound), and states the
basic and RDP bounds with their δ splits; a non-private stage makes every ε infinite (reports say
``"non_private": True``); a shuffle record makes the ledger hold for zero-out adjacency only, and
it says so. ``planned_ledger``'s ``within_budget`` is the budget gate's verdict
(``dpbert.accounting.gate``) on this run alone on a fresh dataset. Derivations and reference
values: docs/privacy.md ("The privacy ledger's derivation").
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional

import dp_accounting

from dpbert.accounting import gate as _gate
from dpbert.accounting import solver as _solver
from dpbert.accounting.sigma import accounted_sigma
from dpbert.accounting.epsilon import ACCOUNTANTS, epsilon as _epsilon, make_accountant as _make_accountant
from dpbert.privacy import _checks
from dpbert.privacy import events as _events
from dpbert.privacy import histogram as _histogram
from dpbert.privacy.plan import plan_training, steps_for  # noqa: F401  (steps_for: re-exported)

PLD_DISCRETIZATION = _histogram.PLD_DISCRETIZATION
TF_PRIVACY_NOTE = (
    "tensorflow-privacy 0.9.0's compute_dp_sgd_privacy_statement assumes used_microbatching=True "
    "by default, which halves the noise multiplier (16.384 instead of 2.597 for n=60000, B=256, "
    "sigma=1.1, 60 epochs, delta=1e-5); dpbert clips per example, so pass "
    "used_microbatching=False to compare.")


# ------------------------------------------------------------------------------------ DP-SGD

def dpsgd_epsilon(noise_multiplier: float, sampling_probability: float, steps: int, delta: float,
                  sampling: str = "poisson", accountant: str = "pld",
                  max_contributions: int = 1, user_level: bool = False) -> float:
    """ε of ``steps`` DP-SGD steps at δ (event: ``events.dpsgd_dp_event``); ``user_level``: per
    patient, q the patient sampling rate."""
    delta = _checks.probability("delta", delta)
    event = _events.dpsgd_dp_event(noise_multiplier, sampling_probability, steps, sampling,
                                   max_contributions, user_level)
    return _epsilon(event, delta, accountant)


def dpsgd_report(examples: int, batch_size: int, noise_multiplier: float, delta: float,
                 epochs: Optional[float] = None, steps: Optional[int] = None,
                 sampling: str = "poisson", max_contributions: int = 1,
                 unit: Optional[str] = None) -> Dict[str, Any]:
    """ε of DP-SGD on n = ``examples`` with batch B (give exactly one of epochs and steps).

    ``unit="patient"``: user-level DP-SGD — ``examples`` is the number of PATIENTS, ``batch_size``
    the expected patients per step, the ε is per patient (epochs are passes over the patients).

    Returns: examples, batch_size, noise_multiplier, delta, steps, epochs (= steps·B/n),
    sampling_probability (B/n), sampling, adjacency, unit, max_contributions, epsilon_rdp,
    epsilon_pld, event (the training record), tf_privacy_note, and for shuffle participations /
    straddling.
    """
    delta = _checks.probability("delta", delta)
    examples = _checks.integer("examples", examples, 1)
    batch_size = _checks.integer("batch_size", batch_size, 1)
    if (epochs is None) == (steps is None):
        raise ValueError(f"exactly one of epochs and steps must be given, got epochs={epochs!r}, "
                         f"steps={steps!r}")
    if steps is None:
        steps = steps_for(examples, batch_size, epochs)
    record = _events.dpsgd_event(noise_multiplier, batch_size, examples, steps, sampling,
                                 max_contributions, unit=unit)
    event = _events.dp_event_from_dict(record["event"])
    report = {
        "examples": examples, "batch_size": batch_size, "noise_multiplier": float(noise_multiplier),
        "delta": delta, "steps": record["steps"], "epochs": record["steps"] * batch_size / examples,
        "sampling_probability": record["sampling_probability"], "sampling": sampling,
        "adjacency": record["adjacency"], "unit": record["unit"],
        "max_contributions": record["max_contributions"],
        "epsilon_rdp": _epsilon(event, delta, "rdp"),
        "epsilon_pld": _epsilon(event, delta, "pld"),
        "event": record,
        "tf_privacy_note": TF_PRIVACY_NOTE,
    }
    if sampling == "shuffle":
        report["participations"] = record["participations"]
        report["straddling"] = record["straddling"]
    if record.get("sampling_unit") == "patient":
        report.update(patients=examples, patients_per_step=batch_size, sampling_unit="patient")
    return report


def noise_multiplier_for_target(target_epsilon: float, sampling_probability: float, steps: int,
                                delta: float, sampling: str = "poisson", accountant: str = "pld",
                                tol: float = 1e-3, max_contributions: int = 1) -> float:
    """Smallest σ (within ``tol``) whose DP-SGD ε at δ is ≤ ``target_epsilon``: the one solver
    (``dpbert.accounting.solver.smallest_sigma``); for PLD it starts from the (cheap) RDP answer,
    so the slow PLD is never evaluated at a σ much smaller than the answer."""
    target_epsilon = _checks.positive("target_epsilon", target_epsilon)
    delta = _checks.probability("delta", delta)
    tol = _checks.positive("tol", tol)
    _checks.choice("accountant", accountant, ACCOUNTANTS)
    # Validate the remaining arguments once, with clear messages.
    _events.dpsgd_dp_event(1.0, sampling_probability, steps, sampling, max_contributions)

    def eps(sigma: float) -> float:
        event = _events.dpsgd_dp_event(sigma, sampling_probability, steps, sampling, max_contributions)
        return _epsilon(event, delta, accountant)

    start = 1.0
    if accountant == "pld":
        start = noise_multiplier_for_target(target_epsilon, sampling_probability, steps, delta, sampling, "rdp",
                                            tol, max_contributions)
    rtol = tol / max(start, 1.0) / 2
    return _solver.smallest_sigma(eps, target_epsilon, start, rtol=rtol, factor=1.25 if accountant == "pld" else 2.0)


# ------------------------------------------------------------------------------------ ledger

def ledger(vocab_event_json, train_event_jsons: Iterable, delta_target: float) -> Dict[str, Any]:
    """Compose the vocabulary record and the training records at total δ = ``delta_target``.

    ``vocab_event_json``: a vocabulary record (JSON text or dict: ``events.histogram_event`` or
    ``events.non_private_event("vocab")``), or None — or a ``mechanism: public`` record
    (``vocab.source: public``, ``dpbert.vocab.public.public_vocab_event``) — if no vocabulary
    was built from private data: nothing is charged for it. ``train_event_jsons``: training records (``events.dpsgd_event`` /
    ``non_private_event("train")``), composed in order.

    Returns (ε as float, ``inf`` for a non-private stage):
      epsilon_vocab at delta_vocab (the histogram's own total δ),
      epsilon_train (PLD) and epsilon_train_rdp at delta_train = delta_target − delta_vocab,
      epsilon_total_basic = epsilon_vocab + epsilon_train (δ = delta_vocab + delta_train),
      epsilon_total_pld, epsilon_total_rdp at delta_composed = delta_target − delta_threshold
        (vocabulary Gaussian + training in one accountant, the threshold's δ₂ added at the end),
      epsilon_total (= epsilon_total_pld), delta / delta_total (= delta_target), delta_vocab,
      delta_train, delta_threshold, delta_composed, steps, non_private, unit, max_contributions.
    """
    delta_target = _checks.probability("delta_target", delta_target)
    if isinstance(train_event_jsons, (str, bytes, Mapping)):
        raise ValueError("train_event_jsons must be a list of training records")
    vocab = None if vocab_event_json is None or is_public_vocab_record(vocab_event_json) \
        else _events.validate_record(vocab_event_json)
    trains = [_events.validate_record(t) for t in train_event_jsons]
    if vocab is not None and vocab["stage"] != "vocab":
        raise ValueError(f"vocab_event_json must be a vocabulary record, got stage {vocab['stage']!r}")
    for record in trains:
        if record["stage"] != "train":
            raise ValueError(f"train_event_jsons must hold training records, got stage {record['stage']!r}")

    units = {(r["unit"], r["max_contributions"]) for r in ([vocab] if vocab else []) + trains
             if r["mechanism"] != "non_private"}
    if len(units) > 1:
        raise ValueError(f"all records must use the same privacy unit, got {sorted(units)}")
    unit, k = next(iter(units)) if units else ("tuple", 1)

    non_private = any(r["mechanism"] == "non_private" for r in ([vocab] if vocab else []) + trains)
    steps = sum(r.get("steps", 0) for r in trains)

    if vocab is not None and vocab["mechanism"] == "dp_histogram":
        delta_vocab = vocab["delta"]
        delta_threshold = vocab["threshold_delta"]
    else:
        delta_vocab = delta_threshold = 0.0
    delta_train = delta_target - delta_vocab
    delta_composed = delta_target - delta_threshold
    if delta_train <= 0 or delta_composed <= 0:
        raise ValueError(f"delta_target must be > the vocabulary's delta {delta_vocab:.6g}, "
                         f"got {delta_target!r}")

    result: Dict[str, Any] = {
        "delta": delta_target, "delta_total": delta_target, "delta_vocab": delta_vocab,
        "delta_train": delta_train if trains else 0.0, "delta_threshold": delta_threshold,
        "delta_composed": delta_composed, "steps": steps, "unit": unit, "max_contributions": k,
        "non_private": non_private, "training_records": len(trains),
        "adjacency": ledger_adjacency(trains),
    }
    vocab_private = vocab is not None and vocab["mechanism"] == "dp_histogram"
    trains_private = all(r["mechanism"] in ("dp_sgd", "dp_count") for r in trains)
    if vocab is None:
        epsilon_vocab = 0.0
    else:
        epsilon_vocab = _vocab_epsilon(vocab) if vocab_private else math.inf
    if not trains:
        epsilon_train = epsilon_train_rdp = 0.0
    elif trains_private:
        epsilon_train = _train_epsilon(trains, delta_train, "pld")
        epsilon_train_rdp = _train_epsilon(trains, delta_train, "rdp")
    else:
        epsilon_train = epsilon_train_rdp = math.inf
    result.update({"epsilon_vocab": epsilon_vocab, "epsilon_train": epsilon_train,
                   "epsilon_train_rdp": epsilon_train_rdp,
                   "epsilon_total_basic": epsilon_vocab + epsilon_train})
    if non_private:
        result.update({"epsilon_total_pld": math.inf, "epsilon_total_rdp": math.inf})
    elif vocab is None and not trains:
        result.update({"epsilon_total_pld": 0.0, "epsilon_total_rdp": 0.0})
    else:
        composed = dp_accounting.ComposedDpEvent(
            ([_events.accountable_event(vocab)] if vocab else [])
            + [_events.accountable_event(r) for r in trains])
        result.update({"epsilon_total_pld": _epsilon(composed, delta_composed, "pld"),
                       "epsilon_total_rdp": _epsilon(composed, delta_composed, "rdp")})
    result["epsilon_total"] = result["epsilon_total_pld"]
    return result


def ledger_adjacency(train_records) -> str:
    """The neighbouring relation the whole ledger holds for: add/remove one unit unless a
    training record is accounted under zero-out (shuffle), which the vocabulary also satisfies."""
    kinds = {r.get("adjacency") for r in train_records if r.get("mechanism") == "dp_sgd"}
    return "zero_out" if "zero_out" in kinds else "add_or_remove_one"


def _vocab_epsilon(vocab: Mapping[str, Any]) -> float:
    return _histogram.histogram_epsilon(vocab["sigma"], vocab["delta"], vocab["threshold"],
                                        vocab["tuple_words"], vocab["max_contributions"])


def _train_epsilon(trains: List[Mapping[str, Any]], delta: float, kind: str) -> float:
    return _epsilon(dp_accounting.ComposedDpEvent([_events.accountable_event(r) for r in trains]),
                    delta, kind)


# ---------------------------------------------------------------------------------- planning

#: The ``mechanism`` of a vocabulary record when no private data was read (``vocab.source: public``).
PUBLIC_VOCAB_MECHANISM = "public"


def public_vocab_record(source: str = "public", checkpoint_sha256: str = "") -> Dict[str, Any]:
    """The vocabulary record of ``vocab.source: public``: composed as no event (ε_V = 0, δ_V = 0)."""
    return {"schema": _events.SCHEMA, "mechanism": PUBLIC_VOCAB_MECHANISM, "stage": "vocab", "source": source,
            "public_checkpoint_vocab_sha256": checkpoint_sha256, "epsilon": 0.0, "delta": 0.0}


def is_public_vocab_record(record) -> bool:
    """A vocabulary record that says no private data was read (``vocab.source: public``)."""
    if isinstance(record, (str, bytes)):
        record = _events.from_json(record)
    return isinstance(record, Mapping) and record.get("mechanism") == PUBLIC_VOCAB_MECHANISM \
        and record.get("stage") == "vocab"


def _planned_n(config, dataset_size: Optional[int]) -> int:
    patient_unit = config.privacy.unit == "patient"
    if dataset_size is None:
        train_cfg = config.training
        dataset_size = train_cfg.dataset_patients if patient_unit else train_cfg.dataset_size
    if dataset_size is None:
        raise ValueError("dataset_size must be given (or training.dataset_size set), got None")
    return _checks.integer("dataset_size", dataset_size, 1)


def _planned_training(config, n: int, dp_count: bool):
    """(TrainingPlan, training records) of ``config`` over the public n: the records the trainer
    writes — ``[count record, dpsgd record]`` with ``dp_count``, else ``[dpsgd record]``
    (``[non_private]`` for ``training.non_private``)."""
    privacy, train_cfg = config.privacy, config.training
    k = privacy.max_tuples_per_patient if privacy.unit == "patient" else 1
    plan = plan_training(train_cfg, n, config.membership.holdout_patient_fraction, unit=privacy.unit,
                         max_contributions=k)
    if train_cfg.non_private:
        return plan, [_events.non_private_event("train")]
    # The σ the trainer will record: the gradient's σ combined with its DP diagnostics.
    sigma = accounted_sigma(train_cfg.noise_multiplier, train_cfg)
    records = [_events.dpsgd_event(sigma, train_cfg.batch_size, plan.dataset_size, plan.steps, train_cfg.sampling,
                                   k, unit=privacy.unit)]
    if dp_count:
        # The trainer's DP count of the trained-on units (dpbert.stages.pretrain.plan_for): a
        # Gaussian of σ_c, sensitivity 1 per tuple or per patient (the record names k), released
        # n̂ ≈ the plan's n. Charged in ε_T as the trainer charges it.
        from dpbert.privacy import count as _count

        records.insert(0, _count.count_event(train_cfg.count_noise_multiplier, plan.dataset_size, unit=privacy.unit,
                                             max_contributions=k))
    return plan, records


def _planned_vocab_record(config) -> Dict[str, Any]:
    """The vocabulary record a run of ``config`` will write (public, non-private or the DP histogram's)."""
    privacy, vocab_cfg = config.privacy, config.vocab
    if vocab_cfg.source == "public":
        return public_vocab_record("public")  # the public checkpoint's vocabulary: nothing charged
    if vocab_cfg.non_private:
        return _events.non_private_event("vocab")
    # dp and public+dp: the same DP histogram (public+dp appends released words: post-processing).
    k = privacy.max_tuples_per_patient if privacy.unit == "patient" else 1
    return _events.histogram_event(_histogram.histogram_report(vocab_cfg.sigma, vocab_cfg.delta, privacy.tuple_words,
                                                               vocab_cfg.threshold_mode, k, unit=privacy.unit))


def planned_records(config, dataset_size: Optional[int] = None, dp_count: bool = False) -> List[Dict[str, Any]]:
    """The records a run of ``config`` will write, vocabulary first (no ε computed)."""
    vocab = _planned_vocab_record(config)
    _, trains = _planned_training(config, _planned_n(config, dataset_size), dp_count)
    return ([] if is_public_vocab_record(vocab) else [vocab]) + list(trains)


def planned_ledger(config, dataset_size: Optional[int] = None, dp_count: bool = False) -> Dict[str, Any]:
    """The ε a configuration WILL spend, from the configuration alone (no private data read).

    ``dataset_size``: n, the number of tuples (a public lower bound is fine: the trainer samples
    with the planned q = B/n); default ``config.training.dataset_size`` — for
    ``privacy.unit: patient`` the number of PATIENTS, default ``training.dataset_patients``
    (user-level DP-SGD: B patients per step, the training event per patient).
    ``dp_count``: the configuration has no public n, so the trainer will plan from a DP count
    (``dpbert.privacy.count``, σ_c = ``training.count_noise_multiplier``) and charge it: its record
    is planned too, at n̂ = the plan's n (what ``dpbert budget --examples N`` passes then).
    Returns the ``ledger`` fields plus epsilon_budget, within_budget (epsilon_total_pld ≤ budget;
    True without a budget), dataset_size, batch_size, sampling, sampling_probability,
    noise_multiplier, dataset_size_source ("public" | "dp_count"), vocab_event and train_events
    (the records the run should write, in its order).
    """
    train_cfg = config.training
    n = _planned_n(config, dataset_size)
    vocab_record = _planned_vocab_record(config)
    delta_vocab = vocab_record.get("delta", 0.0) if vocab_record["mechanism"] == "dp_histogram" else 0.0
    plan, train_records = _planned_training(config, n, dp_count)
    result = ledger(vocab_record, train_records, delta_vocab + train_cfg.delta)
    budget = config.privacy.epsilon_budget
    result.update({
        "epsilon_budget": budget,
        # The gate's verdict on this run alone on a fresh dataset (pipeline.guard adds the dataset's).
        "within_budget": _gate.alone(config, vocab_record, train_records).admitted,
        "dataset_size": plan.dataset_size, "batch_size": train_cfg.batch_size, "sampling": train_cfg.sampling,
        "sampling_probability": plan.sampling_probability, "plan": plan.to_dict(),
        "noise_multiplier": train_cfg.noise_multiplier, "steps": plan.steps,
        "dataset_size_source": "dp_count" if dp_count and not train_cfg.non_private else "public",
        "vocab_event": vocab_record, "train_events": train_records,
    })
    return result


def noise_multiplier_for_planned_target(config, target_epsilon: float, dataset_size: Optional[int] = None,
                                        dp_count: bool = False, rtol: float = 2e-4) -> float:
    """The smallest ``training.noise_multiplier`` σ (within relative ``rtol``, rounded UP) whose
    PLANNED ledger (``planned_ledger(config with σ, dataset_size, dp_count)``) records
    ε_T = ``epsilon_train`` ≤ ``target_epsilon``.

    ε_T is what the ledger will record for training: the DP-SGD steps at the σ_eff of the gradient
    AND its DP diagnostics (``dpbert.privacy.diagnostics``), plus the DP count when ``dp_count``
    (the vocabulary is not part of ε_T: see ``epsilon_total_pld`` of the planned ledger for the
    whole run). Search: bracket from RDP's answer for the bare event, then regula falsi
    (Illinois) on log ε_T(log σ) over exactly the training records ``planned_ledger`` composes —
    ε_T(σ_hi) ≤ target is kept at every step, so the returned σ meets the target.
    ValueError: a non-private configuration, or a target the DP count alone exceeds.
    """
    import dataclasses

    target_epsilon = _checks.positive("target_epsilon", target_epsilon)
    rtol = _checks.positive("rtol", rtol)
    if config.training.non_private:
        raise ValueError("training.non_private is set: its ε is infinite, no noise multiplier meets a target")
    n = _planned_n(config, dataset_size)
    delta_vocab = 0.0  # ε_T is at δ_T = δ_total − δ_V = training.delta, computed as ``ledger`` does
    if config.vocab.source != "public" and not config.vocab.non_private:
        delta_vocab = _histogram.histogram_report(config.vocab.sigma, config.vocab.delta, config.privacy.tuple_words,
                                                  config.vocab.threshold_mode,
                                                  config.privacy.max_tuples_per_patient
                                                  if config.privacy.unit == "patient" else 1,
                                                  unit=config.privacy.unit)["delta"]
    delta_train = (delta_vocab + config.training.delta) - delta_vocab

    def eps(sigma: float) -> float:
        configured = dataclasses.replace(config, training=dataclasses.replace(config.training, noise_multiplier=sigma))
        _, records = _planned_training(configured, n, dp_count)
        return _train_epsilon(records, delta_train, "pld")

    if dp_count:
        _, records = _planned_training(config, n, True)
        count_epsilon = _train_epsilon(records[:1], delta_train, "pld")
        if count_epsilon >= target_epsilon:
            raise ValueError(f"ε_T = {target_epsilon:g} cannot be met: the DP count alone (σ_c = "
                             f"{config.training.count_noise_multiplier:g}) charges ε = {count_epsilon:.4g}; raise "
                             f"training.count_noise_multiplier or configure a public n (training.dataset_size, "
                             f"or training.dataset_patients for privacy.unit = patient)")
    # A first guess: RDP's σ_eff for the bare DP-SGD event, turned into the gradient's σ.
    _, records = _planned_training(config, n, False)
    record = records[-1]
    try:
        guess_eff = noise_multiplier_for_target(target_epsilon, record["sampling_probability"], record["steps"],
                                                delta_train, record["sampling"], "rdp", 1e-2)
        start = guess_eff / accounted_sigma(1.0, config.training)  # σ_eff is linear in σ
    except ValueError:
        start = float(config.training.noise_multiplier)
    return _solver.smallest_sigma(eps, target_epsilon, start, rtol=rtol, factor=1.15)


def noise_multiplier_for_whole_target(config, target_epsilon: float, n: int, dp_count: bool,
                                      rtol: float = 2e-3) -> float:
    """The smallest ``training.noise_multiplier`` σ (within relative ``rtol``) whose planned ledger
    records a WHOLE-run ε (``epsilon_total_pld``: vocabulary, DP count and training composed) ≤
    ``target_epsilon`` — the one solver over that ε(σ). The whole-run ε decreases with σ towards what
    the vocabulary (and the DP count) spend alone: a target at or below that is a ``ValueError``
    naming their parameters."""
    import dataclasses

    def whole(sigma: float) -> float:
        configured = dataclasses.replace(config, training=dataclasses.replace(config.training, noise_multiplier=sigma))
        return planned_ledger(configured, n, dp_count=dp_count)["epsilon_total_pld"]

    floor = whole(1e3)  # ε_T ≈ 0 at σ = 1000 (a larger σ underflows the RDP accountant)
    if floor >= target_epsilon:
        raise ValueError(f"the whole-run ε cannot reach {target_epsilon:g}: the vocabulary"
                         f"{' and the DP count' if dp_count else ''} alone spend ε = {floor:.4g} (raise vocab.sigma"
                         f"{', training.count_noise_multiplier' if dp_count else ''}, or target the training alone "
                         f"with --target training)")
    return _solver.smallest_sigma(whole, target_epsilon, max(float(config.training.noise_multiplier), 1e-2),
                                  rtol=rtol, factor=2.0)
