"""The MembershipInference component (components/membership.py over dpbert.stages.membership),
run through its function on artifacts written by the real helpers: tuples, a WordPiece
vocabulary, tiny saved BERTs."""
import json
import os
import shutil
from collections import Counter

import numpy as np
import pytest

from dpbert.config import MembershipConfig, section_to_json
from dpbert.data import splits
from dpbert.evaluate import membership as mi

#: --dist loadgroup: its module fixture's models are trained on one worker.
pytestmark = pytest.mark.xdist_group("membership_component")


KEY = bytes(range(32))
HOLDOUT = {"holdout_patient_fraction": 0.3, "holdout_key_id": splits.key_fingerprint(KEY)}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from components.artifacts import PretrainedModel, WordTuples
    from components.common import set_properties
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tfrecord import write_tuples
    from dpbert.data.tuples import corpus_tuples
    from dpbert.network.bert import BertSpec, build_bert, save_bert
    from dpbert.vocab.wordpiece import save_vocabulary, train_wordpiece

    root = tmp_path_factory.mktemp("membership")
    tuples = list(corpus_tuples(generate_notes(patients=14, admissions_per_patient=2, notes_per_admission=1,
                                               seed=3), tuple_words=24))
    write_tuples(tuples, str(root / "tuples"), num_shards=2)
    splits.write_holdout_key(str(root / "tuples"), KEY)
    words = Counter(w for t in tuples for w in t.words)
    tokenizer = train_wordpiece(words.items(), vocab_size=120)
    save_vocabulary(tokenizer, root / "vocab")
    spec = BertSpec(vocab_size=tokenizer.get_vocab_size(), hidden_size=16, num_layers=1, num_heads=2,
                    intermediate_size=32, max_seq_length=32, max_predictions=5)

    def model_artifact(name, seed, props, files_of=None):
        """A saved tiny BERT (seed) with the vocabulary; ``files_of``: a copy of that artifact's
        files instead (the refused artifacts are refused on their properties, before any load)."""
        artifact = PretrainedModel()
        artifact.uri = str(root / name)
        if files_of is None:
            save_bert(build_bert(spec, seed=seed), root / name / "model")
            shutil.copytree(root / "vocab", root / name / "tokenizer")
        else:
            shutil.copytree(root / files_of, root / name)
        set_properties(artifact, props)
        return artifact

    tuples_artifact = WordTuples()
    tuples_artifact.uri = str(root / "tuples")
    return {
        "root": root, "tuples": tuples_artifact, "raw": tuples,
        "dp": model_artifact("dp", 1, dict(HOLDOUT, non_private=False)),
        "non_dp": model_artifact("non_dp", 2, dict(HOLDOUT, non_private=True)),
        "no_holdout": model_artifact("no_holdout", 3, {"non_private": False}, files_of="dp"),
        "other_split": model_artifact("other_split", 4, {"holdout_patient_fraction": 0.3, "holdout_key_id": "other"},
                                      files_of="non_dp"),
    }


def _report(root, name):
    from components.artifacts import MembershipReport

    report = MembershipReport()
    report.uri = str(root / name)
    return report


def _props(artifact):
    from components.common import get_property

    return {k: get_property(artifact, k) for k in artifact.mlmd_artifact.custom_properties}


def test_component_signature_baseline_is_optional():
    from components.artifacts import MembershipReport, PretrainedModel, WordTuples
    from components.membership import MembershipInference

    spec = MembershipInference.SPEC_CLASS
    assert spec.INPUTS["tuples"].type is WordTuples and spec.INPUTS["model"].type is PretrainedModel
    assert spec.INPUTS["baseline_model"].optional and not spec.INPUTS["model"].optional
    assert spec.OUTPUTS["report"].type is MembershipReport
    assert MembershipReport.TYPE_NAME == "components.MembershipReport"
    assert {"membership_config", "code_version"} <= set(spec.PARAMETERS)


