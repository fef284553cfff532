"""Fast tests of the dashboard with Starlette's TestClient (no server, no browser)."""
import argparse
import builtins
import contextlib
import errno
import hashlib
import html
import inspect
import io
import json
import math
import os
import socket
from urllib.parse import quote, unquote, urlsplit

import pytest
from dashboard import create_app, serve
from dpbert import exit_codes, metadata, schema
from dashboard import views
from dpbert.release import released_view
from dpbert.report import build_report
from tests.dashboard import fakestore
from dpbert_cli import dashboard as cli_dashboard
from dpbert_cli.dashboard import add_dashboard_parser, cmd_dashboard
from dpbert_cli.main import build_parser
from tests.dashboard.conftest import TestClient, esc, links_of

RICH = "/runs/" + fakestore.RICH_RUN


def page_of(client, run_id):
    runs = {r["run_id"]: r for r in client.get("/api/runs").json()}
    return runs[run_id]["page"], runs[run_id]["report"]


# --- pages ----------------------------------------------------------------------------------

def test_index_lists_every_run_with_status_and_duration(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    text = r.text
    for run_id in (fakestore.RICH_RUN, fakestore.EMPTY_RUN):
        assert run_id in text
    assert esc(fakestore.ODD_RUN) in text
    for status in ("COMPLETE", "FAILED", "EMPTY"):
        assert status in text
    assert "17.3 s" in text  # the rich run: its 9th component ends 8.1 s + 9.2 s after the run started


def test_api_runs_lists_runs_newest_first_with_links(client):
    runs = client.get("/api/runs").json()
    assert [r["run_id"] for r in runs] == [fakestore.EMPTY_RUN, fakestore.RICH_RUN, fakestore.ODD_RUN]
    rich = runs[1]
    assert rich["status"] == "COMPLETE" and rich["components"] == 9 and rich["duration_s"] == 17.3
    assert rich["page"] == RICH and rich["report"] == "/api/runs/" + fakestore.RICH_RUN
    assert runs[2]["status"] == "FAILED" and runs[0]["status"] == "EMPTY"


def test_run_page_shows_dag_ledger_results_and_artifacts(client):
    text = client.get(RICH).text
    # the DAG: every component with its state and duration, every artifact with its URI
    for node in ("CorpusIngest", "DPVocabularyGen", "Trainer", "BaselineTrainer", "PrivacyAccountant",
                 "NerEvaluator", "CanaryEvaluator", "MembershipEvaluator"):
        assert f"<td>{node}</td>" in text
    assert "<td class=\"num\">3.2 s</td>" in text  # Trainer, the 3rd component: 3.2 s (see fakestore)
    for uri_part in ("DPVocabularyGen/vocabulary", "Trainer/model", "PrivacyAccountant/report"):
        assert uri_part in text
    # the ledger
    for label, value in (("ε_V (vocabulary)", "1.2"), ("ε_T (DP-SGD)", "6.5"), ("ε total, basic composition", "7.7"),
                         ("ε total, PLD", "7.1"), ("δ total", "2e-06"), ("unit of privacy", "patient"),
                         ("sampling mode", "poisson"), ("ε budget (configured)", "8"), ("within budget", "yes")):
        assert f"<th>{label}</th><td class=\"num\">{value}</td>" in text, label
    assert "within budget" in text and esc(fakestore.STATEMENT) in text
    # results
    assert "<th>vocabulary size</th><td class=\"num\">300</td>" in text
    assert "<th>threshold C</th><td class=\"num\">231.5</td>" in text
    assert "<th>σ (noise per count)</th><td class=\"num\">50</td>" in text
    assert "entity-level micro F1 = <strong>0.712</strong>" in text
    assert "<td>Chemical</td>" in text and "<td>non-DP</td>" in text
    assert "One-run audit: ε lower bound = 0.31" in text
    assert "<td>x100</td><td class=\"num\">100</td><td class=\"num\">2</td><td class=\"num\">13.2</td>" in text
    assert "loss threshold" in text and "auc = 0.53" in text
    for name in ("dag", "budget", "loss", "loss_comparison", "exposure", "roc"):
        assert f'src="{RICH}/plots/{name}.svg"' in text
    assert "not in this run" not in text


def _section(text, name):
    start = text.index(f'<section id="{name}">')
    return text[start:text.index("</section>", start)]


def _outside_operator_only(section):
    """A section's HTML without its operator-only blocks (``<div class="operator-only">``)."""
    out, rest = [], section
    while '<div class="operator-only"' in rest:
        before, _, after = rest.partition('<div class="operator-only"')
        out.append(before)
        rest = after.partition("</div>")[2]
    return "".join(out + [rest])


RELEASED_BADGE = '<span class="badge released"'
OPERATOR_BADGE = '<span class="badge operator-only"'


def test_operator_only_sections_are_marked_and_released_values_are_not_mixed_with_them(client):
    text = client.get(RICH).text
    # released (DP): the ledger, the DP vocabulary, the DP model's diagnostics, NER F1, the audit bound
    for name in ("privacy", "vocabulary", "pretraining", "ner"):
        heading = _section(text, name).split("</h2>")[0]
        assert RELEASED_BADGE in heading and OPERATOR_BADGE not in heading, name
    assert "One-run audit: ε lower bound = 0.31 " + RELEASED_BADGE in _section(text, "canaries")
    # operator-only: the baseline's loss, every exposure, NER rows of every model, membership, raw properties
    for name, what in (("pretraining", "final MLM loss (non-DP baseline)"), ("canaries", "exposure (non-DP)"),
                       ("ner", "<td>non-DP</td>"), ("membership", "loss threshold")):
        section = _section(text, name)
        assert what in section and what not in _outside_operator_only(section), name
        assert "operator-only: " in section, name
    assert OPERATOR_BADGE in _section(text, "membership").split("</h2>")[0]
    assert OPERATOR_BADGE in _section(text, "artifacts").split("</h2>")[0]
    assert "private: operator-only</span>" in _section(text, "artifacts")
    # no non-DP value outside the operator-only blocks of the result sections
    for name in ("privacy", "vocabulary", "pretraining", "canaries", "ner", "membership"):
        shown = _outside_operator_only(_section(text, name))
        for value in ("4.8", "13.2", "7.5", "0.79", "auc = 0.53"):
            assert value not in shown, (name, value)
    # the released loss chart is the DP curve alone; the comparison is the operator's
    assert f'src="{RICH}/plots/loss_comparison.svg"' in _section(text, "pretraining")
    assert f'src="{RICH}/plots/loss_comparison.svg"' not in _outside_operator_only(_section(text, "pretraining"))
    run = metadata.get_run(metadata.open_store(client.app.state.metadata_path), fakestore.RICH_RUN)
    report = build_report(run)
    assert views.released_loss_curve(report) == {"DP": fakestore.LOSS_CURVE}
    assert views.loss_curves(run, report)["non-DP"] == fakestore.NON_DP_LOSS_CURVE  # the private baseline's


def test_a_non_private_vocabulary_is_operator_only(client):
    page, _ = page_of(client, fakestore.ODD_RUN)
    heading = _section(client.get(page).text, "vocabulary").split("</h2>")[0]
    assert "operator-only: non-private vocabulary (exact counts)" in heading and RELEASED_BADGE not in heading


def test_api_released_is_the_released_view(client, fake_store):
    for run in metadata.list_runs(metadata.open_store(fake_store)):
        r = client.get("/api/runs/" + quote(run.run_id, safe="/") + "/released")
        assert r.status_code == 200
        assert r.json() == json.loads(schema.dumps(released_view(build_report(run))))
    rich = client.get(f"/api/runs/{fakestore.RICH_RUN}/released").json()
    assert rich["releasable"] and "membership_inference" not in rich and "components" not in rich
    assert client.get("/api/runs/" + quote(fakestore.ODD_RUN, safe="/") + "/released").json()["releasable"] is False


def test_missing_reports_say_not_in_this_run(client):
    empty = client.get("/runs/" + fakestore.EMPTY_RUN).text
    assert empty.count("not in this run") == 9  # ledger, corpus, DAG, vocab, loss, canaries, NER, MIA, artifacts
    assert client.get("/runs/" + fakestore.EMPTY_RUN + "/plots/dag.svg").status_code == 404


def test_store_of_a_real_tiny_run(tiny_store):
    """The committed store of a real tiny run: ingest → vocabulary → pre-training → accountant."""
    c = TestClient(create_app(tiny_store))
    [run] = c.get("/api/runs").json()
    text = c.get(run["page"]).text
    for node in ("CorpusIngest", "DPVocabularyGen", "MLMPretrainer", "PrivacyAccountant"):
        assert f"<td>{node}</td>" in text
    assert "tuples (WordTuples)" in text and "withheld: private artifact" in text
    assert "<th>ε_V (vocabulary)</th>" in text and "DP-BERT privacy statement" in text
    assert "<th>vocabulary size</th>" in text and "<th>final MLM loss (DP estimate)</th>" in text
    for what in ("Canary exposure", "NER evaluation", "Membership inference"):
        assert f"{what} (components." in text
    assert text.count("not in this run") == 3
    for name, status in (("dag", 200), ("budget", 200), ("loss", 200), ("loss_comparison", 404), ("exposure", 404),
                         ("roc", 404)):
        assert c.get(f"{run['page']}/plots/{name}.svg").status_code == status, name
    store = metadata.open_store(tiny_store)
    assert c.get(run["report"]).json() == json.loads(schema.dumps(
        build_report(metadata.get_run(store, run["run_id"]))))


def test_infinite_epsilon_and_failed_component(client):
    page, _ = page_of(client, fakestore.ODD_RUN)
    text = client.get(page).text
    assert "<th>ε_V (vocabulary)</th><td class=\"num\">∞</td>" in text
    assert "(no budget configured)" in text
    assert "state-failed" in text
    svg = client.get(page + "/plots/budget.svg")
    assert svg.status_code == 200


def test_every_link_and_image_works(client):
    seen, todo = set(), ["/"]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        r = client.get(url)
        assert r.status_code == 200, url
        if not r.headers["content-type"].startswith("text/html"):
            continue
        parsed = links_of(r.text)
        for link in parsed.links:
            parts = urlsplit(link)
            assert not parts.scheme and not parts.netloc, f"external link {link} on {url}"
            if link.startswith("#"):
                assert link[1:] in parsed.ids, f"dangling anchor {link} on {url}"
            elif parts.path:
                todo.append(parts.path + (f"?{parts.query}" if parts.query else ""))
    # index + 3 run pages + 3 reports + 3 released views + 3 DAG JSONs + /api/runs + stylesheet + 8 plots
    assert len(seen) >= 23
    assert any(unquote(u).startswith("/runs/" + fakestore.ODD_RUN) for u in seen)  # quoted, routed back


def test_html_in_properties_and_run_ids_is_escaped(client):
    text = client.get(RICH).text
    assert fakestore.SCRIPT not in text and "<script" not in text.lower()
    assert esc(f"token {fakestore.SCRIPT} & more") in text  # &lt;script&gt;alert(1)&lt;/script&gt;
    page, _ = page_of(client, fakestore.ODD_RUN)
    odd = client.get(page).text
    assert "<b>run</b>" not in odd and esc(fakestore.ODD_RUN) in odd
    assert "<b>run</b>" not in client.get("/").text


def test_private_artifacts_show_only_type_uri_and_unit_counts(client):
    text = client.get(RICH).text
    dag = client.get(f"/api/runs/{fakestore.RICH_RUN}/dag").text
    report = client.get(f"/api/runs/{fakestore.RICH_RUN}").text
    for secret in fakestore.PRIVATE_SECRETS:
        for body in (text, dag, report):
            for form in (secret, esc(secret), html.escape(secret), json.dumps(secret)):
                assert form not in body
    assert "<th>num_tuples</th><td>480</td>" in text and "<th>num_patients</th><td>40</td>" in text
    assert "<th>tuple_words</th>" not in text and "<th>corpus</th>" not in text
    assert "4 other properties withheld: private artifact." in text  # corpus, num_note (text), private, tuple_words
    tuples = [a for a in json.loads(dag)["artifacts"] if a["type"] == "components.WordTuples"][0]
    assert tuples["private"] and {p["key"] for p in tuples["properties"]} == {"num_documents", "num_patients",
                                                                              "num_tuples"}
    assert tuples["uri"].endswith("CorpusIngest/tuples/" + tuples["uri"].rsplit("/", 1)[1])


# --- the JSON API ---------------------------------------------------------------------------

def test_api_report_is_exactly_build_report_as_strict_json(client, fake_store):
    for run in metadata.list_runs(metadata.open_store(fake_store)):
        r = client.get("/api/runs/" + quote(run.run_id, safe="/"))
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert "Infinity" not in r.text and "NaN" not in r.text
        expected = json.loads(schema.dumps(build_report(run)))
        assert r.json() == expected
    odd = client.get(page_of(client, fakestore.ODD_RUN)[1]).json()
    assert odd["privacy"]["epsilon_vocab"] == "inf" and odd["vocab"]["epsilon"] == "inf"


def test_unknown_run_and_plot_are_404_without_reflecting_input(client):
    r = client.get("/runs/<img src=x onerror=alert(1)>")
    assert r.status_code == 404 and "onerror" not in r.text
    assert client.get("/api/runs/nope").json() == {"error": "no such run"}
    assert client.get(RICH + "/plots/nope.svg").status_code == 404
    assert client.get("/runs/" + fakestore.EMPTY_RUN + "/plots/loss.svg").status_code == 404


def test_plots_are_svg_images_without_script(client):
    for name in ("dag", "budget", "loss", "loss_comparison", "exposure", "roc"):
        r = client.get(f"{RICH}/plots/{name}.svg")
        assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml", name
        assert r.content.lstrip().startswith(b"<?xml") and b"<svg" in r.content
        assert b"<script" not in r.content.lower()


# --- safety ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_only_get_is_served(client, method):
    for url in ("/", RICH, f"{RICH}/plots/dag.svg", "/api/runs", f"/api/runs/{fakestore.RICH_RUN}",
                f"/api/runs/{fakestore.RICH_RUN}/dag", f"/api/runs/{fakestore.RICH_RUN}/released",
                "/static/style.css"):
        r = client.request(method, url)
        assert r.status_code == 405 and method not in r.headers.get("allow", ""), (method, url)
    assert client.head(RICH).status_code == 200


def test_security_headers_forbid_every_script(client):
    for url in ("/", RICH, f"{RICH}/plots/dag.svg", "/api/runs", "/static/style.css", "/nope"):
        h = client.get(url).headers
        csp = h["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp, url
        assert h["x-content-type-options"] == "nosniff" and h["x-frame-options"] == "DENY"


def test_store_is_opened_readonly_and_left_unchanged(fake_store, monkeypatch):
    opened = []
    real_open_store = metadata.open_store

    def spy(path):
        store = real_open_store(path)
        opened.append(path)
        return store

    monkeypatch.setattr(metadata, "open_store", spy)
    before = hashlib.sha256(open(fake_store, "rb").read()).hexdigest()
    files = set(os.listdir(os.path.dirname(fake_store)))
    c = TestClient(create_app(fake_store))
    for url in ("/", RICH, f"{RICH}/plots/dag.svg", "/api/runs", f"/api/runs/{fakestore.RICH_RUN}"):
        assert c.get(url).status_code == 200
    assert opened and set(opened) == {fake_store}
    assert hashlib.sha256(open(fake_store, "rb").read()).hexdigest() == before
    assert set(os.listdir(os.path.dirname(fake_store))) == files  # no journal, no WAL


def test_never_opens_artifact_files(tmp_path, monkeypatch):
    root = tmp_path / "pipeline_root"
    store = fakestore.build_store(str(tmp_path / "m.sqlite"), str(root))
    for sub in ("CorpusIngest/tuples", "DPVocabularyGen/vocabulary"):
        (root / sub).mkdir(parents=True)
        (root / sub / "data.txt").write_text("private")
    touched = []

    def recording(fn):
        def wrapper(path, *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)):
                touched.append(os.fsdecode(os.fspath(path)))
            return fn(path, *args, **kwargs)
        return wrapper

    for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "listdir"), (os, "scandir"),
                         (os, "stat")):
        monkeypatch.setattr(module, name, recording(getattr(module, name)))
    c = TestClient(create_app(store))
    for run in c.get("/api/runs").json():
        page = c.get(run["page"]).text
        for link in links_of(page).links:
            if not link.startswith("#"):
                c.get(link)
    monkeypatch.undo()
    assert any(p.endswith("run.html") for p in touched)  # the recording works (templates are read)
    assert not [p for p in touched if p.startswith(str(root))]


