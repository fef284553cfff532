"""The public start (dpbert.engine.public_warmup, init_public): public rows unchanged, appended rows =
mean of their public pieces, model.public_layers, and a warm-up that reads no private input."""
import builtins
import inspect
import io
import os

import numpy as np
import pytest

from dpbert.config import ModelConfig
from dpbert.network import bert as bert_lib
from dpbert.network import init_public
from dpbert.engine import public_warmup
from dpbert.vocab import public

from .fake_checkpoint import LAYERS, VOCAB, write_checkpoint


@pytest.fixture
def checkpoint(tmp_path):
    return tmp_path / "public", write_checkpoint(tmp_path / "public")


def _combined(directory, words=(("cardiomyopathy", 80.0), ("zq", 50.0), ("heart", 40.0))):
    tokenizer, record = public.build_vocabulary("public+dp", directory, list(words))
    return tokenizer, [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())], record


def _models(directory, vocab_tokens, layers=None, max_seq_length=32):
    spec = init_public.spec_for_public(ModelConfig(max_seq_length=max_seq_length, dropout=0.0, init="minilm",
                                                   public_layers=layers), len(vocab_tokens), directory=directory)
    return bert_lib.build_bert(spec, seed=0)


def test_public_rows_unchanged_and_new_rows_are_the_mean_of_their_pieces(checkpoint):
    directory, t = checkpoint
    tokenizer, tokens, record = _combined(directory)
    models = _models(directory, tokens)
    stats = init_public.init_from_checkpoint(models, tokens, directory)
    table = models.mlm.get_layer("word_embeddings").embeddings.numpy()
    public_table = t["embeddings.word_embeddings.weight"]
    # Every public token: its checkpoint row; same id except the 4 special swaps.
    for i, token in enumerate(tokens[:len(VOCAB)]):
        np.testing.assert_array_equal(table[i], public_table[VOCAB.index(token)])
    assert [i for i, token in enumerate(tokens[:len(VOCAB)]) if VOCAB[i] != token] == [1, 2, 3, 4, 5, 6, 7, 8]
    # Appended DP words: the mean of their public pieces' rows.
    assert tokens[len(VOCAB):] == ["cardiomyopathy", "zq"]
    pieces = {"cardiomyopathy": ["card", "##io", "##my", "##opathy"], "zq": ["z", "##q"]}
    for word, parts in pieces.items():
        expected = public_table[[VOCAB.index(p) for p in parts]].mean(axis=0)
        np.testing.assert_allclose(table[tokens.index(word)], expected, rtol=1e-6)
    assert (stats["rows_exact"], stats["rows_piece_mean"], stats["rows_initialised"]) == (len(VOCAB), 2, 0)
    # The untied MLM output projection starts as a copy of the input table (new rows included).
    np.testing.assert_array_equal(models.mlm.get_layer("mlm_output").kernel.numpy(), table.T)
    assert record["dp_tokens"] == 2


def test_public_layers_keeps_the_first_layers(checkpoint):
    directory, t = checkpoint
    _, tokens, _ = _combined(directory)
    models = _models(directory, tokens, layers=2)
    assert models.spec.num_layers == 2
    stats = init_public.init_from_checkpoint(models, tokens, directory)
    assert (stats["layers"], stats["public_layers"]) == (2, LAYERS)
    np.testing.assert_array_equal(models.mlm.get_layer("layer_1_intermediate").kernel.numpy(),
                                  t["encoder.layer.1.intermediate.dense.weight"].T)
    with pytest.raises(ValueError, match="public_layers"):
        _models(directory, tokens, layers=LAYERS + 1)


def test_warm_up_signature_has_no_private_input():
    params = set(inspect.signature(public_warmup.warm_up).parameters)
    assert params == {"models", "tokenizer", "steps", "seed", "batch_size", "learning_rate", "mask_probability",
                      "scope", "rows"}
    assert set(inspect.signature(public_warmup.public_start).parameters) == {
        "spec", "tokenizer", "vocab_tokens", "steps", "seed", "checkpoint_dir", "batch_size", "learning_rate",
        "mask_probability", "scope"}


