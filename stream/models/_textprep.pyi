"""Types of the C extension stream/models/_textprep.c (WordPiece tokenizing of ASCII texts, pass planning)."""

from collections.abc import Sequence

import numpy as np

class WordPiece:
    def __init__(self, vocab: dict[str, int], unk_id: int, cls_id: int, sep_id: int, max_word_chars: int,
                 prefix: str = "##") -> None: ...
    def encode(self, texts: Sequence[str], max_tokens: int, max_chars: int) -> tuple[bytes, bytes, list[int], int]: ...

def plan_groups(values: np.ndarray, ends: np.ndarray, per_pass: np.ndarray, overhead: int,
                padded_rows: np.ndarray | None) -> bytes: ...
