"""The dataset ledger (dpbert.ledger): identity, location, reserve / finalize by compare-and-swap,
the RDP filter over every entry, on a local folder, ram:// and fake://."""
import dataclasses
import json
import math
import subprocess
import sys
import threading
import uuid

import pytest

from dpbert import storage
from dpbert.config import ConfigError, load_config
from dpbert.ledger import composition as lc
from dpbert.ledger import dataset as ld
from dpbert.ledger import identity
from dpbert.accounting import compose as acompose, gate, reserve as areserve, target
from dpbert.accounting import accountant
from dpbert.privacy import events, histogram
from dpbert.storage import fake

REPO = __file__.rsplit("/tests/", 1)[0]
DELTA = 1e-5


def vocab_record(sigma=20.0, unit="tuple", k=1):
    return events.histogram_event(histogram.histogram_report(sigma, 1e-9, 16, "correct", k, unit=unit))


def train_record(steps=100, sigma=1.0, sampling="poisson", n=1000, unit=None):
    return events.dpsgd_event(sigma, 50, n, steps, sampling, unit=unit)


# local (flock + mtime generations) and fake (GCS-like generations); ram:// is the same gfile
# layer the storage contract tests already cover, and the ledger logic is backend-blind.
@pytest.fixture(params=["local", "fake"])
def uri(request, tmp_path):
    fake.reset()
    tag = uuid.uuid4().hex[:8]
    root = {"local": str(tmp_path / "ledgers"), "ram": f"ram://ledgers-{tag}", "fake": f"fake://b/{tag}"}[request.param]
    return identity.ledger_uri(root, "ds-1")


def reserve(uri, records, budget=None, chain=None, mechanism="dp_sgd", unit="tuple", entry_id=None):
    keys = areserve.EntryKeys("run", "/out/pipeline_root", chain=chain, entry_id=entry_id)
    return areserve.reserve(uri, "ds-1", keys, mechanism, records, unit, request=gate.Request(budget, DELTA))


# ------------------------------------------------------------------------------------------ identity

def test_identity_is_declared_or_the_synthetic_generator_never_the_content():
    config = load_config(None, [], preset="demo")
    sid = identity.dataset_id_for(config.corpus)
    assert sid.startswith("synthetic-") and sid == identity.dataset_id_for(config.corpus)
    more = dataclasses.replace(config.corpus, synthetic=dataclasses.replace(config.corpus.synthetic, patients=7))
    assert identity.dataset_id_for(more) != sid
    user = dataclasses.replace(config.corpus, path="/data/notes.jsonl")
    assert identity.dataset_id_for(user) is None
    assert identity.dataset_id_for(dataclasses.replace(user, dataset_id="mimic-iii")) == "mimic-iii"
    assert identity.ledger_uri("gs://b/l", "mimic-iii") == "gs://b/l/mimic-iii.json"
    assert identity.safe_name("a/b c") == "a_b_c"


def test_a_budget_on_a_user_corpus_needs_a_dataset_id(tmp_path):
    with pytest.raises(ConfigError, match="corpus.dataset_id"):
        load_config(None, ["corpus.path=/x/notes.jsonl", "privacy.epsilon_budget=5"], preset="demo")
    load_config(None, ["corpus.path=/x/notes.jsonl", "privacy.epsilon_budget=5", "corpus.dataset_id=x1"],
                preset="demo")
    with pytest.raises(ConfigError, match="corpus.dataset_id"):
        load_config(None, ["corpus.dataset_id=../etc"], preset="demo")


