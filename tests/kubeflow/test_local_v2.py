"""Rehearse compiled tasks through TFX's Kubeflow V2 container entrypoint (kubeflow/local_v2.py):
the executor input Vertex AI would send, the executor output Vertex AI would read back."""
import os

import pytest

from tests.kubeflow.conftest import task_names

from tests.tiny import CLASSIC
from tests.no_cloud_storage import NoCloudStorage

TINY = CLASSIC + [
    "corpus.synthetic.patients=6",
    "vocab.sigma=2",
    "vocab.delta=1e-6",
    "vocab.size=300",
    "training.steps=4",
    "training.batch_size=8",
    "training.checkpoint_every=2",
    "model.max_seq_length=64",
    "beam.direct_num_workers=2",
    "membership.holdout_patient_fraction=0",
]


def _root_tasks(spec):
    tasks = spec["pipelineSpec"]["root"]["dag"]["tasks"]
    return sorted(name for name, task in tasks.items() if not task.get("dependentTasks"))


@pytest.fixture(scope="module")
def rehearsed_roots(compile_spec, tmp_path_factory):
    from kubeflow.local_v2 import run_spec_locally

    spec = compile_spec(TINY)
    root = tmp_path_factory.mktemp("rehearsal")
    return spec, run_spec_locally(spec, str(root), tasks=_root_tasks(spec), in_process=True)


def test_root_tasks_run_under_the_v2_entrypoint(rehearsed_roots):
    spec, outputs = rehearsed_roots
    assert set(outputs) == set(_root_tasks(spec)) and outputs
    components = spec["pipelineSpec"]["components"]
    for task, artifacts in outputs.items():
        declared = components[spec["pipelineSpec"]["root"]["dag"]["tasks"][task]["componentRef"]["name"]]
        assert set(artifacts) == set(declared.get("outputDefinitions", {}).get("artifacts", {}))
        for artifact in artifacts.values():
            assert os.path.exists(artifact["uri"])
            assert artifact["metadata"]["tfx_version"]  # what Vertex AI records on the artifact
    tuples = outputs["CorpusIngest"]["tuples"]
    assert tuples["metadata"]["num_tuples"] > 0 and tuples["metadata"]["private"] == 1


def test_task_order_follows_dependencies():
    from kubeflow.local_v2 import task_order

    spec = {"pipelineSpec": {"root": {"dag": {"tasks": {
        "c": {"dependentTasks": ["a", "b"]}, "b": {"dependentTasks": ["a"]}, "a": {}}}}}}
    assert task_order(spec) == ["a", "b", "c"]
    spec["pipelineSpec"]["root"]["dag"]["tasks"]["a"]["dependentTasks"] = ["c"]
    with pytest.raises(ValueError, match="cycle"):
        task_order(spec)


