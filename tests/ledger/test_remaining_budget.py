"""`dpbert budget`'s "remaining budget of this dataset": the budget minus what the dataset's ledger
has charged, composed as the budget is enforced; None without a budget or a dataset identity."""
from dpbert.config import load_config
from dpbert.ledger import dataset, identity
from dpbert.ledger import target as ledger_target
from dpbert.privacy import events
from pipeline import guard


def test_remaining_budget_is_the_budget_minus_what_the_ledger_charged(tmp_path):
    config = load_config(None, [f"privacy.ledger={tmp_path}", "privacy.epsilon_budget=10", "corpus.dataset_id=ward-7",
                                "corpus.path=/data/notes.jsonl", "training.dataset_size=1000"])
    assert guard.remaining_budget(config) == 10.0  # nothing spent yet
    target = ledger_target.ledger_target(config)
    uri = identity.ledger_uri(identity.location_for(config), target.dataset_id)
    record = events.dpsgd_event(1.0, 50, 1000, 100, "poisson")
    dataset.reserve(uri, target.dataset_id, "run-1", "/out/root", "dp_sgd", [record], "tuple", delta=target.delta,
                    budget=10.0)
    totals = dataset.within(dataset.entries_of(dataset.read_ledger(uri, target.dataset_id)), 10.0, target.delta,
                            pld=True)
    remaining = guard.remaining_budget(config)
    assert 0 < remaining < 10 and abs(remaining - (10 - dataset.spent(totals))) < 1e-12
    # No budget, or no identity: unknown (positive control of the None branch).
    assert guard.remaining_budget(None) is None
    assert guard.remaining_budget(load_config(None, ["privacy.epsilon_budget=null"])) is None


def test_dpbert_ledger_json_lists_the_runs_and_the_totals(tmp_path, capsys):
    import json

    from dpbert_cli.main import main

    record = events.dpsgd_event(1.0, 50, 1000, 100, "poisson")
    uri = identity.ledger_uri(str(tmp_path), "ward-7")
    for run in ("run-1", "run-2"):  # two runs from two output folders: both composed
        dataset.reserve(uri, "ward-7", run, f"/out/{run}", "dp_sgd", [record], "tuple", delta=1e-5, budget=None)
    assert main(["ledger", "--dataset", "ward-7", "--ledger", str(tmp_path), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [e["run_id"] for e in view["entries"]] == ["run-1", "run-2"] and view["runs"] == 2
    one = view["entries"][0]["epsilon_rdp"]
    assert view["totals"]["rule"] == "rdp_filter" and view["totals"]["epsilon_rdp"] > one  # composed, not the max
