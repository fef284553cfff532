"""Where a local run writes: its pipeline root and its ML Metadata store.

``pipeline.output_dir`` (``dpbert run --output``) is a local folder: it holds the ML Metadata
sqlite, which cannot live on object storage. The pipeline root (every artifact and the trainer's
state) is ``<output_dir>/pipeline_root`` unless ``pipeline.pipeline_root`` (``dpbert run
--pipeline-root``) names another place, local or ``gs://`` (docs/running-on-vertex.md, "A local
run with its artifacts on Cloud Storage"). Every caller (the local runner, the budget guard) asks
:func:`output_paths`, so they agree on one root.

Kept apart from ``pipeline.pipeline`` (which imports TFX) so that the budget guard can find the
trainer's state directories before TFX is loaded."""
from __future__ import annotations

import os
from typing import Tuple

from dpbert import storage
from dpbert.config import PipelineConfig


def root_key(root: str) -> str:
    """A pipeline root in the one form two roots are compared in: a local path made absolute, a
    URI without its trailing ``/`` (TFX's artifact URIs under it have none)."""
    root = str(root)
    return root.rstrip("/") if storage.is_remote(root) else os.path.abspath(root)


def output_paths(pipeline: PipelineConfig) -> Tuple[str, str]:
    """(pipeline root, metadata sqlite path) of a local run of the ``pipeline`` section: the
    sqlite always under the local ``output_dir``; the root ``pipeline_root``, else
    ``<output_dir>/pipeline_root``."""
    output_dir = os.path.abspath(pipeline.output_dir)
    root = (pipeline.pipeline_root or "").strip() or os.path.join(output_dir, "pipeline_root")
    return root_key(root), os.path.join(output_dir, "metadata.sqlite")
