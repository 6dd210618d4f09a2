"""The C WordPiece tokenizer (stream/models/_textprep.c) for a ``tokenizer.json`` it reproduces exactly, for
`stream.models.minilm` (which falls back to the tokenizers library for any other)."""

from __future__ import annotations

import json

try:
    from stream.models import _textprep
except ImportError:  # not compiled
    _textprep = None  # type: ignore[assignment]


def native_wordpiece(tokenizer_json: bytes) -> _textprep.WordPiece | None:
    """The C WordPiece (stream/models/_textprep.c) for this tokenizer.json, or None where the extension is not
    compiled or the tokenizer is not one it reproduces: BertNormalizer lowercasing with clean_text,
    BertPreTokenizer, WordPiece with the "##" prefix, [CLS] text [SEP], and special tokens only in brackets."""
    if _textprep is None:
        return None
    spec = json.loads(tokenizer_json)
    normalizer, model = spec.get("normalizer") or {}, spec.get("model") or {}
    post = spec.get("post_processor") or {}
    single = [next(iter(item.values()))["id"] for item in post.get("single", [])]
    added = spec.get("added_tokens") or []
    vocab = model.get("vocab")
    if (normalizer.get("type") != "BertNormalizer" or not normalizer.get("lowercase")
            or normalizer.get("clean_text") is False
            or (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer"
            or model.get("type") != "WordPiece" or model.get("continuing_subword_prefix") != "##"
            or not isinstance(vocab, dict) or post.get("type") != "TemplateProcessing"
            or single != ["[CLS]", "A", "[SEP]"]
            or any(not (a["content"].startswith("[") and a["content"].endswith("]")) for a in added)
            or not 1 <= model.get("max_input_chars_per_word", 100) <= 512
            or any(vocab.get(t) is None for t in ("[CLS]", "[SEP]", model.get("unk_token")))):
        return None
    special = post.get("special_tokens") or {}
    cls, sep = ((special[t].get("ids") or [None]) if t in special else [vocab[t]] for t in ("[CLS]", "[SEP]"))
    if len(cls) != 1 or len(sep) != 1 or not isinstance(cls[0], int) or not isinstance(sep[0], int):
        return None
    return _textprep.WordPiece(vocab, vocab[model["unk_token"]], cls[0], sep[0],
                                model.get("max_input_chars_per_word", 100))
