"""Two runs on ONE dataset, as the accountant leaves them: a dataset ledger with both runs'
DP-SGD entries (``dpbert.accounting.reserve.reserve``, as tests/accounting/test_pinned_budget.py)
and an ML Metadata store whose two runs each have a PrivacyAccountant execution carrying the
``ledger_target`` parameter and a PrivacyReport with the run's own ε and the gate's verdict over
the ledger at the run's end (the ``dataset_*`` properties of ``dpbert.stages.accountant``)."""
from __future__ import annotations

import os

from ml_metadata.proto import metadata_store_pb2 as mlmd

from dpbert.accounting import gate, reserve
from dpbert.accounting.compose import entry_epsilon
from dpbert.accounting.target import LedgerTarget
from dpbert.ledger import dataset, identity
from dpbert.privacy import events
from tests.dashboard import fakestore

DATASET = "ward7"
DELTA = 1e-5
BUDGET = 8.0
RUNS = ("2026-05-01T09:00:00.000001", "2026-05-02T09:00:00.000001")
STEPS = (20, 30)


def _record(steps: int):
    return events.dpsgd_event(1.0, 50, 1000, steps, "poisson")


def _accountant(b: fakestore._Builder, run_id: str, target: LedgerTarget, props: dict):
    """The PrivacyAccountant's execution (its ``ledger_target`` parameter, as TFX records a
    component's parameters) and its PrivacyReport."""
    run = b.run(run_id)
    node = "PrivacyAccountant"
    if node not in b.nodes:
        b.nodes[node] = b._context("node", f"{fakestore.PIPELINE}.{node}")  # noqa: SLF001
    execution = mlmd.Execution(type_id=b._type(f"components.{node}", "execution"),  # noqa: SLF001
                               last_known_state=mlmd.Execution.COMPLETE)
    execution.custom_properties["ledger_target"].string_value = target.to_json()
    artifact = mlmd.Artifact(type_id=b._type("components.PrivacyReport", "artifact"),  # noqa: SLF001
                             uri=os.path.join(b.root, run_id, "report"), state=mlmd.Artifact.LIVE)
    fakestore._put_props(artifact, props)  # noqa: SLF001
    event = mlmd.Event(type=mlmd.Event.OUTPUT)
    event.path.steps.add().key = "report"
    event.path.steps.add().index = 0
    b.store.put_execution(execution, [(artifact, event)], [b.pipeline, run, b.nodes[node]])


def report_properties(doc, entries, run_entry, with_dataset: bool = True) -> dict:
    """The PrivacyReport's properties at a run's end: its own ε, and (``with_dataset``) the gate's
    verdict over the ledger's entries so far, as the accountant stores them."""
    own = entry_epsilon(run_entry, DELTA)["epsilon_pld"]
    props = {"epsilon_total_pld": own, "epsilon_train": own, "delta": DELTA, "unit": "tuple",
             "epsilon_budget": BUDGET, "within_budget": True, "private": 0}
    if with_dataset:
        v = gate.decide(doc, entries, pld=True)
        props.update({"dataset_epsilon_spent": v.spent, "dataset_epsilon_rdp": v.epsilon_rdp,
                      "dataset_epsilon_pld": v.epsilon_pld, "dataset_delta": v.delta,
                      "dataset_epsilon_budget": v.budget, "dataset_rule": v.rule, "within_budget": v.admitted})
    return props


def build(folder: str, with_dataset: bool = True) -> dict:
    """The ledger (under ``folder``/ledgers) and the store (``folder``/metadata.sqlite):
    ``{"ledger", "store", "doc", "entries", "verdict"}``. ``with_dataset`` False: the reports
    carry only the run's own ε (what a surface that ignores the dataset would read)."""
    location = os.path.join(folder, "ledgers")
    uri = identity.ledger_uri(location, DATASET)
    for run_id, steps in zip(RUNS, STEPS):
        reserve.reserve(uri, DATASET, reserve.EntryKeys(f"MLMPretrainer/{run_id}", f"/out/{run_id}"), "dp_sgd",
                        [_record(steps)], "tuple", request=gate.Request(BUDGET, DELTA, first_plan=(_record(steps),)))
    doc = dataset.read_ledger(uri, DATASET)
    entries = dataset.entries_of(doc)
    target = LedgerTarget(dataset_id=DATASET, unit="tuple", delta=DELTA, epsilon_budget=BUDGET, location=location)
    store = os.path.join(folder, "metadata.sqlite")
    b = fakestore._Builder(store, os.path.join(folder, "root"))  # noqa: SLF001
    for i, run_id in enumerate(RUNS):
        _accountant(b, run_id, target, report_properties(doc, entries[:i + 1], entries[i], with_dataset))
    return {"ledger": uri, "store": store, "doc": doc, "entries": entries,
            "verdict": gate.decide(doc, entries, pld=True)}
