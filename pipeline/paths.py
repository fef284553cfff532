"""Where a local run writes: the pipeline root and the ML Metadata store under ``--output``.

Kept apart from ``pipeline.pipeline`` (which imports TFX) so that the budget guard can find the
trainer's state directories before TFX is loaded."""
from __future__ import annotations

import os


def output_paths(output_dir: str):
    """(pipeline_root, metadata sqlite path) under a local output directory."""
    output_dir = os.path.abspath(output_dir)
    return os.path.join(output_dir, "pipeline_root"), os.path.join(output_dir, "metadata.sqlite")
