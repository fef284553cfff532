"""Fill-mask: the model's most probable tokens at each ``[MASK]`` of a text (``dpbert predict``).

The text is tokenized with the model's own vocabulary (``[CLS] pieces… [SEP]``, the training's
tokenizer, ``[MASK]`` kept whole), padded to the model's positions and read by the MLM head at the
``[MASK]`` positions; each position's probabilities are the softmax of its logits over the whole
vocabulary (special tokens included, as Hugging Face's fill-mask pipeline reports them).

A model is read from a Hugging Face export folder (``config.json`` + ``model.safetensors``,
``dpbert export``) or a dpbert model folder (``model_config.json``) with its tokenizer folder.
A text longer than the model's positions is refused (``FillMaskError``), never truncated: a
``[MASK]`` cut off would be silently lost. docs/without-labels.md says what the output can and
cannot tell about a model.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np

DEFAULT_TOP_K = 5


class FillMaskError(ValueError):
    """A text the model cannot fill: no ``[MASK]``, or longer than the model's positions."""


@dataclasses.dataclass(frozen=True)
class MaskPrediction:
    """The ``number``-th ``[MASK]`` of the text (from 1), at token ``position`` ([CLS] is 0), and its
    ``candidates``: (token, probability), most probable first."""
    number: int
    position: int
    candidates: Tuple[Tuple[str, float], ...]

    def to_dict(self) -> dict:
        return {"mask": self.number, "position": self.position,
                "candidates": [{"token": t, "probability": p} for t, p in self.candidates]}


def encode(tokenizer, text: str, positions: int) -> np.ndarray:
    """``int32 [1, positions]``: ``[CLS] pieces… [SEP]`` padded; FillMaskError without a ``[MASK]``
    or when the text needs more than ``positions`` tokens."""
    from dpbert.vocab.wordpiece import MASK, PAD

    encoding = tokenizer.encode(text)
    ids = list(encoding.ids)
    if tokenizer.token_to_id(MASK) not in ids:
        raise FillMaskError(f"the text has no {MASK} (write it as {MASK}, upper case, where a word is to be filled)")
    if len(ids) > positions:
        raise FillMaskError(f"the text is {len(ids)} tokens ([CLS] and [SEP] included) and the model reads "
                            f"{positions} positions: shorten it (a {MASK} beyond them would be lost)")
    return np.asarray([ids + [tokenizer.token_to_id(PAD)] * (positions - len(ids))], np.int32)


def _probabilities(models, ids: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    """``[len(positions), V]``: softmax of the MLM logits at ``positions``, ``max_predictions`` slots a pass."""
    from scipy.special import softmax

    slots = models.spec.max_predictions
    rows = []
    for start in range(0, len(positions), slots):
        chunk = list(positions[start:start + slots])
        padded = np.asarray([chunk + [0] * (slots - len(chunk))], np.int32)
        logits = np.asarray(models.mlm({"input_ids": ids, "masked_positions": padded}, training=False))
        rows.append(softmax(logits[0, :len(chunk)].astype(np.float64), axis=-1))
    return np.concatenate(rows)


def fill_mask(models, tokenizer, text: str, top_k: int = DEFAULT_TOP_K) -> List[MaskPrediction]:
    """The ``top_k`` most probable tokens at every ``[MASK]`` of ``text`` (module docstring);
    ``models``: a ``dpbert.network.bert.BertModels``, ``tokenizer``: its vocabulary's."""
    from dpbert.vocab.wordpiece import MASK

    if int(top_k) < 1:
        raise FillMaskError(f"top_k must be >= 1, got {top_k}")
    ids = encode(tokenizer, text, models.spec.max_seq_length)
    positions = [int(p) for p in np.flatnonzero(ids[0] == tokenizer.token_to_id(MASK))]
    probabilities = _probabilities(models, ids, positions)
    out = []
    for number, (position, row) in enumerate(zip(positions, probabilities), start=1):
        best = np.argsort(-row, kind="stable")[:int(top_k)]
        out.append(MaskPrediction(number, position, tuple((tokenizer.id_to_token(int(i)), float(row[i]))
                                                          for i in best)))
    return out


def load_model(folder: str, tokenizer_dir: Optional[str] = None):
    """(models, tokenizer, what) of a Hugging Face export folder (its own vocabulary) or of a dpbert
    model folder (``model_config.json``) with ``tokenizer_dir``; local or ``gs://``."""
    from dpbert import storage
    from dpbert.network import hf_layout, init_public
    from dpbert.vocab.wordpiece import load_tokenizer

    store = storage.storage_for(folder)
    if store.exists(storage.join(folder, hf_layout.CONFIG_FILE)) and \
            store.exists(storage.join(folder, hf_layout.WEIGHTS_FILE)):
        return init_public.load_hf_bert(folder), load_tokenizer(folder), "Hugging Face export"
    if tokenizer_dir is None:
        raise FillMaskError(f"{folder}: not a Hugging Face export folder and no tokenizer folder given")
    return hf_layout.load_dpbert(folder), load_tokenizer(tokenizer_dir), "dpbert model"
