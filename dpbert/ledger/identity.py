"""Which dataset a run spends from, and where that dataset's ledger lives.

Identity: a user corpus is named by ``corpus.dataset_id``, declared by its data owner (required
with a budget, ``dpbert.config``). The embedded synthetic corpus is named by its generator's
PUBLIC parameters (``synthetic-<12 hex of sha256>``: an unkeyed hash is fine, nothing private is
in it). Never by a content fingerprint: twelve notes appended to the same patients are the same
dataset and keep the same budget. Ids are normalised wherever one enters
(``dpbert.config.normalise_dataset_id``: stripped, case-folded): ``Ward7`` and ``ward7`` are one
dataset, one ledger object, one budget.

Location: ``privacy.ledger`` (a folder, local or ``gs://``), else ``$DPBERT_LEDGER``, else the
per-user data folder ``$XDG_DATA_HOME/dpbert/ledgers`` (``~/.local/share/dpbert/ledgers``). The
ledger object of a dataset is ``<folder>/<dataset_id>.json``. Never inside an output folder:
deleting an output folder must not forget what its runs spent.

Synthetic stays synthetic: the embedded corpus (``corpus.path`` null) is public, so its runs must
never spend from, nor even read, a real dataset's ledger. Its id is ALWAYS its generator id (a
configured ``corpus.dataset_id`` is ignored) and its ledger ALWAYS lies in
:func:`synthetic_location`, a local folder apart from the real ledgers (a configured
``privacy.ledger``, or a compiled target's location, is ignored): no credentials needed, no real
budget read or charged. One line on stderr says so when a configured value is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Optional, Set, Tuple

from dpbert import storage
from dpbert.config import Config, ConfigError, CorpusConfig, normalise_dataset_id

LEDGER_ENV = "DPBERT_LEDGER"
#: The synthetic corpus's ledger folder (the rehearsal sets ``ROOT/.ledgers``); never gs://.
SYNTHETIC_LEDGER_ENV = "DPBERT_SYNTHETIC_LEDGER"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


#: The embedded (public) synthetic corpus's dataset ids start with this.
SYNTHETIC_PREFIX = "synthetic-"


def synthetic_dataset_id(corpus: CorpusConfig) -> str:
    """``synthetic-<hash>`` of the generator parameters (patients, admissions, notes, seed)."""
    s = corpus.synthetic
    params = {"patients": s.patients, "admissions_per_patient": s.admissions_per_patient,
              "notes_per_admission": s.notes_per_admission, "seed": s.seed}
    if s.shape != "fixed":  # another corpus, another ledger (fixed ids unchanged)
        params["shape"] = s.shape
    material = json.dumps(params, sort_keys=True)
    return SYNTHETIC_PREFIX + hashlib.sha256(material.encode("utf-8")).hexdigest()[:12]


def is_synthetic_id(dataset_id) -> bool:
    return normalise_dataset_id(dataset_id).startswith(SYNTHETIC_PREFIX)


_SAID: Set[Tuple[str, str]] = set()


def _say_ignored(setting: str, value, instead: str) -> None:
    """One line on stderr, once per process and value: a setting the synthetic corpus ignores."""
    if (setting, str(value)) not in _SAID:
        _SAID.add((setting, str(value)))
        print(f"dpbert: the corpus is the public synthetic one: {setting} {value} is ignored (no real "
              f"dataset's ledger is read or charged); {instead}", file=sys.stderr)


def dataset_id_for(corpus: CorpusConfig) -> Optional[str]:
    """The synthetic corpus's generator id (whatever ``corpus.dataset_id`` says); a user corpus's
    declared ``corpus.dataset_id``, normalised; else None (no declared id, no budget: no ledger).
    ConfigError for a user corpus declared ``synthetic-...``: its real budget would be kept in the
    synthetic corpus's local folder."""
    if corpus.path is None:
        synthetic = synthetic_dataset_id(corpus)
        if corpus.dataset_id:
            _say_ignored("corpus.dataset_id", corpus.dataset_id, f"its dataset id is {synthetic}")
        return synthetic
    if not corpus.dataset_id:
        return None
    declared = normalise_dataset_id(corpus.dataset_id)
    if declared.startswith(SYNTHETIC_PREFIX):
        raise ConfigError(f"corpus.dataset_id = {corpus.dataset_id!r}: the prefix {SYNTHETIC_PREFIX!r} is reserved "
                          f"for the embedded synthetic corpus; name the dataset of corpus.path {corpus.path} otherwise")
    return declared


def safe_name(dataset_id: str) -> str:
    """The object name of a dataset id, normalised: anything but letters, digits, ``.``, ``_``,
    ``-`` becomes ``_`` (``corpus.dataset_id`` is validated to that alphabet already)."""
    name = _UNSAFE.sub("_", normalise_dataset_id(dataset_id)).lstrip(".")
    if not name:
        raise ValueError(f"dataset_id must name a dataset, got {dataset_id!r}")
    return name


