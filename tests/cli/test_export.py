"""`dpbert export` (in-process): a model saved by save_bert in the trainer's artifact layout is
written in the Hugging Face BertForMaskedLM layout, which an independent numpy BertForMaskedLM
reads to dpbert's logits; a model whose training OR vocabulary is not shown DP is refused in every
argument form unless --allow-private (marked private); a DP export states the release manifest's
privacy fields in its model card and config.json, and nothing that names the data."""
import dataclasses
import json
import shutil

import numpy as np
import pytest

from dpbert import exit_codes, metadata, release, schema
from dpbert.network import bert as bert_lib
from dpbert.network import hf_layout
from dpbert.privacy import events, histogram
from dpbert.privacy.numbers import fmt_delta
from dpbert_cli.export import PRIVATE_FILE
from dpbert_cli.main import main
from tests.dashboard import fakestore
from tests.model import fake_checkpoint
from tests.model.test_hf_export import hf_mlm_logits, read_hf

#: --dist loadgroup: the models built once per process (test_export.py's cache) are built on one worker.
pytestmark = pytest.mark.xdist_group("export_models")


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "patient", "fever", "heart", "rate", "the", "of", "##s"]
HF_FILES = {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "README.md"}
TRAINING_DELTA = 1.0001e-05
PUBLIC_L = 32  # the run's max_seq_length after a public start; the fake checkpoint has 64 positions


def vocab_record(dp=True):
    return events.histogram_event(histogram.histogram_report(10.0, 1e-9, 32)) if dp else events.non_private_event("vocab")


#: Built models by (seed, public checkpoint folder): artifacts that differ only in their records
#: share one model (the tests read it, never train it).
_BUILT = {}


def _trained_model(seed, public):
    """A tiny BERT (a minilm-shaped one started from ``public``), its weights moved as a training
    would; built once per (seed, public)."""
    key = (seed, None if public is None else str(public))
    if key in _BUILT:
        return _BUILT[key]
    spec = bert_lib.BertSpec(vocab_size=len(VOCAB), max_seq_length=16, max_predictions=3, preset="tiny",
                             **bert_lib.PRESETS["tiny"])
    if public is not None:
        spec = bert_lib.BertSpec(vocab_size=len(VOCAB), hidden_size=fake_checkpoint.H, num_layers=2,
                                 num_heads=fake_checkpoint.HEADS, intermediate_size=fake_checkpoint.INTER,
                                 max_seq_length=PUBLIC_L, max_predictions=5, preset="minilm")
    models = bert_lib.build_bert(spec, seed=seed)
    if public is not None:
        from dpbert.network import init_public

        init_public.init_from_checkpoint(models, VOCAB, public, seed)
    rng = np.random.default_rng(seed)
    for w in models.mlm.weights:
        w.assign(w.numpy() + rng.normal(0, 0.1, w.shape).astype(np.float32))
    _BUILT[key] = models
    return models


def _write_artifact(directory, dp=True, seed=0, vocab_dp=True, public=None):
    """The trainer's artifact layout: model/ (save_bert, tiny preset), tokenizer/, dp_events.json,
    vocab_dp_event.json (the vocabulary's record: a DP histogram's, or exact counts'). ``public``:
    a public checkpoint folder (tests/model/fake_checkpoint.py) the model starts from, with L = 32
    (``init_public``: preset minilm), before its weights are moved as a training would."""
    from dpbert.vocab import wordpiece

    models = _trained_model(seed, public)
    bert_lib.save_bert(models, directory / schema.MODEL_DIR)
    (directory / "vocab_src").mkdir()
    (directory / "vocab_src" / wordpiece.VOCAB_FILE).write_text("\n".join(VOCAB) + "\n")
    wordpiece.save_vocabulary(wordpiece.load_tokenizer(directory / "vocab_src"), directory / schema.TOKENIZER_DIR)
    shutil.rmtree(directory / "vocab_src")
    record = events.dpsgd_event(1.1, 16, 2000, 10) if dp else events.non_private_event("train")
    (directory / schema.DP_EVENTS_FILE).write_text(events.to_json([record]))
    (directory / release.VOCAB_DP_EVENT_FILE).write_text(events.to_json(
        {"vocab_event": vocab_record(vocab_dp), "training_delta": TRAINING_DELTA}))
    return models


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    directory = tmp_path_factory.mktemp("artifact")
    return directory, _write_artifact(directory)


