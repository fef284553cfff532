"""docs/running-on-vertex.md compiles as written, offline and without credentials.

* Every ``dpbert compile`` (or ``python -m kubeflow.runner compile``) command in a fenced block is
  run with its own options, in a folder holding the guide's named YAML files (a block whose first
  line is ``# NAME.yaml``) and with ``$IMAGE`` / ``$CUDA_IMAGE`` as the guide's build block sets
  them; it exits 0, writes its output and ends with the summary. An unnamed YAML block is a
  fragment: its sections replace those of ``vertex.yaml``, compiled by the guide's plain
  ``--config vertex.yaml`` command. (All of them: about 10 s, the first compile's imports included.)
* Every Python block parses, and its imports of this repository's packages resolve (modules the
  guide asks the reader to write excepted).
* The region (``vertex.region`` or the image's regional Artifact Registry host) and the summary
  ``dpbert compile`` ends with.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import shlex
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml

from dpbert import storage
from tests.kubeflow.conftest import IMAGE, PIPELINE_ROOT

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "running-on-vertex.md"
#: Modules the guide's recipes ask the reader to write (section 8).
TO_WRITE = {"components.vertex_ui", "system"}
PROJECT_PACKAGES = {"dpbert", "kubeflow", "pipeline", "components", "dashboard", "beam_jobs", "dpbert_cli"}
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_PROGRAMS = (["dpbert", "compile"], ["python", "-m", "kubeflow.runner", "compile"])


def fenced(text: str, language: str) -> List[Tuple[int, str]]:
    """(line, body) of every fenced block of ``language``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in _FENCE.finditer(text)
            if m.group(1).strip() == language]


def guide_image(text: str, variable: str = "IMAGE") -> str:
    """The ``IMAGE=`` (or another ``variable``) of the guide's build block, its ``$TAG`` a commit."""
    for _, body in fenced(text, "bash"):
        found = re.search(rf"^{variable}=(\S+)$", body, re.M)
        if found:
            return found.group(1).replace("$TAG", "abc1234")
    raise AssertionError(f"the guide sets no {variable}=")


def compile_commands(text: str) -> List[Tuple[int, List[str]]]:
    """(line, argv from ``compile`` on) of every compile command in a bash block."""
    found = []
    for start, body in fenced(text, "bash"):
        lines, at = body.split("\n"), 0
        while at < len(lines):
            first, logical = at, lines[at]
            while logical.endswith("\\") and at + 1 < len(lines):
                at += 1
                logical = logical[:-1] + " " + lines[at]
            at += 1
            words = shlex.split(logical, comments=True)
            for program in _PROGRAMS:
                if words[:len(program)] == program:
                    found.append((start + first + 1, words[len(program) - 1:]))
    return found


def plain_vertex_yaml_case(cases):
    """The first command that compiles ``vertex.yaml`` with no override."""
    return next(case for case in cases if "vertex.yaml" in case[1] and "--set" not in case[1])


def config_files(text: str) -> Tuple[Dict[str, str], List[Tuple[int, str]]]:
    """The named YAML files (``# NAME.yaml`` first line) and the unnamed fragments (line, text)."""
    named, fragments = {}, []
    for line, body in fenced(text, "yaml"):
        first = body.split("\n", 1)[0].strip()
        if re.fullmatch(r"#\s*[\w.-]+\.ya?ml", first):
            named[first.lstrip("#").strip()] = body
        else:
            fragments.append((line, body))
    return named, fragments


def guide_cases(text: str) -> List[Tuple[str, List[str], Dict[str, str]]]:
    """(label, argv, files to write) of every command, then of every fragment (over vertex.yaml)."""
    images = {f"${name}": guide_image(text, name) for name in ("IMAGE", "CUDA_IMAGE")}
    named, fragments = config_files(text)
    cases = []
    for line, argv in compile_commands(text):
        argv = [images.get(word, word) for word in argv]
        cases.append((f"line {line}", argv, dict(named)))
    base = yaml.safe_load(named["vertex.yaml"])
    first = plain_vertex_yaml_case(cases)[1]
    for line, body in fragments:
        merged = dict(base, **yaml.safe_load(body))
        argv = [f"fragment-{line}.yaml" if word == "vertex.yaml" else word for word in first]
        files = dict(named, **{f"fragment-{line}.yaml": yaml.safe_dump(merged)})
        cases.append((f"yaml block line {line}", argv, files))
    return cases


GUIDE_TEXT = GUIDE.read_text(encoding="utf-8")
CASES = guide_cases(GUIDE_TEXT)


