"""Which corpus a dataset id names: the ledger folder's index of KEYED corpus fingerprints.

A dataset id is the data owner's declaration; nothing else stops the same notes from being
declared under two ids — two budgets for the same patients. Before a local run's first
reservation (``dpbert run``, after the budget guard), the corpus's keyed fingerprint
(``dpbert.data.fingerprint``: HMAC-SHA256 under a key kept apart from the ledger objects, in
``<ledger folder>-keys/``, created once, 0600 on a local disk; on gs:// its access is the
operator's) is looked up in ``<ledger folder>/.index.json`` (no dataset id can name that object:
ids never start with a dot):

- unknown: recorded for this dataset id (compare-and-swap);
- known under this id: nothing to do;
- known under another id: refused (exit 2, naming both ids) unless ``--same-corpus-as OTHER``
  says the operator knows (then both ids are listed for it).

Not detected (docs/privacy.md): a changed or overlapping corpus — a note added, a subset, another
export of the same patients — since the fingerprint is of the exact content (of the files' paths,
sizes and times above ``CONTENT_HASH_MAX_BYTES``, and of the path alone on gs://). ``dpbert
compile`` reads no corpus, so a compiled run is not indexed. The synthetic corpus is public: not
indexed.
"""
from __future__ import annotations

from typing import Optional

from dpbert import storage
from dpbert.config import Config, ConfigError, normalise_dataset_id

INDEX_FILE = ".index.json"
SCHEMA = "dpbert.ledger-index/1"


def key_folder(location: str) -> str:
    """Where the fingerprint key lives: beside the ledger folder, never inside it."""
    return str(location).rstrip("/") + "-keys"


def _fingerprint(config: Config, location: str) -> str:
    from dpbert.data.fingerprint import corpus_fingerprint, load_or_create_salt

    return corpus_fingerprint(config.corpus, load_or_create_salt(key_folder(location)))


def check_and_record(config: Config, same_as: Optional[str] = None) -> Optional[str]:
    """Refuse a corpus already indexed under another dataset id (``ConfigError``), else record it;
    returns the index's URI, or None when there is nothing to index (the synthetic corpus, no id)."""
    from dpbert.ledger import identity

    dataset_id = identity.dataset_id_for(config.corpus)
    if config.corpus.path is None or not dataset_id:
        return None
    location = identity.location_for(config)
    fingerprint = _fingerprint(config, location)
    allowed = {dataset_id} | ({normalise_dataset_id(same_as)} if same_as else set())
    uri = storage.join(location, INDEX_FILE)

    def update(doc):
        if doc.get("schema") != SCHEMA or not isinstance(doc.get("corpora"), dict):
            raise ConfigError(f"{uri}: not a dpbert ledger index (schema {SCHEMA}); it is left as it is")
        known = doc["corpora"].setdefault(fingerprint, [])
        others = [d for d in known if d not in allowed]
        if others:
            raise ConfigError(f"corpus.dataset_id = {dataset_id}: this corpus is already spending from dataset "
                              f"{others[0]} (the same content, by its keyed fingerprint in {uri}); one corpus, one "
                              f"budget. If it really is another dataset of the same notes, say so with "
                              f"--same-corpus-as {others[0]}")
        for d in sorted(allowed - set(known)):
            known.append(d)
        return doc

    storage.update_json(uri, update, default={"schema": SCHEMA, "corpora": {}})
    return uri
