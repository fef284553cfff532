"""Run-time integrity checks on the REAL training run: what the audit canaries cannot see (issue 22).

The white-box audit (``dpbert.privacy.whitebox_audit``) adds its gradient canaries to the clipped
sum AFTER the clipping and outside the sampler, and scores them at the CLAIMED σ: a sampler whose
q is off, broken clipping of real examples, or a claim beyond the audit's reach passes it. The
checks here run inside ``train_mlm`` on the running objects (:class:`RunChecks`), each with a
positive control in ``tests/model/test_integrity_checks.py`` (a deliberately broken mechanism the
check catches). A failed check raises :class:`IntegrityCheckFailed` (the run fails, nothing is
released) after writing the statistics to ``integrity_checks.json`` in the PRIVATE state
directory; the messages carry no raw text and no exact count.

1. **Realised units per step** (``units_per_step``; operator-only). Under Poisson sampling the
   sum of the units the step actually processed (``stats["units"]``: rows, or patients under the
   patient unit) over s steps is Binomial(n·s, q) with n the EXACT number of units and q the
   PLAN's rate: z = (Σ units − s·n·q)/√(s·n·q(1−q)), |z| > 6 fails (false alarm ≈ 2e-9 per
   look; evaluated at the check points below and at the end, once s·B ≥ 50 with B = q·n_planned
   the public expected batch, else "not enough draws"). A sampler running at 4q gives z ≈ 3√(s·n·q) ≥ 21. Shuffle sampling: every step must
   hold exactly B units. n and the sums are private: they stay in ``integrity_checks.json`` /
   ``train_result.json`` in the private state directory.
2. **Brute-force clipping** (``clipping``), at the first step of every run and every
   ``training.integrity_check_every`` steps (0 = off): one unit of the step's batch chosen with
   secret randomness; before the step runs (same weights), its gradient is recomputed by brute
   force — ONE ``GradientTape`` over that unit's rows alone (a patient: the sum of its ≤ k rows'
   gradients; with ``training.trainable`` the gradient of the trained pieces only,
   ``Selection.gradients``), independent of ``ghost.py`` — and compared at rtol 1e-4 (float32) with (a) the
   norm the step's clipping path (``DPSGDTrainStep.clip``) gives that unit on the same micro-batch,
   (b) that path's clipped contribution of the unit alone vs min(1, C/‖g‖)·g, and (c) when the
   model has no active dropout, the norm the step itself used (``DPSGDTrainStep.last_unit_norms``).
   Both sides of (a) and (b) run with ``training=False`` (dropout off for both): with dropout on,
   the step's own masks cannot be replayed, so (c) is only possible on a dropout-free model.
   The check's computations run in full float32 (TensorFloat-32 off during the call); where the
   step's own matmuls may have run in reduced precision (TF32 GPU, TPU), (c) is compared at
   rtol 1e-2 (``STEP_NORM_RTOL_REDUCED``) — unverified on such hardware here (CPU only).
   A ghost norm that drops a layer's term or is scaled fails (a) / (c); wrong book-keeping (b).
3. **Noise on the real step** (``noise``): ``DPSGDTrainStep`` with a ``NoiseProbe`` keeps, on
   ``NOISE_COORDINATES`` random coordinates (secret randomness, spread over every trainable
   variable), the all-reduced clipped sum S before the single draw and the update (S + z)/B
   before the optimizer; z = B·update − S must have std σ·C, σ the GRADIENT noise multiplier
   (``DPSGDConfig.effective_noise_multiplier``, not the accountant's σ_eff with the diagnostics
   folded in), mean 0 and lag-1 correlation 0 across consecutive steps. Over the run: for m
   values, |ŝ/(σC) − 1| ≤ 6/√(2m), |mean| ≤ 6·σC/√m, |ρ₁| ≤ 6/√(pairs). σ/2 noise (ratio 0.5)
   fails at the first check (tolerance 0.27 at m = 256); a stuck step counter in the noise seed
   repeats z (ρ₁ = 1) and fails from the second step.

The recorded DP event is checked against the running objects by the stage
(``dpbert.privacy.event_check.check_event`` on :func:`observe`'s values).

Several worker processes (``training.strategy: multi_worker``): every worker runs the checks on
what it holds — the units test on the step's GLOBAL unit count (all-reduced) against the global
n, the clipping check on one of its own units, the noise test on its own probe coordinates of the
identical update — and only the chief writes ``integrity_checks.json``.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import threading
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from dpbert.model import dpsgd, sampling
from dpbert.privacy.event_check import IntegrityCheckFailed  # noqa: F401  (re-exported)

#: Two-sided tolerance of every statistical check, in standard errors (false alarm ≈ 2e-9 per look).
Z_TOLERANCE = 6.0
#: The realised-units test is evaluated once steps·n·q reaches this.
MIN_EXPECTED_UNITS = 50.0
#: Relative tolerance of the brute-force clipping comparison (float32).
CLIP_RTOL = 1e-4
#: Absolute slack of that comparison, in units of C (norms this small cannot be compared).
CLIP_ATOL = 1e-6
#: Tolerance of the comparison with the norm the STEP used when its float32 matmuls may have run
#: in reduced precision (TensorFloat-32 on an Ampere+ GPU, the default bfloat16 passes on a TPU):
#: the check's own computations always run in full float32 (rtol ``CLIP_RTOL``).
STEP_NORM_RTOL_REDUCED = 1e-2
#: Coordinates of the noise probe.
NOISE_COORDINATES = 256
#: Minimum number of noise values (and of consecutive pairs) before the noise tests are evaluated.
MIN_NOISE_VALUES = 100
#: The private record of the checks in the trainer's state directory.
INTEGRITY_FILE = "integrity_checks.json"


def _rng(seed: Optional[int], stream: int) -> np.random.Generator:
    """Secret randomness (OS entropy); a test seed makes it fixed."""
    return np.random.default_rng(secrets.randbits(128) if seed is None else [int(seed), 0x1C4EC, stream])


# --------------------------------------------------------------------------- event values
def observe(sampler, stepper: dpsgd.DPSGDTrainStep, ledger_path, diagnostics_noise_std: Mapping[str, float],
            steps_executed: Optional[int] = None) -> dict:
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
    and its values are not what the stage checks)."""
    config = stepper.config
    patient = isinstance(sampler, sampling.PatientPoissonSampler)
    if ledger_path is not None:
        with open(ledger_path, encoding="utf-8") as f:
            steps = int(json.load(f)["steps_executed"])
    elif steps_executed is not None:
        steps = int(steps_executed)
    else:
        raise ValueError("observe needs the chief's ledger_path (or a non-chief's steps_executed)")
    multipliers = {}
    for part, std in (diagnostics_noise_std or {}).items():
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


