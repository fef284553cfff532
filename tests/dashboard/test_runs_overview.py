"""Issue 18, dashboard: the runs page answers "what did each run spend?" (ε PLD per unit, δ,
budget, within/over, status including CANCELLED); the run page has an operator-only corpus
section with warnings; the loss curve is plotted against the true training steps."""
import json
import time

import pytest

from dashboard import create_app, plots, views
from dpbert import metadata
from dpbert.report import build_report
from tests.dashboard import fakestore
from tests.dashboard.conftest import TestClient


def test_runs_page_shows_what_each_run_spent(client):
    page = client.get("/").text
    assert "<th title=\"ε total, PLD accountant (released ledger)\">ε (PLD)</th>" in page
    rich = page[page.index(fakestore.RICH_RUN):]
    rich = rich[:rich.index("</tr>")]
    assert '<td class="num epsilon">7.1</td>' in rich and "patient" in rich and ">2e-06<" in rich
    assert '<td class="num">8</td>' in rich and '<span class="verdict ok">within budget</span>' in rich
    odd = page[page.index("odd &lt;b&gt;run"):]
    odd = odd[:odd.index("</tr>")]
    assert '<td class="num epsilon">∞</td>' in odd and "no budget" in odd
    empty = page[page.index(fakestore.EMPTY_RUN):]
    assert "no privacy report" in empty[:empty.index("</tr>")]


def test_api_runs_carry_the_ledger_summary(client):
    runs = {r["run_id"]: r for r in client.get("/api/runs").json()}
    rich = runs[fakestore.RICH_RUN]
    assert (rich["epsilon_total_pld"], rich["unit"], rich["delta"], rich["epsilon_budget"], rich["within_budget"]) \
        == (7.1, "patient", 2e-6, 8.0, True)
    assert runs[fakestore.ODD_RUN]["epsilon_total_pld"] == "inf"  # strict JSON
    assert runs[fakestore.EMPTY_RUN]["epsilon_total_pld"] is None


def test_over_budget_and_cancelled_runs_on_the_runs_page(tmp_path):
    path = str(tmp_path / "metadata.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    over = b.run("over-run")
    b.execute(over, "PrivacyAccountant", "COMPLETE", outputs=[("report", "components.PrivacyReport", {
        "private": 0, "epsilon_total_pld": 12.5, "delta": 1e-5, "unit": "tuple", "epsilon_budget": 10.0,
        "within_budget": 0, "adjacency": "add_or_remove_one"})])
    time.sleep(0.01)
    since = int(time.time() * 1000)
    cancelled = b.run("cancelled-run")
    b.execute(cancelled, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_tuples": 7, "num_documents": 3, "num_words": 9,
                                             "replaced_bytes": 8683, "corpus_bytes": 20000})])
    b.execute(cancelled, "MLMPretrainer", "RUNNING")
    del b
    metadata.mark_interrupted(path, since, step=16)
    client = TestClient(create_app(path))
    page = client.get("/").text
    row = page[page.index("over-run"):]
    row = row[:row.index("</tr>")]
    assert '<span class="verdict over">OVER BUDGET</span>' in row and "(add_or_remove_one)" in row
    row = page[page.index("cancelled-run"):]
    row = row[:row.index("</tr>")]
    assert '<span class="state state-cancelled">CANCELLED</span>' in row
    run_page = client.get("/runs/cancelled-run").text
    assert "Interrupted (SIGINT/SIGTERM) in MLMPretrainer at training step 16" in run_page
    # the corpus warnings: heavy byte replacement and 3-word documents, marked operator-only
    assert "43 % of the corpus&#39;s bytes are not UTF-8" in run_page
    assert "the documents hold 3.0 words on average" in run_page
    assert run_page.count("operator-only: from exact counts of the private corpus") == 3  # + tiny corpus
    assert client.get("/api/runs").json()[0]["status"] == "CANCELLED"


def test_corpus_section_is_operator_only_and_shows_counts_not_the_location(client):
    page = client.get("/runs/" + fakestore.RICH_RUN).text
    section = page[page.index('<section id="corpus">'):]
    section = section[:section.index("</section>")]
    assert "operator-only: exact counts of the private data" in section
    assert "<th>tuples (privacy units)</th><td class=\"num\">480</td>" in section
    assert "<th>documents</th><td class=\"num\">160</td>" in section
    for secret in fakestore.PRIVATE_SECRETS:
        assert secret not in page and secret.replace("<", "&lt;") not in page
    released = client.get(f"/api/runs/{fakestore.RICH_RUN}/released").json()
    assert "corpus" not in released and "warnings" not in released


def test_loss_curve_is_plotted_against_true_steps(monkeypatch):
    # a 450-step run: the stored curve is 200 strided points + the last (dpbert.stages.pretrain)
    from dpbert.diagnostics.loss_curve import curve_steps, loss_curve

    losses = [10.0 - i / 100 for i in range(450)]
    report = {"pretraining": {"loss_curve": loss_curve(losses), "loss_curve_steps": curve_steps(450)}}
    steps = views.released_loss_steps(report)["DP"]
    assert len(steps) == len(report["pretraining"]["loss_curve"]) == 201
    assert steps[0] == 1 and steps[-1] == 450 and steps == sorted(steps)
    seen = {}
    real_svg = plots._svg

    def capture(fig):
        seen["xlim"] = fig.axes[0].get_xlim()
        seen["xdata"] = list(fig.axes[0].lines[0].get_xdata())
        return real_svg(fig)

    monkeypatch.setattr(plots, "_svg", capture)
    plots.loss_svg(views.released_loss_curve(report), None, views.released_loss_steps(report))
    assert seen["xdata"][-1] == 450 and seen["xlim"][1] >= 450  # not 201: the index of the point
    plots.loss_svg(views.released_loss_curve(report), None, None)  # an older report: indices
    assert seen["xdata"][-1] == 201


def test_loss_steps_of_a_resumed_run_and_of_an_older_run_without_the_property():
    from dpbert.report import loss_curve_steps

    # resumed from the step-250 checkpoint, 200 steps this run: points 251..450
    assert loss_curve_steps({"loss_curve": [1.0] * 200, "steps_this_run": 200, "resumed_from_step": 250}) \
        == list(range(251, 451))
    # the property wins; a mismatched or missing one gives None (plotted by index)
    assert loss_curve_steps({"loss_curve": [1.0, 2.0], "loss_curve_steps": [5, 10]}) == [5, 10]
    assert loss_curve_steps({"loss_curve": [1.0, 2.0], "loss_curve_steps": [5]}) is None
    assert loss_curve_steps({"loss_curve": [1.0, 2.0]}) is None
    assert views.released_loss_steps({"pretraining": {"loss_curve": [1.0, 2.0], "loss_curve_steps": None}}) == {}


def test_report_of_the_fake_store_has_a_private_corpus_section(fake_store):
    run = metadata.get_run(metadata.open_store(fake_store), fakestore.RICH_RUN)
    report = build_report(run)
    assert report["corpus"]["operator_only"] is True
    assert (report["corpus"]["tuples"], report["corpus"]["documents"], report["corpus"]["patients"]) == (480, 160, 40)
    for secret in fakestore.PRIVATE_SECRETS:  # counts only, never the location
        assert secret not in json.dumps(report)
