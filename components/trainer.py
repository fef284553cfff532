"""MLMPretrainer: DP-SGD (or, explicitly, non-private) BERT masked-LM pre-training.

Adapter over ``dpbert.stages.pretrain``, which holds out patients, inserts the canaries, plans
the run (one ``TrainingPlan``), trains in a stable state directory under the pipeline root (so a
re-run resumes and the ledger charges every step ever executed) and builds the DP event from
the steps actually taken, which the accountant recomputes ε from.

The pipeline root is a parameter the DAG passes (``pipeline_root``): TFX gives an executor none,
and the output URI's layout differs between TFX, Vertex AI and the rehearsal
(``components.common.pipeline_root_of``). The trainer state under it is operator-only: on a local
disk its folder is made 0700 before anything is written there.
"""
import os

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import CanaryList, DPVocabulary, PretrainedModel, WordTuples
from components.common import get_property, pipeline_root_of, set_properties
from dpbert import schema
from dpbert.config import TrainingConfig, section_from_json
from dpbert.properties import to_write


@component
def MLMPretrainer(
    tuples: InputArtifact[WordTuples],
    vocabulary: InputArtifact[DPVocabulary],
    model: OutputArtifact[PretrainedModel],
    model_config: Parameter[str],
    training_config: Parameter[str],
    privacy_config: Parameter[str],
    membership_config: Parameter[str],
    code_version: Parameter[str],
    non_private: Parameter[int] = 0,
    canaries: InputArtifact[CanaryList] = None,
    custom_job: Parameter[str] = "",
    ledger_target: Parameter[str] = "",
    pipeline_root: Parameter[str] = "",
):
    """Tokenize the tuples with the DP vocabulary and pre-train; one tuple = one example.

    ``membership_config``: the patient split only (``membership.holdout_*``), so the evaluation's
    own settings do not re-train the model. ``non_private``: 1 for the non-private baseline.
    ``ledger_target``: the dataset ledger (``dpbert.ledger.LedgerTarget`` JSON; empty: none).
    ``pipeline_root``: the pipeline root the DAG was built with (the trainer state lives under it).
    The stage runs as a ``dpbert.launch`` job (``dpbert.trainer_workers``): in this process with
    one worker; with ``training.workers`` W > 1, W worker processes started here on loopback, or,
    with ``custom_job`` (the CustomJob template a compiled Vertex AI spec carries,
    ``kubeflow.custom_job``), the replicas of a Vertex AI custom job this step submits and waits
    for. Either way the chief's result becomes this artifact's.
    """
    from dpbert.trainer_workers import Sections, invocation, train

    tc = section_from_json(TrainingConfig, training_config)
    root = received_root(pipeline_root, model.uri)
    inv = invocation(tuples.uri, vocabulary.uri, model.uri,
                     Sections(model_config, training_config, privacy_config, membership_config), pipeline_root=root, canaries_dir=None if canaries is None else canaries.uri,
                     non_private=bool(non_private),
                     # The vocabulary's DP record: the trainer refuses any step the budget does not cover.
                     vocab_event=get_property(vocabulary, schema.DP_EVENT),
                     # The dataset's privacy ledger: the run's charge is reserved before the data is read.
                     ledger_target=ledger_target)
    result = train(inv, choose_launcher(tc.workers, custom_job))
    set_properties(model, to_write(schema.PRETRAINED_MODEL, {**result["properties"], "workers": result["workers"],
                                                             "code_version": code_version}))


def choose_launcher(workers: int, custom_job: str = ""):
    """Where the trainer's processes run: the replicas of the compiled Vertex AI custom job
    (``custom_job``: its template), W > 1 local worker processes on loopback, or this process."""
    from dpbert.launch import InProcessLauncher, LocalWorkersLauncher, VertexCustomJobLauncher

    if custom_job:
        return VertexCustomJobLauncher(custom_job)
    return LocalWorkersLauncher() if workers > 1 else InProcessLauncher()


def received_root(pipeline_root: str, model_uri: str) -> str:
    """The ``pipeline_root`` parameter, its trainer-state folder made private. Empty: only a
    local TFX DAG built without it is accepted, whose output URI is TFX's own
    ``ROOT/<node>/<key>/<execution id>`` (``tfx.orchestration.portable.outputs_utils``); any other
    layout (Vertex AI, the rehearsal) is a ValueError, never a guess one folder off."""
    if not pipeline_root:
        parts = str(model_uri).rstrip("/").split("/")
        if not (len(parts) > 3 and parts[-1].isdigit() and parts[-2] == "model"):
            pipeline_root_of("", "MLMPretrainer")  # raises: names the missing parameter
        pipeline_root = "/".join(parts[:-3])
    root = pipeline_root_of(pipeline_root, "MLMPretrainer")
    make_state_root_private(root)
    return root


def make_state_root_private(root: str) -> None:
    """``ROOT/_trainer_state`` mode 0700 on a local disk (the checkpoints, exact curves and step
    log inside are operator-only, whatever their own modes); on object storage access is the
    bucket's IAM, the operator's (docs/running-on-vertex.md)."""
    from dpbert import storage
    from dpbert.stages.pretrain import STATE_ROOT

    if storage.is_remote(root):
        return
    folder = os.path.join(root[len("file://"):] if root.startswith("file://") else root, STATE_ROOT)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # an existing folder too (makedirs' mode is masked, and not applied to it)
