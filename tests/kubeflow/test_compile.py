"""Compiling the DAG for Vertex AI (kubeflow/runner.py): golden spec, optional branches,
importability of every Python path the spec names, resources, validation, the CLI."""
import dataclasses
import difflib
import json
import os
import re
from pathlib import Path
from typing import Callable, FrozenSet, Optional, Tuple

import pytest

from tests.kubeflow.conftest import DATAFLOW, IMAGE, LEDGER, PIPELINE_ROOT, task_names
from tests.kubeflow.spec_normalize import CODE_VERSION, normalize

GOLDEN = Path(__file__).parent / "golden" / "vertex_pipeline.json"
REGENERATE = "UPDATE_GOLDEN=1 .venv/bin/pytest tests/kubeflow"


# --- golden file ----------------------------------------------------------------------------------

def _dump(spec) -> str:
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"


def test_compiled_spec_matches_golden(compile_spec):
    """The whole compiled PipelineJob (built-in defaults + Dataflow), normalized.

    A deliberate DAG change (a new component, parameter, artifact type) changes it: review the
    diff and regenerate with UPDATE_GOLDEN=1. Code edits alone do not (code_version is
    normalized), nor do TFX/SDK versions, timestamps or the image.
    """
    actual = _dump(normalize(compile_spec(DATAFLOW), IMAGE))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(actual, encoding="utf-8")
    assert GOLDEN.exists(), f"no golden file {GOLDEN}; create it with {REGENERATE}"
    expected = GOLDEN.read_text(encoding="utf-8")
    if actual != expected:
        diff = list(difflib.unified_diff(expected.splitlines(), actual.splitlines(), "golden", "compiled",
                                         lineterm="", n=2))
        shown = "\n".join(diff[:120]) + ("\n..." if len(diff) > 120 else "")
        pytest.fail(f"the compiled Vertex spec differs from {GOLDEN.name}; if the change is intended, "
                    f"regenerate with {REGENERATE}\n{shown}")


def test_golden_normalization_ignores_code_versions_versions_and_image(compile_spec):
    spec = compile_spec(DATAFLOW)
    tasks = spec["pipelineSpec"]["root"]["dag"]["tasks"]
    hashed = [t["inputs"]["parameters"]["code_version"] for t in tasks.values()
              if "code_version" in t.get("inputs", {}).get("parameters", {})]
    assert hashed, "every component is expected to carry a code_version parameter"
    edited = json.loads(json.dumps(spec))
    for task in edited["pipelineSpec"]["root"]["dag"]["tasks"].values():
        param = task.get("inputs", {}).get("parameters", {}).get("code_version")
        if param:
            param["runtimeValue"]["constantValue"]["stringValue"] = "0123456789abcdef"
    edited["pipelineSpec"]["sdkVersion"] = "tfx-9.99.1"
    edited["labels"]["tfx_version"] = "9-99-1"
    assert edited != spec
    other_image = "other.example/dpbert:x"
    moved = json.loads(json.dumps(edited).replace(IMAGE, other_image))
    assert normalize(moved, other_image) == normalize(spec, IMAGE)
    text = json.dumps(normalize(spec, IMAGE))
    assert CODE_VERSION in text and IMAGE not in text and "1.16" not in text
    assert re.search(r"\b[0-9a-f]{16}\b", text) is None  # no hash left


# --- optional branches ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Branch:
    """An optional part of the configuration, compiled on and off.

    ``adds`` / ``removes``: the task (component id) names present only with the branch on /
    only with it off. The test asserts the difference is exactly that, so wiring a branch into
    ``create_pipeline`` means declaring here which components it adds. ``check(on, off)``:
    optional extra assertions on the two compiled specs.
    """

    on: Tuple[str, ...]
    off: Tuple[str, ...] = ()
    adds: FrozenSet[str] = frozenset()
    removes: FrozenSet[str] = frozenset()
    check: Optional[Callable[[dict, dict], None]] = None

    @property
    def id(self) -> str:
        return "+".join(self.on)


def _no_cache(on, off):
    def cached(spec):
        return {name for name, t in spec["pipelineSpec"]["root"]["dag"]["tasks"].items()
                if t.get("cachingOptions", {}).get("enableCache")}
    assert cached(on) == set() and cached(off) == task_names(off)


