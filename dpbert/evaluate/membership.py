"""Membership-inference attacks on a pre-trained BERT MLM (Jagannatha et al. 2021).

Setting (as in the paper): the patients are split 70/30 into *training* patients, whose tuples
were used for pre-training (members, b = 1), and *out-of-training* (OOT) patients, whose tuples
never were (non-members, b = 0). A sample is one tuple; its MLM masks are drawn afresh at
evaluation time from a seed (80/10/10 replacement exactly as in training,
``dpbert.engine.masking.mask_with_seed``), the same masks for every model evaluated with the same
seed. Members and non-members come from ``dpbert.data.splits.split_patients``: the split the
trainer holds patients out with, recomputed from its seed.

Contract: per-sample features (:func:`sample_losses`, :func:`attention_features`,
:func:`gradient_features`), the attacks S-BBA, A-BBA, P-BBA, S-AWBA, S-GWBA (white-box regressions
fitted and evaluated on disjoint PATIENTS), their metrics (:func:`advantage`, :func:`auc`,
:func:`roc_curve`, :func:`max_advantage`) and the bounds an (ε, δ) guarantee puts on them
(:func:`advantage_bound`, :func:`group_privacy`). TensorFlow and scikit-learn are imported
lazily: the split, the metrics and the bounds need neither. Features, attacks, metrics and the
bounds' derivation: docs/audits.md ("Membership inference").
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from dpbert.vocab.wordpiece import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_IDS, UNK_ID  # noqa: F401

log = logging.getLogger(__name__)

ATTACKS = ("S-BBA", "A-BBA", "P-BBA", "S-AWBA", "S-GWBA")
ATTENTION_STATS = ("mean", "median", "p05", "p95")
MAX_ROC_POINTS = 200
#: run_attacks' entry for an attack that could not run (too few patients for the white-box split).
SKIPPED = {"advantage": None, "auc": None, "n": 0}
ATTACKER_TRAIN_FRACTION = 0.2
_MASK_SEED_SALT = 0x4D49  # "MI": evaluation masks come from their own seed stream, [seed, salt + draw]


class TooFewPatientsError(ValueError):
    """The white-box attacks need two patients of each class (one to fit on, one to evaluate)."""


# --------------------------------------------------------------------------------------------
# Patients: the evaluated samples (the split: dpbert.data.splits)
# --------------------------------------------------------------------------------------------

def select_samples(patient_ids: Sequence[Hashable], is_member: Sequence[bool], max_samples: int,
                   seed: int = 0, max_per_patient: Optional[int] = None,
                   min_patients: Optional[int] = None) -> np.ndarray:
    """Indices (sorted) of at most ``max_samples`` samples, at most half from each class, taken
    patient by patient in a seeded random order, the last patient truncated to fill the quota.

    Whole patients suit the group attacks; the white-box attacks' patient-level split needs
    several patients per class. ``max_per_patient`` caps the tuples taken from one patient (a
    random subset); ``min_patients`` caps them at ceil(quota / min(min_patients, patients of the
    class)), i.e. spreads each class's quota over at least that many patients when it has them.
    """
    is_member = np.asarray(is_member, dtype=bool)
    if len(patient_ids) != is_member.shape[0]:
        raise ValueError("patient_ids and is_member differ in length")
    if max_samples < 2:
        raise ValueError("max_samples must be >= 2")
    if (max_per_patient is not None and max_per_patient < 1) or (min_patients is not None and min_patients < 1):
        raise ValueError("max_per_patient and min_patients must be >= 1")
    rng = np.random.default_rng([int(seed), 0x5E1])
    chosen: List[int] = []
    for label in (True, False):
        by_patient: Dict[Hashable, List[int]] = {}
        for i in np.flatnonzero(is_member == label):
            by_patient.setdefault(patient_ids[i], []).append(int(i))
        quota = int(max_samples) // 2
        cap = max_per_patient
        if min_patients is not None and by_patient:
            spread = -(-quota // min(int(min_patients), len(by_patient)))
            cap = spread if cap is None else min(cap, spread)
        order = sorted(by_patient, key=str)
        for j in rng.permutation(len(order)):
            if quota <= 0:
                break
            rows = by_patient[order[j]]
            if cap is not None and len(rows) > cap:
                rows = sorted(rng.choice(rows, size=int(cap), replace=False).tolist())
            rows = rows[:quota]
            chosen.extend(rows)
            quota -= len(rows)
    return np.asarray(sorted(chosen), dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

def _labels(is_member) -> np.ndarray:
    y = np.asarray(is_member)
    if y.ndim != 1:
        raise ValueError("is_member must be 1-D")
    return y.astype(bool)


def advantage(is_member, predicted_member) -> float:
    """Pr[A=0 | b=0] − Pr[A=0 | b=1] = TPR − FPR of the attack's decisions (b = 1: member).
    NaN if a class is absent."""
    y, a = _labels(is_member), _labels(predicted_member)
    if y.shape != a.shape:
        raise ValueError("is_member and predicted_member differ in shape")
    if y.all() or not y.any():
        return float("nan")
    return float(np.mean(~a[~y]) - np.mean(~a[y]))


def auc(is_member, scores) -> float:
    """Area under the ROC curve of ``scores`` (higher = more likely a member); NaN if a class is
    absent. 0.5 is chance."""
    from sklearn.metrics import roc_auc_score

    y = _labels(is_member)
    if y.all() or not y.any():
        return float("nan")
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64)))


def downsample_curve(fpr, tpr, max_points: int = MAX_ROC_POINTS) -> Tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points of a ROC curve, evenly spaced in index, first and last kept."""
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    if max_points < 2:
        raise ValueError("max_points must be >= 2")
    if fpr.shape[0] <= max_points:
        return fpr, tpr
    idx = np.unique(np.round(np.linspace(0, fpr.shape[0] - 1, max_points)).astype(np.int64))
    return fpr[idx], tpr[idx]


