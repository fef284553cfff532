"""Did the model learn? A DP readout on the patients' own text, and an ε-free signal on public text.

The readout (``run_readout``, ``dpbert readout``) compares the trained model with its START — the
public start it trained from (``model.init: minilm``: checkpoint + public warm-up, rebuilt from the
run's configuration, no private input) or, after a random start, the uniform guess (loss ln V) —
unit by unit: d_u = the mean over unit u's masked tokens of (start's loss − model's loss), in nats
(> 0: the model predicts u's text better than its start). ONE Gaussian release
(``dpbert.privacy.gaussian_sum``: Σ clip(d_u, ±c) + N(0, (z·c)²), sensitivity c per unit; a noisy
count too when no public count is declared) gives the estimate of the mean d and its 95 % interval,
labelled "DP estimate", and a verdict: learned / worse than its start / cannot tell (0 inside).

The sensitivity's contract, kept here: a unit (a patient; a tuple under privacy.unit: tuple) is
read from its own tuples only — at most ``max_tuples``, its first by record id, tokenized one by
one — masked by its tuples' own record ids and a public seed (``dpbert.engine.masking``), and
scored by two fixed models. The held-out patients are the trainer's (keyed PRF,
``dpbert.data.splits``: a patient's side depends on itself and the key). Without held-out patients
(membership.holdout_patient_fraction = 0) the units are the patients trained on: still DP, but
that measures fit, not generalisation, and the result says so.

The release is reserved in the dataset's ledger through the budget gate (``reserve``, before the
model or a tuple is read: BudgetRefused over the budget) and finalized after (``run_readout``);
ε → noise goes through ``dpbert.accounting`` (``noise_for``).

``public_signal`` needs no ε: both models' MLM loss on public biomedical text shipped in the
package (the BC5CDR test split, which the public warm-up never reads). docs/without-labels.md says
what each number can tell and what the default ε buys.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

DEFAULT_EPSILON = 1.0
DEFAULT_CLIP = 1.0
DEFAULT_SEED = 0
LEVEL = 0.95
MECHANISM = "dp_readout"
#: Rows of the public text scored by ``public_signal`` (its first ones: a public, fixed choice).
PUBLIC_ROWS = 256


@dataclasses.dataclass(frozen=True)
class Units:
    """Rows to score: ``token_ids`` [n, L], each row's ``record_ids`` [n] and ``unit_index`` [n]
    (0..units-1); ``held_out`` False when the units are the patients trained on."""
    token_ids: np.ndarray
    record_ids: np.ndarray
    unit_index: np.ndarray
    units: int
    held_out: bool


def heldout_units(tuples, tokenizer, max_seq_length: int, *, fraction: float, key: Optional[bytes],
                  patient_unit: bool, max_tuples: int) -> Units:
    """The units of ``tuples`` (``WordTuple``s) the readout scores: the held-out patients' (the
    trainer's split at ``fraction`` with ``key``), or every patient's when ``fraction`` is 0."""
    from dpbert.data.splits import is_member, patient_key
    from dpbert.vocab.wordpiece import tokenize_tuples

    groups: Dict[str, list] = {}
    for t in tuples:
        patient = patient_key(t)
        if fraction > 0 and is_member(patient, key, 1.0 - fraction):
            continue
        groups.setdefault(patient if patient_unit else t.tuple_id, []).append((t.record_id, t.words))
    words, records, index = [], [], []
    for u, name in enumerate(sorted(groups)):
        for record_id, unit_words in sorted(groups[name], key=lambda r: r[0])[:int(max_tuples)]:
            words.append(unit_words)
            records.append(record_id)
            index.append(u)
    return Units(tokenize_tuples(tokenizer, words, int(max_seq_length)), np.asarray(records, np.int64),
                 np.asarray(index, np.int64), len(groups), fraction > 0)


def masked(units: Units, specials, mask_id: int, max_predictions: int, mask_probability: float,
           seed: int = DEFAULT_SEED) -> Dict[str, np.ndarray]:
    """Every row masked by its own record id and the public ``seed`` (each chosen token → [MASK])."""
    from dpbert.engine import masking

    keys = masking.example_keys(int(seed), 0, units.record_ids)
    return masking.mask_tokens(units.token_ids, keys, special_token_ids=tuple(specials), mask_token_id=mask_id,
                               vocab_size=None, max_predictions=max_predictions, mask_probability=mask_probability,
                               mask_fraction=1.0, random_fraction=0.0)


def slot_losses(mlm, batch: Dict[str, np.ndarray], batch_size: int = 64) -> np.ndarray:
    """``[n, M]`` cross-entropy (nats) of the true token at each prediction slot; ``mlm`` None: the
    uniform guess over the vocabulary, ln V at every slot."""
    if mlm is None:
        return np.full(batch["masked_labels"].shape, math.log(batch["vocab_size"]), np.float64)
    import tensorflow as tf

    ids, positions, labels = batch["input_ids"], batch["masked_positions"], batch["masked_labels"]
    out = []
    for start in range(0, ids.shape[0], batch_size):
        sl = slice(start, start + batch_size)
        logits = mlm({"input_ids": ids[sl], "masked_positions": positions[sl]}, training=False)
        out.append(np.asarray(tf.keras.losses.sparse_categorical_crossentropy(labels[sl], logits, from_logits=True)))
    return np.concatenate(out).astype(np.float64) if out else np.zeros(labels.shape, np.float64)


def unit_differences(start_losses: np.ndarray, model_losses: np.ndarray, weights: np.ndarray,
                     unit_index: np.ndarray, units: int) -> np.ndarray:
    """``[units]``: each unit's mean over its masked tokens of (start − model); 0 for a unit without one."""
    w = np.asarray(weights, np.float64)
    diff = ((np.asarray(start_losses) - np.asarray(model_losses)) * w).sum(axis=1)
    total = np.bincount(unit_index, weights=diff, minlength=units)
    count = np.bincount(unit_index, weights=w.sum(axis=1), minlength=units)
    return np.divide(total, count, out=np.zeros(units), where=count > 0)


