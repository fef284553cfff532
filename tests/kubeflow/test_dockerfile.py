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


def _instructions(dockerfile=DOCKERFILE):
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            yield keyword.upper(), rest.strip()


def _copied_sources(dockerfile=DOCKERFILE):
    sources = set()
    for keyword, rest in _instructions(dockerfile):
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        parts = [p for p in rest.split() if not p.startswith("--")]
        sources.update(p.rstrip("/") for p in parts[:-1])
    return sources


def _setup_packages():
    """The top-level package names pyproject.toml's [tool.setuptools.packages.find] include lists."""
    return top_level_packages()


def _runs(dockerfile=DOCKERFILE):
    return [rest for keyword, rest in _instructions(dockerfile) if keyword == "RUN"]


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


# --- the CUDA image (kubeflow/Dockerfile.cuda): checked as text, it cannot be built or run here ---
CUDA_DOCKERFILE = REPO / "kubeflow" / "Dockerfile.cuda"
CUDA_LOCK = "requirements/lock-cuda-py310.txt"


def _pins(path):
    return dict(re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", line).groups()
                for line in (REPO / path).read_text(encoding="utf-8").splitlines() if re.match(r"[A-Za-z0-9]", line))


def test_cuda_lock_is_the_cpu_lock_plus_tensorflows_cuda_wheels():
    cpu, cuda = _pins(LOCK), _pins(CUDA_LOCK)
    assert cuda["tensorflow"] == cpu["tensorflow"] == "2.16.2"
    assert {k: v for k, v in cuda.items() if k in cpu} == cpu  # every CPU pin, unchanged
    extra = set(cuda) - set(cpu)
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12", "nvidia-cuda-nvcc-cu12"} <= extra
    assert all(name.startswith("nvidia-") for name in extra), sorted(extra)
    header = (REPO / CUDA_LOCK).read_text(encoding="utf-8").splitlines()[1]
    assert "uv pip compile" in header and "requirements/requirements-cuda.in" in header
    assert "tensorflow[and-cuda]==2.16.2" in (REPO / "requirements/requirements-cuda.in").read_text(encoding="utf-8")


def test_cuda_dockerfile_installs_its_lock_without_a_resolver_and_the_same_sources():
    runs = " && ".join(_runs(CUDA_DOCKERFILE))
    assert re.search(r"pip install (--\S+ )*--no-deps (--\S+ )*-r " + re.escape(CUDA_LOCK), runs), runs
    assert runs.index(CUDA_LOCK) < runs.index("--no-deps .")
    assert "ldconfig" in runs and "is_built_with_cuda" in runs  # the pip CUDA libraries are found
    assert _copied_sources(CUDA_DOCKERFILE) - {CUDA_LOCK} == _copied_sources() - {LOCK}
    envs = " ".join(rest for keyword, rest in _instructions(CUDA_DOCKERFILE) if keyword == "ENV")
    assert re.search(r"(^|\s)TF_USE_LEGACY_KERAS=1(\s|$)", envs), envs
    text, cpu = CUDA_DOCKERFILE.read_text(encoding="utf-8"), DOCKERFILE.read_text(encoding="utf-8")
    for line in ("ARG BEAM_VERSION=", "ARG PYTHON_IMAGE=", "ENTRYPOINT "):
        assert re.search(f"^{line}.*$", text, re.M).group(0) == re.search(f"^{line}.*$", cpu, re.M).group(0)


def test_cuda_dockerignore_sends_what_is_copied_and_nothing_else():
    path = REPO / "kubeflow" / "Dockerfile.cuda.dockerignore"
    lines = [l.strip() for l in path.read_text(encoding="utf-8").splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == "*"
    allowed = {l[1:] for l in lines if l.startswith("!")}
    assert _copied_sources(CUDA_DOCKERFILE) <= allowed and ".venv" not in allowed


def test_a_gpu_trainer_runs_the_cuda_image_and_its_custom_job_asks_for_the_gpu(tmp_path):
    """Chosen at compile time: vertex.accelerator_type → the trainer steps and their custom job's
    replicas run --cuda-image; every other step the CPU image."""
    import json

    from dpbert.config import load_config
    from kubeflow.runner import compile_vertex, trainer_image
    from tests.kubeflow.conftest import IMAGE, PIPELINE_ROOT

    cuda = IMAGE.replace("dpbert:", "dpbert-cuda:")
    gpu = load_config(None, ["training.workers=2", "vertex.project=my-project", "vertex.accelerator_type=NVIDIA_L4",
                             "vertex.accelerator_count=1"])
    assert trainer_image(load_config(None, []), IMAGE, cuda) == IMAGE
    assert trainer_image(load_config(None, []), IMAGE, cuda, {"MLMPretrainer": {"accelerator": "NVIDIA_L4"}}) == cuda
    out = tmp_path / "p.json"
    spec = json.loads(open(compile_vertex(gpu, str(out), IMAGE, PIPELINE_ROOT, cuda_image=cuda)).read())["pipelineSpec"]
    tasks = spec["root"]["dag"]["tasks"]
    images = {}
    for task, body in tasks.items():
        label = spec["components"][body["componentRef"]["name"]]["executorLabel"]
        images[task] = spec["deploymentSpec"]["executors"][label]["container"]["image"]
    assert images.pop("MLMPretrainer") == cuda
    assert set(images.values()) == {IMAGE}
    job = json.loads(tasks["MLMPretrainer"]["inputs"]["parameters"]["custom_job"]["runtimeValue"]["constantValue"]
                     ["stringValue"])["customJob"]
    for pool in job["jobSpec"]["workerPoolSpecs"]:
        assert pool["containerSpec"]["imageUri"] == cuda
        assert pool["machineSpec"]["acceleratorType"] == "NVIDIA_L4" and pool["machineSpec"]["acceleratorCount"] == 1
