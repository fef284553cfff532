"""What `dpbert report`, the dashboard and `dpbert audit` say about a run: the DP estimates' windows
and noise, the corpus and vocabulary warnings (operator-only where computed from exact counts),
the membership and NER tables, the trainable set, a cancelled run, the canary audit's power.
In-process on synthetic ML Metadata stores; nothing trains."""
import time

import pytest

from dpbert import exit_codes, metadata
from dpbert_cli.main import main
from tests.cli.test_user_errors import in_process  # noqa: F401 (fixture)
from tests.dashboard import fakestore


def _store(tmp_path, model=None, vocab=None, tuples=None, membership=None, ner=None, name="m"):
    """A run in a real ML Metadata store: the WordTuples, DPVocabulary and DP model artifacts (and a
    membership / NER report) with the given properties."""
    from tests.dashboard import fakestore

    path = str(tmp_path / f"{name}.sqlite")
    b = fakestore._Builder(path, str(tmp_path / f"{name}-root"))
    run = b.run("r")
    t = b.execute(run, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_patients": 120, "num_tuples": 240,
                                             "num_documents": 242, "num_words": 6000, **(tuples or {})})])
    v = b.execute(run, "DPVocabularyGen", "COMPLETE", inputs=[("tuples", t["tuples"])], outputs=[
        ("vocabulary", "components.DPVocabulary", {"private": 0, **(vocab or {})})])
    b.execute(run, "MLMPretrainer", "COMPLETE", inputs=[("vocabulary", v["vocabulary"])], outputs=[
        ("model", "components.PretrainedModel", {"non_private": 0, "private": 0, **(model or {})})])
    if membership is not None:
        b.execute(run, "MembershipInference", "COMPLETE", outputs=[
            ("report", "components.MembershipReport", {"private": 1, **membership})])
    if ner is not None:
        b.execute(run, "NerEvaluator", "COMPLETE", outputs=[("report", "components.NerReport", {"private": 1, **ner})])
    del b
    return path


def _report(path):
    from dpbert import metadata
    from dpbert.report import build_report

    return build_report(metadata.get_run(metadata.open_store(path)))


DP_MODEL = {"diagnostics": "dp", "steps_taken_total": 20, "steps_this_run": 20, "diagnostics_window": 5,
            "final_mlm_loss": 6.0, "initial_mlm_loss": 7.0, "logical_batch": 16, "privacy_unit": "patient",
            "diagnostics_noise_std": {"loss": 76.8, "accuracy": 6.4, "clipped": 6.4, "batch_size": 6.4},
            "diagnostics_step_noise_std": {"loss": 4.8, "accuracy": 0.4, "clipped_fraction": 0.4, "batch_size": 6.4}}


# ------------------------------------------------------------------ the DP estimates

def test_the_window_share_of_the_run_is_computed(tmp_path):
    """The window's share of the run is computed from its steps: 5 of 20 steps is 25 %."""
    from dpbert.report import format_report

    text = format_report(_report(_store(tmp_path, DP_MODEL)))
    assert "last 5 steps (25 % of the run's 20 steps)" in text and "10 %" not in text


def test_noise_std_is_stated_on_the_released_sum_and_at_the_expected_batch(tmp_path):
    """The noise on the released SUM, the ratio's std at the expected B, and a warning when the
    RELEASED mean batch size is far below the planned one (from released values: not operator-only)."""
    from dashboard import views
    from dpbert.release import released_view
    from dpbert.report import RELEASED_BATCH_SIZE, format_report

    report = _report(_store(tmp_path, dict(DP_MODEL, **{RELEASED_BATCH_SIZE: 2.1})))
    text = format_report(report)
    assert "noise std on the released loss SUM of a step: 76.8 nats" in text
    assert "implied std of one step's loss ratio at the expected batch size B = 16: 4.8 nats" in text
    assert "the released noisy batch size averaged 2.1: at that size, 36.57 nats" in text
    warning = next(w for w in report["warnings"] if w["code"] == "small_batches")
    assert warning["section"] == "pretraining" and "averaged about 2.1 patients" in warning["message"]
    assert "B = 16" in warning["message"] and "training.dataset_patients" in warning["message"]
    rows = {r["label"]: r["value"] for r in views.pretraining_rows(report)}
    assert rows["noise std on each released per-step SUM"] == "loss 76.8, accuracy 6.4, clipped fraction 6.4"
    assert rows["implied noise std of one step's ratio at the expected batch size B = 16"].startswith("loss 4.8")
    assert [w["operator_only"] for w in views.warnings_view(report) if "released (noisy)" in w["message"]] == [False]
    assert "diagnostics_sum_noise_std" not in released_view(report).get("pretraining", {})  # allow-list unchanged
    planned = _report(_store(tmp_path, dict(DP_MODEL, **{RELEASED_BATCH_SIZE: 15.0}), name="ok"))
    assert not [w for w in planned["warnings"] if w["code"] == "small_batches"]
    older = _report(_store(tmp_path, DP_MODEL, name="older"))  # a trainer that does not record it
    assert not [w for w in older["warnings"] if w["code"] == "small_batches"]


