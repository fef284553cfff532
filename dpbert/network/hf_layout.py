"""dpbert's BERT in the Hugging Face ``BertForMaskedLM`` layout (``config.json`` + ``model.safetensors``).

One table (``_pairs``) names, for every dpbert layer, the HF tensor prefix and how its weights are
laid out; the writer (``to_hf_tensors``) and the readers (``assign_*``, used by
``dpbert.network.init_public``) both walk it, so the two directions cannot drift apart.

Orientation: PyTorch ``Linear.weight`` is ``[out, in]``; a Keras ``Dense`` kernel is ``[in, out]``
(transposed). ``MultiHeadAttention`` keeps query/key/value kernels as ``[H, heads, head]`` and the
output kernel as ``[heads, head, H]``; HF's hidden index is ``head · head_size + d`` (its
``transpose_for_scores`` view), which is the row-major flattening of those two axes.

Semantics kept exactly (what an HF reader computes with ``attention_mask = ids != pad``):

* activation: tf_keras' ``"gelu"`` is the exact erf form (``approximate=False``) = HF ``"gelu"``
  (``GELUActivation``); HF ``"gelu_new"`` / ``"gelu_pytorch_tanh"`` are the tanh approximation.
  The MLM head's transform uses the same activation (HF applies ``hidden_act`` there too).
* token types: dpbert has none, so the export has ``type_vocab_size: 1`` and a ZERO row (type 0
  adds nothing). A checkpoint with token types is read with its type-0 row folded into the position
  table (single-segment inputs always add type 0).
* padding: dpbert masks pad keys from ``input_ids`` itself; HF masks what ``attention_mask`` says
  (the tokenizer's padding sets it to 0 on pads). Keras adds −1e9 to masked scores, HF the float
  minimum: both give the pad keys weight 0.
* the output projection is untied (``tie_word_embeddings: false``; DP-SGD's ghost norms need it,
  see ``dpbert.network.bert``); ``cls.predictions.decoder.bias`` is written equal to
  ``cls.predictions.bias``, as HF ties those two.
* positions: the run's table has L = ``max_seq_length`` rows. A model that started from a PUBLIC
  checkpoint (``model.init: minilm``) is exported with the checkpoint's whole table
  (``public_positions``): rows < L the run's, rows ≥ L the checkpoint's with its type-0 row folded
  in (as ``assign_encoder`` folds the first L), so HF's fill-mask reads texts up to the checkpoint's
  length (``max_position_embeddings`` and ``model_max_length`` = its size; ``dpbert_trained_positions``
  = L). Without a public start: L. docs/without-labels.md says how to use either.

``config.json`` also carries the whole ``BertSpec`` under ``dpbert_spec`` (HF keeps unknown keys as
attributes), so a round trip rebuilds the same model (``max_predictions``, dropout, preset).

An export states its privacy twice, with the same values: the model card ``README.md``
(``model_card``) and ``config.json``'s ``dpbert_privacy`` — the release manifest's fields
(``dpbert.release.PRIVACY_FIELDS``: ε, δ, unit, adjacency, mechanisms), nothing that names the
data (no dataset id, no path, no count).
"""
from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from dpbert.network import bert as bert_lib

ARCHITECTURE = "BertForMaskedLM"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HIDDEN_ACT = "gelu"
#: config.json's key for the dpbert ``BertSpec`` (ignored by HF readers).
SPEC_KEY = "dpbert_spec"
#: config.json's key for L, the rows of the position table the run trained (rows ≥ L: the public checkpoint's).
TRAINED_POSITIONS_KEY = "dpbert_trained_positions"
#: config.json's key for the privacy fields (the model card's, the release manifest's).
PRIVACY_KEY = "dpbert_privacy"
CARD_FILE = "README.md"
#: HF's prefix of the encoder's tensors in a ``BertForMaskedLM`` checkpoint.
ENCODER_PREFIX = "bert."
HEAD_BIAS, DECODER_BIAS = "cls.predictions.bias", "cls.predictions.decoder.bias"
TOKEN_TYPE = "embeddings.token_type_embeddings.weight"
POSITIONS = "embeddings.position_embeddings.weight"
WORDS = "embeddings.word_embeddings.weight"
HEAD_PREFIXES = ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                 "cls.predictions.decoder")


