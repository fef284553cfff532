"""The utility table of dpbert.stages.ner without TFX, tiny models: a user's IOB files
(ner.train_path / test_path), the dev split carved from the TRAINING sentences, the rows and the
public row being exactly the DP trainer's public start."""
import json
import shutil

import pytest

from dpbert import schema
from dpbert.config import ModelConfig, NerConfig, TrainingConfig
from dpbert.stages import ner as stage

TRAIN = [("Aspirin", "B-Drug"), ("caused", "O"), ("renal", "B-Problem"), ("failure", "I-Problem"), (".", "O")]
TEST = [("Heparin", "B-Drug"), ("and", "O"), ("fever", "B-Problem"), (".", "O")]


def _iob(path, sentence, copies):
    lines = []
    for i in range(copies):
        lines += ["-DOCSTART-\tO", ""] if i == 0 else []
        lines += [f"{tok}\tNN\t{tag}" for tok, tag in sentence] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def _tiny_models(tmp_path, tiny_bert_dir):
    """The "dp" row: the session's tiny model; the "non_private" row: a copy of it (what is tested
    is the table's rows, not how the models differ)."""
    shutil.copytree(tiny_bert_dir, tmp_path / "non_private")
    return {"dp": tiny_bert_dir, "non_private": tmp_path / "non_private"}


@pytest.fixture
def few_heldout_patients(monkeypatch):
    """The held-out MLM rows of 2 fresh patients (about 100 rows), not the stage's 10 (about 500):
    what is tested is the table, and every row still has a held-out loss and accuracy."""
    monkeypatch.setattr(stage, "HELDOUT_PATIENTS", 2)


def test_ner_evaluation_with_a_users_iob_files(tmp_path, tiny_bert_dir, eager_steps, few_heldout_patients):
    # eager_steps: the table's rows and columns are the claim, not the traced fine-tuning step
    train_path = _iob(tmp_path / "train.tsv", TRAIN, 20)
    test_path = _iob(tmp_path / "test.tsv", TEST, 6)
    # The linear probe (ner.mode = probe) with the baseline's row, two seeds and the second column
    # (the in-domain synthetic task: ner.synthetic_column); fine-tuning, below, once per row.
    cfg = NerConfig(enabled=True, train_path=train_path, test_path=test_path, mode="probe", learning_rate=0.05,
                    epochs=2, seeds=2, batch_size=8, dev_fraction=0.25, patience=1, synthetic_column=True,
                    synthetic_train_sentences=16, synthetic_test_sentences=8)
    train, dev, test, source = stage.load_ner_data(cfg)
    assert source == "user data" and (len(train), len(dev), len(test)) == (15, 5, 6)
    assert all(s.tokens[0] == "Aspirin" for s in train + dev) and all(s.tokens[0] == "Heparin" for s in test)
    dirs = _tiny_models(tmp_path, tiny_bert_dir)
    result = stage.ner_evaluation(str(dirs["dp"]), str(tmp_path / "report"), cfg, 24,
                                  baseline_model_dir=str(dirs["non_private"]),
                                  model_config=ModelConfig(), training_config=TrainingConfig())
    props = result.properties
    assert props["data"] == "user data" and set(props["per_type"]) == {"Drug", "Problem"}
    assert (props["train_sentences"], props["dev_sentences"], props["test_sentences"], props["seeds"]) == (15, 5, 6, 2)
    utility = props[stage.UTILITY]
    # model.init = random: no public row; the gains are measured from the random row
    assert list(utility["rows"]) == ["random", "dp", "non_private"] and utility["reference"] == "random"
    assert (utility["ner_task"], utility["ner_mode"]) == ("user data", "probe") and props["mode"] == "probe"
    for row in utility["rows"].values():
        assert set(row) == set(schema.UTILITY_COLUMNS)
        assert row["heldout_mlm_loss"] > 0 and 0 <= row["heldout_mlm_accuracy"] <= 1
        assert 0 <= row["ner_f1_mean"] <= 1 and row["ner_f1_std"] >= 0
        assert 0 <= row["ner_synthetic_f1_mean"] <= 1 and row["ner_synthetic_f1_std"] >= 0
    assert props["f1"] == utility["rows"]["dp"]["ner_f1_mean"]
    assert [row["model"] for row in props["table"]] == ["random", "dp", "non_private"]
    assert props[schema.PRIVATE] == 1  # the non-private row: operator-only
    report = json.loads((tmp_path / "report" / stage.REPORT_FILE).read_text())
    assert len(report["rows"]["dp"]["f1_seeds"]) == 2 and report["seeds"] == [0, 1]
    assert all(1 <= e <= 2 for e in report["rows"]["dp"]["best_epochs"])
    # without the baseline the artifact may be released; fine-tuning (ner.mode = finetune), without
    # the second column (ner.synthetic_column off)
    finetune = NerConfig(**{**cfg.__dict__, "mode": "finetune", "learning_rate": NerConfig().learning_rate,
                            "epochs": 1, "seeds": 1, "synthetic_column": False})
    alone = stage.ner_evaluation(str(dirs["dp"]), str(tmp_path / "report2"), finetune, 24)
    assert alone.properties[schema.PRIVATE] == 0 and alone.properties[stage.UTILITY]["gain_kept_ner_f1"] is None
    assert alone.properties[stage.UTILITY]["gain_kept_ner_f1_reason"] == "a row is missing"
    for row in alone.properties[stage.UTILITY]["rows"].values():
        assert 0 <= row["ner_f1_mean"] <= 1 and row["ner_synthetic_f1_mean"] is None
    assert alone.properties[stage.UTILITY]["ner_mode"] == "finetune"
    assert alone.properties["mode"] == "finetune" and list(alone.properties[stage.UTILITY]["rows"]) == ["random", "dp"]


