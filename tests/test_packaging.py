"""pyproject.toml: every top-level package is installed, the built wheel carries every module and
data file of those packages (a new yaml, template or folder of modules without ``__init__.py``
would otherwise be missing from ``pip install .`` and the Kubeflow image only), and the
``dpbert`` console script resolves."""
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile

from tests.pyproject_meta import REPO, load_pyproject, package_includes, top_level_packages

# Top-level folders with an __init__.py that are not installed, with the reason.
NOT_INSTALLED = {"tests": "the test suite runs from the checkout"}
# Files inside installed packages that are not shipped: the image's build files, read by docker only.
NOT_SHIPPED = {"kubeflow/Dockerfile", "kubeflow/Dockerfile.dockerignore", "kubeflow/Dockerfile.cuda",
               "kubeflow/Dockerfile.cuda.dockerignore"}
# Planted in the wheel test's copy, not shipped by pyproject.toml: a data file no glob matches and
# a module in a folder without __init__.py.
PLANTED = {"dpbert/resources/planted.json", "dpbert/planted_folder/module.py"}


def test_every_top_level_package_is_listed_with_its_subpackages():
    on_disk = {p.parent.name for p in REPO.glob("*/__init__.py")}
    missing = on_disk - top_level_packages() - set(NOT_INSTALLED)
    assert not missing, f"pyproject.toml [tool.setuptools.packages.find] include lacks {sorted(missing)}"
    assert not set(NOT_INSTALLED) & top_level_packages()
    for name in top_level_packages():
        assert (REPO / name / "__init__.py").is_file(), f"pyproject.toml lists {name}, which is not a package"
        assert f"{name}.*" in package_includes(), f"pyproject.toml installs {name} without its subpackages"


def test_requires_python_310_and_version_from_the_package():
    project = load_pyproject()["project"]
    assert project["requires-python"] == ">=3.10,<3.11"
    assert "version" in project["dynamic"]
    assert load_pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dpbert.__version__"}


def test_console_script_resolves_to_the_cli():
    assert load_pyproject()["project"]["scripts"] == {"dpbert": "dpbert_cli.main:main"}
    module, _, attr = "dpbert_cli.main:main".partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    # the installed distribution is this pyproject's (make venv installs it editable)
    installed = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "dpbert"]
    assert [e.value for e in installed] == ["dpbert_cli.main:main"]
    import dpbert

    assert importlib.metadata.version("dpbert") == dpbert.__version__


def _package_files(root) -> set:
    """Every file of the installed packages under ``root``, relative to it (no caches, no NOT_SHIPPED)."""
    files = set()
    for name in top_level_packages():
        for path in (root / name).rglob("*"):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and rel not in NOT_SHIPPED:
                files.add(rel)
    return files


def test_the_wheel_carries_every_module_and_data_file(tmp_path):
    """Build the wheel from a copy of the sources (never in the shared checkout) with the lock's
    setuptools, offline, and compare its files with the packages' files in the copy. The build
    calls pyproject.toml's PEP 517 backend in a child process, as ``pip wheel
    --no-build-isolation`` does (without pip's start-up). Positive control: two files planted in
    the copy that pyproject.toml does not ship must be the only ones missing."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in top_level_packages():
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in PLANTED:
        (src / rel).parent.mkdir(exist_ok=True)
        (src / rel).write_text("planted\n")
    backend = load_pyproject()["build-system"]["build-backend"]
    build = "import importlib, sys; importlib.import_module(sys.argv[1]).build_wheel(sys.argv[2])"
    result = subprocess.run([sys.executable, "-c", build, backend, str(tmp_path / "dist")],
                            cwd=src, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("dpbert-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n.rsplit("/", 1)[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    missing = _package_files(src) - names  # the copy: what was built, even if the checkout changes meanwhile
    assert PLANTED <= missing, f"the positive control shipped: {sorted(PLANTED - missing)}"
    assert not missing - PLANTED, (f"the wheel lacks {sorted(missing - PLANTED)}: a folder of modules needs "
                                   f"__init__.py, a data file a [tool.setuptools.package-data] glob in pyproject.toml")
    assert "dpbert = dpbert_cli.main:main" in entry_points
    assert not {n for n in names if n.startswith(tuple(f"{t}/" for t in NOT_INSTALLED))}


def test_the_installed_packages_find_their_data_from_another_directory(tmp_path):
    """Outside the checkout (no repo on sys.path) the installed distribution still finds its
    presets, templates and lexicons (make venv installs it editable)."""
    code = ("import importlib.resources as r, dpbert; "
            "print(all((r.files(p) / f).is_file() for p, f in [('dpbert', 'configs/demo.yaml'), "
            "('dpbert', 'configs/default.yaml'), ('dashboard', 'templates/base.html'), "
            "('dpbert.data', 'lexicons/surnames.txt')]), dpbert.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    found, location = result.stdout.split()
    assert found == "True" and location.endswith("dpbert/__init__.py")
