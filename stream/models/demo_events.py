"""The demo's synthetic payment events and the hidden rule that makes some of them fraud.

Pure and seeded: the same (seed, start, count) always gives the same events. The demo model is trained
on data from this generator, the producer publishes it, and the tests reuse it (AUC, end-to-end ids).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_FEATURES = 32
_RULE_SEED = 20261122  # fixed: the rule is part of the demo's definition, not of a run
_rule_rng = np.random.default_rng(_RULE_SEED)
_LINEAR = (_rule_rng.normal(size=N_FEATURES) * (_rule_rng.random(N_FEATURES) < 0.5)).astype(np.float64)
_BIAS = -3.6
_NOISE = 0.25  # logistic label noise scale: small, so a good model reaches AUC well above 0.95


def fraud_logit(features: np.ndarray) -> np.ndarray:
    """The generating rule: a sparse linear part plus a few interactions and a threshold effect."""
    x = np.asarray(features, dtype=np.float64)
    return (
        x @ _LINEAR
        + 1.5 * x[:, 0] * x[:, 1]
        - 0.8 * x[:, 2] ** 2
        + 2.0 * (x[:, 3] > 1.0)
        + 0.7 * np.abs(x[:, 4])
        + _BIAS
    )


@dataclass(frozen=True)
class EventBlock:
    """``count`` events, columnar. ``labels`` is the ground truth (never published)."""

    event_ids: list[str]
    keys: list[str]
    ts_ms: np.ndarray  # int64
    features: np.ndarray  # float32 (n, 32)
    labels: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.event_ids)

    def records(self) -> list[dict[str, object]]:
        """Avro-ready records (the input event schema)."""
        feats = self.features.tolist()
        ts = self.ts_ms.tolist()
        return [
            {"event_id": self.event_ids[i], "key": self.keys[i], "ts_ms": ts[i], "features": feats[i]}
            for i in range(len(self))
        ]


def generate_events(count: int, *, seed: int = 0, start: int = 0, n_keys: int = 10_000,
                    ts_ms: int = 0) -> EventBlock:
    """Events ``start .. start+count-1`` of the stream for ``seed``; ids are unique per (seed, index)."""
    if count < 0 or start < 0:
        raise ValueError("count and start must be >= 0")
    rng = np.random.default_rng([seed, start])
    features = rng.standard_normal((count, N_FEATURES)).astype(np.float32)
    noise = rng.logistic(scale=_NOISE, size=count)
    labels = (fraud_logit(features) + noise) > 0
    accounts = rng.integers(0, n_keys, size=count)
    ids = [f"ev-{seed}-{i}" for i in range(start, start + count)]
    keys = [f"acct-{a}" for a in accounts.tolist()]
    return EventBlock(ids, keys, np.full(count, ts_ms, dtype=np.int64), features, labels)