def test_the_dev_split_comes_from_the_training_sentences_only():
    cfg = NerConfig(enabled=True, max_train_sentences=200, dev_fraction=0.1)
    train, dev, test, _ = stage.load_ner_data(cfg)
    assert (len(train), len(dev)) == (180, 20) and len(test) == 300
    from dpbert.evaluate import ner

    bundled_train = set(ner.bundled_bc5cdr("train")[:200])
    assert set(dev) <= bundled_train and set(train) <= bundled_train and not set(dev) & set(train)
    assert stage.load_ner_data(cfg)[1] == dev  # the same dev split for every model and seed


def test_the_synthetic_task_loads_fresh_patients_with_a_dev_split_and_its_config_is_checked():
    from dpbert.config import ConfigError

    cfg = NerConfig(enabled=True, task="synthetic", synthetic_train_sentences=50, synthetic_test_sentences=20,
                    max_train_sentences=40, dev_fraction=0.1)
    train, dev, test, source = stage.load_ner_data(cfg)
    assert (len(train), len(dev), len(test)) == (36, 4, 20) and "synthetic" in source
    assert {e.type for s in train + test for e in ner_entities(s)} == {"problem", "test", "treatment"}
    assert cfg.tasks() == ["synthetic"] and NerConfig().tasks() == ["bc5cdr", "synthetic"]
    assert NerConfig(synthetic_column=False).tasks() == ["bc5cdr"]
    assert stage.task_name(NerConfig(train_path="a", test_path="b")) == stage.USER_DATA
    for bad in (dict(task="i2b2"), dict(task="synthetic", train_path="a", test_path="b"),
                dict(synthetic_train_sentences=1)):
        with pytest.raises(ConfigError, match="ner.(task|synthetic_train_sentences)"):
            NerConfig(**bad).validate("ner")


def ner_entities(sentence):
    from dpbert.evaluate import ner

    return ner.extract_entities(sentence.tags)


@pytest.fixture
def public_checkpoint(tmp_path):
    from tests.model.fake_checkpoint import write_checkpoint

    write_checkpoint(tmp_path / "public")
    return tmp_path / "public"


def test_the_public_row_is_the_dp_trainers_public_start(tmp_path, public_checkpoint, eager_steps,
                                                       few_heldout_patients):
    """A "DP" model that IS the trainer's public start (zero DP steps) scores exactly as the public
    row: the evaluator rebuilds the same start (checkpoint, public layers, warm-up, seed)."""
    from dpbert.network import bert as bert_lib
    from dpbert.network import init_public
    from dpbert.stages.pretrain import public_start_weights
    from dpbert.vocab import public
    from dpbert.vocab.wordpiece import save_vocabulary

    tokenizer, record = public.build_vocabulary("public", public_checkpoint)
    save_vocabulary(tokenizer, tmp_path / "vocabulary")
    mc = ModelConfig(max_seq_length=32, dropout=0.0, init="minilm", init_dir=str(public_checkpoint), public_layers=1,
                     public_warmup_steps=2, public_warmup_batch_size=4)
    tc = TrainingConfig(seed=7)
    weights, _, _ = public_start_weights(mc, tc, tokenizer, str(tmp_path / "vocabulary"))
    spec = init_public.spec_for_public(mc, tokenizer.get_vocab_size(), tc.mask_probability, public_checkpoint)
    models = bert_lib.build_bert(spec, seed=0)
    models.mlm.set_weights(weights)
    bert_lib.save_bert(models, tmp_path / "dp" / schema.MODEL_DIR)
    shutil.copytree(tmp_path / "vocabulary", tmp_path / "dp" / schema.TOKENIZER_DIR)
    # What is compared is the held-out MLM loss: the NER column is the cheapest one (the linear
    # probe, one epoch, a user's small IOB files).
    cfg = NerConfig(enabled=True, train_path=_iob(tmp_path / "train.tsv", TRAIN, 8),
                    test_path=_iob(tmp_path / "test.tsv", TEST, 4), mode="probe", learning_rate=0.05, epochs=1,
                    seeds=1, batch_size=8, synthetic_column=False)
    result = stage.ner_evaluation(str(tmp_path / "dp"), str(tmp_path / "report"), cfg, 24,
                                  model_config=mc, training_config=tc)
    rows = result.properties[stage.UTILITY]["rows"]
    assert list(rows) == ["random", "public", "dp"] and result.properties[stage.UTILITY]["reference"] == "public"
    assert rows["public"]["heldout_mlm_loss"] == pytest.approx(rows["dp"]["heldout_mlm_loss"], rel=1e-6)
    assert rows["public"]["heldout_mlm_accuracy"] == pytest.approx(rows["dp"]["heldout_mlm_accuracy"])
    assert rows["random"]["heldout_mlm_loss"] != pytest.approx(rows["dp"]["heldout_mlm_loss"], rel=1e-3)
    assert result.properties[schema.PRIVATE] == 0
