"""kubeflow/Dockerfile, checked without a Docker engine: the lock is installed without a resolver,
Keras 2 is selected, and every top-level package the compiled spec imports is in the image."""
import re
from pathlib import Path

from tests.kubeflow.conftest import DATAFLOW
from tests.pyproject_meta import top_level_packages

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "kubeflow" / "Dockerfile"
DOCKERIGNORE = REPO / "kubeflow" / "Dockerfile.dockerignore"
LOCK = "requirements/lock-py310.txt"


def _instructions():
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            yield keyword.upper(), rest.strip()


def _copied_sources():
    sources = set()
    for keyword, rest in _instructions():
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        parts = [p for p in rest.split() if not p.startswith("--")]
        sources.update(p.rstrip("/") for p in parts[:-1])
    return sources


def _setup_packages():
    """The top-level package names pyproject.toml's [tool.setuptools.packages.find] include lists."""
    return top_level_packages()


def _runs():
    return [rest for keyword, rest in _instructions() if keyword == "RUN"]


def test_dockerfile_exists_with_python_310_base():
    froms = [rest for keyword, rest in _instructions() if keyword == "FROM"]
    assert froms, "no FROM"
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(encoding="utf-8"), re.M))
    final = froms[-1].split()[0]
    final = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), final)
    assert re.match(r"(python:3\.10(-|$)|gcr\.io/tfx-oss-public/tfx:1\.16\.0$)", final), final


def test_lock_is_installed_without_a_resolver_then_the_project():
    runs = " && ".join(_runs())
    assert re.search(r"pip install (--\S+ )*--no-deps (--\S+ )*-r " + re.escape(LOCK), runs), runs
    assert re.search(r"pip install (--\S+ )*--no-deps (--\S+ )*\.(\s|$)", runs), runs
    assert runs.index(LOCK) < runs.index("--no-deps .")
    assert LOCK in _copied_sources()


def test_sets_tf_use_legacy_keras():
    envs = " ".join(rest for keyword, rest in _instructions() if keyword == "ENV")
    assert re.search(r"(^|\s)TF_USE_LEGACY_KERAS=1(\s|$)", envs), envs


def test_copies_setup_py_readme_and_every_setup_package():
    copied = _copied_sources()
    assert {"pyproject.toml", "README.md"} <= copied  # pyproject.toml's readme is README.md
    missing = _setup_packages() - copied
    assert not missing, f"kubeflow/Dockerfile does not COPY {sorted(missing)} (pyproject.toml installs them)"


def test_copies_every_top_level_package_the_compiled_spec_references(compile_spec):
    """Executor class paths, custom artifact TYPE_NAMEs and entrypoint modules, parsed from the
    compiled JSON: each top-level package is the project's (COPY'd and installed by pyproject.toml)
    or an installed distribution pinned in the lock."""
    from importlib import metadata

    from kubeflow.spec_check import top_level_packages

    spec = compile_spec(DATAFLOW)
    packages = top_level_packages(spec)
    assert {"components", "tfx"} <= packages
    copied, installed_by_setup = _copied_sources(), _setup_packages()
    lock = {re.split(r"[=<>\[ ]", line)[0].lower().replace("_", "-")
            for line in (REPO / LOCK).read_text(encoding="utf-8").splitlines()
            if line and not line.startswith((" ", "#", "-"))}
    distributions = metadata.packages_distributions()
    for package in sorted(packages):
        if (REPO / package / "__init__.py").exists():
            assert package in copied, f"the compiled spec imports {package}; kubeflow/Dockerfile must COPY it"
            assert package in installed_by_setup, f"pyproject.toml must install {package} (packages.find include)"
        else:
            dists = {d.lower().replace("_", "-") for d in distributions.get(package, [])}
            assert dists & lock, f"the compiled spec imports {package}, which no distribution in {LOCK} provides"


def test_every_executor_sets_its_command(compile_spec):
    """The image's ENTRYPOINT is Beam's worker boot loader (for Dataflow): each Vertex step must
    set its own command, or it would start a Beam worker instead of the TFX executor."""
    spec = compile_spec(DATAFLOW)
    for label, executor in spec["pipelineSpec"]["deploymentSpec"]["executors"].items():
        assert executor["container"].get("command", [])[:2] == ["python", "-m"], label


def test_beam_boot_loader_matches_the_locked_beam_version():
    lock = (REPO / LOCK).read_text(encoding="utf-8")
    beam = re.search(r"^apache-beam(\[[^\]]*\])?==(\S+)", lock, re.M).group(2)
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(rf"^ARG BEAM_VERSION={re.escape(beam)}$", text, re.M), f"BEAM_VERSION must be {beam}"
    assert "FROM apache/beam_python3.10_sdk:${BEAM_VERSION} AS beam_sdk" in text
    assert "COPY --from=beam_sdk /opt/apache/beam /opt/apache/beam" in text
    assert 'ENTRYPOINT ["/opt/apache/beam/boot"]' in text
    assert "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1" in text


def test_dockerignore_sends_what_is_copied_and_nothing_else():
    lines = [l.strip() for l in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
             if l.strip() and not l.startswith("#")]
    assert lines[0] == "*"
    allowed = {l[1:] for l in lines if l.startswith("!")}
    assert _copied_sources() <= allowed
    assert ".venv" not in allowed
