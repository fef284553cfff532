"""tests/skip_guard.py: pytest runs (subprocesses, on generated test files) where a skip that is not
in the allowlist fails the session, under pytest-xdist too, and a listed one passes; the real
allowlist names tests that exist; no test module skips on a missing import."""
import ast
import os
import subprocess
import sys
import textwrap

import pytest

from tests.skip_guard import read_allowlist
from tests.pyproject_meta import REPO

TESTS = textwrap.dedent('''
    import pytest

    @pytest.fixture
    def needs_tool():
        pytest.skip("tool missing")

    def test_skips_in_the_call():
        pytest.skip("not today")

    @pytest.mark.skipif(True, reason="marker")
    def test_skipif_marker():
        pass

    def test_fixture_skip(needs_tool):
        pass

    @pytest.mark.xdist_group("shared")  # --dist loadgroup makes its node id ...::test_grouped_skip@shared
    def test_grouped_skip(needs_tool):
        pass

    @pytest.mark.xfail(reason="expected", strict=True)
    def test_xfail_is_not_a_skip():
        assert False

    def test_passes():
        pass
''')
ALL = ["test_skips_in_the_call", "test_skipif_marker", "test_fixture_skip", "test_grouped_skip"]


def run_pytest(tmp_path, allowed, *args, module=TESTS, name="test_generated.py"):
    """Run pytest with the skip guard on ``module`` in ``tmp_path``, ``allowed`` (test names) listed.
    The child loads no installed plugin but the ones ``args`` name (``-p xdist``): each costs a
    second of start-up per process, and the guard is a conftest, not an installed plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nskip_allowlist = allow.txt\naddopts = -p no:cacheprovider\n")
    (tmp_path / "conftest.py").write_text("from tests.skip_guard import *  # noqa: F401,F403\n")
    (tmp_path / "allow.txt").write_text("# generated\n" + "".join(
        f"{name}::{test} # reason {i}\n" for i, test in enumerate(allowed)))
    (tmp_path / name).write_text(module)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", *args, name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


#: One xdist worker process: the skip is turned into a failure there and the controller reports it.
XDIST = ("-p", "xdist", "-n", "1", "--dist", "loadgroup")


def test_an_unlisted_skip_fails_the_session(tmp_path):
    result = run_pytest(tmp_path, ["test_skips_in_the_call", "test_grouped_skip"])
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-3000:]
    out = result.stdout
    # the fixture's skip is an error at setup, the marker's too; the listed ones and xfail stay as they are
    assert "2 errors" in out and "2 skipped" in out and "1 xfailed" in out and "1 passed" in out, out[-2000:]
    assert "test_generated.py::test_skipif_marker skipped (marker), and skips fail unless listed in allow.txt" in out
    assert "test_generated.py::test_fixture_skip skipped (tool missing)" in out
    assert "test_generated.py::test_skips_in_the_call: reason 0" in out   # the listed skip, in the summary


def test_listed_skips_pass_under_xdist(tmp_path):
    result = run_pytest(tmp_path, ALL, *XDIST)
    assert result.returncode == pytest.ExitCode.OK, result.stdout[-3000:]
    assert "4 skipped" in result.stdout and "1 xfailed" in result.stdout
    assert "test_generated.py::test_grouped_skip: reason 3" in result.stdout


def test_an_unlisted_skip_fails_under_xdist(tmp_path):
    result = run_pytest(tmp_path, ALL[:2], *XDIST)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-3000:]
    assert "test_generated.py::test_fixture_skip skipped (tool missing)" in result.stdout
    assert "test_generated.py::test_grouped_skip@shared skipped (tool missing)" in result.stdout


def test_a_module_that_skips_at_import_fails(tmp_path):
    module = "import pytest\n\npytest.importorskip('no_such_module_dpbert')\n\ndef test_never():\n    pass\n"
    result = run_pytest(tmp_path, [], module=module)
    assert result.returncode != pytest.ExitCode.OK, result.stdout[-3000:]
    assert "could not import 'no_such_module_dpbert'" in result.stdout


def test_an_allowlist_line_without_a_reason_is_refused(tmp_path):
    path = tmp_path / "allow.txt"
    path.write_text("tests/x.py::test_y # fine\ntests/x.py::test_z\n")
    with pytest.raises(pytest.UsageError, match=r"allow.txt:2: expected '<node id> # <why it may skip>'"):
        read_allowlist(path)


def test_every_allowed_skip_names_an_existing_test():
    for nodeid in read_allowlist(REPO / "tests" / "skip_allowlist.txt"):
        path, _, name = nodeid.partition("::")
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert name.split("[")[0] in names, f"tests/skip_allowlist.txt: {nodeid} is not a test"


def test_no_test_skips_on_a_missing_import():
    """Every dependency is in the lock: a test imports it, and a broken install fails."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "test_no_silent_skips.py":
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(REPO)}" for needle in ("importorskip(", "skipif(not hasattr")
                      if needle in text]
    assert not offenders, f"skip on a missing import or attribute: {offenders}"
