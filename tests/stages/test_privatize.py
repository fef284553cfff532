"""dpbert.stages.privatize without TFX: the tuple rewriting and the stage's properties/refusals."""
import numpy as np
import pytest

from dpbert import schema
from dpbert.config import LocalPrivacyConfig
from dpbert.data.tuples import WordTuple
from dpbert.stages import privatize as stage
from tests.local_privacy.conftest import separated_embeddings, toy_embeddings  # noqa: F401 (fixtures)


def _tuples():
    return [WordTuple(doc_id=f"d{i}", index=0, words=("patients", "given", "aspirin", "daily", "."),
                      patient_id=f"p{i}") for i in range(30)]


def test_privatize_tuples_dir(tmp_path, toy_embeddings, separated_embeddings):  # noqa: F811
    from dpbert.data.tfrecord import read_tuples, write_tuples

    write_tuples(_tuples(), str(tmp_path / "in"), num_shards=2)
    stats = stage.privatize_tuples_dir(str(tmp_path / "in"), str(tmp_path / "same"), 1e9, toy_embeddings,
                                       tuple_words=5, seed=0, batch_tuples=7, num_shards=2)
    same = sorted(read_tuples(str(tmp_path / "same")), key=lambda t: t.doc_id)
    assert stats == {"tuples": 30, "truncated_tuples": 0, "empty_tuples": 0}
    original = sorted(_tuples(), key=lambda t: t.doc_id)
    assert same == original  # provenance kept, words unchanged at η → ∞

    stats = stage.privatize_tuples_dir(str(tmp_path / "in"), str(tmp_path / "noisy"), 0.5, separated_embeddings,
                                       tuple_words=5, seed=0)
    noisy = list(read_tuples(str(tmp_path / "noisy")))
    assert len(noisy) == 30 and all(1 <= len(t.words) <= 5 for t in noisy)
    assert np.mean([t.words != o.words for t, o in zip(sorted(noisy, key=lambda t: t.doc_id), original)]) > 0.9
    assert stats["tuples"] == 30


def test_privatize_stage_properties_and_refusals(tmp_path, toy_embeddings):  # noqa: F811
    from dpbert.data.tfrecord import write_tuples
    from dpbert.local_privacy.embeddings import write_hf_checkpoint

    from dpbert.data.splits import read_holdout_key, write_holdout_key

    write_tuples(_tuples(), str(tmp_path / "in"), num_shards=1)
    key = write_holdout_key(str(tmp_path / "in"))  # the ingestion's
    public = str(write_hf_checkpoint(toy_embeddings, tmp_path / "public"))
    config = LocalPrivacyConfig(enabled=True, eta=2.0, seed=0, embeddings_dir=public)
    inputs = {schema.NUM_TUPLES: 30, schema.TUPLE_WORDS: 5, "corpus": "toy", "num_patients": 30}
    result = stage.privatize(str(tmp_path / "in"), str(tmp_path / "out"), config, inputs, num_shards=1)
    props = result.properties
    assert result.failure is None
    assert props[schema.NUM_TUPLES] == 30 and props[schema.TUPLE_WORDS] == 5 and props["corpus"] == "toy"
    assert props["eta"] == 2.0 and props["local_privacy"] == "dchi" and props[schema.PRIVATE] == 1
    assert props["noise_seed_fixed"] == 1 and props["num_documents"] is None
    assert read_holdout_key(str(tmp_path / "out")) == key  # the holdout key travels with the tuples

    miscounted = stage.privatize(str(tmp_path / "in"), str(tmp_path / "out2"), config, dict(inputs, num_tuples=31))
    assert isinstance(miscounted.failure, RuntimeError) and "do not match" in str(miscounted.failure)
    assert "30" not in str(miscounted.failure) and "31" not in str(miscounted.failure)  # no exact count
    with pytest.raises(ValueError, match="tuple_words"):
        stage.privatize(str(tmp_path / "in"), str(tmp_path / "out3"), config, {schema.NUM_TUPLES: 30})
    with pytest.raises(ValueError, match="finite"):
        stage.privatize(str(tmp_path / "in"), str(tmp_path / "out4"), LocalPrivacyConfig(eta=float("inf")), inputs)
