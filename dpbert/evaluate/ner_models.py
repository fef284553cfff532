"""Which encoders the NER evaluator compares, and how each is rebuilt (no TFX here).

The rows of the utility table (``dpbert.evaluate.utility``): ``random`` (the architecture and
vocabulary, random initialization), ``public`` (the public start the DP trainer starts from —
``model.init: minilm``, ``model.public_layers``, the public warm-up — with the run's vocabulary,
no in-domain pre-training), ``dp`` and ``non_private``. Every row uses the run's vocabulary, so
the comparison isolates pre-training.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dpbert.evaluate import ner
from dpbert.evaluate.mlm_loss import heldout_mlm_metrics
from dpbert.evaluate.utility import f1_summary

log = logging.getLogger("dpbert.ner")


def encoder_builder(model_dir: Optional[str], spec=None, seed: int = 0, weights=None) -> Callable[[], object]:
    """A fresh encoder with the weights in ``model_dir``; with ``model_dir`` None: ``spec``
    randomly initialized (``seed``), then given the MLM ``weights`` when not None."""
    return lambda: mlm_builder(model_dir, spec, seed, weights, encoder=True)()


def mlm_builder(model_dir: Optional[str], spec=None, seed: int = 0, weights=None,
                encoder: bool = False) -> Callable[[], object]:
    """As :func:`encoder_builder`, the MLM model (``encoder=True``: the encoder)."""
    from dpbert import storage
    from dpbert.network.bert import build_bert, load_bert

    def build():
        if model_dir is not None:
            models = load_bert(storage.join(model_dir, "model"))
        else:
            models = build_bert(spec, seed=seed)
            if weights is not None:
                models.mlm.set_weights(weights)
        return models.encoder if encoder else models.mlm

    return build


#: One NER task's (train, dev, test) sentences.
Splits = Tuple[Sequence[ner.Sentence], Sequence[ner.Sentence], Sequence[ner.Sentence]]


@dataclasses.dataclass(frozen=True, eq=False)
class HeldoutMLM:
    """The held-out MLM pass each row gets (``heldout_mlm_metrics``): the token rows ``ids``, the
    ``special_ids`` never masked, the ``mask_id``, at most ``max_predictions`` masked positions a
    row, the masking ``seed``."""
    ids: np.ndarray
    special_ids: List[int]
    mask_id: int
    max_predictions: int
    seed: int = 0


def _per_type(runs: Sequence[dict]) -> Dict[str, float]:
    types = sorted({t for r in runs for t in r["per_type"]})
    return {t: float(np.mean([r["per_type"].get(t, {}).get("f1", 0.0) for r in runs])) for t in types}


def _task_summary(runs: Sequence[dict]) -> dict:
    summary = f1_summary([r["f1"] for r in runs])
    return {"f1_mean": summary["mean"], "f1_std": summary["std"], "f1_seeds": [r["f1"] for r in runs],
            "best_epochs": [r["best_epoch"] for r in runs], "per_type": _per_type(runs)}


def evaluate_rows(rows: Dict[str, Callable[[], object]], mlm_builders: Dict[str, Callable[[], object]],
                  tokenizer, splits: Splits, heldout: HeldoutMLM, settings: ner.NERSettings, seeds: Sequence[int], *,
                  extra_tasks: Optional[Dict[str, Splits]] = None) -> Tuple[Dict[str, dict], Dict[str, dict]]:
    """(results, per-row MLM sums): for each row, NER F1 after fine-tuning with ``settings``
    (``train_encoder`` False: a linear probe of the frozen encoder) once per seed of ``seeds``
    (each replacing ``settings.seed``; early stopping on the dev split of ``splits``), its mean
    and std, the mean per-type F1 and the best epochs; the held-out MLM loss and accuracy (one
    pass, ``heldout``). ``extra_tasks`` (task → (train, dev, test)): the same per task, in
    ``results[row]["tasks"][task]`` (``f1_mean``, ``f1_std``, ``f1_seeds``, ``per_type``, ``best_epochs``)."""
    results, mlm_rows = {}, {}

    def run_seeds(build, task_splits: Splits):
        task_train, task_dev, task_test = task_splits
        cache: dict = {}  # probe: the frozen encoder's features, computed once for every seed
        return [ner.finetune_and_score(build, tokenizer, task_train, task_test,
                                       dataclasses.replace(settings, seed=int(seed)), dev_sentences=task_dev,
                                       features_cache=cache) for seed in seeds]

    for name, build in rows.items():
        t0 = time.time()
        runs = run_seeds(build, splits)
        tasks = {task: _task_summary(run_seeds(build, task_splits))
                 for task, task_splits in (extra_tasks or {}).items()}
        t_ner = time.time() - t0
        mlm = heldout_mlm_metrics(mlm_builders[name](), heldout.ids, heldout.special_ids, heldout.mask_id,
                                  heldout.max_predictions, seed=heldout.seed)
        f1 = f1_summary([r["f1"] for r in runs])
        results[name] = {
            "f1": f1["mean"], "f1_mean": f1["mean"], "f1_std": f1["std"], "f1_seeds": [r["f1"] for r in runs],
            "precision": float(np.mean([r["precision"] for r in runs])),
            "recall": float(np.mean([r["recall"] for r in runs])),
            "per_type": _per_type(runs),
            "best_epochs": [r["best_epoch"] for r in runs],
            "dev_f1": [r["best_dev_f1"] for r in runs],
            "heldout_mlm_loss": mlm["loss"], "heldout_mlm_accuracy": mlm["accuracy"],
            "ner_seconds": round(t_ner, 1), "mlm_seconds": round(time.time() - t0 - t_ner, 1),
            **({"tasks": tasks} if tasks else {}),
        }
        mlm_rows[name] = {"row_loss_sum": mlm["row_loss_sum"], "row_count": mlm["row_count"]}
        log.info("ner: %s F1 %.4f ± %.4f over %d seeds (best epochs %s), held-out MLM loss %.3f, accuracy %.3f "
                 "(%.0f s)", name, f1["mean"], f1["std"], len(runs), results[name]["best_epochs"], mlm["loss"],
                 mlm["accuracy"], time.time() - t0)
    return results, mlm_rows
