"""Named-entity recognition evaluation: readers, BIO entities, entity-level F1, fine-tuning.

Plain Python except :func:`finetune_and_score` (TensorFlow / tf_keras, imported lazily).

Readers (both return a list of :class:`Sentence`, i.e. tokens + BIO tags):

* :func:`read_conll` — IOB/CoNLL TSV: one ``token<TAB>tag`` line per token (extra middle columns
  are ignored: the token is the first column, the tag the last), a blank line between sentences,
  ``-DOCSTART-`` lines skipped. Tags must be ``O``, ``B-<type>`` or ``I-<type>``. A malformed line
  raises :class:`NerFormatError` naming ``file:line``.
* :func:`read_i2b2` — the i2b2-2010 concept format: a ``.txt`` file with one sentence per line
  (tokens separated by whitespace) and a ``.con`` file with lines such as
  ``c="chest pain" 12:3 12:4||t="problem"``: 1-based line numbers, 0-based token offsets, the end
  offset inclusive. Concepts become ``B-problem I-problem``. Errors name the ``.con`` file and
  line.

Entities follow conlleval's chunk semantics (:func:`extract_entities`): a chunk starts at ``B-X``,
at ``I-X`` after ``O``, and at ``I-X`` after a tag of a different type; it ends before ``O``, before
``B-*`` and before a tag of another type. Scores (:func:`entity_scores`) are entity-level, exact
span AND type match: a partially overlapping prediction is one false positive plus one false
negative, as in conlleval. Micro precision/recall/F1 over all entities plus per-type scores.

Fine-tuning (:func:`finetune_and_score`) puts a token-classification head on a pre-trained
encoder. The interface is deliberately small so the real encoder plugs in later:

* ``encoder_builder()`` returns a fresh ``tf_keras.Model`` mapping ``input_ids`` ``[B, L]`` int32
  to either a tensor ``[B, L, H]`` or a dict with ``"sequence_output"`` ``[B, L, H]`` (the
  ``BertModels.encoder`` of ``dpbert.network.bert``), with the pre-trained weights loaded;
* ``tokenizer`` is either a Hugging Face ``tokenizers.Tokenizer`` (WordPiece) or a callable
  ``word -> list of piece ids``.

Word-piece alignment: every word is split into pieces; the FIRST piece carries the word's label,
the other pieces (and ``[CLS]``, ``[SEP]``, padding) are ignored by the loss and at prediction
time. A word that yields no piece is encoded as ``[UNK]``. Sentences longer than ``L - 2`` pieces
are cut at word boundaries into several windows, so no gold entity is silently dropped (a
single word longer than the window keeps only its first pieces).
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from dpbert.resources.bundled import bundled_bc5cdr_path  # noqa: F401 (re-exported: ner.bundled_bc5cdr_path)
from dpbert.vocab.wordpiece import CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID  # noqa: F401
IGNORE_LABEL = -100


class NerFormatError(ValueError):
    """A malformed NER file; the message starts with ``file:line:``."""

    def __init__(self, path, line: Optional[int], message: str):
        self.path, self.line = str(path), line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence: its tokens and their BIO tags (same length)."""

    tokens: Tuple[str, ...]
    tags: Tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "tags", tuple(self.tags))
        if len(self.tokens) != len(self.tags):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.tags)} tags")


@dataclasses.dataclass(frozen=True)
class Entity:
    """An entity span: ``tokens[start:end]`` (end exclusive) of type ``type``."""

    type: str
    start: int
    end: int


_TAG_RE = re.compile(r"^(?:O|[BI]-\S+)$")


def _check_tag(tag: str, path, line: int) -> str:
    if not _TAG_RE.match(tag):
        raise NerFormatError(path, line, f"invalid tag {tag!r} (expected O, B-<type> or I-<type>)")
    return tag


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------

def read_conll(path) -> List[Sentence]:
    """Read an IOB/CoNLL TSV file (see the module docstring) into sentences."""
    path = Path(path)
    sentences: List[Sentence] = []
    tokens: List[str] = []
    tags: List[str] = []

    def flush():
        if tokens:
            sentences.append(Sentence(tuple(tokens), tuple(tags)))
            tokens.clear()
            tags.clear()

    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise NerFormatError(path, number, f"not valid UTF-8 ({exc.reason})") from None
            line = line.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            if line.startswith("-DOCSTART-"):
                flush()
                continue
            columns = line.split("\t")
            if len(columns) < 2:
                raise NerFormatError(path, number, "expected 'token<TAB>tag', found no tab")
            token, tag = columns[0], columns[-1].strip()
            if not token.strip():
                raise NerFormatError(path, number, "empty token")
            tokens.append(token)
            tags.append(_check_tag(tag, path, number))
    flush()
    return sentences


