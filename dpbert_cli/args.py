"""The arguments several ``dpbert`` commands share, defined once (``run``, ``budget``, ``audit``).

Without ``--config`` every command that reads a configuration uses the built-in demo preset
(``dpbert/configs/demo.yaml``, ``DEFAULT_PRESET``): ``dpbert run`` runs it, ``dpbert budget``
plans it and ``dpbert audit`` audits it (``dpbert compile``, whose parser is
``kubeflow.runner.add_compile_parser``, compiles it).
"""
from __future__ import annotations

import argparse

#: The configuration of every command run without --config (dpbert/configs/<name>.yaml).
DEFAULT_PRESET = "demo"


def config_args(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and the repeatable ``--set SECTION.FIELD=VALUE``."""
    p.add_argument("--config", help=f"YAML configuration file (default: the built-in {DEFAULT_PRESET} preset, "
                                    f"dpbert/configs/{DEFAULT_PRESET}.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one configuration value (repeatable), e.g. --set vocab.sigma=50")