def _export(*args):
    return main(["export", *map(str, args)])


def _assert_logits_match(models, out):
    config, t = read_hf(out)
    ids = np.array([[2, 5, 6, 11, 7, 3] + [0] * 10, [2, 9, 8, 10, 7, 6, 5, 3] + [0] * 8], np.int32)
    positions = np.array([[1, 3, 9], [2, 4, 6]], np.int32)
    ours = models.mlm({"input_ids": ids, "masked_positions": positions}, training=False).numpy()
    theirs = hf_mlm_logits(config, t, ids, (ids != 0).astype(np.float64))
    np.testing.assert_allclose(np.take_along_axis(theirs, positions[..., None], 1), ours, atol=1e-4, rtol=0)


def test_export_of_an_artifact_folder(artifact, tmp_path, capsys):
    directory, models = artifact
    out = tmp_path / "hf"
    assert _export(directory, "--to", out) == exit_codes.OK
    assert "BertForMaskedLM" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == HF_FILES
    _assert_logits_match(models, out)
    config = json.loads((out / "config.json").read_text())
    assert config["dpbert_private"] is False and config["architectures"] == ["BertForMaskedLM"]
    # the privacy fields: the records that travel with the model, composed as the accountant does
    expected = release.records_privacy(vocab_record(), [events.dpsgd_event(1.1, 16, 2000, 10)], TRAINING_DELTA)
    assert config[hf_layout.PRIVACY_KEY] == {"differentially_private": True, **expected}
    assert expected["mechanisms"] == ["dp_histogram", "dp_sgd"] and expected["delta"] > TRAINING_DELTA
    _assert_card_states(out, expected, forbidden=[str(directory), str(tmp_path)])
    assert (out / "tokenizer.json").read_bytes() == (directory / schema.TOKENIZER_DIR / "tokenizer.json").read_bytes()
    assert (out / "vocab.txt").read_text().split() == VOCAB
    # a random start: the run's own 16 positions, and the card says so
    assert config["max_position_embeddings"] == 16 and "Positions: 16, the run's max_seq_length" in \
        (out / "README.md").read_text()


def test_export_of_the_model_folder_finds_the_tokenizer_next_to_it(artifact, tmp_path, capsys):
    directory, models = artifact
    out = tmp_path / "hf"
    assert _export(directory / schema.MODEL_DIR, "--to", out, "--json") == exit_codes.OK
    summary = json.loads(capsys.readouterr().out)
    assert summary["private"] is False and set(summary["files"]) == HF_FILES
    _assert_logits_match(models, out)


def test_a_private_model_is_refused_unless_allowed(tmp_path, capsys):
    directory = tmp_path / "baseline"
    directory.mkdir()
    models = _write_artifact(directory, dp=False)
    out = tmp_path / "hf"
    assert _export(directory, "--to", out) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert "non-private" in err and "--allow-private" in err and not out.exists()
    assert _export(directory, "--to", out, "--allow-private") == exit_codes.OK
    assert "PRIVATE" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["dpbert_private"] is True and config[hf_layout.PRIVACY_KEY] == {"differentially_private": False}
    assert (out / PRIVATE_FILE).exists() and "operator-only" in (out / "README.md").read_text()
    _assert_logits_match(models, out)


