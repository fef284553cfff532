"""A tiny end-to-end run of the whole DAG on LocalDagRunner + Beam DirectRunner: a subprocess
run, in the slow tier (``make test-slow``, run by CI); tests/e2e/test_dag_ram.py runs the same DAG in
one process."""
import sqlite3

import pytest

from tests.e2e.tiny_dag import REPO, TINY_DAG as TINY, run_cli  # noqa: F401  (TINY: the run's overrides)

# One DAG run (the session fixture ``tiny_dag_run``, tests/conftest.py) shared with the dashboard's
# browser test; the group keeps every test using it on one xdist worker.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("tiny_dag")]


@pytest.fixture(scope="session")
def tiny_run(tiny_dag_run):
    out, result = tiny_dag_run
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result


def test_dag_records_every_component_in_mlmd(tiny_run):
    out, result = tiny_run
    assert "ML Metadata store" in result.stdout
    db = sqlite3.connect(out / "metadata.sqlite")
    types = {name for (name,) in db.execute(
        "SELECT t.name FROM Artifact a JOIN Type t ON a.type_id = t.id")}
    assert {"components.WordTuples", "components.DPVocabulary", "components.PretrainedModel",
            "components.PrivacyReport", "components.CanaryList", "components.CanaryReport",
            "components.NerReport", "components.AuditReport"} <= types
    states = [s for (s,) in db.execute("SELECT last_known_state FROM Execution")]
    assert states and all(s in (3, 5) for s in states)  # COMPLETE or CACHED


