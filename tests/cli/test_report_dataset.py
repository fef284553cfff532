"""``dpbert report`` (text, ``--json``, ``--released``) and the run's last lines tell the DATASET's
truth: after two runs on one dataset, the composed total the gate enforces (``gate.decide(...).spent``,
with its rule) against the pinned budget, next to the run's own ε. Positive control: the same
checks fail on a report that shows only the run's own ε (the reports without the dataset figures)."""
from __future__ import annotations

import json

import pytest

from dpbert import metadata
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
from dpbert.report import build_report, epsilon_summary, format_report
from dpbert_cli.main import main
from tests.dashboard import datasetstore

LATEST = datasetstore.RUNS[-1]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    return datasetstore.build(str(tmp_path_factory.mktemp("two_runs")))


@pytest.fixture(scope="module")
def own_only(tmp_path_factory):
    return datasetstore.build(str(tmp_path_factory.mktemp("own_only")), with_dataset=False)


def assert_tells_dataset(text: str, built: dict):
    v = built["verdict"]
    label = {"rdp_filter": "Rényi filter at the committed order(s)", "one_planned_run_pld": "one planned run (PLD)"}
    assert f"composed ε = {fmt_epsilon(v.spent)} ({label[v.rule]}" in text, text
    assert f"pinned budget ε = {fmt_epsilon(v.budget)} at δ = {fmt_delta(v.delta)}" in text, text


def _report(built, run_id=LATEST):
    return build_report(metadata.get_run(metadata.open_store(built["store"]), run_id))


def test_two_runs_compose_above_either_run_alone(two_runs):
    v, entries = two_runs["verdict"], two_runs["entries"]
    own = _report(two_runs)["privacy"]["epsilon_total_pld"]
    assert len(entries) == 2 and v.admitted and v.spent > own > 0  # the finding: the run's own ε is not the total


def test_report_json_has_the_dataset_block_and_the_gate_total(two_runs, capsys):
    v = two_runs["verdict"]
    assert main(["report", "--metadata", two_runs["store"], "--run", LATEST, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    block = out["dataset"]
    assert block["dataset_id"] == datasetstore.DATASET and block["ledger"] == two_runs["ledger"]
    assert block["epsilon_spent"] == pytest.approx(v.spent, rel=1e-12) and block["rule"] == v.rule
    assert block["epsilon_budget"] == pytest.approx(v.budget) and block["delta"] == pytest.approx(v.delta)
    assert block["epsilon_pld"] == pytest.approx(v.epsilon_pld) and block["epsilon_rdp"] == pytest.approx(v.epsilon_rdp)
    assert block["run_epsilon"] == pytest.approx(out["privacy"]["epsilon_total_pld"])
    assert block["run_epsilon"] < block["epsilon_spent"]
    assert out["privacy"]["dataset_epsilon_spent"] == pytest.approx(v.spent)


def test_report_text_released_and_the_run_summary_show_the_dataset_total(two_runs, capsys):
    for extra in ([], ["--released"]):
        assert main(["report", "--metadata", two_runs["store"], "--run", LATEST, *extra]) == 0
        assert_tells_dataset(capsys.readouterr().out, two_runs)
    assert main(["report", "--metadata", two_runs["store"], "--run", LATEST, "--released", "--json"]) == 0
    released = json.loads(capsys.readouterr().out)
    assert released["privacy"]["dataset_epsilon_spent"] == pytest.approx(two_runs["verdict"].spent)
    summary = epsilon_summary(_report(two_runs))
    assert summary[0].startswith("this run: ε = ") and "dataset ward7:" in summary[-1]
    assert_tells_dataset(summary[-1], two_runs)  # the run's last line is the dataset's verdict


def test_positive_control_a_report_of_the_run_alone_fails_the_checks(own_only):
    report = _report(own_only)
    assert "dataset_epsilon_spent" not in report["privacy"]
    for text in (format_report(report), "\n".join(epsilon_summary(report))):
        with pytest.raises(AssertionError):
            assert_tells_dataset(text, own_only)
