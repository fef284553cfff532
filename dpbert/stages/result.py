"""What every stage returns to its adapter."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional


@dataclasses.dataclass
class StageResult:
    """``properties``: the output artifact's custom properties (the adapter adds
    ``code_version``). ``failure``: an error the stage found AFTER writing its evidence (a run
    over budget, an audit inconsistent with the accountant, a count mismatch); the adapter
    raises it once the properties are recorded, so the failed run keeps what it found."""

    properties: Dict[str, Any]
    failure: Optional[Exception] = None

    def raise_failure(self):
        if self.failure is not None:
            raise self.failure
