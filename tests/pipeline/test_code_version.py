"""pipeline/code_version.py: a component's code_version hashes exactly the first-party files its
module imports (transitively, function-body imports included) and nothing else."""
import shutil
from pathlib import Path

import pytest

from pipeline import code_version as cv

COMPONENTS = ("components.ingest", "components.privatizer", "components.vocabulary", "components.canary",
              "components.trainer", "components.accountant", "components.membership", "components.ner")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the first-party packages, to edit."""
    root = tmp_path_factory.mktemp("repo")
    for package in cv.FIRST_PARTY:
        shutil.copytree(cv.ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def _edit(path: Path):
    path.write_text(path.read_text(encoding="utf-8") + "\n# an edit\n", encoding="utf-8")


def test_trainer_sources_are_what_it_imports():
    sources = cv.component_sources("components.trainer")
    for needed in ("components/trainer.py", "components/__init__.py", "components/artifacts.py",
                   "dpbert/__init__.py", "dpbert/engine/__init__.py", "dpbert/engine/train.py",
                   "dpbert/privacy/plan.py"):
        assert needed in sources
    assert "dpbert/local_privacy/experiments.py" not in sources
    assert not [s for s in sources if s.startswith(("pipeline/", "dpbert_cli/", "kubeflow/", "dashboard/"))]


def test_function_body_imports_and_bundled_data_count():
    # components/vocabulary.py imports the stage, which imports the Beam job, inside a function
    assert "dpbert/vocab/beam_histogram.py" in cv.component_sources("components.vocabulary")
    assert any(s.startswith("dpbert/resources/ner/") for s in cv.component_sources("components.ner"))
    for module, paths in cv.DATA.items():
        assert cv._module_file(module, cv.ROOT) is not None, module
        assert all((cv.ROOT / p).exists() for p in paths), paths


def test_every_component_has_its_own_version():
    versions = {m: cv.component_code_version(m) for m in COMPONENTS if cv._module_file(m, cv.ROOT)}
    assert len(set(versions.values())) == len(versions)
    assert all(len(v) == 16 and int(v, 16) >= 0 for v in versions.values())


def test_an_edit_changes_exactly_the_components_that_import_it(tree):
    before = {m: cv.component_code_version(m, tree) for m in COMPONENTS if cv._module_file(m, tree)}
    assert cv.component_code_version("components.trainer", tree) == cv.component_code_version("components.trainer")

    _edit(tree / "dpbert" / "local_privacy" / "experiments.py")  # imported by no component
    assert {m: cv.component_code_version(m, tree) for m in before} == before

    _edit(tree / "dpbert" / "engine" / "train.py")
    after = {m: cv.component_code_version(m, tree) for m in before}
    assert after["components.trainer"] != before["components.trainer"]
    for m in before:
        assert (after[m] != before[m]) == ("dpbert/engine/train.py" in cv.component_sources(m, tree)), m

    _edit(tree / "dpbert" / "vocab" / "beam_histogram.py")  # a function-body import of the vocabulary only
    again = {m: cv.component_code_version(m, tree) for m in before}
    assert again["components.vocabulary"] != after["components.vocabulary"]
    assert again["components.trainer"] == after["components.trainer"]


def test_static_resolution_on_a_toy_tree(tmp_path):
    files = {
        "components/__init__.py": "",
        "components/comp.py": "import os\nfrom dpbert import a\n\ndef run():\n    from .helper import f\n"
                              "    import dpbert.pkg.deep\n",
        "components/helper.py": "from . import other\n",
        "components/other.py": "",
        "dpbert/__init__.py": "",
        "dpbert/a.py": "from .pkg import *\nimport numpy\n",
        "dpbert/pkg/__init__.py": "",
        "dpbert/pkg/deep.py": "from ..b import thing\n",
        "dpbert/b.py": "thing = 1\n",
        "dpbert/unused.py": "",
        "dpbert/pkg/unused.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert cv.component_sources("components.comp", tmp_path) == sorted(
        k for k in files if "unused" not in k)
    with pytest.raises(ValueError, match="numpy"):
        cv.component_sources("numpy", tmp_path)
