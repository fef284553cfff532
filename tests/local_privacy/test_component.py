"""TextPrivatizer in a LocalDagRunner DAG (slow); its stage is tested in tests/stages/test_privatize.py."""

import pytest


@pytest.mark.slow
def test_component_in_a_dag(tmp_path, toy_embeddings):
    """CorpusIngest → TextPrivatizer on LocalDagRunner; properties recorded, N respected."""
    from tfx import v1 as tfx

    from components.ingest import CorpusIngest
    from components.privatizer import TextPrivatizer
    from dpbert.config import CorpusConfig, LocalPrivacyConfig, SyntheticCorpusConfig, section_to_json
    from dpbert.data.tfrecord import read_tuples
    from dpbert.local_privacy.embeddings import write_hf_checkpoint

    model = write_hf_checkpoint(toy_embeddings, tmp_path / "public")
    corpus = CorpusConfig(synthetic=SyntheticCorpusConfig(patients=2, admissions_per_patient=1, notes_per_admission=1))
    ingest = CorpusIngest(corpus_config=section_to_json(corpus), tuple_words=32, code_version="t")
    privatizer = TextPrivatizer(tuples=ingest.outputs["tuples"], code_version="t", local_privacy_config=section_to_json(
        LocalPrivacyConfig(enabled=True, eta=2.0, seed=0, embeddings_dir=str(model))))
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