# ------------------------------------------------------------------ warnings

def test_size_warning_prints_two_significant_digits_and_stays_operator_only(tmp_path):
    """A ratio of 0.012 reads "about 0.012×", never "about 0.0×"."""
    from dashboard import views
    from dpbert.release import released_view

    model = {"planned_dataset_size": 7000, "dataset_size_source": "public", "privacy_unit": "patient",
             "holdout_patient_fraction": 0.3, "logical_batch": 192}
    report = _report(_store(tmp_path, model, tuples={"num_patients": 120}))
    warning = next(w for w in report["warnings"] if w["code"] == "public_size_mismatch")
    assert "about 0.012× the patients" in warning["message"] and "0.0×" not in warning["message"]
    assert warning["section"] == "corpus"  # operator-only: computed from the exact count
    assert [w["operator_only"] for w in views.warnings_view(report) if "public size" in w["message"]] == [True]
    assert "warnings" not in released_view(dict(report, privacy={"epsilon_total_pld": 1.0}))


def _store_with_sizes(tmp_path, patients: int, planned: int) -> str:
    path = str(tmp_path / f"m{patients}.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    run = b.run("r")
    t = b.execute(run, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_patients": patients, "num_tuples": 4 * patients})])
    b.execute(run, "MLMPretrainer", "COMPLETE", inputs=[("tuples", t["tuples"])], outputs=[
        ("model", "components.PretrainedModel", {"non_private": 0, "planned_dataset_size": planned,
                                                 "dataset_size_source": "public", "privacy_unit": "patient",
                                                 "holdout_patient_fraction": 0.0, "logical_batch": 16})])
    del b
    return path


def test_report_warns_operator_only_when_the_corpus_is_far_from_the_public_size(tmp_path, capsys):
    from dpbert.release import released_view
    from dpbert.report import build_report

    far = _store_with_sizes(tmp_path, patients=20_000, planned=1000)
    assert main(["report", "--metadata", far]) == exit_codes.OK
    text = capsys.readouterr().out
    warning = next(line for line in text.splitlines() if "public size" in line)
    assert warning.strip().startswith("[corpus]") and "20×" in warning and "training.dataset_patients" in warning
    assert "batches" in warning and "B = 16 patients" in warning
    report = build_report(metadata.get_run(metadata.open_store(far)))
    assert "warnings" not in released_view(dict(report, privacy={"epsilon_total_pld": 1.0}))
    near = _store_with_sizes(tmp_path, patients=1500, planned=1000)
    assert main(["report", "--metadata", near]) == exit_codes.OK
    assert "public size" not in capsys.readouterr().out


@pytest.mark.parametrize("source, expected", [
    ("public", []), ("dp", ["tiny_corpus", "tiny_vocabulary"]), ("public+dp", ["tiny_corpus", "tiny_vocabulary"])])
def test_vocabulary_warnings_only_when_a_dp_vocabulary_is_built(tmp_path, source, expected):
    """"fewer than 10,000 words" and "the DP vocabulary kept 7 words" only where a DP vocabulary is
    built (not with vocab.source: public); public+dp says what a small DP release means there."""
    vocab = {"vocab_source": source, **({"words_kept": 7} if source != "public" else {})}
    report = _report(_store(tmp_path, {}, vocab=vocab))
    codes = [w["code"] for w in report["warnings"]]
    assert [c for c in codes if c in ("tiny_corpus", "tiny_vocabulary")] == expected
    if source == "public+dp":
        assert "appended to the public vocabulary" in " ".join(w["message"] for w in report["warnings"])
        assert "mostly characters" not in " ".join(w["message"] for w in report["warnings"])


def test_ingest_logs_no_vocabulary_warning_and_nothing_at_warning_level(tmp_path, caplog):
    """The tiny-corpus warning is printed once, by the run's summary at its end, not also in the
    ingest's log."""
    from dpbert.config import CorpusConfig
    from dpbert.stages.ingest import ingest

    corpus = tmp_path / "notes"
    corpus.mkdir()
    (corpus / "a.txt").write_text("fever and cough", encoding="utf-8")
    with caplog.at_level("INFO", logger="dpbert.ingest"):
        ingest(CorpusConfig(path=str(corpus)), str(tmp_path / "tuples"), 8, num_shards=1)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "words on average" in logged and "fewer than 10,000 words" not in logged


# ------------------------------------------------------------------ tables and labels

def test_membership_bound_column_is_dropped_and_explained_when_empty(tmp_path):
    """A patient-level run's membership table has no bound column of "-" on every row: it says why."""
    from dashboard import views
    from dpbert.report import format_report

    attacks = {"dp": {"S-BBA": {"advantage": 0.02, "auc": 0.51}}, "non_dp": {"S-BBA": {"advantage": 0.1, "auc": 0.55}}}
    report = _report(_store(tmp_path, {}, membership={"attacks": attacks}))
    report["privacy"] = {"unit": "patient", "epsilon_total_pld": 4.0, "delta": 1e-5}
    text = format_report(report)
    table = text.split("membership inference:")[1]
    assert "bound" not in table.splitlines()[1] and "no advantage bound" in table and "per patient" in table
    assert "no advantage bound" in views.membership_bound_note(report)
    tuple_level = dict(report, membership_inference_rows=[dict(report["membership_inference_rows"][0],
                                                                advantage_bound=0.9)])
    assert "  bound" in format_report(tuple_level) and views.membership_bound_note(tuple_level) is None


def test_every_model_ner_table_has_human_labels_and_scrolls_in_its_own_box(tmp_path):
    """The "Every model" table has human labels (not f1_mean, mlm_seconds) and scrolls in its own box."""
    from dashboard import create_app
    from tests.dashboard.conftest import TestClient

    table = [{"model": name, "f1_mean": 0.5, "f1_std": 0.01, "precision": 0.5, "recall": 0.5,
              "heldout_mlm_loss": 6.1, "heldout_mlm_accuracy": 0.1, "ner_seconds": 3.0, "mlm_seconds": 1.0,
              "f1_Chemical": 0.6, "synthetic_f1_mean": 0.4} for name in ("public", "dp", "non_private")]
    path = _store(tmp_path, {}, ner={"f1": 0.5, "table": table, "per_type": {"Chemical": 0.6}})
    html = TestClient(create_app(path)).get("/runs/r").text
    section = html.split('<section id="ner">')[1].split("</section>")[0]
    box = section.split('<div class="table-scroll"')[1].split("</table>")[0]
    assert "overflow-x: auto" in box and '<table class="ner-table">' in box
    for label in ("NER F1 (mean)", "MLM eval time (s)", "held-out MLM loss", "F1 Chemical", "NER F1, in-domain (mean)"):
        assert f">{label}</th>" in box, label
    assert ">f1_mean</th>" not in box and ">mlm_seconds</th>" not in box
    assert 'title="mlm_seconds"' in box  # the key stays as the heading's tooltip


def test_the_trainable_set_and_the_lora_merge_are_shown(tmp_path):
    """The trainable set is in the report and on the dashboard."""
    from dashboard import views
    from dpbert.report import format_report

    lora = {"trainable": {"sets": ["lora", "head"], "parameters": 190_000, "variables": 14,
                          "total_parameters": 27_000_000}}
    report = _report(_store(tmp_path, dict(DP_MODEL, **lora)))
    line = next(x for x in format_report(report).splitlines() if "trained by DP-SGD" in x)
    assert "lora, head (190,000 of 27,000,000 parameters); LoRA adapters merged into the released weights" in line
    rows = {r["label"]: r["value"] for r in views.pretraining_rows(report)}
    assert rows["trained by DP-SGD (training.trainable)"].startswith("lora, head")
    older = _report(_store(tmp_path, DP_MODEL, name="older"))  # not recorded: nothing shown, no error
    assert "trained by DP-SGD" not in format_report(older) and older["pretraining"]["trainable"] is None


def test_dashboard_ner_badge_follows_the_released_view_and_the_canary_audit_shows_its_power():
    from dashboard import views
    from dpbert.metadata import ArtifactInfo, ComponentRun, RunInfo
    from dpbert.release import released_view

    ner = ArtifactInfo(4, "components.NerReport", "/n", "ner", {"private": 1})  # private: the every-model table
    run = RunInfo("r", "p", 0, [ComponentRun("T", 1, "COMPLETE", 0, 1, [], [ner])])
    report = {"privacy": {"epsilon_total_pld": 4.2, "epsilon_train": 2.75, "within_budget": True},
              "ner": {"f1": 0.5, "per_type": {"Chemical": 0.6}, "table": [["model", "f1"]]},
              "canary": {"audit_epsilon_lower_bound": 0.1, "audit_max_reachable_lower_bound": 2.87}}
    assert released_view(report)["ner"]["f1"] == 0.5
    page = views.run_page(run, report)
    assert not page["ner_operator_only"]  # released: not marked operator-only
    assert page["canary_audit"] == {"epsilon": views.fmt(0.1), "power": views.fmt(2.87),
                                    "verdict": f"it could refute ε_T = {views.fmt(2.75)}"}
    over = dict(report, privacy=dict(report["privacy"], within_budget=False))
    assert views.run_page(run, over)["ner_operator_only"]  # not releasable: nothing of it released


# ------------------------------------------------------------------ a cancelled run

def test_report_of_a_cancelled_run_without_checkpoint(tmp_path, capsys):
    path = str(tmp_path / "metadata.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    since_ms = int(time.time() * 1000) - 1
    run = b.run("r1")
    b.execute(run, "CorpusIngest", "COMPLETE")
    b.execute(run, "DPVocabularyGen", "RUNNING")
    del b
    metadata.mark_interrupted(path, since_ms)
    assert main(["report", "--metadata", path]) == exit_codes.OK
    text = capsys.readouterr().out
    assert "CANCELLED" in text and "CANCELED" not in text  # one spelling: status and components table
    assert "no training checkpoint to resume from" in text and "re-run the same command" not in text
    for heading in ("privacy:", "vocab:", "pretraining:"):
        assert f"\n{heading}" not in text, heading  # no empty headings


# ------------------------------------------------------------------ the vocabulary audit's neighbour

def test_vocabulary_audit_says_it_tests_a_one_tuple_neighbour_next_to_the_per_patient_epsilon(in_process):
    """The audit's claimed (ε, δ) is labelled one tuple's, next to the ledger's per-patient ε_V."""
    from dpbert.config import load_config
    from dpbert.privacy.histogram import histogram_report

    result = in_process("audit", "--vocabulary", "--trials", "2000")
    assert result.returncode == exit_codes.OK, result.stderr[-2000:]
    demo = load_config(preset="demo")
    one = histogram_report(demo.vocab.sigma, demo.vocab.delta, demo.privacy.tuple_words, "correct", 1)["epsilon"]
    per_patient = histogram_report(demo.vocab.sigma, demo.vocab.delta, demo.privacy.tuple_words, "correct",
                                   demo.privacy.max_tuples_per_patient, unit="patient")["epsilon"]
    text = " ".join(result.stdout.split())
    assert f"claimed (ε, δ) = ({one:.3g}, 1e-06) for a neighbour of one tuple (D′ = D + one tuple of N words)" in text
    assert f"the ledger's ε_V = {per_patient:.3g} is per patient" in text and "one-tuple neighbour" in text
