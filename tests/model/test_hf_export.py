"""The Hugging Face ``BertForMaskedLM`` export (dpbert.network.hf_layout) and its reader
(dpbert.network.init_public.load_hf_bert).

The independent check is ``hf_mlm_logits``: a numpy forward pass with BertForMaskedLM's semantics
driven ONLY by config.json and the tensor names (no dpbert code). A self round trip cannot catch a
layout that dpbert writes and reads back the same wrong way; this can (the positive controls
below break the layout consistently in both directions: the round trip still passes, it fails).
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

from dpbert.network import bert as bert_lib
from dpbert.network import hf_layout, init_public

from .conftest import repetitive_corpus
from .fake_checkpoint import write_checkpoint

#: --dist loadgroup: with the CLI's export, predict and readout tests, whose models share its
#: helpers (their module fixtures and imports are paid on one worker).
pytestmark = pytest.mark.xdist_group("export_models")


PAD = 0


# ------------------------------------------------------------------ the independent reference
def _gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


ACTIVATIONS = {"gelu": _gelu, "gelu_new": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh}


def read_hf(directory):
    from safetensors.numpy import load_file

    config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    return config, {k: v.astype(np.float64) for k, v in load_file(str(Path(directory) / "model.safetensors")).items()}


def hf_mlm_logits(config, t, input_ids, attention_mask, head=True, activation=None):
    """BertForMaskedLM(input_ids, attention_mask, token_type_ids=0) in numpy: logits [B, L, V]
    (``head=False``: the encoder's last hidden states [B, L, H])."""
    p = "bert." if "bert.embeddings.word_embeddings.weight" in t else ""
    act = activation or ACTIVATIONS[config["hidden_act"]]
    eps, H, heads = config["layer_norm_eps"], config["hidden_size"], config["num_attention_heads"]
    d = H // heads
    B, L = input_ids.shape

    def ln(x, name):
        m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * t[name + ".weight"] + t[name + ".bias"]

    def linear(x, name):
        return x @ t[name + ".weight"].T + t[name + ".bias"]

    h = t[p + "embeddings.word_embeddings.weight"][input_ids] + t[p + "embeddings.position_embeddings.weight"][:L] \
        + t[p + "embeddings.token_type_embeddings.weight"][np.zeros_like(input_ids)]
    h = ln(h, p + "embeddings.LayerNorm")
    # HF's extended attention mask: (1 - mask) · float32 min added to every key's score.
    extended = (1.0 - attention_mask[:, None, None, :]) * np.finfo(np.float32).min
    for i in range(config["num_hidden_layers"]):
        q_name = p + f"encoder.layer.{i}."
        split = lambda x: x.reshape(B, L, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = (split(linear(h, q_name + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + extended
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, L, H)
        h = ln(h + linear(context, q_name + "attention.output.dense"), q_name + "attention.output.LayerNorm")
        inner = act(linear(h, q_name + "intermediate.dense"))
        h = ln(h + linear(inner, q_name + "output.dense"), q_name + "output.LayerNorm")
    if not head:
        return h
    x = ln(act(linear(h, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
    decoder = t.get("cls.predictions.decoder.weight")
    if decoder is None and config.get("tie_word_embeddings", True):
        decoder = t[p + "embeddings.word_embeddings.weight"]
    return x @ decoder.T + t["cls.predictions.bias"]


# ------------------------------------------------------------------ fixtures
SMALL = bert_lib.BertSpec(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                          max_seq_length=12, max_predictions=5, dropout=0.0, attention_dropout=0.0)


def _randomise(models, seed=0, scale=0.3):
    """Every weight random (LayerNorm γ around 1, nonzero biases): a swapped or transposed tensor shows."""
    rng = np.random.default_rng(seed)
    for w in models.mlm.weights:
        base = 1.0 if "gamma" in w.name else 0.0
        w.assign(base + rng.normal(0, scale, w.shape).astype(np.float32))
    return models


def _trained_tiny():
    """The tiny preset (H 64, 2 layers, 2 heads, I 128) after 2 Adam steps on a repetitive corpus
    (lr 1e-2: every weight moved, the LayerNorm γs up to 2e-2 away from 1)."""
    import tensorflow as tf
    import tf_keras

    spec = bert_lib.BertSpec(vocab_size=40, max_seq_length=16, max_predictions=4, **bert_lib.PRESETS["tiny"],
                             preset="tiny")
    models = bert_lib.build_bert(spec, seed=1)
    ids = repetitive_corpus(n=64, length=16, vocab=40)
    rng = np.random.default_rng(0)
    positions = np.stack([rng.choice(np.arange(1, 11), 4, replace=False) for _ in ids]).astype(np.int32)
    labels = np.take_along_axis(ids, positions, 1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 4, 1)
    # Two eager tape steps of 32 rows: Keras' fit would add its data adapter and callbacks (≈ 2 s CPU),
    # or AutoGraph-convert its whole train step (≈ 20 s) without run_eagerly.
    optimizer = tf_keras.optimizers.Adam(1e-2)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for rows in (slice(0, 32), slice(32, 64)):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[rows], models.mlm({"input_ids": masked[rows], "masked_positions": positions[rows]},
                                                    training=True))
        variables = models.mlm.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return models


@pytest.fixture(scope="module")
def small():
    """``SMALL`` with random weights (``_randomise``), built once: the tests read it (an export, a
    LoRA adaptation or a reload builds its own model)."""
    return _randomise(bert_lib.build_bert(SMALL, seed=0))


def _batch(spec, seed=0):
    """[CLS] random tokens [SEP] then pads (a different length per row, one row without pads)."""
    rng = np.random.default_rng(seed)
    L = spec.max_seq_length
    ids = np.full((3, L), PAD, np.int32)
    for row, n in enumerate((L, L - 4, 5)):
        ids[row, :n] = rng.integers(5, spec.vocab_size, n)
        ids[row, 0], ids[row, n - 1] = 2, 3
    positions = np.stack([rng.choice(L, spec.max_predictions, replace=False) for _ in ids]).astype(np.int32)
    return ids, positions


def _dpbert_logits(models, ids, positions):
    return models.mlm({"input_ids": ids, "masked_positions": positions}, training=False).numpy()


def _export(models, directory):
    files = hf_layout.hf_files(models, {"vocab.txt": b"[PAD]\n"})
    hf_layout.write_files(str(directory), files)
    return read_hf(directory)


def _assert_reference_matches(models, directory, atol=1e-4):
    config, t = _export(models, directory)
    ids, positions = _batch(models.spec)
    ours = _dpbert_logits(models, ids, positions)
    theirs = hf_mlm_logits(config, t, ids, (ids != config["pad_token_id"]).astype(np.float64))
    np.testing.assert_allclose(np.take_along_axis(theirs, positions[..., None], 1), ours, atol=atol, rtol=0)
    return ours


# ------------------------------------------------------------------ tests
def test_numpy_bert_for_masked_lm_gives_dpbert_logits_random_weights(small, tmp_path):
    models = small
    ours = _assert_reference_matches(models, tmp_path)
    assert np.abs(ours).max() > 1.0  # not a trivially small output


def test_numpy_bert_for_masked_lm_gives_dpbert_logits_trained_tiny(tmp_path):
    models = _trained_tiny()
    gammas = models.mlm.get_layer("layer_0_output_layer_norm").gamma.numpy()
    assert np.abs(gammas - 1).max() > 1e-2  # trained away from the initialisation
    _assert_reference_matches(models, tmp_path)


def test_pads_are_masked_as_hf_masks_them(small, tmp_path):
    """A pad row's logits do not depend on what the pad keys hold only because both mask them:
    without HF's attention_mask the reference disagrees."""
    models = small
    config, t = _export(models, tmp_path)
    ids, positions = _batch(SMALL)
    unmasked = hf_mlm_logits(config, t, ids, np.ones(ids.shape))
    ours = _dpbert_logits(models, ids, positions)
    assert np.abs(np.take_along_axis(unmasked, positions[..., None], 1)[1:] - ours[1:]).max() > 1e-2


def test_config_and_names(small, tmp_path):
    models = small
    config, t = _export(models, tmp_path)
    assert config["architectures"] == ["BertForMaskedLM"] and config["model_type"] == "bert"
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["intermediate_size"], config["max_position_embeddings"]) == (50, 16, 2, 2, 32, 12)
    assert (config["hidden_act"], config["layer_norm_eps"], config["type_vocab_size"],
            config["tie_word_embeddings"], config["pad_token_id"]) == ("gelu", 1e-12, 1, False, 0)
    assert not np.any(t["bert.embeddings.token_type_embeddings.weight"]) and \
        t["bert.embeddings.token_type_embeddings.weight"].shape == (1, 16)
    np.testing.assert_array_equal(t["cls.predictions.decoder.bias"], t["cls.predictions.bias"])
    assert t["bert.encoder.layer.0.attention.self.query.weight"].shape == (16, 16)
    assert t["bert.encoder.layer.1.intermediate.dense.weight"].shape == (32, 16)  # [out, in]
    assert t["cls.predictions.decoder.weight"].shape == (50, 16)
    assert all(k.startswith(("bert.", "cls.predictions.")) for k in t)
    assert len(t) == 5 + 2 * 16 + 7
    for name in ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        assert (tmp_path / name).exists()


def test_round_trip_through_load_hf_bert(small, tmp_path):
    models = small
    _export(models, tmp_path)
    loaded = init_public.load_hf_bert(str(tmp_path))
    assert loaded.spec == models.spec
    ids, positions = _batch(SMALL)
    np.testing.assert_allclose(_dpbert_logits(loaded, ids, positions), _dpbert_logits(models, ids, positions),
                               atol=1e-5, rtol=0)


def test_lora_model_is_exported_merged(small, tmp_path):
    models = small
    adapted = bert_lib.add_lora(models, bert_lib.LoRASpec(rank=2, alpha=4.0), seed=3)
    rng = np.random.default_rng(5)
    for w in adapted.mlm.weights:
        if "lora_b" in w.name:
            w.assign(rng.normal(0, 0.3, w.shape).astype(np.float32))
    _assert_reference_matches(adapted, tmp_path)


def test_remote_path_through_gfile(small):
    """DIR may be any tf.io.gfile filesystem (``ram://`` here, ``gs://`` in production)."""
    models = small
    directory = "ram://hf_export_test/out"
    hf_layout.write_files(directory, hf_layout.hf_files(models, {"vocab.txt": b"[PAD]\n"}))
    loaded = init_public.load_hf_bert(directory)
    ids, positions = _batch(SMALL)
    np.testing.assert_allclose(_dpbert_logits(loaded, ids, positions), _dpbert_logits(models, ids, positions),
                               atol=1e-5, rtol=0)


def test_unprefixed_minilm_names_are_read(tmp_path):
    """A bare BertModel checkpoint (MiniLM's names, two token types, no head): the encoder is HF's."""
    t = write_checkpoint(tmp_path)
    models = init_public.load_hf_bert(str(tmp_path))
    config, tensors = read_hf(tmp_path)
    ids = np.array([[6, 20, 31, 40, 7, 0, 0, 0]], np.int32)
    ids = np.pad(ids, ((0, 0), (0, models.spec.max_seq_length - ids.shape[1])))
    ours = models.encoder(ids, training=False)["sequence_output"].numpy()
    theirs = hf_mlm_logits(config, tensors, ids, (ids != 0).astype(np.float64), head=False)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(models.mlm.get_layer("mlm_output").kernel.numpy(),
                                  t["embeddings.word_embeddings.weight"].T)


def test_a_head_without_decoder_weight_is_tied_as_hf_ties_it(small, tmp_path):
    from safetensors.numpy import save_file

    models = small
    config, _ = _export(models, tmp_path)
    tensors = hf_layout.to_hf_tensors(models)
    del tensors["cls.predictions.decoder.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = init_public.load_hf_bert(str(tmp_path))
    np.testing.assert_array_equal(loaded.mlm.get_layer("mlm_output").kernel.numpy(),
                                  tensors["bert.embeddings.word_embeddings.weight"].T)


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"hidden_size": 32}, "disagrees with the HF keys on hidden_size"),
])
def test_configs_dpbert_cannot_compute_are_refused(small, tmp_path, change, message):
    models = small
    config, _ = _export(models, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(hf_layout.LayoutError, match=message):
        init_public.load_hf_bert(str(tmp_path))


def test_a_missing_tensor_is_named(small, tmp_path):
    from safetensors.numpy import save_file

    models = small
    _export(models, tmp_path)
    tensors = hf_layout.to_hf_tensors(models)
    del tensors["bert.encoder.layer.1.output.LayerNorm.bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(hf_layout.LayoutError, match="encoder.layer.1.output.LayerNorm.bias"):
        init_public.load_hf_bert(str(tmp_path))


# ------------------------------------------------------------------ positive controls
@pytest.fixture
def swapped_head_axes(monkeypatch):
    """A deliberately broken layout (test fixture only): query/key/value flattened [head_size, heads]
    instead of [heads, head_size], in BOTH directions, so dpbert reads back what it wrote."""
    export, assign = hf_layout._export, hf_layout._assign

    def bad_export(kind, layer):
        weight, bias = export(kind, layer)
        if kind == "qkv":
            heads, d = layer.kernel.shape[1], layer.kernel.shape[2]
            weight = weight.reshape(heads, d, -1).transpose(1, 0, 2).reshape(heads * d, -1)
            bias = bias.reshape(heads, d).T.reshape(-1)
        return weight, bias

    def bad_assign(kind, layer, weight, bias):
        if kind == "qkv":
            heads, d = layer.kernel.shape[1], layer.kernel.shape[2]
            weight = weight.reshape(d, heads, -1).transpose(1, 0, 2).reshape(heads * d, -1)
            bias = np.reshape(bias, (d, heads)).T.reshape(-1)
        assign(kind, layer, weight, bias)

    monkeypatch.setattr(hf_layout, "_export", bad_export)
    monkeypatch.setattr(hf_layout, "_assign", bad_assign)


def test_positive_control_a_consistent_wrong_layout_passes_the_round_trip_but_not_the_reference(
        small, tmp_path, swapped_head_axes):
    models = small
    config, t = _export(models, tmp_path)
    ids, positions = _batch(SMALL)
    ours = _dpbert_logits(models, ids, positions)
    loaded = init_public.load_hf_bert(str(tmp_path))
    np.testing.assert_allclose(_dpbert_logits(loaded, ids, positions), ours, atol=1e-5, rtol=0)
    theirs = hf_mlm_logits(config, t, ids, (ids != 0).astype(np.float64))
    assert np.abs(np.take_along_axis(theirs, positions[..., None], 1) - ours).max() > 1e-2


def test_positive_control_the_tanh_gelu_is_told_apart(tmp_path):
    """The reference distinguishes HF's 'gelu' from 'gelu_new' at the tolerance used: the
    activation named in config.json is the one dpbert computes."""
    models = _randomise(bert_lib.build_bert(SMALL, seed=0), scale=0.6)
    config, t = _export(models, tmp_path)
    ids, positions = _batch(SMALL)
    ours = _dpbert_logits(models, ids, positions)
    tanh = hf_mlm_logits(config, t, ids, (ids != 0).astype(np.float64), activation=_gelu_tanh)
    assert np.abs(np.take_along_axis(tanh, positions[..., None], 1) - ours).max() > 1e-4


# ------------------------------------------------------------------------------ the model card
CARD_PRIVACY = {"epsilon": 2.34561, "delta": 1.0000001e-05, "epsilon_vocab": 0.4242, "delta_vocab": 1e-09,
                "epsilon_train": 2.1, "unit": "patient", "adjacency": "add_or_remove_one",
                "mechanisms": ["dp_histogram", "dp_count", "dp_sgd"]}


def _card_states(card: str, privacy: dict) -> bool:
    """The card's table states ε (rounded up), δ with ≥ 6 significant digits rounded up, the unit,
    the adjacency and the mechanisms."""
    return all(row in card for row in ("| ε (vocabulary + training, composed) | 2.346 |", "| δ | 1.00001e-05 |",
                                       f"| privacy unit | {privacy['unit']} |", f"| adjacency | {privacy['adjacency']} |",
                                       "| mechanisms | dp_histogram, dp_count, dp_sgd |", "0.4242 at δ = 1e-09"))


def test_the_model_card_states_the_privacy_fields_with_delta_rounded_up():
    spec = bert_lib.BertSpec(vocab_size=12, max_seq_length=16, max_predictions=3, preset="tiny",
                             **bert_lib.PRESETS["tiny"])
    card = hf_layout.model_card(spec, CARD_PRIVACY)
    assert card.startswith("---\n") and _card_states(card, CARD_PRIVACY) and hf_layout.PRIVACY_KEY in card
    # positive control: a card printing δ with 3 significant digits (1e-05, below the true δ) fails
    assert not _card_states(card.replace("1.00001e-05", f"{CARD_PRIVACY['delta']:.3g}"), CARD_PRIVACY)
    private = hf_layout.model_card(spec, None)
    assert "NOT differentially private" in private and "| δ |" not in private
