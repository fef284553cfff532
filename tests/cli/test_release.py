"""The release boundary (issue 14): `dpbert release` writes only the files of dpbert.release.RELEASED
with a manifest naming the ε/δ/unit covering each; `dpbert report --released` prints only the
released view. The store is the synthetic one of tests/dashboard/fakestore.py with real files
(artifacts on ram:// / fake:// and a remote --to: test_release_storage.py)."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpbert import metadata, release, schema
from dpbert.report import build_report
from dpbert_cli.main import main
from tests.dashboard import fakestore

REPO = Path(__file__).resolve().parents[2]
SECRET = fakestore.RELEASE_SECRET.encode()
OPERATOR_FILES = (schema.TRAIN_RESULT_FILE, schema.CANARY_COUNTS_FILE, schema.RUN_CONFIG_FILE, "exposure.json")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("release_store")
    uris = fakestore.build_release_store(str(base / "metadata.sqlite"), str(base / "pipeline_root"))
    return {"path": str(base / "metadata.sqlite"), "uris": uris}


@pytest.fixture(scope="module")
def bundle(store, tmp_path_factory):
    """`dpbert release --json` of the DP run (in-process): (exit code, manifest printed, bundle dir)."""
    out = tmp_path_factory.mktemp("bundles") / "bundle"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["release", "--metadata", store["path"], "--to", str(out), "--json"])
    return code, json.loads(buf.getvalue()), out


def _run(store, run_id):
    return metadata.get_run(metadata.open_store(store["path"]), run_id)


def _files(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in Path(directory).rglob("*") if p.is_file()}


def _cli(*args, cwd=REPO):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    return subprocess.run([sys.executable, "-m", "dpbert_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_manifest_epsilon_is_the_accountants_and_lists_every_file(store, bundle):
    code, manifest, out = bundle
    assert code == 0
    ledger = [a for a in _run(store, fakestore.RELEASE_RUN).artifacts(schema.type_name(schema.PRIVACY_REPORT))][0]
    assert manifest["epsilon"] == ledger.properties[schema.EPSILON_TOTAL_PLD] == fakestore.RELEASE_EPSILON
    assert manifest["run_id"] == fakestore.RELEASE_RUN and manifest["unit"] == "tuple"
    assert manifest["adjacency"] == "add_or_remove_one"  # from privacy_report.json
    # the privacy fields a released model states (the export's model card has the same)
    assert set(release.PRIVACY_FIELDS) <= set(manifest) and manifest["mechanisms"] == ["dp_histogram", "dp_sgd"]
    assert json.loads((out / release.MANIFEST_FILE).read_text()) == manifest
    files = _files(out)
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(files) == set(listed) | {release.MANIFEST_FILE}
    for path, entry in listed.items():
        assert entry["sha256"] == hashlib.sha256(files[path]).hexdigest() and entry["bytes"] == len(files[path])
        assert entry["unit"] == "tuple" and entry["adjacency"] == "add_or_remove_one"
        if path.startswith("vocabulary/"):
            assert (entry["covered_by"], entry["epsilon"], entry["delta"]) == ("epsilon_vocab", 0.4242, 1e-6)
        else:
            assert (entry["covered_by"], entry["epsilon"], entry["delta"]) == \
                ("epsilon_total", fakestore.RELEASE_EPSILON, 2e-6)
    assert {"vocabulary/vocab.txt", "vocabulary/histogram.jsonl", "model/model/saved_model.pb",
            "model/tokenizer/vocab.txt", "model/tensorboard/" + release.TENSORBOARD_EVENTS_FILE, "model/dp_events.json",
            "privacy/privacy_report.json", "privacy/privacy_statement.txt", release.AUDIT_FILE} <= set(listed)


def _timing_leaks(directory):
    """What a released TensorBoard directory may not carry: (event files with a digit run of a time,
    the host or a pid in their NAME, events with a wall_time != 0, run-metadata events)."""
    import re

    names, timed, metadata_events = [], 0, 0
    for path in sorted(Path(directory).rglob("*")):
        if not path.is_file():
            continue
        if re.search(r"\d{3,}|host", path.name) or not release._is_event_file(path.name):
            names.append(path.name)
        if release._is_event_file(path.name):
            events = release.read_event_file(str(path))
            timed += sum(e.wall_time != 0 for e in events)
            metadata_events += sum(e.HasField("tagged_run_metadata") for e in events)
    return names, timed, metadata_events


def test_released_tensorboard_has_no_wall_clock_time_and_a_neutral_name(store, bundle):
    """Issue 22 item 7 (fails on the previous main, which copied the files as they were)."""
    _, manifest, out = bundle
    model = Path(store["uris"][fakestore.RELEASE_RUN]["model"])
    # positive control: the trainer's own files carry all three, and the check sees them
    names, timed, metadata_events = _timing_leaks(model / schema.TENSORBOARD_DIR)
    assert len(names) == 3 and timed == 8 and metadata_events == 2
    # the bundle: one neutral file, every event at wall_time 0, no run metadata, no profiler trace
    assert _timing_leaks(out / "model" / schema.TENSORBOARD_DIR) == ([], 0, 0)
    released = sorted(p.relative_to(out).as_posix() for p in (out / "model" / schema.TENSORBOARD_DIR).rglob("*")
                      if p.is_file())
    assert released == ["model/tensorboard/" + release.TENSORBOARD_EVENTS_FILE]
    assert released[0] in {f["path"] for f in manifest["files"]}
    # the same diagnostics, in step order, both segments: nothing but the time is gone
    events = release.read_event_file(str(out / released[0]))
    assert events[0].file_version == "brain.Event:2" and sum(e.HasField("file_version") for e in events) == 1
    scalars = [(e.step, v.tag, round(v.simple_value, 4)) for e in events for v in e.summary.value]
    assert scalars == [(s, tag, round(value, 4)) for s in range(4)
                       for tag, value in (("mlm_loss", 8.8 - 0.3 * s), ("batch_size", 16.0 + s))]


def test_an_unreadable_tensorboard_file_is_refused(store, tmp_path):
    uris = fakestore.build_release_store(str(tmp_path / "m.sqlite"), str(tmp_path / "root"))
    board = Path(uris[fakestore.RELEASE_RUN]["model"]) / schema.TENSORBOARD_DIR
    name = next(iter(fakestore.RELEASE_TENSORBOARD)).split("/")[-1]
    (board / name).write_bytes((board / name).read_bytes()[:-3])  # a truncated record
    run = metadata.get_run(metadata.open_store(str(tmp_path / "m.sqlite")), fakestore.RELEASE_RUN)
    with pytest.raises(release.ReleaseError, match="not a readable TensorBoard event file.*truncated.*without wall-clock time"):
        release.write_bundle(run, str(tmp_path / "bundle"))
    assert not (tmp_path / "bundle").exists()


def test_no_operator_only_file_or_secret_in_the_bundle(store, bundle):
    _, _, out = bundle
    files = _files(out)
    for name in files:
        assert os.path.basename(name) not in OPERATOR_FILES, name
    for name, content in files.items():
        assert SECRET not in content, name
    # nothing copied from a private artifact (tuples, canaries, the baseline, the reports on private data)
    uris = store["uris"][fakestore.RELEASE_RUN]
    private = {hashlib.sha256(p.read_bytes()).hexdigest()
               for key in ("tuples", "canaries", "baseline", "exposure", "membership")
               for p in Path(uris[key]).rglob("*") if p.is_file()}
    assert not private & {hashlib.sha256(c).hexdigest() for c in files.values()}
    # the audit: the DP model's audit fields only, read although the CanaryReport is marked private
    audit = json.loads(files[release.AUDIT_FILE])
    assert set(audit) == set(release.AUDIT_FIELDS)
    assert audit["audit_epsilon_lower_bound"] == 0.25 and audit["audit_epsilon_upper_bound"] == 8.7
    assert set(audit["audit"]) == set(release.AUDIT_RESULT_KEYS)  # "canary_text" dropped


def test_released_list_leaves_operator_artifacts_and_files_out():
    released_types = {part.artifact_type for part in release.RELEASED}
    assert released_types == {schema.DP_VOCABULARY, schema.PRETRAINED_MODEL, schema.PRIVACY_REPORT, schema.AUDIT_REPORT}
    paths = {p for part in release.RELEASED for p in part.paths}
    assert not paths & set(OPERATOR_FILES)
    from dpbert.stages.canary import AUDIT_FIELDS

    assert release.AUDIT_RESULT_KEYS == AUDIT_FIELDS


def test_cli_summary_in_a_subprocess_and_refusals_in_process(store, tmp_path, capsys):
    """The real entry point (``python -m dpbert_cli``) prints the DP run's short summary; its
    refusals, in-process (an exception escaping ``main`` fails the test), are one line, exit 2."""
    proc = _cli("release", "--metadata", store["path"], "--run", fakestore.RELEASE_RUN, "--to", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    assert "ε = 9.088" in proc.stdout and "unit: tuple" in proc.stdout and "adjacency: add_or_remove_one" in proc.stdout
    assert f"files in {tmp_path / 'b'}" in proc.stdout
    # a non-private run: exit 2, one line naming the run, nothing written
    target = tmp_path / "np" / "bundle"
    capsys.readouterr()
    code = main(["release", "--metadata", store["path"], "--run", fakestore.NON_PRIVATE_RUN, "--to", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and fakestore.NON_PRIVATE_RUN in err and "ε = ∞" in err
    assert not (tmp_path / "np").exists()
    # an existing non-empty bundle directory: exit 2, untouched
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    code = main(["release", "--metadata", store["path"], "--to", str(existing)])
    err = capsys.readouterr().err
    assert code == 2 and str(existing) in err and "not empty" in err
    assert "Traceback" not in err and _files(existing) == {"keep.txt": b"mine"}
    assert sorted(os.listdir(tmp_path)) == ["b", "existing"]  # no temporary directory left


@pytest.mark.parametrize("case", ["over_budget", "no_store", "no_run", "file_target", "missing_files"])
def test_refusals_exit_2_and_write_nothing(store, tmp_path, capsys, case):
    target = tmp_path / "bundle"
    args = ["release", "--metadata", store["path"], "--to", str(target)]
    named = str(target)
    if case == "over_budget":
        args += ["--run", fakestore.OVER_BUDGET_RUN]
        named = fakestore.OVER_BUDGET_RUN
    elif case == "no_store":
        args[2] = named = str(tmp_path / "nothing.sqlite")
    elif case == "no_run":
        args += ["--run", "nope"]
        named = "nope"
    elif case == "file_target":
        target.write_text("a file")
    else:  # a real run's store whose artifact files are gone
        from tests.dashboard.conftest import TINY_RUN_STORE

        args[2] = TINY_RUN_STORE
        named = "does not exist"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpbert release: error: ") and named in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == (["bundle"] if case == "file_target" else [])


def test_a_failure_while_copying_leaves_nothing(store, tmp_path, monkeypatch):
    real, calls = release._put_local, []

    def failing(folder, relative, data):
        calls.append(relative)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(folder, relative, data)

    monkeypatch.setattr(release, "_put_local", failing)
    target = tmp_path / "new" / "deeper" / "bundle"
    with pytest.raises(release.ReleaseError, match="No space left"):
        release.write_bundle(_run(store, fakestore.RELEASE_RUN), str(target))
    assert os.listdir(tmp_path) == []  # parents it created removed too


def test_symbolic_links_in_a_released_directory_are_refused(store, tmp_path):
    uris = fakestore.build_release_store(str(tmp_path / "m.sqlite"), str(tmp_path / "root"))
    model = Path(uris[fakestore.RELEASE_RUN]["model"])
    os.symlink(Path(uris[fakestore.RELEASE_RUN]["canaries"]) / "canaries.json", model / "model" / "extra.json")
    run = metadata.get_run(metadata.open_store(str(tmp_path / "m.sqlite")), fakestore.RELEASE_RUN)
    with pytest.raises(release.ReleaseError, match="symbolic link"):
        release.write_bundle(run, str(tmp_path / "bundle"))
    assert not (tmp_path / "bundle").exists()


def test_report_released_prints_only_the_released_view(store, capsys):
    full = build_report(_run(store, fakestore.RELEASE_RUN))
    assert "membership_inference" in full and full["canary"]["groups"]  # the operator's report has them
    assert main(["report", "--metadata", store["path"], "--released", "--json"]) == 0
    out = capsys.readouterr().out
    view = json.loads(out)
    assert view == json.loads(schema.dumps(release.released_view(full)))
    assert view["releasable"] is True and view["privacy"]["epsilon_total_pld"] == fakestore.RELEASE_EPSILON
    assert set(view) == {"run_id", "pipeline", "status", "view", "releasable", "operator_only_omitted",
                         "privacy", "vocab", "pretraining", "ner", "canary"}
    assert view["vocab"]["size"] == 5 and view["vocab"]["epsilon"] == 0.42
    assert view["pretraining"]["loss_curve"] and "non_dp_final_mlm_loss" not in view["pretraining"]
    assert view["canary"] == {"audit_epsilon_lower_bound": 0.25, "audit_max_reachable_lower_bound": None} and "table" not in view["ner"]
    assert fakestore.RELEASE_SECRET not in out and "11.7" not in out and "0.83" not in out
    assert main(["report", "--metadata", store["path"], "--released"]) == 0
    table = capsys.readouterr().out
    assert "released view" in table and "audit ε lower bound: 0.25" in table and "9.088" in table
    for operator_only in ("components:", "membership inference:", "canary exposure:", "non_dp", "5.1"):
        assert operator_only not in table, operator_only


def test_released_view_of_the_richest_report_and_of_a_non_private_run(store, tmp_path):
    path = fakestore.build_store(str(tmp_path / "rich.sqlite"), str(tmp_path / "root"))
    rich = build_report(metadata.get_run(metadata.open_store(path), fakestore.RICH_RUN))
    view = release.released_view(rich)
    text = schema.dumps({k: v for k, v in view.items() if k != "operator_only_omitted"})
    for operator_only in ("membership", "non_dp", "exposure", "components", "duration_s", "table", "groups",
                          "4.8", "13.2", "loss threshold"):
        assert operator_only not in text, operator_only
    assert view["privacy"] == rich["privacy"] and view["ner"]["f1"] == 0.712
    assert view["pretraining"]["loss_curve"] == fakestore.LOSS_CURVE
    non_private = release.released_view(build_report(_run(store, fakestore.NON_PRIVATE_RUN)))
    assert non_private["releasable"] is False and set(non_private) == {
        "run_id", "pipeline", "status", "view", "releasable", "operator_only_omitted", "privacy"}


def test_the_model_artifacts_vocabulary_record_is_released_under_the_trainers_name(store, tmp_path):
    from dpbert.stages.pretrain import VOCAB_DP_EVENT_FILE

    assert release.VOCAB_DP_EVENT_FILE == VOCAB_DP_EVENT_FILE
    run = _run(store, fakestore.RELEASE_RUN)
    model = [a for a in run.artifacts(schema.type_name(schema.PRETRAINED_MODEL)) if not a.private][0]
    Path(model.uri, VOCAB_DP_EVENT_FILE).write_text('{"vocab_event": {"mechanism": "dp_histogram"}}')
    try:
        manifest = release.write_bundle(run, str(tmp_path / "bundle"))
    finally:
        Path(model.uri, VOCAB_DP_EVENT_FILE).unlink()
    assert f"model/{VOCAB_DP_EVENT_FILE}" in {f["path"] for f in manifest["files"]}
