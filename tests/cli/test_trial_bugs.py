"""A platform engineer's trial on a 242-note corpus of their own: each bug they found, with the test
that fails without its fix. In-process (``dpbert_cli.main.main``) on small files and synthetic
stores; nothing trains."""
import json

import pytest

from dpbert import exit_codes
from tests.cli.test_user_errors import assert_user_error, in_process  # noqa: F401 (fixture)

#: The demo's budget needs more than a corpus path (a public size, a dataset name): not these tests' subject.
NO_BUDGET = ("--set", "privacy.epsilon_budget=null")


# ------------------------------------------------------------------ 1. a JSONL line cut mid-record
def test_a_jsonl_line_cut_mid_record_names_file_line_and_json_column(tmp_path, in_process):
    corpus = tmp_path / "notes.jsonl"
    cut = '{"patient_id": "p2", "text": "secret note text"'  # json's error is just past its end
    corpus.write_text('{"patient_id": "p1", "text": "first note"}\n' + cut + "\n", encoding="utf-8")
    result = in_process("run", "--corpus", corpus, "--output", tmp_path / "out", *NO_BUDGET)
    line = assert_user_error(result, exit_codes.BAD_INPUT, f"{corpus}:2:{len(cut) + 1}:", "cut mid-record")
    assert "column 1" not in line and "secret note" not in line
    assert not (tmp_path / "out").exists()


def test_a_json_error_inside_a_line_keeps_its_column(tmp_path):
    from dpbert.data.readers import CorpusError, read_jsonl

    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "abc" "x": 1}\n', encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        list(read_jsonl(path))
    assert str(err.value).startswith(f"{path}:1:16: not valid JSON: Expecting ',' delimiter")
    assert err.value.column == 16 and "cut mid-record" not in str(err.value)


# ------------------------------------------------------------------ 13. the corpus's encoding
def _latin1_corpus(tmp_path):
    corpus = tmp_path / "latin.jsonl"
    corpus.write_bytes('{"patient_id": "p1", "text": "patient ok"}\n'.encode("utf-8")
                      + '{"patient_id": "p2", "text": "caf\u00e9 au lait"}\n'.encode("latin-1"))
    return corpus


def test_latin1_bytes_read_as_utf8_are_an_error_naming_file_line_and_corpus_encoding(tmp_path, in_process):
    corpus = _latin1_corpus(tmp_path)
    result = in_process("run", "--corpus", corpus, "--output", tmp_path / "out", *NO_BUDGET)
    line = assert_user_error(result, exit_codes.BAD_INPUT, f"{corpus}:2:", "0xe9", "corpus.encoding")
    assert "caf" not in line and not (tmp_path / "out").exists()


def test_corpus_encoding_reads_latin1_and_replace_keeps_the_count(tmp_path):
    from dpbert.config import ConfigError, load_config
    from dpbert.data.corpus import iter_documents
    from dpbert.data.readers import DecodeStats

    corpus = _latin1_corpus(tmp_path)
    latin = load_config(None, [f"corpus.path={corpus}", "corpus.encoding=latin-1"]).corpus
    assert [d.text for d in iter_documents(latin)][1] == "caf\u00e9 au lait"
    replace = load_config(None, [f"corpus.path={corpus}", "corpus.encoding=utf-8:replace"]).corpus
    stats = DecodeStats()
    assert [d.text for d in iter_documents(replace, stats)][1] == "caf\ufffd au lait" and stats.replaced_bytes == 1
    with pytest.raises(ConfigError, match="corpus.encoding"):
        load_config(None, ["corpus.encoding=klingon"])


# ------------------------------------------------------------------ the report and the dashboard
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


def test_the_window_share_of_the_run_is_computed(tmp_path):
    """2. "(10 % of the run)" was printed for a window of 5 of 20 steps."""
    from dpbert.report import format_report

    text = format_report(_report(_store(tmp_path, DP_MODEL)))
    assert "last 5 steps (25 % of the run's 20 steps)" in text and "10 %" not in text


