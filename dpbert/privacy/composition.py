"""δ of the composed privacy ledger (the PrivacyAccountant's and the trainer's budget check's)."""
from __future__ import annotations


def ledger_delta(vocab_record, training_delta: float) -> float:
    """δ of the composed ledger: δ_V of a DP histogram vocabulary (0 otherwise) + δ_T. Basic
    composition of δ across the two mechanisms (each (ε_i, δ_i)-DP gives δ_V + δ_T in total);
    the ε side is composed by the accountant (PLD)."""
    vocab_record = vocab_record or {}
    delta_vocab = vocab_record.get("delta", 0.0) if vocab_record.get("mechanism") == "dp_histogram" else 0.0
    return delta_vocab + training_delta
