"""`dpbert budget`'s "the dataset's budget gate still admits": the most steps of the configured plan
the gate admits after the dataset's ledger — never a subtraction; None without a budget or identity."""
from dpbert.accounting import gate, reserve, target as ledger_target
from dpbert.config import load_config
from dpbert.accounting.accountant import planned_ledger
from dpbert.ledger import composition, dataset, identity
from dpbert.privacy import events
from pipeline import guard


def _config(tmp_path, *more):
    return load_config(None, [f"privacy.ledger={tmp_path}", "privacy.epsilon_budget=10", "corpus.dataset_id=ward-7",
                              "corpus.path=/data/notes.jsonl", "training.dataset_size=1000", *more])


def test_what_the_gate_admits_shrinks_as_the_dataset_spends(tmp_path):
    config = _config(tmp_path)
    fresh = guard.remaining_budget(config)
    assert fresh["steps"] >= fresh["planned_steps"]  # nothing spent yet: the plan fits
    target = ledger_target.ledger_target(config)
    record = events.dpsgd_event(1.0, 50, 1000, 4 * fresh["steps"] // 5, "poisson")
    reserve.reserve(target.uri(), target.dataset_id, reserve.EntryKeys("run-1", "/out/root"), "dp_sgd", [record],
                    "tuple", request=gate.Request(10.0, target.delta, target.threshold_delta, target.first_plan))
    after = guard.remaining_budget(config)
    assert 0 < after["steps"] < fresh["steps"]
    # The figure is the gate's: one more step than it says is refused by the same call the CAS makes.
    doc = dataset.read_ledger(target.uri(), target.dataset_id)
    planned = planned_ledger(config)
    train = composition.with_steps(composition.ledger_record(planned["train_events"][-1]), after["steps"] + 1)
    over = gate.decide(doc, dataset.entries_of(doc) + gate.planned_entries(planned["vocab_event"], [train], "x", "/o"),
                       gate.request_for(target))
    assert not over.admitted and over.reason == "over_budget"
    # No budget, or no identity: None (positive control of the None branch).
    assert guard.remaining_budget(None) is None
    assert guard.remaining_budget(load_config(None, ["privacy.epsilon_budget=null"])) is None


def test_dpbert_ledger_json_lists_the_runs_and_the_totals(tmp_path, capsys):
    import json

    from dpbert_cli.main import main

    record = events.dpsgd_event(1.0, 50, 1000, 100, "poisson")
    uri = identity.ledger_uri(str(tmp_path), "ward-7")
    for run in ("run-1", "run-2"):  # two runs from two output folders: both composed
        reserve.reserve(uri, "ward-7", reserve.EntryKeys(run, f"/out/{run}"), "dp_sgd", [record], "tuple",
                        request=gate.Request(None, 1e-5))
    assert main(["ledger", "--dataset", "ward-7", "--ledger", str(tmp_path), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [e["run_id"] for e in view["entries"]] == ["run-1", "run-2"] and view["runs"] == 2
    one = view["entries"][0]["epsilon_rdp"]
    assert view["totals"]["rule"] == "no_budget" and view["totals"]["epsilon_rdp"] > one  # composed, not the max
    # An unknown dataset is an error naming it (exit 2), not an empty "remaining -".
    assert main(["ledger", "--dataset", "no-such-id", "--ledger", str(tmp_path)]) == 2
    assert "no-such-id" in capsys.readouterr().err
