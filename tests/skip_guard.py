"""A pytest plugin: a skipped test FAILS unless its node id is in the skip allowlist.

Everything the tests import is installed from the lock, so a skip usually hides a broken install
or a test that no longer runs; only a few skips depend on the machine (a Debian package outside
the lock) and those are listed, each with its reason, in the file the ini option
``skip_allowlist`` names (``tests/skip_allowlist.txt``, relative to the rootdir):

    tests/dashboard/test_browser.py::test_x # why this test may skip

The skip is turned into a failure in the process that ran the test (an xdist worker too), so the
report, ``-x`` and the exit status see a failure. Listed skips are printed in the summary.
tests/conftest.py imports these hooks; tests/test_no_silent_skips.py runs pytest on generated files.
"""
from pathlib import Path

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_runtest_makereport", "pytest_make_collect_report",
           "pytest_terminal_summary", "read_allowlist"]

ALLOWED = pytest.StashKey[dict]()
SOURCE = pytest.StashKey[str]()


def read_allowlist(path: Path) -> dict:
    """``{node id: reason}`` from ``path``: one ``<node id> # <reason>`` a line; ``#`` lines are comments."""
    allowed = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        nodeid, _, reason = line.partition(" # ")
        if "::" not in nodeid or not reason.strip():
            raise pytest.UsageError(f"{path}:{lineno}: expected '<node id> # <why it may skip>', got {line!r}")
        allowed[nodeid.strip()] = reason.strip()
    return allowed


def pytest_addoption(parser):
    parser.addini("skip_allowlist", "file (relative to the rootdir) of the node ids allowed to skip, with why; "
                                    "every other skip fails", default="")


def pytest_configure(config):
    name = config.getini("skip_allowlist")
    config.stash[SOURCE] = name or "(no skip_allowlist configured)"
    config.stash[ALLOWED] = read_allowlist(config.rootpath / name) if name else {}


def _listed(nodeid: str, allowed: dict) -> bool:
    # pytest-xdist's --dist loadgroup appends "@<group>" to the node id of an xdist_group test.
    return nodeid in allowed or nodeid.rsplit("@", 1)[0] in allowed


def _fail_unlisted(report, config):
    if not report.skipped or hasattr(report, "wasxfail") or _listed(report.nodeid, config.stash[ALLOWED]):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = (f"{report.nodeid} skipped ({reason}), and skips fail unless listed in "
                       f"{config.stash[SOURCE]}: install what it needs (make venv installs the lock), or list "
                       f"it there with the reason if the machine legitimately lacks it")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_unlisted(report, item.config)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_unlisted(report, collector.config)
    return report


def pytest_terminal_summary(terminalreporter, config):
    allowed = config.stash[ALLOWED]
    shown = sorted({r.nodeid.rsplit("@", 1)[0] if r.nodeid not in allowed else r.nodeid
                    for r in terminalreporter.stats.get("skipped", []) if _listed(r.nodeid, allowed)})
    if shown:
        terminalreporter.section(f"allowed skips ({config.stash[SOURCE]})", sep="-")
        for nodeid in shown:
            terminalreporter.line(f"{nodeid}: {allowed[nodeid]}")