def test_downstream_components_read_upstream_properties_on_vertex(rehearsed_roots):
    """On Vertex AI an input artifact's custom properties come back from its metadata as
    struct values (numbers as floats): what a downstream component's get_property must read."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils

    from components.common import get_property

    spec, outputs = rehearsed_roots
    produced = dict(outputs["CorpusIngest"]["tuples"])
    produced["type"] = {"instanceSchema": "title: components.WordTuples\ntype: object\n"}
    artifact = kubeflow_v2_entrypoint_utils._parse_raw_artifact(  # pylint: disable=protected-access
        json_format.ParseDict(produced, pipeline_spec_pb2.RuntimeArtifact()), {})
    assert get_property(artifact, "num_tuples") == produced["metadata"]["num_tuples"]


@pytest.mark.slow
@pytest.mark.e2e
def test_whole_dag_rehearses_under_the_v2_entrypoint(compile_spec, tmp_path):
    """Every task, in a fresh interpreter each, as the containers would run them."""
    from kubeflow.local_v2 import run_spec_locally

    spec = compile_spec(TINY)
    outputs = run_spec_locally(spec, str(tmp_path))
    assert set(outputs) == task_names(spec)


def test_a_synthetic_rehearsal_keeps_its_ledger_under_its_own_folder_a_real_dataset_does_not(tmp_path):
    """The public synthetic corpus: a local ledger (no credentials), its generator's id even in a
    target compiled with a real one. A real dataset: the ledger the spec names, unchanged (a
    rehearsal's releases come from the same patients)."""
    import json

    from dpbert.config import CorpusConfig
    from dpbert.ledger.identity import synthetic_dataset_id
    from dpbert.accounting.target import LedgerTarget
    from kubeflow.local_v2 import local_ledger_target

    remote, sid = "gs://my-bucket/dpbert/ledgers", synthetic_dataset_id(CorpusConfig())
    public = LedgerTarget(sid, "patient", 1e-6, 8.0, remote).to_json()
    local = LedgerTarget.from_json(local_ledger_target(public, str(tmp_path)))
    assert json.loads(local.to_json()) == dict(json.loads(public), location=str(tmp_path / ".ledgers"))
    real = LedgerTarget("notes", "patient", 1e-6, 8.0, remote).to_json()
    assert local_ledger_target(real, str(tmp_path)) == real
    moved = LedgerTarget.from_json(local_ledger_target(real, str(tmp_path), synthetic_id=sid))
    assert (moved.dataset_id, moved.location) == (sid, str(tmp_path / ".ledgers"))
    assert local_ledger_target("", str(tmp_path)) == ""  # no dataset identity: nothing to move


REAL_ID = ["corpus.dataset_id=Ward7", "privacy.epsilon_budget=10000"]  # the tiny run spends ε ≈ 75


@pytest.mark.parametrize("layout", ["rehearsal", "vertex"])
def test_the_trainer_receives_the_rehearsal_root_and_a_synthetic_ledger(compile_spec, tmp_path, layout):
    """Compiled with a real corpus.dataset_id and a gs:// ledger, the synthetic corpus's trainer
    task gets the generator's id, ROOT/.ledgers, and ROOT as its pipeline root (in either layout)."""
    from dpbert.ledger.identity import is_synthetic_id
    from dpbert.accounting.target import LedgerTarget
    from kubeflow.local_v2 import executor_input, spec_synthetic_id, task_folder

    spec = compile_spec(TINY + REAL_ID)
    task = spec["pipelineSpec"]["root"]["dag"]["tasks"]["MLMPretrainer"]["inputs"]["parameters"]
    compiled = LedgerTarget.from_json(task["ledger_target"]["runtimeValue"]["constantValue"]["stringValue"])
    assert is_synthetic_id(compiled.dataset_id) and compiled.dataset_id == spec_synthetic_id(spec)
    assert task["pipeline_root"]["runtimeValue"]["constantValue"]["stringValue"] == "gs://my-bucket/dpbert/root"
    upstream = {"DPVocabularyGen": {"vocabulary": {"uri": "v"}}, "CorpusIngest": {"tuples": {"uri": "t"}}}
    got = executor_input(spec, "MLMPretrainer", str(tmp_path), upstream, layout)
    params = got["inputs"]["parameters"]
    assert params["pipeline_root"] == {"stringValue": str(tmp_path)}
    target = LedgerTarget.from_json(params["ledger_target"]["stringValue"])
    assert (target.dataset_id, target.location) == (compiled.dataset_id, str(tmp_path / ".ledgers"))
    assert got["outputs"]["artifacts"]["model"]["artifacts"][0]["uri"].startswith(
        task_folder(str(tmp_path), "MLMPretrainer", layout))


def test_the_rehearsal_s_private_folders_are_operator_only(tmp_path):
    import stat

    from kubeflow.local_v2 import PRIVATE_FOLDERS, make_private_folders

    (tmp_path / "_trainer_state").mkdir(mode=0o755)
    make_private_folders(str(tmp_path))
    for name in PRIVATE_FOLDERS:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o700, name


def _snapshot(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["rehearsal", "vertex"])
def test_a_synthetic_rehearsal_compiled_for_a_real_dataset_completes_offline_inside_its_folder(
        compile_spec, tmp_path, monkeypatch, layout):
    """Compiled with a real corpus.dataset_id and a gs:// ledger: every task COMPLETEs with no
    gs:// access (a storage spy), and nothing is written outside ROOT (the parent's snapshot)."""
    from dpbert.storage import api
    from kubeflow.local_v2 import run_spec_locally

    spy = NoCloudStorage()
    monkeypatch.setitem(api._SINGLETONS, "gs", spy)  # pylint: disable=protected-access
    spec = compile_spec(TINY + REAL_ID)
    parent = tmp_path / "parent"
    root = parent / "rehearsal"
    root.mkdir(parents=True)
    (parent / "neighbour.txt").write_text("x", encoding="utf-8")
    before = _snapshot(parent)
    outputs = run_spec_locally(spec, str(root), in_process=True, layout=layout)
    assert set(outputs) == task_names(spec)
    assert spy.touched == []
    after = _snapshot(parent)
    assert [p for p in after if not p.startswith("rehearsal" + os.sep)] == [p for p in before]
    assert any(p.startswith(os.path.join("rehearsal", "_trainer_state")) for p in after)
    assert [p for p in after if p.startswith(os.path.join("rehearsal", ".ledgers"))]
