"""Text-to-text privatization: identity at η = ∞, word lists, files."""
import math

import numpy as np
import pytest

from dpbert.local_privacy.text import (decode_tokens, privatize_file, privatize_text, privatize_texts,
                                       privatize_word_lists, tokens_to_words)

TEXT = "The Patient's BLOOD pressure was high, given Aspirin 10 mg daily."


def _normalized(tokenizer, text):
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("eta", [math.inf, 1e9])
def test_large_eta_returns_the_normalized_tokenization(toy_embeddings, eta):
    tokenizer = toy_embeddings.tokenizer
    out = privatize_text(TEXT, tokenizer, toy_embeddings, eta, rng=0)
    assert out == _normalized(tokenizer, TEXT) == "the patient ' s blood pressure was high, given aspirin 10 mg daily."
    # Same with a bare [V, d] table (special tokens found by name).
    assert privatize_text(TEXT, tokenizer, toy_embeddings.vectors, eta, rng=0) == out


def test_small_eta_changes_the_text_and_never_outputs_specials(toy_embeddings):
    tokenizer = toy_embeddings.tokenizer
    texts = privatize_texts([TEXT] * 20, tokenizer, toy_embeddings, 0.5, rng=1)
    original = tokenizer.encode(TEXT, add_special_tokens=False).tokens
    changed = 0
    for out in texts:
        assert "[" not in out  # no [PAD]/[UNK]/[unused0]/...
        changed += sum(a != b for a, b in zip(tokenizer.encode(out, add_special_tokens=False).tokens, original))
    assert changed > 0.5 * 20 * len(original)


def test_seed_reproduces_and_entropy_varies(toy_embeddings):
    tokenizer = toy_embeddings.tokenizer
    a = privatize_texts([TEXT] * 5, tokenizer, toy_embeddings, 2.0, rng=5)
    assert a == privatize_texts([TEXT] * 5, tokenizer, toy_embeddings, 2.0, rng=5)
    assert a != privatize_texts([TEXT] * 5, tokenizer, toy_embeddings, 2.0, rng=None)


def test_decode_and_words():
    assert tokens_to_words(["patient", "##s", "was", "given", "##ed", ",", "'"]) == ["patients", "was", "givened",
                                                                                  ",", "'"]
    assert tokens_to_words(["##s", "the"]) == ["s", "the"]
    assert tokens_to_words(["a.b"]) == ["a", ".", "b"]


def test_decode_tokens_strips_a_leading_piece(toy_embeddings):
    assert decode_tokens(["##s", "the", "patient", "##s"], toy_embeddings.tokenizer) == "s the patients"
    assert decode_tokens([], toy_embeddings.tokenizer) == ""


def test_word_lists_identity_and_truncation(toy_embeddings, separated_embeddings):
    words = [["patients", "given", "aspirin", "."], ["heart", "rate"], []]
    out, cut = privatize_word_lists(words, toy_embeddings.tokenizer, toy_embeddings, math.inf)
    assert out == [["patients", "given", "aspirin", "."], ["heart", "rate"], []] and cut == 0
    out, cut = privatize_word_lists(words, toy_embeddings.tokenizer, toy_embeddings, math.inf, max_words=3)
    assert out[0] == ["patients", "given", "aspirin"] and cut == 1
    # Small η: every list stays within the cap.
    many = [["patients", "given", "aspirin", "daily"]] * 200
    out, cut = privatize_word_lists(many, separated_embeddings.tokenizer, separated_embeddings, 0.5, rng=0,
                                    max_words=4)
    assert all(1 <= len(w) <= 4 for w in out)
    assert cut > 0  # a "##s" replaced by a word-initial token starts a fifth word somewhere


def test_privatize_file_round_trip(tmp_path, toy_embeddings):
    from dpbert.local_privacy.embeddings import write_hf_checkpoint

    model = write_hf_checkpoint(toy_embeddings, tmp_path / "model")
    source = tmp_path / "in.txt"
    source.write_text(TEXT + "\n\nHeart rate and blood pressure.\n", encoding="utf-8")
    summary = privatize_file(source, tmp_path / "out.txt", 1e9, model_dir=model, seed=0)
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert lines == [_normalized(toy_embeddings.tokenizer, TEXT), "", "heart rate and blood pressure.", ""]
    assert summary["lines"] == 3 and summary["tokens_changed"] == 0 and summary["seeded"]
    summary = privatize_file(source, tmp_path / "noisy.txt", 0.5, model_dir=model, seed=0)
    assert summary["fraction_changed"] > 0.5
    assert len((tmp_path / "noisy.txt").read_text(encoding="utf-8").split("\n")) == 4
    with pytest.raises(FileNotFoundError):
        privatize_file(tmp_path / "missing.txt", tmp_path / "x.txt", 1.0, model_dir=model)
    assert not list(tmp_path.glob("*.tmp-*"))


def test_load_embeddings_sources(tmp_path, toy_embeddings, monkeypatch):
    from dpbert.local_privacy.embeddings import load_embeddings, write_hf_checkpoint

    write_hf_checkpoint(toy_embeddings, tmp_path / "ckpt")
    loaded = load_embeddings(tmp_path / "ckpt")
    assert loaded.tokens == toy_embeddings.tokens and np.array_equal(loaded.vectors, toy_embeddings.vectors)
    assert loaded.public and loaded.describe()["candidates"] == len(loaded.tokens) - 6
    with pytest.raises(FileNotFoundError):
        load_embeddings(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        load_embeddings(tmp_path / "empty")
    # Default: $DPBERT_MINILM_DIR (the public checkpoint's layout).
    monkeypatch.setenv("DPBERT_MINILM_DIR", str(tmp_path / "ckpt"))
    assert load_embeddings().tokens == toy_embeddings.tokens


def test_unknown_input_token_is_privatized_not_passed_through(toy_embeddings):
    """[UNK] carries content ("some unknown word"): like any input it goes to a candidate, so the
    output never holds a special token, even at η = ∞ (then: the nearest candidate to φ([UNK]))."""
    tokenizer = toy_embeddings.tokenizer
    assert "[UNK]" in tokenizer.encode("zebra fever", add_special_tokens=False).tokens
    out = privatize_text("zebra fever", tokenizer, toy_embeddings, math.inf)
    assert "[" not in out and out.endswith("fever")
