"""The compiled (tf.function) feature paths give the eager results. Slow: tracing a BERT's
forward and ghost-norm backward takes seconds per function."""
import numpy as np
import pytest

from dpbert.evaluate import membership as mi

pytestmark = pytest.mark.slow


def test_compiled_features_equal_eager_features():
    from dpbert.network.bert import BertSpec, build_bert

    spec = BertSpec(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                    max_seq_length=12, max_predictions=4)
    models = build_bert(spec, seed=1)
    ids = np.random.default_rng(0).integers(5, 40, (9, 12)).astype(np.int32)
    ids[:, 0], ids[:, -1] = mi.CLS_ID, mi.SEP_ID
    ids[::2, 8:] = 0  # some padding
    for fn in (lambda c: mi.sample_losses(models, ids, 1, batch_size=4, compile=c),
               lambda c: mi.attention_features(models, ids, batch_size=4, compile=c),
               lambda c: mi.gradient_features(models, ids, 1, batch_size=4, compile=c)):
        np.testing.assert_allclose(fn(True), fn(False), rtol=1e-4, atol=1e-9)


def test_trainer_holds_out_the_split_the_membership_component_uses(tmp_path):
    """With membership.holdout_patient_fraction, the trainer component trains on exactly the
    training patients' tuples and records the split on the model (what MembershipInference reads)."""
    import dataclasses
    import json
    from collections import Counter

    from components.artifacts import DPVocabulary, PretrainedModel, WordTuples
    from components.common import get_property
    from components.trainer import MLMPretrainer
    from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig, section_to_json
    from dpbert.data import splits
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tfrecord import write_tuples
    from dpbert.data.tuples import corpus_tuples
    from dpbert.stages.membership import TrainedModel, holdout_of
    from dpbert.vocab.wordpiece import save_vocabulary, train_wordpiece

    tuples = list(corpus_tuples(generate_notes(patients=10, admissions_per_patient=1, notes_per_admission=1,
                                               seed=4), tuple_words=24))
    write_tuples(tuples, str(tmp_path / "tuples"), num_shards=1)
    key = splits.write_holdout_key(str(tmp_path / "tuples"))
    save_vocabulary(train_wordpiece(Counter(w for t in tuples for w in t.words).items(), vocab_size=100),
                    tmp_path / "vocab")
    t_art, v_art, m_art = WordTuples(), DPVocabulary(), PretrainedModel()
    t_art.uri, v_art.uri = str(tmp_path / "tuples"), str(tmp_path / "vocab")
    m_art.uri = str(tmp_path / "root" / "MLMPretrainer" / "model" / "1")
    tc = TrainingConfig(batch_size=4, steps=1, non_private=True, warmup_steps=0)
    mc = ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     max_seq_length=16)
    membership = MembershipConfig(holdout_patient_fraction=0.3)
    MLMPretrainer.test_call(tuples=t_art, vocabulary=v_art, model=m_art,
                            model_config=json.dumps(dataclasses.asdict(mc)),
                            training_config=json.dumps(dataclasses.asdict(tc)),
                            privacy_config=json.dumps(dataclasses.asdict(PrivacyConfig())),
                            membership_config=section_to_json(membership, MembershipConfig.HOLDOUT_FIELDS),
                            code_version="t")
    recorded = TrainedModel(m_art.uri, get_property(m_art, "holdout_patient_fraction"),
                            get_property(m_art, "holdout_key_id"), bool(get_property(m_art, "non_private")))
    assert holdout_of(recorded) == {"fraction": 0.3, "key_id": splits.key_fingerprint(key)}
    split = splits.split_patients([splits.patient_key(t) for t in tuples], 0.7, key)
    assert split.oot and split.train
    # The state directory is under the pipeline root (<root>/<node>/<output>/<execution>).
    assert (tmp_path / "root" / "_trainer_state").is_dir()