def roc_curve(is_member, scores, max_points: int = MAX_ROC_POINTS) -> Tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) of ``scores`` from (0, 0) to (1, 1), downsampled to ≤ ``max_points``."""
    from sklearn import metrics

    y = _labels(is_member)
    if y.all() or not y.any():
        return np.array([0.0, 1.0]), np.array([0.0, 1.0]) * float("nan")
    fpr, tpr, _ = metrics.roc_curve(y, np.asarray(scores, dtype=np.float64))
    return downsample_curve(fpr, tpr, max_points)


def max_advantage(is_member, scores) -> float:
    """max over thresholds of |TPR − FPR| (tensorflow-privacy's "attacker advantage"). Optimistic
    when read off the evaluation set itself: the threshold is chosen knowing the labels."""
    from sklearn import metrics

    y = _labels(is_member)
    if y.all() or not y.any():
        return float("nan")
    fpr, tpr, _ = metrics.roc_curve(y, np.asarray(scores, dtype=np.float64))
    return float(np.max(np.abs(tpr - fpr)))


def advantage_bound(epsilon: float, delta: float = 0.0) -> float:
    """Largest TPR − FPR any attack can reach on an (ε, δ)-DP mechanism: (e^ε − 1 + 2δ)/(e^ε + 1),
    capped at 1."""
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError("need epsilon >= 0 and delta in [0, 1]")
    if math.isinf(epsilon):
        return 1.0
    e = math.exp(min(epsilon, 700.0))
    return min(1.0, (e - 1.0 + 2.0 * delta) / (e + 1.0))


def group_privacy(epsilon: float, delta: float, k: int, tight: bool = False) -> Tuple[float, float]:
    """(ε_k, δ_k) = (k·ε, k·e^{(k−1)ε}·δ): what an (ε, δ) guarantee for one unit (a tuple) gives
    a group of k units (a patient with k tuples). ``tight=True``: δ_k = δ·Σ_{j<k} e^{jε}, which the
    chaining argument actually gives (≤ the standard form). ``δ_k`` is capped at 1 (vacuous)."""
    k = int(k)
    if k < 1:
        raise ValueError("k must be >= 1")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError("need epsilon >= 0 and delta in [0, 1]")
    if delta == 0:
        return k * epsilon, 0.0
    if tight:
        # log Σ_{j<k} e^{jε} without overflow
        log_sum = float(np.logaddexp.reduce(np.arange(k, dtype=np.float64) * epsilon))
        log_delta = log_sum + math.log(delta)
    else:
        log_delta = math.log(k) + (k - 1) * epsilon + math.log(delta)
    return k * epsilon, 1.0 if log_delta >= 0 else math.exp(log_delta)


# --------------------------------------------------------------------------------------------
# Attacks on given scores / features
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class AttackResult:
    """One attack on ``n`` evaluated units (samples or groups). ``scores``: higher = member."""

    name: str
    is_member: np.ndarray
    scores: np.ndarray
    predicted_member: np.ndarray
    threshold: Optional[float] = None

    @property
    def n(self) -> int:
        return int(self.is_member.shape[0])

    @property
    def advantage(self) -> float:
        return advantage(self.is_member, self.predicted_member)

    @property
    def auc(self) -> float:
        return auc(self.is_member, self.scores)

    def summary(self, max_points: int = MAX_ROC_POINTS) -> Dict:
        """``{"advantage", "auc", "roc": {"fpr", "tpr"}, "n"}`` (plain floats / lists)."""
        fpr, tpr = roc_curve(self.is_member, self.scores, max_points)
        return {"advantage": _num(self.advantage), "auc": _num(self.auc),
                "roc": {"fpr": [round(float(x), 6) for x in fpr], "tpr": [_num(x, 6) for x in tpr]},
                "n": self.n}


def _num(x, digits: Optional[int] = None):
    x = float(x)
    if math.isnan(x):
        return None
    return round(x, digits) if digits is not None else x


def loss_threshold_attack(losses, is_member, threshold: Optional[float] = None,
                          name: str = "S-BBA") -> AttackResult:
    """S-BBA: member iff loss < ``threshold`` (default: the mean loss of the members)."""
    losses = np.asarray(losses, dtype=np.float64)
    y = _labels(is_member)
    if losses.shape != y.shape:
        raise ValueError("losses and is_member differ in shape")
    if threshold is None:
        if not y.any():
            raise ValueError("no member sample to set the threshold from")
        threshold = float(losses[y].mean())
    return AttackResult(name, y, -losses, losses < threshold, float(threshold))


def group_means(values, groups: Sequence[Optional[Hashable]]
                ) -> Tuple[List[Hashable], np.ndarray, np.ndarray]:
    """(group keys in first-appearance order, mean of each group's own values, sizes); entries
    whose group is ``None`` are ignored."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape[0] != len(groups):
        raise ValueError("values and groups differ in length")
    index: Dict[Hashable, int] = {}
    codes = np.full(values.shape[0], -1, dtype=np.int64)
    for i, g in enumerate(groups):
        if g is not None:
            codes[i] = index.setdefault(g, len(index))
    keep = codes >= 0
    sizes = np.bincount(codes[keep], minlength=len(index)).astype(np.int64)
    sums = np.bincount(codes[keep], weights=values[keep], minlength=len(index))
    return list(index), sums / np.maximum(sizes, 1), sizes


def group_threshold_attack(losses, is_member, groups: Sequence[Optional[Hashable]], threshold: float,
                           name: str) -> AttackResult:
    """A-BBA / P-BBA: member iff the mean loss of the group's samples < ``threshold``."""
    y = _labels(is_member)
    keys, means, _ = group_means(losses, groups)
    _, member_frac, _ = group_means(y.astype(np.float64), groups)
    if np.any((member_frac > 0) & (member_frac < 1)):
        raise ValueError(f"{name}: a group mixes member and non-member samples")
    labels = member_frac > 0.5
    return AttackResult(name, labels, -means, means < threshold, float(threshold))


def attacker_split(patient_ids: Optional[Sequence[Hashable]], is_member,
                   train_fraction: float = ATTACKER_TRAIN_FRACTION, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """(fit indices, evaluation indices) for the white-box attacks: disjoint, covering every
    sample, whole patients on one side (``patient_ids=None``: each sample its own group), for
    each class about ``train_fraction`` of its samples fitted on, at least one patient of each
    class on each side."""
    y = _labels(is_member)
    if patient_ids is None:
        patient_ids = list(range(y.shape[0]))
    if len(patient_ids) != y.shape[0]:
        raise ValueError("patient_ids and is_member differ in length")
    if not 0 < train_fraction < 1:
        raise ValueError("train_fraction must be in (0, 1)")
    rng = np.random.default_rng([int(seed), 0xA77])
    fit: List[int] = []
    for label in (True, False):
        by_patient: Dict[Hashable, List[int]] = {}
        for i in np.flatnonzero(y == label):
            by_patient.setdefault(patient_ids[i], []).append(int(i))
        if len(by_patient) < 2:
            raise TooFewPatientsError(f"the white-box attacks need >= 2 {'member' if label else 'non-member'} "
                             f"patients (one to fit, one to evaluate)")
        order = sorted(by_patient, key=str)
        order = [order[j] for j in rng.permutation(len(order))]
        target = train_fraction * sum(len(v) for v in by_patient.values())
        taken = 0
        for j, p in enumerate(order):
            rows = by_patient[p]
            # Always one patient to fit on and one to evaluate on; otherwise stop at the target.
            if j > 0 and (j == len(order) - 1 or taken + len(rows) / 2.0 > target):
                break
            fit.extend(rows)
            taken += len(rows)
    fit_idx = np.asarray(sorted(fit), dtype=np.int64)
    eval_mask = np.ones(y.shape[0], dtype=bool)
    eval_mask[fit_idx] = False
    return fit_idx, np.flatnonzero(eval_mask)


def _default_classifier(seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(),
                         LogisticRegression(max_iter=2000, class_weight="balanced", random_state=seed))


def logistic_attack(features, is_member, fit_idx, eval_idx, name: str, seed: int = 0,
                    classifier_factory: Optional[Callable[[int], object]] = None) -> AttackResult:
    """Fit ``classifier_factory(seed)`` (default: standardise + balanced logistic regression) on
    the rows ``fit_idx``, score the rows ``eval_idx`` (which must be disjoint from them); member
    iff the predicted probability ≥ 1/2."""
    X = np.asarray(features, dtype=np.float64)
    y = _labels(is_member)
    fit_idx, eval_idx = np.asarray(fit_idx, dtype=np.int64), np.asarray(eval_idx, dtype=np.int64)
    if np.intersect1d(fit_idx, eval_idx).size:
        raise ValueError(f"{name}: a sample is both fitted and evaluated on")
    if not np.isfinite(X).all():
        raise ValueError(f"{name}: non-finite features")
    clf = (classifier_factory or _default_classifier)(seed)
    clf.fit(X[fit_idx], y[fit_idx])
    proba = np.asarray(clf.predict_proba(X[eval_idx]))[:, 1]
    return AttackResult(name, y[eval_idx], proba, proba >= 0.5)


# --------------------------------------------------------------------------------------------
# Features from a model (TensorFlow)
# --------------------------------------------------------------------------------------------

_MASKED_KEYS = ("input_ids", "masked_positions", "masked_labels", "masked_weights")


def _mask_seed(seed: int, draw: int = 0):
    """(seed, draw) of ``masking.mask_with_seed`` for the evaluation masks."""
    return int(seed), _MASK_SEED_SALT + int(draw)


def _masked_inputs(models, token_ids: np.ndarray, seed: int, draw: int, special_token_ids, mask_token_id,
                   mask_probability: float):
    from dpbert.engine import masking

    masked = masking.mask_with_seed(
        token_ids, *_mask_seed(seed, draw), special_token_ids=special_token_ids, mask_token_id=mask_token_id,
        vocab_size=models.spec.vocab_size, max_predictions=models.spec.max_predictions,
        mask_probability=mask_probability, pad_id=models.spec.pad_id)
    return {k: masked[k] for k in _MASKED_KEYS}


def _check_ids(models, token_ids) -> np.ndarray:
    ids = np.asarray(token_ids)
    L = models.spec.max_seq_length
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_ids must be an integer array [n, L], got {ids.dtype} {ids.shape}")
    if ids.shape[1] > L:
        raise ValueError(f"sequences of length {ids.shape[1]} exceed the model's {L}")
    if ids.shape[1] < L:
        ids = np.pad(ids, [(0, 0), (0, L - ids.shape[1])], constant_values=models.spec.pad_id)
    if ids.size and (ids.min() < 0 or ids.max() >= models.spec.vocab_size):
        raise ValueError("token ids outside the model's vocabulary")
    return ids.astype(np.int32)


def _batches(n: int, batch_size: int):
    for start in range(0, n, batch_size):
        yield slice(start, min(n, start + batch_size))


def _compiled(fn, n: int, batch_size: int, compile_: Optional[bool]):
    """``fn`` as a ``tf.function`` when worth it: tracing a BERT costs seconds, eager execution
    costs Python overhead per batch. ``compile_=None``: compile from 32 batches on."""
    import tensorflow as tf

    if compile_ is None:
        compile_ = -(-n // batch_size) >= 32
    return tf.function(fn, reduce_retracing=True, autograph=False) if compile_ else fn  # plain Python control flow


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    if array.shape[0] == rows:
        return array
    return np.concatenate([array, np.zeros((rows - array.shape[0],) + array.shape[1:], array.dtype)])


def sample_losses(models, token_ids, seed: int, *, special_token_ids: Sequence[int] = SPECIAL_IDS,
                  mask_token_id: int = MASK_ID, mask_probability: float = 0.15, num_masks: int = 1,
                  batch_size: int = 64, compile: Optional[bool] = None) -> np.ndarray:
    """Per-sample MLM loss ``[n]`` (float64) under masks drawn from ``seed``; with ``num_masks``
    > 1 the mean over that many independent mask draws (draw 0 is the one
    :func:`gradient_features` uses). A sample with no maskable token has loss 0."""
    import tensorflow as tf

    from dpbert.mechanism import clipping

    ids = _check_ids(models, token_ids)
    n = ids.shape[0]
    out = np.zeros(n, dtype=np.float64)

    def loss_fn(input_ids, positions, labels, weights):
        logits = models.mlm({"input_ids": input_ids, "masked_positions": positions}, training=False)
        return clipping.per_example_mlm_loss(labels, logits, weights)

    loss_fn = _compiled(loss_fn, n * int(num_masks), batch_size, compile)

    for draw in range(int(num_masks)):
        m = _masked_inputs(models, ids, seed, draw, special_token_ids, mask_token_id, mask_probability)
        for sl in _batches(n, batch_size):
            rows = sl.stop - sl.start
            args = [_pad_rows(m[k][sl], batch_size) for k in _MASKED_KEYS]
            out[sl] += np.asarray(loss_fn(*args), dtype=np.float64)[:rows]
    return out / int(num_masks)


def attention_concentration(probs: np.ndarray) -> np.ndarray:
    """C(a) = Σ_j a_j log a_j over the last axis (0·log 0 = 0): ``[..., L, L]`` → ``[..., L]``."""
    from scipy.special import xlogy

    probs = np.asarray(probs, dtype=np.float64)
    return xlogy(probs, probs).sum(axis=-1)


def masked_summaries(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mean, median, 5th and 95th percentile (numpy's linear interpolation) of ``values`` over
    the last axis where ``valid``: ``[..., L]`` → ``[..., 4]``. ``valid`` broadcasts against
    ``values``; a row with no valid entry gives zeros."""
    values = np.asarray(values, dtype=np.float64)
    valid = np.broadcast_to(np.asarray(valid, dtype=bool), values.shape)
    count = valid.sum(axis=-1)
    filled = np.where(valid, values, np.inf)  # invalid entries sort last
    ordered = np.sort(filled, axis=-1)
    ordered = np.where(np.arange(values.shape[-1]) < count[..., None], ordered, 0.0)
    safe = np.maximum(count, 1)
    mean = np.where(valid, values, 0.0).sum(axis=-1) / safe
    stats = [mean]
    for q in (0.5, 0.05, 0.95):
        h = (safe - 1) * q
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, safe - 1)
        v_lo = np.take_along_axis(ordered, lo[..., None], axis=-1)[..., 0]
        v_hi = np.take_along_axis(ordered, hi[..., None], axis=-1)[..., 0]
        stats.append(v_lo + (h - lo) * (v_hi - v_lo))
    out = np.stack(stats, axis=-1)
    return np.where((count > 0)[..., None], out, 0.0)


def attention_feature_names(num_layers: int, num_heads: int) -> List[str]:
    return [f"layer_{l}_head_{h}_{s}" for l in range(num_layers) for h in range(num_heads)
            for s in ATTENTION_STATS]


def attention_features(models, token_ids, *, batch_size: int = 32,
                       compile: Optional[bool] = None) -> np.ndarray:
    """``[n, layers · heads · 4]``: per layer and head, mean / median / p05 / p95 over the
    sample's non-padding query tokens of the attention concentration Σ_j a_j log a_j."""
    import tensorflow as tf

    ids = _check_ids(models, token_ids)
    spec = models.spec
    n = ids.shape[0]

    def concentration(input_ids):
        probs = models.encoder(input_ids, training=False)["attention_probs"]  # layers × [B, heads, L, L]
        # Reduce each layer before stacking: [B, layers, heads, L], never [B, layers, heads, L, L].
        return tf.stack([tf.reduce_sum(tf.math.xlogy(p, p), axis=-1) for p in probs], axis=1)

    concentration = _compiled(concentration, n, batch_size, compile)

    out = np.zeros((n, spec.num_layers, spec.num_heads, len(ATTENTION_STATS)), dtype=np.float64)
    for sl in _batches(n, batch_size):
        rows = sl.stop - sl.start
        c = np.asarray(concentration(_pad_rows(ids[sl], batch_size)), dtype=np.float64)[:rows]
        valid = (ids[sl] != spec.pad_id)[:, None, None, :]
        out[sl] = masked_summaries(c, valid)
    return out.reshape(n, -1)


def gradient_feature_names(models) -> List[str]:
    """The layers of :func:`gradient_features`, in column order (the model's layer order)."""
    return [layer.name for layer in models.mlm.layers if layer.trainable_variables]


def gradient_features(models, token_ids, seed: int, *, special_token_ids: Sequence[int] = SPECIAL_IDS,
                      mask_token_id: int = MASK_ID, mask_probability: float = 0.15,
                      batch_size: int = 16, compile: Optional[bool] = None) -> np.ndarray:
    """``[n, len(gradient_feature_names(models))]``: per layer, ‖∇_layer ℓ_i‖² of sample i's MLM
    loss under mask draw 0 of ``seed`` (the masks of :func:`sample_losses`), by ghost norms."""
    import tensorflow as tf
    from tensorflow_privacy.privacy.fast_gradient_clipping import gradient_clipping_utils

    from dpbert.mechanism import clipping
    from dpbert.mechanism import ghost

    ids = _check_ids(models, token_ids)
    n = ids.shape[0]
    names = gradient_feature_names(models)
    column = {name: i for i, name in enumerate(names)}

    def per_layer_sqr_norms(input_ids, positions, labels, weights):
        entries = []
        cache: Dict = {}  # shared by the layers of one pass, as in ghost.clipped_gradient_sum
        tape = tf.GradientTape(watch_accessed_variables=False)

        def generator(layer, args, kwargs):
            kwargs = dict(kwargs)
            if getattr(layer, "_expects_training_arg", False):
                kwargs["training"] = False
            if layer.trainable_variables:
                fn = ghost.REGISTRY.get(type(layer))
                if fn is None:
                    raise NotImplementedError(f"layer {layer.name!r} ({type(layer).__name__}) has no "
                                              f"ghost-norm function")
                outputs, entry = fn(layer, args, kwargs, tape, cache)
                entries.append((layer.name, entry))
                return outputs, None
            return layer(*args, **kwargs), None

        with tape:
            logits, _ = gradient_clipping_utils.model_forward_pass(
                models.mlm, {"input_ids": input_ids, "masked_positions": positions}, generator_fn=generator)
            total = tf.reduce_sum(clipping.per_example_mlm_loss(labels, logits, weights))
        flat = [t for _, e in entries for t in e.base]
        grads = tape.gradient(total, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        columns = [None] * len(names)
        start = 0
        for name, e in entries:
            columns[column[name]] = e.sqr_norm_fn(grads[start:start + len(e.base)])
            start += len(e.base)
        if any(c is None for c in columns):
            raise RuntimeError("a layer with weights was not reached by the forward pass")
        return tf.stack(columns, axis=1)

    compiled = _compiled(per_layer_sqr_norms, n, batch_size, compile)
    m = _masked_inputs(models, ids, seed, 0, special_token_ids, mask_token_id, mask_probability)
    out = np.zeros((n, len(names)), dtype=np.float64)
    for sl in _batches(n, batch_size):
        rows = sl.stop - sl.start
        args = [_pad_rows(m[k][sl], batch_size) for k in _MASKED_KEYS]
        out[sl] = np.asarray(compiled(*args), dtype=np.float64)[:rows]
    return np.maximum(out, 0.0)


# --------------------------------------------------------------------------------------------
# Everything
# --------------------------------------------------------------------------------------------

def _log_gradient_features(g: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(g, 0.0) + 1e-30)


@dataclasses.dataclass(frozen=True)
class AttackSettings:
    """How the attacks query the model: the masking of :func:`sample_losses` /
    :func:`gradient_features` (``special_token_ids`` never masked, ``mask_token_id``,
    ``mask_probability``, ``num_masks`` draws per sample), the share of patients the white-box
    attacker fits on, and the batch size."""
    special_token_ids: Sequence[int] = SPECIAL_IDS
    mask_token_id: int = MASK_ID
    mask_probability: float = 0.15
    num_masks: int = 1
    attacker_train_fraction: float = ATTACKER_TRAIN_FRACTION
    batch_size: int = 32


def run_attack_results(models, token_ids, patient_ids: Sequence[Hashable],
                       admission_ids: Optional[Sequence[Optional[Hashable]]], is_member, seed: int = 0, *,
                       settings: AttackSettings = AttackSettings(), attacks: Sequence[str] = ATTACKS,
                       classifier_factory: Optional[Callable[[int], object]] = None) -> Dict[str, AttackResult]:
    """The attacks of :func:`run_attacks` as :class:`AttackResult` objects (scores, decisions).
    The white-box attacks are left out (with a warning) when a class has fewer than two patients;
    ``classifier_factory(seed)`` replaces their logistic regression (tests)."""
    num_masks, batch_size = settings.num_masks, settings.batch_size
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        raise ValueError(f"unknown attacks {unknown} (known: {', '.join(ATTACKS)})")
    ids = _check_ids(models, token_ids)
    y = _labels(is_member)
    n = ids.shape[0]
    if y.shape[0] != n or len(patient_ids) != n:
        raise ValueError("token_ids, patient_ids and is_member differ in length")
    if admission_ids is not None and len(admission_ids) != n:
        raise ValueError("admission_ids and token_ids differ in length")
    if y.all() or not y.any():
        raise ValueError("need both member and non-member samples")
    mask_kwargs = dict(special_token_ids=settings.special_token_ids, mask_token_id=settings.mask_token_id,
                       mask_probability=settings.mask_probability)
    results: Dict[str, AttackResult] = {}
    if {"S-BBA", "A-BBA", "P-BBA"} & set(attacks):
        losses = sample_losses(models, ids, seed, num_masks=num_masks, batch_size=batch_size, **mask_kwargs)
        s_bba = loss_threshold_attack(losses, y)
        threshold = s_bba.threshold
        if "S-BBA" in attacks:
            results["S-BBA"] = s_bba
        if "A-BBA" in attacks:
            groups = ([None] * n if admission_ids is None else
                      [None if a is None else (patient_ids[i], a) for i, a in enumerate(admission_ids)])
            results["A-BBA"] = group_threshold_attack(losses, y, groups, threshold, "A-BBA")
        if "P-BBA" in attacks:
            results["P-BBA"] = group_threshold_attack(losses, y, list(patient_ids), threshold, "P-BBA")
    white_box = [a for a in ("S-AWBA", "S-GWBA") if a in attacks]
    try:
        fit_idx, eval_idx = (attacker_split(patient_ids, y, settings.attacker_train_fraction, seed) if white_box
                             else (None, None))
    except TooFewPatientsError as err:
        log.warning("membership: %s skipped: %s", " and ".join(white_box), err)
        white_box = []
    if white_box:
        if "S-AWBA" in attacks:
            feats = attention_features(models, ids, batch_size=batch_size)
            results["S-AWBA"] = logistic_attack(feats, y, fit_idx, eval_idx, "S-AWBA", seed, classifier_factory)
        if "S-GWBA" in attacks:
            feats = gradient_features(models, ids, seed, batch_size=max(1, batch_size // 2), **mask_kwargs)
            results["S-GWBA"] = logistic_attack(_log_gradient_features(feats), y, fit_idx, eval_idx,
                                                "S-GWBA", seed, classifier_factory)
    return {name: results[name] for name in ATTACKS if name in results}


def run_attacks(models, token_ids, patient_ids: Sequence[Hashable],
                admission_ids: Optional[Sequence[Optional[Hashable]]], is_member, seed: int = 0, *,
                max_roc_points: int = MAX_ROC_POINTS, **kwargs) -> Dict[str, Dict]:
    """Run the five attacks on ``models`` (``dpbert.network.bert.BertModels``).

    ``token_ids`` ``[n, L]`` (padded with the model's pad id), ``patient_ids`` / ``admission_ids``
    (None entries: no admission) / ``is_member`` per sample. Returns ``{attack: {"advantage",
    "auc", "roc": {"fpr": [...], "tpr": [...]}, "n"}}`` for ``"S-BBA", "A-BBA", "P-BBA",
    "S-AWBA", "S-GWBA"``; ``n`` counts the units evaluated (samples, admissions, patients, or the
    white-box attacks' evaluation samples). NaN metrics (a class missing) are ``None``; an attack
    that could not run has ``n = 0``, ``None`` metrics and an empty curve. Keyword arguments go
    to :func:`run_attack_results`.
    """
    results = run_attack_results(models, token_ids, patient_ids, admission_ids, is_member, seed, **kwargs)
    wanted = kwargs.get("attacks", ATTACKS)
    return {name: _summary_or_skipped(results.get(name), max_roc_points) for name in ATTACKS if name in wanted}


def _summary_or_skipped(result: Optional[AttackResult], max_roc_points: int) -> Dict:
    if result is None or result.n == 0:
        return dict(SKIPPED, roc={"fpr": [], "tpr": []})
    return result.summary(max_roc_points)


__all__ = [
    "ATTACKS", "SPECIAL_IDS", "AttackResult", "AttackSettings", "select_samples", "advantage", "auc", "roc_curve", "downsample_curve",
    "max_advantage", "advantage_bound", "group_privacy", "loss_threshold_attack", "group_means",
    "group_threshold_attack", "attacker_split", "logistic_attack", "sample_losses",
    "attention_concentration", "masked_summaries", "attention_features", "attention_feature_names",
    "gradient_features", "gradient_feature_names", "run_attack_results", "run_attacks", "TooFewPatientsError",
]
