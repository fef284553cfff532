"""A BERT WordPiece vocabulary learned from a word histogram alone (never from raw text).

The histogram is the DP one (``dpbert.vocab.beam_histogram``: noisy counts of the released words) or,
for the non-private BERT-M baseline only, the exact one. The tokenizer uses the same
``BertNormalizer`` / ``BertPreTokenizer`` as ``dpbert.data.words`` (the histogram's words are
exactly the units the tokenizer splits into pieces), BERT's special tokens with BERT's
``vocab.txt`` order ([PAD]=0, [UNK], [CLS], [SEP], [MASK]), the ``##`` continuing prefix, the
WordPiece decoder and BERT's ``[CLS] … [SEP]`` post-processor.

Training from counts. HF tokenizers (0.23) has no API that takes ``(word, count)`` pairs, so the
trainer is fed each word repeated ``round(count × s)`` times (strings of up to
``_REPEAT_CHUNK`` copies, ``"w w w …"``: the pre-tokenizer splits and counts each copy). That is
linear in the total count (timings below), so at MIMIC scale
(≈ 400M tuple-word pairs) the scale factor ``s`` matters. Scaling every count by the same ``s``
leaves the order of the trainer's pair counts unchanged up to rounding; the rounding error of a
word is at most 0.5 / (s · count) relative. The automatic choice (``count_scale=None``):

    s = min(1, MIN_SCALED_COUNT / smallest_count)        (MIN_SCALED_COUNT = 50)

i.e. shrink until the smallest count is 50 copies (≤ 1 % rounding error for every word), never
enlarge. The cost is then ≈ 50 · total / smallest copies. A DP histogram's counts are all ≥ the
threshold (≈ 1369 for σ = 200), so it shrinks by ≈ 27× (MIMIC-scale: ≈ 400M → ≈ 15M copies);
an exact histogram (smallest count 1) is never scaled, its cost stays linear in its total.
Why 50: at the automatic scale a word's rounding error has standard deviation ≈ 0.29 / s =
0.29 · smallest / 50 ≈ 0.04 σ for a DP histogram (smallest ≈ 7σ), which adds ≈ 0.1 % to the
noise the mechanism already put on every count. Measured with ``benchmarks/vocab_bench.py``
(10M words of the synthetic clinical corpus, the σ = 10 histogram: 2602 words, 5.7M copies
unscaled, target 30000 → 4919 tokens): two unscaled runs share 99.88 % of their tokens (the
trainer breaks ties arbitrarily); scaled so that the smallest count is 50 / 6 / 3 / 1 copies, a
run shares 99.76 / 99.65 / 99.33 / 96.96 % with an unscaled one (94.5 % at 1 copy on a 1M-word
corpus). Training time is linear in the copies fed (≈ 0.5-1.2 µs each here, depending on load).
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from tokenizers import Tokenizer, decoders, models, processors, trainers

from dpbert.data.words import NORMALIZER, PRE_TOKENIZER

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
#: BERT's special tokens, in vocab.txt order (ids 0..4).
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)


class SpecialIds(NamedTuple):
    """The ids of ``SPECIAL_TOKENS`` in one vocabulary; as a tuple, the special ids in
    ``SPECIAL_TOKENS`` order (what masking excludes), with ``.mask`` the ``[MASK]`` id."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def by_token(self) -> dict:
        """``{"[PAD]": id, ..., "[MASK]": id}``."""
        return dict(zip(SPECIAL_TOKENS, self))


def special_ids(vocab: Union[Tokenizer, Mapping[str, int], Sequence[str], None] = None) -> SpecialIds:
    """The special token ids of a vocabulary: a ``Tokenizer`` (or anything with ``token_to_id``),
    a ``token → id`` mapping, or the tokens in id order (``vocab.txt``). None: a vocabulary of
    this module (``train_wordpiece`` / ``load_tokenizer`` / ``save_vocabulary`` check that the
    special tokens hold ids 0..4). A missing special token is an error."""
    if vocab is None:
        return SpecialIds(*range(len(SPECIAL_TOKENS)))
    if hasattr(vocab, "token_to_id"):
        lookup = vocab.token_to_id
    elif isinstance(vocab, Mapping):
        lookup = vocab.get
    else:
        index: dict = {}
        for i, token in enumerate(vocab):
            index.setdefault(token, i)
        lookup = index.get
    ids = [lookup(token) for token in SPECIAL_TOKENS]
    missing = [token for token, i in zip(SPECIAL_TOKENS, ids) if i is None]
    if missing:
        raise ValueError(f"vocabulary has no {', '.join(missing)} token")
    return SpecialIds(*(int(i) for i in ids))