def test_membership_component_dp_and_non_dp(world):
    from components.membership import MembershipInference
    from dpbert.stages.membership import ROC_FILE

    report = _report(world["root"], "report")
    MembershipInference.test_call(tuples=world["tuples"], model=world["dp"], baseline_model=world["non_dp"],
                                  report=report, code_version="test",
                                  membership_config=section_to_json(MembershipConfig(seed=0, max_samples=80)))
    props = _props(report)
    attacks = props["attacks"]  # decoded by dpbert.schema
    assert set(attacks) == {"dp", "non_dp"}
    for label in ("dp", "non_dp"):
        assert sorted(attacks[label]) == sorted(mi.ATTACKS)
        for name, r in attacks[label].items():
            assert set(r) == {"advantage", "auc"}, name
            assert r["auc"] is None or 0 <= r["auc"] <= 1
    assert attacks["dp"]["S-BBA"]["auc"] is not None and attacks["dp"]["S-GWBA"]["auc"] is not None
    assert props["n_members"] == 40 and props["n_non_members"] == 40 and props["private"] == 1
    assert props["holdout_key_id"] == HOLDOUT["holdout_key_id"] and props["roc_file"] == ROC_FILE
    coarse = props["roc_curves"]
    assert all(len(c["fpr"]) <= 50 for label in coarse.values() for c in label.values())
    with open(os.path.join(report.uri, ROC_FILE), encoding="utf-8") as f:
        text = f.read()
    curves = json.loads(text)
    for label in ("dp", "non_dp"):
        for name, r in curves[label].items():
            assert len(r["roc"]["fpr"]) <= 200 and set(r) == {"advantage", "auc", "roc", "n"}
    # Neither the file nor the properties name a patient, an admission, a document or a word.
    everything = text + json.dumps(props)
    secrets = {t.patient_id for t in world["raw"]} | {t.admission_id for t in world["raw"]} | \
        {t.doc_id for t in world["raw"]} | {" ".join(t.words[i:i + 3]) for t in world["raw"] for i in (0, 5) if len(t.words) >= i + 3}
    assert not [s for s in secrets if s and len(s) >= 6 and s in everything]
    # Members are exactly the training side of split_patients over patient_key: the trainer's split.
    split = splits.split_patients([splits.patient_key(t) for t in world["raw"]], 0.7, KEY)
    assert len(split.oot) >= 2 and len(split.train) >= 2


def test_membership_component_refuses_a_model_without_holdout(world):
    from components.membership import MembershipInference
    from dpbert.stages.membership import NoHoldoutError

    config = section_to_json(MembershipConfig())
    with pytest.raises(NoHoldoutError, match="holdout_patient_fraction"):
        MembershipInference.test_call(tuples=world["tuples"], model=world["no_holdout"],
                                      report=_report(world["root"], "r1"), code_version="t", membership_config=config)
    with pytest.raises(ValueError, match="different patient splits"):
        MembershipInference.test_call(tuples=world["tuples"], model=world["dp"], baseline_model=world["other_split"],
                                      report=_report(world["root"], "r2"), code_version="t", membership_config=config)


def test_evaluate_models_same_samples_and_masks_for_every_model(world):
    from dpbert.stages.membership import evaluate_models

    uri = world["dp"].uri
    out = evaluate_models(world["tuples"].uri, {"a": uri, "b": uri}, 0.3, HOLDOUT["holdout_key_id"], seed=1,
                          max_samples=20)
    assert out["results"]["a"] == out["results"]["b"]  # same model, same samples, same masks
    assert out["n_members"] == out["n_non_members"] == 10
    again = evaluate_models(world["tuples"].uri, {"a": uri}, 0.3, HOLDOUT["holdout_key_id"], seed=1, max_samples=20)
    assert again["results"]["a"] == out["results"]["a"]
    assert np.isfinite(out["results"]["a"]["S-BBA"]["auc"])
