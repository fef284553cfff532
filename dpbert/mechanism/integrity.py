"""Run-time integrity checks on the REAL training run: what the audit canaries cannot see.

The white-box audit (``dpbert.privacy.whitebox_audit``) adds its gradient canaries to the clipped
sum AFTER the clipping and outside the sampler, and scores them at the CLAIMED σ: a sampler whose
q is off, broken clipping of real examples, or a claim beyond the audit's reach passes it. The
checks here run inside the training loop on the running objects (:class:`RunChecks`), each with
positive controls (deliberately broken mechanisms, test fixtures in
``tests/model/broken_mechanisms.py``) that the check catches.

Contract: a failed check raises :class:`IntegrityCheckFailed` (the run fails, nothing is
released) after writing the statistics to ``integrity_checks.json`` in the PRIVATE state
directory; the messages carry no raw text and no exact count. Every p-value is exact or a
rigorous bound (``dpbert.privacy.integrity_stats``); an honest run fails a statistical family with
probability ≤ 1e-6 and any of the four (units per step, participation, noise, released
diagnostics) with probability ≤ 4e-6. The checks — the sampler, brute-force clipping, the noise
on the real step, the released diagnostics, patient groups, the step log at resume — their
statistics, levels and what each catches: docs/audits.md ("The run-time checks in detail").
"""
from __future__ import annotations

import dataclasses
import json
import math
import secrets
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from dpbert import storage
from dpbert.mechanism import step as step_lib
from dpbert.mechanism import sampling
from dpbert.privacy import integrity_stats as stats
from dpbert.privacy.event_check import IntegrityCheckFailed  # noqa: F401  (re-exported)

#: Whole-run false-alarm probability of each statistical family (``integrity_stats``).
FALSE_ALARM = stats.FALSE_ALARM
#: The realised-units test is evaluated once steps·B (public expected batch) reaches this.
MIN_EXPECTED_UNITS = 50.0
#: Relative tolerance of the brute-force clipping comparison (float32).
CLIP_RTOL = 1e-4
#: Absolute slack of that comparison, in units of C (norms this small cannot be compared).
CLIP_ATOL = 1e-6
#: Per trained piece, the clipped part is compared relative to itself, or to this fraction of the
#: unit's clipped norm when smaller (a piece whose gradient is ~0, e.g. the attention key bias,
#: has only rounding error, which reached 6e-4 of its own tiny norm on a public start): a factor r on a
#: piece carrying a share s of the unit's norm is caught when |r − 1|·min(s, PIECE_FLOOR)/PIECE_FLOOR
#: exceeds CLIP_RTOL, i.e. |r − 1|·s > 1e-8 for the smallest pieces.
PIECE_FLOOR = 1e-4
#: Tolerance of the comparison with the norm the STEP used when its float32 matmuls may have run
#: in reduced precision (TensorFloat-32 on an Ampere+ GPU, the default bfloat16 passes on a TPU):
#: the check's own computations always run in full float32 (rtol ``CLIP_RTOL``).
STEP_NORM_RTOL_REDUCED = 1e-2
#: Probe coordinates per trained variable or piece (all of a smaller one).
NOISE_COORDINATES_PER_VARIABLE = 128
#: The private record of the checks in the trainer's state directory.
INTEGRITY_FILE = "integrity_checks.json"


def _rng(seed: Optional[int], stream: int) -> np.random.Generator:
    """Secret randomness (OS entropy); a test seed makes it fixed."""
    return np.random.default_rng(secrets.randbits(128) if seed is None else [int(seed), 0x1C4EC, stream])


