"""`dpbert report --pipeline-root` and `dpbert dashboard --pipeline-root`: a run read from the
``executor_output.json`` files a pipeline root holds (what Vertex AI writes under ``gs://``, what the
kubeflow/local_v2 rehearsal writes), not from an ML Metadata store (dpbert/pipeline_root.py).

Fast: the committed store of a real tiny run, written out as Vertex AI records it (TFX's own
conversion of each artifact's custom properties: every number a double), reports exactly as the
store does; a hand-written root with exact ε/δ strings and every report; on a local folder, ram://
and fake://. Slow: the rehearsal of a compiled tiny spec, reported from its root."""
import calendar
import json
import os
import time
import uuid

import pytest

from dpbert import pipeline_root, schema, storage
from dpbert.report import build_report, format_report

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_RUN_STORE = os.path.join(HERE, "dashboard", "data", "tiny_run.sqlite")
JOB = "dpbert-demo-20261122123147"   # the job id Vertex AI gives a run by default: <pipeline>-<time>
PROJECT = "123456789"


def vertex_executor_output(artifacts):
    """``executor_output.json``'s text as TFX's Vertex entrypoint writes it: ``artifacts`` is
    {key: (uri, MLMD custom properties)}, turned into a struct by TFX's own mapping."""
    from google.protobuf import json_format, struct_pb2
    from kfp.pipeline_spec import pipeline_spec_pb2
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils as utils

    out = pipeline_spec_pb2.ExecutorOutput()
    for key, (uri, custom_properties) in artifacts.items():
        metadata = struct_pb2.Struct()
        values = utils._get_json_value_mapping(custom_properties)  # pylint: disable=protected-access
        json_format.ParseDict(values, metadata)
        out.artifacts[key].artifacts.add(uri=uri, metadata=metadata)
    return json_format.MessageToJson(out)


def store_as_pipeline_root(store_path, root):
    """Write the newest run of the store at ``store_path`` under ``root`` with Vertex AI's layout;
    returns that run as ``dpbert.metadata`` reads it."""
    from dpbert import metadata

    store = metadata.open_store(store_path)
    run = metadata.get_run(store)
    for number, component in enumerate(run.components):
        raw = {a.id: a for a in store.get_artifacts_by_id([a.id for a in component.outputs])}
        text = vertex_executor_output({a.name: (a.uri, raw[a.id].custom_properties) for a in component.outputs})
        storage.write_text(storage.join(root, PROJECT, JOB, f"{component.node_id}_-{8000 + number}",
                                        pipeline_root.EXECUTOR_OUTPUT_FILE), text)
    return run


