"""The dashboard's data layer tolerates the shapes the growing DAG may write (and absent data)."""
import math

from dashboard import views
from dpbert.metadata import ArtifactInfo, ComponentRun, RunInfo


def artifact(id_, type_, props, name="out"):
    return ArtifactInfo(id=id_, type=type_, uri=f"/root/{id_}", name=name, properties=props)


def test_fmt():
    assert [views.fmt(v) for v in (None, True, 0.000012345, math.inf, -math.inf, math.nan, 3, "x", [1, 2.5])] == \
        ["—", "yes", "1.234e-05", "∞", "−∞", "NaN", "3", "x", "[1, 2.5]"]
    # containers as strict JSON (dpbert.schema's codec), keys sorted, non-ASCII kept
    assert views.fmt({"b": (1,), "a": [math.inf, -math.inf, math.nan, 1.0], "ε": "δ"}) == \
        '{"a": ["inf", "-inf", "nan", 1.0], "b": [1], "ε": "δ"}'
    assert views.fmt_duration(75) == "1 min 15 s" and views.fmt_duration(3725) == "1 h 02 min"
    assert views.number("inf") == math.inf and views.number({"mean": 2}) == 2.0 and views.number(True) is None


def test_private_artifacts_show_numeric_unit_counts_only():
    a = artifact(1, "components.Anything", {"private": 1, "num_tuples": 3, "num_x": "text", "path": "/p"})
    rows, hidden = views.visible_properties(a)
    assert [r["key"] for r in rows] == ["num_tuples"] and hidden == 3
    # WordTuples is private even if an old run did not mark it
    rows, hidden = views.visible_properties(artifact(2, "components.WordTuples", {"corpus": "c", "num_tuples": 1}))
    assert [r["key"] for r in rows] == ["num_tuples"] and hidden == 1
    long = artifact(3, "components.DPVocabulary", {"dp_event": {"k": "v" * 500}})
    [row], hidden = views.visible_properties(long)
    assert row["truncated"] and len(row["short"]) == views.SHORT_VALUE + 1 and hidden == 0


def test_dag_edges_layers_and_consumers():
    t = artifact(1, "components.WordTuples", {"private": 1})
    v = artifact(2, "components.DPVocabulary", {})
    m = artifact(3, "components.PretrainedModel", {})
    run = RunInfo("r", "p", 0, [
        ComponentRun("Ingest", 1, "COMPLETE", 0, 1000, [], [t]),
        ComponentRun("Vocab", 2, "COMPLETE", 0, 2000, [t], [v]),
        ComponentRun("Train", 3, "RUNNING", 0, 3000, [t, v], [m]),
        ComponentRun("Orphan", 4, "NEW", 0, 0, [], [])])
    d = views.dag(run)
    assert d["edges"] == [("Ingest", "Vocab"), ("Ingest", "Train"), ("Vocab", "Train")]
    assert views.dag_layers([n["id"] for n in d["nodes"]], d["edges"]) == \
        {"Ingest": 0, "Vocab": 1, "Train": 2, "Orphan": 0}
    tuples = d["artifacts"][0]
    assert tuples["producer"] == "Ingest" and tuples["consumers"] == ["Vocab", "Train"] and tuples["private"]
    assert run.status == "RUNNING" and views.plots_available(run, {})["dag"]


def test_exposure_groups_accept_numbers_summaries_and_plain_exposure():
    report = {"canary": {"groups": [
        {"group": "held_out", "occurrences": None, "exposure": {"n": 3, "mean": 1.5}},
        {"pattern": "mrn", "occurrences": 10, "exposure_dp": 2, "exposure_non_dp": {"mean": "inf"}},
        "junk"]}}
    groups = views.exposure_groups(report)
    assert [(g["label"], g["occurrences"], g["dp"], g["non_dp"]) for g in groups] == \
        [("held_out", None, 1.5, None), ("mrn", 10.0, 2.0, math.inf)]
    assert views.exposure_groups({}) == [] and views.exposure_groups({"canary": {"groups": None}}) == []


def test_membership_attacks_in_several_shapes():
    as_list = views.membership_attacks({"membership_inference": [
        {"name": "loss", "auc": 0.5, "roc": [[0, 0], [0.5, 0.6], [1, 1]]}, {"attack": "bad", "fpr": [0], "tpr": []}]})
    assert as_list[0]["fpr"] == [0.0, 0.5, 1.0] and as_list[0]["tpr"] == [0.0, 0.6, 1.0]
    assert as_list[1]["name"] == "bad" and as_list[1]["fpr"] == []
    by_name = views.membership_attacks({"membership_inference": {"loss": {"auc": 0.55}, "lira": 0.61}})
    assert [(a["name"], a["stats"]) for a in by_name] == [("loss", [("auc", "0.55")]), ("lira", [("auc", "0.61")])]
    single = views.membership_attacks({"membership_inference": {"auc": 0.7, "fpr": [0, 1], "tpr": [0, 1]}})
    assert single[0]["name"] == "attack" and single[0]["fpr"] == [0.0, 1.0]
    assert views.membership_attacks({}) == [] and views.membership_attacks({"membership_inference": None}) == []