# --------------------------------------------------------------------------- event values
def observe(sampler, stepper: step_lib.DPSGDTrainStep, ledger_path, diagnostics_noise_std: Mapping[str, float],
            steps_executed: Optional[int] = None, checks: Optional["RunChecks"] = None) -> dict:
    """The values ``event_check.check_event`` compares with the record, read from the objects that
    used them: the running sampler, the step, and the write-ahead ledger on disk.
    ``diagnostics_noise_std``: the std of the noise on each released diagnostic sum (empty without
    DP diagnostics), whose sensitivity is the step's loss bound (loss) or 1.

    Several worker processes: the values are the GLOBAL mechanism's, never one worker's share —
    q is the coin probability every worker's sampler flips with (the union of the workers'
    samples is the Poisson sample at q), the divisor B the step's public global expected batch
    (a worker's own expected share is B/W and appears nowhere), P the replicas in sync over all
    workers (the all-reduce's span), σ and the mode the step's, and the steps the CHIEF's ledger
    (``ledger_path``; a non-chief, which has no ledger, passes ``steps_executed``, its own count,
    and its values are not what the stage checks).

    ``checks``: the run's :class:`RunChecks`; when its release check saw the diagnostics, the
    noise stds are the ones the released sums were TESTED against (``released_diagnostics``),
    not ``diagnostics_noise_std`` (the configuration's): the event is then derived from what
    the release was shown to carry."""
    config = stepper.config
    patient = isinstance(sampler, sampling.PatientPoissonSampler)
    if ledger_path is not None:
        steps = int(storage.read_json(str(ledger_path))["steps_executed"])
    elif steps_executed is not None:
        steps = int(steps_executed)
    else:
        raise ValueError("observe needs the chief's ledger_path (or a non-chief's steps_executed)")
    claimed = checks.release.claimed if checks is not None and checks.enabled else {}
    multipliers = {}
    for part, std in (claimed or diagnostics_noise_std or {}).items():
        sensitivity = float(config.loss_bound) if part == "loss" else 1.0
        multipliers[part] = float(std) / sensitivity
    out = {
        "sampling": sampler.mode,
        "sampling_probability": float(sampler.q),
        "sampling_unit": "patient" if patient else "tuple",
        "sampler_k": int(sampler.k) if patient else None,
        "group_size": int(config.group_size),
        "steps_executed": steps,
        "base_noise_multiplier": float(config.noise_multiplier),
        "gradient_noise_multiplier": float(config.effective_noise_multiplier),
        "noise_mode": config.noise_mode,
        "replicas": int(stepper.strategy.num_replicas_in_sync),
        "accumulation_steps": int(config.accumulation_steps),
        "diagnostic_noise_multipliers": multipliers,
        "expected_batch_size": float(config.expected_batch_size),
        "workers": int(getattr(stepper, "workers", 1)),
        "steps_from": "ledger" if ledger_path is not None else "this worker (not the chief)",
    }
    if sampler.mode == "shuffle":  # PRIVATE: the exact n the permutations run over
        out.update(batch_size=int(sampler.batch_size), units=int(sampler.n))
    return out


# --------------------------------------------------------------------------- 1. the sampler
class UnitsCheck:
    """The realised units per step (the step's GLOBAL count) against iid Binomial(n, q) draws:
    their total (exact binomial) and their dispersion (both tails, ``integrity_stats``);
    shuffle: every step exactly B."""

    name = "units_per_step"
    TESTS = 3  # total, dispersion too small, dispersion too large

    def __init__(self, sampling_mode: str, units: int, q: float, batch_size: int, alpha: float = stats.FALSE_ALARM):
        self.mode, self.n, self.q, self.batch_size = sampling_mode, int(units), float(q), int(batch_size)
        self.alpha = float(alpha)
        self.sizes: List[float] = []
        self.wrong_sizes = 0

    @property
    def total(self) -> float:
        return float(sum(self.sizes))

    def add(self, units: float):
        self.sizes.append(float(units))
        if self.mode == "shuffle" and int(round(units)) != self.batch_size:
            self.wrong_sizes += 1

    def result(self, look: int = 1) -> dict:
        draws = len(self.sizes)
        if self.mode == "shuffle":
            return {"ran": draws > 0, "statistic": "steps whose batch is not exactly B",
                    "wrong_sizes": self.wrong_sizes, "steps": draws, "tolerance": 0,
                    "passed": self.wrong_sizes == 0, **({} if draws else {"reason": "no step"})}
        mean = draws * self.n * self.q
        out = {"statistic": "units per step vs iid Binomial(n, q): total (exact) and dispersion (Chernoff)",
               "steps": draws, "units_total": self.total, "units_expected": mean, "q": self.q,
               "units": self.n}  # PRIVATE: exact counts
        # Whether there are enough draws is decided on the PUBLIC expected batch B (q·n_planned),
        # not on the exact n: the released pass/fail summary must not depend on the data.
        if draws * self.batch_size < MIN_EXPECTED_UNITS:
            return dict(out, ran=False, reason="not enough draws", passed=None)
        var = mean * (1.0 - self.q)
        z = (self.total - mean) / math.sqrt(var) if var > 0 else (0.0 if self.total == mean else math.inf)
        level = stats.look_level(self.alpha, look, self.TESTS)
        p = {"total": stats.binomial_two_sided(self.total, self.n * draws, self.q),
             "dispersion_low": stats.dispersion_lower(self.sizes, self.n, self.q),
             "dispersion_high": stats.dispersion_upper(self.sizes, self.n, self.q)}
        dispersion = float(np.var(self.sizes) / (self.n * self.q * (1 - self.q))) if self.q < 1 else 0.0
        return dict(out, ran=True, z=z, dispersion_ratio=dispersion, p_values=p, level=level, look=look,
                    failed=[k for k, v in p.items() if v < level], passed=all(v >= level for v in p.values()))

    @staticmethod
    def message(result: dict) -> str:
        if "wrong_sizes" in result:
            return "a shuffle step did not hold exactly B units"
        why = {"total": "their total is not what the plan's q gives",
               "dispersion_low": "their spread is too small for Poisson sampling (fixed-size batches?)",
               "dispersion_high": "their spread is too large for Poisson sampling at one q"}
        return (f"the realised units per step are not Binomial(n, q) draws: "
                f"{'; '.join(why[k] for k in result['failed'])} (p < {result['level']:.1e})")


