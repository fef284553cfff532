"""A tiny public BERT checkpoint in the Hugging Face layout of all-MiniLM-L6-v2, written by tests:
BERT's vocab.txt order ([PAD] 0, [unused0..3] 1..4, [UNK] [CLS] [SEP] [MASK] after them),
letters and ## letters (so every lower-case word has pieces), a few whole words."""
import json

import numpy as np

H, HEADS, LAYERS, INTER, POS = 8, 2, 3, 16, 64
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
WORDS = ["the", "patient", "heart", "fever", "rate", "card", "##io", "##my", "##opathy", "of", "and", "with", "."]
VOCAB = (["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[unused3]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
         + LETTERS + ["##" + c for c in LETTERS] + WORDS)


def write_checkpoint(directory, seed=0, vocab=VOCAB):
    """Write config.json, vocab.txt and model.safetensors into ``directory``; returns the tensors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0, 0.3, shape).astype(np.float32)  # noqa: E731
    t = {"embeddings.word_embeddings.weight": w(len(vocab), H),
         "embeddings.position_embeddings.weight": w(POS, H),
         "embeddings.token_type_embeddings.weight": w(2, H),
         "embeddings.LayerNorm.weight": 1 + w(H), "embeddings.LayerNorm.bias": w(H)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + name + ".weight"], t[p + name + ".bias"] = w(H, H), w(H)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = w(INTER, H), w(INTER)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = w(H, INTER), w(H)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + name + ".weight"], t[p + name + ".bias"] = 1 + w(H), w(H)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(t, str(directory / "model.safetensors"))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (directory / "config.json").write_text(json.dumps({
        "hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INTER,
        "max_position_embeddings": POS, "vocab_size": len(vocab), "hidden_act": "gelu", "layer_norm_eps": 1e-12}))
    return t