def test_report_ledger_is_recomputed_from_recorded_events(tiny_run):
    """The report's ε equals what the accountant core gives for the recorded DP events."""
    import json

    from dpbert.accounting import accountant
    from dpbert.privacy import events

    out, _ = tiny_run
    result = run_cli(["report", "--output", str(out), "--json"], REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    privacy = report["privacy"]
    assert report["pretraining"]["steps"] == 4
    assert report["ner"]["f1"] is not None and set(report["ner"]["per_type"]) == {"Chemical", "Disease"}
    groups = report["canary"]["groups"]
    assert groups and all(g["exposure_dp"] is not None and g["exposure_non_dp"] is not None for g in groups)
    assert 0 <= report["canary"]["audit_epsilon_lower_bound"] <= report["privacy"]["epsilon_train"]
    # black-box audit: its power and the non-private baseline audited with the same canaries
    from dpbert.privacy.whitebox_audit import max_reachable_lower_bound

    assert report["canary"]["audit_max_reachable_lower_bound"] == pytest.approx(
        max_reachable_lower_bound(40, 0.001, 1e-5), rel=1e-6)
    assert report["canary"]["baseline_audit_epsilon_lower_bound"] >= 0
    # the white-box audit of the configured DP-SGD, next to the ledger's ε_T
    audit = report["audit"]
    assert audit["canaries"] == 200 and audit["steps"] == 4 and audit["consistent"]
    assert 0 <= audit["epsilon_lower_bound"] <= audit["epsilon_upper_bound"] <= privacy["epsilon_train"] + 1e-6
    assert audit["epsilon_train_ledger"] == pytest.approx(privacy["epsilon_train"], rel=1e-6)
    assert audit["positive_control_lower_bound"] >= audit["epsilon_lower_bound"]
    released = json.loads(run_cli(["report", "--output", str(out), "--json", "--released"], REPO).stdout)
    assert released["audit"]["epsilon_lower_bound"] == audit["epsilon_lower_bound"]
    mia = report["membership_inference"]
    attacks = {"S-BBA", "A-BBA", "P-BBA", "S-AWBA", "S-GWBA"}
    assert set(mia["dp"]) == attacks and set(mia["non_dp"]) == attacks
    assert all(0 <= mia[m][a]["auc"] <= 1 and -1 <= mia[m][a]["advantage"] <= 1 for m in mia for a in attacks)
    assert report["vocab"]["size"] <= 300 and report["vocab"]["words_kept"] > 0
    vocab_event = json.loads(next((out / "pipeline_root" / "DPVocabularyGen" / "vocabulary").glob("*/dp_event.json")).read_text())
    train_events = json.loads(next((out / "pipeline_root" / "MLMPretrainer" / "model").glob("*/dp_events.json")).read_text())
    assert train_events[0]["steps"] == 4
    expected = accountant.ledger(events.from_json(json.dumps(vocab_event)), train_events,
                                 vocab_event["delta"] + 1e-5)
    for key in ("epsilon_vocab", "epsilon_train", "epsilon_total_basic", "epsilon_total_pld"):
        # ML Metadata's sqlite backend keeps about 7 significant digits of a double property.
        assert abs(privacy[key] - expected[key]) < 1e-6 * max(1.0, expected[key]), key
    assert privacy["epsilon_total_pld"] <= privacy["epsilon_total_basic"]
    assert privacy["unit"] == "tuple" and privacy["sampling"] == "poisson"


def test_no_exact_count_or_raw_text_in_the_vocabulary_artifact(tiny_run):
    """Released counts are noisy floats; the artifact holds no note text."""
    import json

    out, _ = tiny_run
    vocab_dir = next((out / "pipeline_root" / "DPVocabularyGen" / "vocabulary").glob("*"))
    counts = [json.loads(line)["count"] for line in (vocab_dir / "histogram.jsonl").read_text().splitlines()]
    assert counts and all(isinstance(c, float) and not float(c).is_integer() for c in counts)
    listing = " ".join(p.name for p in vocab_dir.iterdir())
    assert "tuples" not in listing


def _canary_needles(root):
    """The CanaryList folder, the vocabulary, and regexes for every canary of 3+ pieces: its
    token-id list, and its text as whole words.

    Canaries of two pieces are left out: two vocabulary words in a row occur in English by
    chance (CI, 2026-11-26: an "HS" canary read "as d", found in "charged as dp_event"); the
    set's 3- to 5-piece canaries and the audit's are what a dump or a log line would leak."""
    import json
    import re

    canary_dir = next((root / "CanaryGen" / "canaries").glob("*"))
    vocab = (next((root / "DPVocabularyGen" / "vocabulary").glob("*")) / "vocab.txt").read_text().split("\n")
    needles = []
    for name in ("canaries.json", "audit_canaries.json"):
        for canary in json.loads((canary_dir / name).read_text())["canaries"]:
            tokens = canary["tokens"]
            if len(tokens) >= 3:
                text = " ".join(vocab[t] for t in tokens)
                needles += [re.compile(re.escape(json.dumps(tokens))),
                            re.compile(r"(?<!\w)" + re.escape(text) + r"(?!\w)")]
    return canary_dir, vocab, needles


def test_no_canary_secret_outside_the_private_canary_list(tiny_run):
    """Canary token sequences appear in no log line and in no file outside the CanaryList."""
    out, result = tiny_run
    root = out / "pipeline_root"
    canary_dir, _, needles = _canary_needles(root)
    assert needles
    haystacks = {"stdout+stderr": result.stdout + result.stderr}
    for path in root.rglob("*"):
        if path.is_file() and canary_dir not in path.parents and "_trainer_state" not in path.parts \
                and path.suffix in (".json", ".jsonl", ".txt", ".svg", ".csv", ".log"):
            haystacks[str(path)] = path.read_text(errors="replace")
    import sqlite3

    db = sqlite3.connect(out / "metadata.sqlite")
    # one value per line: two values side by side ("… None", "ghost …") are no leak of "ne g"
    haystacks["mlmd"] = "\n".join(v for (v,) in db.execute(
        "SELECT string_value FROM ArtifactProperty") if v is not None)
    for where, text in haystacks.items():
        for needle in needles:
            assert not needle.search(text), f"a canary sequence leaked into {where}"


def test_the_canary_leak_check_finds_a_planted_canary(tiny_run):
    """Positive control: one canary's text in a log line, its id list in a JSON file."""
    import json

    canary_dir, vocab, needles = _canary_needles(tiny_run[0] / "pipeline_root")
    tokens = next(c["tokens"] for c in json.loads((canary_dir / "audit_canaries.json").read_text())["canaries"])
    line = "INFO step 3: scored '" + " ".join(vocab[t] for t in tokens) + "'."
    dump = json.dumps({"tokens": tokens})
    assert any(n.search(line) for n in needles) and any(n.search(dump) for n in needles)


def _integers(obj):
    if isinstance(obj, bool):
        return
    if isinstance(obj, int):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _integers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _integers(v)


def test_release_boundary_exact_counts_private_marks_and_the_bundle(tiny_run, tmp_path):
    """(7) no exact corpus count in a released file or a released artifact's MLMD property;
    (9) every operator-only artifact is marked private; the `dpbert release` bundle holds no
    canary secret, no exact count, no exact loss, and its manifest's ε is the accountant's."""
    import json
    from pathlib import Path

    from dpbert import metadata
    from dpbert.data.splits import patient_key, read_holdout_key, split_patients
    from dpbert.data.tfrecord import read_tuples

    out, _ = tiny_run
    run = metadata.get_run(metadata.open_store(str(out / "metadata.sqlite")))
    artifacts = [a for c in run.components for a in c.outputs]
    tuples = next(a for a in artifacts if a.type == "components.WordTuples")
    raw = list(read_tuples(tuples.uri))
    split = split_patients([patient_key(t) for t in raw], 0.7, read_holdout_key(tuples.uri))
    exact = {len(raw), sum(patient_key(t) in split.train for t in raw), len({patient_key(t) for t in raw}),
             tuples.properties["num_documents"]}
    # (9) operator-only artifacts are marked private.
    by_type = {}
    for a in artifacts:
        by_type.setdefault(a.type, []).append(a)
    for name in ("WordTuples", "CanaryList", "MembershipReport", "NerReport", "CanaryReport"):
        assert all(a.properties.get("private") == 1 for a in by_type[f"components.{name}"]), name
    assert [a.properties.get("private") for a in by_type["components.PretrainedModel"]
            if a.properties.get("non_private")] == [1]
    # (7) released artifacts' properties carry no exact count.
    for a in artifacts:
        # The AuditReport is computed from the embedded PUBLIC corpus and the DP vocabulary only
        # (PrivacyAuditor has no WordTuples input): its integers (canaries, guesses) are not counts.
        if not a.properties.get("private") and a.type != "components.AuditReport":
            leaked = exact & set(_integers(a.properties))
            assert not leaked, (a.type, leaked)
    # The release bundle.
    bundle = tmp_path / "bundle"
    result = run_cli(["release", "--output", str(out), "--to", str(bundle), "--json"], REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    report = next(a for a in artifacts if a.type == "components.PrivacyReport")
    assert abs(manifest["epsilon"] - report.properties["epsilon_total_pld"]) < 1e-6 * manifest["epsilon"]
    canary_dir = next(a for a in artifacts if a.type == "components.CanaryList").uri
    secrets = [json.dumps(c["tokens"]) for name in ("canaries.json", "audit_canaries.json")
               for c in json.loads((Path(canary_dir) / name).read_text())["canaries"]]
    state = out / "pipeline_root" / "_trainer_state"
    exact_losses = [json.loads(p.read_text())["losses"] for p in state.glob("*/train_result.json")]
    assert "audit/whitebox_audit.json" in {e["path"] for e in manifest["files"]}
    for entry in manifest["files"]:
        path = bundle / entry["path"]
        assert "train_result" not in entry["path"] and "canary_counts" not in entry["path"]
        if path.suffix in (".json", ".jsonl", ".txt"):
            text = path.read_text(errors="replace")
            assert not any(s in text for s in secrets), entry["path"]
            if path.suffix == ".json" and path.name not in ("tokenizer.json", "model_config.json",
                                                            "whitebox_audit.json"):
                # (token ids and model sizes are integers of their own; records and reports are checked)
                assert not exact & set(_integers(json.loads(text))), entry["path"]
            for losses in exact_losses:
                assert not any(f"{x:.5f}" in text for x in losses[:3]), entry["path"]  # no exact loss
    # (issue 22 item 7) the trainer's TensorBoard files are released rewritten: one neutral name, no wall time
    from dpbert.release import TENSORBOARD_EVENTS_FILE, read_event_file

    boards = sorted(p.relative_to(bundle).as_posix() for p in (bundle / "model" / "tensorboard").rglob("*") if p.is_file())
    assert boards == [f"model/tensorboard/{TENSORBOARD_EVENTS_FILE}"]
    events = read_event_file(str(bundle / boards[0]))
    assert len(events) > 1 and all(e.wall_time == 0 for e in events)
