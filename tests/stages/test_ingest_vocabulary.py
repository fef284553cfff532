"""dpbert.stages.ingest and dpbert.stages.vocabulary without TFX (Beam's in-memory runner)."""
import json
import os

import pytest

from dpbert import schema
from dpbert.config import CorpusConfig, PrivacyConfig, SyntheticCorpusConfig, VocabConfig
from dpbert.stages.ingest import ingest
from dpbert.stages.vocabulary import DP_EVENT_FILE, HISTOGRAM_FILE, dp_vocabulary


def test_ingest_then_dp_vocabulary(tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpbert.data.tfrecord import read_tuples

    corpus = CorpusConfig(synthetic=SyntheticCorpusConfig(patients=4, admissions_per_patient=1, notes_per_admission=1))
    result = ingest(corpus, str(tmp_path / "tuples"), tuple_words=32, num_shards=1)
    props = result.properties
    assert props[schema.NUM_TUPLES] == len(list(read_tuples(str(tmp_path / "tuples")))) > 0
    assert props[schema.TUPLE_WORDS] == 32 and props["num_patients"] == 4 and props[schema.PRIVATE] == 1

    vocab = VocabConfig(sigma=0.5, delta=1e-3, size=60, noise_seed=1)
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"]))
    out = dp_vocabulary(pipeline, str(tmp_path / "tuples"), str(tmp_path / "vocab"), vocab,  # runs the job
                        PrivacyConfig(tuple_words=32), tuple_words=32)
    props = out.properties
    assert {HISTOGRAM_FILE, DP_EVENT_FILE, "vocab.txt", "tokenizer.json"} <= set(os.listdir(tmp_path / "vocab"))
    assert props["words_kept"] > 0 and props["vocab_size"] <= 60
    # A test seed makes the noise predictable: recorded as ε = ∞ and private; the seed itself is not recorded.
    assert "noise_seed" not in props and props["epsilon"] == float("inf") and props[schema.PRIVATE] == 1
    assert json.loads(props[schema.DP_EVENT]) == json.loads((tmp_path / "vocab" / DP_EVENT_FILE).read_text())
    assert props["threshold"] > 1

    with pytest.raises(ValueError, match="privacy.tuple_words = 32"):
        dp_vocabulary(None, str(tmp_path / "tuples"), str(tmp_path / "v2"), vocab, PrivacyConfig(tuple_words=32),
                      tuple_words=16)
