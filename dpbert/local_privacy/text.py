"""Text-to-text dχ-privatization: text → WordPiece tokens → privatized tokens → text or words.

Each token of the input's WordPiece tokenization (public vocabulary, see ``embeddings``) is
replaced by ``DchiMechanism.privatize_ids`` independently; the output is decoded with the
WordPiece rule (a ``##`` piece continues the previous word, any other token starts a new one;
a leading ``##`` piece is stripped). With η = ∞ the output is exactly
``tokenizer.decode(tokenizer.encode(text).ids)``: the input's normalized (lower-cased, accents
stripped) tokenization, decoded — provided it has no ``[UNK]`` (a special token is never output:
an ``[UNK]`` input goes, like any token, to its nearest candidate).

Everything is vectorized over whole corpora: ``privatize_texts`` encodes a batch, privatizes
all its tokens in one call (fresh noise per token occurrence) and decodes.
"""
from __future__ import annotations

import math
import os
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from tokenizers import Tokenizer

from dpbert.data.words import split_words
from dpbert.local_privacy.dchi import DchiMechanism, SeedLike, check_eta, make_rng
from dpbert.local_privacy.embeddings import CONTINUING_PREFIX, TokenEmbeddings, load_embeddings

EmbeddingsLike = Union[TokenEmbeddings, DchiMechanism, np.ndarray]


def _mechanism(embeddings: EmbeddingsLike, tokenizer: Tokenizer) -> DchiMechanism:
    if isinstance(embeddings, DchiMechanism):
        return embeddings
    if isinstance(embeddings, TokenEmbeddings):
        return embeddings.mechanism()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    from dpbert.local_privacy.dchi import special_ids_of

    return DchiMechanism(np.asarray(embeddings), exclude_ids=special_ids_of(tokens).tolist())