def noise_for(epsilon: float, delta: float, with_count: bool) -> Tuple[float, Optional[float]]:
    """(z_S, z_N): the smallest Gaussian noise multiplier whose ε at ``delta`` is ≤ ``epsilon``
    (``dpbert.accounting``: the solver over the PLD ε, closed form for a Gaussian), split between
    the sum and the count (``gaussian_sum.split``)."""
    import dp_accounting

    from dpbert.accounting.epsilon import epsilon as epsilon_of
    from dpbert.accounting.solver import smallest_sigma
    from dpbert.privacy import _checks, gaussian_sum

    target, delta = _checks.positive("epsilon", epsilon), _checks.probability("delta", delta)
    z = smallest_sigma(lambda s: epsilon_of(dp_accounting.GaussianDpEvent(s), delta, "pld"), target)
    return gaussian_sum.split(z, with_count)


def verdict(low: float, high: float) -> str:
    if low > 0:
        return "learned: better than its start"
    if high < 0:
        return "worse than its start"
    return "cannot tell (the interval contains 0)"


def estimate(released: Dict[str, Any], declared: Optional[float], level: float = LEVEL) -> Dict[str, Any]:
    """The mean difference S̃ / n and its ``level`` interval. ``declared``: a public count n (the
    interval is S̃'s, divided by it); else the released Ñ: each of S and n gets a (1 + level)/2
    interval (Bonferroni) and the mean's interval is the range of S/n over that box, n ≥ 1."""
    from scipy.stats import norm

    s, s_std = released["sum"], released["sum_std"]
    if declared is not None:
        q = norm.ppf(0.5 + level / 2)
        n_low = n_high = n = float(declared)
    else:
        q = norm.ppf(0.5 + (1 + level) / 4)
        n = max(1.0, released["count"])
        n_low = max(1.0, released["count"] - q * released["count_std"])
        n_high = max(n_low, released["count"] + q * released["count_std"])
    corners = [a / b for a in (s - q * s_std, s + q * s_std) for b in (n_low, n_high)]
    low, high = min(corners), max(corners)
    return {"estimate": s / n, "low": low, "high": high, "level": level, "divisor": n,
            "divisor_source": "declared" if declared is not None else "dp_count", "verdict": verdict(low, high)}


