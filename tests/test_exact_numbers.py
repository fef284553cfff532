"""ε, δ and q reach every reader exactly although ML Metadata 1.16 rounds doubles to 6 decimals.

A run with ``vocab.delta: 1e-9`` has δ_V = 1e-09 and δ = δ_V + δ_T = 1.0001e-05. Written through
the writers (``components.common.set_properties``, ``dpbert.metadata.put_properties``), the report
(JSON and text), ``dpbert report --released``, the dashboard's view data and the release manifest
show 1e-09 and 1.0001e-05. Positive control: a writer that stores the doubles only (a run written
before the change, or the broken fixture below) reads back δ_V = 0 and δ = 1e-05 — the readers
then mark both approximate ("≈") instead of presenting a Gaussian mechanism as pure DP.
"""
import json

import pytest

from dpbert import metadata, release, schema
from dpbert.privacy.numbers import fmt_delta
from dpbert.report import build_report, epsilon_summary, format_report
from tests.dashboard import fakestore

DELTA_VOCAB, DELTA_TRAIN = 1e-9, 1e-5
DELTA = DELTA_VOCAB + DELTA_TRAIN  # what the accountant composes (dpbert.stages.accountant.ledger_delta)
Q = 0.0192000001
LEDGER = {"epsilon_vocab": 0.4242, "epsilon_train": 8.7, "epsilon_total_pld": 9.0882123456,
          "delta": DELTA, "delta_vocab": DELTA_VOCAB, "delta_train": DELTA_TRAIN, "sampling_probability": Q,
          "epsilon_budget": 10.0}


def _store(tmp_path, write):
    """fakestore's release store with the DP run's PrivacyReport properties rewritten by ``write``
    (and its privacy_report.json holding what the accountant wrote)."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    path = str(tmp_path / "metadata.sqlite")
    uris = fakestore.build_release_store(path, str(tmp_path / "pipeline_root"))
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = path
    store = metadata_store.MetadataStore(config)
    (artifact,) = [a for a in store.get_artifacts() if a.uri == uris[fakestore.RELEASE_RUN]["privacy"]]
    for key in LEDGER:
        artifact.custom_properties.pop(key, None)
        artifact.custom_properties.pop(key + schema.EXACT_SUFFIX, None)
    write(artifact, LEDGER)
    store.put_artifacts([artifact])
    report_json = uris[fakestore.RELEASE_RUN]["privacy"] + "/privacy_report.json"
    with open(report_json) as f:
        recorded = json.load(f)
    recorded.update(LEDGER)
    with open(report_json, "w") as f:
        f.write(schema.dumps(recorded))
    return path


def _doubles_only(artifact, values):
    """The broken writer (fixture): every float as MLMD's double, no exact string."""
    for key, value in values.items():
        artifact.custom_properties[key].double_value = value


def _run(path):
    return metadata.get_run(metadata.open_store(path), fakestore.RELEASE_RUN)


def _views(path, tmp_path):
    """(report, text report, released text, epsilon summary, dashboard ledger + summary, manifest)."""
    from dashboard import views

    run = _run(path)
    report = build_report(run)
    bundle = tmp_path / "bundle"
    manifest = release.write_bundle(run, str(bundle))
    return {"report": report, "text": format_report(report),
            "released": format_report(release.released_view(report)),
            "released_json": json.dumps(release.released_view(report)),
            "summary": "\n".join(epsilon_summary(report)),
            "ledger": views.ledger(run), "privacy_summary": views.privacy_summary(run),
            "manifest": manifest, "manifest_text": (bundle / release.MANIFEST_FILE).read_text()}


def _row(text, key):
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(key + " ")]
    return line.split()[-1]


def test_mlmd_rounds_doubles_positive_control(tmp_path):
    """Why this exists: what ML Metadata 1.16 gives back of a double."""
    run = _run(_store(tmp_path, _doubles_only))
    ledger = next(a.properties for a in run.artifacts(schema.type_name(schema.PRIVACY_REPORT)) if not a.private)
    assert ledger[schema.DELTA_VOCAB] == 0.0 and ledger[schema.DELTA] == 1e-05
    assert ledger[schema.DELTA_VOCAB + schema.APPROX_SUFFIX] and ledger[schema.DELTA + schema.APPROX_SUFFIX]


