"""TextPrivatizer's tuple rewriting (plain function) and, slow, the component in a LocalDagRunner DAG."""

import numpy as np
import pytest

from dpbert.data.tuples import WordTuple


def _tuples():
    return [WordTuple(doc_id=f"d{i}", index=0, words=("patients", "given", "aspirin", "daily", "."),
                      patient_id=f"p{i}") for i in range(30)]


def test_privatize_tuples_dir(tmp_path, toy_embeddings, separated_embeddings):
    from components.privatizer import privatize_tuples_dir
    from dpbert.data.tfrecord import read_tuples, write_tuples

    write_tuples(_tuples(), str(tmp_path / "in"), num_shards=2)
    stats = privatize_tuples_dir(str(tmp_path / "in"), str(tmp_path / "same"), 1e9, toy_embeddings, tuple_words=5,
                                 seed=0, batch_tuples=7, num_shards=2)
    same = sorted(read_tuples(str(tmp_path / "same")), key=lambda t: t.doc_id)
    assert stats == {"tuples": 30, "truncated_tuples": 0, "empty_tuples": 0}
    original = sorted(_tuples(), key=lambda t: t.doc_id)
    assert same == original  # provenance kept, words unchanged at η → ∞

    stats = privatize_tuples_dir(str(tmp_path / "in"), str(tmp_path / "noisy"), 0.5, separated_embeddings,
                                 tuple_words=5, seed=0)
    noisy = list(read_tuples(str(tmp_path / "noisy")))
    assert len(noisy) == 30 and all(1 <= len(t.words) <= 5 for t in noisy)
    assert np.mean([t.words != o.words for t, o in zip(sorted(noisy, key=lambda t: t.doc_id), original)]) > 0.9
    assert stats["tuples"] == 30


@pytest.mark.slow
def test_component_in_a_dag(tmp_path, toy_embeddings):
    """CorpusIngest → TextPrivatizer on LocalDagRunner; properties recorded, N respected."""
    import dataclasses
    import json

    from tfx import v1 as tfx

    from components.ingest import CorpusIngest
    from components.privatizer import TextPrivatizer
    from dpbert.config import CorpusConfig, SyntheticCorpusConfig
    from dpbert.data.tfrecord import read_tuples
    from dpbert.local_privacy.embeddings import write_hf_checkpoint

    model = write_hf_checkpoint(toy_embeddings, tmp_path / "public")
    corpus = CorpusConfig(synthetic=SyntheticCorpusConfig(patients=2, admissions_per_patient=1, notes_per_admission=1))
    ingest = CorpusIngest(corpus_config=json.dumps(dataclasses.asdict(corpus)), tuple_words=32, code_version="t")
    privatizer = TextPrivatizer(tuples=ingest.outputs["tuples"], eta=2.0, code_version="t", seed=0,
                                embeddings_dir=str(model))
    root, db = tmp_path / "root", tmp_path / "m.sqlite"
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="lp", pipeline_root=str(root), components=[ingest, privatizer],
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(str(db))))

    import ml_metadata as mlmd

    store = mlmd.MetadataStore(tfx.orchestration.metadata.sqlite_metadata_connection_config(str(db)))
    artifacts = store.get_artifacts_by_type("components.WordTuples")
    assert len(artifacts) == 2
    out = next(a for a in artifacts if "eta" in a.custom_properties)
    source = next(a for a in artifacts if "eta" not in a.custom_properties)
    props = out.custom_properties
    assert props["eta"].double_value == 2.0 and props["local_privacy"].string_value == "dchi"
    assert props["num_tuples"].int_value == source.custom_properties["num_tuples"].int_value
    assert props["tuple_words"].int_value == 32 and props["private"].int_value == 1
    assert props["noise_seed_fixed"].int_value == 1
    tuples = list(read_tuples(out.uri))
    assert len(tuples) == source.custom_properties["num_tuples"].int_value
    assert all(len(t.words) <= 32 for t in tuples)