# --- the command line -----------------------------------------------------------------------

def _parse(argv):
    parser = argparse.ArgumentParser(prog="dpbert")
    sub = parser.add_subparsers(dest="command")
    add_dashboard_parser(sub)
    return parser.parse_args(argv)


@contextlib.contextmanager
def port_taken(port: int):
    """``127.0.0.1:port`` with a listener: ours, or whoever already holds it."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
        yield


def test_binds_127_0_0_1_by_default(fake_store, monkeypatch, capsys):
    """The defaults, with port 8080 taken (by this test or anything else on the machine): the
    command is never run against the real port, its probe is recorded instead."""
    args = _parse(["dashboard", "--metadata", fake_store])
    assert (args.host, args.port, args.func) == ("127.0.0.1", 8080, cmd_dashboard)
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    import uvicorn

    calls, probed = [], []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    with port_taken(8080):
        assert cli_dashboard._port_refused("127.0.0.1", 8080)  # the real probe sees it taken
        monkeypatch.setattr(cli_dashboard, "_port_refused", lambda host, port: probed.append((host, port)))
        assert cmd_dashboard(args) == 0
    assert probed == [("127.0.0.1", 8080)]
    [(app, kw)] = calls
    assert kw["host"] == "127.0.0.1" and kw["port"] == 8080
    assert "http://127.0.0.1:8080/" in capsys.readouterr().out
    # bound to loopback, it answers only to loopback host names (DNS rebinding guard)
    c = TestClient(app, base_url="http://127.0.0.1:8080")
    assert c.get("/").status_code == 200
    assert c.get("/", headers={"host": "localhost:8080"}).status_code == 200
    assert c.get("/", headers={"host": "evil.example:8080"}).status_code == 400


def test_a_taken_port_is_refused_before_serving(fake_store, monkeypatch, capsys):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: pytest.fail("served on a taken port"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # a free port, listened on here: no fixed port, no race
        sock.listen()
        port = sock.getsockname()[1]
        assert cmd_dashboard(_parse(["dashboard", "--metadata", fake_store, "--port", str(port)])) == \
            exit_codes.ENVIRONMENT
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_other_host_and_output_dir(fake_store, tmp_path, monkeypatch):
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    monkeypatch.setattr(cli_dashboard, "_port_refused", lambda host, port: None)  # 9999 need not be free
    out = tmp_path / "run"
    out.mkdir()
    os.link(fake_store, out / "metadata.sqlite")
    assert cmd_dashboard(_parse(["dashboard", "--output", str(out), "--host", "0.0.0.0", "--port", "9999"])) == 0
    assert (calls[0][1]["host"], calls[0][1]["port"]) == ("0.0.0.0", 9999)
    assert calls[0][0].state.metadata_path == str(out / "metadata.sqlite")


def test_missing_store_exits_2(tmp_path, capsys):
    assert cmd_dashboard(_parse(["dashboard", "--output", str(tmp_path / "nothing")])) == 2
    assert "no ML Metadata store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["dashboard", "--output", "a", "--metadata", "b"])


def test_plots_render_edge_cases():
    from dashboard import plots

    only_held_out = [{"label": "held_out", "occurrences": None, "dp": 1.0, "non_dp": None}]
    infinite = [{"label": "x1", "occurrences": 0.0, "dp": math.inf, "non_dp": 2.0},
                {"label": "x5", "occurrences": 5.0, "dp": 1.0, "non_dp": None}]
    for svg in (plots.exposure_svg(only_held_out), plots.exposure_svg(infinite),
                plots.budget_svg([("ε_V", math.inf), ("ε_T", 3.0)], None),
                plots.budget_svg([("total (PLD)", 9.0)], 8.0),
                plots.loss_svg({"DP": [3.0, math.nan, 2.0]}, 1.5),
                plots.roc_svg([{"name": "a", "fpr": [0.0, 1.0], "tpr": [0.0, 1.0], "stats": []}]),
                plots.dag_svg([{"id": "<b>A</b>", "state": "FAILED", "duration": "1 s"}], [])):
        assert svg.startswith(b"<?xml") and b"<script" not in svg and b"<b>" not in svg


def test_dpbert_cli_wires_the_dashboard():
    args = build_parser().parse_args(["dashboard"])
    assert args.func is cmd_dashboard and args.host == "127.0.0.1" and args.port == 8080


def test_unreadable_store_is_a_500_without_details(tmp_path):
    bad = tmp_path / "metadata.sqlite"
    bad.write_bytes(b"not a database " * 100)
    c = TestClient(create_app(str(bad)), raise_server_exceptions=False)
    r = c.get("/")
    assert r.status_code == 500 and r.text == "internal error (see the server log)"
    r = c.get("/api/runs")
    assert r.status_code == 500 and r.json() == {"error": "internal error (see the server log)"}
    assert "content-security-policy" in r.headers
