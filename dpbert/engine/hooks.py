"""Hooks of the training loop (``dpbert.engine.loop.TrainLoop``): what happens around each
step that is not the mechanism itself.

A hook gets ``on_start(loop)`` before the first step, ``on_step(loop, step, rounds, stats,
sampled)`` after each step (``step``: the optimizer steps done, 1-based; ``stats``: the step's
EXACT, private statistics, read every ``training.stats_every`` steps so ``on_step`` may come a few
steps late unless ``needs_read`` asks for the step; ``sampled``: the indices of the units that took part), ``on_end(loop)``
after the last step of a run that completed, and ``close(loop)`` always (crash or not). Built-in,
in this order: :class:`ReleaseDiagnostics` (the DP estimates, ``loop.shown``), :class:`TensorBoard`
(released values only), :class:`ProgressHook`, :class:`IntegrityHook`, :class:`CheckpointHook`;
then the caller's hooks (a probe, an observer, :class:`CrashAfter`).
"""
from __future__ import annotations

import tempfile
from typing import List, Optional

import numpy as np
import tensorflow as tf

from dpbert.engine.progress import Progress
from dpbert.privacy import diagnostics


class Hook:
    """Base hook: every method a no-op."""

    def on_start(self, loop):
        pass

    def on_step(self, loop, step: int, rounds: List[dict], stats: dict, sampled: np.ndarray):
        pass

    def on_end(self, loop):
        pass

    def close(self, loop):
        pass

    def needs_read(self, loop, step: int) -> bool:
        """True: the loop reads the statistics right after step ``step`` (this hook's ``on_step``
        must see the model as it is after that step), whatever ``training.stats_every``."""
        return False


class SimulatedCrash(RuntimeError):
    """Raised by :class:`CrashAfter` (tests): stops like a crash, no final save."""


class CrashAfter(Hook):
    """TESTS: raise :class:`SimulatedCrash` once this run has taken ``steps`` steps and more are
    planned — after the step's checkpoint (if due), before the next step's step-log entry."""

    def __init__(self, steps: int):
        self.steps = int(steps)

    def needs_read(self, loop, step):
        return loop.steps_this_run >= self.steps

    def on_step(self, loop, step, rounds, stats, sampled):
        if loop.steps_this_run >= self.steps and step < loop.steps_planned:
            raise SimulatedCrash(f"simulated crash after {loop.steps_this_run} steps (at step {step})")


class ReleaseDiagnostics(Hook):
    """The per-step diagnostics that may be shown: DP estimates (``diagnostics.release``: Gaussian
    noise on each bounded per-step sum, charged in the step's event at σ_eff) for a DP run with
    diagnostics; the exact values for the non-private baseline (its artifact is private); nothing
    for a DP run without diagnostics. Keeps the run's record (``loop.record``) and hands the exact
    and released sums to the integrity checks (``checks.released``)."""

    def __init__(self, release: bool, non_private: bool, gradient_sigma: float, expected_batch: float, config,
                 rng: np.random.Generator, patient_unit: bool):
        self.release, self.non_private = release, non_private
        self.gradient_sigma, self.expected_batch, self.config = gradient_sigma, expected_batch, config
        self.rng, self.patient_unit = rng, patient_unit
        self.noise_std = diagnostics.noise_stds(gradient_sigma, config) if release else {}

    def on_step(self, loop, step, rounds, stats, sampled):
        record = loop.record
        examples = stats["examples"]
        loss = stats["loss_sum"] / examples if examples > 0 else float("nan")
        record.last_accuracy = stats["correct"] / stats["predictions"] if stats["predictions"] > 0 else float("nan")
        record.losses.append(loss)
        record.clipped_total += stats["clipped"]
        record.examples_total += examples
        shown = None  # a DP run without DP diagnostics: nothing about the batches is released
        if self.release:
            record.exact_sums.append({k: float(stats[k]) for k in ("loss_clipped_sum", "accuracy_sum", "clipped",
                                                                   "examples")})
            # Per unit: a patient counts once in the batch size (its loss/accuracy are its means).
            exact = diagnostics.exact_parts(dict(stats, examples=stats["units"]) if self.patient_unit else stats)
            noisy = diagnostics.noisy_sums(exact, self.gradient_sigma, self.config, self.rng)
            shown = diagnostics.ratios(noisy, self.config)  # = diagnostics.release(...), in its three steps
            loop.checks.released(step - 1, exact=exact, released=noisy, noise_std=self.noise_std)
        elif self.non_private:  # the baseline's artifact is private: its exact curve is what it shows
            shown = {"loss": loss, "accuracy": record.last_accuracy, "batch_size": examples,
                     "clipped_fraction": stats["clipped"] / examples if examples else 0.0}
        loop.shown = shown
        if shown is not None:
            for key, value in shown.items():
                record.released[key].append(float(value))


