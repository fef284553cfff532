"""Accounting per patient (user-level DP-SGD): the per-patient ε is dp-accounting's
PoissonSampled(Gaussian) at the PATIENT rate; records, ledger, plan, guard and statement speak of
one patient; example-level sampling with group privacy is a different (larger) bound."""
import math

import dp_accounting
import pytest

from dpbert.config import Config, ConfigError
from dpbert.accounting import accountant
from dpbert.privacy import events, histogram, statement
from dpbert.privacy.plan import plan_for_config, plan_training


def _direct(sigma, q, steps, delta, kind="pld"):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    acc = (dp_accounting.pld.PLDAccountant(value_discretization_interval=accountant.PLD_DISCRETIZATION)
           if kind == "pld" else dp_accounting.rdp.RdpAccountant())
    return acc.compose(event).get_epsilon(delta)


@pytest.mark.parametrize("patients,per_step,sigma,steps,k", [
    pytest.param(10_000, 100, 1.0, 500, 8, marks=pytest.mark.slow),  # 84 s of PLD at q = 0.01, 500 steps
    (2_000, 64, 0.9, 200, 1)])
def test_per_patient_epsilon_is_poisson_sampled_gaussian_at_the_patient_rate(patients, per_step, sigma, steps, k):
    record = events.dpsgd_event(sigma, per_step, patients, steps, "poisson", k, unit="patient")
    assert record["unit"] == "patient" and record["sampling_unit"] == "patient" and record["max_contributions"] == k
    q = per_step / patients
    assert record["sampling_probability"] == pytest.approx(q)
    want = _direct(sigma, q, steps, 1e-6)
    led = accountant.ledger(None, [record], 1e-6)
    assert led["epsilon_train"] == pytest.approx(want, rel=1e-12)
    assert led["epsilon_train_rdp"] == pytest.approx(_direct(sigma, q, steps, 1e-6, "rdp"), rel=1e-9)
    assert accountant.dpsgd_epsilon(sigma, q, steps, 1e-6, user_level=True) == pytest.approx(want, rel=1e-12)
    report = accountant.dpsgd_report(patients, per_step, sigma, 1e-6, steps=steps, max_contributions=k, unit="patient")
    assert report["epsilon_pld"] == pytest.approx(want, rel=1e-12) and report["unit"] == "patient"
    assert report["patients"] == patients and report["patients_per_step"] == per_step
    if k > 1:  # NOT example-level sampling with group privacy over k tuples, which is larger
        group = events.dpsgd_event(sigma, per_step, patients, steps, "poisson", k)
        assert "sampling_unit" not in group
        assert accountant.ledger(None, [group], 1e-6)["epsilon_train"] > 2 * want


def test_patient_records_are_validated():
    record = events.dpsgd_event(1.0, 10, 1000, 5, "poisson", 4, unit="patient")
    assert events.validate_record(events.to_json(record)) == record
    bad = dict(record, sampling_unit="tuple")  # claims a patient rate under example-level sampling
    with pytest.raises(ValueError, match="event does not match"):
        events.validate_record(bad)
    with pytest.raises(ValueError, match="unit patient"):
        events.validate_record(dict(record, unit="tuple"))
    with pytest.raises(ValueError, match="Poisson"):
        events.dpsgd_event(1.0, 10, 1000, 5, "shuffle", 4, unit="patient")


def test_ledger_composes_the_patient_vocabulary_and_training_per_patient():
    k = 4
    vocab = events.histogram_event(histogram.histogram_report(50.0, 1e-9, 24, "correct", k, unit="patient"))
    train = events.dpsgd_event(1.0, 10, 1000, 20, "poisson", k, unit="patient")
    led = accountant.ledger(vocab, [train], 1e-9 + 1e-6)
    assert (led["unit"], led["max_contributions"]) == ("patient", k)
    assert led["epsilon_total_pld"] >= led["epsilon_train"] and math.isfinite(led["epsilon_total_pld"])
    other = events.dpsgd_event(1.0, 10, 1000, 20, "poisson", 2, unit="patient")
    with pytest.raises(ValueError, match="same privacy unit"):
        accountant.ledger(vocab, [other], 1e-9 + 1e-6)
    text = statement.ledger_statement(dict(led, train_events=[train]))
    assert "one patient (at most 4 tuples)" in text and "Poisson-samples PATIENTS" in text


def _patient_config(**training):
    config = Config()
    config.privacy.unit, config.privacy.max_tuples_per_patient, config.privacy.tuple_words = "patient", 4, 24
    config.vocab.sigma = 50.0
    config.training.batch_size, config.training.steps = 32, 300
    for key, value in training.items():
        setattr(config.training, key, value)
    config.membership.holdout_patient_fraction = 0.2
    return config


def test_one_plan_and_the_planned_ledger_count_patients():
    config = _patient_config(dataset_patients=5000, dataset_size=10)  # dataset_size (tuples) is not used
    plan = plan_for_config(config, 5000)
    assert (plan.unit, plan.max_contributions, plan.dataset_size) == ("patient", 4, 4000)  # 5000 · (1 − 0.2)
    assert plan.micro_batch_rows == plan.micro_batch * 4
    planned = accountant.planned_ledger(config)
    train = planned["train_events"][0]
    assert planned["unit"] == "patient" and train["sampling_unit"] == "patient"
    assert train["dataset_size"] == 4000 and planned["plan"]["unit"] == "patient"
    assert planned["sampling_probability"] == pytest.approx(32 / 4000)
    with pytest.raises(ValueError, match="poisson"):
        plan_training(config.training.__class__(sampling="shuffle", batch_size=4), 100, unit="patient",
                      max_contributions=2)


def test_budget_guard_plans_per_patient_and_needs_the_public_number_of_patients(tmp_path):
    from pipeline import guard

    config = _patient_config(dataset_patients=5000)
    config.privacy.epsilon_budget = 100.0
    config.validate()
    planned = guard.planned(config)
    assert planned["dataset_size"] == 4000 and planned["unit"] == "patient"
    assert "patients, ≤ 4 tuples each" in guard.planned_statement(planned)
    assert guard.training_plan(config).unit == "patient"
    missing = _patient_config()
    missing.privacy.epsilon_budget = 100.0
    with pytest.raises(ConfigError, match="training.dataset_patients"):
        missing.validate()
    with pytest.raises(ConfigError, match="number of patients"):
        guard.planned(_patient_config())
    # A corpus without patient ids (a directory of text files) is refused before anything runs.
    (tmp_path / "a.txt").write_text("some words of a note " * 20)
    config.corpus.path = str(tmp_path)
    with pytest.raises(ConfigError, match="needs a patient id"):
        guard.check_budget(config)
