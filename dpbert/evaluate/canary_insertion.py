"""Canary insertion into the training rows — what every trainer does with a CanaryList directory
(written by the CanaryGen stage, ``dpbert.stages.canary.generate_canaries``), below the stages so
the trainer stage does not import another stage."""
from __future__ import annotations

from dpbert import storage

#: The CanaryList directory's files.
CANARIES_FILE = "canaries.json"
AUDIT_FILE = "audit_canaries.json"
SEED_FILE = "insertion_seed.json"


def load_canaries(canaries_dir: str):
    """(CanarySet, audit CanarySet or None, insertion seed) from a CanaryList directory."""
    from dpbert.evaluate.canary import CanarySet

    canary_set = CanarySet.from_dict(storage.read_json(storage.join(canaries_dir, CANARIES_FILE)))
    audit = storage.read_json(storage.join(canaries_dir, AUDIT_FILE), default=None)
    seed = storage.read_json(storage.join(canaries_dir, SEED_FILE))["insertion_seed"]
    return canary_set, None if audit is None else CanarySet.from_dict(audit), seed


def apply_canaries(token_ids, row_ids, canaries_dir: str, max_seq_length: int, rows_planned: int):
    """Insert the canaries into the training examples and append the included audit canaries as
    examples of their own (one privacy unit each).

    Insertion is decided row by row from (the secret insertion key, the row's own record id)
    (``dpbert.evaluate.canary.insert_canaries``): the same rows get the same canaries in every
    trainer, and adding or removing a row changes no other row's canaries. ``rows_planned``: the
    plan's public (or DP-counted) n, so a group of c occurrences is inserted with probability
    c / n per row. Returns (token ids, record ids, insertion counts per canary id) — the counts
    are operator-only (they are Binomial draws over the private rows).
    """
    import numpy as np

    from dpbert.data.tuples import record_id
    from dpbert.evaluate.canary import canary_examples, insert_canaries

    canary_set, audit, key = load_canaries(canaries_dir)
    token_ids, counts = insert_canaries(token_ids, canary_set, key, row_ids=row_ids, rows_planned=rows_planned)
    row_ids = np.asarray(row_ids, dtype=np.int64)
    if audit is not None:
        included = [c for c in audit.canaries if c.included]
        if included:
            extra, _ = canary_examples(included, max_seq_length)
            token_ids = np.concatenate([token_ids, extra.astype(token_ids.dtype)])
            row_ids = np.concatenate([row_ids, [record_id(f"audit-canary/{c.canary_id}") for c in included]])
    return token_ids, row_ids, {str(c.canary_id): int(k) for c, k in zip(canary_set.canaries, counts)}
