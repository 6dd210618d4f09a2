"""Types of the C extension stream/codec/_nativecodec.c (the fast paths of stream/codec.py)."""

import numpy as np

def scan_events(values: list[bytes | None] | tuple[bytes, np.ndarray, np.ndarray], header: bytes, n_features: int,
                max_bytes: int, index: np.ndarray,
                id_buf: np.ndarray, id_start: np.ndarray, id_len: np.ndarray, ts: np.ndarray,
                features: np.ndarray) -> int: ...
def encode_predictions(header: bytes, id_buf: np.ndarray, id_start: np.ndarray, id_len: np.ndarray, models: bytes,
                       scores: np.ndarray, flags: np.ndarray, event_ts: np.ndarray, tail: bytes,
                       partitions: np.ndarray | None, offsets: np.ndarray | None, ends: np.ndarray) -> bytes: ...
