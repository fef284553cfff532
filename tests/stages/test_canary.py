"""dpbert.stages.canary without TFX: generation, insertion, carriers, the exposure report."""
import json
import os
import stat
from types import SimpleNamespace

import numpy as np
import pytest

from dpbert import schema, storage
from dpbert.config import CanaryConfig
from dpbert.stages import canary as stage


@pytest.fixture(scope="module")
def canaries_dir(tmp_path_factory, vocabulary_dir):
    path = tmp_path_factory.mktemp("canaries") / "list"
    result = stage.generate_canaries(vocabulary_dir, str(path), CanaryConfig(canaries_per_group=1, audit_canaries=6),
                                     public_rows=40)
    return str(path), result


def test_generate_canaries_writes_a_private_list(canaries_dir, vocabulary_dir):
    path, result = canaries_dir
    # dpbert.storage's listing (hides its local bookkeeping: the folder's generation lock file)
    assert storage.storage_for(path).listdir(path) == sorted([stage.CANARIES_FILE, stage.AUDIT_FILE, stage.SEED_FILE])
    assert stat.S_IMODE(os.stat(os.path.join(path, stage.SEED_FILE)).st_mode) == 0o600
    props = result.properties
    assert props[schema.PRIVATE] == 1 and props["groups"] == ["1", "4"]  # ≤ 10% of the public n = 40
    no_public_n = stage.generate_canaries(vocabulary_dir, str(path) + "-default", CanaryConfig(audit_canaries=0))
    assert no_public_n.properties["groups"] == [str(o) for o in stage.DEFAULT_OCCURRENCES]
    canary_set, audit, seed = stage.load_canaries(path)
    assert props["num_canaries"] == len(canary_set) and props["num_audit_canaries"] == len(audit) == 6
    assert isinstance(seed, int)
    assert not any(str(c.tokens) in json.dumps(props) for c in canary_set)  # no secret in a property


def test_apply_canaries_is_the_same_for_every_trainer(canaries_dir):
    path, _ = canaries_dir
    rng = np.random.default_rng(0)
    token_ids = np.zeros((40, 16), np.int32)
    token_ids[:, 0], token_ids[:, 1:14], token_ids[:, 14] = 2, rng.integers(5, 100, (40, 13)), 3
    row_ids = np.arange(1000, 1040)
    first, ids, counts = stage.apply_canaries(token_ids, row_ids, path, 16, rows_planned=40)
    again, ids_again, counts_again = stage.apply_canaries(token_ids, row_ids, path, 16, rows_planned=40)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(ids, ids_again)
    assert counts == counts_again and ids.shape == (first.shape[0],) and len(set(ids.tolist())) == len(ids)
    canary_set, audit, _ = stage.load_canaries(path)
    assert set(counts) == {str(c.canary_id) for c in canary_set}
    # The included audit canaries are appended as examples of their own.
    assert first.shape == (40 + sum(c.included for c in audit.canaries), 16)


def test_carrier_rows_are_tokenized_public_notes(vocabulary_dir):
    rows = stage.carrier_rows(vocabulary_dir, 16, tuple_words=24)
    assert rows.ndim == 2 and rows.shape[1] == 16 and rows.shape[0] > 10
    np.testing.assert_array_equal(rows, stage.carrier_rows(vocabulary_dir, 16, tuple_words=24))


def test_exposure_report_files_properties_and_audit_failure(tmp_path, canaries_dir, vocabulary_dir, monkeypatch):
    import shutil

    import dpbert.network.bert as bert_lib
    from dpbert.privacy.one_run_audit import AuditInconsistencyError

    path, _ = canaries_dir
    canary_set, _, _ = stage.load_canaries(path)
    L, M = 16, 4
    vocab_size = len(open(os.path.join(vocabulary_dir, "vocab.txt"), encoding="utf-8").read().splitlines())
    noise = np.random.default_rng(5)

    def mlm(inputs, training=False):
        return noise.normal(size=(len(inputs["input_ids"]), M, vocab_size))

    fake = SimpleNamespace(spec=SimpleNamespace(max_seq_length=L, max_predictions=M), mlm=mlm)
    monkeypatch.setattr(bert_lib, "load_bert", lambda directory: fake)
    models = {}
    for name in ("dp", "non_dp"):
        models[name] = tmp_path / name
        shutil.copytree(vocabulary_dir, models[name] / schema.TOKENIZER_DIR)
        (models[name] / schema.CANARY_COUNTS_FILE).write_text(
            json.dumps({str(c.canary_id): c.occurrences for c in canary_set}), encoding="utf-8")

    result = stage.exposure_report(path, str(models["dp"]), str(tmp_path / "report"), audit_beta=0.05,
                                   max_seq_length=L, epsilon_train=100.0, delta_train=1e-5,
                                   baseline_model_dir=str(models["non_dp"]))
    assert result.failure is None
    report_dir = str(tmp_path / "report")
    assert storage.storage_for(report_dir).listdir(report_dir) == ["exposure.json", "exposure.png", "exposure.svg"]
    report = json.loads((tmp_path / "report" / stage.EXPOSURE_FILE).read_text())
    assert report == json.loads(json.dumps(result.report))
    props = result.properties
    assert props["groups"] and all(g["exposure_non_dp"] is not None for g in props["groups"])
    assert props["audit_epsilon_upper_bound"] == 100.0 and set(props["audit"]) == set(stage.AUDIT_FIELDS)
    assert report["query"]["form"] == "in_context" and report["audit_query"] == {"form": "standalone"}

    # A lower bound above the accountant's ε: the evidence is returned, the failure handed over
    # (its plots, drawn as above, are not what is checked here: not drawn).
    monkeypatch.setattr(stage, "_plot", lambda groups, path: None)
    bad = stage.exposure_report(path, str(models["dp"]), str(tmp_path / "bad"), audit_beta=0.05, max_seq_length=L,
                                epsilon_train=-1.0, delta_train=1e-5)
    assert isinstance(bad.failure, AuditInconsistencyError) and bad.properties["audit_epsilon_upper_bound"] == -1.0
    with pytest.raises(AuditInconsistencyError):
        bad.raise_failure()