class LayoutError(ValueError):
    """A checkpoint that is not a BERT in the HF layout dpbert can represent; names the file and key."""


def exported_spec(spec: bert_lib.BertSpec, positions: Optional[int] = None) -> bert_lib.BertSpec:
    """``spec`` with ``positions`` rows in its position table (None: its own ``max_seq_length``)."""
    import dataclasses

    return spec if positions is None else dataclasses.replace(spec, max_seq_length=int(positions))


def hf_config(spec: bert_lib.BertSpec, positions: Optional[int] = None) -> dict:
    """``config.json`` of ``BertForMaskedLM`` for ``spec`` with ``positions`` rows in the position
    table (None: ``spec.max_seq_length``; module docstring)."""
    trained, spec = spec.max_seq_length, exported_spec(spec, positions)
    return {
        "architectures": [ARCHITECTURE], "model_type": "bert",
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "intermediate_size": spec.intermediate_size, "hidden_act": HIDDEN_ACT,
        "layer_norm_eps": spec.layer_norm_epsilon, "max_position_embeddings": spec.max_seq_length,
        "type_vocab_size": 1, "tie_word_embeddings": False, "pad_token_id": spec.pad_id,
        "hidden_dropout_prob": spec.dropout, "attention_probs_dropout_prob": spec.attention_dropout,
        "initializer_range": spec.initializer_range, "position_embedding_type": "absolute",
        "torch_dtype": "float32", SPEC_KEY: spec.to_dict(), TRAINED_POSITIONS_KEY: trained,
    }


def spec_from_hf_config(config: dict, where: str = CONFIG_FILE) -> bert_lib.BertSpec:
    """The ``BertSpec`` of an HF BERT ``config.json``; ``LayoutError`` naming the key when dpbert
    cannot compute what HF would (another activation, relative positions)."""
    act = config.get("hidden_act", HIDDEN_ACT)
    if act != HIDDEN_ACT:
        raise LayoutError(f"{where}: hidden_act {act!r} is not supported (dpbert computes the erf 'gelu')")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise LayoutError(f"{where}: position_embedding_type {config['position_embedding_type']!r} "
                          "is not supported (absolute only)")
    try:
        sizes = dict(vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
                     num_layers=int(config["num_hidden_layers"]), num_heads=int(config["num_attention_heads"]),
                     intermediate_size=int(config["intermediate_size"]),
                     max_seq_length=int(config["max_position_embeddings"]),
                     layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
                     pad_id=int(config.get("pad_token_id") or 0))
    except KeyError as err:
        raise LayoutError(f"{where}: no {err.args[0]!r}") from None
    recorded = config.get(SPEC_KEY)
    if isinstance(recorded, dict):
        spec = bert_lib.BertSpec.from_dict(recorded)
        differ = [k for k, v in sizes.items() if getattr(spec, k) != v]
        if differ:
            raise LayoutError(f"{where}: {SPEC_KEY} disagrees with the HF keys on {', '.join(differ)}")
        return spec
    return bert_lib.BertSpec(max_predictions=bert_lib.max_predictions_for(sizes["max_seq_length"]),
                             dropout=float(config.get("hidden_dropout_prob", 0.1)),
                             attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
                             preset="hf", **sizes)


# ------------------------------------------------------------------------------ the name table
def _pairs(models, layers: Optional[int] = None) -> Iterator[Tuple[str, str, object]]:
    """(HF prefix without ``bert.``, kind, Keras layer or projection) for every weight of ``models``
    except the word embeddings' and the MLM head's (``_head_pairs``)."""
    get = models.mlm.get_layer
    yield "embeddings.position_embeddings", "embedding", get("position_embeddings")
    yield "embeddings.LayerNorm", "layer_norm", get("embeddings_layer_norm")
    for i in range(models.spec.num_layers if layers is None else layers):
        p, attention = f"encoder.layer.{i}.", get(f"layer_{i}_attention")
        for name in ("query", "key", "value"):
            yield p + f"attention.self.{name}", "qkv", getattr(attention, f"_{name}_dense")
        output = attention._output_dense  # pylint: disable=protected-access
        yield p + "attention.output.dense", "attention_output", output
        yield p + "attention.output.LayerNorm", "layer_norm", get(f"layer_{i}_attention_layer_norm")
        yield p + "intermediate.dense", "dense", get(f"layer_{i}_intermediate")
        yield p + "output.dense", "dense", get(f"layer_{i}_output")
        yield p + "output.LayerNorm", "layer_norm", get(f"layer_{i}_output_layer_norm")


