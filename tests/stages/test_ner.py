"""dpbert.stages.ner without TFX: the rows, the report file and the properties (tiny models)."""
import json
import shutil

from dpbert import schema
from dpbert.config import NerConfig
from dpbert.stages import ner as stage


def test_ner_evaluation_rows_and_properties(tmp_path, vocabulary_dir):
    from dpbert.model.bert import BertSpec, build_bert, save_bert
    from dpbert.vocab.wordpiece import load_tokenizer

    spec = BertSpec(vocab_size=load_tokenizer(vocabulary_dir).get_vocab_size(), hidden_size=16, num_layers=1,
                    num_heads=2, intermediate_size=32, max_seq_length=32, max_predictions=5)
    dirs = {}
    for name, seed in (("dp", 1), ("non_private", 2)):
        dirs[name] = tmp_path / name
        save_bert(build_bert(spec, seed=seed), dirs[name] / schema.MODEL_DIR)
        shutil.copytree(vocabulary_dir, dirs[name] / schema.TOKENIZER_DIR)
    result = stage.ner_evaluation(str(dirs["dp"]), str(tmp_path / "report"),
                                  NerConfig(enabled=True, epochs=1, max_train_sentences=16, batch_size=8, seeds=1,
                                            synthetic_column=False), 24,
                                  baseline_model_dir=str(dirs["non_private"]))
    props = result.properties
    assert [row["model"] for row in props["table"]] == ["random", "dp", "non_private"]
    assert 0 <= props["f1"] <= 1 and set(props["per_type"]) == {"Chemical", "Disease"}
    assert props["train_sentences"] + props["dev_sentences"] == 16 and props["data"].startswith("bundled BC5CDR")
    assert props[schema.PRIVATE] == 1
    report = json.loads((tmp_path / "report" / stage.REPORT_FILE).read_text())
    assert set(report["rows"]) == {"random", "dp", "non_private"}