def test_report_released_dashboard_and_manifest_show_exact_delta(tmp_path):
    """Fails on the previous main: delta_vocab 0 and delta 1e-05 everywhere."""
    v = _views(_store(tmp_path, lambda a, values: metadata.put_properties(a, values)), tmp_path)
    privacy = v["report"]["privacy"]
    assert privacy[schema.DELTA_VOCAB] == 1e-9 and privacy[schema.DELTA] == DELTA == pytest.approx(1.0001e-05, rel=1e-15)
    assert not any(k.endswith(schema.APPROX_SUFFIX) for k in privacy)
    for text in (v["text"], v["released"]):  # fmt_delta: 6 significant digits, rounded up
        assert _row(text, "delta_vocab") == "1e-09" and _row(text, "delta") == fmt_delta(DELTA)
        # Never below δ (1e-14: the float sum 1e-9 + 1e-5 = 1.0001000000000001e-05 is the decimal 1.0001e-05).
        assert _row(text, "delta").startswith("1.0001") and float(_row(text, "delta")) >= DELTA * (1 - 1e-14)
        assert "≈" not in text
    assert '"delta_vocab": 1e-09' in v["released_json"] and f'"delta": {DELTA!r}' in v["released_json"]
    assert f"δ = {fmt_delta(DELTA)}" in v["summary"]
    rows = {r["key"]: r["value"] for r in v["ledger"]["rows"]}
    assert rows[schema.DELTA_VOCAB] == "1e-09" and rows[schema.DELTA] == "1.0001e-05"
    assert v["privacy_summary"]["delta"] == "1.0001e-05" and v["privacy_summary"]["delta_value"] == DELTA
    m = v["manifest"]
    assert (m["delta_vocab"], m["delta"], m["epsilon"]) == (1e-9, DELTA, LEDGER["epsilon_total_pld"])
    assert "approximate" not in m
    assert '"delta_vocab": 1e-09' in v["manifest_text"] and f'"delta": {DELTA!r}' in v["manifest_text"]
    vocab_files = [f for f in m["files"] if f["covered_by"] == "epsilon_vocab"]
    assert vocab_files and all(f["delta"] == 1e-9 for f in vocab_files)


def test_a_run_written_before_is_marked_approximate_and_the_manifest_reads_the_accountants_file(tmp_path):
    v = _views(_store(tmp_path, _doubles_only), tmp_path)
    for text in (v["text"], v["released"]):
        assert _row(text, "delta_vocab") == "≈0" and _row(text, "delta") == "≈1e-05"
    assert "δ = ≈1e-05" in v["summary"]
    rows = {r["key"]: r["value"] for r in v["ledger"]["rows"]}
    assert rows[schema.DELTA_VOCAB] == "≈0" and rows[schema.DELTA] == "≈1e-05"
    assert v["privacy_summary"]["delta"] == "≈1e-05"
    m = v["manifest"]  # privacy_report.json is full-precision JSON: exact after all
    assert (m["delta_vocab"], m["delta"]) == (1e-9, DELTA) and "approximate" not in m


def test_manifest_says_approximate_when_no_exact_value_exists(tmp_path):
    path = _store(tmp_path, _doubles_only)
    run = _run(path)
    report = next(a for a in run.artifacts(schema.type_name(schema.PRIVACY_REPORT)) if not a.private)
    with open(report.uri + "/privacy_report.json", "w") as f:
        f.write(json.dumps({"adjacency": "add_or_remove_one"}))
    manifest = release.write_bundle(run, str(tmp_path / "bundle"))
    assert manifest["delta"] == 1e-05 and manifest["approximate"] == ["delta", "delta_vocab", "epsilon",
                                                                       "epsilon_train", "epsilon_vocab"]