def test_noise_std_is_stated_on_the_released_sum_and_at_the_expected_batch(tmp_path):
    """7. The std of one step's ratio was stated for the planned B only: now the noise on the released
    SUM, the ratio's std at the expected B, and a warning when the RELEASED mean batch size is far
    below the planned one (from released values: not operator-only)."""
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


def test_size_warning_prints_two_significant_digits_and_stays_operator_only(tmp_path):
    """5. "about 0.0×" for a ratio of 0.012."""
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


@pytest.mark.parametrize("source, expected", [
    ("public", []), ("dp", ["tiny_corpus", "tiny_vocabulary"]), ("public+dp", ["tiny_corpus", "tiny_vocabulary"])])
def test_vocabulary_warnings_only_when_a_dp_vocabulary_is_built(tmp_path, source, expected):
    """4. "fewer than 10,000 words" and "the DP vocabulary kept 7 words" fired with vocab.source:
    public (no DP vocabulary); public+dp says what a small DP release means there."""
    vocab = {"vocab_source": source, **({"words_kept": 7} if source != "public" else {})}
    report = _report(_store(tmp_path, {}, vocab=vocab))
    codes = [w["code"] for w in report["warnings"]]
    assert [c for c in codes if c in ("tiny_corpus", "tiny_vocabulary")] == expected
    if source == "public+dp":
        assert "appended to the public vocabulary" in " ".join(w["message"] for w in report["warnings"])
        assert "mostly characters" not in " ".join(w["message"] for w in report["warnings"])


def test_ingest_logs_no_vocabulary_warning_and_nothing_at_warning_level(tmp_path, caplog):
    """4. The tiny-corpus warning was printed twice by `dpbert run` (the ingest's log and the run's
    summary): the run prints the report's warnings once at its end."""
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


def test_membership_bound_column_is_dropped_and_explained_when_empty(tmp_path):
    """6. The membership table's bound column was "-" on every row of a patient-level run."""
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
    """6. The "Every model" table overflowed a 1400 px window with raw keys (f1_mean, mlm_seconds)."""
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
    """9. The trainable set appeared in no report or dashboard."""
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


# ------------------------------------------------------------------ 3. the model's preset name
def test_the_resolved_preset_is_the_one_model_config_json_records():
    """3. The demo's model artifact said model_preset: tiny (the unused default of model.preset)
    while its model_config.json said minilm: model.init = minilm takes the checkpoint's sizes."""
    from dpbert.config import load_config
    from dpbert.model.init_public import spec_for_public

    demo = load_config(preset="demo").model
    assert demo.preset == "tiny" and demo.resolved_preset == "minilm"
    assert spec_for_public(demo, vocab_size=100).preset == demo.resolved_preset
    assert load_config(None, ["model.preset=small"]).model.resolved_preset == "small"


# ------------------------------------------------------------------ 10. the vocabulary audit's neighbour
def test_vocabulary_audit_says_it_tests_a_one_tuple_neighbour_next_to_the_per_patient_epsilon(in_process):
    """10. "(1.77, 1e-06)" was printed next to the ledger's ε_V = 3.797 without saying it is one tuple's."""
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


# ------------------------------------------------------------------ budget and run before anything trains
def _json(result):
    return json.loads(result.stdout)


SMALL = ("--set", "training.dataset_patients=120", "--set", "training.batch_size=16")


@pytest.mark.slow  # make test-all (≈ 30 s); docs/development.md
def test_target_epsilon_targets_the_whole_run_and_budget_exits_3_over_the_budget(in_process):
    """11. `budget --target-epsilon 0.5` with a budget of 3 printed a whole-run ε of 3.433 and exit 0."""
    training = in_process("budget", "--target-epsilon", "0.5", "--target", "training",
                          "--set", "privacy.epsilon_budget=3", "--json")
    data = _json(training)
    assert training.returncode == exit_codes.OVER_BUDGET and data["target"] == "epsilon_train"
    assert data["epsilon_train"] <= 0.5 < 3 < data["epsilon_total_pld"] and data["within_budget"] is False
    # the default target is the whole run: the vocabulary alone spends more than 0.5 here
    assert_user_error(in_process("budget", "--target-epsilon", "0.5"), exit_codes.BAD_INPUT, "vocab.sigma",
                      "--target training")
    whole = in_process("budget", "--target-epsilon", "4", "--set", "training.steps=10", "--json")
    data = _json(whole)
    assert whole.returncode == exit_codes.OK and data["target"] == "epsilon_total_pld"
    assert 3.9 < data["epsilon_total_pld"] <= 4 and data["epsilon_pld"] == data["epsilon_total_pld"]