def _head_pairs(models):
    get = models.mlm.get_layer
    transform, norm, decoder = HEAD_PREFIXES
    return ((transform, "dense", get("mlm_transform")), (norm, "layer_norm", get("mlm_layer_norm")),
            (decoder, "dense", get("mlm_output")))


def _export(kind: str, layer) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(weight in HF orientation, bias or None) of one layer."""
    if kind == "embedding":
        return layer.embeddings.numpy(), None
    if kind == "layer_norm":
        return layer.gamma.numpy(), layer.beta.numpy()
    kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
    if kind == "qkv":  # [H, heads, head] → [heads·head, H]
        return kernel.reshape(kernel.shape[0], -1).T, bias.reshape(-1)
    if kind == "attention_output":  # [heads, head, H] → [H, heads·head]
        return kernel.reshape(-1, kernel.shape[-1]).T, bias
    return kernel.T, bias


def _assign(kind: str, layer, weight: np.ndarray, bias: Optional[np.ndarray]):
    """The inverse of ``_export`` (shapes checked by Keras' ``assign``)."""
    if kind == "embedding":
        layer.embeddings.assign(weight)
        return
    if kind == "layer_norm":
        layer.gamma.assign(weight)
        layer.beta.assign(bias)
        return
    kernel_shape, bias_shape = layer.kernel.shape, layer.bias.shape
    layer.kernel.assign(weight.T.reshape(kernel_shape))
    layer.bias.assign(np.reshape(bias, bias_shape))


def public_positions(t: Dict[str, np.ndarray], where: str = WEIGHTS_FILE) -> np.ndarray:
    """A public checkpoint's position table as dpbert holds it: every row plus its token-type-0
    row (what ``assign_encoder`` loads into the first L rows); ``t`` has canonical names."""
    table = np.asarray(_tensor(t, POSITIONS, where), np.float32)
    return table + (np.asarray(t[TOKEN_TYPE][0], np.float32) if TOKEN_TYPE in t else 0.0)


def extend_positions(trained: np.ndarray, public: np.ndarray, where: str = "the public checkpoint") -> np.ndarray:
    """The exported position table: rows < L the run's ``trained`` ones, rows ≥ L ``public``'s
    (``public_positions``). ``LayoutError`` when the widths differ or ``public`` has fewer rows."""
    L = trained.shape[0]
    if public.ndim != 2 or public.shape[1] != trained.shape[1] or public.shape[0] < L:
        raise LayoutError(f"{where}: {POSITIONS} has shape {tuple(public.shape)}, the model's is "
                          f"{tuple(trained.shape)} (a public start has the same width and at least L rows)")
    return np.concatenate([trained, public[L:]]).astype(np.float32)


def to_hf_tensors(models, public_table: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """Every tensor of ``BertForMaskedLM`` (``bert.``-prefixed encoder, ``cls.predictions`` head)
    from a dpbert model (LoRA adapters merged first). ``public_table``: the public checkpoint's
    position table (``public_positions``), whose rows ≥ L extend the model's (``extend_positions``)."""
    models = bert_lib.merge_lora(models)
    H = models.spec.hidden_size
    t = {WORDS: models.mlm.get_layer("word_embeddings").embeddings.numpy(),
         TOKEN_TYPE: np.zeros((1, H), np.float32)}
    for prefix, kind, layer in _pairs(models):
        weight, bias = _export(kind, layer)
        t[prefix + ".weight"] = weight
        if bias is not None:
            t[prefix + ".bias"] = bias
    if public_table is not None:
        t[POSITIONS] = extend_positions(t[POSITIONS], public_table)
    out = {ENCODER_PREFIX + k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}
    for prefix, kind, layer in _head_pairs(models):
        weight, bias = _export(kind, layer)
        out[prefix + ".weight"] = np.ascontiguousarray(weight, dtype=np.float32)
        out[HEAD_BIAS if prefix.endswith("decoder") else prefix + ".bias"] = bias.astype(np.float32)
    out[DECODER_BIAS] = out[HEAD_BIAS].copy()
    return out


# ------------------------------------------------------------------------------ reading
def canonical_names(tensors: Dict[str, np.ndarray], where: str = WEIGHTS_FILE) -> Dict[str, np.ndarray]:
    """The tensors with the ``bert.`` prefix removed (a ``BertForMaskedLM`` / ``BertModel``
    checkpoint) and unprefixed names (a bare ``BertModel`` such as MiniLM) kept as they are."""
    out: Dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        key = name[len(ENCODER_PREFIX):] if name.startswith(ENCODER_PREFIX) else name
        if key in out:
            raise LayoutError(f"{where}: {key!r} appears both with and without the {ENCODER_PREFIX!r} prefix")
        out[key] = value
    if WORDS not in out:
        raise LayoutError(f"{where}: no {WORDS!r} (with or without {ENCODER_PREFIX!r}): not a BERT checkpoint")
    return out


def _tensor(t, name: str, where: str) -> np.ndarray:
    if name not in t:
        raise LayoutError(f"{where}: no tensor {name!r}")
    return t[name]


def assign_encoder(models, t: Dict[str, np.ndarray], where: str = WEIGHTS_FILE, layers: Optional[int] = None):
    """Load positions (token-type 0 folded in), the embedding LayerNorm and the first ``layers``
    encoder layers (default all of ``models``) from canonical HF names. Word embeddings: the caller's."""
    L = models.spec.max_seq_length
    for prefix, kind, layer in _pairs(models, layers):
        weight = _tensor(t, prefix + ".weight", where)
        bias = None if kind == "embedding" else _tensor(t, prefix + ".bias", where)
        if prefix == "embeddings.position_embeddings":
            if weight.shape[0] < L:
                raise LayoutError(f"{where}: {POSITIONS} has {weight.shape[0]} rows, the model needs {L}")
            weight = weight[:L] + (t[TOKEN_TYPE][0] if TOKEN_TYPE in t else 0.0)
        try:
            _assign(kind, layer, np.asarray(weight, np.float32), bias)
        except (ValueError, TypeError) as err:
            raise LayoutError(f"{where}: {prefix}: shape does not fit the model ({err})") from None


def has_head(t: Dict[str, np.ndarray]) -> bool:
    """Whether the checkpoint carries an MLM head (at least its transform)."""
    return HEAD_PREFIXES[0] + ".weight" in t


def assign_head(models, t: Dict[str, np.ndarray], where: str = WEIGHTS_FILE):
    """Load the MLM head; a checkpoint without ``cls.predictions.decoder.weight`` ties it to the
    word embeddings, as HF does (``tie_word_embeddings``)."""
    transform, norm, decoder = HEAD_PREFIXES
    weights = {transform: (_tensor(t, transform + ".weight", where), _tensor(t, transform + ".bias", where)),
               norm: (_tensor(t, norm + ".weight", where), _tensor(t, norm + ".bias", where)),
               decoder: (t.get(decoder + ".weight", t[WORDS]), _tensor(t, HEAD_BIAS, where))}
    for prefix, kind, layer in _head_pairs(models):
        weight, bias = weights[prefix]
        try:
            _assign(kind, layer, np.asarray(weight, np.float32), np.asarray(bias, np.float32))
        except (ValueError, TypeError) as err:
            raise LayoutError(f"{where}: {prefix}: shape does not fit the model ({err})") from None


# ------------------------------------------------------------------------------ files
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"


def tokenizer_configs(spec: bert_lib.BertSpec) -> Dict[str, dict]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` of a dpbert WordPiece vocabulary:
    BERT's uncased normalisation with accents stripped (``dpbert.data.words.NORMALIZER``);
    ``model_max_length``: the positions of ``spec`` (``exported_spec``: the exported table's)."""
    from dpbert.vocab import wordpiece

    specials = {"unk_token": wordpiece.UNK, "sep_token": wordpiece.SEP, "pad_token": wordpiece.PAD,
                "cls_token": wordpiece.CLS, "mask_token": wordpiece.MASK}
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "strip_accents": True,
              "tokenize_chinese_chars": True, "clean_up_tokenization_spaces": True,
              "model_max_length": spec.max_seq_length, **specials}
    return {TOKENIZER_CONFIG_FILE: config, SPECIAL_TOKENS_MAP_FILE: specials}


def _store(uri: str):
    from dpbert import storage

    return storage.storage_for(uri)


def read_bytes(path: str) -> bytes:
    return _store(path).read_bytes(path)


def write_bytes(path: str, data: bytes):
    # tf.io.gfile, not dpbert.storage: a local storage write keeps a generation lock file in the
    # folder, which a Hugging Face directory (uploaded as it is) must not carry.
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)


def read_hf_checkpoint(directory: str) -> Tuple[dict, Dict[str, np.ndarray]]:
    """(config dict, tensors with canonical names) of an HF BERT directory (local or ``gs://``)."""
    import json

    from safetensors.numpy import load

    from dpbert import storage

    config_path, weights_path = storage.join(directory, CONFIG_FILE), storage.join(directory, WEIGHTS_FILE)
    for path in (config_path, weights_path):
        if not _store(path).exists(path):
            raise FileNotFoundError(f"{path} does not exist (an HF BERT directory has {CONFIG_FILE} "
                                    f"and {WEIGHTS_FILE})")
    try:
        config = json.loads(read_bytes(config_path).decode("utf-8"))
    except ValueError as err:
        raise LayoutError(f"{config_path}: not JSON ({err})") from None
    try:
        tensors = load(read_bytes(weights_path))
    except Exception as err:  # safetensors' SafetensorError: header or data corrupt
        raise LayoutError(f"{weights_path}: not a safetensors file ({err})") from None
    return config, canonical_names(tensors, weights_path)


_CARD_HEAD = """---
library_name: transformers
pipeline_tag: fill-mask
tags:
- bert
- differential-privacy
- dpbert
---

"""


def positions_text(spec: bert_lib.BertSpec, positions: Optional[int] = None) -> str:
    """What the model card says about the position table (module docstring)."""
    L, P = spec.max_seq_length, positions or spec.max_seq_length
    if P == L:
        return (f"Positions: {L}, the run's max_seq_length; there is no public start to take more from (the model "
                f"was trained from a random start, or exported without the public rows). Text longer than {L} "
                f"tokens ([CLS] and [SEP] included) must be truncated; a [MASK] beyond them is lost.")
    return (f"Positions: {P}. Rows 0-{L - 1} were trained by this run (its max_seq_length is {L}); rows {L}-{P - 1} "
            f"are the public checkpoint's it started from, untouched by the training. Text beyond {L} tokens is "
            f"read with positions the DP training never adjusted; beyond {P} it must be truncated and a [MASK] "
            f"there is lost.")


_CARD_USE = """## Use

```python
from transformers import pipeline

fill = pipeline("fill-mask", model="PATH/TO/THIS/FOLDER", tokenizer_kwargs={{"truncation": True}})
fill("the patient was given [MASK] for the infection")
```

{positions} A CPU-only PyTorch is enough: `pip install torch --index-url https://download.pytorch.org/whl/cpu`
then `pip install transformers`.
"""


def model_card(spec: bert_lib.BertSpec, privacy: Optional[dict], positions: Optional[int] = None) -> str:
    """``README.md`` of an export: the architecture, how to use it (``positions_text``: the exported
    position table of ``positions`` rows, None = L) and ``privacy`` (the release manifest's fields)
    as a table — ε rounded up (``fmt_epsilon``), δ with ``fmt_delta`` (≥ 6 significant digits,
    rounded up). ``privacy`` None: the model is not shown DP (operator-only, never to be released)."""
    from dpbert.privacy.numbers import fmt_delta, fmt_epsilon

    shape = (f"{ARCHITECTURE}: {spec.num_layers} layers, hidden size {spec.hidden_size}, {spec.num_heads} heads, "
             f"a vocabulary of {spec.vocab_size} tokens, {positions or spec.max_seq_length} positions.")
    use = _CARD_USE.format(positions=positions_text(spec, positions))
    if privacy is None:
        return _CARD_HEAD + (f"# NOT differentially private: operator-only\n\n{shape}\n\nNothing shows that this "
                             "model or its vocabulary was trained with differential privacy. It was exported with "
                             f"--allow-private. Never release it.\n\n{use}")
    unit, adjacency = privacy["unit"], privacy["adjacency"]
    public = "" if (positions or spec.max_seq_length) == spec.max_seq_length else \
        " The position rows taken from the public checkpoint are public: they cost no ε."
    rows = [("ε (vocabulary + training, composed)", fmt_epsilon(privacy["epsilon"])),
            ("δ", fmt_delta(privacy["delta"])), ("privacy unit", unit), ("adjacency", adjacency),
            ("mechanisms", ", ".join(privacy["mechanisms"])),
            ("ε of the vocabulary", f"{fmt_epsilon(privacy['epsilon_vocab'])} at δ = {fmt_delta(privacy['delta_vocab'])}"),
            ("ε of the training", fmt_epsilon(privacy["epsilon_train"]))]
    table = "\n".join(["| | |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows])
    return _CARD_HEAD + (
        f"# BERT pre-trained with differential privacy (dpbert)\n\n{shape}\n\n## Privacy\n\n{table}\n\n"
        f"The weights and the vocabulary (vocab.txt, tokenizer.json) together are (ε, δ)-differentially private "
        f"with respect to one {unit} ({adjacency}), as stated above (ε and δ rounded up). The same values, "
        f"exact, are in config.json under {PRIVACY_KEY}.{public}\n\n{use}")


def hf_files(models, tokenizer_files: Dict[str, bytes], extra_config: Optional[dict] = None,
             card: Optional[str] = None, public_table: Optional[np.ndarray] = None) -> Dict[str, bytes]:
    """Every file of the HF directory, by name: ``config.json``, ``model.safetensors``, the
    tokenizer files given (``vocab.txt``, ``tokenizer.json``), the tokenizer configs and the model
    card ``card`` (``README.md``) when given. ``public_table``: the public checkpoint's position
    table (``public_positions``): the export has its rows (module docstring)."""
    import json

    from safetensors.numpy import save

    dump = lambda obj: (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")  # noqa: E731
    tensors = to_hf_tensors(models, public_table)
    positions = int(tensors[ENCODER_PREFIX + POSITIONS].shape[0])
    config = {**hf_config(models.spec, positions), **(extra_config or {})}
    files = {CONFIG_FILE: dump(config), WEIGHTS_FILE: save(tensors, metadata={"format": "pt"})}
    files.update(tokenizer_files)
    files.update({name: dump(obj) for name, obj in tokenizer_configs(exported_spec(models.spec, positions)).items()})
    if card is not None:
        files[CARD_FILE] = card.encode("utf-8")
    return files


def write_files(directory: str, files: Dict[str, bytes]):
    """Write ``files`` under ``directory`` (created; local, ``gs://`` or any tf.io.gfile scheme)."""
    import tensorflow as tf

    from dpbert import storage

    tf.io.gfile.makedirs(directory)
    for name, data in files.items():
        write_bytes(storage.join(directory, name), data)


def load_dpbert(model_dir: str):
    """``dpbert.network.bert.load_bert`` for a local or remote folder: ``model_config.json`` through
    ``dpbert.storage``, the weights through TensorFlow's checkpoint reader (gfile: ``gs://``)."""
    import json

    from dpbert import storage

    spec_path = storage.join(model_dir, bert_lib.MODEL_CONFIG_FILE)
    spec = bert_lib.BertSpec.from_dict(json.loads(read_bytes(spec_path).decode("utf-8")))
    models = bert_lib.build_bert(spec)
    models.mlm.load_weights(storage.join(model_dir, bert_lib.WEIGHTS_PREFIX)).expect_partial()
    return models
