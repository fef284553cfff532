"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
installed by ``.ci/install-chromium.sh``) driven through chromedriver's WebDriver API, against
the ML Metadata store of a tiny real run served by uvicorn on a free loopback port.

Skips (with the reason) only when Chromium or chromedriver is not installed: Debian packages outside
the lock, so tests/skip_allowlist.txt allows these two skips (any other skip fails the session).
"""
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import threading
import time
import urllib.request
import warnings
from urllib.parse import urldefrag, urlsplit

import pytest

from dashboard import views
from dpbert import metadata, schema
from dpbert.release import released_view
from dpbert.report import build_report
from tests.dashboard import fakestore
from tests.dashboard.conftest import TINY_RUN_STORE
from tests.dashboard.webdriver import Chrome, find_chromedriver, find_chromium

# The real store is the tiny DAG run that tests/e2e/test_dag_tiny.py asserts on (the session fixture
# ``tiny_dag_run``, tests/conftest.py): run once, on the worker of the group "tiny_dag".
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("tiny_dag")]

TITLE = "dpbert dashboard"
# Each would change the page title if it ever ran as script.
XSS_URI = "/<script>document.title='pwned-uri'</script>"
XSS_PROP = "<script>document.title='pwned-prop'</script><img src=x onerror=\"document.title='pwned-img'\">"
XSS_PIPELINE = "dpbert-demo <b>bold</b><script>document.title='pwned-pipeline'</script>"
PRIVATE_MARKER = "PRIVATE-MARKER <script>document.title='pwned-private'</script>"


@pytest.fixture(scope="module")
def browser_binaries():
    chromium, chromedriver = find_chromium(), find_chromedriver()
    if not chromium or not chromedriver:
        pytest.skip("headless Chromium not found (chromium: %s, chromedriver: %s); install with "
                    "`bash .ci/install-chromium.sh` (apt-get install chromium chromium-driver)"
                    % (chromium, chromedriver))
    return chromium, chromedriver


@pytest.fixture(scope="module", params=["committed", pytest.param("tiny_dag", marks=pytest.mark.slow)])
def real_store(request, browser_binaries, tmp_path_factory):
    """A real run's store: the committed store of an earlier tiny run (``make test``), or the store
    of this code's tiny run (`dpbert run`, shared with tests/e2e/test_dag_tiny.py; slow tier) —
    falling back, when that run fails (a component in the middle of development), to the
    committed one, with a warning."""
    if request.param == "committed":
        copy = tmp_path_factory.mktemp("dashboard_committed") / "metadata.sqlite"
        shutil.copy(TINY_RUN_STORE, copy)
        return str(copy), "earlier tiny run (committed)"
    out, result = request.getfixturevalue("tiny_dag_run")
    store = out / "metadata.sqlite"
    if result.returncode == 0 and store.exists():
        print(f"\ndashboard browser test: real tiny run -> {store}")
        return str(store), "real tiny run"
    message = (f"`dpbert run` (tiny) failed with exit {result.returncode}; the browser test falls back "
               f"to the store of an earlier tiny run ({TINY_RUN_STORE}). stderr tail:\n"
               + result.stderr[-1500:])
    warnings.warn(message)
    print("\n" + message)
    fallback = tmp_path_factory.mktemp("dashboard_fallback") / "fallback.sqlite"
    shutil.copy(TINY_RUN_STORE, fallback)
    return str(fallback), "earlier tiny run (fallback)"


def inject(src: str, dst: str) -> dict:
    """Copy the store and plant HTML in it, as a private corpus's file names or tokens could; the
    copy's run loses its MembershipReport (unlinked from its execution) so that one section of the
    page is missing, as in a run without membership inference."""
    shutil.copy(src, dst)
    db = sqlite3.connect(dst)
    planted = {}
    with db:
        dropped = {a for (a,) in db.execute(
            "SELECT a.id FROM Artifact a JOIN Type t ON a.type_id = t.id WHERE t.name = 'components.MembershipReport'")}
        db.execute("DELETE FROM Event WHERE artifact_id IN (%s)" % ",".join(str(i) for i in dropped or {-1}))
        planted["dropped"] = sorted(dropped)
        private_ids = {a for (a,) in db.execute(
            "SELECT artifact_id FROM ArtifactProperty WHERE is_custom_property = 1 AND name = 'private' "
            "AND int_value = 1")}
        private_ids |= {a for (a,) in db.execute(
            "SELECT a.id FROM Artifact a JOIN Type t ON a.type_id = t.id WHERE t.name = 'components.WordTuples'")}
        first = db.execute("SELECT min(id) FROM Artifact").fetchone()[0]
        assert first is not None, "the tiny run recorded no artifact"
        db.execute("UPDATE Artifact SET uri = uri || ? WHERE id = ?", (XSS_URI, first))
        planted["uri"] = first
        db.execute("UPDATE Context SET name = ? WHERE type_id = (SELECT id FROM Type WHERE name = 'pipeline')",
                   (XSS_PIPELINE,))
        # a visible string property of a public artifact (DPVocabulary, reports, ...), when the DAG has one
        row = db.execute(
            "SELECT artifact_id, name FROM ArtifactProperty WHERE is_custom_property = 1 AND string_value "
            "IS NOT NULL AND name NOT IN ('dp_event', 'dp_events') AND artifact_id NOT IN (%s) "
            "ORDER BY artifact_id, name LIMIT 1" % ",".join(str(i) for i in private_ids or {-1})).fetchone()
        if row:
            db.execute("UPDATE ArtifactProperty SET string_value = ? WHERE artifact_id = ? AND name = ? "
                       "AND is_custom_property = 1", (XSS_PROP, row[0], row[1]))
            planted["property"] = row
        # a withheld property of a private artifact: must not appear at all
        row = db.execute(
            "SELECT artifact_id, name FROM ArtifactProperty WHERE is_custom_property = 1 AND string_value "
            "IS NOT NULL AND name NOT LIKE 'num\\_%%' ESCAPE '\\' AND artifact_id IN (%s) LIMIT 1"
            % ",".join(str(i) for i in (private_ids - dropped) or {-1})).fetchone()
        if row:
            db.execute("UPDATE ArtifactProperty SET string_value = ? WHERE artifact_id = ? AND name = ? "
                       "AND is_custom_property = 1", (PRIVATE_MARKER, row[0], row[1]))
            planted["private"] = row
    db.close()
    return planted


@contextlib.contextmanager
def uvicorn_server(store: str):
    """uvicorn in a background thread on a free loopback port, as `serve` configures the app."""
    import uvicorn

    from dashboard.app import LOOPBACK_HOSTS, create_app

    # The socket is bound here (port 0: a free port, no window for another xdist worker to take it).
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(store, allowed_hosts=LOOPBACK_HOSTS), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dashboard-uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def served(real_store, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("dashboard_injected") / "metadata.sqlite")
    planted = inject(real_store[0], store)
    with uvicorn_server(store) as base:
        yield {"base": base, "store": store, "planted": planted, "source": real_store[1]}


@pytest.fixture(scope="module")
def chrome(browser_binaries, tmp_path_factory):
    chromium, chromedriver = browser_binaries
    work = tmp_path_factory.mktemp("chromium")
    browser = Chrome(chromedriver, chromium, str(work / "profile"), str(work / "chromedriver.log"))
    yield browser
    browser.close()


def http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status


def test_dashboard_in_headless_chromium(served, chrome, tmp_path):
    base, planted = served["base"], served["planted"]
    print(f"\nstore: {served['source']}; planted: {planted}")

    # index: the run is listed; following its link (a real click) opens the run page
    chrome.get(base + "/")
    assert chrome.title == TITLE
    run_links = chrome.find_all("a.run-link")
    assert len(run_links) == 1
    run_id = chrome.text(run_links[0])
    index_links = [chrome.prop(a, "href") for a in chrome.find_all("a[href]")]
    # the runs page answers "what did the run spend?": ε (PLD) of the ledger, its unit, δ, budget
    run = metadata.get_run(metadata.open_store(served["store"]), run_id)
    ledger = build_report(run)["privacy"]
    assert ledger["epsilon_total_pld"] is not None
    # "≈" marks a value ML Metadata kept to ~7 digits only (an older store has no exact text)
    shown = chrome.text(chrome.find("td.epsilon"))
    assert shown == views.privacy_summary(run)["epsilon"] and shown.lstrip("≈") == views.fmt(ledger["epsilon_total_pld"])
    row = chrome.text(chrome.find("table.runs tbody tr"))
    assert ledger["unit"] in row and f"{ledger['delta']:.3g}" in row
    assert ("no budget" if ledger["epsilon_budget"] is None else "within budget") in row
    assert "COMPLETE" in row
    chrome.click(run_links[0])
    assert urlsplit(chrome.url).path.startswith("/runs/")
    assert chrome.title == f"{run_id} · {TITLE}"  # no planted script changed it
    assert chrome.alert_text() is None
    assert run_id in chrome.text(chrome.find("h1"))
    body = chrome.text(chrome.find("body"))
    assert "CorpusIngest" in body and "Privacy ledger" in body and "Artifacts" in body
    assert "Corpus" in body and "operator-only: exact counts of the private data" in body

    # planted HTML shows as text, never as elements, and nothing ran
    assert XSS_URI.strip("/") in body and XSS_PIPELINE in body
    assert chrome.execute("return document.scripts.length") == 0
    assert chrome.execute("return document.querySelectorAll('img[src=\"x\"], img[onerror]').length") == 0
    if "property" in planted:
        assert XSS_PROP in body
    source = chrome.source
    assert "PRIVATE-MARKER" not in source and "PRIVATE-MARKER" not in body
    assert "not in this run" in body  # at least one section is missing from a tiny run

    # every image (the charts) loaded and decoded; every link answers; every anchor has its target
    images = chrome.execute("return Array.from(document.images).map(i => [i.src, i.complete && i.naturalWidth])")
    assert images and all(width > 0 for _, width in images), images
    page_links = [chrome.prop(a, "href") for a in chrome.find_all("a[href]")]
    for link in set(index_links + page_links):
        url, fragment = urldefrag(link)
        assert url.startswith(base + "/"), f"external link {link}"
        assert http_status(url) == 200, link
        if fragment and url == urldefrag(chrome.url)[0]:
            assert chrome.execute("return document.getElementById(arguments[0]) !== null", fragment), link

    # the screenshot, for review
    shot = chrome.screenshot(str(tmp_path / "dashboard-run.png"))
    print(f"screenshot: {shot}")
    assert os.path.getsize(shot) > 10_000

    # the JSON report link, in the browser: exactly build_report as strict JSON
    run = metadata.get_run(metadata.open_store(served["store"]), run_id)
    released = chrome.prop(chrome.find("a[href^='/api/runs/'][href$='/released']"), "href")
    chrome.get(chrome.prop(chrome.find("a[href^='/api/runs/']:not([href$='/released']):not([href$='/dag'])"),
                           "href"))
    shown = json.loads(chrome.text(chrome.find("body")))
    assert shown == json.loads(schema.dumps(build_report(run)))
    # the released view link: dpbert.release.released_view of the same report
    chrome.get(released)
    assert json.loads(chrome.text(chrome.find("body"))) == json.loads(schema.dumps(released_view(build_report(run))))
    assert chrome.title != "pwned-uri"


def test_every_chart_of_a_full_run_in_headless_chromium(browser_binaries, chrome, fake_store, tmp_path):
    """The synthetic store has every report the DAG will write: all five charts must load."""
    with uvicorn_server(fake_store) as base:
        chrome.get(base + "/")
        table = chrome.text(chrome.find("table.runs"))
        rich_row = next(line for line in table.splitlines() if fakestore.RICH_RUN in line)
        assert "7.1" in rich_row and "patient" in rich_row and "2e-06" in rich_row and "within budget" in rich_row
        links = {chrome.text(a): a for a in chrome.find_all("a.run-link")}
        chrome.click(links[fakestore.RICH_RUN])
        assert chrome.title == f"{fakestore.RICH_RUN} · {TITLE}"
        images = chrome.execute(
            "return Array.from(document.images).map(i => [i.src.split('/').pop(), i.complete && i.naturalWidth])")
        assert sorted(name for name, width in images if width > 0) == \
            ["budget.svg", "dag.svg", "exposure.svg", "loss.svg", "loss_comparison.svg", "roc.svg"], images
        badges = chrome.execute("return Array.from(document.querySelectorAll('.badge.operator-only')).length")
        assert badges >= 6 and chrome.execute("return document.querySelectorAll('.badge.released').length") >= 4
        body = chrome.text(chrome.find("body"))
        assert f"token {fakestore.SCRIPT} & more" in body  # shown as text
        assert chrome.execute("return document.scripts.length") == 0 and chrome.alert_text() is None
        assert not any(secret in body for secret in fakestore.PRIVATE_SECRETS)
        shot = chrome.screenshot(str(tmp_path / "dashboard-full-run.png"))
        print(f"\nscreenshot (synthetic full run): {shot}")