def test_run_refuses_a_vocabulary_threshold_no_word_can_pass_before_anything_is_written(tmp_path, in_process):
    """12. "no word passed the threshold C = 1370.4" came after 19 s with a FAILED run written."""
    out = tmp_path / "out"
    args = ("--set", "vocab.sigma=200", *SMALL, "--output", out)
    line = assert_user_error(in_process("run", *args), exit_codes.BAD_INPUT, "vocab.sigma", "vocab.delta",
                             "training.dataset_patients = 120", "no word can pass")
    assert "at most 240 times" in line and not out.exists()
    budget = in_process("budget", "--set", "vocab.sigma=200", *SMALL)
    assert "no word can pass the vocabulary threshold C" in budget.stdout  # said (its exit: the ε verdict)
    passable = in_process("budget", *SMALL)  # σ_V = 40: C = 237.5 ≤ 240
    assert "threshold C = 237.5 can be passed" in passable.stdout
    public = in_process("budget", "--set", "vocab.source=public", "--set", "vocab.sigma=200", *SMALL)
    assert "no DP vocabulary" in public.stdout


def test_canary_groups_scale_to_the_declared_corpus_or_the_run_is_refused(tmp_path, in_process):
    """8. Canary groups of 1,000 and 2,000 occurrences on a 120-patient corpus."""
    from dpbert.config import load_config
    from dpbert.stages.canary import canary_rows, planned_occurrences

    config = load_config(None, ["training.dataset_patients=120", "training.batch_size=16"], preset="demo")
    assert canary_rows(config) == 84 * 2  # 30 % held out, ≤ 2 tuples each
    assert planned_occurrences(config.canary, canary_rows(config)) == [1, 10, 16]
    demo = load_config(preset="demo")
    assert planned_occurrences(demo.canary, canary_rows(demo)) == [1, 10, 100, 1000, 1400]
    out = tmp_path / "out"
    result = in_process("run", *SMALL, "--set", "canary.occurrences=[1, 1000]", "--output", out)
    assert_user_error(result, exit_codes.BAD_INPUT, "canary.occurrences", "canary.max_occurrence_fraction",
                      "training.dataset_patients = 120")
    assert not out.exists()


def test_budget_says_everything_before_anything_trains(tmp_path, in_process):
    """14. The ε per patient by part, the vocabulary threshold, the declared size against --corpus
    (operator-only), a labelled training-time estimate and the dataset's remaining budget (a hook)."""
    from pipeline import guard

    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"patient_id": f"p{i}", "text": "fever and cough " * 20}) + "\n"
                              for i in range(30)), encoding="utf-8")
    result = in_process("budget", "--corpus", corpus)
    assert result.returncode == exit_codes.OK, result.stderr
    lines = result.stdout.splitlines()
    parts = next(x for x in lines if x.startswith("planned ε per patient:"))
    for word in ("vocabulary", "count 0", "training", "whole run"):
        assert word in parts
    size = next(x for x in lines if x.startswith("corpus:"))
    assert size.endswith("(operator-only: exact count)") and "30 patients" in size and "does NOT match" in size
    estimate = next(x for x in lines if x.startswith("training time on this machine"))
    assert "ESTIMATE" in estimate and "50 steps" in estimate
    # the demo's dataset has spent nothing in this test's ledger: the gate admits the whole plan and more
    assert "the dataset's budget gate still admits: at least 400 DP-SGD steps of this plan (50 planned" \
        in result.stdout and guard.remaining_budget(None) is None
    data = _json(in_process("budget", "--json"))
    assert data["epsilon_parts"]["whole"] == data["epsilon_total_pld"] and "corpus_sizes" not in data
    assert data["vocabulary_threshold"]["passable"] is True and data["training_time_estimate"]["seconds"] > 0