class NoCredentials:
    """The gs:// backend of a machine without Google Cloud credentials: every call raises
    CredentialsMissing (and is recorded), nothing is contacted."""

    def __init__(self):
        self.touched = []

    def __getattr__(self, name):
        def refuse(uri=None, *args, **kwargs):
            self.touched.append(str(uri))
            raise storage.CredentialsMissing(str(uri))
        return refuse


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """A folder to compile in, the synthetic ledger inside it, and gs:// without credentials."""
    from dpbert.ledger import identity
    from dpbert.storage import api

    spy = NoCredentials()
    monkeypatch.setitem(api._SINGLETONS, "gs", spy)  # pylint: disable=protected-access
    monkeypatch.setenv(identity.SYNTHETIC_LEDGER_ENV, str(tmp_path / "synthetic-ledgers"))
    monkeypatch.chdir(tmp_path)
    return spy


def _prepare(tmp_path: Path, argv: List[str], files: Dict[str, str]) -> List[str]:
    """Write ``files`` here; a ``--config`` that is not one of them is read from the repository."""
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    argv = list(argv)
    if "--config" in argv:
        at = argv.index("--config") + 1
        if not (tmp_path / argv[at]).exists() and (REPO / argv[at]).exists():
            argv[at] = str(REPO / argv[at])
    return argv


def _parse(argv: List[str]):
    from kubeflow.runner import add_compile_parser

    parser = argparse.ArgumentParser(prog="dpbert")
    add_compile_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_the_guide_has_the_commands_and_blocks_to_check():
    labels = [label for label, _, _ in CASES]
    assert len(compile_commands(GUIDE_TEXT)) >= 6, labels
    assert any(label.startswith("yaml block") for label in labels), labels
    assert "vertex.yaml" in config_files(GUIDE_TEXT)[0]
    assert re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-docker\.pkg\.dev/.+:abc1234", guide_image(GUIDE_TEXT))


def test_control_the_extractor_reads_continuations_comments_and_both_programs():
    text = ("```bash\nIMAGE=x/y:$TAG\ndpbert compile --output a.json \\\n    --set a.b=1  # note\n"
            "python -m kubeflow.runner compile --output b.json\necho dpbert compile\n```\n"
            "```yaml\n# v.yaml\nk: 1\n```\n```yaml\nbeam: {}\n```\n")
    assert compile_commands(text) == [(3, ["compile", "--output", "a.json", "--set", "a.b=1"]),
                                      (5, ["compile", "--output", "b.json"])]
    assert guide_image(text) == "x/y:abc1234"
    named, fragments = config_files(text)
    assert list(named) == ["v.yaml"] and fragments == [(12, "beam: {}\n")]


def _check_before_compiling(argv: List[str]) -> None:
    """What ``dpbert compile`` checks before the TFX compiler: ConfigError (exit 2) or an
    over-budget message (exit 3) fail."""
    from dpbert.config import load_config
    from kubeflow.beam_args import cloud_beam_args
    from kubeflow.resources import parse_resources
    from kubeflow.runner import planned_budget_problem, validate_for_vertex, vertex_region

    args = _parse(argv)
    config = load_config(args.config, list(args.overrides), preset=None if args.config else "demo")
    [parse_resources(text) for text in args.resources]
    vertex_region(config, args.image)
    validate_for_vertex(config, args.pipeline_root)
    cloud_beam_args(config, args.image)
    assert planned_budget_problem(config) is None


def test_control_the_guide_s_old_vertex_yaml_is_refused(tmp_path, offline):
    """Without corpus.dataset_id and privacy.ledger the first command fails, naming the field."""
    from dpbert.config import ConfigError

    _, argv, files = plain_vertex_yaml_case(CASES)
    for drop, field in (("  dataset_id: mimic-iii\n", "corpus.dataset_id"),
                        ("  ledger: gs://my-bucket/dpbert/ledgers\n", "privacy.ledger")):
        assert drop in files["vertex.yaml"]
        broken = dict(files, **{"vertex.yaml": files["vertex.yaml"].replace(drop, "")})
        with pytest.raises(ConfigError, match=re.escape(field)):
            _check_before_compiling(_prepare(tmp_path, argv, broken))


@pytest.mark.parametrize("label, argv, files", CASES, ids=[c[0] for c in CASES])
def test_every_guide_command_compiles(label, argv, files, tmp_path, offline, capsys):
    from kubeflow.runner import main

    argv = _prepare(tmp_path, argv, files)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert (tmp_path / argv[argv.index("--output") + 1]).exists()
    for field in ("planned ε per ", "ledger admits: ", "region: ", "machines: ", "image: ", "pipeline root: "):
        assert field in out, (field, out)


