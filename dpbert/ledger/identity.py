"""Which dataset a run spends from, and where that dataset's ledger lives.

Identity: a user corpus is named by ``corpus.dataset_id``, declared by its data owner (required
with a budget, ``dpbert.config``). The embedded synthetic corpus is named by its generator's
PUBLIC parameters (``synthetic-<12 hex of sha256>``: an unkeyed hash is fine, nothing private is
in it). Never by a content fingerprint: twelve notes appended to the same patients are the same
dataset and keep the same budget.

Location: ``privacy.ledger`` (a folder, local or ``gs://``), else ``$DPBERT_LEDGER``, else the
per-user data folder ``$XDG_DATA_HOME/dpbert/ledgers`` (``~/.local/share/dpbert/ledgers``). The
ledger object of a dataset is ``<folder>/<dataset_id>.json``. Never inside an output folder:
deleting an output folder must not forget what its runs spent.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Optional

from dpbert import storage
from dpbert.config import Config, ConfigError, CorpusConfig

LEDGER_ENV = "DPBERT_LEDGER"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


#: The embedded (public) synthetic corpus's dataset ids start with this.
SYNTHETIC_PREFIX = "synthetic-"


def synthetic_dataset_id(corpus: CorpusConfig) -> str:
    """``synthetic-<hash>`` of the generator parameters (patients, admissions, notes, seed)."""
    s = corpus.synthetic
    material = json.dumps({"patients": s.patients, "admissions_per_patient": s.admissions_per_patient,
                           "notes_per_admission": s.notes_per_admission, "seed": s.seed}, sort_keys=True)
    return SYNTHETIC_PREFIX + hashlib.sha256(material.encode("utf-8")).hexdigest()[:12]


def dataset_id_for(corpus: CorpusConfig) -> Optional[str]:
    """The declared ``corpus.dataset_id``; the synthetic corpus's generator id; else None (a user
    corpus without a declared id and without a budget: no ledger)."""
    if corpus.dataset_id:
        return str(corpus.dataset_id)
    if corpus.path is None:
        return synthetic_dataset_id(corpus)
    return None


def safe_name(dataset_id: str) -> str:
    """The object name of a dataset id: anything but letters, digits, ``.``, ``_``, ``-`` becomes
    ``_`` (``corpus.dataset_id`` is validated to that alphabet already)."""
    name = _UNSAFE.sub("_", str(dataset_id)).lstrip(".")
    if not name:
        raise ValueError(f"dataset_id must name a dataset, got {dataset_id!r}")
    return name


def default_location() -> str:
    """``$DPBERT_LEDGER``, else ``$XDG_DATA_HOME/dpbert/ledgers`` (``~/.local/share/...``)."""
    env = os.environ.get(LEDGER_ENV)
    if env:
        return env
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data_home, "dpbert", "ledgers")


def location_for(config: Config) -> str:
    """The ledger folder of ``config``; ConfigError if it lies inside ``pipeline.output_dir``."""
    location = config.privacy.ledger or default_location()
    if not storage.is_remote(location) and not storage.is_remote(config.pipeline.output_dir):
        folder = os.path.abspath(location[len("file://"):] if location.startswith("file://") else location)
        out = os.path.abspath(config.pipeline.output_dir)
        if folder == out or folder.startswith(out.rstrip(os.sep) + os.sep):
            raise ConfigError(f"privacy.ledger {location} is inside pipeline.output_dir {config.pipeline.output_dir}: "
                              f"a dataset's ledger outlives any output folder; put it elsewhere")
    return location


def ledger_uri(location: str, dataset_id: str) -> str:
    """``<location>/<safe dataset id>.json``."""
    return storage.join(location, safe_name(dataset_id) + ".json")


def remote_ledger_problem(config: Config) -> Optional[str]:
    """For a compiled (Vertex AI) pipeline: with a budget the ledger must be on Cloud Storage —
    a step's container has no lasting folder, and every run on the dataset must see one ledger.
    The message (a ConfigError's) or None."""
    if config.privacy.epsilon_budget is None:
        return None
    if not str(config.privacy.ledger or "").startswith("gs://"):
        return (f"privacy.ledger must be a Cloud Storage folder gs://BUCKET/PATH when privacy.epsilon_budget is "
                f"set for Vertex AI (the dataset's ledger outlives every run; a step's own disk does not), got "
                f"{config.privacy.ledger!r}")
    return None
