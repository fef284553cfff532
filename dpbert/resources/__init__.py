"""Public resources dpbert ships or locates, below every layer that reads them (no imports of
dpbert): ``bundled`` (the BC5CDR subset shipped in ``dpbert/resources/ner``) and ``checkpoint``
(where the public MiniLM checkpoint is). Nothing here reads private data."""