def test_the_location_is_outside_every_output_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(identity.LEDGER_ENV, str(tmp_path / "ledgers"))
    config = load_config(None, [f"pipeline.output_dir={tmp_path / 'out'}", "corpus.path=/x/notes.jsonl",
                                "corpus.dataset_id=x1"], preset="demo")
    assert identity.location_for(config) == str(tmp_path / "ledgers")
    monkeypatch.delenv(identity.LEDGER_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert identity.default_location() == str(tmp_path / "xdg" / "dpbert" / "ledgers")
    inside = load_config(None, [f"pipeline.output_dir={tmp_path / 'out'}", f"privacy.ledger={tmp_path / 'out' / 'l'}",
                                "corpus.path=/x/notes.jsonl", "corpus.dataset_id=x1"], preset="demo")
    with pytest.raises(ConfigError, match="privacy.ledger"):
        identity.location_for(inside)


# ---------------------------------------------------------------------------------------- compose

def test_one_vocabulary_and_one_training_compose_as_the_accountant_does():
    vocab, train = vocab_record(), train_record()
    delta = vocab["delta"] + 1e-6
    want = accountant.ledger(vocab, [train], delta)
    got = acompose.compose([{"mechanism": "dp_histogram", "status": "finalized", "executed": [lc.ledger_record(vocab)]},
                      {"mechanism": "dp_sgd", "status": "reserved", "planned": [lc.ledger_record(train)]}], delta)
    assert got["epsilon_rdp"] == pytest.approx(want["epsilon_total_rdp"], rel=1e-9)
    assert got["epsilon_pld"] == pytest.approx(want["epsilon_total_pld"], rel=1e-9)
    assert got["delta_composed"] == pytest.approx(want["delta_composed"], rel=1e-12)


def test_two_runs_compose_to_more_than_either_and_less_than_their_sum():
    one = {"mechanism": "dp_sgd", "status": "reserved", "planned": [lc.ledger_record(train_record())]}
    single, double = acompose.compose([one], DELTA)["epsilon_rdp"], acompose.compose([one, one], DELTA)["epsilon_rdp"]
    assert single < double < 2 * single


def test_the_ledger_holds_no_exact_count():
    shuffled = lc.ledger_record(train_record(sampling="shuffle", n=1234))
    dp_count = lc.ledger_record(events.validate_record(__import__("dpbert.privacy.count", fromlist=["x"])
                                                       .count_event(5.0, 987)))
    text = json.dumps([shuffled, dp_count])
    assert "1234" not in text and "987" not in text and "dataset_size" not in text and "released" not in text
    assert acompose.compose([{"mechanism": "dp_sgd", "planned": [shuffled]}], DELTA)["epsilon_rdp"] == pytest.approx(
        accountant.ledger(None, [train_record(sampling="shuffle", n=1234)], DELTA)["epsilon_total_rdp"])


def test_non_private_and_dchi_are_listed_not_composed():
    entries = [{"mechanism": "non_private", "planned": [lc.ledger_record(events.non_private_event("train"))]},
               {"mechanism": "dchi", "planned": []}]
    got = acompose.compose(entries, DELTA)
    assert got["epsilon_rdp"] == 0 and got["listed"] == 2 and got["entries"] == 0


# ------------------------------------------------------------------------------- reserve / finalize

def test_reserve_then_finalize(uri):
    res = reserve(uri, [train_record(steps=100)], budget=100)
    doc = ld.read_ledger(uri)
    (entry,) = ld.entries_of(doc)
    assert entry["status"] == "reserved" and entry["planned"][0]["steps"] == 100 and doc["unit"] == "tuple"
    assert doc["delta"] == DELTA
    target.finalize_training(res, 40)
    (entry,) = ld.entries_of(ld.read_ledger(uri))
    assert entry["status"] == "finalized" and entry["executed"][0]["steps"] == 40
    assert acompose.compose([entry], DELTA)["epsilon_rdp"] == pytest.approx(
        accountant.ledger(None, [train_record(steps=40)], DELTA)["epsilon_total_rdp"])


def _budget_for_one(record):
    one = acompose.compose([{"mechanism": "x", "planned": [lc.ledger_record(record)]}], DELTA)["epsilon_rdp"]
    two = acompose.compose([{"mechanism": "x", "planned": [lc.ledger_record(record)] * 2}], DELTA)["epsilon_rdp"]
    return (one + two) / 2


def test_over_budget_is_refused_with_the_totals_and_writes_nothing(uri):
    record = train_record()
    budget = _budget_for_one(record)
    reserve(uri, [record], budget=budget)
    before = storage.storage_for(uri).read(uri)
    with pytest.raises(gate.BudgetRefused) as refused:
        reserve(uri, [record], budget=budget)
    assert refused.value.totals["epsilon_rdp"] > budget and refused.value.totals["entries"] == 2
    assert "ds-1" in str(refused.value)
    assert storage.storage_for(uri).read(uri) == before


def test_an_unfinalized_reservation_stays_charged_at_its_planned_size(uri):
    record = train_record(steps=100)
    budget = _budget_for_one(record)
    reserve(uri, [record])  # an interrupted run: never finalized, charged at its 100 planned steps
    with pytest.raises(gate.BudgetRefused):
        reserve(uri, [record], budget=budget)
    target.finalize_training(areserve.Reservation(uri, ld.entries_of(ld.read_ledger(uri))[0]["id"], "ds-1"), 10)
    reserve(uri, [record], budget=budget)  # finalized at the 10 steps it executed: 110 fit


def test_a_resumed_chain_replaces_its_own_entry(uri):
    record = train_record()
    budget = _budget_for_one(record)
    first = reserve(uri, [train_record(steps=60)], budget=budget, chain="state/abc")
    target.finalize_training(first, 30)
    second = reserve(uri, [train_record(steps=100)], budget=budget, chain="state/abc")  # 30 done + 70 left
    assert second.entry_id == first.entry_id
    target.finalize_training(second, 20)  # a stale count: the larger executed count wins
    (entry,) = ld.entries_of(ld.read_ledger(uri))
    assert entry["status"] == "finalized" and entry["executed"][0]["steps"] == 30
    target.finalize_training(second, 100)
    assert ld.entries_of(ld.read_ledger(uri))[0]["executed"][0]["steps"] == 100
    with pytest.raises(gate.BudgetRefused):  # another chain is a second charge
        reserve(uri, [train_record(steps=100)], budget=budget, chain="state/other")


def test_a_retried_reservation_is_applied_once(uri):
    reserve(uri, [train_record()], entry_id="fixed")
    reserve(uri, [train_record()], entry_id="fixed")
    assert len(ld.entries_of(ld.read_ledger(uri))) == 1


def test_one_privacy_unit_per_dataset(uri):
    reserve(uri, [vocab_record(unit="patient", k=4)], mechanism="dp_histogram", unit="patient")
    with pytest.raises(lc.UnitMismatch, match="one unit per dataset"):
        reserve(uri, [train_record()], unit="tuple")
    with pytest.raises(lc.UnitMismatch):
        reserve(uri, [train_record()], unit="patient")  # a tuple-level event under the patient unit


def test_a_listed_entry_is_never_refused(uri):
    reserve(uri, [train_record(steps=1000)], budget=1e3)
    res = reserve(uri, [events.non_private_event("train")], budget=1e-3)
    assert ld.read_ledger(uri)["entries"][res.entry_id]["mechanism"] == "non_private"


# ------------------------------------------------------------------------------------- concurrency

def _race(uri, record, budget, workers=6):
    wins, refusals = [], []
    barrier = threading.Barrier(workers)

    def go():
        barrier.wait()
        try:
            wins.append(reserve(uri, [record], budget=budget))
        except gate.BudgetRefused:
            refusals.append(1)

    threads = [threading.Thread(target=go) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins, refusals


def test_threads_racing_for_the_last_epsilon_on_fake_storage_one_wins():
    fake.reset()
    uri = identity.ledger_uri(f"fake://b/{uuid.uuid4().hex[:6]}", "ds-1")
    record = train_record()
    wins, refusals = _race(uri, record, _budget_for_one(record))
    assert len(wins) == 1 and len(refusals) == 5 and len(ld.entries_of(ld.read_ledger(uri))) == 1


def test_positive_control_without_compare_and_swap_both_threads_spend(monkeypatch):
    """A broken update (read, check, write unconditionally) with both readers before either writer:
    two entries are written over a budget that holds one — what the CAS prevents."""
    fake.reset()
    uri = identity.ledger_uri(f"fake://b/{uuid.uuid4().hex[:6]}", "ds-1")
    record = train_record()
    barrier = threading.Barrier(2)

    def broken_update(u, fn, default=None, retries=20):
        value = storage.read_json(u, default=default)
        value = json.loads(json.dumps(value))
        barrier.wait()
        new = fn(value)
        with lock:
            current = storage.read_json(u, default=default)  # a blind merge: last writer adds its entries
            current.setdefault("entries", {}).update(new["entries"])
            current.update({k: v for k, v in new.items() if k != "entries"})
            storage.write_json(u, current)
        return new

    lock = threading.Lock()
    monkeypatch.setattr(ld.storage, "update_json", broken_update)
    wins, refusals = _race(uri, record, _budget_for_one(record), workers=2)
    assert len(wins) == 2 and len(ld.entries_of(ld.read_ledger(uri))) == 2  # the budget was overspent


_WORKER = """
import sys
from tests.ledger.test_dataset_ledger import reserve, train_record
from dpbert.accounting.gate import BudgetRefused
try:
    reserve(sys.argv[1], [train_record()], budget=float(sys.argv[2]))
    print("won")
except BudgetRefused:
    print("refused")
"""


def test_processes_racing_for_the_last_epsilon_on_a_local_folder_one_wins(tmp_path):
    uri = identity.ledger_uri(str(tmp_path / "ledgers"), "ds-1")
    budget = _budget_for_one(train_record())
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, uri, repr(budget)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    assert outs == ["refused", "refused", "won"]
    assert len(ld.entries_of(ld.read_ledger(uri))) == 1


def test_a_dataset_ledger_infinite_when_thresholds_use_up_delta():
    rec = lc.ledger_record(vocab_record())
    got = acompose.compose([{"mechanism": "dp_histogram", "planned": [rec]}], rec["threshold_delta"] / 2)
    assert math.isinf(got["epsilon_rdp"])


def test_a_compiled_pipeline_with_a_budget_needs_a_cloud_storage_ledger():
    user = ["corpus.path=/x/notes.jsonl", "corpus.dataset_id=x1", "training.dataset_patients=10000"]
    assert identity.remote_ledger_problem(load_config(None, ["privacy.epsilon_budget=null", *user], preset="demo")) is None
    assert "privacy.ledger" in identity.remote_ledger_problem(load_config(None, user, preset="demo"))
    assert identity.remote_ledger_problem(load_config(None, ["privacy.ledger=gs://b/ledgers", *user],
                                                      preset="demo")) is None