def test_component_writer_and_reader_round_trip_through_mlmd(tmp_path):
    """components.common.set_properties (every component's writer) and get_property (a
    component reading its input's properties, e.g. the accountant the model's q)."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    from components.artifacts import PretrainedModel
    from components.common import get_property, set_properties

    model = PretrainedModel()
    set_properties(model, {"sampling_rate": Q, "noise_multiplier": 0.7830000001, "epsilon_train": 4.474912345678,
                           "delta_train": 1e-9, "final_mlm_loss": 6.123456789, "steps": 12})
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(tmp_path / "m.sqlite")
    store = metadata_store.MetadataStore(config)
    message = model.mlmd_artifact
    message.type_id = store.put_artifact_type(metadata_store_pb2.ArtifactType(name=model.type_name))
    message.uri = str(tmp_path)
    [aid] = store.put_artifacts([message])
    (back,) = store.get_artifacts_by_id([aid])
    doubles = {k: v.double_value for k, v in back.custom_properties.items() if v.WhichOneof("value") == "double_value"}
    # MLMD keeps 6 decimals of a double: an ε's or a δ's is rounded up, never below the exact value
    assert doubles["delta_train"] == 1e-06 and doubles["epsilon_train"] == 4.474913
    assert doubles["sampling_rate"] == pytest.approx(Q, abs=1e-6)  # q, σ: as MLMD rounds them
    props = schema.exact_properties(back)
    assert (props["sampling_rate"], props["noise_multiplier"], props["epsilon_train"], props["delta_train"]) == \
        (Q, 0.7830000001, 4.474912345678, 1e-9)
    assert props["steps"] == 12 and props["final_mlm_loss"] == pytest.approx(6.123457)  # not a privacy number
    assert not any(k.endswith((schema.EXACT_SUFFIX, schema.APPROX_SUFFIX)) for k in props)
    model.mlmd_artifact.CopyFrom(back)
    assert get_property(model, "sampling_rate") == Q and get_property(model, "delta_train") == 1e-9


def test_charged_epsilon_on_the_run_context_is_exact(tmp_path):
    path = _store(tmp_path, lambda a, values: metadata.put_properties(a, values))
    run_id = metadata.mark_charged(path, 0, {"epsilon_charged": 2.000000049, "delta": DELTA, "steps_charged": 7})
    run = metadata.get_run(metadata.open_store(path), run_id)
    assert run.properties[metadata.EPSILON_CHARGED] == 2.000000049 and run.properties[metadata.DELTA_CHARGED] == DELTA
    assert build_report(run)["charged"]["delta"] == DELTA


def _mlmd_doubles(tmp_path, write, values):
    """The doubles ML Metadata (a real sqlite store) gives back for ``values`` written by ``write``."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    from components.artifacts import PrivacyReport

    report = PrivacyReport()
    write(report, values)
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(tmp_path / "doubles.sqlite")
    store = metadata_store.MetadataStore(config)
    message = report.mlmd_artifact
    message.type_id = store.put_artifact_type(metadata_store_pb2.ArtifactType(name=report.type_name))
    message.uri = str(tmp_path)
    (back,) = store.get_artifacts_by_id(store.put_artifacts([message]))
    return {k: v.double_value for k, v in back.custom_properties.items() if v.WhichOneof("value") == "double_value"}


def _understated(values, doubles):
    """The ε and δ keys whose stored double is below the exact value."""
    return sorted(k for k in values if schema.rounds_up(k) and doubles[k] < values[k])


def test_the_stored_double_of_every_epsilon_and_delta_is_never_below_the_exact_value(tmp_path):
    from components.common import set_properties

    values = dict(LEDGER, delta_vocab=1e-9, audit_epsilon_lower_bound=0.1234561)
    doubles = _mlmd_doubles(tmp_path, set_properties, values)
    assert _understated(values, doubles) == []
    assert doubles["delta_vocab"] == 1e-06 and doubles["delta"] == 1.1e-05       # 1e-9 is not 0: not pure DP
    assert doubles["epsilon_total_pld"] == 9.088213 and doubles["epsilon_budget"] == 10.0


def test_understated_doubles_positive_control(tmp_path):
    """The doubles-only writer: MLMD rounds δ_V = 1e-9 to 0 and δ = 1.0001e-05 down to 1e-05."""
    values = dict(LEDGER, delta_vocab=1e-9)
    doubles = _mlmd_doubles(tmp_path, _broken_writer, values)
    assert {"delta", "delta_vocab", "epsilon_total_pld"} <= set(_understated(values, doubles))


def _broken_writer(artifact, values):
    for key, value in values.items():
        artifact.set_float_custom_property(key, value)


def test_report_prints_a_delta_of_1_0001e_05_as_it_is(tmp_path):
    """δ = 1.0001e-05 exactly (not a sum): the report's text and summary show 1.0001e-05, and a
    charged run's sentence too; never 1e-05."""
    from dpbert.report import charged_sentence

    report = {"run_id": "r", "pipeline": "p", "status": "COMPLETE", "duration_s": 1,
              "privacy": dict(LEDGER, delta=1.0001e-05)}
    text = format_report(report) + "\n".join(epsilon_summary(report))
    assert _row(text, "delta") == "1.0001e-05" and "δ = 1.0001e-05" in text
    assert "(δ = 1.0001e-05)" in charged_sentence({"epsilon_charged": 2.0, "delta": 1.0001e-05, "steps_charged": 3})
