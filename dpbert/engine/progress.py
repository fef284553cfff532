"""Training progress: a tqdm bar on a terminal, else one log line every 30 s."""
from __future__ import annotations

import logging
import math
import time
from typing import Iterable, Optional, Tuple

from dpbert.privacy import diagnostics

log = logging.getLogger("dpbert.engine.train")


class Progress:
    """Training progress: a tqdm bar when stderr is a terminal; otherwise one log line every
    ``interval`` seconds (step, rate, ETA) and one at the end, never ``\\r`` redraws in a file."""

    def __init__(self, total: int, initial: int, desc: str, interval: float = 30.0, stream=None,
                 label: str = "DP estimate", step_noise_std: Optional[float] = None):
        import collections
        import sys

        #: What the shown loss/accuracy are: "DP estimate" (noisy diagnostics) or, for the
        #: non-private baseline, "exact (private)" — never to be read as a released figure.
        self.label = label
        #: Lines show the mean over the last 10 % of the steps (one DP estimate is too noisy to
        #: read: ``step_noise_std``, the per-step loss noise std, is printed with it).
        self.step_noise_std = step_noise_std
        self.recent = collections.deque(maxlen=diagnostics.window(total))
        stream = stream if stream is not None else sys.stderr
        self.total, self.initial, self.desc, self.interval = total, initial, desc, interval
        self.step = initial
        self.shown: Optional[dict] = None
        self.started = self.last = time.monotonic()
        self.bar = None
        if getattr(stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", file=stream)

    def update(self, step: int, shown: Optional[dict] = None):
        done, self.step = step - self.step, step
        if shown is not None:
            self.shown = shown
            self.recent.append((float(shown["loss"]), float(shown["accuracy"])))
        if self.bar is not None:
            loss, accuracy, counted = self._means() if shown is not None else (0.0, 0.0, 0)
            if counted:  # refresh=False: the bar redraws at its own pace, not every step
                self.bar.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.3f}",
                                     shown=f"{self.label}, {self._over(counted)}", refresh=False)
            self.bar.update(done)
            return
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._log(now)

    def _log(self, now: float):
        elapsed = now - self.started
        rate = (self.step - self.initial) / elapsed if elapsed > 0 else float("nan")
        left = self.total - self.step
        eta = f"{_duration(left / rate)}" if rate > 0 else "?"
        extra = ""
        loss, accuracy, counted = self._means()
        if counted:
            noise = f", per-step loss noise std {self.step_noise_std:.3g}" if self.step_noise_std else ""
            extra = f", loss {loss:.3f}, accuracy {accuracy:.3f} ({self.label}: {self._over(counted)}{noise})"
        elif self.recent:
            extra = f" (no example in the last {len(self.recent)} steps: no loss to show)"
        log.info("%s: step %d/%d, %.3g steps/s, ETA %s%s", self.desc, self.step, self.total, rate, eta, extra)

    def _means(self) -> Tuple[float, float, int]:
        """(loss, accuracy, steps counted): the means over the recent steps that had an example."""
        loss, counted = finite_mean(loss for loss, _ in self.recent)
        accuracy, _ = finite_mean(accuracy for _, accuracy in self.recent)
        return loss, accuracy, counted

    def _over(self, counted: int) -> str:
        if counted == len(self.recent):
            return f"mean of the last {counted} steps"
        return f"mean of the {counted} steps with an example among the last {len(self.recent)}"

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.step > self.initial:
            self._log(time.monotonic())


def finite_mean(values: Iterable[float]) -> Tuple[float, int]:
    """(mean, count) of the finite values (NaN, 0 when there is none). A step whose logical batch
    held no example has no loss or accuracy — recorded as NaN (0/0), not a value to average: a
    mean over steps that include one would be NaN too."""
    kept = [float(v) for v in values if math.isfinite(float(v))]
    return (sum(kept) / len(kept) if kept else float("nan")), len(kept)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
