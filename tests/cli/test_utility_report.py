"""The utility table's contract (issue 16) on a synthetic ML Metadata store: `dpbert report --json`
has utility.rows (random / public / dp / non_private, each with the four columns) and the gains
kept; the released view keeps the random / public / DP rows only (no non-private row, no gain);
the text report and the dashboard's run page show the table."""
import json

import pytest

from dpbert import metadata, release, schema
from dpbert.report import build_report, format_report
from dpbert_cli.main import main
from tests.dashboard import fakestore

RUN = "2026-05-05T08:00:00.000001"
RANDOM_RUN = "2026-05-05T07:00:00.000001"
COLUMNS = set(schema.UTILITY_COLUMNS)
NON_PRIVATE_LOSS = 3.14159  # recognizable: must not appear in the released view


def _row(loss, acc, f1, std, synthetic=0.5):
    return {"heldout_mlm_loss": loss, "heldout_mlm_accuracy": acc, "ner_f1_mean": f1, "ner_f1_std": std,
            "ner_synthetic_f1_mean": synthetic, "ner_synthetic_f1_std": 0.004}


UTILITY = {
    "rows": {"random": _row(7.2, 0.03, 0.31, 0.02, 0.27), "public": _row(6.0, 0.12, 0.61, 0.011, 0.5265),
             "dp": _row(5.0, 0.2, 0.62, 0.012, 0.5512), "non_private": _row(NON_PRIVATE_LOSS, 0.41, 0.66, 0.013, 0.61)},
    "reference": "public", "public_start": True, "ner_seeds": 3, "ner_task": "bc5cdr", "ner_mode": "finetune",
    "gain_kept_mlm_loss": 0.3498, "gain_kept_mlm_loss_std": 0.0123,
    "gain_kept_ner_f1": 0.2, "gain_kept_ner_f1_std": 0.2345, "uncertainty": "delta method / bootstrap",
    "gain_kept_ner_synthetic_f1": None, "gain_kept_ner_synthetic_f1_std": None,
    "gain_kept_ner_synthetic_f1_reason": "non-private gain not significant",
}


def _run(b, run_id, utility, baseline=True):
    ctx = b.run(run_id)
    m = b.execute(ctx, "MLMPretrainer", "COMPLETE", outputs=[("model", "components.PretrainedModel", {
        "private": 0, "non_private": 0, "steps_taken_total": 4, "final_mlm_loss": 5.5})])
    inputs = [("model", m["model"])]
    if baseline:
        n = b.execute(ctx, "MLMPretrainerNonPrivate", "COMPLETE", outputs=[("model", "components.PretrainedModel", {
            "private": 1, "non_private": 1, "steps_taken_total": 4, "final_mlm_loss": NON_PRIVATE_LOSS})])
        inputs.append(("baseline_model", n["model"]))
    b.execute(ctx, "PrivacyAccountant", "COMPLETE", inputs=[("model", m["model"])], outputs=[
        ("report", "components.PrivacyReport", {"private": 0, "epsilon_vocab": 1.0, "epsilon_train": 6.0,
                                                "epsilon_total_pld": 7.0, "delta": 2e-6, "unit": "tuple",
                                                "sampling": "poisson", "epsilon_budget": 10.0, "within_budget": 1})])
    b.execute(ctx, "NerEvaluator", "COMPLETE", inputs=inputs, outputs=[("report", "components.NerReport", {
        "private": int(baseline), "f1": utility["rows"]["dp"]["ner_f1_mean"], "per_type": {"Chemical": 0.7},
        "table": [{"model": k, "f1_mean": v["ner_f1_mean"]} for k, v in utility["rows"].items()],
        "utility": utility})])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("utility_store")
    b = fakestore._Builder(str(base / "metadata.sqlite"), str(base / "root"))  # pylint: disable=protected-access
    random_only = {**UTILITY, "rows": {k: v for k, v in UTILITY["rows"].items() if k != "public"},
                   "reference": "random", "public_start": False, "gain_kept_mlm_loss": 0.5}
    _run(b, RANDOM_RUN, random_only)
    _run(b, RUN, UTILITY)
    del b
    return str(base / "metadata.sqlite")


def _report(store, run_id):
    return build_report(metadata.get_run(metadata.open_store(store), run_id))