def public_signal(model, start, tokenizer, max_predictions: int, mask_probability: float,
                  seed: int = DEFAULT_SEED) -> Dict[str, Any]:
    """ε-free: the MLM loss (nats) of ``model`` and of ``start`` (None: the uniform guess) on the
    first ``PUBLIC_ROWS`` rows of the shipped BC5CDR test text, the same masks for both."""
    from dpbert.evaluate.mlm_loss import masked_batch
    from dpbert.engine.public_warmup import public_rows, public_sentences
    from dpbert.resources.bundled import bundled_bc5cdr_path
    from dpbert.vocab.wordpiece import special_ids

    ids = special_ids(tokenizer)
    rows = public_rows(tokenizer, model.spec.max_seq_length, public_sentences(bundled_bc5cdr_path("test")))
    rows = rows[:PUBLIC_ROWS]
    inputs, positions, labels, weights = masked_batch(rows, tuple(ids), ids.mask, max_predictions,
                                                      mask_probability, seed)
    batch = {"input_ids": inputs, "masked_positions": positions, "masked_labels": labels,
             "vocab_size": model.spec.vocab_size}
    count = float(weights.sum())
    losses = {name: float((slot_losses(m, batch) * weights).sum() / count)
              for name, m in (("model", model.mlm), ("start", None if start is None else start.mlm))}
    return {**losses, "difference": losses["start"] - losses["model"], "masked_tokens": int(count),
            "text": "BC5CDR test split shipped in dpbert/resources/ner/bc5cdr (public)"}


@dataclasses.dataclass(frozen=True)
class Request:
    """What one readout releases: ε at δ, the clip c, the public count (None: a DP count), the
    masks' public seed, and the ledger target (``dpbert.accounting.target.LedgerTarget``)."""
    epsilon: float
    delta: float
    clip: float
    declared: Optional[float]
    target: Any
    output_uri: str
    seed: int = DEFAULT_SEED


@dataclasses.dataclass(frozen=True)
class Charge:
    """A reserved readout: the ledger's reservation, the noise multipliers and their records."""
    reservation: Any
    z_sum: float
    z_count: Optional[float]
    records: tuple


def reserve(request: Request) -> Charge:
    """Reserve the release in the dataset's ledger through the budget gate (BudgetRefused over the
    budget, nothing written): before the model is read, before any tuple is."""
    from dpbert.accounting.target import reserve_event
    from dpbert.privacy import gaussian_sum

    z_sum, z_count = noise_for(request.epsilon, request.delta, request.declared is None)
    records = gaussian_sum.records(z_sum, z_count, request.target.unit)
    return Charge(reserve_event(request.target, MECHANISM, records, request.output_uri), z_sum, z_count,
                  tuple(records))


def run_readout(request: Request, charge: Charge, model, start, tokenizer, read_units: Callable[[], Units],
                mask_probability: float, rng: Optional[np.random.Generator] = None) -> Dict[str, Any]:
    """Read the units (``read_units``: the only access to the private tuples), score them with the
    start and the model, release once and finalize ``charge`` (module docstring). A failure before
    the release leaves the reservation charged at its planned size."""
    from dpbert.accounting.target import finalize_event
    from dpbert.privacy import gaussian_sum
    from dpbert.vocab.wordpiece import special_ids

    units = read_units()
    ids = special_ids(tokenizer)
    batch = dict(masked(units, tuple(ids), ids.mask, model.spec.max_predictions, mask_probability, request.seed),
                 vocab_size=model.spec.vocab_size)
    d = unit_differences(slot_losses(None if start is None else start.mlm, batch), slot_losses(model.mlm, batch),
                         batch["masked_weights"], units.unit_index, units.units)
    released = gaussian_sum.release(d, request.clip, charge.z_sum, charge.z_count, rng)
    finalize_event(charge.reservation, list(charge.records))
    return {"released": released, "result": estimate(released, request.declared), "held_out": units.held_out,
            "epsilon": request.epsilon, "delta": request.delta, "clip": request.clip,
            "noise_multiplier": gaussian_sum.combined(charge.z_sum, charge.z_count), "z_sum": charge.z_sum,
            "z_count": charge.z_count, "ledger_entry": str(charge.reservation), "ledger": charge.reservation.ledger_uri,
            "dataset_id": charge.reservation.dataset_id, "label": "DP estimate",
            "start": "uniform guess (ln V)" if start is None else "public start"}


def interval_half_width(epsilon: float, delta: float, clip: float, units: int, level: float = LEVEL) -> float:
    """The 95 % half-width of the readout's mean over ``units`` with a declared count: what ε buys
    (docs/without-labels.md's table)."""
    from scipy.stats import norm

    z_sum, _ = noise_for(epsilon, delta, False)
    return float(norm.ppf(0.5 + level / 2) * z_sum * clip / units)


__all__: List[str] = ["Units", "heldout_units", "masked", "slot_losses", "unit_differences", "noise_for", "verdict",
                      "estimate", "public_signal", "Request", "Charge", "reserve", "run_readout",
                      "interval_half_width"]
