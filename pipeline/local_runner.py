"""Run the DAG locally: LocalDagRunner, Beam DirectRunner (multi-processing, 2 workers).

Interrupts: SIGINT (Ctrl-C) and SIGTERM stop the run as a ``KeyboardInterrupt`` (SIGTERM's handler
raises it), which ``run_local`` turns into ``RunInterrupted``: the run is marked cancelled in ML
Metadata (``dpbert.metadata.mark_interrupted``; TFX would leave it RUNNING forever) and the
exception says where it stopped (the component, the trainer's step and its last checkpoint, the
DP steps charged so far: the trainer's write-ahead ledger). Nothing is lost: a re-run of the same
command re-uses the finished components (TFX's cache) and the trainer resumes from its
checkpoint, its ledger still counting every step that ever ran.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from typing import Any, Dict, Mapping, Optional

from tfx import v1 as tfx

from dpbert import schema, storage
from dpbert.config import Config
from pipeline.paths import output_paths
from pipeline.pipeline import create_pipeline

log = logging.getLogger("dpbert")


class RunInterrupted(Exception):
    """The run was stopped by SIGINT/SIGTERM; the run is marked cancelled in ML Metadata.

    ``component``: the component that was running (None: between components or before the
    first); ``step``: the trainer's step (steps started, the ledger's count) when a trainer ran in
    this process, with ``checkpoint_step`` (where a re-run resumes) and ``charged`` (the DP steps
    the ledger charges so far, earlier interrupted runs of the chain included; None for the
    non-private baseline, which is not accounted)."""

    def __init__(self, run_id: Optional[str], component: Optional[str], step: Optional[int] = None,
                 checkpoint_step: Optional[int] = None, charged: Optional[int] = None,
                 non_private: bool = False):
        self.run_id, self.component, self.step = run_id, component, step
        self.checkpoint_step, self.charged, self.non_private = checkpoint_step, charged, non_private
        super().__init__(self.message())

    def message(self) -> str:
        """One line: where it stopped, how to resume, what was charged."""
        where = self.component or "between components"
        if self.step is not None:
            head = f"interrupted at step {self.step} ({where}"
            if self.checkpoint_step is not None:
                head += f", last checkpoint at step {self.checkpoint_step}"
            head += ")"
        elif self.run_id is None:
            head = "interrupted before any component started"
        else:
            head = f"interrupted in {where}"
        if self.non_private:
            charged = "the non-private baseline is not accounted"
        elif self.charged is not None:
            charged = f"{self.charged} steps charged"
        else:
            charged = "0 training steps charged by this run"
        # The resume hint only where there is something to resume from (dpbert.report.resume_hint).
        from dpbert.report import resume_hint

        return f"{head}; {resume_hint(self.checkpoint_step)}; {charged}"


class RunRefused(Exception):
    """The trainer refused a step over ``privacy.epsilon_budget`` (``dpbert.stages.pretrain``):
    the run failed with the ε already charged recorded on it in ML Metadata (exit 3)."""

    def __init__(self, refusal: Dict[str, Any]):
        self.refusal = refusal
        super().__init__(self.message())

    def message(self) -> str:
        r = self.refusal
        return (f"the privacy budget ({r['epsilon_budget']:.4g}) covers {r['step_limit']} DP-SGD steps of this "
                f"training chain and {r['steps_charged']} are charged: no further step was run; "
                f"ε = {r['epsilon_charged']:.4g} (δ = {r['delta']:.3g}) already spent, recorded on the run "
                f"(dpbert report). Raise training.noise_multiplier or privacy.epsilon_budget, or lower training.steps")


def state_snapshot(pipeline_root: str) -> Dict[str, Optional[int]]:
    """The storage generation of every trainer chain's step log and budget-refusal file under
    ``pipeline_root`` (any storage: a ``gs://`` root too). Taken before a run; a file whose
    generation differs afterwards was written by that run."""
    from dpbert.stages.pretrain import STATE_ROOT, chains

    paths = [c["step_log"] for c in chains(pipeline_root)]
    pattern = storage.join(pipeline_root, STATE_ROOT, "*", schema.BUDGET_REFUSAL_FILE)
    paths += storage.storage_for(pattern).glob(pattern)
    return {str(p): storage.storage_for(str(p)).generation(str(p)) for p in paths}


def _written_since(path: str, before: Mapping[str, Optional[int]]) -> Optional[int]:
    """``path``'s generation when this run wrote it (it differs from ``before``), else None."""
    generation = storage.storage_for(str(path)).generation(str(path))
    return generation if generation is not None and generation != before.get(str(path)) else None


def budget_refusal(pipeline_root: str, before: Mapping[str, Optional[int]]) -> Optional[Dict[str, Any]]:
    """The trainer's ``schema.BUDGET_REFUSAL_FILE`` written by this run (``state_snapshot``), or None."""
    from dpbert.stages.pretrain import STATE_ROOT

    pattern = storage.join(pipeline_root, STATE_ROOT, "*", schema.BUDGET_REFUSAL_FILE)
    for path in storage.storage_for(pattern).glob(pattern):
        try:
            if _written_since(path, before) is not None:
                return storage.read_json(path)
        except (OSError, ValueError):
            continue
    return None


def _newest_chain(pipeline_root: str, before: Mapping[str, Optional[int]], dp_only: bool = False):
    """The chain whose step log this run wrote last (generations order writes), or None."""
    from dpbert.stages.pretrain import chains

    newest, newest_generation = None, None
    for chain in chains(pipeline_root):
        if dp_only and chain["non_private"]:
            continue
        generation = _written_since(chain["step_log"], before)
        if generation is not None and (newest_generation is None or generation > newest_generation):
            newest, newest_generation = chain, generation
    return newest


def trainer_progress(pipeline_root: str, before: Mapping[str, Optional[int]]) -> Optional[Dict[str, Any]]:
    """The state of the trainer that ran in this run: the chain under ``<pipeline_root>/_trainer_state``
    whose step log this run wrote last (``state_snapshot`` taken before it).

    ``{"steps_executed", "checkpoint_step", "non_private", "state"}`` or None when no trainer ran."""
    newest = _newest_chain(pipeline_root, before)
    if newest is None:
        return None
    return {"steps_executed": newest["steps_executed"], "checkpoint_step": newest["checkpoint_step"] or None,
            "non_private": newest["non_private"], "state": newest["state"]}


def record_charged(pipeline_root: str, metadata_path: str, started: float, before: Mapping[str, Optional[int]],
                   refusal: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """After a run stopped before its accountant: the ε the DP trainer's chain has spent so far
    (``dpbert.stages.pretrain.chain_charged``) recorded on the run in ML Metadata
    (``dpbert.metadata.mark_charged``; with ``refusal``, marked refused over the budget). ``started``:
    the run's start (seconds; ML Metadata's clock), ``before``: ``state_snapshot`` then. Returns
    what was recorded, or None (no DP trainer ran in this run)."""
    from dpbert.metadata import mark_charged
    from dpbert.stages.pretrain import chain_charged

    since_ms = int(started * 1000)
    if refusal is not None:
        charged = {k: refusal[k] for k in ("epsilon_charged", "delta", "steps_charged")}
    else:
        newest = _newest_chain(pipeline_root, before, dp_only=True)
        charged = chain_charged(newest["state"]) if newest else None
    if charged is None:
        return None
    try:
        mark_charged(metadata_path, since_ms, charged,
                     refused_budget=None if refusal is None else refusal["epsilon_budget"])
    except Exception as err:  # noqa: BLE001 -- the stop itself is what the user must see
        log.warning("could not record the ε already spent on the run in %s: %s", metadata_path, err)
    return charged


@contextlib.contextmanager
def _interrupt_on_sigterm():
    """SIGTERM raises KeyboardInterrupt (as SIGINT does) in the main thread while the run lasts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def components_argv():
    """While the DAG runs, the process's argv is the program name alone: no component parses the
    command line that started it. (TFX's Beam executor hands ``sys.argv`` + the Beam arguments to
    absl's flag parser, which read ``dpbert -v run`` as ``--verbosity=run``; the Beam pipeline
    gets its own explicit ``beam_pipeline_args``.)"""
    saved = sys.argv
    sys.argv = saved[:1] or ["dpbert"]
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _signals_ignored():
    """While the interrupted run is marked: a second Ctrl-C must not leave it half-marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_local(config: Config) -> dict:
    """Run the whole DAG; returns where the artifacts and the ML Metadata store are.

    Raises ``RunInterrupted`` after SIGINT/SIGTERM (the run marked cancelled in ML Metadata)."""
    pipeline_root, metadata_path = output_paths(config.pipeline)
    storage.storage_for(pipeline_root).makedirs(pipeline_root)
    pipeline = create_pipeline(config, pipeline_root, metadata_path)
    # MLMD's create times are in ms; a second of slack for clocks read differently.
    started, before = time.time(), state_snapshot(pipeline_root)
    try:
        with _interrupt_on_sigterm(), components_argv():
            tfx.orchestration.LocalDagRunner().run(pipeline)
    except KeyboardInterrupt:
        with _signals_ignored():
            progress = trainer_progress(pipeline_root, before)
            step = progress["steps_executed"] if progress else None
            try:
                marked = _mark(metadata_path, int((started - 1.0) * 1000), step,
                               progress and progress["checkpoint_step"])
            except Exception as err:  # noqa: BLE001 -- the interrupt is what the user must see
                log.warning("could not mark the interrupted run cancelled in %s: %s", metadata_path, err)
                marked = None
            record_charged(pipeline_root, metadata_path, started - 1.0, before)
        raise RunInterrupted(
            run_id=marked and marked["run_id"], component=marked and marked["component"], step=step,
            checkpoint_step=progress and progress["checkpoint_step"],
            charged=None if not progress or progress["non_private"] else progress["steps_executed"],
            non_private=bool(progress and progress["non_private"])) from None
    except Exception:
        refusal = budget_refusal(pipeline_root, before)
        record_charged(pipeline_root, metadata_path, started - 1.0, before, refusal)  # failed: what was spent
        if refusal is None:
            raise
        raise RunRefused(refusal) from None
    return {"pipeline_root": pipeline_root, "metadata": metadata_path}


def _mark(metadata_path: str, since_ms: int, step: Optional[int], checkpoint_step: Optional[int] = None):
    from dpbert.metadata import mark_interrupted

    return mark_interrupted(metadata_path, since_ms, step, checkpoint_step)