def test_loss_curves_ner_and_tables():
    run = RunInfo("r", "p", 0, [ComponentRun("Base", 1, "COMPLETE", 0, 1, [], [
        artifact(1, "components.PretrainedModel", {"non_private": 1, "loss_curve": [{"step": 1, "loss": 3.0}]})])])
    curves = views.loss_curves(run, {"pretraining": {"loss_curve": [2.0, "nan", None, 1.0]}})
    assert curves["non-DP"] == [3.0] and curves["DP"][0] == 2.0 and math.isnan(curves["DP"][1])
    assert views.loss_curves(run, {"pretraining": {"loss_curve": [None]}}) == {"non-DP": [3.0]}
    assert views.ner_view({"ner": {"f1": None, "per_type": None, "table": None}}) is None
    ner = views.ner_view({"ner": {"f1": 0.5, "per_type": {"D": 0.4}, "table": {"dp": {"f1": 0.5}}}})
    assert ner["per_type"][0]["f1"] == "0.4"
    assert ner["table"] == {"columns": ["", "f1"], "column_keys": ["", "f1"], "rows": [["dp", "0.5"]]}
    assert views.generic_table([["a", "b"], [1, 2]]) == {"columns": ["a", "b"], "rows": [["1", "2"]]}
    assert views.generic_table("text") is None


def test_ledger_within_budget_and_absent():
    report_artifact = artifact(9, "components.PrivacyReport", {
        "epsilon_vocab": 1.0, "epsilon_train": 2.0, "epsilon_total_pld": 2.5, "epsilon_budget": 2.0})
    run = RunInfo("r", "p", 0, [ComponentRun("Acc", 1, "FAILED", 0, 1, [], [report_artifact])])
    ledger = views.ledger(run)
    assert ledger["within"] is False and ledger["total"] == "2.5" and ledger["budget"] == "2"
    assert views.ledger_bars(run)["budget"] == 2.0
    assert views.ledger(RunInfo("r", "p", 0, [])) is None and views.ledger_bars(RunInfo("r", "p", 0, [])) is None


def test_release_boundary_flags():
    dp = artifact(1, "components.PretrainedModel", {"non_private": 0, "loss_curve": [3.0, 2.0]})
    base = artifact(2, "components.PretrainedModel", {"private": 1, "non_private": 1, "loss_curve": [3.0, 1.0]})
    vocab = artifact(3, "components.DPVocabulary", {"non_private": 0})
    ner = artifact(4, "components.NerReport", {"private": 1})
    run = RunInfo("r", "p", 0, [ComponentRun("T", 1, "COMPLETE", 0, 1, [], [vocab, dp, base, ner])])
    report = {"vocab": {"non_private": 0}, "pretraining": {"loss_curve": [3.0, 2.0], "non_dp_final_mlm_loss": 1.0}}
    assert views.released_loss_curve(report) == {"DP": [3.0, 2.0]}
    assert views.loss_curves(run, report) == {"DP": [3.0, 2.0], "non-DP": [3.0, 1.0]}  # baseline private: shown
    plots = views.plots_available(run, report)
    assert plots["loss"] and plots["loss_comparison"]
    assert [r["value"] for r in views.baseline_rows(report)] == ["1"]
    assert [r["label"] for r in views.pretraining_rows({"pretraining": dict(report["pretraining"], final_mlm_loss=2.0)})] == \
        ["final MLM loss (DP estimate)"]
    assert not views.vocab_operator_only(run, report) and views.vocab_operator_only(run, {"vocab": {"non_private": 1}})
    assert views.marked_private(run, "NerReport") and not views.marked_private(run, "PretrainedModel")
    page = views.run_page(run, report)
    assert page["ner_operator_only"] and not page["vocab_operator_only"]
    only_baseline = RunInfo("r", "p", 0, [ComponentRun("T", 1, "COMPLETE", 0, 1, [], [base])])
    assert views.run_page(only_baseline, {})["ner_operator_only"]  # NER's "dp" row is then the non-private model


def test_whitebox_audit_view_says_whether_it_could_refute_and_whether_the_control_fired():
    report = {"audit": {"epsilon_lower_bound": 1.81, "epsilon_upper_bound": 4.97, "epsilon_train_ledger": 5.25,
                        "max_reachable_lower_bound": 5.51, "positive_control_lower_bound": 5.51,
                        "positive_control_exceeds_upper_bound": 1, "consistent": 1, "canaries": 10000,
                        "confidence": 0.95}}
    view = views.audit_view(report)
    assert view["consistent"] and view["powerful"] and view["control_detected"]
    labels = {r["label"]: r["value"] for r in view["rows"]}
    assert labels["ε lower bound (audit)"] == views.fmt(1.81) and "ε_T in the ledger" in labels
    report["audit"].update(epsilon_upper_bound=8.0, consistent=0, positive_control_exceeds_upper_bound=0)
    view = views.audit_view(report)
    assert not view["consistent"] and not view["powerful"] and not view["control_detected"]
    assert views.audit_view({}) is None
