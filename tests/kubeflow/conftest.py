"""Shared fixtures: compile the DAG for Vertex AI once per configuration and session."""
import copy
import json

import pytest

IMAGE = "europe-west4-docker.pkg.dev/my-project/dpbert/dpbert:golden"
PIPELINE_ROOT = "gs://my-bucket/dpbert/root"
#: The dataset ledger a compiled pipeline with a budget must name (a step's own disk does not last).
LEDGER = "privacy.ledger=gs://my-bucket/dpbert/ledgers"
DATAFLOW = [
    "beam.runner=DataflowRunner",
    "beam.extra_args=--project=my-project,--region=europe-west4,--temp_location=gs://my-bucket/dataflow/tmp",
]


@pytest.fixture(scope="session")
def compile_spec(tmp_path_factory):
    """compile_spec(overrides=(), resources=None) -> the compiled PipelineJob as a dict."""
    from dpbert.config import load_config
    from kubeflow.runner import compile_vertex

    cache = {}

    def _compile(overrides=(), resources=None):
        key = (tuple(overrides), repr(resources))
        if key not in cache:
            config = load_config(None, [LEDGER, *overrides])
            out = tmp_path_factory.mktemp("compile") / "pipeline.json"
            compile_vertex(config, str(out), IMAGE, PIPELINE_ROOT, resources=resources)
            cache[key] = json.loads(out.read_text(encoding="utf-8"))
        return copy.deepcopy(cache[key])

    return _compile


def task_names(spec):
    return set(spec["pipelineSpec"]["root"]["dag"]["tasks"])