def test_report_json_has_the_utility_contract(store, capsys):
    assert main(["report", "--metadata", store, "--run", RUN, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    utility = report["utility"]
    assert set(utility["rows"]) == {"random", "public", "dp", "non_private"}  # JSON keys are sorted
    assert list(_report(store, RUN)["utility"]["rows"]) == ["random", "public", "dp", "non_private"]
    for row in utility["rows"].values():
        assert set(row) == COLUMNS and all(isinstance(v, float) for v in row.values())
    assert utility["rows"]["dp"] == UTILITY["rows"]["dp"]
    assert utility["gain_kept_mlm_loss"] == 0.3498 and utility["gain_kept_ner_f1"] == 0.2
    assert utility["gain_kept_mlm_loss_std"] == 0.0123 and utility["gain_kept_ner_f1_std"] == 0.2345
    assert utility["reference"] == "public" and utility["ner_seeds"] == 3
    assert report["ner"]["f1"] == 0.62  # the ner section keeps working


def test_a_run_without_a_public_start_has_no_public_row(store):
    utility = _report(store, RANDOM_RUN)["utility"]
    assert list(utility["rows"]) == ["random", "dp", "non_private"] and utility["reference"] == "random"
    assert "public start is the random row" in format_report(_report(store, RANDOM_RUN))


def test_released_view_drops_the_non_private_row_and_the_gains(store):
    view = release.released_view(_report(store, RUN))
    assert view["releasable"]
    assert list(view["utility"]["rows"]) == ["random", "public", "dp"]
    assert view["utility"]["rows"]["dp"] == UTILITY["rows"]["dp"]
    assert not any(k.startswith("gain_kept") for k in view["utility"])
    text = schema.dumps({k: v for k, v in view.items() if k != "operator_only_omitted"})
    assert "non_private" not in text and str(NON_PRIVATE_LOSS) not in text and "0.3498" not in text
    assert "utility: non-private row and gains kept" in view["operator_only_omitted"]


def test_report_without_ner_has_no_utility_section(tmp_path):
    b = fakestore._Builder(str(tmp_path / "m.sqlite"), str(tmp_path / "root"))  # pylint: disable=protected-access
    ctx = b.run("r1")
    b.execute(ctx, "NerEvaluator", "COMPLETE", outputs=[("report", "components.NerReport", {"private": 0, "f1": 0.5})])
    del b
    report = build_report(metadata.get_run(metadata.open_store(str(tmp_path / "m.sqlite")), "r1"))
    assert "utility" not in report and report["ner"]["f1"] == 0.5
    assert "utility" not in release.released_view(report)


def test_text_report_prints_the_table(store):
    text = format_report(_report(store, RUN))
    assert "utility (NER F1 over 3 fine-tuning seeds; gains from the public row):" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert "0.6200 ± 0.0120" in lines["dp"] and "5" in lines["dp"] and "0.6100 ± 0.0110" in lines["public"]
    assert "gain kept, MLM loss" in text and "0.3498 ± 0.0123" in text
    # the second NER column (in-domain synthetic task) and a gain without a value: n/a with its reason
    assert "NER F1 BC5CDR" in text and "NER F1 in-domain" in text and "0.5512 ± 0.0040" in lines["dp"]
    assert "gain kept, NER F1 in-domain  n/a (non-private gain not significant)" in text
    released = format_report(release.released_view(_report(store, RUN)))
    assert "utility" in released and "non_private" not in released and "gain kept" not in released
    assert "not significant" not in released and "0.5512 ± 0.0040" in released


def test_headings_name_the_ner_mode_and_pretraining_shows_dp_estimates():
    """Issue 24: the NER / utility headings say probe or fine-tuning; issue 23: the pretraining
    diagnostics are labelled DP estimates, with the per-step noise std and why a final loss can
    exceed the initial one."""
    from dpbert.report import format_pretraining, format_utility, ner_heading

    probe = format_utility({**UTILITY, "ner_mode": "probe"})
    assert "NER F1 over 3 probe seeds (a linear head on the frozen encoder)" in "\n".join(probe)
    assert "fine-tuning" not in "\n".join(probe)
    assert ner_heading({"mode": "probe", "task": "synthetic", "seeds": 3}) == \
        "ner (DP model, in-domain, 3 probe seeds (a linear head on the frozen encoder)):"
    assert ner_heading({"mode": "finetune", "task": "bc5cdr"}) == "ner (DP model, BC5CDR, fine-tuning seeds):"
    text = "\n".join(format_pretraining({
        "steps": 60, "initial_mlm_loss": 10.63, "final_mlm_loss": 13.54, "final_mlm_accuracy": 0.0,
        "clipped_fraction": 1.0, "diagnostics": "dp", "diagnostics_window": 6,
        "diagnostics_step_noise_std": {"loss": 4.8, "accuracy": 0.4, "clipped_fraction": 0.4, "batch_size": 6.4}},
        lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)))
    assert "final_mlm_loss (DP estimate)" in text and "(one step's ratio: noise std ≈ 4.8 at the expected B)" in text
    assert "noisy sum ÷ noisy batch size, clamped" in text and "last 6 steps (10 % of the run's 60 steps)" in text
    assert "≈ 1.96 nats (a 6-step mean, at the expected B) is noise, not divergence" in text
    exact = "\n".join(format_pretraining({"final_mlm_loss": 2.0, "diagnostics": "exact (private)"}, str))
    assert "DP estimate" not in exact


def test_dashboard_run_page_shows_the_utility_table(store):
    from dashboard import create_app
    from tests.dashboard.conftest import TestClient

    client = TestClient(create_app(store))
    html = client.get("/runs/" + RUN).text
    section = html.split('<section id="utility">')[1].split("</section>")[0]
    for label in ("random init", "public start", "DP in-domain", "non-private in-domain"):
        assert label in section
    assert "0.6200 ± 0.0120" in section and "0.3498 ± 0.0123" in section
    assert "0.5512 ± 0.0040" in section and "NER F1, in-domain" in section and "fine-tuning seeds" in section
    assert "n/a (non-private gain not significant)" in section
    non_private_row = section.split('class="utility-non_private"')[1].split("</tr>")[0]
    assert "operator-only" in non_private_row
    dp_row = section.split('class="utility-dp"')[1].split("</tr>")[0]
    assert "released (DP)" in dp_row
    released = client.get(f"/api/runs/{RUN}/released").json()
    assert list(released["utility"]["rows"]) == ["random", "public", "dp"]