class ParticipationCheck:
    """How often each unit took part (``RunChecks.sampled``) against Binomial(T, q), Bonferroni
    over the n units; shuffle: at most ⌈T·B/n⌉ + 1 (a window may straddle two permutations)."""

    name = "participation"
    TESTS = 1

    def __init__(self, sampling_mode: str, units: int, q: float, batch_size: int, alpha: float = stats.FALSE_ALARM):
        self.mode, self.n, self.q, self.batch_size = sampling_mode, int(units), float(q), int(batch_size)
        self.alpha = float(alpha)
        self.counts = np.zeros(0, np.int64)
        self.steps = 0

    def add(self, unit_indices):
        idx = np.asarray(unit_indices, np.int64).ravel()
        self.steps += 1
        if idx.size == 0:
            return
        if idx.min() < 0:
            raise ValueError("sampled unit indices must be >= 0")
        if idx.max() >= self.counts.size:
            self.counts = np.concatenate([self.counts, np.zeros(int(idx.max()) + 1 - self.counts.size, np.int64)])
        np.add.at(self.counts, idx, 1)  # a unit drawn twice in one step counts twice

    def result(self, look: int = 1) -> dict:
        out = {"statistic": "the most steps any unit took part in, vs Binomial(T, q) (Bonferroni over n units)",
               "steps": self.steps, "max_participation": int(self.counts.max()) if self.counts.size else 0,
               "units": self.n, "q": self.q}  # PRIVATE: exact counts
        if self.steps == 0:
            return dict(out, ran=False, reason="the training loop reported no sampled units", passed=None)
        top = out["max_participation"]
        if self.mode == "shuffle":
            bound = math.ceil(self.steps * self.batch_size / self.n) + 1
            return dict(out, ran=True, bound=bound, passed=top <= bound)
        level = stats.look_level(self.alpha, look, self.TESTS) / max(self.n, 1)
        p = stats.binomial_upper(top, self.steps, self.q)
        return dict(out, ran=True, p_value=p, level=level, look=look, passed=p >= level)

    @staticmethod
    def message(result: dict) -> str:
        if "bound" in result:
            return "a unit took part in more shuffle steps than the stream's epochs allow"
        return (f"a unit took part in more steps than Binomial(T, q) allows (p < {result['level']:.1e} per unit): "
                f"the sampler does not flip an independent coin per unit and step")


# --------------------------------------------------------------------------- 3. noise
def make_noise_probe(variables: Sequence, per_variable: int = NOISE_COORDINATES_PER_VARIABLE,
                     seed: Optional[int] = None) -> step_lib.NoiseProbe:
    """``per_variable`` distinct coordinates (all of a smaller one) of EVERY trained variable or
    piece (``variables``: tf.Variables or ``trainable.Piece``\\ s, aligned with the step's
    variables), drawn with secret randomness."""
    rng = _rng(seed, 3)
    out = {}
    for i, v in enumerate(variables):
        size = int(v.shape.num_elements())
        out[i] = np.sort(rng.choice(size, size=min(int(per_variable), size), replace=False)).astype(np.int64)
    return step_lib.NoiseProbe(out)