# --------------------------------------------------------------------------- 1. units per step
class UnitsCheck:
    """Σ realised units over the run vs Binomial(n·steps, q) (Poisson) / exactly B per step (shuffle)."""

    name = "units_per_step"

    def __init__(self, sampling_mode: str, units: int, q: float, batch_size: int):
        self.mode, self.n, self.q, self.batch_size = sampling_mode, int(units), float(q), int(batch_size)
        self.total, self.draws, self.wrong_sizes = 0.0, 0, 0

    def add(self, units: float):
        self.total += float(units)
        self.draws += 1
        if self.mode == "shuffle" and int(round(units)) != self.batch_size:
            self.wrong_sizes += 1

    def result(self) -> dict:
        if self.mode == "shuffle":
            return {"ran": self.draws > 0, "statistic": "steps whose batch is not exactly B",
                    "wrong_sizes": self.wrong_sizes, "steps": self.draws, "tolerance": 0,
                    "passed": self.wrong_sizes == 0, **({} if self.draws else {"reason": "no step"})}
        mean = self.draws * self.n * self.q
        out = {"statistic": "z of the summed units per step vs Binomial(n*steps, q)", "tolerance": Z_TOLERANCE,
               "steps": self.draws, "units_total": self.total, "units_expected": mean, "q": self.q,
               "units": self.n}  # PRIVATE: exact counts
        # Whether there are enough draws is decided on the PUBLIC expected batch B (q·n_planned),
        # not on the exact n: the released pass/fail summary must not depend on the data.
        if self.draws * self.batch_size < MIN_EXPECTED_UNITS:
            return dict(out, ran=False, reason="not enough draws", passed=None)
        var = mean * (1.0 - self.q)
        z = (self.total - mean) / math.sqrt(var) if var > 0 else (0.0 if self.total == mean else math.inf)
        return dict(out, ran=True, z=z, passed=abs(z) <= Z_TOLERANCE)

    @staticmethod
    def message(result: dict) -> str:
        if "wrong_sizes" in result:
            return "a shuffle step did not hold exactly B units"
        return (f"the realised number of units per step is not what the plan's q gives "
                f"(|z| > {Z_TOLERANCE:g} standard errors)")


