"""Types of the C extension stream/codec/_nativecodec.c (the decoder's field plans, the encoder's output plans)."""

from typing import Any

import numpy as np

MAX_DEPTH: int
ZERO_SIZE_ITEMS_BASE: int
ZERO_SIZE_ITEMS_PER_BYTE: int

def run_plan(program: np.ndarray, defaults: list[bytes | None],
             values: list[bytes | None] | tuple[Any, np.ndarray, np.ndarray], rows: np.ndarray, skip: int,
             columns: list[tuple[Any, ...]], index: np.ndarray,
             ) -> tuple[int, list[tuple[int, int, str | int]], int]: ...
def read_ids(values: list[bytes | None] | tuple[Any, np.ndarray, np.ndarray], ids: np.ndarray) -> None: ...
def encode_rows(header: bytes, program: np.ndarray, consts: list[bytes], arrays: list[np.ndarray], n: int,
                ends: np.ndarray) -> bytes: ...
