"""The dashboard's dataset page and its JSON twin (Starlette's TestClient, no server): after two
runs on one dataset they show every ledger entry and the composed total the gate enforces
(``gate.decide(...).spent``) after each entry and over all, against the pinned budget; a run page
links to its dataset's page. Positive control: the same checks fail on a view that shows only the
run's own ε."""
from __future__ import annotations

import html
import re
from urllib.parse import quote

import pytest

from dashboard import create_app
from dpbert.accounting import gate
from dpbert.privacy.numbers import fmt_epsilon
from tests.dashboard import datasetstore
from tests.dashboard.conftest import TestClient, links_of


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    built = datasetstore.build(str(tmp_path_factory.mktemp("dataset_page")))
    return built, TestClient(create_app(built["store"]))


def query(uri: str) -> str:
    return "?ledger=" + quote(uri, safe="")


def assert_dataset_json(body: dict, built: dict):
    doc, entries, v = built["doc"], built["entries"], built["verdict"]
    assert [e["id"] for e in body["entries"]] == [e["id"] for e in entries]  # every entry, by time
    assert body["totals"]["epsilon_spent"] == pytest.approx(v.spent, rel=1e-12) and body["totals"]["rule"] == v.rule
    assert body["totals"]["epsilon_pld"] == pytest.approx(v.epsilon_pld)
    assert body["totals"]["epsilon_rdp"] == pytest.approx(v.epsilon_rdp)
    assert body["epsilon_budget"] == pytest.approx(v.budget)
    for i, row in enumerate(body["entries"]):  # the composed total over time
        assert row["after"]["epsilon_spent"] == pytest.approx(gate.decide(doc, entries[:i + 1], pld=True).spent)


def assert_dataset_html(text: str, built: dict):
    v = built["verdict"]
    spent = re.search(r'id="dataset-spent">([^<]*)<', text)
    assert spent and spent.group(1) == fmt_epsilon(v.spent), spent
    assert f"pinned budget ε = {fmt_epsilon(v.budget)}" in text
    rows = re.findall(r'<tr class="entry">(.*?)</tr>', text, re.S)
    assert len(rows) == len(built["entries"])
    for row, entry in zip(rows, built["entries"]):
        assert html.escape(entry["run_id"]) in row


def test_dataset_page_and_json_show_every_entry_and_the_gate_total(two_runs):
    built, client = two_runs
    r = client.get("/api/dataset" + query(built["ledger"]))
    assert r.status_code == 200
    assert_dataset_json(r.json(), built)
    page = client.get("/dataset" + query(built["ledger"]))
    assert page.status_code == 200 and page.headers["content-security-policy"].startswith("default-src 'none'")
    assert_dataset_html(page.text, built)
    chart = [link for link in links_of(page.text).links if link.startswith("/dataset/plot.svg")]
    assert chart and client.get(chart[0]).headers["content-type"].startswith("image/svg+xml")


def test_the_run_page_links_to_its_dataset_and_tells_the_dataset_total(two_runs):
    built, client = two_runs
    runs = {r["run_id"]: r for r in client.get("/api/runs").json()}
    page = client.get(runs[datasetstore.RUNS[-1]]["page"]).text
    assert "/dataset" + query(built["ledger"]) in [html.unescape(x) for x in links_of(page).links]
    assert f"composed ε = {fmt_epsilon(built['verdict'].spent)}" in page
    assert "against the configured budget" not in page  # the run's own ε is not called the budget's verdict


def test_a_ledger_the_app_is_given_and_what_is_not_a_ledger(two_runs, tmp_path):
    built, _ = two_runs
    client = TestClient(create_app(built["store"], ledger=built["ledger"]))
    assert_dataset_json(client.get("/api/dataset").json(), built)
    other = tmp_path / "ward7.json"
    other.write_text('{"not": "a ledger"}')
    for uri in (str(other), str(tmp_path / "absent.json"), str(tmp_path)):
        assert client.get("/api/dataset" + query(uri)).status_code == 404
        assert client.get("/dataset" + query(uri)).status_code == 404
    bare = TestClient(create_app(built["store"]))
    assert bare.get("/api/dataset").status_code == 404


def test_positive_control_a_view_of_the_run_alone_fails_the_checks(two_runs):
    built, client = two_runs
    body = client.get("/api/dataset" + query(built["ledger"])).json()
    own = body["entries"][-1]["epsilon_pld"]  # what a run-only view reports as "the" ε
    run_only = {**body, "totals": {**body["totals"], "epsilon_spent": own},
                "entries": [{**e, "after": {**e["after"], "epsilon_spent": e["epsilon_pld"]}} for e in body["entries"]]}
    with pytest.raises(AssertionError):
        assert_dataset_json(run_only, built)
    page = client.get("/dataset" + query(built["ledger"])).text
    with pytest.raises(AssertionError):
        assert_dataset_html(page.replace(f'id="dataset-spent">{fmt_epsilon(built["verdict"].spent)}<',
                                         f'id="dataset-spent">{fmt_epsilon(own)}<'), built)


def test_dashboard_ledger_option_refuses_what_is_not_a_ledger(two_runs, tmp_path, capsys):
    from dpbert import exit_codes
    from dpbert_cli.main import main

    built, _ = two_runs
    bad = tmp_path / "ward7.json"
    bad.write_text("[]")
    assert main(["dashboard", "--metadata", built["store"], "--ledger", str(bad), "--port", "1"]) == exit_codes.BAD_INPUT
    assert "--ledger" in capsys.readouterr().err
    import argparse

    from dpbert_cli.dashboard import _ledger

    assert _ledger(argparse.Namespace(ledger=built["ledger"])) == built["ledger"]  # control: a ledger passes