# --------------------------------------------------------------------------- 3. noise
def make_noise_probe(variables: Sequence[tf.Variable], count: int = NOISE_COORDINATES,
                     seed: Optional[int] = None) -> dpsgd.NoiseProbe:
    """``count`` distinct coordinates drawn uniformly over all of ``variables`` (flattened and
    concatenated) with secret randomness, grouped per variable index."""
    sizes = np.array([int(v.shape.num_elements()) for v in variables], dtype=np.int64)
    total = int(sizes.sum())
    chosen = np.sort(_rng(seed, 3).choice(total, size=min(int(count), total), replace=False))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    which = np.searchsorted(starts, chosen, side="right") - 1
    return dpsgd.NoiseProbe({int(i): chosen[which == i] - starts[i] for i in np.unique(which)})


class NoiseCheck:
    """z = B·(update) − S on the probe's coordinates: std σ·C, mean 0, no lag-1 correlation."""

    name = "noise"

    def __init__(self, sigma: float, clip_norm: float, divisor: float):
        self.std = float(sigma) * float(clip_norm)
        self.divisor = float(divisor)
        self.sum = self.sum_sq = self.cross = 0.0
        self.count = self.pairs = 0
        self.previous: Optional[np.ndarray] = None

    def add(self, clean: np.ndarray, update: np.ndarray):
        z = np.asarray(update, np.float64) * self.divisor - np.asarray(clean, np.float64)
        self.sum += float(z.sum())
        self.sum_sq += float(np.square(z).sum())
        self.count += z.size
        if self.previous is not None:
            self.cross += float(np.dot(z, self.previous))
            self.pairs += z.size
        self.previous = z

    def result(self) -> dict:
        out = {"statistic": "std of B*update - S vs sigma*C; lag-1 correlation across steps",
               "expected_std": self.std, "values": self.count, "pairs": self.pairs}
        if self.count < MIN_NOISE_VALUES:
            return dict(out, ran=False, reason="not enough steps", passed=None)
        measured = math.sqrt(self.sum_sq / self.count)
        std_tol = Z_TOLERANCE / math.sqrt(2 * self.count)
        mean_z = (self.sum / self.count) / (self.std / math.sqrt(self.count))
        out.update(ran=True, std_ratio=measured / self.std, std_tolerance=std_tol, mean_z=mean_z,
                   mean_tolerance=Z_TOLERANCE)
        passed = abs(measured / self.std - 1.0) <= std_tol and abs(mean_z) <= Z_TOLERANCE
        if self.pairs >= MIN_NOISE_VALUES and self.sum_sq > 0:
            lag1 = self.cross / (self.pairs * self.sum_sq / self.count)
            lag_tol = Z_TOLERANCE / math.sqrt(self.pairs)
            out.update(lag1=lag1, lag1_tolerance=lag_tol)
            passed = passed and abs(lag1) <= lag_tol
        else:
            out.update(lag1=None, lag1_tolerance=None)
        out["passed"] = bool(passed)
        return out

    @staticmethod
    def message(result: dict) -> str:
        parts = [f"noise std {result['std_ratio']:.3f} x sigma*C (tolerance +-{result['std_tolerance']:.3f})",
                 f"mean {result['mean_z']:.2f} standard errors"]
        if result.get("lag1") is not None:
            parts.append(f"lag-1 correlation {result['lag1']:.3f} (tolerance +-{result['lag1_tolerance']:.3f})")
        return "the update's noise is not N(0, (sigma*C/B)^2) independent across steps: " + ", ".join(parts)


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
    """One secret-random unit per check: brute-force gradient norm vs the clipping path's norm,
    its clipped contribution, and (dropout-free model) the norm the step used."""

    name = "clipping"

    def __init__(self, stepper: dpsgd.DPSGDTrainStep, seed: Optional[int] = None):
        self.stepper = stepper
        self.k = int(stepper.config.group_size)
        self.clip_norm = float(stepper.config.clip_norm)
        self.rng = _rng(seed, 2)
        self.compare_step = dropout_free(stepper.model)
        # The step's own matmuls may run in TF32 (GPU) / bf16 passes (TPU); the check's never do.
        self.reduced_precision = bool(tf.config.experimental.tensor_float_32_execution_enabled() and (
            tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU")))
        self.step_rtol = STEP_NORM_RTOL_REDUCED if self.reduced_precision else CLIP_RTOL
        self.checks = 0
        self.errors = {"norm": 0.0, "clipped": 0.0, "step_norm": 0.0}
        self.failed: Optional[str] = None

    def _build(self):
        stepper, k, clip = self.stepper, self.k, self.clip_norm

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
            brute_norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in brute]))
            # The step's clipping path on the same micro-batch, only that unit's slots unmasked.
            grads, _, norms, _ = stepper.clip(inputs, lambda o: stepper.loss_fn(targets, o), mask, training=False)
            factor = clip / tf.maximum(brute_norm, clip)
            diff = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.convert_to_tensor(g) - factor * b))
                                     for g, b in zip(grads, brute)]))
            return brute_norm, norms, diff

        strategy = stepper.strategy

        def run(batch, rows):
            return strategy.experimental_local_results(strategy.run(replica_fn, args=(batch, rows)))

        return tf.function(run, autograph=False)

    def before(self, rounds: List[dict]) -> Optional[tuple]:
        """Choose a unit of this step's batch and recompute it (the weights the step will use)."""
        units = []
        for r, round_batch in enumerate(rounds):
            mask = np.asarray(round_batch["example_mask"], np.float32)
            present = mask.reshape(mask.shape[0], -1, self.k).max(axis=2) > 0  # [P, units]
            units += [(r, int(p), int(j)) for p, j in zip(*np.nonzero(present))]
        if not units:
            return None  # an empty Poisson batch: nothing to check at this step
        r, p, j = units[int(self.rng.integers(len(units)))]
        mask = np.asarray(rounds[r]["example_mask"], np.float32)
        only = np.zeros_like(mask)
        only[p, j * self.k:(j + 1) * self.k] = mask[p, j * self.k:(j + 1) * self.k]
        fn = getattr(self.stepper, "_integrity_clip_fn", None)
        if fn is None:  # traced once per step object (every run's checks reuse it)
            fn = self.stepper._integrity_clip_fn = self._build()  # pylint: disable=protected-access
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(False)  # full float32 on both sides
        try:
            results = fn(self.stepper.distribute({"features": rounds[r]["features"], "example_mask": only}),
                         tf.constant(np.arange(j * self.k, (j + 1) * self.k), tf.int32))
        finally:
            tf.config.experimental.enable_tensor_float_32_execution(tf32)
        brute_norm, norms, diff = (np.asarray(x) for x in results[p])
        return r, p, j, float(brute_norm), float(np.asarray(norms)[j]), float(diff)

    def _relative(self, a: float, b: float) -> float:
        return abs(a - b) / max(abs(a), abs(b), CLIP_ATOL * self.clip_norm)

    def after(self, pending: Optional[tuple]):
        """Compare (after the step ran, with the norms it used)."""
        if pending is None:
            return
        r, p, j, brute, path_norm, diff = pending
        errors = {"norm": self._relative(path_norm, brute),
                  "clipped": diff / max(min(brute, self.clip_norm), CLIP_ATOL * self.clip_norm)}
        if self.compare_step:
            errors["step_norm"] = self._relative(float(self.stepper.last_unit_norms[r][p][j]), brute)
        self.checks += 1
        for key, value in errors.items():
            self.errors[key] = max(self.errors[key], value)
        bad = [key for key, value in errors.items()
               if not value <= (self.step_rtol if key == "step_norm" else CLIP_RTOL)]
        if bad and self.failed is None:
            self.failed = ", ".join(f"{key} relative error {errors[key]:.2e}" for key in bad)

    def result(self) -> dict:
        out = {"statistic": "relative error of the clipping path vs a brute-force gradient of one unit",
               "tolerance": CLIP_RTOL, "checks": self.checks,
               "compared_with_step_norm": self.compare_step, "step_norm_tolerance": self.step_rtol,
               "max_relative_error": dict(self.errors) if self.compare_step else
               {k: v for k, v in self.errors.items() if k != "step_norm"}}
        if not self.checks:
            return dict(out, ran=False, reason="no check step", passed=None)
        return dict(out, ran=True, passed=self.failed is None)

    def message(self, result: dict) -> str:
        return (f"a unit's clipping disagrees with its brute-force gradient ({self.failed}; tolerance "
                f"{CLIP_RTOL:g}): the per-example clipping is broken")


