"""DP event records: JSON codec, round trips, recomputation checks."""
import json
import math

import dp_accounting as dpa
import numpy as np
import pytest

from dpbert import schema
from dpbert.privacy import events as E
from dpbert.privacy import histogram as H

ALL_EVENTS = [
    dpa.NoOpDpEvent(),
    dpa.NonPrivateDpEvent(),
    dpa.GaussianDpEvent(1.1),
    dpa.LaplaceDpEvent(0.5),
    dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063),
    dpa.SampledWithoutReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(2.0)),
    dpa.SampledWithReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(2.0)),
    dpa.ComposedDpEvent([dpa.GaussianDpEvent(12.5),
                         dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.1), 60)]),
]


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_dp_event_json_round_trip(event):
    data = E.dp_event_to_dict(event)
    assert data["type"] == type(event).__name__
    assert E.dp_event_from_dict(json.loads(json.dumps(data))) == event
    assert E.dp_event_from_dict(E.from_json(E.to_json(event))) == event


def test_dp_event_shape():
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(1.1)), 3)
    assert E.dp_event_to_dict(event) == {
        "type": "SelfComposedDpEvent", "count": 3,
        "event": {"type": "PoissonSampledDpEvent", "sampling_probability": 0.5,
                  "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.1}}}


@pytest.mark.parametrize("data,message", [
    ({"type": "os.system"}, "event type must be one of"),
    ({"noise_multiplier": 1.0}, "event must be a mapping with a 'type'"),
    ({"type": "GaussianDpEvent", "noise_multiplier": 1.0, "extra": 1}, "are not fields of"),
    ({"type": "GaussianDpEvent"}, "GaussianDpEvent.noise_multiplier is missing"),
])
def test_dp_event_from_dict_rejects(data, message):
    with pytest.raises(ValueError, match=message):
        E.dp_event_from_dict(data)


def test_infinity_is_strict_json():
    text = E.to_json({"epsilon": math.inf, "low": -math.inf, "x": [1.0, math.nan], "n": np.float64(2.5)})
    assert "Infinity" not in text and "NaN" not in text
    data = json.loads(text)                       # strict JSON parser accepts it
    assert data["epsilon"] == "inf" and data["low"] == "-inf"
    back = E.from_json(text)
    assert back["epsilon"] == math.inf and back["low"] == -math.inf and math.isnan(back["x"][1])
    assert back["n"] == 2.5
    # the events API is the artifact contract's codec, not a copy of it
    assert text == schema.dumps({"epsilon": math.inf, "low": -math.inf, "x": [1.0, math.nan], "n": 2.5})


def test_histogram_event_round_trip_and_recomputation():
    report = H.histogram_report(200.0, 1e-9, 256)
    record = E.histogram_event(report)
    assert record["mechanism"] == "dp_histogram" and record["schema"] == E.SCHEMA
    assert E.dp_event_from_dict(record["gaussian"]) == dpa.GaussianDpEvent(12.5)
    assert record["threshold"] == report["threshold"] and record["delta"] == 1e-9
    assert record["threshold_delta"] == pytest.approx(1e-9, rel=1e-9)
    again = E.validate_record(E.to_json(record))
    assert again == record
    assert E.accountable_event(E.to_json(record)) == dpa.GaussianDpEvent(12.5)

    # A record may not understate the threshold's δ (e.g. the paper's C with a claimed 1e-9) ...
    paper = E.histogram_event(H.histogram_report(200.0, 1e-9, 256, threshold_mode="paper"))
    assert paper["threshold_delta"] == pytest.approx(1.18e-4, rel=1e-2)
    forged = dict(paper, threshold_delta=1e-9)
    with pytest.raises(ValueError, match="threshold_delta must be >="):
        E.validate_record(forged)
    # ... nor claim a Gaussian event its σ and sensitivity do not give.
    with pytest.raises(ValueError, match="gaussian must be GaussianDpEvent"):
        E.validate_record(dict(record, gaussian={"type": "GaussianDpEvent", "noise_multiplier": 100.0}))
    with pytest.raises(ValueError, match="sensitivity_l2 must be"):
        E.validate_record(dict(record, sensitivity_l2=1.0))


def test_patient_histogram_event():
    record = E.histogram_event(H.histogram_report(200.0, 1e-9, 256, max_contributions=4))
    assert record["unit"] == "patient" and record["max_contributions"] == 4
    assert E.dp_event_from_dict(record["gaussian"]) == dpa.GaussianDpEvent(200.0 / (4 * 16))


def test_dpsgd_poisson_event():
    record = E.dpsgd_event(1.1, 256, 60000, 14063)
    expected = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)
    assert E.dp_event_from_dict(record["event"]) == expected
    assert (record["sampling"], record["steps"], record["noise_multiplier"], record["batch_size"],
            record["dataset_size"], record["adjacency"]) == ("poisson", 14063, 1.1, 256, 60000,
                                                             "add_or_remove_one")
    assert record["sampling_probability"] == 256 / 60000
    assert E.validate_record(E.to_json(record)) == record
    # The event is recomputed from the parameters: a record cannot claim fewer steps.
    tampered = json.loads(E.to_json(record))
    tampered["event"]["count"] = 10
    with pytest.raises(ValueError, match="event does not match its parameters"):
        E.validate_record(tampered)
    with pytest.raises(ValueError, match="sampling_probability must be batch_size/dataset_size"):
        E.validate_record(dict(record, sampling_probability=0.001))


def test_dpsgd_patient_poisson_event():
    q, k = 0.01, 5
    event = E.dpsgd_dp_event(2.0, q, 100, "poisson", max_contributions=k)
    inner = event.event
    assert inner.sampling_probability == pytest.approx(1 - (1 - q) ** k, rel=1e-12)
    assert inner.event == dpa.GaussianDpEvent(2.0 / k)
    assert event.count == 100


def _max_sum_squares(n, batch, steps, seed):
    """Largest Σ_s a_s² over examples, a_s = occurrences of the example in step s, for batches
    cut as consecutive windows of a stream of random permutations (the ShuffleSampler)."""
    rng = np.random.default_rng(seed)
    stream = np.concatenate([rng.permutation(n) for _ in range(steps * batch // n + 2)])
    total = np.zeros(n)
    for s in range(steps):
        occurrences = np.bincount(stream[s * batch:(s + 1) * batch], minlength=n)
        total += occurrences.astype(float) ** 2
    per_example = np.bincount(stream[:steps * batch], minlength=n)
    return total.max(), per_example.max()


@pytest.mark.parametrize("n,batch,steps,participations,straddling", [
    (1000, 250, 10, 3, False),      # 2500 positions: 3 permutations touched, aligned
    (1000, 300, 10, 3, True),       # 3000 positions, windows straddle permutations
    (1000, 300, 11, 4, True),       # 3300 → 4
    (60000, 256, 14063, 61, True),  # 60 epochs as steps = ceil(60·n/B): just over 60 permutations
    (60000, 250, 14400, 60, False),
])
def test_shuffle_participations(n, batch, steps, participations, straddling):
    assert E.shuffle_participations(steps, batch / n) == (participations, straddling)
    event = E.dpsgd_dp_event(1.1, batch / n, steps, "shuffle")
    assert event == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.1),
                                            participations * (2 if straddling else 1))


@pytest.mark.parametrize("n,batch,steps", [(10, 3, 40), (12, 4, 30), (7, 5, 50), (50, 45, 40)])
def test_shuffle_count_bounds_simulated_stream(n, batch, steps):
    """The composed count bounds Σ a_s² of every example, for many random streams."""
    q = batch / n
    event = E.dpsgd_dp_event(1.0, q, steps, "shuffle")
    participations, _ = E.shuffle_participations(steps, q)
    worst = 0.0
    for seed in range(200):
        sum_sq, occurrences = _max_sum_squares(n, batch, steps, seed)
        assert occurrences <= participations
        worst = max(worst, sum_sq)
    assert worst <= event.count
    if n % batch == 0:
        assert worst == event.count                  # aligned: exactly E, the bound is tight
    else:
        assert worst > participations                # straddling: counting E alone would be wrong


def test_shuffle_record_and_patient():
    record = E.dpsgd_event(1.0, 300, 1000, 11, sampling="shuffle")
    assert record["adjacency"] == "zero_out"
    assert (record["participations"], record["straddling"]) == (4, True)
    assert E.validate_record(E.to_json(record)) == record
    event = E.dpsgd_dp_event(1.0, 0.25, 8, "shuffle", max_contributions=3)
    assert event == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0 / 3), 2)