_CON_RE = re.compile(r'^c="(.*)" (\d+):(\d+) (\d+):(\d+)\|\|t="([^"]+)"\s*$')


def read_i2b2(txt_path, con_path, check_text: bool = True) -> List[Sentence]:
    """Read an i2b2-2010 ``.txt`` / ``.con`` pair into BIO-tagged sentences.

    ``check_text``: the concept text must equal the tokens it points at (case-insensitive,
    whitespace-normalized); a mismatch is an error naming the ``.con`` line. Concepts spanning
    several lines or overlapping another concept are errors (BIO cannot represent them). Empty
    ``.txt`` lines yield no sentence.
    """
    txt_path, con_path = Path(txt_path), Path(con_path)
    try:
        lines = txt_path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise NerFormatError(txt_path, None, f"not valid UTF-8 ({exc.reason})") from None
    if lines and lines[-1] == "":
        lines.pop()
    token_lines = [line.split() for line in lines]
    tag_lines = [["O"] * len(tokens) for tokens in token_lines]
    owner: Dict[Tuple[int, int], int] = {}

    try:
        con_text = con_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise NerFormatError(con_path, None, f"not valid UTF-8 ({exc.reason})") from None
    for number, line in enumerate(con_text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        match = _CON_RE.match(line)
        if not match:
            raise NerFormatError(con_path, number,
                                 "expected 'c=\"text\" LINE:TOKEN LINE:TOKEN||t=\"type\"'")
        text, l1, t1, l2, t2, ctype = match.groups()
        l1, t1, l2, t2 = int(l1), int(t1), int(l2), int(t2)
        if l1 != l2:
            raise NerFormatError(con_path, number, "a concept spanning several lines is not supported")
        if not 1 <= l1 <= len(token_lines):
            raise NerFormatError(con_path, number,
                                 f"line {l1} is outside {txt_path.name} ({len(token_lines)} lines)")
        tokens = token_lines[l1 - 1]
        if not 0 <= t1 <= t2 < len(tokens):
            raise NerFormatError(con_path, number,
                                 f"token span {t1}..{t2} is outside line {l1} ({len(tokens)} tokens)")
        if check_text and " ".join(text.split()).lower() != " ".join(tokens[t1:t2 + 1]).lower():
            raise NerFormatError(con_path, number,
                                 f"concept text does not match tokens {t1}..{t2} of line {l1}")
        for t in range(t1, t2 + 1):
            if (l1, t) in owner:
                raise NerFormatError(con_path, number,
                                     f"overlaps the concept on line {owner[(l1, t)]}")
            owner[(l1, t)] = number
        tag_lines[l1 - 1][t1] = f"B-{ctype}"
        for t in range(t1 + 1, t2 + 1):
            tag_lines[l1 - 1][t] = f"I-{ctype}"
    return [Sentence(tuple(tokens), tuple(tags))
            for tokens, tags in zip(token_lines, tag_lines) if tokens]


def bundled_bc5cdr(split: str) -> List[Sentence]:
    """The shipped BC5CDR subset (README in the same folder: CC BY 4.0, attribution)."""
    return read_conll(bundled_bc5cdr_path(split))


# --------------------------------------------------------------------------------------------
# Entities and scores
# --------------------------------------------------------------------------------------------

def _split_tag(tag: str) -> Tuple[str, str]:
    if tag == "O" or not tag:
        return "O", ""
    prefix, _, etype = tag.partition("-")
    if prefix not in ("B", "I") or not etype:
        raise ValueError(f"invalid BIO tag {tag!r}")
    return prefix, etype


def extract_entities(tags: Sequence[str]) -> List[Entity]:
    """Entities of a BIO tag sequence with conlleval's chunk boundaries (module docstring)."""
    entities: List[Entity] = []
    start: Optional[int] = None
    current = ""
    for i, tag in enumerate(tags):
        prefix, etype = _split_tag(tag)
        # end of the open chunk?
        if start is not None and (prefix in ("O", "B") or etype != current):
            entities.append(Entity(current, start, i))
            start = None
        # start of a chunk? (B-X; I-X after O; I-X after another type — conlleval)
        if prefix != "O" and start is None:
            start, current = i, etype
    if start is not None:
        entities.append(Entity(current, start, len(tags)))
    return entities


def _prf(tp: int, fp: int, fn: int) -> Dict[str, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "tp": tp, "fp": fp, "fn": fn, "support": tp + fn}


def entity_scores(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> dict:
    """Entity-level micro precision/recall/F1 and per-type scores (exact span + type match).

    ``gold`` and ``predicted``: parallel sequences of tag sequences (one per sentence), or of
    :class:`Sentence`. Returns ``{"precision", "recall", "f1", "tp", "fp", "fn", "support",
    "per_type": {type: {...same keys...}}}``; a type present only in predictions appears with
    support 0.
    """
    gold, predicted = list(gold), list(predicted)
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    tp: Counter = Counter()
    n_gold: Counter = Counter()
    n_pred: Counter = Counter()
    for i, (g, p) in enumerate(zip(gold, predicted)):
        g = g.tags if isinstance(g, Sentence) else g
        p = p.tags if isinstance(p, Sentence) else p
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
        gold_entities = set(extract_entities(g))
        pred_entities = set(extract_entities(p))
        for e in gold_entities:
            n_gold[e.type] += 1
        for e in pred_entities:
            n_pred[e.type] += 1
        for e in gold_entities & pred_entities:
            tp[e.type] += 1
    types = sorted(set(n_gold) | set(n_pred))
    per_type = {t: _prf(tp[t], n_pred[t] - tp[t], n_gold[t] - tp[t]) for t in types}
    total_tp = sum(tp.values())
    result = _prf(total_tp, sum(n_pred.values()) - total_tp, sum(n_gold.values()) - total_tp)
    result["per_type"] = per_type
    return result


# --------------------------------------------------------------------------------------------
# Word-piece alignment
# --------------------------------------------------------------------------------------------

TokenizerLike = Union[Callable[[str], Sequence[int]], object]


def word_piece_ids(tokenizer: TokenizerLike, words: Sequence[str], unk_id: int = UNK_ID
                   ) -> List[List[int]]:
    """The piece ids of each word (``[unk_id]`` for a word that yields none).

    ``tokenizer``: a Hugging Face ``tokenizers.Tokenizer`` (anything with ``encode`` accepting
    ``is_pretokenized``) or a callable ``word -> piece ids``.
    """
    words = list(words)
    if hasattr(tokenizer, "encode"):
        encoding = tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
        pieces: List[List[int]] = [[] for _ in words]
        for piece_id, word_id in zip(encoding.ids, encoding.word_ids):
            if word_id is not None:
                pieces[word_id].append(int(piece_id))
    elif callable(tokenizer):
        pieces = [[int(i) for i in tokenizer(word)] for word in words]
    else:
        raise TypeError("tokenizer must be a tokenizers.Tokenizer or a callable word -> ids")
    return [p if p else [int(unk_id)] for p in pieces]


@dataclasses.dataclass
class EncodedNer:
    """Model inputs for token classification, one row per window.

    ``input_ids`` / ``labels`` ``[N, L]`` int32 (labels ``IGNORE_LABEL`` except at first pieces);
    ``sentence_index[N]`` and ``word_offset[N]``: which sentence a window comes from and the
    index of its first word; ``first_piece[N, L]`` the word index (within the sentence) whose
    first piece is at that position, -1 elsewhere.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    first_piece: np.ndarray
    sentence_index: np.ndarray


def encode_sentences(sentences: Sequence[Sentence], tokenizer: TokenizerLike,
                     label_to_id: Dict[str, int], max_seq_length: int, *,
                     cls_id: int = CLS_ID, sep_id: int = SEP_ID, pad_id: int = PAD_ID,
                     unk_id: int = UNK_ID, unknown_label: Optional[str] = "O") -> EncodedNer:
    """Word-piece-align BIO sentences: ``[CLS] pieces... [SEP] pad...``, label on first pieces.

    A tag missing from ``label_to_id`` is mapped to ``unknown_label`` (``None``: error).
    """
    L = int(max_seq_length)
    if L < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {L}")
    room = L - 2
    rows_ids, rows_labels, rows_first, rows_sentence = [], [], [], []
    for s_index, sentence in enumerate(sentences):
        pieces = word_piece_ids(tokenizer, sentence.tokens, unk_id)
        w = 0
        while w < len(pieces):
            ids = [cls_id]
            labels = [IGNORE_LABEL]
            first = [-1]
            while w < len(pieces):
                word = pieces[w]
                if len(ids) - 1 + len(word) > room:
                    if len(ids) > 1:
                        break          # close this window; the word starts the next one
                    word = word[:room]  # a single word longer than a window: keep its head
                tag = sentence.tags[w]
                if tag not in label_to_id:
                    if unknown_label is None:
                        raise ValueError(f"sentence {s_index}: tag {tag!r} has no label id")
                    tag = unknown_label
                ids.extend(word)
                labels.extend([label_to_id[tag]] + [IGNORE_LABEL] * (len(word) - 1))
                first.extend([w] + [-1] * (len(word) - 1))
                w += 1
            ids.append(sep_id)
            labels.append(IGNORE_LABEL)
            first.append(-1)
            pad = L - len(ids)
            rows_ids.append(ids + [pad_id] * pad)
            rows_labels.append(labels + [IGNORE_LABEL] * pad)
            rows_first.append(first + [-1] * pad)
            rows_sentence.append(s_index)
    return EncodedNer(
        input_ids=np.asarray(rows_ids, np.int32).reshape(-1, L),
        labels=np.asarray(rows_labels, np.int32).reshape(-1, L),
        first_piece=np.asarray(rows_first, np.int32).reshape(-1, L),
        sentence_index=np.asarray(rows_sentence, np.int32),
    )


def decode_predictions(encoded: EncodedNer, label_ids: np.ndarray, id_to_label: Sequence[str],
                       sentences: Sequence[Sentence]) -> List[Tuple[str, ...]]:
    """Per-sentence predicted tags from per-position label ids ``[N, L]`` (first pieces only)."""
    predicted = [["O"] * len(s.tokens) for s in sentences]
    rows, cols = np.nonzero(encoded.first_piece >= 0)
    for r, c in zip(rows, cols):
        s = int(encoded.sentence_index[r])
        predicted[s][int(encoded.first_piece[r, c])] = id_to_label[int(label_ids[r, c])]
    return [tuple(p) for p in predicted]


def label_list(sentences: Iterable[Sentence], types: Optional[Sequence[str]] = None) -> List[str]:
    """``["O", "B-t1", "I-t1", ...]`` for the given types (default: every type in ``sentences``)."""
    if types is None:
        found = set()
        for sentence in sentences:
            for tag in sentence.tags:
                prefix, etype = _split_tag(tag)
                if etype:
                    found.add(etype)
        types = sorted(found)
    labels = ["O"]
    for t in types:
        labels += [f"B-{t}", f"I-{t}"]
    return labels


# --------------------------------------------------------------------------------------------
# Fine-tuning
# --------------------------------------------------------------------------------------------

def _sequence_output(outputs):
    if isinstance(outputs, dict):
        if "sequence_output" not in outputs:
            raise ValueError("the encoder returned a dict without 'sequence_output'")
        return outputs["sequence_output"]
    if isinstance(outputs, (list, tuple)):
        return outputs[0]
    return outputs


def build_token_classifier(encoder, num_labels: int, max_seq_length: int, dropout: float = 0.1,
                           seed: Optional[int] = None):
    """``encoder`` (input_ids → [B, L, H] or dict) + Dropout + Dense(num_labels) logits."""
    import tensorflow as tf
    import tf_keras

    input_ids = tf_keras.Input(shape=(int(max_seq_length),), dtype=tf.int32, name="input_ids")
    hidden = _sequence_output(encoder(input_ids))
    hidden = tf_keras.layers.Dropout(dropout, seed=seed, name="ner_dropout")(hidden)
    logits = tf_keras.layers.Dense(
        int(num_labels), name="ner_classifier",
        kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02, seed=seed))(hidden)
    return tf_keras.Model(inputs=input_ids, outputs=logits, name="ner_token_classifier")


def split_dev(sentences: Sequence[Sentence], fraction: float, seed: int = 0
              ) -> Tuple[List[Sentence], List[Sentence]]:
    """(train, dev): a random ``fraction`` of the TRAINING sentences held out as the dev split
    for early stopping (at least one sentence each when ``fraction > 0`` and there are two or
    more; the test split is never touched). The choice depends on ``seed`` only, not on the
    fine-tuning seed, so every model and seed sees the same dev sentences."""
    sentences = list(sentences)
    k = int(round(float(fraction) * len(sentences)))
    if fraction > 0 and len(sentences) >= 2:
        k = min(max(k, 1), len(sentences) - 1)
    else:
        k = 0
    dev_index = set(np.random.default_rng([int(seed), 0xDE5]).permutation(len(sentences))[:k].tolist())
    return ([s for i, s in enumerate(sentences) if i not in dev_index],
            [s for i, s in enumerate(sentences) if i in dev_index])


def _lengths(input_ids: np.ndarray, pad_id: int) -> np.ndarray:
    """Length of each row up to its last non-pad position."""
    if input_ids.size == 0:
        return np.zeros(len(input_ids), np.int64)
    nonpad = input_ids != pad_id
    return np.where(nonpad.any(axis=1), input_ids.shape[1] - np.argmax(nonpad[:, ::-1], axis=1), 1)


def _trimmed(batch: np.ndarray, lengths: np.ndarray, multiple: int = 8) -> np.ndarray:
    """The batch cut to its longest row rounded up to ``multiple`` (fewer padded positions: the
    encoder masks padding out of attention, so the outputs at real positions are unchanged)."""
    width = min(batch.shape[1], int(-(-int(lengths.max()) // multiple) * multiple))
    return batch[:, :width]


class EarlyStopping:
    """The early-stopping tracker of both NER recipes (fine-tuning and the probe): after each epoch
    :meth:`update` records the dev F1; a strictly better F1 (the first best on ties) takes a
    ``snapshot()`` of the weights; ``patience`` epochs without a better F1 stop training (None:
    never). :meth:`restore` puts the best epoch's weights back when a later epoch was the last."""

    def __init__(self, patience: Optional[int]):
        self.patience = patience
        self.history: List[float] = []
        self.best_f1, self.best_epoch, self.best_state, self.since_best = -1.0, None, None, 0

    def update(self, dev_f1: float, snapshot: Callable[[], object]) -> bool:
        """Record one epoch's dev F1; True when training should stop."""
        self.history.append(float(dev_f1))
        if dev_f1 > self.best_f1:
            self.best_f1, self.best_epoch, self.since_best = dev_f1, len(self.history), 0
            self.best_state = snapshot()
            return False
        self.since_best += 1
        return self.patience is not None and self.since_best >= int(self.patience)

    def restore(self, epochs_run: int, load: Callable[[object], None], dev_f1: Callable[[], float]) -> Optional[float]:
        """The dev F1 of the weights that will be tested: the best epoch's, re-measured by
        ``dev_f1()`` after ``load(best state)`` when the last epoch run was not the best (a check
        that costs one dev pass); None without a dev split."""
        restored = self.history[-1] if self.history else None
        if self.best_state is not None and self.best_epoch != epochs_run:
            load(self.best_state)
            restored = dev_f1()
        return restored

    def summary(self) -> dict:
        return {"dev_f1_history": list(self.history), "best_epoch": self.best_epoch,
                "best_dev_f1": None if self.best_epoch is None else float(self.best_f1)}


@dataclasses.dataclass(frozen=True)
class PieceIds:
    """The special piece ids the windows are built with (``dpbert.vocab.wordpiece``'s by default)."""
    cls_id: int = CLS_ID
    sep_id: int = SEP_ID
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID


@dataclasses.dataclass(frozen=True)
class NERSettings:
    """How :func:`finetune_and_score` trains the head and scores (its docstring says what each does).

    Schedule: ``epochs`` passes over the windows, ``batch_size`` windows a step (a probe: × 16
    words), Adam at ``learning_rate``, ``dropout`` before the head, ``seed`` (None: unseeded),
    ``patience`` epochs without a better dev F1 before stopping (None: never early).
    Windows: ``max_seq_length`` pieces each; ``dynamic_length``: each batch cut to its longest window.
    Mode: ``train_encoder`` False is a linear probe of the frozen encoder (``ner.mode: probe``)."""
    epochs: int
    max_seq_length: int = 128
    batch_size: int = 16
    learning_rate: float = 5e-5
    dropout: float = 0.1
    seed: Optional[int] = 0
    patience: Optional[int] = None
    dynamic_length: bool = True
    train_encoder: bool = True


@dataclasses.dataclass(frozen=True)
class _Task:
    """One task's sentences, its label list and its encoded windows (``dev``: None without a dev split)."""
    labels: List[str]
    train_sentences: Sequence[Sentence]
    dev_sentences: List[Sentence]
    test_sentences: Sequence[Sentence]
    train: EncodedNer
    dev: Optional[EncodedNer]
    test: EncodedNer


def _encode_task(tokenizer: TokenizerLike, train_sentences, dev_sentences, test_sentences,
                 entity_types: Optional[Sequence[str]], max_seq_length: int, ids: PieceIds) -> _Task:
    dev_sentences = list(dev_sentences or [])
    labels = label_list(list(train_sentences) + dev_sentences, entity_types)
    label_to_id = {label: i for i, label in enumerate(labels)}
    kwargs = dict(cls_id=ids.cls_id, sep_id=ids.sep_id, pad_id=ids.pad_id, unk_id=ids.unk_id)
    train = encode_sentences(train_sentences, tokenizer, label_to_id, max_seq_length, **kwargs)
    test = encode_sentences(test_sentences, tokenizer, label_to_id, max_seq_length, **kwargs)
    dev = encode_sentences(dev_sentences, tokenizer, label_to_id, max_seq_length, **kwargs) if dev_sentences else None
    return _Task(labels, train_sentences, dev_sentences, test_sentences, train, dev, test)


def _scored(task: _Task, predictions, loss_history: List[float], stopping: "EarlyStopping",
            restored_dev_f1: Optional[float], epochs: int, mode: str) -> dict:
    """The :func:`entity_scores` of the test predictions and what :func:`finetune_and_score` returns with them."""
    result = entity_scores([s.tags for s in task.test_sentences], predictions)
    result.update({
        "labels": task.labels, "loss_history": loss_history, **stopping.summary(), "restored_dev_f1": restored_dev_f1,
        "predictions": predictions, "train_sentences": len(task.train_sentences),
        "dev_sentences": len(task.dev_sentences), "test_sentences": len(task.test_sentences),
        "train_windows": int(len(task.train.input_ids)), "test_windows": int(len(task.test.input_ids)),
        "epochs": int(epochs), "epochs_run": len(loss_history), "mode": mode,
    })
    return result


class _FineTuner:
    """The encoder + token-classification head of :func:`finetune_and_score`, its compiled train
    and predict steps (``tf.function`` without autograph) and its epoch loop with early stopping."""

    def __init__(self, encoder_builder, labels, settings: NERSettings, pad_id: int):
        import tensorflow as tf
        import tf_keras

        seed, max_seq_length = settings.seed, int(settings.max_seq_length)
        self.labels, self.max_seq_length, self.dynamic_length = labels, max_seq_length, settings.dynamic_length
        self.batch_size, self.pad_id = int(settings.batch_size), pad_id
        self.encoder = encoder_builder()
        self.head_dropout = tf_keras.layers.Dropout(settings.dropout, seed=seed, name="ner_dropout")
        self.classifier = tf_keras.layers.Dense(
            int(len(labels)), name="ner_classifier",
            kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02, seed=seed))
        self._logits(tf.zeros((1, max_seq_length), tf.int32), False)  # build the head
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=settings.learning_rate)
        self.variables = self.encoder.trainable_variables + self.classifier.trainable_variables
        # Adam's slots made here, not by the first step: a tf.function that creates variables is
        # traced twice (once to lift them), and that trace cost more than a short fine-tune.
        self.optimizer.build(self.variables)
        self.all_variables = self.encoder.variables + self.classifier.variables
        # One trace each for every batch shape (dynamic_length trims batches to their longest
        # sentence): tracing per new shape cost more than the steps of a short fine-tune.
        ids_spec = tf.TensorSpec([None, None], tf.int32)
        self.train_step = tf.function(self._train_step, autograph=False, input_signature=[
            ids_spec, tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.float32)])
        self.predict_step = tf.function(
            lambda ids: tf.argmax(self._logits(ids, False), axis=-1, output_type=tf.int32),
            autograph=False, input_signature=[ids_spec])

    def _logits(self, ids, training):
        # ``call`` skips the functional input-shape check: a batch may be shorter than L.
        outputs = self.encoder.call(ids, training=training) if self.dynamic_length else \
            self.encoder(ids, training=training)
        return self.classifier(self.head_dropout(_sequence_output(outputs), training=training))

    def _train_step(self, ids, targets, weights):
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = self._logits(ids, True)
            per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
            loss = tf.reduce_sum(per_token * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
        grads = tape.gradient(loss, self.variables)
        self.optimizer.apply_gradients(zip(grads, self.variables))
        return loss

    def predict(self, encoded: EncodedNer, sentences) -> List[Tuple[str, ...]]:
        import tensorflow as tf

        n = len(encoded.input_ids)
        predicted_ids = np.zeros((n, self.max_seq_length), np.int32)
        lengths = _lengths(encoded.input_ids, self.pad_id)
        order = np.argsort(lengths, kind="stable") if self.dynamic_length else np.arange(n)
        step = max(self.batch_size, 32)
        for start in range(0, n, step):
            idx = order[start:start + step]
            chunk = encoded.input_ids[idx]
            if self.dynamic_length:
                chunk = _trimmed(chunk, lengths[idx])
            predicted_ids[idx, :chunk.shape[1]] = self.predict_step(tf.constant(chunk)).numpy()
        return decode_predictions(encoded, predicted_ids, self.labels, sentences)

    def load(self, weights):
        for v, value in zip(self.all_variables, weights):
            v.assign(value)

    def _epoch(self, train: EncodedNer, targets, weights, lengths, order) -> float:
        import tensorflow as tf

        losses, sizes = [], []
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            ids, tg, wt = train.input_ids[idx], targets[idx], weights[idx]
            if self.dynamic_length:
                ids = _trimmed(ids, lengths[idx])
                tg, wt = tg[:, :ids.shape[1]], wt[:, :ids.shape[1]]
            losses.append(float(self.train_step(tf.constant(ids), tf.constant(tg), tf.constant(wt))))
            sizes.append(float(wt.sum()))
        return float(np.average(losses, weights=np.maximum(sizes, 1e-12)))

    def train_epochs(self, train: EncodedNer, dev, dev_sentences, epochs: int, seed, patience):
        """(mean training loss per epoch, the ``EarlyStopping`` tracker): epochs in a fresh random
        order (``seed``), the dev F1 after each, stopping after ``patience`` epochs without a gain."""
        weights = (train.labels != IGNORE_LABEL).astype(np.float32)
        targets = np.where(train.labels == IGNORE_LABEL, 0, train.labels).astype(np.int32)
        lengths = _lengths(train.input_ids, self.pad_id)
        order_rng = np.random.default_rng(seed)
        loss_history: List[float] = []
        stopping = EarlyStopping(patience)
        n_train = len(train.input_ids)
        for _ in range(int(epochs) if n_train else 0):
            loss_history.append(self._epoch(train, targets, weights, lengths, order_rng.permutation(n_train)))
            if dev is None:
                continue
            dev_f1 = entity_scores([s.tags for s in dev_sentences], self.predict(dev, dev_sentences))["f1"]
            if stopping.update(dev_f1, lambda: [v.numpy() for v in self.all_variables]):
                break
        return loss_history, stopping


def finetune_and_score(encoder_builder: Callable[[], object], tokenizer: TokenizerLike,
                       train_sentences: Sequence[Sentence], test_sentences: Sequence[Sentence],
                       settings: NERSettings, *, dev_sentences: Optional[Sequence[Sentence]] = None,
                       entity_types: Optional[Sequence[str]] = None, features_cache: Optional[dict] = None,
                       ids: PieceIds = PieceIds()) -> dict:
    """Fine-tune ``encoder_builder()`` + a token-classification head on ``train_sentences``
    (non-private, as in Hoory et al.'s downstream evaluation) and score ``test_sentences``;
    ``settings``: the schedule, windows and mode (:class:`NERSettings`), ``ids``: the special pieces.

    Training: Adam, ``epochs`` passes over the windows in a fresh random order (``seed``), loss =
    mean cross-entropy over the first pieces of the batch (every other position is ignored).
    The step is a ``tf.function`` without autograph (tracing a Keras ``fit`` step through
    autograph costs ~10 s of CPU per process; the step has no Python control flow to convert).

    Early stopping (``dev_sentences``, carved from the TRAINING data by :func:`split_dev`): after
    every epoch the dev entity F1 is measured; the weights of the best epoch (first best on ties)
    are restored before testing, and training stops after ``patience`` epochs without a better
    dev F1 (None: never stops early). Without a dev split the last epoch is tested.

    Speed (``dynamic_length``): every batch is cut to its longest window rounded up to 8
    positions (padding is masked out of attention, so nothing else changes) and the encoder is
    called through ``Model.call`` so a shorter batch is accepted; test and dev windows are
    predicted in length order. A fixed ``max_seq_length`` batch is used when it is False.

    ``train_encoder`` False (a linear probe, ``ner.mode: probe``): the encoder is frozen and run
    ONCE per window (``features_cache``: a dict shared by the calls of one encoder, so several
    seeds reuse the same forward passes); only the head is trained, on the first-piece features,
    in batches of ``batch_size`` words. Orders of magnitude cheaper than fine-tuning; it measures
    what the pre-trained representations hold, not what fine-tuning can make of them.

    Returns the :func:`entity_scores` dict plus ``labels`` (the label list), ``loss_history``
    (mean training loss per epoch), ``dev_f1_history``, ``best_epoch`` (1-based; None without a
    dev split), ``best_dev_f1``, ``restored_dev_f1`` (the dev F1 of the weights tested: equal to
    ``best_dev_f1``), ``predictions`` (tags per test sentence) and counts.
    """
    import tf_keras

    s = settings
    if s.epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {s.epochs}")
    if s.seed is not None:
        tf_keras.utils.set_random_seed(int(s.seed))
    task = _encode_task(tokenizer, train_sentences, dev_sentences, test_sentences, entity_types,
                        s.max_seq_length, ids)
    if not s.train_encoder:
        return _probe_and_score(encoder_builder, task, s, ids.pad_id, features_cache)
    tuner = _FineTuner(encoder_builder, task.labels, s, ids.pad_id)
    loss_history, stopping = tuner.train_epochs(task.train, task.dev, task.dev_sentences, s.epochs, s.seed, s.patience)
    restored_dev_f1 = stopping.restore(len(loss_history), tuner.load, lambda: entity_scores(
        [x.tags for x in task.dev_sentences], tuner.predict(task.dev, task.dev_sentences))["f1"])
    predictions = tuner.predict(task.test, task.test_sentences)
    return _scored(task, predictions, loss_history, stopping, restored_dev_f1, s.epochs, "finetune")


def first_piece_features(encoder, encoded: EncodedNer, pad_id: int = PAD_ID, batch_size: int = 64) -> np.ndarray:
    """``float32 [n_words, H]``: the encoder's output at every first piece of ``encoded``, in the
    order of ``np.nonzero(encoded.first_piece >= 0)``; one forward pass per window, in length
    order, each batch cut to its longest window."""
    import tensorflow as tf

    n = len(encoded.input_ids)
    lengths = _lengths(encoded.input_ids, pad_id)
    order = np.argsort(lengths, kind="stable")
    per_row: List[Optional[np.ndarray]] = [None] * n
    call = tf.function(lambda ids: _sequence_output(encoder.call(ids, training=False)), autograph=False,
                       reduce_retracing=True)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        chunk = _trimmed(encoded.input_ids[idx], lengths[idx])
        out = call(tf.constant(chunk)).numpy()
        for j, r in enumerate(idx):
            cols = np.nonzero(encoded.first_piece[r, :chunk.shape[1]] >= 0)[0]
            per_row[r] = out[j, cols]
    rows = [p for p in per_row if p is not None and len(p)]
    width = rows[0].shape[1] if rows else 0
    return np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, width), np.float32)


