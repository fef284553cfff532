"""``pipeline.pipeline_root`` / ``dpbert run --pipeline-root``: the artifacts in a bucket, the ML
Metadata sqlite in the local ``--output``. In-process and without a DAG: the flag sets the key,
``output_paths`` gives every caller the same root, a ``gs://`` ``--output`` is refused (exit 2)
before anything is written, and the budget guard looks for training chains under the given root
(a ``fake://`` root: generations, no local files). The whole DAG on a gs:// root is
tests/e2e/test_dag_gcs.py (slow tier)."""
import os
import sys
import types
import uuid

import pytest

from dpbert import exit_codes, schema, storage
from dpbert.config import ConfigError, PipelineConfig, load_config
from dpbert.storage import api, fake
from pipeline import guard
from pipeline.paths import output_paths, root_key
from tests.no_cloud_storage import NoCloudStorage


def _pipeline(tmp_path, root=None) -> PipelineConfig:
    section = PipelineConfig(output_dir=str(tmp_path / "out"), pipeline_root=root)
    section.validate("pipeline")
    return section


def test_the_flag_sets_the_key(tmp_path):
    from dpbert_cli import commands
    from dpbert_cli.main import build_parser

    args = build_parser().parse_args(["run", "--output", str(tmp_path), "--pipeline-root", "gs://bucket/root"])
    assert commands.load(args).pipeline.pipeline_root == "gs://bucket/root"
    args = build_parser().parse_args(["run", "--output", str(tmp_path)])
    assert commands.load(args).pipeline.pipeline_root is None  # the default: <output>/pipeline_root
    assert not os.listdir(tmp_path)


def test_output_paths_gives_the_bucket_root_and_the_local_store(tmp_path):
    root, sqlite = output_paths(_pipeline(tmp_path, "gs://bucket/root/"))
    assert (root, sqlite) == ("gs://bucket/root", str(tmp_path / "out" / "metadata.sqlite"))
    assert output_paths(_pipeline(tmp_path)) == (str(tmp_path / "out" / "pipeline_root"), sqlite)
    assert output_paths(_pipeline(tmp_path, str(tmp_path / "elsewhere")))[0] == str(tmp_path / "elsewhere")


def test_relative_folders_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    section = PipelineConfig(output_dir="out", pipeline_root="roots/a")
    assert output_paths(section) == (str(tmp_path / "roots" / "a"), str(tmp_path / "out" / "metadata.sqlite"))
    assert root_key("gs://b/r/") == root_key("gs://b/r") == "gs://b/r"
    assert root_key("roots/a/") == str(tmp_path / "roots" / "a")


@pytest.mark.parametrize("root", ["s3://bucket/root", "gs://", "gs:///", "gs:/bucket/root", "gs:bucket"])
def test_a_pipeline_root_the_run_cannot_use_is_refused_naming_the_key(root):
    refused = r"pipeline\.pipeline_root must be a local folder or gs://BUCKET/ROOT .*, got '"
    with pytest.raises(ConfigError, match=r"^--set pipeline\.pipeline_root=.*: " + refused):
        load_config(None, [f"pipeline.pipeline_root={root}"], preset="demo")
    with pytest.raises(ConfigError, match="^" + refused):
        PipelineConfig(pipeline_root=root).validate("pipeline")
    with pytest.raises(ConfigError, match="^" + refused):
        PipelineConfig(pipeline_root=" ").validate("pipeline")  # the override parser reads "" as null


@pytest.mark.parametrize("root", ["gs://bucket", "gs://bucket/a/b", "ram://x/root", "fake://b/r", "/tmp/x", "rel"])
def test_a_pipeline_root_the_storage_layer_serves_is_accepted(root):
    assert load_config(None, [f"pipeline.pipeline_root={root}"], preset="demo").pipeline.pipeline_root == root


