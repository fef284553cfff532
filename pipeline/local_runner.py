"""Run the DAG locally: LocalDagRunner, Beam DirectRunner (multi-processing, 2 workers)."""
from __future__ import annotations

import logging
import os

from tfx import v1 as tfx

from dpbert.config import Config
from pipeline.pipeline import create_pipeline, output_paths

log = logging.getLogger("dpbert")


def run_local(config: Config) -> dict:
    """Run the whole DAG; returns where the artifacts and the ML Metadata store are."""
    pipeline_root, metadata_path = output_paths(config.pipeline.output_dir)
    os.makedirs(pipeline_root, exist_ok=True)
    pipeline = create_pipeline(config, pipeline_root, metadata_path)
    tfx.orchestration.LocalDagRunner().run(pipeline)
    return {"pipeline_root": pipeline_root, "metadata": metadata_path}