def _probe_and_score(encoder_builder, task: _Task, settings: NERSettings, pad_id: int, cache: Optional[dict]) -> dict:
    """:func:`finetune_and_score` with a frozen encoder (see its docstring)."""
    import tensorflow as tf
    import tf_keras

    train, dev, test, labels, dev_sentences = task.train, task.dev, task.test, task.labels, task.dev_sentences
    seed = settings.seed
    cache = {} if cache is None else cache
    if "train" not in cache:
        encoder = encoder_builder()
        for name, encoded in (("train", train), ("dev", dev), ("test", test)):
            cache[name] = None if encoded is None else first_piece_features(encoder, encoded, pad_id)
    x_train, x_dev, x_test = cache["train"], cache["dev"], cache["test"]
    y_train = train.labels[train.first_piece >= 0].astype(np.int32)
    head = tf_keras.Sequential([tf_keras.layers.Dropout(settings.dropout, seed=seed), tf_keras.layers.Dense(
        len(labels), kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02, seed=seed))])
    head.build((None, x_train.shape[1]))
    optimizer = tf_keras.optimizers.Adam(learning_rate=settings.learning_rate)
    optimizer.build(head.trainable_variables)  # slots outside the step: one trace, not two

    @tf.function(autograph=False, reduce_retracing=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=head(x, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, head.trainable_variables), head.trainable_variables))
        return loss

    def predict(features, encoded, sentences):
        ids = np.zeros(encoded.input_ids.shape, np.int32)
        if len(features):
            ids[encoded.first_piece >= 0] = np.argmax(head(features, training=False).numpy(), axis=-1)
        return decode_predictions(encoded, ids, labels, sentences)

    rng = np.random.default_rng(seed)
    loss_history = []
    stopping = EarlyStopping(settings.patience)
    bs = max(int(settings.batch_size), 1) * 16  # words, not windows: ~16 labelled words per window
    for _ in range(int(settings.epochs) if len(y_train) else 0):
        order = rng.permutation(len(y_train))
        losses = [float(step(tf.constant(x_train[order[i:i + bs]]), tf.constant(y_train[order[i:i + bs]])))
                  for i in range(0, len(order), bs)]
        loss_history.append(float(np.mean(losses)))
        if dev is None:
            continue
        dev_f1 = entity_scores([s.tags for s in dev_sentences], predict(x_dev, dev, dev_sentences))["f1"]
        if stopping.update(dev_f1, head.get_weights):
            break
    restored_dev_f1 = stopping.restore(len(loss_history), head.set_weights, lambda: entity_scores(
        [s.tags for s in dev_sentences], predict(x_dev, dev, dev_sentences))["f1"])
    predictions = predict(x_test, test, task.test_sentences)
    return _scored(task, predictions, loss_history, stopping, restored_dev_f1, settings.epochs, "probe")