def _assert_card_states(out, privacy, forbidden):
    """The card states ε, δ (fmt_delta), unit, adjacency and mechanisms; config.json holds the same
    values; neither names a forbidden string (a local path, a dataset id)."""
    card = (out / "README.md").read_text()
    assert f"| δ | {fmt_delta(privacy['delta'])} |" in card and f"| privacy unit | {privacy['unit']} |" in card
    assert f"| adjacency | {privacy['adjacency']} |" in card and ", ".join(privacy["mechanisms"]) in card
    assert "| ε (vocabulary + training, composed) |" in card
    config = (out / "config.json").read_text()
    assert not [f for f in forbidden if f in card or f in config], "the export names the data"


def test_the_card_check_catches_a_card_that_names_the_data(artifact, tmp_path):
    # positive control: a card whose unit names a local path fails the check
    directory, models = artifact
    privacy = release.records_privacy(vocab_record(), [events.dpsgd_event(1.1, 16, 2000, 10)], TRAINING_DELTA)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "README.md").write_text(hf_layout.model_card(models.spec, {**privacy, "mechanisms": [str(directory)]}))
    with pytest.raises(AssertionError, match="names the data"):
        _assert_card_states(out, {**privacy, "mechanisms": [str(directory)]}, forbidden=[str(directory)])


@pytest.mark.parametrize("vocab_dp, dp, message", [
    (False, True, "the vocabulary is not DP"),     # exact WordPiece of the corpus, DP training
    (True, False, "non-private"),                    # DP vocabulary, non-private training
])
def test_the_path_form_refuses_a_model_whose_vocabulary_or_training_is_not_dp(tmp_path, capsys, vocab_dp, dp,
                                                                              message):
    directory = tmp_path / "artifact"
    directory.mkdir()
    _write_artifact(directory, dp=dp, vocab_dp=vocab_dp)
    for model in (directory, directory / schema.MODEL_DIR):  # the artifact folder, its model/ folder
        assert _export(model, "--to", tmp_path / "hf") == exit_codes.BAD_INPUT
        assert message in capsys.readouterr().err and not (tmp_path / "hf").exists()


def test_a_model_without_its_vocabulary_record_is_refused(artifact, tmp_path, capsys):
    directory, _ = artifact
    bare = tmp_path / "bare"
    shutil.copytree(directory, bare)
    (bare / release.VOCAB_DP_EVENT_FILE).unlink()
    assert _export(bare, "--to", tmp_path / "hf") == exit_codes.BAD_INPUT
    assert "nothing shows its vocabulary is DP" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_another_tokenizer_is_not_shown_dp(artifact, tmp_path, capsys):
    directory, _ = artifact
    other = tmp_path / "exact_vocab"
    shutil.copytree(directory / schema.TOKENIZER_DIR, other)
    (other / "vocab.txt").write_text("\n".join(VOCAB[:-1] + ["##ed"]) + "\n")
    assert _export(directory, "--to", tmp_path / "hf", "--tokenizer", other) == exit_codes.BAD_INPUT
    assert "--tokenizer" in capsys.readouterr().err and not (tmp_path / "hf").exists()


