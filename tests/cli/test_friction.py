"""A new user's friction (issue 24): one default for every command, `-v` anywhere, a failed or
cancelled run's report, labels, the folder corpus's files, the public-size warning, quoted hints.
In-process (``dpbert_cli.main.main``) on synthetic stores; no DAG run."""
import contextlib
import json
import sys
import time
from pathlib import Path

import pytest
from tfx.dsl.components.base.base_beam_executor import BaseBeamExecutor

from dpbert import exit_codes, metadata
from dpbert.config import load_config
from dpbert_cli.main import main
from tests.dashboard import fakestore


def _help(capsys, *argv):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------ one default for every command
def test_every_command_without_config_uses_the_demo_preset_and_says_so(capsys):
    for command in ("run", "budget", "audit", "compile"):
        assert "demo preset" in _help(capsys, command), command
    budget = _help(capsys, "budget")
    assert "reads no corpus" in budget and "counted from the corpus" not in budget
    assert "training.dataset_size" in budget


def test_budget_without_config_plans_the_demo_and_reads_no_corpus(capsys, tmp_path):
    """Fails on the previous main (exit 2: "dataset_size not set"). A corpus that does not exist
    changes nothing: budget plans from the public sizes alone."""
    code = main(["budget", "--json", "--set", f"corpus.path={tmp_path / 'no-such-corpus'}",
                 "--set", "corpus.dataset_id=notes"])
    data = json.loads(capsys.readouterr().out)
    assert code == exit_codes.OK and data["dataset_size_source"] == "public"
    # the demo's public patient count, 30 % held out for the membership attacks
    demo = load_config(preset="demo")
    expected = round(demo.training.dataset_patients * (1 - demo.membership.holdout_patient_fraction))
    assert data["unit"] == "patient" and data["dataset_size"] == expected


# ------------------------------------------------------------------ -v in every position
class BeamExecutor(BaseBeamExecutor):
    def Do(self, *args):  # noqa: N802
        pass


class _BeamComponent:
    """What TFX's Beam executor does in the vocabulary component: absl parses sys.argv + Beam args."""

    def run(self, metadata_path):
        BeamExecutor(BaseBeamExecutor.Context(beam_pipeline_args=["--runner=DirectRunner"]))
        b = fakestore._Builder(metadata_path, str(Path(metadata_path).parent / "root"))  # the run's store
        b.execute(b.run("r"), "CorpusIngest", "COMPLETE")


@pytest.fixture()
def fake_dag(monkeypatch):
    from types import SimpleNamespace

    from pipeline import local_runner

    monkeypatch.setattr(local_runner, "create_pipeline", lambda config, root, metadata_path: metadata_path)
    monkeypatch.setattr(local_runner, "tfx", SimpleNamespace(orchestration=SimpleNamespace(LocalDagRunner=_BeamComponent)))
    return local_runner


def test_verbose_before_the_command_reaches_no_component(fake_dag, monkeypatch, tmp_path, capsys):
    """`dpbert -v run` crashed in the vocabulary component (absl read `-v run` as --verbosity=run).
    The output directory has a space: the "inspect with:" hint is shell-quoted."""
    out = tmp_path / "my run"
    argv = ["-v", "run", "--output", str(out)]
    monkeypatch.setattr(sys, "argv", ["dpbert", *argv])
    assert main(argv) == exit_codes.OK
    printed = capsys.readouterr().out
    assert f"inspect with:      dpbert report --output '{out}'" in printed
    assert sys.argv == ["dpbert", *argv]  # restored after the DAG


def test_positive_control_a_component_that_sees_the_cli_argv_fails(fake_dag, monkeypatch, tmp_path):
    from absl.flags import IllegalFlagValueError

    monkeypatch.setattr(fake_dag, "components_argv", contextlib.nullcontext)
    argv = ["-v", "run", "--output", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", ["dpbert", *argv])
    with pytest.raises(IllegalFlagValueError, match="verbosity"):
        main(argv)


# ------------------------------------------------------------------ a failed / cancelled run
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


# ------------------------------------------------------------------ labels
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
    assert not page["ner_operator_only"]  # fails on the previous main: operator-only though released
    assert page["canary_audit"] == {"epsilon": views.fmt(0.1), "power": views.fmt(2.87),
                                    "verdict": f"it could refute ε_T = {views.fmt(2.75)}"}
    over = dict(report, privacy=dict(report["privacy"], within_budget=False))
    assert views.run_page(run, over)["ner_operator_only"]  # not releasable: nothing of it released


# ------------------------------------------------------------------ the folder corpus
def test_a_folder_corpus_reads_txt_files_unless_corpus_glob_says_otherwise(tmp_path):
    from dpbert.config import ConfigError, load_config
    from dpbert.data.corpus import iter_documents
    from dpbert.data.fingerprint import corpus_files

    (tmp_path / "notes" / "a").mkdir(parents=True)
    (tmp_path / "notes" / "a" / "1.txt").write_text("first note text", encoding="utf-8")
    (tmp_path / "notes" / "2.txt").write_text("second note text", encoding="utf-8")
    (tmp_path / "notes" / "README.md").write_text("not a note", encoding="utf-8")
    corpus = f"corpus.path={tmp_path / 'notes'}"
    config = load_config(None, [corpus]).corpus
    assert [d.doc_id for d in iter_documents(config)] == ["2.txt", "a/1.txt"]  # fails on the previous main
    assert [rel for rel, _ in corpus_files(config)] == ["2.txt", "a/1.txt"]    # one definition of the list
    everything = load_config(None, [corpus, "corpus.glob=*"]).corpus
    assert sorted(d.doc_id for d in iter_documents(everything)) == ["2.txt", "README.md", "a/1.txt"]
    with pytest.raises(ConfigError, match="corpus.glob"):
        load_config(None, [corpus, "corpus.glob=../*.txt"])


# ------------------------------------------------------------------ corpus vs the public size
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

