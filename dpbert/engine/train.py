"""MLM pre-training with DP-SGD (or the non-private baseline): ``train_mlm``.

One call trains (or resumes) a BERT MLM on already tokenized, padded tuples ``token_ids``
``[n, L]`` (pad id 0) in the training chain ``output_dir`` (local, ``gs://`` or ``ram://``; its
files: ``dpbert.engine.chain``): checkpoints, the write-ahead step log, run_config.json,
``model/`` (``dpbert.network.bert.load_bert``), ``saved_model/`` (optional), ``tensorboard/``
(released diagnostics only) and the PRIVATE ``train_result.json`` (``TrainResult``).

The run is composed by ``dpbert.engine.build.build_training`` — batch source (sampler,
keyed masks, packing), DP-SGD stepper, chain, integrity checks, loop with hooks — which the
white-box audit, the noise check and the benchmarks reuse with their own hooks.

Diagnostics: the per-step loss, MLM accuracy, clipped fraction and batch size are RELEASED only as
DP estimates (``dpbert.privacy.diagnostics``: Gaussian noise on each bounded per-step sum, charged
in the same per-step event, σ_eff); ``TensorBoard`` and ``TrainResult.released_diagnostics`` hold
those. The exact values (``TrainResult.losses`` / ``final_mlm_*`` / ``clipped_fraction``,
``train_result.json``) are computed on the private examples without noise: operator-only, they
stay in the private state directory.

Distribution (``dpbert.engine.devices``): default, mirrored, tpu (untested), multi_worker
(``MultiWorkerMirroredStrategy`` over ``$TF_CONFIG``; every worker process calls ``train_mlm``
with the same inputs and the same shared ``output_dir``): worker w keeps the units with
``sampling.shard_of(id, W) == w`` (a patient's tuples on one worker) and Poisson-samples its own
units at q with a fresh key per process; the noise seed is the chief's, shared by an all-reduce,
and the one draw is added after the SUM (``dpbert.mechanism``). Only the CHIEF (rank 0) locks
and writes the state directory; non-chief workers save their checkpoints to a temporary directory
removed at once (TF's MWMS rule: every worker saves) and restore from the chief's. Each step the
chief checks the budget and writes its step-log entry, then every worker enters
``DPSGDTrainStep.sync_step`` (the barrier), so no worker computes a step the chief has not
charged. A resume with another W is allowed and charges every executed step.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np

from dpbert import schema, storage
from dpbert.network import bert as bert_lib
from dpbert.engine.build import (ChainOutputs, ModelStart, NoiseSpec, RunHooks, TrainingRows, build_training,
                                       finish)
from dpbert.engine.chain import HeldStateLock, StateDirectoryBusy, state_lock  # noqa: F401
from dpbert.engine.devices import (configure_logical_cpus, make_strategy, mirrored_strategy,  # noqa: F401
                                         multi_worker_strategy)
from dpbert.engine.hooks import CrashAfter, Hook, SimulatedCrash  # noqa: F401
from dpbert.engine.loop import BudgetExhausted  # noqa: F401
from dpbert.engine.mlm import MASK_TOKEN_NAMES, WarmupLinearDecay, make_mlm_functions, make_optimizer  # noqa: F401
from dpbert.engine.progress import Progress as _Progress  # noqa: F401
from dpbert.engine.result import TrainResult
from dpbert.engine.source import mlm_patient_rounds, mlm_rounds  # noqa: F401
from dpbert.privacy.plan import TrainingPlan


def train_mlm(token_ids: np.ndarray, special_token_ids: Union[Mapping[str, int], Sequence[int]],
              vocab_size: int, model_config, training_config, output_dir,
              plan: Optional[TrainingPlan] = None, resume: bool = True, progress: bool = True,
              *, mask_token_id: Optional[int] = None, noise_mode: str = "once",
              export_saved_model: Optional[bool] = None, strategy=None,
              vocab_tokens: Optional[Sequence[str]] = None, public_checkpoint_dir=None,
              example_ids: Optional[np.ndarray] = None, initial_weights: Optional[list] = None,
              patient_keys: Optional[Sequence[str]] = None,
              charge_limit: Optional[Callable[[float, int], int]] = None,
              held_lock: Optional[HeldStateLock] = None,
              new_token_ids: Optional[Sequence[int]] = None,
              hooks: Sequence[Hook] = ()) -> TrainResult:
    """Pre-train (or resume) a BERT MLM with DP-SGD; see the module docstring for the outputs.

    ``plan``: the ``TrainingPlan`` the budget was checked against (q, steps, P, T); default
    (library use, tests): planned from ``training.dataset_size`` or, without it, the exact n — the
    pipeline always passes a public or DP-counted plan. Its q is used exactly whatever the actual n.
    ``special_token_ids``: mapping name → id (must contain ``[MASK]``) or a sequence of ids plus
    ``mask_token_id``. ``model.init: minilm`` takes the sizes from the public checkpoint
    (``dpbert.network.init_public``) and needs ``vocab_tokens`` (the new vocabulary's token strings).
    ``example_ids`` ``[n]``: each row's own record id (default the row index), which keys its MLM
    masks. ``export_saved_model``: None = ``training.export_saved_model``. ``initial_weights``:
    the MLM model's starting weights (e.g. the public start of
    ``dpbert.engine.public_warmup``); a resumed run restores its checkpoint over them.
    ``patient_keys`` ``[n]``: each row's patient, required by a plan with ``unit == "patient"``
    (user-level DP-SGD: patients Poisson-sampled at q, ≤ k rows each chosen by a secret PRF, the
    patient's summed gradient clipped to C).
    ``charge_limit(σ_accounted, steps_needed) -> L``: the most DP steps the budget covers for this
    chain, asked once; a step that would make the step log exceed L is refused
    (``BudgetExhausted``) BEFORE its write-ahead entry.
    ``held_lock``: ``state_lock(output_dir)``'s value when the caller already holds the lease;
    otherwise ``train_mlm`` takes it for its whole duration (``StateDirectoryBusy`` when held).
    ``new_token_ids``: the ids the DP vocabulary appended to the public one; required by
    ``training.trainable`` ``new_tokens``. What DP-SGD trains is ``training.trainable``; the
    released ``model/`` holds the MERGED weights (a plain BERT).
    ``strategy``: with ``MultiWorkerMirroredStrategy`` every worker calls ``train_mlm`` with the
    same arguments. ``hooks``: extra loop hooks (``dpbert.engine.hooks.Hook``), run after
    the built-in ones (tests: ``CrashAfter(k)`` stops like a crash after k steps).
    """
    rows = TrainingRows(token_ids, special_token_ids, mask_token_id, example_ids, patient_keys)
    start = ModelStart(model_config, vocab_size, vocab_tokens, public_checkpoint_dir, initial_weights, new_token_ids)
    outputs = ChainOutputs(output_dir, resume, held_lock, export_saved_model, progress, charge_limit)
    with build_training(rows, start, training_config, outputs, plan, NoiseSpec(noise_mode), RunHooks(tuple(hooks)),
                        strategy) as training:
        training.loop.run()
        return finish(training)


def load_models(output_dir) -> bert_lib.BertModels:
    """Rebuild the trained models from ``output_dir/model`` (config + weights; any storage)."""
    model_dir = storage.join(str(output_dir), schema.MODEL_DIR)
    models = bert_lib.build_bert(bert_lib.BertSpec.from_dict(
        storage.read_json(storage.join(model_dir, bert_lib.MODEL_CONFIG_FILE))))
    models.mlm.load_weights(storage.join(model_dir, bert_lib.WEIGHTS_PREFIX)).expect_partial()
    return models
