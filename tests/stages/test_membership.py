"""dpbert.stages.membership without TFX: the recorded split, the refusals, the report."""
import json

import pytest

from dpbert import schema
from dpbert.config import MembershipConfig
from dpbert.stages import membership as stage
from dpbert.stages.membership import NoHoldoutError, TrainedModel


@pytest.fixture(scope="module")
def model_dir(tiny_bert_dir):
    return tiny_bert_dir


def test_holdout_of():
    assert stage.holdout_of(TrainedModel("u", 0.3, "k5", False)) == {"fraction": 0.3, "key_id": "k5"}
    for fraction, key_id in ((None, None), (0.0, "k1"), (0.3, None)):
        with pytest.raises(NoHoldoutError, match="membership.holdout_patient_fraction"):
            stage.holdout_of(TrainedModel("u", fraction, key_id, False))


def test_refuses_a_baseline_on_another_split_or_a_private_baseline(tmp_path):
    dp = TrainedModel("dp", 0.3, "k5", False)
    with pytest.raises(ValueError, match="different patient splits"):
        stage.membership_inference("t", str(tmp_path), dp, MembershipConfig(), TrainedModel("b", 0.3, "k6", True))
    with pytest.raises(ValueError, match="non-private baseline"):
        stage.membership_inference("t", str(tmp_path), dp, MembershipConfig(), TrainedModel("b", 0.3, "k5", False))


def test_membership_inference_report(tmp_path, tuples_dir, model_dir):
    from dpbert.data.splits import key_fingerprint
    from dpbert.evaluate.membership import ATTACKS

    from .conftest import HOLDOUT_KEY

    config = MembershipConfig(seed=0, max_samples=20)
    key_id = key_fingerprint(HOLDOUT_KEY)
    with pytest.raises(ValueError, match="holdout key is not the one"):
        stage.membership_inference(tuples_dir, str(tmp_path / "r0"), TrainedModel(model_dir, 0.3, "other", True), config)
    result = stage.membership_inference(tuples_dir, str(tmp_path / "report"),
                                        TrainedModel(model_dir, 0.3, key_id, True), config)
    props = result.properties
    assert set(props["attacks"]) == {"non_dp"}  # a non-private main model is reported as non_dp
    assert sorted(props["attacks"]["non_dp"]) == sorted(ATTACKS)
    # Attack scores on private rows: operator-only.
    assert props[schema.HOLDOUT_FRACTION] == 0.3 and props["holdout_key_id"] == key_id and props[schema.PRIVATE] == 1
    assert (props["seed"], props["max_samples"]) == (0, 20)
    assert props["n_members"] + props["n_non_members"] <= 20
    curves = json.loads((tmp_path / "report" / stage.ROC_FILE).read_text())
    assert set(curves["non_dp"]) == set(ATTACKS)
    assert all(len(c["fpr"]) <= stage.PROPERTY_ROC_POINTS for c in props["roc_curves"]["non_dp"].values())