# --- Python blocks ---------------------------------------------------------------------------------

def _imports(tree: ast.AST) -> List[Tuple[str, List[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def unresolved_imports(source: str) -> List[str]:
    """What a Python block imports from this repository that does not exist (other packages: only
    that they are installed)."""
    missing = []
    for module, names in _imports(ast.parse(source)):
        top = module.split(".")[0]
        if module in TO_WRITE or top in TO_WRITE:
            continue
        if top not in PROJECT_PACKAGES:
            if importlib.util.find_spec(top) is None:
                missing.append(module)
            continue
        try:
            loaded = importlib.import_module(module)
        except ImportError:
            missing.append(module)
            continue
        missing += [f"{module}.{name}" for name in names if not hasattr(loaded, name)
                    and not (hasattr(loaded, "__path__") and importlib.util.find_spec(f"{module}.{name}"))]
    return missing


def test_every_python_block_parses_and_its_imports_resolve():
    blocks = fenced(GUIDE_TEXT, "python")
    assert len(blocks) >= 3
    for line, body in blocks:
        ast.parse(body, filename=f"running-on-vertex.md:{line}")
        assert unresolved_imports(body) == [], f"running-on-vertex.md:{line}"


def test_control_an_unknown_import_and_a_syntax_error_are_caught():
    assert unresolved_imports("from dpbert.config import NoSuchThing\nimport kubeflow.nope\n") == [
        "dpbert.config.NoSuchThing", "kubeflow.nope"]
    assert unresolved_imports("from dpbert.config import load_config\nfrom components.vertex_ui import X\n") == []
    with pytest.raises(SyntaxError):
        ast.parse("job = {")


# --- the region ------------------------------------------------------------------------------------

@pytest.mark.parametrize("image, region", [
    ("europe-west4-docker.pkg.dev/p/r/dpbert:1", "europe-west4"),
    ("us-central1-docker.pkg.dev/p/r/dpbert:1", "us-central1"),
    ("northamerica-northeast1-docker.pkg.dev/p/r/i:1", "northamerica-northeast1"),
    ("europe-docker.pkg.dev/p/r/dpbert:1", None),
    ("us-docker.pkg.dev/p/r/dpbert:1", None),
    ("gcr.io/p/dpbert:1", None),
    ("eu.gcr.io/p/dpbert:1", None),
    ("dpbert:test", None),
])
def test_region_of_image(image, region):
    from kubeflow.custom_job import region_of_image

    assert region_of_image(image) == region


def _stub_compile(monkeypatch):
    """compile_vertex replaced by a writer of an empty file: the CLI's checks and summary only."""
    from kubeflow import runner

    def fake(config, output, image, pipeline_root, **kwargs):
        Path(output).write_text("{}", encoding="utf-8")
        return str(Path(output).resolve())

    monkeypatch.setattr(runner, "compile_vertex", fake)


def _cli(tmp_path, image, *extra):
    from kubeflow.runner import main

    out = tmp_path / "p.json"
    return main(["compile", "--output", str(out), "--image", image, "--pipeline-root", PIPELINE_ROOT, *extra]), out


@pytest.mark.parametrize("image", ["europe-docker.pkg.dev/p/r/dpbert:1", "gcr.io/p/dpbert:1"])
def test_a_multi_region_image_without_vertex_region_is_refused(image, tmp_path, offline, capsys, monkeypatch):
    _stub_compile(monkeypatch)
    code, out = _cli(tmp_path, image)
    assert code == 2 and not out.exists()
    assert "vertex.region must be set" in capsys.readouterr().err
    # control: the same image with vertex.region compiles, in that region
    code, out = _cli(tmp_path, image, "--set", "vertex.region=europe-west1")
    assert code == 0 and out.exists()
    assert "region: europe-west1 (vertex.region)" in capsys.readouterr().out


def test_the_region_is_derived_from_a_regional_host_and_printed(tmp_path, offline, capsys, monkeypatch):
    _stub_compile(monkeypatch)
    code, _ = _cli(tmp_path, IMAGE)
    assert code == 0
    assert "region: europe-west4 (from the image's Artifact Registry host)" in capsys.readouterr().out


def test_the_custom_job_runs_in_the_derived_or_configured_region():
    from dpbert.config import ConfigError, load_config
    from kubeflow.custom_job import build_custom_job

    workers = ["training.workers=2", "vertex.project=my-project"]
    assert build_custom_job(load_config(None, workers), IMAGE)["region"] == "europe-west4"
    assert build_custom_job(load_config(None, workers + ["vertex.region=us-east1"]), IMAGE)["region"] == "us-east1"
    with pytest.raises(ConfigError, match="vertex.region"):
        build_custom_job(load_config(None, workers), "gcr.io/p/dpbert:1")


# --- the patient unit and the summary -----------------------------------------------------------------

REAL = ["corpus.path=/gcs/b/notes.jsonl", "corpus.dataset_id=my-clinic-notes", "privacy.ledger=gs://b/ledgers"]


def test_the_patient_unit_compiles_without_training_dataset_size(tmp_path, offline, capsys, monkeypatch):
    from dpbert.config import ConfigError, load_config
    from kubeflow.runner import planned_budget_problem

    config = load_config(None, REAL, preset="own-data")
    assert config.privacy.unit == "patient" and config.training.dataset_size is None
    assert planned_budget_problem(config) is None
    _stub_compile(monkeypatch)
    args = sum((["--set", o] for o in REAL), [])
    code, _ = _cli(tmp_path, IMAGE, "--config", str(REPO / "dpbert/configs/own-data.yaml"), *args)
    assert code == 0, capsys.readouterr().err
    assert "planned ε per patient: ε_total (PLD) = " in capsys.readouterr().out
    # control: without the patients' public size it is refused, naming the field
    with pytest.raises(ConfigError, match="training.dataset_patients"):
        load_config(None, REAL + ["training.dataset_patients=null"], preset="own-data")


def _summary_fields(out: str) -> Dict[str, str]:
    lines = out.split("summary:\n", 1)[1].splitlines()
    return dict(line.strip().split(": ", 1) for line in lines if line.startswith("  "))


def test_the_summary_of_a_real_dataset_without_credentials(tmp_path, offline, capsys, monkeypatch):
    _stub_compile(monkeypatch)
    args = sum((["--set", o] for o in REAL), [])
    code, _ = _cli(tmp_path, IMAGE, "--config", str(REPO / "dpbert/configs/own-data.yaml"), *args,
                   "--set", "training.workers=2", "--set", "vertex.project=my-project",
                   "--resources", "CorpusIngest:cpu=4,memory=16")
    assert code == 0
    fields = _summary_fields(capsys.readouterr().out)
    assert re.fullmatch(r"ε_total \(PLD\) = [0-9.]+ at δ = \S+ \(vocabulary ε_V = 0, training ε_T = [0-9.]+, "
                        r"each at its own δ; n = 10000 patients, 50 steps\)", fields["planned ε per patient"])
    assert fields["ledger"] == "gs://b/ledgers/my-clinic-notes.json"
    assert fields["ledger admits"] == "ledger not read (no credentials)"
    assert fields["region"] == "europe-west4 (from the image's Artifact Registry host)"
    assert fields["machines"].startswith("trainer custom job 2 × n1-standard-8; CorpusIngest cpu=4, memory=16GB")
    assert fields["image"] == IMAGE and fields["pipeline root"] == PIPELINE_ROOT
    assert offline.touched, "the ledger was asked for (and had no credentials)"


def test_the_summary_reads_a_readable_ledger(tmp_path, offline, capsys, monkeypatch):
    """The demo's synthetic corpus: its ledger is a local folder, read; with a budget it admits steps."""
    _stub_compile(monkeypatch)
    code, _ = _cli(tmp_path, IMAGE)
    assert code == 0
    fields = _summary_fields(capsys.readouterr().out)
    from dpbert.config import load_config

    planned = load_config(None, [], preset="demo").training.steps
    assert re.match(rf"(at least )?[0-9]+ DP-SGD steps of this plan \({planned} planned; a run of [0-9]+ steps: ε_T = ",
                    fields["ledger admits"]), fields
    assert fields["ledger"].startswith(str(tmp_path / "synthetic-ledgers"))
    assert fields["machines"] == "every step: Vertex AI's default machine (size it with --resources)"
    assert not offline.touched
    # control: no public size, no plan
    code, _ = _cli(tmp_path, IMAGE, "--set", "privacy.epsilon_budget=null", "--set", "training.dataset_patients=null")
    assert code == 0
    fields = _summary_fields(capsys.readouterr().out)
    assert fields["planned ε per patient"].startswith("not planned (training.dataset_patients is unset")