def _ingest_uncached_without_fingerprint(on, off):
    """A corpus path: CorpusIngest re-reads it on every submission (no content hash in a spec to
    key the cache on: kubeflow.runner.uncache_corpus_ingest); the synthetic corpus stays cached."""
    def ingest(spec):
        return spec["pipelineSpec"]["root"]["dag"]["tasks"]["CorpusIngest"]

    assert "cachingOptions" not in ingest(on) and ingest(off)["cachingOptions"]["enableCache"]
    for spec in (on, off):
        assert "corpus_fingerprint" not in ingest(spec)["inputs"]["parameters"]
    others = task_names(on) - {"CorpusIngest"}
    assert all(on["pipelineSpec"]["root"]["dag"]["tasks"][t]["cachingOptions"]["enableCache"] for t in others)


def _dataflow_args(on, off):
    for executor in on["pipelineSpec"]["deploymentSpec"]["executors"].values():
        assert "--runner=DataflowRunner" in executor["container"]["args"]
    for executor in off["pipelineSpec"]["deploymentSpec"]["executors"].values():
        assert "--runner=DirectRunner" in executor["container"]["args"]


#: Append to this list when a configuration switch changes the DAG (or may, later).
OPTIONAL_BRANCHES = [
    Branch(on=("training.train_non_private_baseline=true",), adds=("MLMPretrainerNonPrivate",)),
    Branch(on=("vocab.non_private=true",)),
    Branch(on=("training.non_private=true",)),
    Branch(on=("privacy.epsilon_budget=8", "training.dataset_size=100000")),  # a budget needs a public n
    Branch(on=("privacy.unit=patient",)),
    Branch(on=("corpus.synthetic.with_labels=true",)),
    Branch(on=("canary.enabled=true",), adds=("CanaryGen", "CanaryExposure")),
    Branch(on=("ner.enabled=true",), adds=("NerEvaluator",)),
    Branch(on=("local_privacy.enabled=true",), adds=("TextPrivatizer",)),
    Branch(on=("membership.holdout_patient_fraction=0.3",), adds=("MembershipInference",)),
    Branch(on=("model.init=minilm",)),
    Branch(on=("corpus.path=/gcs/my-bucket/notes.jsonl",), check=_ingest_uncached_without_fingerprint),
    Branch(on=("pipeline.enable_cache=false",), check=_no_cache),
    Branch(on=tuple(DATAFLOW), check=_dataflow_args),
]


@pytest.mark.parametrize("branch", OPTIONAL_BRANCHES, ids=lambda b: b.id)
def test_optional_branch_compiles_on_and_off(branch, compile_spec):
    on, off = compile_spec(branch.on), compile_spec(branch.off)
    added, removed = task_names(on) - task_names(off), task_names(off) - task_names(on)
    assert (added, removed) == (set(branch.adds), set(branch.removes)), (
        f"{branch.id} now adds {sorted(added)} and removes {sorted(removed)} components; declare "
        f"adds=/removes= for it in OPTIONAL_BRANCHES (tests/kubeflow/test_compile.py)")
    if branch.check:
        branch.check(on, off)


# --- what the image must import -------------------------------------------------------------------

def test_every_python_path_in_the_spec_imports(compile_spec):
    from tfx.types.artifact import Artifact
    from tfx.utils import import_utils

    from kubeflow.spec_check import check_spec_importable, custom_artifact_titles, executor_class_paths

    spec = compile_spec(DATAFLOW)
    titles = custom_artifact_titles(spec)
    assert "components.WordTuples" in titles
    for title in titles:  # imported by TYPE_NAME inside the image
        cls = import_utils.import_class_by_path(title)
        assert issubclass(cls, Artifact) and cls.TYPE_NAME == title
    assert executor_class_paths(spec)
    check_spec_importable(spec)


def _artifact_classes_in_components():
    import importlib
    import pkgutil

    import components
    from tfx.types.artifact import Artifact

    found = {}
    for info in pkgutil.walk_packages(components.__path__, "components."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, Artifact)
                    and value.__module__.startswith("components")):
                found[value.TYPE_NAME] = value
    return found