#: The special ids of every dpbert vocabulary, and each by name.
SPECIAL_IDS = special_ids()
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = SPECIAL_IDS
CONTINUING_PREFIX = "##"
MIN_VOCAB_SIZE = 10
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"

#: Automatic scaling never maps the smallest count below this.
MIN_SCALED_COUNT = 50
_REPEAT_CHUNK = 1024


# ----------------------------------------------------------------------------- helpers

def _new_tokenizer(vocab=None) -> Tokenizer:
    model = models.WordPiece(vocab, unk_token=UNK, continuing_subword_prefix=CONTINUING_PREFIX) \
        if vocab is not None else models.WordPiece(unk_token=UNK, continuing_subword_prefix=CONTINUING_PREFIX)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = NORMALIZER
    tokenizer.pre_tokenizer = PRE_TOKENIZER
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUING_PREFIX)
    return tokenizer


def _install_post_processor(tokenizer: Tokenizer) -> Tokenizer:
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    tokenizer.post_processor = processors.BertProcessing((SEP, sep_id), (CLS, cls_id))
    return tokenizer


def _check_histogram(histogram) -> Tuple[List[str], np.ndarray]:
    words: List[str] = []
    counts: List[float] = []
    for i, pair in enumerate(histogram):
        try:
            word, count = pair
        except (TypeError, ValueError):
            raise ValueError(f"histogram entry {i} must be a (word, count) pair") from None
        if not isinstance(word, str) or not word:
            raise ValueError(f"histogram entry {i}: word must be a non-empty string")
        if isinstance(count, bool) or not isinstance(count, numbers.Real) or not math.isfinite(count) \
                or count <= 0:
            raise ValueError(f"histogram entry {i}: count must be a finite number > 0, got {count!r}")
        words.append(word)
        counts.append(float(count))
    if not words:
        raise ValueError("histogram is empty: no word to learn a vocabulary from (did any word pass "
                         "the DP threshold? try a smaller vocab.sigma or a larger corpus)")
    if len(set(words)) != len(words):
        raise ValueError("histogram has a word more than once (each word must appear once)")
    return words, np.asarray(counts, dtype=np.float64)


def choose_count_scale(counts: np.ndarray) -> float:
    """The automatic scale factor: ``min(1, MIN_SCALED_COUNT / smallest count)``."""
    return float(min(1.0, MIN_SCALED_COUNT / float(np.min(counts))))


def scaled_counts(counts: np.ndarray, scale: float) -> np.ndarray:
    """``round(count × scale)``, floored at 1 (every histogram word stays in the training)."""
    return np.maximum(1, np.rint(np.asarray(counts, dtype=np.float64) * scale)).astype(np.int64)


def _repeated(words: Sequence[str], counts: np.ndarray) -> Iterator[str]:
    for word, count in zip(words, counts.tolist()):
        while count > 0:
            copies = min(count, _REPEAT_CHUNK)
            yield word if copies == 1 else " ".join([word] * copies)
            count -= copies


def _trainer(vocab_size: int, min_frequency: int, limit_alphabet: Optional[int]):
    kwargs = dict(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                  special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix=CONTINUING_PREFIX)
    if limit_alphabet is not None:
        kwargs["limit_alphabet"] = limit_alphabet
    return trainers.WordPieceTrainer(**kwargs)


# ----------------------------------------------------------------------------- training