class NoiseCheck:
    """The noise the optimizer was handed, per trained variable (docs/audits.md, 3.)."""

    name = "noise"

    def __init__(self, sigma: float, sensitivity: float, divisor: float, groups: Sequence,
                 alpha: float = stats.FALSE_ALARM):
        """``sensitivity``: the mechanism's Δ (C, or 1 under normalized clipping); ``groups``:
        ``[(name, number of probe coordinates)]`` in the probe's order."""
        self.std = float(sigma) * float(sensitivity)
        self.divisor = float(divisor)
        self.alpha = float(alpha)
        self.names = [str(name) for name, _ in groups]
        sizes = np.array([int(size) for _, size in groups], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.sum_sq = np.zeros(len(sizes))
        self.counts = np.zeros(len(sizes), np.int64)
        self.sum = 0.0
        self.count = self.pairs = 0
        self.cross = 0.0
        self.pending: Optional[np.ndarray] = None

    @property
    def tests(self) -> int:
        return len(self.names) + 3  # each variable, all pooled, the mean, the lag-1 products

    def add(self, clean: np.ndarray, update: np.ndarray):
        z = (np.asarray(update, np.float64) * self.divisor - np.asarray(clean, np.float64)) / self.std
        self.sum_sq += np.add.reduceat(np.square(z), self.offsets) if z.size else 0.0
        self.counts += np.diff(np.append(self.offsets, z.size))
        self.sum += float(z.sum())
        self.count += z.size
        if self.pending is None:  # disjoint pairs of consecutive steps: independent products
            self.pending = z
        else:
            self.cross += float(np.dot(z, self.pending))
            self.pairs += z.size
            self.pending = None

    def result(self, look: int = 1) -> dict:
        out = {"statistic": "z = (B*update - S)/(sigma*Delta) per coordinate (Delta: the mechanism's sensitivity): "
                            "chi-square per variable and pooled, "
                            "mean, lag-1 products", "expected_std": self.std, "values": int(self.count),
               "pairs": int(self.pairs), "variables": len(self.names)}
        if self.count == 0:
            return dict(out, ran=False, reason="no step", passed=None)
        level = stats.look_level(self.alpha, look, self.tests)
        per_variable = {name: {"std_ratio": math.sqrt(s / c) if c else None, "p": stats.chi2_two_sided(s, int(c))}
                        for name, s, c in zip(self.names, self.sum_sq, self.counts)}
        pooled = {"std_ratio": math.sqrt(float(self.sum_sq.sum()) / self.count),
                  "p": stats.chi2_two_sided(float(self.sum_sq.sum()), int(self.count))}
        mean_z = self.sum / math.sqrt(self.count)
        lag1 = self.cross / self.pairs if self.pairs else None
        p_mean = stats.normal_two_sided(mean_z)
        p_lag = stats.product_sum_two_sided(self.cross, self.pairs)
        failed = [label for label, p in (("all variables", pooled["p"]), ("mean", p_mean), ("lag-1", p_lag))
                  if p < level]
        failed += [name for name, r in per_variable.items() if r["p"] < level]
        return dict(out, ran=True, level=level, look=look, per_variable=per_variable, pooled=pooled,
                    std_ratio=pooled["std_ratio"], mean_z=mean_z, mean_p=p_mean, lag1=lag1, lag1_p=p_lag,
                    failed=failed, passed=not failed)

    @staticmethod
    def message(result: dict) -> str:
        parts = []
        for name in result["failed"][:6]:
            if name in result["per_variable"]:
                parts.append(f"{name}: std {result['per_variable'][name]['std_ratio']:.3f} x sigma*Delta")
            elif name == "all variables":
                parts.append(f"all variables: std {result['pooled']['std_ratio']:.3f} x sigma*Delta")
            elif name == "mean":
                parts.append(f"mean {result['mean_z']:.2f} standard errors")
            else:
                parts.append(f"lag-1 correlation {result['lag1']:.3f}")
        more = len(result["failed"]) - len(parts)
        return ("the noise handed to the optimizer is not N(0, (sigma*Delta/B)^2) per coordinate (Delta: the "
                "mechanism's sensitivity), independent across "
                f"steps (p < {result['level']:.1e} each): " + "; ".join(parts) + (f"; {more} more" if more > 0 else ""))


# --------------------------------------------------------------------------- 4. released diagnostics
class ReleaseCheck:
    """Released − exact of every released diagnostic sum, over its claimed noise std: χ² per part
    and pooled (docs/audits.md, 4.)."""

    name = "released_diagnostics"

    def __init__(self, alpha: float = stats.FALSE_ALARM):
        self.alpha = float(alpha)
        self.sum_sq: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}
        self.no_noise: List[str] = []
        #: The std each part claimed (one value per run; a change is a failure of its own).
        self.claimed: Dict[str, float] = {}
        self.changed: List[str] = []

    def add(self, exact: Mapping[str, float], released: Mapping[str, float], noise_std: Mapping[str, float]):
        for part, std in noise_std.items():
            if part not in exact or part not in released:
                raise ValueError(f"released diagnostics: part {part!r} has a noise std but no "
                                 f"{'exact' if part not in exact else 'released'} value")
            if part in self.claimed and not math.isclose(self.claimed[part], float(std), rel_tol=1e-9):
                if part not in self.changed:
                    self.changed.append(part)
            self.claimed.setdefault(part, float(std))
            if not float(std) > 0:
                if part not in self.no_noise:
                    self.no_noise.append(part)
                continue
            r = (float(released[part]) - float(exact[part])) / float(std)
            self.sum_sq[part] = self.sum_sq.get(part, 0.0) + r * r
            self.counts[part] = self.counts.get(part, 0) + 1

    def result(self, look: int = 1) -> dict:
        out = {"statistic": "(released - exact)/claimed std per step: chi-square per part and pooled",
               "steps": max(self.counts.values(), default=0), "no_noise": list(self.no_noise),
               "claimed_std": dict(self.claimed), "claimed_std_changed": list(self.changed)}
        if not self.counts and not self.no_noise:
            return dict(out, ran=False, reason="the training loop reported no released diagnostics", passed=None)
        level = stats.look_level(self.alpha, look, len(self.counts) + 1)
        parts = {part: {"std_ratio": math.sqrt(self.sum_sq[part] / c), "p": stats.chi2_two_sided(self.sum_sq[part], c)}
                 for part, c in self.counts.items()}
        total, count = sum(self.sum_sq.values()), sum(self.counts.values())
        pooled = {"std_ratio": math.sqrt(total / count) if count else None,
                  "p": stats.chi2_two_sided(total, count) if count else 1.0}
        failed = list(self.no_noise) + [p for p in self.changed if p not in self.no_noise] + \
            [p for p, r in parts.items() if r["p"] < level and p not in self.changed] + \
            (["all parts"] if pooled["p"] < level else [])
        return dict(out, ran=True, level=level, look=look, parts=parts, pooled=pooled, failed=failed,
                    passed=not failed)

    @staticmethod
    def message(result: dict) -> str:
        def why(p):
            if p in result["no_noise"]:
                return f"{p}: claims no noise"
            if p in result["claimed_std_changed"]:
                return f"{p}: its claimed noise std changed during the run"
            if p in result["parts"]:
                return f"{p}: noise std {result['parts'][p]['std_ratio']:.3f} x the claimed std"
            return f"all parts: noise std {result['pooled']['std_ratio']:.3f} x the claimed std"

        parts = [why(p) for p in result["failed"]]
        return ("a released diagnostic does not carry the noise its DP event is charged for "
                f"(p < {result['level']:.1e} each): " + "; ".join(parts))


