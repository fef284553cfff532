"""The public start: public checkpoint + a non-private MLM warm-up on PUBLIC text (no ε).

The DP literature's recipe is "public pre-training, then private in-domain training" (the
paper's BERT → BERT-M; Yu et al. 2021; Anil et al. 2021). ``model.init: minilm`` loads the public
all-MiniLM-L6-v2 encoder (``dpbert.network.init_public``), but that checkpoint has no MLM head:
the head's transform starts random and DP-SGD would spend its first, noisiest steps learning
it. :func:`warm_up` trains the model on masked-LM over text SHIPPED IN THE REPOSITORY — the
token text of the bundled BC5CDR TRAINING abstracts (``dpbert/resources/ner/bc5cdr/train.tsv``,
1,000 sentences, ≈ 26k words, CC BY 4.0; the test split is never read) — with plain Adam, no
clipping, no noise.

Privacy: :func:`warm_up` is a function of (the model, the tokenizer, the shipped public text,
the number of steps, the seed) only. It never receives a path of a private artifact and opens
exactly one file, the shipped text (``tests/model/test_public_warmup.py`` checks both). The
tokenizer it gets is the released vocabulary (DP, or public), itself covered by ε_V. So the
warm-up is outside the ε ledger and recorded on the model artifact as public
(``public_init``, ``public_layers``, ``public_warmup_steps``, ``public_warmup_source``).

What is trained (``scope``): ``"head"`` (default) — the MLM head (transform dense + LayerNorm)
and the output bias; the encoder, the input embeddings and the output projection (a copy of the
input table) keep their public values. ``"all"`` trains every weight (public text only).

:func:`public_start` = build + ``init_from_checkpoint`` + :func:`warm_up`; the pretrain stage
hands its weights to ``train_mlm`` (``initial_weights``) before DP training.

Measured (``benchmarks/public_start.py``; 2 CPU cores shared with other test runs, load ≈ 5, so
upper figures): MiniLM, 2 public layers, L = 64, the public+dp vocabulary of the demo corpus
(30,600 tokens, 78 appended): a warm-up step (B = 32, head only) ≈ 1.5 s — the 384 × 30.6k output
layer dominates; 200 steps took 298 s and brought the held-out MLM loss on fresh synthetic notes
from 11.20 nats (the checkpoint with its random head: worse than uniform, ln 30,600 = 10.3) to
7.89 (training loss on the public text 9.45 → 6.58). A DP-SGD step of the same model at B = 64
took 2.3–5.4 s (L = 128: 8–16 s).
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

log = logging.getLogger("dpbert.public_warmup")

#: What the warm-up reads, as recorded on the model artifact.
SOURCE = "bundled BC5CDR training abstracts (dpbert/resources/ner/bc5cdr/train.tsv, CC BY 4.0)"
SCOPES = ("head", "all")
_HEAD_LAYERS = ("mlm_transform", "mlm_layer_norm")


def public_text_path():
    """The shipped public text: the bundled BC5CDR TRAINING split (never an evaluation split)."""
    from dpbert.resources.bundled import bundled_bc5cdr_path

    return bundled_bc5cdr_path("train")


def public_sentences(path=None) -> List[List[str]]:
    """The words of each sentence of the shipped text (IOB file: the token column only)."""
    path = public_text_path() if path is None else path
    sentences, current = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                if current:
                    sentences.append(current)
                current = []
            else:
                current.append(line.split("\t", 1)[0])
    if current:
        sentences.append(current)
    return sentences


def public_rows(tokenizer, max_seq_length: int, sentences: Optional[Sequence[Sequence[str]]] = None) -> np.ndarray:
    """``int32 [n, max_seq_length]``: the shipped text's word pieces, consecutive sentences packed
    into rows of ``[CLS] pieces… [SEP]`` (L − 2 pieces each, the last row padded)."""
    from dpbert.vocab.wordpiece import special_ids

    sentences = public_sentences() if sentences is None else sentences
    ids = special_ids(tokenizer)
    encodings = tokenizer.encode_batch([list(s) for s in sentences], is_pretokenized=True, add_special_tokens=False)
    stream = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32)
    width = int(max_seq_length) - 2
    n = max(1, -(-stream.size // width))
    rows = np.full((n, int(max_seq_length)), ids.pad, dtype=np.int32)
    for r in range(n):
        chunk = stream[r * width:(r + 1) * width]
        rows[r, 0] = ids.cls
        rows[r, 1:1 + chunk.size] = chunk
        rows[r, 1 + chunk.size] = ids.sep
    return rows


def _trainable(models, scope: str):
    if scope == "all":
        return list(models.mlm.trainable_variables)
    variables = [v for name in _HEAD_LAYERS for v in models.mlm.get_layer(name).trainable_variables]
    return variables + [models.mlm.get_layer("mlm_output").bias]


def warm_up(models, tokenizer, steps: int, seed: int, *, batch_size: int = 32, learning_rate: float = 1e-3,
            mask_probability: float = 0.15, scope: str = "head", rows: Optional[np.ndarray] = None) -> Dict:
    """Non-private MLM training of ``models`` (a ``BertModels``) for ``steps`` steps on the shipped
    public text, tokenized with ``tokenizer``; returns a record for the model artifact.

    Batches: ``batch_size`` rows drawn without replacement (epoch after epoch) by
    ``np.random.default_rng(seed)``; masks: ``dpbert.engine.masking`` keyed by (seed, step, row).
    ``rows``: tests only (pre-tokenized public rows).
    """
    import tensorflow as tf
    import tf_keras

    from dpbert.mechanism.clipping import per_example_mlm_loss
    from dpbert.engine import masking
    from dpbert.vocab.wordpiece import special_ids

    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    spec = models.spec
    record = {"steps": int(steps), "source": SOURCE, "scope": scope, "batch_size": int(batch_size),
              "learning_rate": float(learning_rate), "seed": int(seed)}
    if steps <= 0:
        return record
    t0 = time.time()
    rows = public_rows(tokenizer, spec.max_seq_length) if rows is None else np.asarray(rows, np.int32)
    ids = special_ids(tokenizer)
    variables = _trainable(models, scope)
    optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate)
    optimizer.build(variables)  # slots outside the step: a tf.function creating them is traced twice
    rng = np.random.default_rng(seed)
    order = np.empty(0, np.int64)
    mask_key = int(np.random.default_rng([seed, 0x5EED]).integers(2 ** 62))

    @tf.function(reduce_retracing=True, autograph=False)  # no tensor-dependent control flow
    def step(input_ids, positions, labels, weights):
        with tf.GradientTape() as tape:
            logits = models.mlm({"input_ids": input_ids, "masked_positions": positions}, training=True)
            loss = tf.reduce_mean(per_example_mlm_loss(labels, logits, weights))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses = []
    for s in range(int(steps)):
        if order.size < batch_size:
            order = np.concatenate([order, rng.permutation(rows.shape[0])])
        batch, order = order[:batch_size], order[batch_size:]
        m = masking.mask_tokens(rows[batch], masking.example_keys(mask_key, s, batch),
                                special_token_ids=tuple(ids), mask_token_id=ids.mask, vocab_size=spec.vocab_size,
                                max_predictions=spec.max_predictions, mask_probability=mask_probability,
                                pad_id=spec.pad_id)
        losses.append(float(step(m["input_ids"], m["masked_positions"], m["masked_labels"], m["masked_weights"])))
    k = min(5, len(losses))
    record.update({"rows": int(rows.shape[0]), "loss_first": float(np.mean(losses[:k])),
                   "loss_last": float(np.mean(losses[-k:])), "seconds": round(time.time() - t0, 1)})
    log.info("public warm-up: %d steps on %d public rows, MLM loss %.3f → %.3f (%.0f s)", steps, rows.shape[0],
             record["loss_first"], record["loss_last"], record["seconds"])
    return record


def public_start(spec, tokenizer, vocab_tokens: Sequence[str], *, steps: int, seed: int, checkpoint_dir=None,
                 batch_size: int = 32, learning_rate: float = 1e-3, mask_probability: float = 0.15,
                 scope: str = "head"):
    """(MLM weights as a list of arrays, record): a model of ``spec`` initialised from the public
    checkpoint and warmed up for ``steps`` steps on the shipped public text. No private input."""
    from dpbert.network import bert as bert_lib
    from dpbert.network import init_public

    models = bert_lib.build_bert(spec, seed=seed)
    init = init_public.init_from_checkpoint(models, vocab_tokens, checkpoint_dir, seed)
    warm = warm_up(models, tokenizer, steps, seed, batch_size=batch_size, learning_rate=learning_rate,
                   mask_probability=mask_probability, scope=scope)
    return models.mlm.get_weights(), {"init": init, "warmup": warm}


__all__ = ["SOURCE", "SCOPES", "public_text_path", "public_sentences", "public_rows", "warm_up", "public_start"]


def public_start_weights(mc, tc, tokenizer, vocabulary_dir: str):
    """(initial MLM weights, properties, checkpoint directory) of the public start for
    ``model.init: minilm`` (the trainer stage and the NER evaluation); reads the public checkpoint,
    the released vocabulary and the shipped public text — nothing private. A public / public+dp
    vocabulary must come from the same checkpoint (its ``token_sources.json`` sha256 is checked)."""
    from os import environ

    from dpbert import schema
    from dpbert.network import init_public
    from dpbert.resources import checkpoint
    from dpbert.vocab import public

    directory = checkpoint.checkpoint_dir(mc.init_dir)
    sources = public.read_token_sources(vocabulary_dir)
    if sources is not None and sources.get("public_checkpoint_vocab_sha256") != \
            public.file_sha256(directory / "vocab.txt"):
        raise ValueError(f"the {sources.get('source')} vocabulary was built from another public checkpoint than "
                         f"model.init_dir ({directory}): use the same checkpoint for both")
    spec = init_public.spec_for_public(mc, tokenizer.get_vocab_size(), tc.mask_probability, directory)
    vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    weights, record = public_start(
        spec, tokenizer, vocab_tokens, steps=mc.public_warmup_steps, seed=tc.seed, checkpoint_dir=directory,
        batch_size=mc.public_warmup_batch_size, learning_rate=mc.public_warmup_learning_rate,
        mask_probability=tc.mask_probability)
    warm = record["warmup"]
    properties = {
        schema.PUBLIC_INIT: f"{checkpoint.PACKAGE}=={checkpoint.PACKAGE_VERSION}" if mc.init_dir is None
        and environ.get(checkpoint.ENV_DIR) is None else str(directory),
        schema.PUBLIC_LAYERS: spec.num_layers,
        schema.PUBLIC_WARMUP_STEPS: mc.public_warmup_steps,
        schema.PUBLIC_WARMUP_SOURCE: warm["source"] if mc.public_warmup_steps else None,
        "public_warmup_loss_first": warm.get("loss_first"),
        "public_warmup_loss_last": warm.get("loss_last"),
        "public_rows_copied": record["init"]["rows_exact"] + record["init"]["rows_lowercased"],
        "public_rows_piece_mean": record["init"]["rows_piece_mean"],
    }
    return weights, properties, directory