def train_wordpiece(histogram: Iterable[Tuple[str, float]], vocab_size: int = 30000,
                    count_scale: Optional[float] = None, min_frequency: float = 1) -> Tokenizer:
    """Learn a BERT WordPiece tokenizer from ``(word, count)`` pairs only.

    Args:
      histogram: ``(word, count)`` pairs, each word once, counts > 0 (noisy floats are fine).
      vocab_size: target size, special tokens included; the result has at most this many tokens
        (fewer when the histogram has too few words to merge). If the characters alone would not
        fit, only the most frequent ``(vocab_size − 5) // 2`` characters are kept (others → [UNK]).
      count_scale: counts are multiplied by this, rounded and floored at 1 before training;
        None chooses it automatically (``choose_count_scale``).
      min_frequency: the trainer's minimum pair count for a merge, in histogram (unscaled) units.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be an integer >= {MIN_VOCAB_SIZE} (the {len(SPECIAL_TOKENS)} "
                         f"special tokens plus room for characters), got {vocab_size!r}")
    if count_scale is not None and (isinstance(count_scale, bool) or not isinstance(count_scale, numbers.Real)
                                    or not math.isfinite(count_scale) or count_scale <= 0):
        raise ValueError(f"count_scale must be a finite number > 0 (or None), got {count_scale!r}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, numbers.Real) \
            or not math.isfinite(min_frequency) or min_frequency < 0:
        raise ValueError(f"min_frequency must be a finite number >= 0, got {min_frequency!r}")
    words, counts = _check_histogram(histogram)
    scale = choose_count_scale(counts) if count_scale is None else float(count_scale)
    fed = scaled_counts(counts, scale)
    trainer_min_frequency = max(1, int(round(min_frequency * scale)))

    tokenizer = _new_tokenizer()
    tokenizer.train_from_iterator(_repeated(words, fed), _trainer(int(vocab_size), trainer_min_frequency, None))
    if tokenizer.get_vocab_size() > vocab_size:
        # The alphabet (and its ## forms) alone exceeds the target: keep the frequent characters.
        limit = (int(vocab_size) - len(SPECIAL_TOKENS)) // 2
        tokenizer = _new_tokenizer()
        tokenizer.train_from_iterator(_repeated(words, fed),
                                      _trainer(int(vocab_size), trainer_min_frequency, limit))
    _check_specials(tokenizer)
    if tokenizer.get_vocab_size() > vocab_size:  # pragma: no cover - guarded by limit_alphabet
        raise RuntimeError(f"WordPiece training produced {tokenizer.get_vocab_size()} tokens for "
                           f"vocab_size={vocab_size}")
    return _install_post_processor(tokenizer)


def _check_specials(tokenizer: Tokenizer):
    for token, expected_id in SPECIAL_IDS.by_token().items():
        if tokenizer.token_to_id(token) != expected_id:
            raise ValueError(f"tokenizer: special token {token} must have id {expected_id}, "
                             f"has {tokenizer.token_to_id(token)}")


# ----------------------------------------------------------------------------- files

def _vocab_in_id_order(tokenizer: Tokenizer) -> List[str]:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    ordered = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise ValueError("tokenizer ids are not contiguous from 0; cannot write a BERT vocab.txt")
    tokens = [token for token, _ in ordered]
    for token in tokens:
        if not token or any(ch in token for ch in "\n\r"):
            raise ValueError("a token is empty or holds a line break; cannot write a BERT vocab.txt")
    return tokens


def save_vocabulary(tokenizer: Tokenizer, out_dir) -> Tuple[str, str]:
    """Write BERT's ``vocab.txt`` (one token per line, id order) and ``tokenizer.json`` (any
    ``dpbert.storage`` URI)."""
    from dpbert import storage

    _check_specials(tokenizer)
    tokens = _vocab_in_id_order(tokenizer)
    vocab_path, tokenizer_path = storage.join(str(out_dir), VOCAB_FILE), storage.join(str(out_dir), TOKENIZER_FILE)
    storage.write_text(vocab_path, "".join(token + "\n" for token in tokens))
    storage.write_text(tokenizer_path, tokenizer.to_str(pretty=True))  # what Tokenizer.save writes
    return vocab_path, tokenizer_path


def read_vocab_txt(path) -> List[str]:
    from dpbert import storage

    return [line for line in storage.read_text(str(path)).split("\n") if line]


def load_tokenizer(directory) -> Tokenizer:
    """Load what ``save_vocabulary`` wrote: ``tokenizer.json``, or ``vocab.txt`` alone (a BERT
    checkpoint's vocabulary) rebuilt with the same normalizer, pre-tokenizer and post-processor.
    When both exist they must agree."""
    from dpbert import storage

    directory = str(directory)
    tokenizer_path, vocab_path = storage.join(directory, TOKENIZER_FILE), storage.join(directory, VOCAB_FILE)
    store = storage.storage_for(directory)
    if store.exists(tokenizer_path):
        tokenizer = Tokenizer.from_str(storage.read_text(tokenizer_path))
        if store.exists(vocab_path) and read_vocab_txt(vocab_path) != _vocab_in_id_order(tokenizer):
            raise ValueError(f"{vocab_path} does not match {tokenizer_path}")
    elif store.exists(vocab_path):
        tokens = read_vocab_txt(vocab_path)
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"{vocab_path}: a token appears more than once")
        tokenizer = _new_tokenizer({t: i for i, t in enumerate(tokens)})
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))  # already in the vocabulary: ids kept
        tokenizer = _install_post_processor(tokenizer)
    else:
        raise FileNotFoundError(f"no {TOKENIZER_FILE} or {VOCAB_FILE} in {directory}")
    _check_specials(tokenizer)
    return tokenizer


# ----------------------------------------------------------------------------- tokenizing

def tokenize_tuples(tokenizer: Tokenizer, word_tuples: Iterable, max_seq_length: int,
                    batch_size: int = 2048) -> np.ndarray:
    """Token ids ``int32 [n, max_seq_length]``: ``[CLS] pieces… [SEP]`` truncated, padded with [PAD].

    ``word_tuples`` holds pre-split words (a sequence of str per tuple, or ``WordTuple``s); they
    are encoded with ``is_pretokenized=True`` in batches of ``batch_size``. The caller's
    tokenizer is not modified.
    """
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, numbers.Integral) or max_seq_length < 2:
        raise ValueError(f"max_seq_length must be an integer >= 2 (room for [CLS] and [SEP]), "
                         f"got {max_seq_length!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    _check_specials(tokenizer)
    encoder = Tokenizer.from_str(tokenizer.to_str())
    if encoder.post_processor is None:
        _install_post_processor(encoder)
    encoder.enable_truncation(max_length=int(max_seq_length))
    encoder.enable_padding(length=int(max_seq_length), pad_id=PAD_ID, pad_token=PAD)
    chunks: List[np.ndarray] = []
    batch: List[List[str]] = []

    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets: same ids, ≈ 15 % faster.
    encode_batch = getattr(encoder, "encode_batch_fast", encoder.encode_batch)

    def encode(batch):
        encodings = encode_batch(batch, is_pretokenized=True)
        return np.asarray([e.ids for e in encodings], dtype=np.int32).reshape(len(batch), int(max_seq_length))

    for item in word_tuples:
        words = getattr(item, "words", item)
        if isinstance(words, (str, bytes)):
            raise TypeError("tokenize_tuples expects pre-split words (a sequence of str per tuple), got a string")
        batch.append(list(words))
        if len(batch) >= batch_size:
            chunks.append(encode(batch))
            batch = []
    if batch:
        chunks.append(encode(batch))
    if not chunks:
        return np.zeros((0, int(max_seq_length)), dtype=np.int32)
    return np.concatenate(chunks, axis=0)


__all__ = [
    "SPECIAL_TOKENS", "PAD", "UNK", "CLS", "SEP", "MASK", "SpecialIds", "special_ids", "SPECIAL_IDS",
    "PAD_ID", "UNK_ID", "CLS_ID", "SEP_ID", "MASK_ID", "VOCAB_FILE", "TOKENIZER_FILE",
    "MIN_SCALED_COUNT", "train_wordpiece", "choose_count_scale", "scaled_counts",
    "save_vocabulary", "load_tokenizer", "read_vocab_txt", "tokenize_tuples",
]
