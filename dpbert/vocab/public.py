"""Vocabulary sources: ``vocab.source: dp | public | public+dp``.

* ``dp`` (default, the paper): WordPiece learnt from the DP noisy word histogram alone
  (``dpbert.vocab.wordpiece.train_wordpiece``).
* ``public``: the PUBLIC checkpoint's WordPiece vocabulary (``vocab.txt`` of ``model.init_dir``
  / ``$DPBERT_MINILM_DIR`` / the installed all-MiniLM-L6-v2, 30,522 tokens). The private tuples
  are never read: no ε for the vocabulary (the artifact carries a ``mechanism: public`` record,
  which the ledger composes as nothing, ``dpbert.accounting.accountant``).
* ``public+dp``: the public vocabulary UNCHANGED (same tokens, same ids) followed by the
  DP-released words (the noisy, thresholded histogram the vocabulary stage releases anyway) that
  the public tokenizer splits into >= 2 pieces, highest noisy count first (ties by the word), at
  most ``vocab.max_new_tokens`` (default 2000). A word that is already one public token, a word
  the public tokenizer maps to [UNK], and any word not in the released histogram are never
  appended. Choosing by the noisy counts is post-processing of the DP histogram, so ε_V (the
  same mechanism as ``dp``) covers the appended words and the public part costs nothing.
  An appended word is a word-initial token; WordPiece's longest-match-first then encodes the word
  as that one token (and longer words starting with it as it plus ``##`` pieces).
  ``dpbert.network.init_public`` starts each new embedding / MLM-output row from the MEAN of the
  public rows of its public pieces.

Special tokens. Every dpbert vocabulary has [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4 (masking,
canaries, NER and the white-box audit rely on it); BERT checkpoints have [UNK] [CLS] [SEP]
[MASK] at 100..103 and [unused0..3] at 1..4. The public part therefore swaps each special token
with the token at its dpbert id (MiniLM: 1↔100, 2↔101, 3↔102, 4↔103): those 8 ids are the only
ones that differ from the checkpoint's ``vocab.txt``; every other public token keeps its id, and
``init_public`` copies rows by token string, so every public token keeps its public embedding.

Provenance (released with the vocabulary, ``token_sources.json``, and as properties): the
source, the public checkpoint's ``vocab.txt`` sha256, ``public_tokens`` (ids 0 … P−1),
``dp_tokens`` (ids P … P+K−1: appended DP words, K a function of the DP histogram only) and the
special-token swaps. No exact count appears: K is DP post-processing.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from tokenizers import Tokenizer

from dpbert.vocab import wordpiece

SOURCES = ("dp", "public", "public+dp")
#: ``token_sources.json``'s ``"schema"``.
SCHEMA = "dpbert.vocab.sources/1"
#: The ``mechanism`` of the vocabulary record when no private data was read (``vocab.source:
#: public``; ``dpbert.accounting.accountant.PUBLIC_VOCAB_MECHANISM``).
PUBLIC_MECHANISM = "public"


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def public_vocab_path(directory=None) -> Path:
    """``vocab.txt`` of the public checkpoint (``dpbert.resources.checkpoint.checkpoint_dir``)."""
    from dpbert.resources.checkpoint import checkpoint_dir

    return checkpoint_dir(directory) / wordpiece.VOCAB_FILE


def public_tokens(tokens: Sequence[str]) -> Tuple[List[str], List[Tuple[int, int]]]:
    """(the public tokens with the special tokens moved to ids 0..4, the swaps ``[(dpbert id,
    checkpoint id)]``). Raises if a special token is missing or a token repeats."""
    tokens = list(tokens)
    if len(set(tokens)) != len(tokens):
        raise ValueError("the public vocabulary has a token more than once")
    index = {t: i for i, t in enumerate(tokens)}
    swaps = []
    for want, token in enumerate(wordpiece.SPECIAL_TOKENS):
        if token not in index:
            raise ValueError(f"the public vocabulary has no {token} token")
        have = index[token]
        if have != want:
            other = tokens[want]
            tokens[want], tokens[have] = token, other
            index[token], index[other] = want, have
            swaps.append((want, have))
    return tokens, swaps


def tokenizer_from_tokens(tokens: Sequence[str]) -> Tokenizer:
    """A dpbert WordPiece tokenizer (BERT normalizer, pre-tokenizer, post-processor) over ``tokens``
    in id order."""
    tokenizer = wordpiece._new_tokenizer({t: i for i, t in enumerate(tokens)})  # pylint: disable=protected-access
    tokenizer.add_special_tokens(list(wordpiece.SPECIAL_TOKENS))  # already in the vocabulary: ids kept
    tokenizer = wordpiece._install_post_processor(tokenizer)  # pylint: disable=protected-access
    wordpiece._check_specials(tokenizer)  # pylint: disable=protected-access
    return tokenizer


def word_pieces(tokenizer: Tokenizer, words: Sequence[str]) -> List[List[str]]:
    """The WordPiece pieces (strings) of each pre-split word, no special tokens."""
    if not words:
        return []
    encodings = tokenizer.encode_batch([[w] for w in words], is_pretokenized=True, add_special_tokens=False)
    return [list(e.tokens) for e in encodings]


def select_new_words(histogram: Iterable[Tuple[str, float]], public_tokenizer: Tokenizer,
                     max_new_tokens: int) -> List[str]:
    """The DP-released words to append: only words of ``histogram`` (the released noisy one), each
    split by ``public_tokenizer`` into >= 2 pieces none of which is [UNK], by decreasing noisy
    count then word, at most ``max_new_tokens``."""
    pairs = sorted(((str(w), float(c)) for w, c in histogram), key=lambda p: (-p[1], p[0]))
    vocab = public_tokenizer.get_vocab()
    candidates = [w for w, _ in pairs if w not in vocab]
    chosen: List[str] = []
    for word, pieces in zip(candidates, word_pieces(public_tokenizer, candidates)):
        if len(chosen) >= max_new_tokens:
            break
        if len(pieces) >= 2 and wordpiece.UNK not in pieces:
            chosen.append(word)
    return chosen


def build_vocabulary(source: str, checkpoint_dir=None, histogram: Optional[Iterable[Tuple[str, float]]] = None,
                     max_new_tokens: int = 2000) -> Tuple[Tokenizer, Dict]:
    """(tokenizer, token sources record) for ``source`` public or public+dp (``histogram``: the
    released DP histogram, required for public+dp)."""
    if source not in ("public", "public+dp"):
        raise ValueError(f"source must be public or public+dp here, got {source!r}")
    path = public_vocab_path(checkpoint_dir)
    tokens, swaps = public_tokens(wordpiece.read_vocab_txt(path))
    new_words: List[str] = []
    if source == "public+dp":
        if histogram is None:
            raise ValueError("vocab.source = public+dp needs the DP histogram")
        new_words = select_new_words(histogram, tokenizer_from_tokens(tokens), max_new_tokens)
    tokenizer = tokenizer_from_tokens(tokens + new_words)
    record = {
        "schema": SCHEMA, "source": source,
        "public_checkpoint_vocab_sha256": file_sha256(path),
        "public_tokens": len(tokens), "dp_tokens": len(new_words),
        "ranges": {"public": [0, len(tokens)], "dp": [len(tokens), len(tokens) + len(new_words)]},
        "special_swaps": [list(s) for s in swaps],
        "max_new_tokens": max_new_tokens if source == "public+dp" else None,
    }
    return tokenizer, record


def write_token_sources(record: Dict, vocabulary_dir) -> str:
    from dpbert import schema

    from dpbert import storage

    path = storage.join(str(vocabulary_dir), schema.TOKEN_SOURCES_FILE)
    storage.write_text(path, json.dumps(record, indent=2, sort_keys=True))
    return path


def read_token_sources(vocabulary_dir) -> Optional[Dict]:
    """The record of a public / public+dp vocabulary (or a model's tokenizer directory); None for dp."""
    from dpbert import schema

    from dpbert import storage

    return storage.read_json(storage.join(str(vocabulary_dir), schema.TOKEN_SOURCES_FILE), default=None)


def public_vocab_event(source: str, checkpoint_sha256: str) -> Dict:
    """The vocabulary's ledger record when no private data was read: ``mechanism: public``
    (``dpbert.accounting.accountant.ledger`` composes it as no event)."""
    from dpbert.accounting.accountant import public_vocab_record

    return public_vocab_record(source, checkpoint_sha256)


__all__ = ["SOURCES", "PUBLIC_MECHANISM", "public_tokens", "tokenizer_from_tokens", "word_pieces",
           "select_new_words", "build_vocabulary", "write_token_sources", "read_token_sources",
           "public_vocab_event", "public_vocab_path", "file_sha256"]
