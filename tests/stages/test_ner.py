"""dpbert.stages.ner without TFX: the bundled data's path into the stage (the whole evaluation —
rows, table, report file, properties — runs on the user's IOB files in test_ner_utility.py)."""
from dpbert.config import NerConfig
from dpbert.stages import ner as stage


def test_without_user_files_the_stage_evaluates_the_bundled_bc5cdr_subset():
    train, dev, test, source = stage.load_ner_data(NerConfig(enabled=True, max_train_sentences=16))
    assert source.startswith("bundled BC5CDR") and len(train) + len(dev) == 16 and dev and test
    types = {tag[2:] for s in train + test for tag in s.tags if tag != "O"}
    assert types == {"Chemical", "Disease"}
