"""The typed artifact properties (dpbert/properties.py) and the readers of a run behind one
interface (``dpbert.metadata.RunReader``): a legacy run (written without ``schema_version``) reads
into the dataclasses, a malformed value is an error naming the artifact and the key, both readers
give equal typed objects for the same run (tests/test_report_pipeline_root.py, which already
writes a store's run out as a pipeline root), and a writer's values come back as written.

Cheap: the committed store of a real tiny run (tests/dashboard/data/tiny_run.sqlite, written
before ``schema_version``) and hand-written property dicts; no training."""
import dataclasses
import shutil

import pytest

from dpbert import metadata, pipeline_root, properties, schema
from dpbert.properties import (LEGACY_VERSION, SCHEMA_VERSION, PropertyError, PrivacyReportProperties,
                               read_properties, to_write)
from tests.test_report_pipeline_root import TINY_RUN_STORE

#: A legacy DPVocabulary's decoded properties (no ``schema_version``, no ``vocab_source``).
LEGACY_VOCABULARY = {"vocab_size": 184, "words_kept": 41, "sigma": 4.0, "sigma_approx": True, "epsilon": "inf",
                     "threshold": 24.089818, "non_private": 0, "private": 0, "unit": "tuple", "tfx_version": "1.16.0"}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "metadata.sqlite"
    shutil.copy(TINY_RUN_STORE, path)
    return str(path)


def test_a_legacy_property_dict_reads_into_the_dataclass_missing_keys_none():
    vocab = read_properties(schema.DP_VOCABULARY, LEGACY_VOCABULARY)
    assert isinstance(vocab, properties.VocabularyProperties) and vocab.schema_version == LEGACY_VERSION
    assert (vocab.vocab_size, vocab.words_kept, vocab.sigma, vocab.non_private) == (184, 41, 4.0, False)
    assert vocab.epsilon == float("inf") and vocab.vocab_source is None and vocab.dp_event is None
    assert vocab.approximate == {"sigma"} and vocab.extra == {"tfx_version": "1.16.0"}
    # the full type name reads the same; an unknown type keeps everything in extra
    assert read_properties("components.DPVocabulary", LEGACY_VOCABULARY) == vocab
    assert read_properties("components.Other", {"a": 1}).extra == {"a": 1}


def test_the_legacy_store_reads_typed_every_artifact_at_version_0(store_path):
    run = metadata.MetadataRunReader(store_path).get_run()
    kinds = {}
    for artifact in (a for c in run.components for a in c.outputs):
        typed = artifact.typed
        assert type(typed) is properties.kind_class(artifact.type) and typed.schema_version == LEGACY_VERSION
        kinds[schema.short_type_name(artifact.type)] = typed
    ledger, model = kinds[schema.PRIVACY_REPORT], kinds[schema.PRETRAINED_MODEL]
    assert ledger.within_budget is True and ledger.unit == "tuple" and ledger.adjacency is None  # written before it
    assert {"epsilon_total_pld", "delta"} <= ledger.approximate  # rounded doubles without exact strings
    assert model.steps_taken_total == 4 and model.workers is None and model.trainable is None
    assert kinds[schema.WORD_TUPLES].num_tuples == run.artifacts("components.WordTuples")[0].properties["num_tuples"]


def test_a_malformed_property_is_an_error_naming_the_artifact_and_the_key(store_path):
    raw = {"epsilon_total_pld": 2.5, "unit": "tuple", "within_budget": 1}
    assert read_properties(schema.PRIVACY_REPORT, raw).epsilon_total_pld == 2.5  # the control reads
    for key, bad in (("epsilon_total_pld", "abc"), ("unit", 3), ("within_budget", {"x": 1}),
                     ("epsilon_total_pld", True), ("schema_version", "v1")):
        with pytest.raises(PropertyError, match=rf"PrivacyReport artifact 7 \(/r\): property '{key}'"):
            read_properties(schema.PRIVACY_REPORT, dict(raw, **{key: bad}), "PrivacyReport artifact 7 (/r)")
    # through a run: ArtifactInfo.typed names the artifact's id and URI, and the report refuses it
    run = metadata.MetadataRunReader(store_path).get_run()
    artifact = run.artifacts("components.PrivacyReport")[0]
    artifact.properties = dict(artifact.properties, epsilon_total_pld="abc")
    with pytest.raises(PropertyError, match=rf"PrivacyReport artifact {artifact.id} \({artifact.uri}\): "
                                            r"property 'epsilon_total_pld'"):
        from dpbert.report_model import read_report

        read_report(run)


def test_a_writer_s_values_are_stamped_and_read_back_as_written():
    import numpy as np

    values = {"epsilon_total_pld": np.float64(2.5), "steps": np.int64(40), "within_budget": True, "unit": "tuple",
              "statement": "s", "dataset_id": None, "tfx_version": "1.16.0"}
    written = to_write(schema.PRIVACY_REPORT, values)
    assert written[properties.VERSION_KEY] == SCHEMA_VERSION and "dataset_id" not in written
    assert type(written["steps"]) is int and written["steps"] == 40
    back = read_properties(schema.PRIVACY_REPORT, written)
    assert back.schema_version == SCHEMA_VERSION and back.within_budget is True and back.extra == {"tfx_version": "1.16.0"}
    assert dataclasses.replace(back, schema_version=SCHEMA_VERSION + 1).to_properties()[properties.VERSION_KEY] == 2
    with pytest.raises(PropertyError, match="the PrivacyReport output: property 'unit'"):
        to_write(schema.PRIVACY_REPORT, dict(values, unit=3))  # before anything is written


def test_every_artifact_type_of_the_dag_has_its_dataclass():
    assert {t for _, _, t in pipeline_root.OUTPUTS} == set(properties.KINDS)
    assert all(k in {f.name for f in dataclasses.fields(PrivacyReportProperties)}
               for k in ("epsilon_total_pld", "delta", "within_budget", "unit", "adjacency"))
