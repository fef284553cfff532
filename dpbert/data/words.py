"""The one definition of a "word", shared by the vocabulary job, the WordPiece trainer and training.

A word is what BERT's uncased pre-tokenization yields: the text is normalized by
``tokenizers.normalizers.BertNormalizer`` (control characters removed, CJK characters spaced,
accents stripped, lower-cased) and split by ``tokenizers.pre_tokenizers.BertPreTokenizer`` on
whitespace and punctuation, each punctuation character being a word of its own.

Using the tokenizers library itself (rather than a look-alike regex) is what makes the DP
histogram's words exactly the units the WordPiece model later sees: a word the histogram
counted is a word the tokenizer will split into pieces, never a different string.
"""
from __future__ import annotations

from typing import List

from tokenizers import normalizers, pre_tokenizers

#: Normalizer used by every stage; also installed on the trained WordPiece tokenizer.
NORMALIZER = normalizers.BertNormalizer(
    clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
)
#: Pre-tokenizer used by every stage; also installed on the trained WordPiece tokenizer.
PRE_TOKENIZER = pre_tokenizers.BertPreTokenizer()


def split_words(text: str) -> List[str]:
    """Normalize ``text`` and return its words in order (see the module docstring)."""
    normalized = NORMALIZER.normalize_str(text)
    return [word for word, _ in PRE_TOKENIZER.pre_tokenize_str(normalized)]
