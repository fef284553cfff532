"""The MLM pieces of a training run: the mask token, the host-side masking and the step's
prepare / loss / metrics functions (``dpbert.mechanism.step.DPSGDTrainStep``), BERT's learning-rate schedule and
the optimizer."""
from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf
import tf_keras

from dpbert.mechanism import clipping
from dpbert.network import bert as bert_lib
from dpbert.engine import masking
from dpbert.engine import optimizers

MASK_TOKEN_NAMES = ("[MASK]", "<mask>", "MASK")


class WarmupLinearDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """BERT's schedule: linear warmup 0 → peak over ``warmup_steps``, then linear decay to 0 at
    ``total_steps``."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak, self.warmup_steps, self.total_steps = float(peak), int(warmup_steps), int(total_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        total = tf.cast(max(self.total_steps, self.warmup_steps + 1), tf.float32)
        up = self.peak * (step + 1.0) / warmup
        down = self.peak * tf.maximum(total - step, 0.0) / tf.maximum(total - float(self.warmup_steps), 1.0)
        return tf.where(step < float(self.warmup_steps), up, down)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


def make_optimizer(training_config, total_steps: int):
    """``training.optimizer`` (AdamW or DP-AdamBC: ``dpbert.engine.optimizers``; decoupled weight
    decay, not on LayerNorm or biases) with ``WarmupLinearDecay``."""
    schedule = WarmupLinearDecay(training_config.learning_rate, training_config.warmup_steps, total_steps)
    optimizer = optimizers.make(training_config, schedule)
    optimizer.dpbert_schedule = schedule
    return optimizer


def mask_token_id_of(special_token_ids, mask_token_id):
    if mask_token_id is not None:
        return int(mask_token_id)
    if isinstance(special_token_ids, Mapping):
        for name in MASK_TOKEN_NAMES:
            if name in special_token_ids:
                return int(special_token_ids[name])
    raise ValueError("pass special_token_ids as a mapping with '[MASK]', or mask_token_id=")


def make_mlm_functions(spec: bert_lib.BertSpec, special_ids: Sequence[int], mask_token_id: int,
                       mask_probability: float):
    """(mask_fn, prepare_fn, loss_fn, metrics_fn) for ``dpbert.mechanism.step.DPSGDTrainStep`` on the MLM model.

    ``mask_fn(token_ids [b, L], keys [b]) -> features`` masks on the host (``dpbert.engine.masking``,
    keys from ``masking.example_keys(secret key, step, example ids)``); ``prepare_fn(features)``
    splits them into model inputs and targets inside the step.
    """

    def mask_fn(token_ids, keys):
        masked = masking.mask_tokens(
            token_ids, keys, special_token_ids=special_ids, mask_token_id=mask_token_id,
            vocab_size=spec.vocab_size, max_predictions=spec.max_predictions,
            mask_probability=mask_probability, pad_id=spec.pad_id)
        return {k: masked[k] for k in ("input_ids", "masked_positions", "masked_labels", "masked_weights")}

    def prepare_fn(features):
        inputs = {"input_ids": features["input_ids"], "masked_positions": features["masked_positions"]}
        return inputs, (features["masked_labels"], features["masked_weights"])

    def loss_fn(targets, logits):
        labels, weights = targets
        return clipping.per_example_mlm_loss(labels, logits, weights)

    def metrics_fn(targets, logits, example_mask, group_size: int = 1):
        labels, weights = targets
        weights = weights * example_mask[:, tf.newaxis]
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
        per_example = tf.math.divide_no_nan(tf.reduce_sum(correct * weights, axis=1), tf.reduce_sum(weights, axis=1))
        if group_size > 1:  # per patient: the mean accuracy of its own tuples, still in [0, 1]
            accuracy_sum = tf.reduce_sum(clipping.group_mean(per_example * example_mask, example_mask, group_size))
        else:
            accuracy_sum = tf.reduce_sum(per_example * example_mask)
        return {"correct": tf.reduce_sum(correct * weights), "predictions": tf.reduce_sum(weights),
                # Σ_i accuracy_i ∈ [0, 1] per unit: sensitivity 1 (dpbert.mechanism.integrity).
                "accuracy_sum": accuracy_sum}

    return mask_fn, prepare_fn, loss_fn, metrics_fn