def _per_user_folder() -> str:
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data_home, "dpbert", "ledgers")


def default_location() -> str:
    """``$DPBERT_LEDGER``, else ``$XDG_DATA_HOME/dpbert/ledgers`` (``~/.local/share/...``)."""
    return os.environ.get(LEDGER_ENV) or _per_user_folder()


def _same_folder(a: Optional[str], b: Optional[str]) -> bool:
    if not a or not b:
        return False
    if storage.is_remote(a) or storage.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    local = [os.path.abspath(p[len("file://"):] if p.startswith("file://") else p) for p in (a, b)]
    return local[0] == local[1]


def synthetic_location() -> str:
    """The synthetic corpus's ledger folder: ``$DPBERT_SYNTHETIC_LEDGER``, else the sibling
    ``<folder>-synthetic`` of the default real folder when that is not on Cloud Storage
    (``$DPBERT_LEDGER-synthetic``, ``~/.local/share/dpbert/ledgers-synthetic``), else of the
    per-user folder. Never gs:// (a rehearsal runs offline) and never ``$DPBERT_LEDGER`` itself
    (ConfigError)."""
    base = default_location()
    base = _per_user_folder() if base.startswith("gs://") else base
    location = os.environ.get(SYNTHETIC_LEDGER_ENV) or base.rstrip("/") + "-synthetic"
    if location.startswith("gs://"):
        raise ConfigError(f"${SYNTHETIC_LEDGER_ENV} = {location}: the synthetic corpus's ledger is kept off "
                          f"Cloud Storage (a rehearsal runs offline); give a local folder")
    if _same_folder(location, os.environ.get(LEDGER_ENV)):
        raise ConfigError(f"${SYNTHETIC_LEDGER_ENV} = ${LEDGER_ENV} = {location}: the synthetic corpus's ledger "
                          f"must not share the real datasets' ledger folder")
    return location


def _real_location(config: Config) -> str:
    """``privacy.ledger`` or :func:`default_location`; ConfigError if inside ``pipeline.output_dir``."""
    location = config.privacy.ledger or default_location()
    if not storage.is_remote(location) and not storage.is_remote(config.pipeline.output_dir):
        folder = os.path.abspath(location[len("file://"):] if location.startswith("file://") else location)
        out = os.path.abspath(config.pipeline.output_dir)
        if folder == out or folder.startswith(out.rstrip(os.sep) + os.sep):
            raise ConfigError(f"privacy.ledger {location} is inside pipeline.output_dir {config.pipeline.output_dir}: "
                              f"a dataset's ledger outlives any output folder; put it elsewhere")
    return location


def location_for(config: Config) -> str:
    """The ledger folder of ``config``: :func:`synthetic_location` for the synthetic corpus (a
    configured ``privacy.ledger`` ignored, or ConfigError if it IS that folder); else
    ``privacy.ledger`` or :func:`default_location`, never inside ``pipeline.output_dir``."""
    if config.corpus.path is not None:
        return _real_location(config)
    location = synthetic_location()
    if config.privacy.ledger:
        if _same_folder(location, config.privacy.ledger):
            raise ConfigError(f"privacy.ledger = {config.privacy.ledger} is the synthetic corpus's ledger folder "
                              f"(${SYNTHETIC_LEDGER_ENV}): keep the real datasets' ledgers apart")
        _say_ignored("privacy.ledger", config.privacy.ledger, f"its ledger folder is {location}")
    return location


def ledger_uri(location: Optional[str], dataset_id: str) -> str:
    """``<location>/<normalised dataset id>.json``; for a synthetic id ``<synthetic_location()>/...``
    whatever ``location`` says (e.g. a ledger target compiled with a real ``privacy.ledger``)."""
    if is_synthetic_id(dataset_id):
        folder = synthetic_location()
        if location and not _same_folder(location, folder):
            _say_ignored("ledger folder", location, f"its ledger folder is {folder}")
        location = folder
    return storage.join(location or default_location(), safe_name(dataset_id) + ".json")


def remote_ledger_problem(config: Config) -> Optional[str]:
    """For a compiled (Vertex AI) pipeline: with a budget the ledger of a real dataset must be on
    Cloud Storage — a step's container has no lasting folder, and every run on the dataset must
    see one ledger (the synthetic corpus's is local: :func:`synthetic_location`). The message (a
    ConfigError's) or None."""
    if config.privacy.epsilon_budget is None or config.corpus.path is None:
        return None
    if not str(config.privacy.ledger or "").startswith("gs://"):
        return (f"privacy.ledger must be a Cloud Storage folder gs://BUCKET/PATH when privacy.epsilon_budget is "
                f"set for Vertex AI (the dataset's ledger outlives every run; a step's own disk does not), got "
                f"{config.privacy.ledger!r}")
    return None
