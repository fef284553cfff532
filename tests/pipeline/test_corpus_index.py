"""One corpus, one budget: the same content declared under a second dataset id is refused unless
the operator says --same-corpus-as (pipeline.corpus_index); the key lives apart from the ledgers."""
import json
import os

import pytest

from dpbert.config import ConfigError, load_config
from pipeline import corpus_index


def _config(tmp_path, dataset_id, corpus="notes.jsonl"):
    return load_config(None, [f"corpus.path={tmp_path / corpus}", f"corpus.dataset_id={dataset_id}",
                              f"privacy.ledger={tmp_path / 'ledgers'}", "privacy.epsilon_budget=null"])


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "notes.jsonl").write_text(json.dumps({"text": "pt stable on metoprolol", "patient_id": "p1"}) + "\n")
    (tmp_path / "other.jsonl").write_text(json.dumps({"text": "another patient, another note", "patient_id": "p2"}) + "\n")
    return tmp_path


def test_the_same_content_under_another_id_is_refused(corpus):
    uri = corpus_index.check_and_record(_config(corpus, "ward7"))
    assert corpus_index.check_and_record(_config(corpus, "Ward7")) == uri  # the same id (normalised): fine
    with pytest.raises(ConfigError, match="already spending from dataset ward7") as refused:
        corpus_index.check_and_record(_config(corpus, "ward7-copy"))
    assert "--same-corpus-as ward7" in str(refused.value)
    corpus_index.check_and_record(_config(corpus, "ward7-copy"), same_as="ward7")  # declared: accepted
    corpus_index.check_and_record(_config(corpus, "ward9", "other.jsonl"))  # another corpus: its own id
    index = json.loads((corpus / "ledgers" / ".index.json").read_text())
    assert sorted(map(sorted, index["corpora"].values())) == [["ward7", "ward7-copy"], ["ward9"]]
    # The key is apart from the ledger objects, private; the index holds no unkeyed hash of the notes.
    key_dir = corpus / "ledgers-keys"
    key = key_dir / "fingerprint_salt.json"
    assert key.exists() and os.stat(key).st_mode & 0o077 == 0
    import hashlib

    plain = hashlib.sha256((corpus / "notes.jsonl").read_bytes()).hexdigest()
    assert plain not in (corpus / "ledgers" / ".index.json").read_text()


def test_the_synthetic_corpus_is_not_indexed(tmp_path):
    assert corpus_index.check_and_record(load_config(None, [f"privacy.ledger={tmp_path}"])) is None
    assert not (tmp_path / ".index.json").exists()
