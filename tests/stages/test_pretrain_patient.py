"""The trainer stage with ``privacy.unit: patient`` (user-level DP-SGD): rows grouped by patient, the
plan over the public number of patients, the per-patient DP event; a corpus without patient ids is refused."""
import dataclasses

import dp_accounting
import pytest

from dpbert import schema
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.accounting import accountant
from dpbert.privacy import events
from dpbert.stages import pretrain as stage

from .conftest import PATIENTS, tiny_model_config, tiny_training_config


def _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, k=2, name="model"):
    root = tmp_path / "root"
    return stage.pretrain(stage.PretrainInputs(tuples_dir, vocabulary_dir),
                          str(root / "MLMPretrainer" / "model" / name),
                          model_config=tiny_model_config(), training_config=tc,
                          privacy_config=PrivacyConfig(tuple_words=24, unit="patient", max_tuples_per_patient=k),
                          membership_config=MembershipConfig(), pipeline_root=str(root),
                          options=stage.PretrainOptions(export_saved_model=False))


@pytest.mark.xdist_group("patient_chain")
def test_patient_unit_trains_per_patient_and_records_a_per_patient_event(patient_chain):
    # The shared chain (conftest.patient_chain: 3 steps, resumed from its checkpoint at step 2).
    tc, result = patient_chain.training_config, patient_chain.result
    plan = result.plan
    assert (plan.unit, plan.max_contributions, plan.dataset_size, plan.batch_size) == ("patient", 2, PATIENTS, 2)
    record = result.dp_event
    assert record["unit"] == "patient" and record["sampling_unit"] == "patient" and record["max_contributions"] == 2
    assert record["sampling_probability"] == pytest.approx(2 / PATIENTS) and record["steps"] == 3
    sigma = result.train.effective_noise_multiplier
    direct = dp_accounting.pld.PLDAccountant(value_discretization_interval=accountant.PLD_DISCRETIZATION).compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(2 / PATIENTS, dp_accounting.GaussianDpEvent(sigma)), 3)
    ).get_epsilon(tc.delta)
    assert result.epsilon == pytest.approx(direct, rel=1e-9)
    props = result.properties
    assert props["privacy_unit"] == "patient" and props["max_tuples_per_patient"] == 2
    assert props["planned_dataset_size"] == PATIENTS and props["clipping_path"] == "ghost"
    assert props[schema.STEPS_TAKEN_TOTAL] == 3
    # The ledger (accountant stage) composes it per patient with a patient-unit vocabulary record.
    led = accountant.ledger(None, [record], tc.delta)
    assert led["unit"] == "patient" and led["epsilon_train"] == pytest.approx(direct, rel=1e-9)


def test_patient_unit_without_public_n_plans_from_a_dp_count_of_patients(tmp_path, tuples_dir, vocabulary_dir,
                                                                         eager_steps):
    tc = tiny_training_config(batch_size=2, steps=1, count_noise_multiplier=0.5)
    result = _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, k=3)
    records = events.from_json(result.properties[schema.DP_EVENTS])
    count, train = records
    assert count["mechanism"] == "dp_count" and count["unit"] == "patient" and count["max_contributions"] == 3
    assert abs(count["released"] - PATIENTS) <= 5  # a count of PATIENTS (σ = 0.5), not of tuples
    assert train["sampling_unit"] == "patient" and train["dataset_size"] == count["released"]
    assert result.properties["dataset_size_source"] == "dp_count"


def test_a_corpus_without_patient_ids_is_refused_for_the_patient_unit(tmp_path, raw_tuples, vocabulary_dir):
    from dpbert.data.tfrecord import write_tuples

    no_ids = [dataclasses.replace(t, patient_id=None) for t in raw_tuples]
    path = tmp_path / "tuples"
    write_tuples(no_ids, str(path), num_shards=1)
    with pytest.raises(stage.PatientIdsMissing, match="privacy.unit = patient needs a patient id"):
        _pretrain(tmp_path, str(path), vocabulary_dir, tiny_training_config(batch_size=2, steps=1,
                                                                            dataset_patients=PATIENTS))