def test_a_gs_output_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """Exit 2 naming --pipeline-root; no local folder (not even ``gs:``) and no gs:// call."""
    from dpbert_cli.main import main

    spy = NoCloudStorage()
    monkeypatch.setitem(api._SINGLETONS, "gs", spy)  # pylint: disable=protected-access
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--output", "gs://bucket/out"]) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert "pipeline.output_dir (dpbert run --output) must be a local folder" in err
    assert "--pipeline-root gs://BUCKET/ROOT" in err and "'gs://bucket/out'" in err
    assert main(["run", "--output", "gs:/bucket/out"]) == exit_codes.BAD_INPUT  # a slash short: not a folder "gs:"
    assert "pipeline.output_dir must be a local folder, got 'gs:/bucket/out'" in capsys.readouterr().err
    assert not os.listdir(tmp_path) and spy.touched == []


def _chain(root: str, key: str, steps: int) -> str:
    state = storage.join(root, "_trainer_state", uuid.uuid4().hex[:20])
    storage.write_json(storage.join(state, schema.STEP_LOG_FILE), {"steps_executed": steps})
    storage.write_json(storage.join(state, schema.RESUME_KEY_FILE), {"key": key, "non_private": False})
    return state


def test_the_guard_looks_for_chains_under_the_given_root(tmp_path):
    """A chain of this configuration on the ``fake://`` root is found there; the same chain under
    the default local root is not what a run with the bucket root resumes (positive control)."""
    from dpbert.stages.pretrain import resume_key

    fake.reset()
    root = f"fake://bucket/{uuid.uuid4().hex}"
    config = load_config(None, [f"pipeline.output_dir={tmp_path / 'out'}", f"pipeline.pipeline_root={root}",
                                "training.dataset_size=1000"], preset="demo")
    key = resume_key(config.model, config.training, config.privacy, config.membership.holdout_patient_fraction,
                     False)
    assert guard.charged_chain(config) is None
    local_state = _chain(str(tmp_path / "out" / "pipeline_root"), key, 7)
    assert guard.charged_chain(config) is None  # the local default root is not looked in
    state = _chain(root + "/", key, 3)
    found = guard.charged_chain(config)
    assert found["state"] == state and found["steps_executed"] == 3
    config.pipeline.pipeline_root = None
    assert guard.charged_chain(config)["state"] == local_state


def test_the_guard_matches_the_cached_vocabulary_by_the_given_root(tmp_path):
    """A vocabulary entry of the bucket root (as ``dpbert.accounting.target`` records it: no
    trailing slash) is the run's cache; an entry of another root is not."""
    config = load_config(None, [f"pipeline.output_dir={tmp_path}", "pipeline.pipeline_root=gs://bucket/root/"],
                         preset="demo")
    target = types.SimpleNamespace(vocab_key="v1")
    entry = {"stage": "vocab", "config_key": "v1", "pipeline_root": "gs://bucket/root"}
    assert guard._vocab_cached(config, [entry], target)  # pylint: disable=protected-access
    for other in ("gs://bucket/other", str(tmp_path / "pipeline_root")):
        assert not guard._vocab_cached(config, [{**entry, "pipeline_root": other}], target)  # noqa: SLF001


def test_the_run_names_the_bucket_and_the_local_store(tmp_path, monkeypatch, capsys):
    """``dpbert run``'s closing lines, the DAG stubbed out: the artifacts where ``output_paths``
    put them, the store and the report command on the local --output."""
    from dpbert import metadata
    from dpbert_cli.main import main

    ran = []

    def run_local(config):
        ran.append(config)
        root, sqlite = output_paths(config.pipeline)
        return {"pipeline_root": root, "metadata": sqlite}

    class Stop(Exception):
        pass

    stub = types.SimpleNamespace(run_local=run_local, RunRefused=Stop, RunInterrupted=Stop)
    monkeypatch.setitem(sys.modules, "pipeline.local_runner", stub)  # no TFX import, no DAG
    monkeypatch.setattr(guard, "prechecks", lambda config: None)
    monkeypatch.setattr(guard, "check_budget", lambda config: None)

    def no_store(path):
        raise OSError(f"{path}: no store (stubbed)")

    monkeypatch.setattr(metadata, "open_store", no_store)
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--pipeline-root", "fake://bucket/root"]) == exit_codes.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["artifacts:         fake://bucket/root",
                         f"ML Metadata store: {out / 'metadata.sqlite'}",
                         f"inspect with:      dpbert report --output {out}"]
    assert ran[0].pipeline.pipeline_root == "fake://bucket/root"