def test_a_model_without_dp_record_is_refused(artifact, tmp_path, capsys):
    directory, _ = artifact
    bare = tmp_path / "bare"
    shutil.copytree(directory, bare)
    (bare / schema.DP_EVENTS_FILE).unlink()
    assert _export(bare, "--to", tmp_path / "hf") == exit_codes.BAD_INPUT
    assert "nothing shows it was trained with DP" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The release store of tests/dashboard/fakestore.py with real models in its model artifacts."""
    base = tmp_path_factory.mktemp("export_store")
    uris = fakestore.build_release_store(str(base / "metadata.sqlite"), str(base / "pipeline_root"))
    from pathlib import Path

    models = {}
    for run in (fakestore.RELEASE_RUN, fakestore.NON_PRIVATE_RUN):
        uri = Path(uris[run]["model"])
        shutil.rmtree(uri)
        uri.mkdir()
        models[run] = _write_artifact(uri, seed=3)
    return {"path": str(base / "metadata.sqlite"), "models": models, "base": str(base)}


def test_the_run_form_exports_the_runs_dp_model(store, tmp_path, capsys):
    out = tmp_path / "hf"
    assert _export("--metadata", store["path"], "--run", fakestore.RELEASE_RUN, "--to", out) == exit_codes.OK
    _assert_logits_match(store["models"][fakestore.RELEASE_RUN], out)
    assert fakestore.RELEASE_SECRET not in capsys.readouterr().out
    # the same privacy fields as the run's release manifest, in config.json and the card
    run = metadata.get_run(metadata.open_store(store["path"]), fakestore.RELEASE_RUN)
    manifest = release.write_bundle(run, str(tmp_path / "bundle"))
    privacy = json.loads((out / "config.json").read_text())[hf_layout.PRIVACY_KEY]
    assert privacy == {"differentially_private": True, **{k: manifest[k] for k in release.PRIVACY_FIELDS}}
    assert privacy["epsilon"] == fakestore.RELEASE_EPSILON and privacy["mechanisms"] == ["dp_histogram", "dp_sgd"]
    _assert_card_states(out, privacy, forbidden=[store["base"], fakestore.RELEASE_SECRET, run.run_id])


@pytest.mark.parametrize("run, message", [(fakestore.NON_PRIVATE_RUN, "not differentially private"),
                                          (fakestore.OVER_BUDGET_RUN, "over its privacy budget")])
@pytest.mark.parametrize("form", ["--metadata", "--output", "MODEL"])
def test_the_run_form_refuses_a_run_that_is_not_dp(store, tmp_path, capsys, run, message, form):
    out = tmp_path / "hf"
    where = {"--metadata": ["--metadata", store["path"]], "--output": ["--output", store["base"]],
             "MODEL": [store["base"]]}[form]
    assert _export(*where, "--run", run, "--to", out) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and fakestore.RELEASE_SECRET not in err and not out.exists()


def test_bad_inputs_are_named_before_anything_is_written(artifact, tmp_path, capsys):
    directory, _ = artifact
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert _export(directory, "--to", full) == exit_codes.BAD_INPUT
    assert "not an empty directory" in capsys.readouterr().err
    assert _export(tmp_path / "nowhere", "--to", tmp_path / "hf") == exit_codes.BAD_INPUT
    assert "does not exist" in capsys.readouterr().err
    short = tmp_path / "short"
    shutil.copytree(directory, short)
    (short / schema.TOKENIZER_DIR / "tokenizer.json").unlink()
    (short / schema.TOKENIZER_DIR / "vocab.txt").write_text("\n".join(VOCAB[:-1]) + "\n")
    assert _export(short, "--to", tmp_path / "hf") == exit_codes.BAD_INPUT
    assert "vocab.txt has 11 tokens, the model's vocab_size is 12" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------ a public start's positions
@pytest.fixture(scope="module")
def public_start(tmp_path_factory):
    """(artifact folder, its model, the public checkpoint folder, the checkpoint's tensors as written)."""
    base = tmp_path_factory.mktemp("public_start")
    tensors = fake_checkpoint.write_checkpoint(base / "checkpoint")
    models = _write_artifact(base / "artifact", public=base / "checkpoint")
    return base / "artifact", models, base / "checkpoint", tensors


def _reference_positions(models, tensors, fold=True):
    """The position table an HF reader must see, assembled WITHOUT the export's code: the run's rows
    (< L) from the Keras layer, the rest read from the public checkpoint's tensors (+ its type-0 row)."""
    trained = models.mlm.get_layer("position_embeddings").embeddings.numpy()
    public = tensors["embeddings.position_embeddings.weight"] + (tensors["embeddings.token_type_embeddings.weight"][0]
                                                                 if fold else 0.0)
    return np.concatenate([trained, public[trained.shape[0]:]]).astype(np.float64)


def test_a_public_start_exports_the_checkpoints_positions(public_start, tmp_path, capsys):
    directory, models, checkpoint, tensors = public_start
    out = tmp_path / "hf"
    assert _export(directory, "--to", out, "--public-checkpoint", checkpoint, "--json") == exit_codes.OK
    summary = json.loads(capsys.readouterr().out)
    assert (summary["positions"], summary["trained_positions"]) == (fake_checkpoint.POS, PUBLIC_L)
    config, t = read_hf(out)
    assert config["max_position_embeddings"] == fake_checkpoint.POS and config["dpbert_trained_positions"] == PUBLIC_L
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == fake_checkpoint.POS
    assert "Rows 0-31 were trained by this run" in (out / "README.md").read_text()
    n = 60  # a note longer than the run's 32 positions: [CLS] 58 tokens [SEP]
    ids = np.array([[2] + [5 + i % 7 for i in range(n - 2)] + [3] + [0] * 4], np.int32)
    mask = (ids != 0).astype(np.float64)
    exported = hf_mlm_logits(config, t, ids, mask)
    reference = dict(t, **{"bert.embeddings.position_embeddings.weight": _reference_positions(models, tensors)})
    expected = hf_mlm_logits(config, reference, ids, mask)
    np.testing.assert_allclose(exported[:, PUBLIC_L:n], expected[:, PUBLIC_L:n], atol=1e-4, rtol=0)
    np.testing.assert_allclose(exported, expected, atol=1e-4, rtol=0)
    # positive control: the same reference without the checkpoint's type-0 row folded in is told apart
    unfolded = dict(t, **{"bert.embeddings.position_embeddings.weight": _reference_positions(models, tensors, False)})
    assert np.abs(hf_mlm_logits(config, unfolded, ids, mask)[:, PUBLIC_L:n] - exported[:, PUBLIC_L:n]).max() > 1e-2
    # within the run's positions the export computes what dpbert computes
    short = ids[:, :PUBLIC_L].copy()
    short[0, -1] = 3
    positions = np.array([[1, 4, 9, 20, 30]], np.int32)
    ours = models.mlm({"input_ids": short, "masked_positions": positions}, training=False).numpy()
    theirs = hf_mlm_logits(config, t, short, (short != 0).astype(np.float64))
    np.testing.assert_allclose(np.take_along_axis(theirs, positions[..., None], 1), ours, atol=1e-4, rtol=0)


def test_the_public_checkpoint_is_found_as_the_run_found_it_or_refused_naming_the_fix(public_start, tmp_path,
                                                                                      monkeypatch):
    import argparse

    from dpbert_cli.commands import UserError
    from dpbert_cli.export import Source, _public_table

    directory, models, checkpoint, tensors = public_start
    spec, path = models.spec, Source(str(directory / "model"), "", None)  # the path form: the preset says minilm
    args = lambda **kw: argparse.Namespace(**{"public_checkpoint": None, "no_public_positions": False, **kw})  # noqa
    monkeypatch.setenv("DPBERT_MINILM_DIR", str(checkpoint))
    table, where = _public_table(args(), path, spec)
    assert where == str(checkpoint) and table.shape == (fake_checkpoint.POS, fake_checkpoint.H)
    # the run form: the checkpoint folder the run recorded (public_init) wins over the environment's
    run = Source("", "", None, public_init=str(checkpoint), from_run=True)
    monkeypatch.setenv("DPBERT_MINILM_DIR", str(tmp_path / "nowhere"))
    assert _public_table(args(), run, spec)[1] == str(checkpoint)
    with pytest.raises(UserError, match="--public-checkpoint DIR, or --no-public-positions"):
        _public_table(args(), path, spec)
    assert _public_table(args(no_public_positions=True), path, spec) == (None, None)
    assert _public_table(args(), Source("", "", None, public_init=None, from_run=True), spec) == (None, None)
    with pytest.raises(UserError, match="did not start from a public checkpoint"):
        _public_table(args(public_checkpoint=str(checkpoint)), Source("", "", None, from_run=True), spec)
    wide = dataclasses.replace(spec, hidden_size=2 * spec.hidden_size, num_heads=2)
    with pytest.raises(UserError, match="the model's is"):
        _public_table(args(public_checkpoint=str(checkpoint)), path, wide)
