"""Fine-tuning on dχ-privatized input: a small sentence-classification benchmark.

Task (real, public data): does a BC5CDR sentence (the bundled subset, ``dpbert/resources/ner``)
mention a Chemical? Train on the 1,000 train sentences, test on the 300 test sentences.

Setting (Qu et al. 2021, §6): the users privatize their text ONCE before sending it, so the
training and the test sentences are both privatized at the same η (one fixed privatized copy);
"original" is the same model fine-tuned and tested on the raw text (η = ∞). Every encoder has
the public embedding table as its frozen word-embedding layer; encoders either start from
random weights ("none") or from privacy-adaptive pre-training (``pretrain``) at the same η.
``classification_table`` returns rows like the paper's Tables 4–7 (accuracy per η × encoder).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dpbert.local_privacy.dchi import DchiMechanism, SeedLike, make_rng
from dpbert.local_privacy.pretrain import privatize_sequences


def encode_sentences(tokenizer, word_lists: Sequence[Sequence[str]], max_seq_length: int) -> np.ndarray:
    """``[CLS] pieces… [SEP]`` ids, truncated and padded with ``[PAD]``: int32 ``[n, L]``."""
    cls_id, sep_id, pad_id = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    encodings = tokenizer.encode_batch([list(w) for w in word_lists], is_pretokenized=True,
                                       add_special_tokens=False)
    out = np.full((len(encodings), max_seq_length), pad_id, np.int32)
    for row, e in enumerate(encodings):
        ids = [cls_id] + e.ids[:max_seq_length - 2] + [sep_id]
        out[row, :len(ids)] = ids
    return out


def chemical_sentence_task(tokenizer, max_seq_length: int = 64) -> Dict[str, np.ndarray]:
    """BC5CDR sentences → ids and labels (1 = has a Chemical mention)."""
    from dpbert.evaluate.ner import bundled_bc5cdr

    out = {}
    for split in ("train", "test"):
        sentences = bundled_bc5cdr(split)
        out[f"{split}_ids"] = encode_sentences(tokenizer, [s.tokens for s in sentences], max_seq_length)
        out[f"{split}_labels"] = np.asarray([int(any(t.endswith("Chemical") for t in s.tags)) for s in sentences],
                                            np.int32)
    return out


def build_classifier(encoder, num_labels: int, pad_id: int = 0, dropout: float = 0.1):
    """Masked mean of the encoder's ``sequence_output`` → dropout → Dense(num_labels) logits."""
    import tensorflow as tf
    import tf_keras

    input_ids = tf_keras.Input(shape=encoder.input_shape[1:], dtype=tf.int32, name="input_ids")
    sequence = encoder(input_ids)["sequence_output"]
    mask = tf_keras.layers.Lambda(lambda ids: tf.cast(tf.not_equal(ids, pad_id), tf.float32)[..., None])(input_ids)
    pooled = tf_keras.layers.Lambda(
        lambda t: tf.reduce_sum(t[0] * t[1], 1) / tf.maximum(tf.reduce_sum(t[1], 1), 1.0))([sequence, mask])
    pooled = tf_keras.layers.Dropout(dropout)(pooled)
    logits = tf_keras.layers.Dense(num_labels, name="classifier")(pooled)
    return tf_keras.Model(input_ids, logits)


def finetune_and_evaluate(models, train_ids, train_labels, test_ids, test_labels, *, epochs: int = 3,
                          batch_size: int = 32, learning_rate: float = 5e-4, seed: int = 0,
                          pad_id: int = 0) -> Dict[str, float]:
    """Fine-tune ``models.encoder`` (word embeddings stay as they are: frozen if frozen) plus a
    classification head; returns test accuracy (and the majority-class rate for reference)."""
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    num_labels = int(max(train_labels.max(), test_labels.max())) + 1
    model = build_classifier(models.encoder, num_labels, pad_id=pad_id)
    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    start = time.time()
    model.fit(train_ids, train_labels, epochs=epochs, batch_size=batch_size, shuffle=True, verbose=0)
    logits = model.predict(test_ids, batch_size=128, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, -1) == test_labels))
    majority = float(max(np.mean(test_labels), 1 - np.mean(test_labels)))
    return {"accuracy": accuracy, "majority": majority, "seconds": time.time() - start}


def classification_table(mechanism: DchiMechanism, task: Dict[str, np.ndarray], etas: Sequence[float],
                         encoders: Dict[str, Callable[[float], object]], *, keep_ids: Sequence[int],
                         epochs: int = 3, seed: SeedLike = 0, pad_id: int = 0,
                         log: Optional[Callable[[str], None]] = None) -> List[dict]:
    """Accuracy for every η (``math.inf`` = original text) × encoder.

    ``encoders`` maps a name to ``factory(eta) -> BertModels`` (a fresh model for each cell:
    e.g. a random encoder, or one pre-trained with an objective at that η).
    """
    rng = make_rng(seed)
    rows = []
    for eta in etas:
        if math.isinf(eta):
            train_ids, test_ids = task["train_ids"], task["test_ids"]
        else:
            train_ids = privatize_sequences(task["train_ids"], mechanism, eta, rng, keep_ids)
            test_ids = privatize_sequences(task["test_ids"], mechanism, eta, rng, keep_ids)
        content = ~np.isin(task["test_ids"], list(keep_ids))
        changed = float(np.mean(test_ids[content] != task["test_ids"][content])) if content.any() else 0.0
        for name, factory in encoders.items():
            models = factory(eta)
            result = finetune_and_evaluate(models, train_ids, task["train_labels"], test_ids, task["test_labels"],
                                           epochs=epochs, seed=int(rng.integers(1 << 30)), pad_id=pad_id)
            row = {"eta": float(eta), "encoder": name, "tokens_changed": changed, **result}
            rows.append(row)
            if log:
                log(f"η={eta:g} encoder={name}: accuracy {result['accuracy']:.3f} "
                    f"(tokens changed {changed:.2f}, {result['seconds']:.0f} s)")
    return rows


def format_classification_table(rows: Sequence[dict]) -> str:
    """Markdown: one row per encoder, one column per η (test accuracy)."""
    etas: List[float] = []
    for r in rows:
        if r["eta"] not in etas:
            etas.append(r["eta"])
    names: List[str] = []
    for r in rows:
        if r["encoder"] not in names:
            names.append(r["encoder"])
    label = lambda e: "original (η = ∞)" if math.isinf(e) else f"η = {e:g}"  # noqa: E731
    cell: Dict[Tuple[str, float], float] = {(r["encoder"], r["eta"]): r["accuracy"] for r in rows}
    changed = {r["eta"]: r["tokens_changed"] for r in rows}
    lines = ["| encoder | " + " | ".join(label(e) for e in etas) + " |", "|---|" + "---|" * len(etas)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{cell[(name, e)]:.3f}" if (name, e) in cell else "–"
                                                for e in etas) + " |")
    lines.append("| tokens changed | " + " | ".join(f"{changed[e]:.2f}" for e in etas) + " |")
    return "\n".join(lines)


__all__ = ["encode_sentences", "chemical_sentence_task", "build_classifier", "finetune_and_evaluate",
           "classification_table", "format_classification_table"]
