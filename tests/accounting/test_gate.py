"""One budget gate: every surface that says "within budget" or "over budget" asks it, over the
same entries, so their verdicts cannot differ (dpbert.accounting.gate)."""
from __future__ import annotations

import json
import shutil

import pytest

from dpbert import storage
from dpbert.accounting import gate, reserve, target as ledger_target
from dpbert.accounting.accountant import planned_ledger
from dpbert.config import PrivacyConfig, load_config
from dpbert.ledger import dataset
from dpbert.engine.charges import budget_step_limit
from dpbert.privacy.plan import TrainingPlan

#: --dist loadgroup: its module fixture's ledgers and the cached ε are computed on one worker.
pytestmark = pytest.mark.xdist_group("gate")


BUDGET = 3.0


def _config_file(ledgers, out, steps: int):
    """A whole configuration (``--config`` replaces the demo preset) for a user corpus on Ward7."""
    import yaml

    path = out.parent / f"{out.name}-{steps}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus = out.parent / "notes.jsonl"  # read only by dpbert run's preflight: the plan's n is public
    corpus.write_text('{"text": "pt stable on metoprolol", "patient_id": "p1"}\n', encoding="utf-8")
    path.write_text(yaml.safe_dump({
        "privacy": {"ledger": str(ledgers), "epsilon_budget": BUDGET},
        "corpus": {"path": str(corpus), "dataset_id": "Ward7"},
        "training": {"dataset_size": 2000, "steps": steps}, "pipeline": {"output_dir": str(out)}}), encoding="utf-8")
    return path


def _config(ledgers, out, steps: int):
    return load_config(str(_config_file(ledgers, out, steps)), [])


def _reserve_run(config, root: str):
    """The vocabulary and the training of one run, reserved as the stages reserve them."""
    target = ledger_target.ledger_target(config)
    planned = planned_ledger(config)
    ledger_target.reserve_vocabulary(target, planned["vocab_event"], f"{root}/DPVocabularyGen/vocabulary/1")
    return ledger_target.reserve_training(target, f"{root}/MLMPretrainer/model/2", f"{root}/_state/c", "key",
                                          planned["train_events"])


@pytest.fixture(scope="module")
def spent_once(tmp_path_factory):
    """A dataset ledger holding one earlier run of 20 steps (pinned at BUDGET by it)."""
    base = tmp_path_factory.mktemp("gate")
    _reserve_run(_config(base / "ledgers", base / "run1", 20), str(base / "run1" / "root"))
    return base


def _surfaces(base, tmp_path, steps: int, monkeypatch) -> dict:
    from dpbert_cli.main import main
    from kubeflow.runner import planned_budget_problem
    from pipeline import guard
    from dpbert.stages.accountant import account

    ledgers = tmp_path / "ledgers"
    shutil.copytree(base / "ledgers", ledgers)
    config = _config(ledgers, tmp_path / "run2", steps)
    target = ledger_target.ledger_target(config)
    verdicts = {"budget": main(["budget", "--config", str(_config_file(ledgers, tmp_path / "run2", steps)),
                                "--set", "corpus.dataset_id= WARD7"]) == 0}  # a case variant: the same ledger
    verdicts["run"] = _run_admitted(main, _config_file(ledgers, tmp_path / "run2", steps), monkeypatch)
    planned = guard.planned(config)
    verdicts["guard"] = guard.dataset_budget(config, planned, None)["within_budget"]
    verdicts["compile"] = planned_budget_problem(config) is None
    before = storage.storage_for(target.uri()).read(target.uri())[0]
    try:
        _reserve_run(config, str(tmp_path / "run2" / "root"))
        verdicts["reservation"] = True
    except gate.BudgetRefused:
        verdicts["reservation"] = False
        assert storage.storage_for(target.uri()).read(target.uri())[0].count(b'"reserved"') >= before.count(b'"reserved"')
    # The trainer's step limit and the accountant stage, over the run written into the ledger as it
    # would stand (bypassing the gate: what they must then say is the gate's).
    shutil.rmtree(ledgers)
    shutil.copytree(base / "ledgers", ledgers)
    monkeypatch.setattr(gate, "decide", _admit_all(gate.decide))
    first = _reserve_run(config, str(tmp_path / "run2" / "root"))
    monkeypatch.undo()
    record = planned["train_events"][-1]
    plan = TrainingPlan(**{k: v for k, v in planned["plan"].items() if k in TrainingPlan.__dataclass_fields__})
    limit = budget_step_limit(first, BUDGET, plan, 2000)(record["noise_multiplier"], steps)
    verdicts["step_limit"] = limit == steps
    result = account(str(tmp_path / "report"), planned["vocab_event"], planned["train_events"], 1e-6,
                     PrivacyConfig(epsilon_budget=BUDGET), {}, ledger_target=target.to_json())
    verdicts["accountant"] = result.properties["within_budget"]
    from dashboard.dataset import dataset_view

    verdicts["dashboard"] = dataset_view(target.uri())["totals"]["within_budget"]  # the dataset page's verdict
    return verdicts