def test_non_private_event():
    record = E.non_private_event("train")
    assert E.accountable_event(E.to_json(record)) == dpa.NonPrivateDpEvent()
    with pytest.raises(ValueError, match="stage must be one of"):
        E.non_private_event("eval")


@pytest.mark.parametrize("call,message", [
    (lambda: E.dpsgd_event(-1.0, 256, 60000, 100), "noise_multiplier must be"),
    (lambda: E.dpsgd_event(1.0, 0, 60000, 100), "batch_size must be an integer >= 1"),
    (lambda: E.dpsgd_event(1.0, 256, 100, 100), "batch_size must be <= dataset_size"),
    (lambda: E.dpsgd_event(1.0, 256, 60000, 0), "steps must be an integer >= 1"),
    (lambda: E.dpsgd_event(1.0, 256, 60000, 10, sampling="uniform"), "sampling must be one of"),
    (lambda: E.dpsgd_dp_event(1.0, 0.0, 10), "sampling_probability must be in (0, 1]"),
    (lambda: E.dpsgd_dp_event(1.0, 1.5, 10), "sampling_probability must be in (0, 1]"),
    (lambda: E.dpsgd_dp_event(1.0, 0.1, 10, max_contributions=0), "max_contributions must be"),
    (lambda: E.validate_record({"schema": "other", "mechanism": "dp_sgd"}), "schema must be"),
    (lambda: E.validate_record({"schema": E.SCHEMA, "mechanism": "magic"}), "mechanism must be one of"),
    (lambda: E.validate_record({"schema": E.SCHEMA, "mechanism": "dp_sgd"}), "missing field"),
    (lambda: E.histogram_event({"mechanism": "dp_sgd"}), "report must be a histogram_report"),
])
def test_bad_records_rejected(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_accounted_dataset_size_follows_the_sampler_that_ran():
    from dpbert.privacy.events import accounted_dataset_size, dpsgd_event

    # Poisson keeps the planned q; shuffle must count epochs over the rows actually trained on.
    assert accounted_dataset_size("poisson", 1000, 700) == 1000
    assert accounted_dataset_size("shuffle", 1000, 700) == 700
    planned = dpsgd_event(1.0, 100, 1000, 70, "shuffle")
    actual = dpsgd_event(1.0, 100, accounted_dataset_size("shuffle", 1000, 700), 70, "shuffle")
    assert actual["participations"] > planned["participations"]
    with pytest.raises(ValueError, match="sampling"):
        accounted_dataset_size("random", 10, 10)
