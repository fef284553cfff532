"""A synthetic ML Metadata store with the structure TFX's LocalDagRunner writes (pipeline,
pipeline_run and node contexts; executions; OUTPUT/INPUT events keyed by the output name) and
every artifact type the dashboard knows, including those whose components are still being
written (NerReport, CanaryReport, MembershipReport): their property shapes are guesses that the
dashboard must tolerate.

Runs (newest first as ``list_runs`` returns them):
- ``RICH_RUN``: every component COMPLETE, every report present, a ``<script>`` in a visible
  string property, a private tuples artifact whose withheld properties hold a fake file name
  and a private canary-secrets artifact holding a fake secret;
- ``ODD_RUN``: a run id with HTML and URL metacharacters, a non-private vocabulary (ε = ∞,
  stored as the string "inf"), a failed evaluator: status FAILED;
- ``EMPTY_RUN``: a pipeline_run context without executions.

``build_release_store`` writes another store whose artifacts have real files (for ``dpbert
release``): a DP run, a non-private run and a run over its budget, with a recognizable secret in
every operator-only file and property.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2 as mlmd

PIPELINE = "dpbert-demo"
RICH_RUN = "2026-02-02T10:00:00.000001"
ODD_RUN = "odd <b>run</b> #1?x=1&y=2 / 'q\" 100%"
EMPTY_RUN = "2026-03-03T09:00:00.000001"
SCRIPT = "<script>alert(1)</script>"
PRIVATE_SECRETS = ("/data/patients/<script>alert(2)</script>mrn-0042.jsonl", "canary secret 4 7 1 1 9 3")

LOSS_CURVE = [8.9, 8.1, 7.6, 7.3, 7.05, 6.9]
NON_DP_LOSS_CURVE = [8.9, 7.2, 6.1, 5.5, 5.1, 4.8]
CANARY_GROUPS = [
    {"group": "held_out", "occurrences": None, "exposure_dp": {"n": 10, "mean": 1.1}, "exposure_non_dp": 1.3},
    {"group": "x1", "occurrences": 1, "exposure_dp": 1.2, "exposure_non_dp": 2.9},
    {"group": "x10", "occurrences": 10, "exposure_dp": 1.4, "exposure_non_dp": 7.5},
    {"group": "x100", "occurrences": 100, "exposure_dp": {"n": 10, "mean": 2.0, "std": 0.4},
     "exposure_non_dp": {"n": 10, "mean": 13.2}},
]
ATTACKS = [{"name": "loss threshold", "auc": 0.53, "advantage": 0.04,
            "fpr": [0.0, 0.1, 0.3, 0.6, 1.0], "tpr": [0.0, 0.12, 0.33, 0.62, 1.0]},
           {"name": "reference model", "auc": 0.61,
            "roc": {"fpr": [0.0, 0.2, 0.5, 1.0], "tpr": [0.0, 0.3, 0.65, 1.0]}}]
STATEMENT = ("This run is (7.1, 2e-06)-DP at the patient level: vocabulary ε_V = 1.2, "
             "DP-SGD ε_T = 6.5 (PLD), within the budget ε = 8.")


def _put_props(message, props):
    """As the components' writer (``components.common.set_properties``): each privacy number's
    exact string next to its double (``dpbert.schema.exact_companions``)."""
    from dpbert.schema import exact_companions

    for key, text in exact_companions(props).items():
        message.custom_properties[key].string_value = text
    for key, value in props.items():
        v = message.custom_properties[key]
        if isinstance(value, bool):
            v.int_value = int(value)
        elif isinstance(value, int):
            v.int_value = value
        elif isinstance(value, float):
            if value == float("inf"):
                v.string_value = "inf"
            else:
                v.double_value = value
        elif isinstance(value, (dict, list)):
            v.string_value = json.dumps(value, sort_keys=True)
        else:
            v.string_value = str(value)


class _Builder:
    def __init__(self, path: str, root: str):
        config = mlmd.ConnectionConfig()
        config.sqlite.filename_uri = path
        config.sqlite.connection_mode = mlmd.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        self.store = metadata_store.MetadataStore(config)
        self.root = root
        self.ctx_types = {n: self.store.put_context_type(mlmd.ContextType(name=n))
                          for n in ("pipeline", "pipeline_run", "node")}
        self.types = {}
        self.pipeline = self._context("pipeline", PIPELINE)
        self.nodes = {}
        self.made = 0

    def _context(self, kind, name):
        [cid] = self.store.put_contexts([mlmd.Context(type_id=self.ctx_types[kind], name=name)])
        return mlmd.Context(id=cid, type_id=self.ctx_types[kind], name=name)

    def run(self, run_id):
        ctx = self._context("pipeline_run", run_id)
        self.store.put_parent_contexts([mlmd.ParentContext(child_id=ctx.id, parent_id=self.pipeline.id)])
        return ctx

    def _type(self, name, kind):
        if (kind, name) not in self.types:
            if kind == "artifact":
                self.types[kind, name] = self.store.put_artifact_type(mlmd.ArtifactType(name=name))
            else:
                self.types[kind, name] = self.store.put_execution_type(mlmd.ExecutionType(name=name))
        return self.types[kind, name]

    def execute(self, run_ctx, node_id, state, inputs=(), outputs=()):
        """outputs: [(key, type_name, props)]; returns {key: artifact (with id)}."""
        if node_id not in self.nodes:
            self.nodes[node_id] = self._context("node", f"{PIPELINE}.{node_id}")
        execution = mlmd.Execution(type_id=self._type(f"components.{node_id}", "execution"),
                                   last_known_state=getattr(mlmd.Execution, state))
        pairs = []
        for key, artifact in inputs:
            event = mlmd.Event(type=mlmd.Event.INPUT)
            event.path.steps.add().key = key
            event.path.steps.add().index = 0
            pairs.append((artifact, event))
        made = {}
        for key, type_name, props in outputs:
            self.made += 1  # a distinct URI per artifact, as TFX's <node>/<key>/<execution id>
            artifact = mlmd.Artifact(type_id=self._type(type_name, "artifact"),
                                     uri=os.path.join(self.root, node_id, key, str(self.made)),
                                     state=mlmd.Artifact.LIVE)
            _put_props(artifact, props)
            event = mlmd.Event(type=mlmd.Event.OUTPUT)
            event.path.steps.add().key = key
            event.path.steps.add().index = 0
            pairs.append((artifact, event))
            made[key] = artifact
        _, artifact_ids, _ = self.store.put_execution(
            execution, pairs, [self.pipeline, run_ctx, self.nodes[node_id]])
        for (artifact, _), aid in zip(pairs, artifact_ids):
            artifact.id = aid
        time.sleep(0.002)  # distinct creation times
        return made


def build_store(path: str, artifact_root: str) -> str:
    """Write the store at ``path``; artifact URIs point under ``artifact_root`` (never created)."""
    b = _Builder(path, artifact_root)

    odd = b.run(ODD_RUN)
    t = b.execute(odd, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_tuples": 12, "corpus": PRIVATE_SECRETS[0]})])
    v = b.execute(odd, "DPVocabularyGen", "COMPLETE", inputs=[("tuples", t["tuples"])], outputs=[
        ("vocabulary", "components.DPVocabulary",
         {"private": 0, "vocab_size": 120, "words_kept": 340, "non_private": 1, "epsilon": float("inf")})])
    m = b.execute(odd, "Trainer", "COMPLETE", inputs=[("tuples", t["tuples"]), ("vocabulary", v["vocabulary"])],
                  outputs=[("model", "components.PretrainedModel",
                            {"private": 0, "steps_taken_total": 2, "final_mlm_loss": 8.5, "non_private": 0})])
    b.execute(odd, "PrivacyAccountant", "COMPLETE", inputs=[("vocabulary", v["vocabulary"]), ("model", m["model"])],
              outputs=[("report", "components.PrivacyReport", {
                  "private": 0, "epsilon_vocab": float("inf"), "epsilon_train": 3.0,
                  "epsilon_total_basic": float("inf"), "epsilon_total_pld": float("inf"),
                  "delta": 1e-5, "unit": "tuple", "sampling": "shuffle", "steps": 2, "within_budget": 1})])
    b.execute(odd, "NerEvaluator", "FAILED", inputs=[("model", m["model"])])

    rich = b.run(RICH_RUN)
    t = b.execute(rich, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_tuples": 480, "num_documents": 160,
                                             "num_patients": 40, "corpus": PRIVATE_SECRETS[0],
                                             "num_note": PRIVATE_SECRETS[0],  # not a count: withheld
                                             "tuple_words": 256})])
    v = b.execute(rich, "DPVocabularyGen", "COMPLETE", inputs=[("tuples", t["tuples"])], outputs=[
        ("vocabulary", "components.DPVocabulary", {
            "private": 0, "vocab_size": 300, "words_kept": 812, "sigma": 50.0, "threshold": 231.5,
            "epsilon": 1.2, "delta": 1e-6, "non_private": 0, "unit": "patient",
            "note": f"token {SCRIPT} & more",
            "dp_event": {"mechanism": "dp_histogram", "sigma": 50.0, "delta": 1e-6, "padding": "x" * 300}})])
    m = b.execute(rich, "Trainer", "COMPLETE", inputs=[("tuples", t["tuples"]), ("vocabulary", v["vocabulary"])],
                  outputs=[("model", "components.PretrainedModel", {
                      "private": 0, "steps_taken_total": 6, "initial_mlm_loss": 8.9, "final_mlm_loss": 6.9,
                      "loss_curve": LOSS_CURVE, "non_private": 0, "sampling_mode": "poisson"})])
    n = b.execute(rich, "BaselineTrainer", "COMPLETE",
                  inputs=[("tuples", t["tuples"]), ("vocabulary", v["vocabulary"])],
                  outputs=[("model", "components.PretrainedModel", {  # trained without noise: private
                      "private": 1, "steps_taken_total": 6, "final_mlm_loss": 4.8,
                      "loss_curve": NON_DP_LOSS_CURVE, "non_private": 1})])
    b.execute(rich, "PrivacyAccountant", "COMPLETE",
              inputs=[("vocabulary", v["vocabulary"]), ("model", m["model"])],
              outputs=[("report", "components.PrivacyReport", {
                  "private": 0, "epsilon_vocab": 1.2, "epsilon_train": 6.5, "epsilon_total_basic": 7.7,
                  "epsilon_total_pld": 7.1, "epsilon_total_rdp": 7.4, "delta": 2e-6, "delta_vocab": 1e-6,
                  "delta_train": 1e-6, "unit": "patient", "sampling": "poisson", "steps": 6,
                  "epsilon_budget": 8.0, "within_budget": 1, "statement": STATEMENT})])
    b.execute(rich, "NerEvaluator", "COMPLETE", inputs=[("model", m["model"])], outputs=[
        ("report", "components.NerReport", {
            "private": 0, "f1": 0.712,
            "per_type": {"Chemical": {"precision": 0.8, "recall": 0.7, "f1": 0.747, "support": 120},
                         "Disease": 0.66},
            "table": [{"model": "DP", "f1": 0.712}, {"model": "non-DP", "f1": 0.79}]})])
    c = b.execute(rich, "CanaryInserter", "COMPLETE", outputs=[
        ("secrets", "components.CanarySecrets", {"private": 1, "num_canaries": 40,
                                                 "secrets": PRIVATE_SECRETS[1]})])
    b.execute(rich, "CanaryEvaluator", "COMPLETE",
              inputs=[("model", m["model"]), ("baseline", n["model"]), ("secrets", c["secrets"])],
              outputs=[("report", "components.CanaryReport", {
                  "private": 0, "groups": CANARY_GROUPS, "audit_epsilon_lower_bound": 0.31})])
    b.execute(rich, "MembershipEvaluator", "COMPLETE", inputs=[("model", m["model"])], outputs=[
        ("report", "components.MembershipReport", {"private": 1, "attacks": ATTACKS})])

    time.sleep(0.002)
    b.run(EMPTY_RUN)
    del b
    # Durations: MLMD stamps creation and update at insertion; spread them like a real run's. The
    # k-th execution of a run starts 1000k + 100 ms after the run and lasts 1000(k + 1) + 200 ms.
    db = sqlite3.connect(path)
    with db:
        runs = db.execute("SELECT c.id, c.create_time_since_epoch FROM Context c JOIN Type t ON c.type_id = t.id "
                          "WHERE t.name = 'pipeline_run'").fetchall()
        for ctx_id, created in runs:
            ids = [e for (e,) in db.execute("SELECT execution_id FROM Association WHERE context_id = ? "
                                            "ORDER BY execution_id", (ctx_id,))]
            for k, execution_id in enumerate(ids):
                start = created + 1000 * k + 100
                db.execute("UPDATE Execution SET create_time_since_epoch = ?, last_update_time_since_epoch = ? "
                           "WHERE id = ?", (start, start + 1000 * (k + 1) + 200, execution_id))
    db.close()
    return path


# --------------------------------------------------------------------------- with artifact files
#: A recognizable secret planted in every operator-only file and property of ``build_release_store``.
RELEASE_SECRET = "CANARY-SECRET 4 7 1 1 9 3 mrn-0042"
RELEASE_RUN = "2026-04-04T08:00:00.000001"
NON_PRIVATE_RUN = "2026-04-04T07:00:00.000001"
OVER_BUDGET_RUN = "2026-04-04T06:00:00.000001"
RELEASE_EPSILON = 9.0882
#: The DP model's TensorBoard files as TensorFlow names them (unix time, host, pid) — two segments
#: of a resumed run, with wall times; ``dpbert.release`` rewrites them (no time, neutral name).
RELEASE_TENSORBOARD = {"tensorboard/events.out.tfevents.1775289600.build-host-7.4242.0.v2": (0, 1775289600.25),
                       "tensorboard/events.out.tfevents.1775289999.build-host-7.4243.0.v2": (2, 1775289999.5)}


def _tensorboard_events(first_step: int, start: float) -> bytes:
    """A real event file: file_version, 2 steps of scalars (seconds apart), one run-metadata event."""
    from tensorboard.compat.proto import event_pb2

    from dpbert.release import encode_event_file

    events = [event_pb2.Event(wall_time=start, file_version="brain.Event:2")]
    for i, step in enumerate((first_step, first_step + 1)):
        event = event_pb2.Event(wall_time=start + 0.9 + 1.31 * i, step=step)
        event.summary.value.add(tag="mlm_loss", simple_value=8.8 - 0.3 * step)
        event.summary.value.add(tag="batch_size", simple_value=16.0 + step)
        events.append(event)
    timing = event_pb2.Event(wall_time=start + 3.0, step=first_step + 1)
    timing.tagged_run_metadata.tag = "step_timing"
    timing.tagged_run_metadata.run_metadata = b"all_start_micros 1775289600250000"
    return encode_event_file(events + [timing])


def _write(directory: str, files: dict):
    for rel, content in files.items():
        path = os.path.join(directory, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode("utf-8"))


def _release_run(b: _Builder, run_id: str, ledger: dict, files: dict):
    """One run of the full DAG whose artifacts hold real files (``files``: {uri key: uri}, filled)."""
    secret = RELEASE_SECRET
    run = b.run(run_id)
    t = b.execute(run, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_tuples": 4811, "corpus": secret})])
    _write(t["tuples"].uri, {"tuples-00000-of-00001.gz": f"patient P0001 note: {secret} exact text"})
    v = b.execute(run, "DPVocabularyGen", "COMPLETE", inputs=[("tuples", t["tuples"])], outputs=[
        ("vocabulary", "components.DPVocabulary", {
            "private": 0, "vocab_size": 5, "words_kept": 3, "sigma": 2.0, "threshold": 9.5, "epsilon": 0.42,
            "non_private": 0, "unit": "tuple"})])
    _write(v["vocabulary"].uri, {
        "vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\npatient\nfever\n",
        "tokenizer.json": '{"model": {"type": "WordPiece"}}',
        "histogram.jsonl": '{"word": "patient", "count": 13.7}\n{"word": "fever", "count": 10.2}\n',
        "dp_event.json": '{"mechanism": "dp_histogram", "sigma": 2.0}'})
    c = b.execute(run, "CanaryGen", "COMPLETE", inputs=[("vocabulary", v["vocabulary"])], outputs=[
        ("canaries", "components.CanaryList", {"private": 1, "num_canaries": 8, "secrets": secret})])
    _write(c["canaries"].uri, {"canaries.json": json.dumps({"canaries": [secret]}),
                               "insertion_seed.json": '{"insertion_seed": 1234567}'})
    m = b.execute(run, "MLMPretrainer", "COMPLETE",
                  inputs=[("tuples", t["tuples"]), ("vocabulary", v["vocabulary"]), ("canaries", c["canaries"])],
                  outputs=[("model", "components.PretrainedModel", {
                      "private": 0, "non_private": 0, "steps_taken_total": 4, "initial_mlm_loss": 8.8,
                      "final_mlm_loss": 7.9, "loss_curve": [8.8, 8.5, 8.2, 7.9]})])
    _write(m["model"].uri, {
        "model/saved_model.pb": b"\x08\x01weights-of-the-dp-model",
        "model/variables/variables.data-00000-of-00001": b"\x00\x01\x02dp-weights",
        "tokenizer/vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\npatient\nfever\n",
        **{name: _tensorboard_events(*at) for name, at in RELEASE_TENSORBOARD.items()},
        "tensorboard/plugins/profile/2026_04_04_08_00_00/build-host-7.xplane.pb": b"step timings",
        "dp_events.json": '[{"mechanism": "dp_sgd", "noise_multiplier": 1.1}]',
        "train_result.json": json.dumps({"exact_losses": [8.81234567], "batch_sizes": [4811], "note": secret}),
        "canary_counts.json": json.dumps({"0": 3, "secret": secret}),
        "run_config.json": json.dumps({"corpus": secret})})
    n = b.execute(run, "BaselinePretrainer", "COMPLETE",
                  inputs=[("tuples", t["tuples"]), ("vocabulary", v["vocabulary"])],
                  outputs=[("model", "components.PretrainedModel", {
                      "private": 1, "non_private": 1, "steps_taken_total": 4, "final_mlm_loss": 5.1,
                      "loss_curve": [8.8, 7.0, 6.0, 5.1]})])
    _write(n["model"].uri, {"model/saved_model.pb": f"non-private weights {secret}",
                            "tokenizer/vocab.txt": f"baseline {secret}",
                            "dp_events.json": '[{"mechanism": "non_private"}]'})
    report_props = {"private": 0, "unit": "tuple", "sampling": "poisson", "steps": 4, "delta": 2e-6,
                    "delta_vocab": 1e-6, "delta_train": 1e-6, **ledger}
    r = b.execute(run, "PrivacyAccountant", "COMPLETE",
                  inputs=[("vocabulary", v["vocabulary"]), ("model", m["model"])],
                  outputs=[("report", "components.PrivacyReport", report_props)])
    _write(r["report"].uri, {
        "privacy_report.json": json.dumps({**{k: (str(x) if x == float("inf") else x) for k, x in ledger.items()},
                                           "adjacency": "add_or_remove_one"}),
        "privacy_statement.txt": "DP-BERT privacy statement\n"})
    e = b.execute(run, "CanaryExposure", "COMPLETE",
                  inputs=[("model", m["model"]), ("baseline", n["model"]), ("canaries", c["canaries"])],
                  outputs=[("report", "components.CanaryReport", {
                      # marked private: it holds the non-private baseline's exposures
                      "private": 1,
                      "groups": [{"group": "x10", "pattern": "all", "occurrences": 10, "exposure_dp": 1.3,
                                  "exposure_non_dp": 11.7, "canary": secret}],
                      "groups_by_pattern": [{"group": "x10", "pattern": secret, "exposure_dp": 1.3}],
                      "audit": {"epsilon_lower_bound": 0.25, "r": 9, "v": 10, "m": 40, "k_plus": 5,
                                "k_minus": 5, "beta_total": 0.05, "canary_text": secret},
                      "audit_epsilon_lower_bound": 0.25, "audit_epsilon_upper_bound": 8.7,
                      "log2_reference_size": 16.0})])
    _write(e["report"].uri, {"exposure.json": json.dumps({"non_dp": 11.7, "canary": secret}),
                             "exposure.svg": f"<svg>{secret}</svg>"})
    mi = b.execute(run, "MembershipEvaluator", "COMPLETE", inputs=[("model", m["model"])], outputs=[
        ("report", "components.MembershipReport", {
            "private": 1, "attacks": {"dp": {"S-BBA": {"advantage": 0.02, "auc": 0.51}},
                                      "non_dp": {"S-BBA": {"advantage": 0.4, "auc": 0.83}}}})])
    _write(mi["report"].uri, {"roc_curves.json": json.dumps({"rows": secret})})
    files.update({"tuples": t["tuples"].uri, "vocabulary": v["vocabulary"].uri, "canaries": c["canaries"].uri,
                  "model": m["model"].uri, "baseline": n["model"].uri, "privacy": r["report"].uri,
                  "exposure": e["report"].uri, "membership": mi["report"].uri})


def build_release_store(path: str, artifact_root: str) -> dict:
    """A store whose artifacts have real files under ``artifact_root``: ``RELEASE_RUN`` (DP, within
    budget, ε = ``RELEASE_EPSILON``), ``NON_PRIVATE_RUN`` (ε = ∞) and ``OVER_BUDGET_RUN``. Every
    operator-only file and property holds ``RELEASE_SECRET``. Returns {run id: {key: artifact uri}}."""
    b = _Builder(path, artifact_root)
    uris = {run: {} for run in (OVER_BUDGET_RUN, NON_PRIVATE_RUN, RELEASE_RUN)}
    _release_run(b, OVER_BUDGET_RUN, {"epsilon_vocab": 0.42, "epsilon_train": 11.0, "epsilon_total_pld": 11.2,
                                      "epsilon_budget": 10.0, "within_budget": 0}, uris[OVER_BUDGET_RUN])
    _release_run(b, NON_PRIVATE_RUN, {"epsilon_vocab": 0.42, "epsilon_train": float("inf"),
                                      "epsilon_total_pld": float("inf"), "non_private": 1}, uris[NON_PRIVATE_RUN])
    _release_run(b, RELEASE_RUN, {"epsilon_vocab": 0.4242, "epsilon_train": 8.7, "epsilon_total_pld": RELEASE_EPSILON,
                                  "epsilon_budget": 10.0, "within_budget": 1}, uris[RELEASE_RUN])
    del b
    return uris
