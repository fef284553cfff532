"""What every ``dpbert`` command prints the same way: ``--json`` output and error lines."""
from __future__ import annotations

import sys

from dpbert import schema


def print_json(obj) -> None:
    """One strict-JSON object on stdout (``dpbert.schema.dumps``: non-finite floats as "inf"/"-inf"
    /"nan", numpy scalars as Python numbers), keys sorted, indented by 2."""
    print(schema.dumps(obj, indent=2, sort_keys=True))


def print_error(command: str, err) -> None:
    """``dpbert COMMAND: error: MESSAGE`` on stderr."""
    print(f"dpbert {command}: error: {err}", file=sys.stderr)