def test_every_artifact_type_in_components_resolves_by_type_name():
    """Including types no component outputs yet: each must import by TYPE_NAME (re-exported
    from components/__init__.py), fit Vertex's schema-title pattern, and declare no PROPERTIES."""
    from tfx.orchestration.kubeflow.v2 import compiler_utils
    from tfx.utils import import_utils

    classes = _artifact_classes_in_components()
    assert "components.WordTuples" in classes
    for type_name, cls in classes.items():
        assert re.fullmatch(r"[a-z][a-z0-9-_]{2,20}[.][A-Z][a-zA-Z0-9-_]{2,49}", type_name), type_name
        assert import_utils.import_class_by_path(type_name) is cls, (
            f"{type_name} must be importable by its TYPE_NAME: re-export {cls.__name__} from components/__init__.py")
        assert not cls.PROPERTIES, f"{type_name}: Vertex rejects PROPERTIES on custom types; use custom properties"
        assert type_name in compiler_utils.get_artifact_schema(cls)


def test_check_spec_importable_names_what_does_not_import(compile_spec):
    from kubeflow.spec_check import check_spec_importable

    spec = compile_spec(DATAFLOW)
    ps = spec["pipelineSpec"]
    component = next(iter(ps["components"].values()))
    component.setdefault("outputDefinitions", {}).setdefault("artifacts", {})["extra"] = {
        "artifactType": {"instanceSchema": "title: components.NoSuchType\ntype: object\n"}}
    executor = next(iter(ps["deploymentSpec"]["executors"].values()))
    args = executor["container"]["args"]
    args[args.index("--executor_class_path") + 1] = "components.no_such_module.X_Executor"
    with pytest.raises(ImportError) as err:
        check_spec_importable(spec)
    assert "components.NoSuchType" in str(err.value) and "components.no_such_module" in str(err.value)


# --- the compiled file is a Vertex AI PipelineJob -------------------------------------------------