# --------------------------------------------------------------------------- all together
class RunChecks:
    """The run-time checks of one ``train_mlm`` run; ``step`` replaces ``stepper.run_step``.

    ``units``: the EXACT number of units the sampler draws from (rows, or patients). ``every``:
    ``training.integrity_check_every`` — the brute-force clipping check at the run's first step
    and every ``every`` steps (0 = off), the accumulated tests evaluated at the same points and at
    the end (:meth:`finish`). ``noise_seed``: tests only (fixes the checks' randomness too).
    A non-private run has no mechanism to check (everything "not run")."""

    def __init__(self, stepper: dpsgd.DPSGDTrainStep, *, sampling_mode: str, units: int, q: float,
                 batch_size: int, every: int, output_dir, seed: Optional[int] = None):
        # output_dir None: a non-chief worker of a multi-worker run (writes nothing).
        self.stepper, self.every = stepper, int(every)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.enabled = not stepper.config.non_private
        self.steps_run = 0
        self.units = UnitsCheck(sampling_mode, units, q, batch_size)
        self.noise = NoiseCheck(stepper.config.effective_noise_multiplier, stepper.config.clip_norm,
                                stepper.config.expected_batch_size) if stepper.noise_probe is not None else None
        self.clipping = ClippingCheck(stepper, seed) if self.every > 0 else None

    def step(self, rounds: List[dict], step: int) -> Dict[str, float]:
        """``stepper.run_step(rounds)`` with the checks around it; ``step``: the optimizer step
        (0-based) this call takes."""
        if not self.enabled:
            return self.stepper.run_step(rounds)
        due = self.every > 0 and (self.steps_run == 0 or (int(step) + 1) % self.every == 0)
        pending = self.clipping.before(rounds) if due and self.clipping is not None else None
        stats = self.stepper.run_step(rounds)
        self.steps_run += 1
        if due and self.clipping is not None:
            self.clipping.after(pending)
        self.units.add(stats["units"])
        if self.noise is not None:
            self.noise.add(self.stepper.noise_probe_clean.numpy(), self.stepper.noise_probe_update.numpy())
        if due or self.units.wrong_sizes:
            self._evaluate()
        return stats

    def sampled(self, step: int, unit_indices: np.ndarray):
        """The units the sampler drew for optimizer step ``step`` (this worker's own units, as
        indices into its local unit list). Called by the training loop once per step, before
        :meth:`step`."""
        del step, unit_indices  # contract first; the sampler tests read them

    def released(self, step: int, exact: Mapping[str, float], released: Mapping[str, float],
                 noise_std: Mapping[str, float]):
        """The DP diagnostics of step ``step``: the EXACT per-step sums (``exact``), the released
        noisy sums (``released``, same keys) and the std of the noise each one claims to carry
        (``noise_std``). Called by the training loop once per step after the release."""
        del step, exact, released, noise_std  # contract first; the release test reads them

    def results(self) -> Dict[str, dict]:
        if not self.enabled:
            return {name: {"ran": False, "reason": "non-private baseline", "passed": None}
                    for name in (UnitsCheck.name, ClippingCheck.name, NoiseCheck.name)}
        out = {UnitsCheck.name: self.units.result()}
        out[ClippingCheck.name] = self.clipping.result() if self.clipping is not None else \
            {"ran": False, "reason": "training.integrity_check_every = 0", "passed": None}
        out[NoiseCheck.name] = self.noise.result() if self.noise is not None else \
            {"ran": False, "reason": "no noise probe", "passed": None}
        return out

    def _evaluate(self):
        results = self.results()
        self._write(results)
        checks = {UnitsCheck.name: self.units, ClippingCheck.name: self.clipping, NoiseCheck.name: self.noise}
        for name, result in results.items():
            if result.get("ran") and not result.get("passed"):
                raise IntegrityCheckFailed(
                    f"run-time integrity check '{name}' failed: {checks[name].message(result)}. The run stops and "
                    f"nothing is released; the statistics (operator-only) are in "
                    f"{self.output_dir / INTEGRITY_FILE if self.output_dir is not None else 'the chief'}")

    def finish(self) -> Dict[str, dict]:
        """Evaluate everything once more at the end of the run; raises on a failure."""
        if self.enabled:
            self._evaluate()
        results = self.results()
        self._write(results)
        return results

    def _write(self, results):
        if self.output_dir is None:
            return
        path = self.output_dir / INTEGRITY_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(results, indent=2, sort_keys=True, default=float), encoding="utf-8")
        os.replace(tmp, path)