def test_warm_up_opens_only_the_shipped_public_text_and_learns(checkpoint, monkeypatch):
    directory, t = checkpoint
    tokenizer, tokens, _ = _combined(directory)
    models = _models(directory, tokens)
    init_public.init_from_checkpoint(models, tokens, directory)
    before = {v.name: v.numpy().copy() for v in models.mlm.weights}
    opened = []
    real_open, real_io_open = builtins.open, io.open

    def spy(open_fn):
        def wrapped(file, mode="r", *args, **kwargs):
            if not any(c in mode for c in "wax+"):        # what is READ (TF's autograph writes temp files)
                opened.append(os.path.realpath(file) if isinstance(file, (str, os.PathLike)) else file)
            return open_fn(file, mode, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(builtins, "open", spy(real_open))
    monkeypatch.setattr(io, "open", spy(real_io_open))
    record = public_warmup.warm_up(models, tokenizer, steps=40, seed=0, batch_size=16, learning_rate=1e-2)
    monkeypatch.undo()
    shipped = os.path.realpath(public_warmup.public_text_path())
    assert shipped.endswith(os.path.join("resources", "ner", "bc5cdr", "train.tsv"))
    assert set(opened) == {shipped}
    assert record["loss_last"] < record["loss_first"]
    assert record["source"] == public_warmup.SOURCE and record["steps"] == 40
    # scope "head": the encoder, the embeddings and the output projection keep their public values.
    after = {v.name: v.numpy() for v in models.mlm.weights}
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert changed and all(name.startswith(("mlm_transform", "mlm_layer_norm", "mlm_output/bias")) for name in changed)


def test_public_rows_pack_the_shipped_sentences():
    from dpbert.vocab.wordpiece import load_tokenizer, save_vocabulary, train_wordpiece
    from collections import Counter

    sentences = public_warmup.public_sentences()
    assert len(sentences) == 1000 and sentences[0][0] == "Selegiline"
    words = Counter(w.lower() for s in sentences for w in s)
    tokenizer = train_wordpiece(words.items(), vocab_size=400)
    rows = public_warmup.public_rows(tokenizer, 64, sentences[:50])
    assert rows.shape[1] == 64 and (rows[:, 0] == 2).all()
    assert ((rows == 3).sum(axis=1) == 1).all()
    pieces = sum(len(e.ids) for e in tokenizer.encode_batch(sentences[:50], is_pretokenized=True,
                                                             add_special_tokens=False))
    assert ((rows > 4).sum()) + (rows == 1).sum() == pieces          # every piece once, none lost


def test_pretrain_stage_records_the_public_start(checkpoint, tmp_path, eager_steps):
    """(The warm-up's 3 and the training's 2 steps, eagerly: the stage's records are tested.)"""
    from dpbert import schema
    from dpbert.config import MembershipConfig, PrivacyConfig, TrainingConfig
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tfrecord import write_tuples
    from dpbert.data.tuples import corpus_tuples
    from dpbert.stages.pretrain import PretrainInputs, PretrainOptions, pretrain
    from dpbert.vocab.wordpiece import save_vocabulary

    directory, _ = checkpoint
    tuples = list(corpus_tuples(generate_notes(patients=4, admissions_per_patient=1, notes_per_admission=1, seed=4),
                                tuple_words=24))
    write_tuples(tuples, str(tmp_path / "tuples"), num_shards=1)
    tokenizer, _, record = _combined(directory)
    save_vocabulary(tokenizer, tmp_path / "vocabulary")
    public.write_token_sources(record, tmp_path / "vocabulary")
    mc = ModelConfig(max_seq_length=16, dropout=0.0, init="minilm", init_dir=str(directory), public_layers=1,
                     public_warmup_steps=3, public_warmup_batch_size=4)
    # n planned 48 (53 tuples, some held out): q ≈ 1/10, a round or two of 4 rows a step (n = 8: ≈ 7 rounds)
    tc = TrainingConfig(batch_size=4, steps=2, warmup_steps=0, clip_norm=1.0, noise_multiplier=1.0, delta=1e-5,
                        dataset_size=48, integrity_check_every=0)  # the brute-force check: test_integrity_checks
    inputs = PretrainInputs(str(tmp_path / "tuples"), str(tmp_path / "vocabulary"))
    result = pretrain(inputs, str(tmp_path / "model"),
                      model_config=mc, training_config=tc, privacy_config=PrivacyConfig(tuple_words=24),
                      membership_config=MembershipConfig(), pipeline_root=str(tmp_path / "root"),
                      options=PretrainOptions(export_saved_model=False))
    props = result.properties
    assert props[schema.PUBLIC_INIT] == str(directory)
    assert (props[schema.PUBLIC_LAYERS], props[schema.PUBLIC_WARMUP_STEPS]) == (1, 3)
    assert props[schema.PUBLIC_WARMUP_SOURCE] == public_warmup.SOURCE
    assert props["public_rows_piece_mean"] == 2
    # The ledger holds the DP-SGD record only: the public start is outside it.
    assert [r["mechanism"] for r in __import__("json").loads(props[schema.DP_EVENTS])] == ["dp_sgd"]
    # A public vocabulary from another checkpoint is refused.
    write_checkpoint(tmp_path / "other", vocab=VOCAB + ["extra"])
    with pytest.raises(ValueError, match="another public checkpoint"):
        pretrain(inputs, str(tmp_path / "model2"),
                 model_config=ModelConfig(max_seq_length=16, init="minilm", init_dir=str(tmp_path / "other")),
                 training_config=tc, privacy_config=PrivacyConfig(tuple_words=24),
                 membership_config=MembershipConfig(), pipeline_root=str(tmp_path / "root"),
                 options=PretrainOptions(export_saved_model=False))