class TensorBoard(Hook):
    """The RELEASED diagnostics and the learning rate, chief only (a no-op writer elsewhere)."""

    def __init__(self, logdir: Optional[str], schedule):
        self.writer = tf.summary.create_file_writer(logdir) if logdir else tf.summary.create_noop_writer()
        self.schedule = schedule

    def on_step(self, loop, step, rounds, stats, sampled):
        shown = loop.shown
        if shown is None:
            return
        with self.writer.as_default(step=step):
            tf.summary.scalar("mlm_loss", shown["loss"])
            tf.summary.scalar("mlm_accuracy", shown["accuracy"])
            tf.summary.scalar("clipped_fraction", shown["clipped_fraction"])
            tf.summary.scalar("batch_size", shown["batch_size"])
            tf.summary.scalar("learning_rate", float(self.schedule(step - 1)))

    def close(self, loop):
        self.writer.flush()


class ProgressHook(Hook):
    """A progress bar on a terminal; elsewhere (TFX logs, CI, a pipe) one log line every 30 s."""

    def __init__(self, desc: str, label: str, step_noise_std: Optional[float]):
        self.desc, self.label, self.step_noise_std = desc, label, step_noise_std
        self.bar: Optional[Progress] = None

    def on_start(self, loop):
        self.bar = Progress(loop.steps_planned, loop.start_step, self.desc, label=self.label,
                            step_noise_std=self.step_noise_std)

    def on_step(self, loop, step, rounds, stats, sampled):
        self.bar.update(step, loop.shown)

    def close(self, loop):
        if self.bar is not None:
            self.bar.close()


class IntegrityHook(Hook):
    """The run-time integrity checks' final evaluation (raises on a failure, before the final save)."""

    def on_end(self, loop):
        loop.integrity_results = loop.checks.finish()


class CheckpointHook(Hook):
    """Every ``every`` steps and at the end of a completed run. Every worker saves (TF's
    multi-worker rule); the chief into the chain, a non-chief to a temporary directory removed at
    once. ``manager``: the chief's ``tf.train.CheckpointManager`` (None on a non-chief)."""

    def __init__(self, checkpoint: tf.train.Checkpoint, manager, every: int, last_saved: Optional[int]):
        self.checkpoint, self.manager, self.every, self.last_saved = checkpoint, manager, int(every), last_saved

    def save(self, number: int, step_log=None):
        """Checkpoint ``number``; the chief first records the step log's count beside it (a
        resume from it refuses a step log that counts fewer steps: ``chain.StepLogBehind``)."""
        if self.manager is not None:
            if step_log is not None:
                step_log.record_checkpoint(number)
            self.manager.save(checkpoint_number=number)
        else:
            with tempfile.TemporaryDirectory(prefix="dpbert-worker-ckpt-") as tmp:
                self.checkpoint.write(tmp + "/ckpt")
        self.last_saved = number

    def needs_read(self, loop, step):
        return step % self.every == 0

    def on_step(self, loop, step, rounds, stats, sampled):
        if step % self.every == 0:
            self.save(step, loop.step_log)

    def on_end(self, loop):
        if self.last_saved != loop.step:
            self.save(loop.step, loop.step_log)