def test_compiled_json_is_a_vertex_pipeline_job(compile_spec, tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    spec = compile_spec(DATAFLOW)
    assert spec["runtimeConfig"]["gcsOutputDirectory"] == PIPELINE_ROOT
    assert spec["displayName"] == "dpbert"
    images = {e["container"]["image"] for e in spec["pipelineSpec"]["deploymentSpec"]["executors"].values()}
    assert images == {IMAGE}
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    job = aiplatform.PipelineJob(display_name="dpbert", template_path=str(path), project="my-project",
                                 location="europe-west4", credentials=AnonymousCredentials())
    resource = job._gca_resource  # built locally; nothing is submitted
    assert resource.runtime_config.gcs_output_directory == PIPELINE_ROOT
    assert set(resource.pipeline_spec["root"]["dag"]["tasks"]) == task_names(spec)


# --- resources --------------------------------------------------------------------------------------

def test_resources_become_the_steps_machine_spec(compile_spec):
    target = sorted(task_names(compile_spec(DATAFLOW)))[0]
    spec = compile_spec(DATAFLOW, resources={target: {"cpu": 8, "memory": 32, "accelerator": "NVIDIA_TESLA_T4",
                                                      "accelerator_count": 2}})
    ps = spec["pipelineSpec"]
    label = ps["components"][ps["root"]["dag"]["tasks"][target]["componentRef"]["name"]]["executorLabel"]
    for name, executor in ps["deploymentSpec"]["executors"].items():
        resources = executor["container"].get("resources")
        if name == label:
            assert resources == {"cpuLimit": 8.0, "memoryLimit": 32.0,
                                 "accelerator": {"type": "NVIDIA_TESLA_T4", "count": "2"}}
        else:
            assert resources is None


def test_parse_resources():
    from dpbert.config import ConfigError
    from kubeflow.resources import parse_resources

    cid, spec = parse_resources("Trainer:cpu=8,memory=30.5,accelerator=NVIDIA_L4")
    assert cid == "Trainer" and spec.cpu_limit == 8 and spec.memory_limit == 30.5
    assert (spec.accelerator.type, spec.accelerator.count) == ("NVIDIA_L4", 1)
    for bad in ("Trainer", "Trainer:gpu=1", "Trainer:cpu=x", "Trainer:cpu=-1", "Trainer:accelerator_count=2",
                "Trainer:accelerator=NVIDIA_L4,accelerator_count=0"):
        with pytest.raises(ConfigError):
            parse_resources(bad)


def test_resources_for_an_unknown_component_name_the_known_ones(tmp_path):
    from dpbert.config import ConfigError, load_config
    from kubeflow.runner import compile_vertex

    with pytest.raises(ConfigError, match="no component 'Nope'.*CorpusIngest"):
        compile_vertex(load_config(), str(tmp_path / "p.json"), IMAGE, PIPELINE_ROOT,
                       resources={"Nope": {"cpu": 4}})


# --- the command line -------------------------------------------------------------------------------

def _compile_cli(tmp_path, *extra):
    from kubeflow.runner import main

    out = tmp_path / "pipeline.json"
    code = main(["compile", "--target", "vertex", "--output", str(out), "--image", IMAGE,
                 "--pipeline-root", PIPELINE_ROOT, "--set", LEDGER, *extra])
    return code, out


def test_cli_compile_writes_the_pipeline_job(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("pipeline:\n  name: dpbert-test\n", encoding="utf-8")
    code, out = _compile_cli(tmp_path, "--config", str(config), "--set", "vocab.sigma=50",
                             "--resources", "CorpusIngest:cpu=4,memory=16")
    assert code == 0, capsys.readouterr().err
    assert str(out) in capsys.readouterr().out
    spec = json.loads(out.read_text(encoding="utf-8"))
    assert spec["pipelineSpec"]["pipelineInfo"]["name"] == "dpbert-test"


@pytest.mark.parametrize("extra, needle", [
    (["--set", "pipeline.name=dp_bert"], "pipeline.name"),
    (["--set", "corpus.path=gs://my-bucket/notes.jsonl", "--set", "corpus.dataset_id=notes"],
     "/gcs/my-bucket/notes.jsonl"),
    (["--set", "corpus.path=/home/me/notes.jsonl", "--set", "corpus.dataset_id=notes"], "corpus.path"),
    (["--set", "beam.runner=DataflowRunner"], "beam.extra_args must set --project, --region, --temp_location"),
    (["--set", "beam.runner=FlinkRunner"], "--job_endpoint"),
    (["--set", "beam.runner=NoSuchRunner"], "beam.runner"),
    (["--set", "vocab.sigma=-1"], "vocab.sigma"),
    (["--resources", "Nope:cpu=1"], "Nope"),
    # (without --config: the demo preset, whose unit is the patient)
    (["--set", "privacy.epsilon_budget=8", "--set", "training.dataset_patients=null",
      "--set", "corpus.path=/gcs/b/notes.jsonl", "--set", "corpus.dataset_id=notes"], "training.dataset_patients"),
    # a real dataset's budget with its ledger on this machine's disk: the steps' containers cannot share it
    (["--set", "privacy.ledger=/home/me/ledgers", "--set", "corpus.path=/gcs/b/notes.jsonl",
      "--set", "corpus.dataset_id=notes"], "privacy.ledger must be a Cloud Storage folder"),
])
def test_cli_refuses_what_cannot_run_on_vertex(tmp_path, capsys, extra, needle):
    code, out = _compile_cli(tmp_path, *extra)
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_the_synthetic_corpus_compiles_without_a_cloud_storage_ledger(tmp_path, capsys, monkeypatch):
    """Public data: its ledger is never a real one (dpbert.ledger.identity.synthetic_location),
    so a local privacy.ledger is ignored, with one line saying so, not refused."""
    from dpbert.ledger import identity

    monkeypatch.setattr(identity, "_SAID", set())
    code, out = _compile_cli(tmp_path, "--set", "privacy.ledger=/home/me/ledgers", "--set", "corpus.dataset_id=Ward7")
    assert code == 0 and out.exists()
    err = capsys.readouterr().err
    assert "corpus.dataset_id ward7 is ignored" in err


def test_cli_refuses_a_pipeline_root_outside_cloud_storage(tmp_path, capsys):
    from kubeflow.runner import main

    out = tmp_path / "p.json"
    assert main(["compile", "--output", str(out), "--image", IMAGE, "--pipeline-root", str(tmp_path)]) == 2
    assert "--pipeline-root" in capsys.readouterr().err and not out.exists()


def test_cli_over_budget_exits_3_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from pipeline import guard

    monkeypatch.setattr(guard, "planned", lambda config: {
        "within_budget": False, "epsilon_total_pld": 12.0, "delta": 1e-6, "epsilon_budget": 8.0})
    monkeypatch.setattr(guard, "dataset_budget", lambda config, ledger, chain: None)
    code, out = _compile_cli(tmp_path, "--set", "privacy.epsilon_budget=8", "--set", "training.dataset_size=100000")
    assert code == 3
    assert "exceeds" in capsys.readouterr().err and not out.exists()


def test_compile_subcommand_plugs_into_a_cli(capsys):
    """What dpbert_cli/main.py does with it: add_compile_parser(subparsers) + args.func(args)."""
    import argparse

    from kubeflow.runner import add_compile_parser, cmd_compile

    parser = argparse.ArgumentParser(prog="dpbert")
    sub = parser.add_subparsers(dest="command")
    add_compile_parser(sub)
    args = parser.parse_args(["compile", "--output", "p.json", "--image", IMAGE, "--pipeline-root",
                              PIPELINE_ROOT, "--set", "vocab.sigma=5", "--resources", "X:cpu=1"])
    assert args.func is cmd_compile and args.target == "vertex" and args.overrides == ["vocab.sigma=5"]
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["compile", "--help"])
    assert exit_.value.code == 0 and "--pipeline-root" in capsys.readouterr().out


# --- offline -----------------------------------------------------------------------------------------

_NO_NETWORK = r'''
import socket, sys
attempts = []
def _refuse(what):
    def refuse(*args, **kwargs):
        attempts.append(what)
        raise OSError("network disabled by the offline test: " + what)
    return refuse
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse("connect %r" % (address,))()
    return _connect(self, address)
def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse("connect_ex %r" % (address,))()
    return _connect_ex(self, address)
socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
socket.create_connection = _refuse("create_connection")
socket.getaddrinfo = _refuse("getaddrinfo")

from kubeflow.runner import main
code = main(sys.argv[1:])
if code == 0:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform
    aiplatform.PipelineJob(display_name="dpbert", template_path=sys.argv[sys.argv.index("--output") + 1],
                           project="my-project", location="europe-west4", credentials=AnonymousCredentials())
print("NETWORK_ATTEMPTS=%d %s" % (len(attempts), attempts[:3]))
sys.exit(code)
'''


@pytest.mark.slow  # make test-slow (CI): a subprocess; compiling is covered in process above
def test_compile_is_offline(tmp_path):
    """A fresh interpreter with every IPv4/IPv6 connection and DNS lookup refused compiles the
    Dataflow variant and loads it as a Vertex PipelineJob, without even trying the network."""
    import subprocess
    import sys

    script = tmp_path / "offline_compile.py"
    script.write_text(_NO_NETWORK, encoding="utf-8")
    out = tmp_path / "pipeline.json"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3",
               GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "no-credentials.json"),
               PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    args = ["compile", "--output", str(out), "--image", IMAGE, "--pipeline-root", PIPELINE_ROOT, "--set", LEDGER]
    for override in DATAFLOW:
        args += ["--set", override]
    result = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "NETWORK_ATTEMPTS=0 " in result.stdout, result.stdout
    assert json.loads(out.read_text(encoding="utf-8"))["pipelineSpec"]["root"]["dag"]["tasks"]


def _presets():
    from dpbert.config import CONFIG_DIR

    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


@pytest.mark.parametrize("preset", _presets())
def test_every_built_in_preset_compiles(preset, tmp_path):
    from dpbert.config import load_config
    from kubeflow.runner import compile_vertex

    path = compile_vertex(load_config(preset=preset, overrides=[LEDGER]), str(tmp_path / "p.json"), IMAGE,
                          PIPELINE_ROOT)
    assert json.loads(Path(path).read_text(encoding="utf-8"))["pipelineSpec"]["root"]["dag"]["tasks"]