def _plain(tokenizer: Tokenizer) -> Tokenizer:
    """A copy without truncation, padding or post-processor (ids of the text's tokens only)."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def decode_tokens(tokens: Sequence[str], tokenizer: Tokenizer) -> str:
    """The WordPiece decoding of token strings (a leading ``##`` piece loses its prefix)."""
    tokens = list(tokens)
    if not tokens:
        return ""
    if tokens[0].startswith(CONTINUING_PREFIX) and len(tokens[0]) > len(CONTINUING_PREFIX):
        tokens[0] = tokens[0][len(CONTINUING_PREFIX):]
    if tokenizer.decoder is None:
        return " ".join(tokens)
    return tokenizer.decoder.decode(tokens)


def tokens_to_words(tokens: Sequence[str]) -> List[str]:
    """Words from WordPiece tokens: ``##`` pieces join the previous word; the result is re-split
    with ``dpbert.data.words.split_words`` so every word is a unit the pipeline's tokenizers see."""
    pieces: List[str] = []
    for token in tokens:
        if token.startswith(CONTINUING_PREFIX) and len(token) > len(CONTINUING_PREFIX):
            stem = token[len(CONTINUING_PREFIX):]
            if pieces:
                pieces[-1] += stem
            else:
                pieces.append(stem)
        else:
            pieces.append(token)
    return [word for piece in pieces for word in split_words(piece)]


def privatize_ids_batch(id_lists: Sequence[Sequence[int]], mechanism: DchiMechanism, eta: float,
                        rng: Union[np.random.Generator, Sequence[np.random.Generator]]) -> List[np.ndarray]:
    """Privatize several id sequences in one vectorized call; same lengths out.

    ``rng``: one Generator for all (fresh noise for every token), or one Generator PER sequence
    (noise keyed per unit: a sequence's output then depends on its own Generator only, not on
    where it sits in the batch or on the other sequences)."""
    if not isinstance(rng, np.random.Generator):
        rngs = list(rng)
        if len(rngs) != len(id_lists):
            raise ValueError(f"one Generator per sequence: got {len(rngs)} for {len(id_lists)} sequences")
        return [mechanism.privatize_ids(np.asarray(ids, dtype=np.int64), eta, r) for ids, r in zip(id_lists, rngs)]
    lengths = [len(ids) for ids in id_lists]
    flat = np.fromiter((i for ids in id_lists for i in ids), dtype=np.int64, count=sum(lengths))
    out = mechanism.privatize_ids(flat, eta, rng)
    return np.split(out, np.cumsum(lengths)[:-1]) if lengths else []


def privatize_texts(texts: Sequence[str], tokenizer: Tokenizer, embeddings: EmbeddingsLike, eta: float,
                    rng: SeedLike = None) -> List[str]:
    """Privatize every text (fresh noise for every token occurrence); returns decoded texts."""
    eta = check_eta(eta)
    rng = make_rng(rng)
    mechanism = _mechanism(embeddings, tokenizer)
    encoder = _plain(tokenizer)
    encodings = encoder.encode_batch(list(texts), add_special_tokens=False)
    privatized = privatize_ids_batch([e.ids for e in encodings], mechanism, eta, rng)
    return [decode_tokens([encoder.id_to_token(int(i)) for i in ids], encoder) for ids in privatized]


def privatize_text(text: str, tokenizer: Tokenizer, embeddings: EmbeddingsLike, eta: float,
                   rng: SeedLike = None) -> str:
    """Privatize one text: WordPiece tokens → dχ-privatized tokens → decoded text.

    ``embeddings``: a ``TokenEmbeddings``, a ``DchiMechanism`` or a ``[V, d]`` table aligned with
    the tokenizer's ids (special tokens then found by name). ``rng``: a numpy Generator, a seed
    (tests) or None (OS entropy).
    """
    return privatize_texts([text], tokenizer, embeddings, eta, rng)[0]


def privatize_word_lists(word_lists: Sequence[Sequence[str]], tokenizer: Tokenizer, embeddings: EmbeddingsLike,
                         eta: float, rng: SeedLike = None,
                         max_words: Optional[int] = None) -> Tuple[List[List[str]], int]:
    """Privatize pre-split words (e.g. the tuples of ``dpbert.data.tuples``).

    ``rng``: a Generator, a seed (tests) or None (OS entropy) for all lists, or one Generator per
    list (noise keyed per unit, ``privatize_ids_batch``).
    Returns the privatized word lists and how many of them were cut to ``max_words`` (a
    privatized list can have more words than its input: a ``##`` piece replaced by a word-initial
    token starts a new word). The cut keeps a privacy unit at most N words long, which the DP
    vocabulary's sensitivity relies on.
    """
    eta = check_eta(eta)
    rng = make_rng(rng) if rng is None or isinstance(rng, (int, np.integer, np.random.Generator)) else list(rng)
    mechanism = _mechanism(embeddings, tokenizer)
    encoder = _plain(tokenizer)
    encodings = encoder.encode_batch([list(words) for words in word_lists], is_pretokenized=True,
                                     add_special_tokens=False)
    privatized = privatize_ids_batch([e.ids for e in encodings], mechanism, eta, rng)
    out, cut = [], 0
    for ids in privatized:
        words = tokens_to_words([encoder.id_to_token(int(i)) for i in ids])
        if max_words is not None and len(words) > max_words:
            words = words[:max_words]
            cut += 1
        out.append(words)
    return out, cut


def _lines(path, chunk: int) -> Iterator[List[str]]:
    batch: List[str] = []
    with open(path, encoding="utf-8", errors="replace", newline=None) as handle:
        for line in handle:
            batch.append(line.rstrip("\n"))
            if len(batch) >= chunk:
                yield batch
                batch = []
    if batch:
        yield batch


def privatize_file(input_path, output_path, eta: float, model_dir=None, seed: Optional[int] = None,
                   embeddings: Optional[TokenEmbeddings] = None, batch_lines: int = 512) -> dict:
    """Privatize a UTF-8 text file line by line (each line independently; empty lines stay empty).

    The table is ``embeddings`` if given, else ``load_embeddings(model_dir)`` (a public checkpoint
    by default). ``seed`` fixes the noise (tests only; None = OS entropy). Returns a summary
    (lines, tokens, tokens changed, the table's description); no text is logged.
    """
    eta = check_eta(eta)
    rng = make_rng(seed)
    if not os.path.isfile(input_path):
        raise FileNotFoundError(f"input file {input_path} does not exist")
    if embeddings is None:
        embeddings = load_embeddings(model_dir)
    mechanism = embeddings.mechanism()
    tokenizer = _plain(embeddings.tokenizer)
    lines = tokens = changed = 0
    tmp = f"{output_path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as out:
            for batch in _lines(input_path, batch_lines):
                encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
                originals = [np.asarray(e.ids, np.int64) for e in encodings]
                privatized = privatize_ids_batch(originals, mechanism, eta, rng)
                for before, after in zip(originals, privatized):
                    out.write(decode_tokens([tokenizer.id_to_token(int(i)) for i in after], tokenizer) + "\n")
                    tokens += int(before.size)
                    changed += int(np.sum(before != after))
                lines += len(batch)
        os.replace(tmp, output_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return {"lines": lines, "tokens": tokens, "tokens_changed": changed,
            "fraction_changed": changed / tokens if tokens else 0.0,
            "eta": "inf" if math.isinf(eta) else eta, "seeded": seed is not None,
            "embeddings": embeddings.describe()}


__all__ = ["privatize_text", "privatize_texts", "privatize_word_lists", "privatize_file", "decode_tokens",
           "tokens_to_words", "privatize_ids_batch"]