@pytest.fixture(params=["local", "ram", "fake"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    if request.param == "ram":
        return f"ram://pipeline-root-{uuid.uuid4().hex}/root"
    return f"fake://bucket-{uuid.uuid4().hex}/root"


def _without_identity(report):
    return {k: v for k, v in report.items() if k not in ("run_id", "duration_s", "components")}


def test_a_real_run_reports_from_its_pipeline_root_as_from_its_store(root):
    from_store = store_as_pipeline_root(TINY_RUN_STORE, root)
    run = pipeline_root.get_run(root)
    assert run.run_id == f"{PROJECT}/{JOB}" and run.pipeline == from_store.pipeline == "dpbert-demo"
    assert run.created_ms == calendar.timegm((2026, 11, 22, 12, 31, 47, 0, 0, 0)) * 1000  # from the job id
    assert [c.node_id for c in run.components] == [c.node_id for c in from_store.components]
    assert [a.type for c in run.components for a in c.outputs] == \
        [a.type for c in from_store.components for a in c.outputs]
    expected, got = build_report(from_store), build_report(run)
    assert _without_identity(got) == _without_identity(expected)
    # Both readers (dpbert.metadata.RunReader) give equal typed properties (dpbert.properties).
    from dpbert.metadata import MetadataRunReader

    runs = [reader.get_run() for reader in (MetadataRunReader(TINY_RUN_STORE), pipeline_root.PipelineRootRunReader(root))]
    typed = [[(a.type, a.name, a.typed) for c in r.components for a in c.outputs] for r in runs]
    assert len(typed[0]) == 4 and typed[0] == typed[1] and typed[0][3][2].epsilon_total_pld > 0
    assert got["status"] == "COMPLETE" and got["privacy"]["epsilon_total_pld"] > 0
    # The text: the same sections, line for line after the heading and the components' times.
    assert format_report(got).splitlines()[7:] == format_report(expected).splitlines()[7:]


def _struct(values):
    """A Vertex AI metadata struct: numbers as doubles (ints included)."""
    return {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in values.items()}


#: A hand-written run of every component, as Vertex AI records its outputs. ML Metadata would read
#: δ = 1.0001e-05 back as 1e-05 and δ_V = 1e-9 as 0: the exact strings carry the values.
HAND_WRITTEN = {
    "CorpusIngest_-11": {"tuples": {"private": 1, "num_tuples": 480, "num_documents": 160, "num_patients": 40,
                                    "tuple_words": 256, "corpus": "/data/notes.jsonl"}},
    "DPVocabularyGen_-12": {"vocabulary": {
        "private": 0, "vocab_size": 300, "words_kept": 812, "sigma": 50.0, "threshold": 231.5, "epsilon": 1.2,
        "epsilon__exact": "1.2", "delta": 0.0, "delta__exact": "1e-09", "non_private": 0, "unit": "patient",
        "dp_event": json.dumps({"name": "GaussianDpEvent", "noise_multiplier": 50.0})}},
    "MLMPretrainer_-13": {"model": {
        "private": 0, "non_private": 0, "steps_taken_total": 6, "workers": 2, "initial_mlm_loss": 8.9,
        "final_mlm_loss": 6.9, "loss_curve": "[8.9, 8.1, 7.6, 7.3, 7.05, 6.9]", "epsilon_train": 6.5,
        "epsilon_train__exact": "6.5", "dp_events": json.dumps([{"name": "PoissonSampledDpEvent"}])}},
    "MLMPretrainerNonPrivate_-14": {"model": {"private": 1, "non_private": 1, "steps_taken_total": 6,
                                              "final_mlm_loss": 4.8}},
    "PrivacyAccountant_-15": {"report": {
        "private": 0, "epsilon_vocab": 1.2, "epsilon_vocab__exact": "1.2", "epsilon_train": 6.5,
        "epsilon_train__exact": "6.5", "epsilon_total_pld": 7.123456789, "epsilon_total_pld__exact": "7.123456789",
        "delta": 1e-05, "delta__exact": "1.0001e-05", "delta_vocab": 0.0, "delta_vocab__exact": "1e-09",
        "delta_train": 1e-05, "delta_train__exact": "1e-05", "unit": "patient", "sampling": "poisson", "steps": 6,
        "epsilon_budget": 8.0, "within_budget": 1, "statement": "(7.12, 1.0001e-05)-DP at the patient level"}},
    "CanaryExposure_-16": {"report": {"private": 0, "groups": json.dumps([{"group": "x10", "exposure_dp": 1.4}]),
                                      "audit_epsilon_lower_bound": 0.31}},
    "NerEvaluator_-17": {"report": {"private": 0, "f1": 0.712}},
    "MembershipInference_-18": {"report": {"private": 0, "attacks": json.dumps(
        {"dp": {"loss threshold": {"auc": 0.53, "advantage": 0.04}}})}},
}


def write_hand_written(root, job=JOB, tasks=HAND_WRITTEN):
    for task, outputs in tasks.items():
        doc = {"artifacts": {key: {"artifacts": [{"name": f"projects/{PROJECT}/{task}/{key}",
                                                  "uri": storage.join(root, PROJECT, job, task, key),
                                                  "metadata": _struct(props)}]}
                             for key, props in outputs.items()}}
        storage.write_text(storage.join(root, PROJECT, job, task, pipeline_root.EXECUTOR_OUTPUT_FILE),
                           json.dumps(doc))


def test_a_hand_written_root_reports_exact_epsilon_and_delta(root):
    write_hand_written(root)
    report = build_report(pipeline_root.get_run(root))
    privacy = report["privacy"]
    assert privacy["delta"] == 1.0001e-05 and privacy["delta_vocab"] == 1e-09  # not 1e-05 and 0
    assert privacy["epsilon_total_pld"] == 7.123456789 and privacy["steps"] == 6
    assert privacy["epsilon_budget"] == 8.0 and privacy["epsilon_budget_approx"] is True  # no exact string
    assert report["vocab"]["size"] == 300 and isinstance(report["vocab"]["size"], int)  # 300.0 on Vertex
    assert report["pretraining"]["workers"] == 2 and report["pretraining"]["non_dp_final_mlm_loss"] == 4.8
    assert report["pretraining"]["loss_curve"][-1] == 6.9
    assert report["corpus"]["tuples"] == 480 and report["canary"]["audit_epsilon_lower_bound"] == 0.31
    assert report["ner"]["f1"] == 0.712 and report["membership_inference"]["dp"]["loss threshold"]["auc"] == 0.53
    text = format_report(report)
    assert "1.0001e-05" in text and "1e-09" in text and "≈8" in text


def test_positive_control_without_the_exact_strings_delta_reads_rounded_and_is_marked(tmp_path):
    """What the exact strings protect: dropped, δ reads as Vertex AI recorded the double and is flagged."""
    tasks = {t: {k: {p: v for p, v in props.items() if not p.endswith(schema.EXACT_SUFFIX)}
                 for k, props in outputs.items()} for t, outputs in HAND_WRITTEN.items()}
    write_hand_written(str(tmp_path), tasks=tasks)
    privacy = build_report(pipeline_root.get_run(str(tmp_path)))["privacy"]
    assert privacy["delta"] == 1e-05 and privacy["delta_approx"] is True
    assert privacy["delta_vocab"] == 0.0 and privacy["delta_vocab_approx"] is True


def test_runs_are_the_job_folders_newest_first_and_a_rehearsal_root_is_one_run(tmp_path):
    root = str(tmp_path / "root")
    write_hand_written(root, job="dpbert-demo-20261101000000")
    write_hand_written(root, job="dpbert-demo-20261201000000")
    runs = pipeline_root.list_runs(root)
    assert [r.run_id for r in runs] == [f"{PROJECT}/dpbert-demo-20261201000000",
                                        f"{PROJECT}/dpbert-demo-20261101000000"]
    assert pipeline_root.get_run(root, runs[1].run_id) is not None
    with pytest.raises(LookupError, match="no run 'nope'"):
        pipeline_root.get_run(root, "nope")
    # The job's own folder (the rehearsal's layout: ROOT/<task>/executor_output.json) is one run.
    job = pipeline_root.get_run(storage.join(root, PROJECT, "dpbert-demo-20261101000000"))
    assert job.run_id == "dpbert-demo-20261101000000" and job.pipeline == "dpbert-demo"
    assert [c.node_id for c in job.components][:3] == ["CorpusIngest", "DPVocabularyGen", "MLMPretrainer"]


def test_the_type_table_is_the_dag_s():
    """``pipeline_root.OUTPUTS`` (executor outputs carry no type) names every component's outputs
    and their types as pipeline/pipeline.py builds the DAG with every component enabled."""
    from dpbert.config import load_config
    from pipeline.pipeline import create_components

    config = load_config(None, ["local_privacy.enabled=true", "canary.enabled=true", "audit.enabled=true",
                                "membership.holdout_patient_fraction=0.2", "ner.enabled=true",
                                "training.train_non_private_baseline=true"])
    dag = [(c.id, key, schema.short_type_name(channel.type.TYPE_NAME))
           for c in create_components(config) for key, channel in c.outputs.items()]
    assert list(pipeline_root.OUTPUTS) == dag
    assert pipeline_root.output_type("MLMPretrainer", "model") == "components.PretrainedModel"
    assert pipeline_root.output_type("SomeNewTask", "report") == ""  # ambiguous by key alone


# --------------------------------------------------------------------------- the command line
def test_cli_report_reads_a_pipeline_root(root, capsys):
    from dpbert_cli.main import main

    write_hand_written(root)
    assert main(["report", "--pipeline-root", root, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == schema.encode(build_report(pipeline_root.get_run(root)))
    assert got["privacy"]["delta"] == 1.0001e-05
    assert main(["report", "--pipeline-root", root]) == 0
    text = capsys.readouterr().out
    for heading in ("components:", "privacy:", "vocab:", "pretraining:", "corpus (OPERATOR-ONLY"):
        assert heading in text
    assert main(["report", "--pipeline-root", root, "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_cli_a_folder_without_executor_outputs_exits_2_naming_it(tmp_path, capsys):
    from dpbert_cli.main import main

    empty = tmp_path / "not-a-root"
    (empty / "task").mkdir(parents=True)
    (empty / "task" / "other.json").write_text("{}", encoding="utf-8")
    for command in (["report"], ["dashboard"]):
        assert main(command + ["--pipeline-root", str(empty)]) == 2
        err = capsys.readouterr().err
        assert str(empty) in err and "executor_output.json" in err
    assert main(["report", "--pipeline-root", str(empty), "--output", str(tmp_path)]) == 2
    assert "without --output/--metadata" in capsys.readouterr().err


def test_cli_a_damaged_executor_output_exits_2_naming_the_file(tmp_path, capsys):
    from dpbert_cli.main import main

    bad = tmp_path / "root" / "CorpusIngest" / "executor_output.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"artifacts": {"tuples": {}}}', encoding="utf-8")
    assert main(["report", "--pipeline-root", str(tmp_path / "root")]) == 2
    assert f"{bad}: artifacts.tuples holds no artifact" in capsys.readouterr().err


# --------------------------------------------------------------------------- the dashboard
def test_the_dashboard_serves_a_pipeline_root(tmp_path):
    from dashboard import create_app
    from tests.dashboard.conftest import TestClient  # imported there without httpx's warning

    root = f"ram://dashboard-{uuid.uuid4().hex}/root"
    write_hand_written(root)
    run_id = f"{PROJECT}/{JOB}"
    client = TestClient(create_app(None, pipeline_root=root))
    index = client.get("/")
    assert index.status_code == 200 and JOB in index.text
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and "MLMPretrainer" in page.text and "1.0001e-05" in page.text
    assert client.get(f"/api/runs/{run_id}").json()["privacy"]["delta_vocab"] == 1e-09
    assert client.get("/api/runs").json()[0]["run_id"] == run_id
    assert client.get("/runs/nope").status_code == 404
    assert client.get(f"/runs/{run_id}/plots/budget.svg").status_code == 200
    with pytest.raises(ValueError, match="one of them"):
        create_app(None)


def test_cli_dashboard_starts_on_a_pipeline_root(tmp_path, monkeypatch, capsys):
    import uvicorn

    from dpbert_cli import dashboard as cli_dashboard
    from dpbert_cli.main import main

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(app))
    monkeypatch.setattr(cli_dashboard, "_port_refused", lambda host, port: None)
    root = str(tmp_path / "root")
    write_hand_written(root)
    assert main(["dashboard", "--pipeline-root", root, "--port", "9999"]) == 0
    assert calls[0].state.pipeline_root == root and calls[0].state.metadata_path is None
    assert f"pipeline root {root}" in capsys.readouterr().out


# --------------------------------------------------------------------------- the rehearsal
REHEARSED = ["corpus.synthetic.patients=6", "vocab.sigma=2", "vocab.size=300", "training.steps=4",
             "training.batch_size=8", "training.checkpoint_every=2", "model.max_seq_length=64",
             "privacy.epsilon_budget=null", "canary.enabled=false", "ner.enabled=false", "audit.enabled=false",
             "training.train_non_private_baseline=false", "membership.holdout_patient_fraction=0",
             "beam.direct_num_workers=1"]


@pytest.mark.slow
def test_dpbert_report_opens_a_rehearsal_s_pipeline_root(tmp_path, capsys):
    """kubeflow/local_v2 rehearses a compiled tiny spec; `dpbert report --pipeline-root` on its root
    (and on a ram:// copy) gives the report its ``--report`` gives, exact ε included."""
    from dpbert.config import load_config
    from dpbert_cli.main import main
    from kubeflow.local_v2 import run_info, run_spec_locally
    from kubeflow.runner import compile_vertex
    from kubeflow.spec_check import load_spec
    from tests.tiny import CLASSIC

    out = str(tmp_path / "pipeline.json")
    ledger = f"privacy.ledger={tmp_path / 'ledgers'}"  # the dataset ledger: here, not on gs://
    compile_vertex(load_config(None, CLASSIC + REHEARSED + [ledger]), out, "dpbert:test", "gs://my-bucket/dpbert/root")
    spec, root = load_spec(out), str(tmp_path / "root")
    started = time.monotonic()
    outputs = run_spec_locally(spec, root, tasks=["CorpusIngest", "DPVocabularyGen", "MLMPretrainer",
                                                  "PrivacyAccountant"], in_process=True)
    seconds = time.monotonic() - started
    expected = schema.encode(build_report(run_info(spec, outputs)))
    ram = f"ram://rehearsal-{uuid.uuid4().hex}/root"
    for task in outputs:
        name = storage.join(task, pipeline_root.EXECUTOR_OUTPUT_FILE)
        storage.write_text(storage.join(ram, name), storage.read_text(storage.join(root, name)))
    for where in (root, ram):
        assert main(["report", "--pipeline-root", where, "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["components"] == expected["components"] and got["status"] == "COMPLETE"
        assert _without_identity(got) == {**_without_identity(expected), "pipeline": "root"}
        assert got["privacy"]["epsilon_train"] > 0 and got["pretraining"]["steps"] == 4
    print(f"rehearsal of 4 tasks: {seconds:.0f} s")


# --- the pipeline root a trainer step receives ------------------------------------------------------

def _layouts(root):
    """(layout, the MLMPretrainer model URI it gives) under ``root``: TFX's local DAG, the
    rehearsal's, Vertex AI's (this module's docstring)."""
    from kubeflow.local_v2 import task_folder

    return [("tfx", f"{root}/MLMPretrainer/model/7"),
            ("rehearsal", task_folder(root, "MLMPretrainer") + "/model"),
            ("vertex", task_folder(root, "MLMPretrainer", "vertex") + "/model")]


def _old_arithmetic(uri):
    """A deliberately broken pipeline root (three dirnames of the output URI): the positive control."""
    import posixpath

    return posixpath.dirname(posixpath.dirname(posixpath.dirname(uri)))


def test_the_trainer_s_pipeline_root_is_the_one_it_receives_in_every_layout(tmp_path):
    import stat

    from components.common import pipeline_root_of
    from components.trainer import received_root

    root = str(tmp_path / "root")
    for layout, uri in _layouts(root):
        assert received_root(root, uri) == root, layout
        assert received_root(root + "/", uri) == root, layout
        if layout != "tfx":  # no parameter: refused, never guessed from a KFP v2 URI
            with pytest.raises(ValueError, match="pipeline_root"):
                received_root("", uri)
    assert received_root("", f"{root}/MLMPretrainer/model/7") == root  # a local DAG built without it
    assert stat.S_IMODE(os.stat(os.path.join(root, "_trainer_state")).st_mode) == 0o700
    assert pipeline_root_of("gs://b/root/", "X") == "gs://b/root"
    with pytest.raises(ValueError, match="X: parameter pipeline_root is empty"):
        pipeline_root_of(" ", "X")
    # positive control: the URI arithmetic is right for TFX only, one level off for the others
    wrong = {layout for layout, uri in _layouts(root) if _old_arithmetic(uri) != root}
    assert wrong == {"rehearsal", "vertex"}

