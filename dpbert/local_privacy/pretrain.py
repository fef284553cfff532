"""Privacy-adaptive pre-training (Qu et al. 2021, §4) on a PUBLIC corpus, embeddings frozen.

At inference time the model will only ever see privatized tokens x̃ = M(x) (``dchi``), embedded
by the user-side table φ. Privacy-adaptive pre-training teaches the encoder to work with such
input: the word-embedding layer is φ itself and stays FROZEN (the users' mechanism is defined
over φ; training it would change the metric the guarantee is stated in), everything else
trains. The corpus is public, so this training is NOT private (no DP-SGD, no ledger entry).

The three objectives differ only in their labels; inputs are always the privatized sequence
with ~``mask_probability`` of the non-special positions (at most ``max_predictions``) replaced
by ``[MASK]``:

* ``vanilla``   — predict the privatized token x̃ᵢ at each masked position (plain MLM on
  privatized text: what a provider can do with privatized data alone);
* ``prob``      — draw K fresh privatizations of the ORIGINAL token xᵢ at each masked position
  and use all of them as labels, each with weight 1/K: the loss is the cross-entropy against
  the empirical distribution of M(xᵢ), i.e. every distinct output weighted by its frequency;
* ``denoising`` — predict the original token xᵢ (possible because the corpus is public).
  ``mask_inputs=False`` leaves x̃ᵢ visible instead of ``[MASK]`` (pure denoising).

``build_objective_batch`` returns numpy arrays only; ``pretrain`` is a small tf_keras loop over
a ``dpbert.network.bert`` model whose hidden size is the table's dimension.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from dpbert.local_privacy.dchi import DchiMechanism, SeedLike, check_eta, make_rng

OBJECTIVES = ("vanilla", "prob", "denoising")


@dataclasses.dataclass
class MlmBatch:
    """One batch: model inputs and (possibly several, weighted) labels per masked slot."""

    input_ids: np.ndarray         # int32 [B, L]: privatized, masked
    masked_positions: np.ndarray  # int32 [B, M] (0 in unused slots)
    labels: np.ndarray            # int32 [B, M, K]
    weights: np.ndarray           # float32 [B, M, K]: sums to 1 over K in used slots, 0 in unused ones
    original_ids: np.ndarray      # int32 [B, L]: the input before privatization (diagnostics)

    @property
    def num_predictions(self) -> int:
        return int(np.sum(self.weights.sum(-1) > 0))


def privatize_sequences(token_ids, mechanism: DchiMechanism, eta: float, rng: np.random.Generator,
                        keep_ids: Iterable[int]) -> np.ndarray:
    """Privatize every position of ``[B, L]`` ids except the framing ``keep_ids``
    (``[PAD]``, ``[CLS]``, ``[SEP]``): int32 out."""
    return mechanism.privatize_ids(np.asarray(token_ids), eta, rng, keep_ids=list(keep_ids)).astype(np.int32)


def select_masked_positions(token_ids, maskable: np.ndarray, rng: np.random.Generator,
                            mask_probability: float, max_predictions: int):
    """Per row, ``max(1, round(p · #maskable))`` (capped at M) random maskable positions, sorted.

    Returns ``positions`` int32 ``[B, M]`` and ``valid`` bool ``[B, M]``.
    """
    token_ids = np.asarray(token_ids)
    B = token_ids.shape[0]
    positions = np.zeros((B, max_predictions), np.int32)
    valid = np.zeros((B, max_predictions), bool)
    keys = rng.random(token_ids.shape)
    keys[~maskable] = np.inf
    order = np.argsort(keys, axis=1)
    counts = maskable.sum(1)
    for b in range(B):
        if counts[b] == 0:
            continue
        k = int(min(max_predictions, max(1, round(mask_probability * counts[b]))))
        chosen = np.sort(order[b, :k])
        positions[b, :k] = chosen
        valid[b, :k] = True
    return positions, valid


@dataclasses.dataclass(frozen=True)
class Objective:
    """One pre-training objective (``name`` in :data:`OBJECTIVES`, module docstring) and how its
    batches mask: ``mask_id`` replaces ``mask_probability`` of the tokens not in ``keep_ids``
    (unless ``mask_inputs`` is False for ``denoising``); ``prob`` draws ``num_samples`` labels."""
    name: str
    mask_id: int
    keep_ids: Sequence[int]
    mask_probability: float = 0.15
    num_samples: int = 5
    mask_inputs: bool = True

    def __post_init__(self):
        if self.name not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.name!r}")
        object.__setattr__(self, "keep_ids", tuple(int(i) for i in self.keep_ids))


@dataclasses.dataclass(frozen=True)
class Encoder:
    """The shape of the small BERT :func:`pretrain` builds (:func:`build_frozen_bert`)."""
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: Optional[int] = None
    dropout: float = 0.1
    pad_id: int = 0


def build_objective_batch(objective: Objective, token_ids, mechanism: DchiMechanism, eta: float,
                          rng: SeedLike, *, max_predictions: int = 20) -> MlmBatch:
    """(inputs, labels) of one objective (module docstring) for ``[B, L]`` public token ids."""
    spec = objective
    objective, mask_id, keep_ids = spec.name, spec.mask_id, spec.keep_ids
    mask_probability, num_samples, mask_inputs = spec.mask_probability, spec.num_samples, spec.mask_inputs
    eta = check_eta(eta)
    rng = make_rng(rng)
    original = np.asarray(token_ids, dtype=np.int64)
    if original.ndim != 2:
        raise ValueError(f"token_ids must be [B, L], got shape {original.shape}")
    keep = np.asarray(list(keep_ids), dtype=np.int64)
    privatized = privatize_sequences(original, mechanism, eta, rng, keep)
    maskable = ~np.isin(original, keep)
    positions, valid = select_masked_positions(original, maskable, rng, mask_probability, max_predictions)
    rows = np.arange(original.shape[0])[:, None]
    inputs = privatized.copy()
    if objective != "denoising" or mask_inputs:
        masked_rows, masked_slots = np.nonzero(valid)
        inputs[masked_rows, positions[masked_rows, masked_slots]] = mask_id

    if objective == "vanilla":
        labels = privatized[rows, positions][..., None]
    elif objective == "denoising":
        labels = original[rows, positions][..., None]
    else:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        at_mask = np.repeat(original[rows, positions][..., None], num_samples, axis=-1)
        labels = mechanism.privatize_ids(at_mask, eta, rng)
    K = labels.shape[-1]
    weights = np.where(valid[..., None], 1.0 / K, 0.0).astype(np.float32) * np.ones((1, 1, K), np.float32)
    labels = np.where(valid[..., None], labels, 0)
    return MlmBatch(inputs.astype(np.int32), positions, labels.astype(np.int32), weights,
                    original.astype(np.int32))


# ----------------------------------------------------------------------------- training

@dataclasses.dataclass
class PretrainResult:
    models: object  # dpbert.network.bert.BertModels
    objective: str
    eta: float
    losses: List[float]
    seconds: float

    def to_dict(self) -> dict:
        return {"objective": self.objective, "eta": self.eta, "steps": len(self.losses),
                "initial_loss": float(np.mean(self.losses[:5])) if self.losses else None,
                "final_loss": float(np.mean(self.losses[-5:])) if self.losses else None,
                "seconds": self.seconds}


def build_frozen_bert(table: np.ndarray, *, max_seq_length: int, num_layers: int = 2, num_heads: int = 2,
                      intermediate_size: Optional[int] = None, mask_probability: float = 0.15,
                      dropout: float = 0.1, pad_id: int = 0, seed: int = 0):
    """A small ``dpbert.network.bert`` model whose word embeddings are ``table`` and frozen; the
    (untied) MLM output projection starts as a copy of ``table``ᵀ."""
    from dpbert.network import bert as bert_lib

    table = np.asarray(table, np.float32)
    V, d = table.shape
    spec = bert_lib.BertSpec(vocab_size=V, hidden_size=d, num_layers=num_layers, num_heads=num_heads,
                             intermediate_size=intermediate_size or 2 * d, max_seq_length=max_seq_length,
                             max_predictions=bert_lib.max_predictions_for(max_seq_length, mask_probability),
                             dropout=dropout, attention_dropout=dropout, pad_id=pad_id, preset="custom")
    models = bert_lib.build_bert(spec, seed=seed)
    word = models.mlm.get_layer("word_embeddings")
    word.set_weights([table])
    word.trainable = False
    output = models.mlm.get_layer("mlm_output")
    output.set_weights([table.T.copy(), np.zeros(V, np.float32)])
    return models


def weighted_mlm_loss(labels, weights, logits):
    """Σ w·(−log softmax(logits)[label]) / #used slots (TensorFlow)."""
    import tensorflow as tf

    log_probs = tf.nn.log_softmax(logits, axis=-1)                    # [B, M, V]
    picked = tf.gather(log_probs, labels, axis=-1, batch_dims=2)      # [B, M, K]
    used = tf.reduce_sum(tf.cast(tf.reduce_sum(weights, -1) > 0, tf.float32))
    return -tf.reduce_sum(weights * picked) / tf.maximum(used, 1.0)


def pretrain(token_ids, mechanism: DchiMechanism, objective: Objective, eta: float, *,
             encoder: Encoder = Encoder(), steps: int = 100, batch_size: int = 32,
             learning_rate: float = 1e-3, seed: SeedLike = 0, models=None) -> PretrainResult:
    """Privacy-adaptive pre-training of a small BERT (``encoder``) on public ``[n, L]`` token ids.

    Each step draws ``batch_size`` sequences and builds a fresh batch (fresh noise) with
    ``build_objective_batch``. ``models``: continue training these (built by
    ``build_frozen_bert``) instead of a new model.
    """
    import tensorflow as tf
    import tf_keras

    token_ids = np.asarray(token_ids, np.int32)
    rng = make_rng(seed)
    if models is None:
        models = build_frozen_bert(mechanism.table, max_seq_length=token_ids.shape[1],
                                   num_layers=encoder.num_layers, num_heads=encoder.num_heads,
                                   intermediate_size=encoder.intermediate_size,
                                   mask_probability=objective.mask_probability, dropout=encoder.dropout,
                                   pad_id=encoder.pad_id, seed=int(rng.integers(1 << 30)))
    if models.spec.hidden_size != mechanism.dim:
        raise ValueError(f"model hidden size {models.spec.hidden_size} != embedding dimension {mechanism.dim}")
    mlm = models.mlm
    optimizer = tf_keras.optimizers.Adam(learning_rate)
    variables = mlm.trainable_variables
    optimizer.build(variables)  # slots outside the step: a tf.function creating them is traced twice

    @tf.function(autograph=False)  # no tensor-dependent control flow
    def step(input_ids, positions, labels, weights):
        with tf.GradientTape() as tape:
            logits = mlm({"input_ids": input_ids, "masked_positions": positions}, training=True)
            loss = weighted_mlm_loss(labels, weights, logits)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses = []
    start = time.time()
    M = models.spec.max_predictions
    for _ in range(int(steps)):
        rows = rng.integers(0, token_ids.shape[0], size=min(batch_size, token_ids.shape[0]))
        batch = build_objective_batch(objective, token_ids[rows], mechanism, eta, rng, max_predictions=M)
        losses.append(float(step(batch.input_ids, batch.masked_positions, batch.labels, batch.weights)))
    return PretrainResult(models, objective.name, float(eta), losses, time.time() - start)


def mlm_accuracy(models, token_ids, mechanism: DchiMechanism, objective: str, eta: float, *, mask_id: int,
                 keep_ids: Sequence[int], seed: SeedLike = 0, batch_size: int = 64) -> Dict[str, float]:
    """Held-out top-1 accuracy of the objective's own labels (the weighted hit rate for ``prob``)."""
    rng = make_rng(seed)
    hits = total = 0.0
    token_ids = np.asarray(token_ids, np.int32)
    spec = Objective(objective, mask_id, keep_ids)
    for start in range(0, token_ids.shape[0], batch_size):
        batch = build_objective_batch(spec, token_ids[start:start + batch_size], mechanism, eta, rng,
                                      max_predictions=models.spec.max_predictions)
        logits = models.mlm({"input_ids": batch.input_ids, "masked_positions": batch.masked_positions},
                            training=False).numpy()
        predicted = logits.argmax(-1)[..., None]
        hits += float(np.sum(batch.weights * (batch.labels == predicted)))
        total += float(batch.num_predictions)
    return {"accuracy": hits / max(total, 1.0), "predictions": int(total)}


__all__ = ["OBJECTIVES", "Objective", "Encoder", "MlmBatch", "build_objective_batch", "select_masked_positions",
           "privatize_sequences", "build_frozen_bert", "pretrain", "weighted_mlm_loss", "PretrainResult", "mlm_accuracy"]
