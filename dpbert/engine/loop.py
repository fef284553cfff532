"""The training loop: one DP-SGD step after another, with hooks (Opacus-style: the mechanism is
the loop's, everything else is a hook).

Per step, in this order:

1. budget: a step that would make the step log exceed the budget's limit is refused
   (:class:`BudgetExhausted`) BEFORE its write-ahead entry, so no step beyond the budget runs;
2. ``step_log.charge()``: the write-ahead entry (chief), a step that starts is charged;
3. ``source.rounds(step, window, local replicas)``: sample, mask, pack (the shuffle window is the
   step log's count before this step); ``checks.sampled(step, units)``;
4. several workers: ``stepper.sync_step`` — the max round count and the chief's go flag, an
   all-reduce that is also the barrier behind the chief's step-log entry, so no worker computes a
   step the chief has not charged;
5. ``checks.launch(rounds, step)``: the step itself, with the run-time integrity checks; its
   statistics stay on the device;
6. every ``stats_every`` steps (``training.stats_every``), at the last step, before a budget
   refusal and whenever a hook asks (``Hook.needs_read``: a checkpoint step, the audit's probe),
   the steps taken since the last read are read in ONE transfer (``checks.read``), then per step
   in order ``checks.settle`` (the checks' look: a failure raises) and the hooks
   (``dpbert.engine.hooks``). Between reads nothing depends on the statistics: the step log,
   the budget and the noise are decided without them, so reading later changes no release.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence

import numpy as np

from dpbert.engine.hooks import Hook


class BudgetExhausted(RuntimeError):
    """The next step would charge more than ``privacy.epsilon_budget`` covers: refused BEFORE the
    step's write-ahead entry, so no step beyond the budget ever runs. ``steps_executed``: the steps
    charged so far (this chain), ``limit``: the most the budget covers, ``sigma``: the accounted σ
    per step."""

    def __init__(self, steps_executed: int, limit: int, sigma: float):
        self.steps_executed, self.limit, self.sigma = int(steps_executed), int(limit), float(sigma)
        super().__init__(f"the privacy budget covers {self.limit} DP-SGD steps and {self.steps_executed} "
                         f"have been charged; the next step was refused")


@dataclasses.dataclass
class RunRecord:
    """What a run saw: the exact (PRIVATE) per-step losses and sums, and the released values."""

    losses: List[float] = dataclasses.field(default_factory=list)
    released: dict = dataclasses.field(default_factory=lambda: {"loss": [], "accuracy": [],
                                                                 "clipped_fraction": [], "batch_size": []})
    exact_sums: List[dict] = dataclasses.field(default_factory=list)
    last_accuracy: float = float("nan")
    clipped_total: float = 0.0
    examples_total: float = 0.0


class TrainLoop:
    """``run()`` takes the steps ``start_step`` … ``steps_planned`` − 1.

    ``source``: a ``BatchSource``; ``stepper``: the ``mechanism.step.DPSGDTrainStep``; ``step_log``: the
    chain's ``StepLog``; ``checks``: ``integrity.RunChecks`` (``launch`` runs the stepper);
    ``step_limit``: the most steps the budget lets the step log count (None: no budget);
    ``lock_check``: raises when the chain's lease was lost (called before each charge);
    ``stats_every``: read the steps' statistics every this many steps (module docstring)."""

    def __init__(self, source, stepper, step_log, checks, hooks: Sequence[Hook], *, start_step: int,
                 steps_planned: int, step_limit: Optional[int] = None, accounted_sigma: float = 0.0,
                 lock_check: Optional[Callable[[], None]] = None, stats_every: int = 1):
        self.source, self.stepper, self.step_log, self.checks = source, stepper, step_log, checks
        self.hooks = list(hooks)
        if int(stats_every) < 1:
            raise ValueError(f"stats_every must be >= 1, got {stats_every!r}")
        self.stats_every = int(stats_every)
        self._unread: list = []  # (step, rounds, launched, sampled) not read yet
        self.start_step, self.steps_planned, self.step_limit = int(start_step), int(steps_planned), step_limit
        self.accounted_sigma, self.lock_check = float(accounted_sigma), lock_check
        self.step, self.steps_this_run = self.start_step, 0
        self.record = RunRecord()
        self.shown: Optional[dict] = None
        self.integrity_results: dict = {}

    @property
    def workers(self) -> int:
        return int(getattr(self.stepper, "workers", 1))

    def _go(self) -> bool:
        return not (self.step_limit is not None and self.step_log.count + 1 > self.step_limit)

    def _take_step(self):
        go = self._go()
        if self.workers == 1 and not go:
            self.read()
            raise BudgetExhausted(self.step_log.count, self.step_limit, self.accounted_sigma)
        # The shuffle stream's window: the step log's count of steps ever executed in this chain,
        # not the checkpoint's step, so steps replayed after a crash read NEW windows and every
        # row takes part ceil(executed·B/n) times at most — what the record charges.
        window = self.step_log.count
        if go:
            if self.lock_check is not None:
                self.lock_check()
            self.step_log.charge()  # write-ahead: a step that starts is charged
        rounds, sampled = self.source.rounds(self.step, window, self.stepper.local_replicas)
        self.checks.sampled(self.step, sampled)
        if self.workers > 1:
            # The barrier behind the chief's step-log entry, the max round count, the chief's go.
            count, go = self.stepper.sync_step(len(rounds), go)
            if not go:
                self.read()
                limit = self.step_limit if self.step_limit is not None else self.step_log.count
                raise BudgetExhausted(self.step_log.count, limit, self.accounted_sigma)
            rounds = rounds + [self.stepper.padding_round(rounds[0])] * (count - len(rounds))
        launched = self.checks.launch(rounds, self.step)
        self.step += 1
        self.steps_this_run += 1
        self._unread.append((self.step, rounds, launched, sampled))
        if self.step % self.stats_every == 0 or self.step >= self.steps_planned or \
                any(getattr(hook, "needs_read", lambda *_: False)(self, self.step) for hook in self.hooks):
            self.read()

    def read(self):
        """The unread steps' statistics in one transfer; then, per step in order, the checks' look
        and the hooks' ``on_step``."""
        unread, self._unread = self._unread, []
        if not unread:
            return
        for (step, rounds, launched, sampled), values in zip(unread, self.checks.read([u[2] for u in unread])):
            stats = self.checks.settle(launched, values)
            for hook in self.hooks:
                hook.on_step(self, step, rounds, stats, sampled)

    def run(self) -> "TrainLoop":
        try:
            for hook in self.hooks:
                hook.on_start(self)
            while self.step < self.steps_planned:
                self._take_step()
        finally:
            for hook in self.hooks:
                hook.close(self)
        for hook in self.hooks:
            hook.on_end(self)
        return self

    def sampled_units(self) -> np.ndarray:
        """The source's unit ids (what ``sampled`` indexes)."""
        return self.source.unit_ids