def _run_admitted(main, config_file, monkeypatch) -> bool:
    """``dpbert run``'s verdict: exit 3 before anything runs, or it reaches the DAG (stubbed here)."""
    import pipeline.local_runner as runner

    class ReachedTheDag(Exception):
        pass

    def stub(config, *args, **kwargs):
        raise ReachedTheDag

    monkeypatch.setattr(runner, "run_local", stub)
    try:
        code = main(["run", "--config", str(config_file)])
    except ReachedTheDag:
        return True
    finally:
        monkeypatch.undo()
    assert code == 3, code
    return False


def _admit_all(decide):
    def admitting(*args, **kwargs):
        import dataclasses

        return dataclasses.replace(decide(*args, **kwargs), admitted=True)
    return admitting


@pytest.mark.parametrize("steps, admitted, alone", [(20, True, True), (100, False, True), (400, False, False)])
def test_every_surface_gives_the_gates_verdict(spent_once, tmp_path, monkeypatch, steps, admitted, alone):
    """Under, over only with the earlier run (the case where a per-run rule and the dataset's rule
    differ: the run alone fits), and over alone."""
    assert planned_ledger(_config(tmp_path / "l", tmp_path / "x", steps))["within_budget"] is alone
    verdicts = _surfaces(spent_once, tmp_path, steps, monkeypatch)
    assert verdicts == {k: admitted for k in verdicts}, verdicts


def test_a_delta_of_1_0001e_05_prints_as_such_in_budget_and_the_guard(tmp_path, capsys):
    """δ = δ_V + δ_T = 1e-9 + 1e-5: never "1e-05" (rounded down) in what a person reads."""
    import yaml

    from dpbert_cli.main import main
    from pipeline import guard

    path = _config_file(tmp_path / "ledgers", tmp_path / "out", 20)
    doc = yaml.safe_load(path.read_text())
    doc["training"]["delta"], doc["vocab"] = 1e-5, {"delta": 1e-9}
    path.write_text(yaml.safe_dump(doc))
    assert main(["budget", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1.0001e-05" in out and "δ = 1e-05" not in out
    config = load_config(str(path), [])
    planned = guard.planned(config)
    planned["dataset"] = guard.dataset_budget(config, planned, None)
    assert "1.0001e-05" in guard.planned_statement(planned)
    planned["within_budget"], planned["dataset"]["message"] = False, None
    assert "1.0001e-05" in guard.over_budget_message(planned)


@pytest.mark.parametrize("command", ["budget", "run", "ledger", "compile"])
def test_a_budget_on_a_user_corpus_without_a_dataset_id_is_exit_2_in_every_command(tmp_path, capsys, command):
    from dpbert_cli.main import main

    extra = {"run": ["--output", str(tmp_path / "out")],
             "compile": ["--output", str(tmp_path / "p.json"), "--image", "europe-west4-docker.pkg.dev/p/r/i:1",
                         "--pipeline-root", "gs://b/root"]}.get(command, [])
    code = main([command, *extra, "--set", "corpus.path=/x/notes.jsonl", "--set", "privacy.epsilon_budget=5",
                 "--set", "training.dataset_patients=100"])
    assert code == 2 and "corpus.dataset_id" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "p.json").exists()


def test_the_vocabularys_ledger_parameter_does_not_change_with_the_training(tmp_path):
    """A parameter that moved with the training would miss TFX's cache of the vocabulary: a second
    histogram released and charged. The trainer's parameter carries the plan (positive control)."""
    from dpbert.accounting.target import ledger_target_json

    short, long = (_config(tmp_path / "l", tmp_path / "o", steps) for steps in (20, 400))
    assert ledger_target_json(short, with_plan=False) == ledger_target_json(long, with_plan=False)
    assert ledger_target_json(short) != ledger_target_json(long)
