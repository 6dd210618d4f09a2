"""Types of the C extension stream/models/_wordpiece.c (BERT WordPiece tokenizing of ASCII texts)."""

from collections.abc import Sequence

class WordPiece:
    def __init__(self, vocab: dict[str, int], unk_id: int, cls_id: int, sep_id: int, max_word_chars: int,
                 prefix: str = "##") -> None: ...
    def encode(self, texts: Sequence[str], max_tokens: int, max_chars: int) -> tuple[bytes, bytes, list[int], int]: ...