# --------------------------------------------------------------------------- 2. clipping
def dropout_free(model: tf_keras.Model) -> bool:
    """True when no layer of ``model`` drops anything in training (then training=True and
    training=False compute the same function)."""
    for layer in model.layers:
        if isinstance(layer, tf_keras.layers.Dropout) and float(layer.rate) > 0:
            return False
        if isinstance(layer, tf_keras.layers.MultiHeadAttention) and float(getattr(layer, "_dropout", 0.0)) > 0:
            return False
    return True


class ClippingCheck:
    """One secret-random unit per check, its gradient by brute force against: the clipping path
    (``clip()``: the norm, the clipped contribution as a whole and per trained piece), the step's
    OWN accumulate replayed on that unit alone (the clipped sum the noise is added to: as a whole,
    per piece, and its norm against the norm the step used), and (dropout-free model) the norm the
    real step used (docs/audits.md, 2.)."""

    name = "clipping"
    #: The comparisons, each with the tolerance it is held to (``clip``: CLIP_RTOL; ``step``: the
    #: step's own computations, ``step_rtol``) and whether it needs a dropout-free model.
    ERRORS = {"norm": ("clip", False), "clipped": ("clip", False), "clipped_piece": ("clip", False),
              "summed_norm": ("step", False), "summed": ("step", True), "summed_piece": ("step", True),
              "step_norm": ("step", True)}

    def __init__(self, stepper: step_lib.DPSGDTrainStep, seed: Optional[int] = None, eager_first: bool = True):
        self.stepper, self.eager_first = stepper, bool(eager_first)
        self.k = int(stepper.config.group_size)
        #: Δ, the mechanism's sensitivity (C; 1 under normalized clipping): the bound of a clipped
        #: unit and the scale of the comparisons' absolute slack.
        self.bound = float(stepper.mechanism.sensitivity)
        #: r of normalized clipping (None: flat, clipped at Δ = C), the brute force's own rule.
        self.stability = float(stepper.config.clip_stability) if stepper.config.clip_rule == "normalized" else None
        self.rng = _rng(seed, 2)
        self.compare_step = dropout_free(stepper.model)
        pieces = getattr(getattr(stepper, "selection", None), "pieces", None)
        self.piece_names = [p.name for p in pieces] if pieces is not None else \
            [v.name for v in stepper.variables]
        # The step's own matmuls may run in TF32 (GPU) / bf16 passes (TPU); the check's never do.
        self.reduced_precision = bool(tf.config.experimental.tensor_float_32_execution_enabled() and (
            tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU")))
        self.step_rtol = STEP_NORM_RTOL_REDUCED if self.reduced_precision else CLIP_RTOL
        self.checks = 0
        self.errors = {key: 0.0 for key, (_, needs) in self.ERRORS.items() if self.compare_step or not needs}
        self.worst_piece: Dict[str, str] = {}
        self.failed: Optional[str] = None

    def _build(self):
        stepper, clip, stability = self.stepper, self.bound, self.stability

        def squares(tensors):
            return tf.stack([tf.reduce_sum(tf.square(tf.convert_to_tensor(t))) for t in tensors])

        def replica_fn(batch, rows):
            mask = tf.cast(batch["example_mask"], tf.float32)
            inputs, targets = stepper.prepare_fn(batch["features"])
            # Brute force, independent of ghost.py: one tape over the unit's own rows only.
            unit_features = tf.nest.map_structure(lambda a: tf.gather(a, rows), batch["features"])
            unit_inputs, unit_targets = stepper.prepare_fn(unit_features)
            unit_mask = tf.gather(mask, rows)
            with tf.GradientTape() as tape:
                outputs = stepper.model(unit_inputs, training=False)
                loss = tf.reduce_sum(stepper.loss_fn(unit_targets, outputs) * unit_mask)
            # The gradient of the TRAINED pieces only (training.trainable: frozen variables and rows
            # are no part of the clipped unit), aligned with the step's variables.
            brute = [tf.convert_to_tensor(g) for g in stepper.selection.gradients(tape, loss)]
            brute_norm = tf.sqrt(tf.reduce_sum(squares(brute)))
            # min(1, C/‖g‖)·g, or g/(‖g‖ + r) under normalized clipping
            factor = clip / tf.maximum(brute_norm, clip) if stability is None else 1.0 / (brute_norm + stability)
            expected = [factor * b for b in brute]
            # The step's clipping path on the same micro-batch, only that unit's slots unmasked.
            grads, _, norms, _ = stepper.clip(inputs, lambda o: stepper.loss_fn(targets, o), mask, training=False)
            # What the step's own accumulate (replayed on this round) left in this replica's accumulators.
            summed = [acc.read_value() for acc in stepper.accumulators]
            return (brute_norm, norms, squares(expected), squares([g - e for g, e in zip(grads, expected)]),
                    squares(summed), squares([s - e for s, e in zip(summed, expected)]))

        strategy = stepper.strategy

        def run(batch, rows):
            return strategy.experimental_local_results(strategy.run(replica_fn, args=(batch, rows)))

        return run

    def _function(self):
        """The check's function: with ``eager_first``, run eagerly the first time a step object is
        checked, traced from its second check on (kept on the step object: every run's checks
        reuse it). A check is often made once per run (steps < ``integrity_check_every``), where
        tracing and optimising the brute-force graph cost seconds and eager dispatch about one;
        checked every step, it is traced at once."""
        stepper = self.stepper
        calls = getattr(stepper, "_integrity_checks_made", 0)
        stepper._integrity_checks_made = calls + 1  # pylint: disable=protected-access
        if calls == 0 and self.eager_first:
            return self._build()
        fn = getattr(stepper, "_integrity_clip_fn", None)
        if fn is None:
            fn = stepper._integrity_clip_fn = tf.function(self._build(), autograph=False)  # pylint: disable=protected-access
        return fn

    def _choose(self, rounds: List[dict]) -> Optional[tuple]:
        """A secret-random unit of the step's batch: ``(round, replica, slot group)``, None if empty."""
        units = []
        for r, round_batch in enumerate(rounds):
            mask = np.asarray(round_batch["example_mask"], np.float32)
            present = mask.reshape(mask.shape[0], -1, self.k).max(axis=2) > 0  # [P, units]
            units += [(r, int(p), int(j)) for p, j in zip(*np.nonzero(present))]
        return units[int(self.rng.integers(len(units)))] if units else None

    def before(self, rounds: List[dict]) -> Optional[tuple]:
        """Choose a unit of this step's batch and recompute it (the weights the step will use)."""
        chosen = self._choose(rounds)
        if chosen is None:
            if getattr(self.stepper, "workers", 1) > 1:  # the replay is a collective: every worker takes part
                self.stepper.replay_accumulate(self.stepper.padding_round(rounds[0]))
                self.stepper.clear_accumulators()
            return None  # an empty Poisson batch: nothing to check at this step
        r, p, j = chosen
        mask = np.asarray(rounds[r]["example_mask"], np.float32)
        only = np.zeros_like(mask)
        only[p, j * self.k:(j + 1) * self.k] = mask[p, j * self.k:(j + 1) * self.k]
        unit_round = {"features": rounds[r]["features"], "example_mask": only}
        fn = self._function()
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(False)  # full float32 on both sides
        try:
            replay_norms = self.stepper.replay_accumulate(unit_round, r)  # the step's own path, this unit only
            results = fn(self.stepper.distribute(unit_round),
                         tf.constant(np.arange(j * self.k, (j + 1) * self.k), tf.int32))
        finally:
            self.stepper.clear_accumulators()
            tf.config.experimental.enable_tensor_float_32_execution(tf32)
        brute_norm, norms, expected, clip_diff, summed, summed_diff = (np.asarray(x, np.float64) for x in results[p])
        return (r, p, j, float(brute_norm), float(norms[j]), float(replay_norms[p][j]), expected, clip_diff,
                summed, summed_diff)

    def _relative(self, a: float, b: float) -> float:
        return abs(a - b) / max(abs(a), abs(b), CLIP_ATOL * self.bound)

    def _clipped_norm(self, norm: float) -> float:
        """The norm of a unit's clipped contribution when its gradient has ``norm``."""
        return min(norm, self.bound) if self.stability is None else norm / (norm + self.stability)

    def _worst_piece(self, key: str, diff_sq: np.ndarray, expected_sq: np.ndarray) -> float:
        """The largest per-piece relative error, each piece against its own expected clipped part
        (a piece below ``PIECE_FLOOR`` of the unit's clipped norm against that floor)."""
        floor = max(PIECE_FLOOR * math.sqrt(float(expected_sq.sum())), CLIP_ATOL * self.bound)
        errors = np.sqrt(diff_sq) / np.maximum(np.sqrt(expected_sq), floor)
        worst = int(np.argmax(errors)) if errors.size else 0
        if errors.size and errors[worst] > self.errors.get(key, 0.0):
            self.worst_piece[key] = self.piece_names[worst]
        return float(errors[worst]) if errors.size else 0.0

    def _errors(self, pending: tuple) -> Dict[str, float]:
        r, p, j, brute, path_norm, replay_norm, expected, clip_diff, summed, summed_diff = pending
        unit = max(self._clipped_norm(brute), CLIP_ATOL * self.bound)
        errors = {"norm": self._relative(path_norm, brute),
                  "clipped": math.sqrt(clip_diff.sum()) / unit,
                  "clipped_piece": self._worst_piece("clipped_piece", clip_diff, expected),
                  # Dropout-robust: the replayed sum's norm is the clipped norm of the norm the step used.
                  "summed_norm": self._relative(math.sqrt(summed.sum()), self._clipped_norm(replay_norm))}
        if self.compare_step:
            errors.update(summed=math.sqrt(summed_diff.sum()) / unit,
                          summed_piece=self._worst_piece("summed_piece", summed_diff, expected),
                          step_norm=self._relative(float(self.stepper.last_unit_norms[r][p][j]), brute))
        return errors

    def after(self, pending: Optional[tuple]):
        """Compare (after the step ran, with the norms it used)."""
        if pending is None:
            return
        errors = self._errors(pending)
        self.checks += 1
        for key, value in errors.items():
            self.errors[key] = max(self.errors[key], value)
        bad = [key for key, value in errors.items() if not value <= self._tolerance(key)]
        if bad and self.failed is None:
            self.failed = ", ".join(f"{key} relative error {errors[key]:.2e}" +
                                    (f" on {self.worst_piece[key]}" if key in self.worst_piece else "")
                                    for key in bad)

    def _tolerance(self, key: str) -> float:
        return CLIP_RTOL if self.ERRORS[key][0] == "clip" else self.step_rtol

    def result(self) -> dict:
        out = {"statistic": "relative error of the clipping path and of the step's replayed clipped sum vs a "
                            "brute-force gradient of one unit (whole and per trained piece)",
               "tolerance": CLIP_RTOL, "checks": self.checks, "piece_floor": PIECE_FLOOR,
               "compared_with_step_norm": self.compare_step, "step_norm_tolerance": self.step_rtol,
               "max_relative_error": dict(self.errors), "worst_piece": dict(self.worst_piece)}
        if not self.checks:
            return dict(out, ran=False, reason="no check step", passed=None)
        return dict(out, ran=True, passed=self.failed is None)

    def message(self, result: dict) -> str:
        return (f"a unit's clipping disagrees with its brute-force gradient ({self.failed}; tolerance "
                f"{CLIP_RTOL:g}, the step's own computations {self.step_rtol:g}): the per-example clipping "
                f"is broken")


# --------------------------------------------------------------------------- all together
@dataclasses.dataclass(frozen=True)
class LaunchedStep:
    """A step that ran (``RunChecks.launch``): its statistics and noise-probe snapshots still on the
    device, and whether it is a look of the checks."""

    stats: "step_lib.DeviceStats"
    probe: tuple
    due: bool


class RunChecks:
    """The run-time checks of one training run; ``step`` replaces ``stepper.run_step``.

    ``units``: the EXACT number of units the sampler draws from (rows, or patients; all workers
    together). ``every``: ``training.integrity_check_every`` — the brute-force clipping check at
    the run's first step and every ``every`` steps (0 = off), the accumulated tests evaluated
    (one "look") at the same points and at the end (:meth:`finish`). ``seed``: tests only (fixes
    the checks' randomness). A non-private run has no mechanism to check (everything "not run").

    The training loop calls, per step: :meth:`sampled` (the units it drew), :meth:`launch` (the
    step itself); every ``training.stats_every`` steps :meth:`read` (one transfer), then per step
    in order :meth:`settle` and :meth:`released` (the DP diagnostics it released, if any)."""

    def __init__(self, stepper: step_lib.DPSGDTrainStep, *, sampling_mode: str, units: int, q: float,
                 batch_size: int, every: int, output_dir, seed: Optional[int] = None):
        # output_dir None: a non-chief worker of a multi-worker run (writes nothing).
        self.stepper, self.every = stepper, int(every)
        self.output_dir = str(output_dir) if output_dir is not None else None
        self.enabled = not stepper.config.non_private
        self.steps_run = self.looks = 0
        self.units = UnitsCheck(sampling_mode, units, q, batch_size)
        self.participation = ParticipationCheck(sampling_mode, units, q, batch_size)
        probe = getattr(stepper, "noise_probe", None)
        self.noise = None
        if probe is not None:
            pieces = getattr(getattr(stepper, "selection", None), "pieces", None)
            names = [pieces[i].name if pieces is not None else f"variable {i}" for i, _ in probe.groups()]
            self.noise = NoiseCheck(stepper.config.effective_noise_multiplier, stepper.mechanism.sensitivity,
                                    stepper.config.expected_batch_size,
                                    [(name, c.size) for name, (_, c) in zip(names, probe.groups())])
        self.clipping = ClippingCheck(stepper, seed, eager_first=self.every > 1) if self.every > 0 else None
        self.release = ReleaseCheck()

    def sampled(self, step: int, unit_indices: np.ndarray):
        """The units the sampler drew for optimizer step ``step`` (this worker's own units, as
        indices into its local unit list). Called by the training loop once per step, before
        :meth:`step`."""
        del step
        if self.enabled:
            self.participation.add(unit_indices)

    def released(self, step: int, exact: Mapping[str, float], released: Mapping[str, float],
                 noise_std: Mapping[str, float]):
        """The DP diagnostics of step ``step``: the EXACT per-step sums (``exact``), the released
        noisy sums (``released``) and the std of the noise each one claims to carry
        (``noise_std``), all keyed by part (``dpbert.privacy.diagnostics.noise_stds``'s keys).
        Called by the training loop once per step after the release."""
        del step
        if self.enabled:
            self.release.add(exact, released, noise_std)

    def step(self, rounds: List[dict], step: int) -> Dict[str, float]:
        """:meth:`launch`, :meth:`read` and :meth:`settle` of one step: its EXACT statistics."""
        launched = self.launch(rounds, step)
        return self.settle(launched, self.read([launched])[0])

    def launch(self, rounds: List[dict], step: int) -> "LaunchedStep":
        """``stepper.run_step(rounds)`` with the checks around it, its statistics left on the
        device until :meth:`read` (``training.stats_every``); ``step``: the optimizer step
        (0-based) this call takes. The brute-force clipping check reads what it needs at once."""
        if not self.enabled:
            return LaunchedStep(self.stepper.run_step(rounds, read=False), (), False)
        due = self.every > 0 and (self.steps_run == 0 or (int(step) + 1) % self.every == 0)
        pending = self.clipping.before(rounds) if due and self.clipping is not None else None
        device = self.stepper.run_step(rounds, read=False)
        self.steps_run += 1
        if due and self.clipping is not None:
            self.clipping.after(pending)
        probe = ()
        if self.noise is not None:  # snapshots: the probe variables hold the latest step only
            probe = (tf.identity(self.stepper.noise_probe_clean), tf.identity(self.stepper.noise_probe_update))
        return LaunchedStep(device, probe, due)

    @staticmethod
    def read(launched: Sequence["LaunchedStep"]) -> List[tuple]:
        """The launched steps' statistics and probe snapshots in ONE device-to-host transfer:
        ``(stats, probe arrays)`` per step, in order."""
        host = step_lib.read_stats([x.stats for x in launched], [t for x in launched for t in x.probe])
        stats_, arrays = host[:len(launched)], iter(host[len(launched):])
        return [(st, tuple(next(arrays) for _ in x.probe)) for st, x in zip(stats_, launched)]

    def settle(self, launched: "LaunchedStep", values: tuple) -> Dict[str, float]:
        """Feed one read step (``read``) to the checks, in step order; evaluate at its look (a
        failure raises). Returns the step's EXACT statistics (python floats)."""
        stats_, probe = values
        if not self.enabled:
            return stats_
        self.units.add(stats_["units"])
        if self.noise is not None:
            self.noise.add(*probe)
        if launched.due or self.units.wrong_sizes:
            self._evaluate()
        return stats_

    def _checks(self) -> dict:
        return {UnitsCheck.name: self.units, ParticipationCheck.name: self.participation,
                ClippingCheck.name: self.clipping, NoiseCheck.name: self.noise, ReleaseCheck.name: self.release}

    def results(self) -> Dict[str, dict]:
        """Every check's result at the latest look (PRIVATE: statistics and exact counts)."""
        if not self.enabled:
            return {name: {"ran": False, "reason": "non-private baseline", "passed": None} for name in self._checks()}
        look = max(self.looks, 1)
        off = {ClippingCheck.name: "training.integrity_check_every = 0", NoiseCheck.name: "no noise probe"}
        return {name: (check.result() if isinstance(check, ClippingCheck) else check.result(look))
                if check is not None else {"ran": False, "reason": off[name], "passed": None}
                for name, check in self._checks().items()}

    def _evaluate(self):
        self.looks += 1
        results = self.results()
        self._write(results)
        checks = self._checks()
        for name, result in results.items():
            if result.get("ran") and not result.get("passed"):
                raise IntegrityCheckFailed(
                    f"run-time integrity check '{name}' failed: {checks[name].message(result)}. The run stops and "
                    f"nothing is released; the statistics (operator-only) are in "
                    f"{storage.join(self.output_dir, INTEGRITY_FILE) if self.output_dir is not None else 'the chief'}")

    def finish(self) -> Dict[str, dict]:
        """Evaluate everything once more at the end of the run (a last look); raises on a failure."""
        if self.enabled:
            self._evaluate()
        results = self.results()
        self._write(results)
        return results

    def _write(self, results):
        if self.output_dir is None:
            return
        # One whole-object write through the storage layer (atomic; local, gs://, ...).
        storage.write_text(storage.join(self.output_dir, INTEGRITY_FILE),
                           json.dumps(results, indent=2, sort_keys=True, default=float))
