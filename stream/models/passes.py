"""How a batch of token rows becomes forward passes, for `stream.models.minilm`: padded passes planned by a dynamic
programme over the rows' lengths (`plan_passes`: padded tokens plus a fixed cost a pass, minimised; C where
compiled), the packed passes' layout (`Pack`, `cu_tier`; `tier_warm_texts`: texts that warm every tier), and rows
of ids laid out one after another (`flatten`, `splice`). numpy only: no torch."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stream.models.shapes import ShapeSet

try:
    from stream.models import _textprep
except ImportError:  # not compiled: the numpy reference plans
    _textprep = None  # type: ignore[assignment]

# Packing (``packing=True``): a pass's tokens rounded up to a multiple of this many (the only shapes the encoder
# meets are these buckets), at most this many tokens a pass; padding tokens form texts of their own of at most
# PAD_TEXT tokens (attention within them is wasted work, kept small).
PACK_BUCKET = {"cpu": 1, "cuda": 1024}
PACK_TOKENS = {"cpu": 16_384, "cuda": 65_536}
PAD_TEXT = 32


@dataclass(frozen=True)
class Pack:
    """One packed pass: tokens ``offset:offset + tokens`` of the flat buffers (texts one after another, then
    padding), its texts' boundaries ``cu[cu_offset:cu_offset + cu_count]`` (relative to ``offset``), the longest
    of them ``max_length`` tokens; the batch's texts ``first:first + count``, numbered from 0 in its segments (its
    padding: ``count``)."""

    offset: int
    tokens: int
    cu_offset: int
    cu_count: int
    max_length: int
    first: int = 0
    count: int = 0


# Under CUDA graphs a pack's texts' boundaries are padded (with empty texts) to the first of these counts that holds
# them. The attention kernel launches blocks for every text, empty or not: one fixed count per bucket (half its
# tokens) cost about 12x the blocks of a real pack (the graphs ran at 0.56x eager on an H200); powers of 4 waste at
# most 4x, with at most 4 graphs a bucket.
CU_TIERS = (64, 256, 1024, 4096)


def cu_tier(count: int) -> int:
    """The boundaries a graph's pack with ``count`` of them is padded to (at most `graph_pack_texts` + 1 + its
    padding texts: within the top tier)."""
    for tier in CU_TIERS:
        if count <= tier:
            return tier
    raise ValueError(f"{count} text boundaries in a pack: more than a graph takes ({CU_TIERS[-1]})")


def graph_pack_texts(bucket: int, max_tokens: int) -> int:
    """The most texts a pack takes under graphs (a pack closes early at this many): its boundaries, its padding
    texts' (at most one per ``min(PAD_TEXT, max_tokens)`` of a bucket) included, within the top tier."""
    return CU_TIERS[-1] - 1 - -(-(bucket - 1) // min(PAD_TEXT, max_tokens))


def tier_warm_texts(bucket: int, budget: int, max_tokens: int) -> list[list[str]]:
    """The warm-up's batches under graphs: for every token bucket up to ``budget``, every tier of boundaries
    (`cu_tier`) a pack of it can have. Each is one pack of exactly the bucket's tokens with as many texts as the
    tier holds, or as the bucket can (texts of 2 tokens, [CLS] [SEP], at the most; ``max_tokens`` at the least). A
    pack with padding texts has more boundaries than an exact one of as many real tokens, never past the exact
    ones' highest tier."""
    most = graph_pack_texts(bucket, max_tokens)
    out = []
    for tokens in range(bucket, budget + 1, bucket):
        fewest, texts_at_most = -(-tokens // max_tokens), min(most, tokens // 2)
        below = 0  # this tier's counts: more boundaries (texts + 1) than the tier below holds
        for tier in CU_TIERS:
            texts = min(tier - 1, texts_at_most)
            if texts >= max(fewest, below):
                size, longer = divmod(tokens, texts)  # `longer` texts of size + 1 tokens, the rest of size
                out.append([words(size + 1)] * longer + [words(size)] * (texts - longer))
            below = tier
    return out


def words(tokens: int) -> str:
    """A text of ``tokens`` tokens with [CLS] and [SEP] (at least 2: " " is those alone)."""
    return " ".join(["hello"] * (tokens - 2)) or " "


@dataclass(frozen=True)
class Pass:
    """One forward pass: rows ``start:stop`` of the length-sorted batch, padded to ``length`` tokens, whose ids
    start at ``offset`` in the flat id buffer; ``rows`` rows in all (more than ``stop - start`` with a fixed shape
    set: padding rows), whose lengths start at ``row_offset`` in the layout's ``lengths``."""

    start: int
    stop: int
    length: int
    offset: int
    rows: int
    row_offset: int


def plan_passes(sorted_lengths: np.ndarray, overhead_tokens: int, pass_tokens: int,
                bucketing: bool = True, shapes: ShapeSet | None = None) -> list[Pass]:
    """Split a batch (its token lengths, ascending) into passes minimising padded tokens + ``overhead_tokens`` a
    pass, no pass over ``pass_tokens`` padded tokens (a row longer than that alone). Without ``bucketing``: the
    whole batch padded to its longest text (plain padding), cut only by ``pass_tokens``. With ``shapes``: every
    pass of a shape of that set (lengths and row counts rounded up), padding rows counted in the cost."""
    n = len(sorted_lengths)
    if n == 0:
        return []
    planned = shapes.lengths(sorted_lengths) if shapes is not None else sorted_lengths
    values, counts = np.unique(planned, return_counts=True)
    if not bucketing:
        values, counts = values[-1:], np.array([n])
    ends = np.concatenate([[0], np.cumsum(counts)])  # rows before group g
    choice = plan_groups(values, ends, pass_tokens, overhead_tokens, shapes)
    groups = len(values)
    buckets: list[tuple[int, int, int]] = []
    j = groups
    while j > 0:
        i = int(choice[j])
        buckets.append((int(ends[i]), int(ends[j]), int(values[j - 1])))
        j = i
    passes: list[Pass] = []
    offset = row_offset = 0
    for start, stop, length in reversed(buckets):
        per_pass = _rows_per_pass(length, pass_tokens, shapes)
        for a in range(start, stop, per_pass):
            b = min(a + per_pass, stop)
            rows = b - a if shapes is None else int(shapes.padded_rows[b - a])
            passes.append(Pass(a, b, length, offset, rows, row_offset))
            offset += rows * length
            row_offset += rows
    return passes


def plan_groups(values: np.ndarray, ends: np.ndarray, pass_tokens: int, overhead_tokens: int,
                shapes: ShapeSet | None, native: bool = True) -> np.ndarray:
    """`plan_passes`' dynamic programme over the groups of equal length (``values`` ascending, ``ends`` the rows
    before each group's end, 0 first): choice[j + 1] is where the cheapest split of groups 0..j starts its last
    bucket. In C (stream/models/_textprep.c) where compiled and ``native``; the numpy version is the reference."""
    values = values.astype(np.int64, copy=False)
    ends = ends.astype(np.int64, copy=False)
    per_passes = (np.maximum(1, pass_tokens // values) if shapes is None else
                  np.fromiter((_rows_per_pass(int(v), pass_tokens, shapes) for v in values), dtype=np.int64,
                              count=len(values)))
    if native and _textprep is not None:
        return np.frombuffer(_textprep.plan_groups(values, ends, per_passes, overhead_tokens,
                                                   None if shapes is None else shapes.padded_rows), np.int64)
    groups = len(values)
    best = np.zeros(groups + 1)
    choice = np.zeros(groups + 1, dtype=np.int64)
    for j in range(groups):  # best[j+1]: the cheapest split of groups 0..j; its last bucket is groups i..j
        length = int(values[j])
        rows = ends[j + 1] - ends[: j + 1]
        per_pass = int(per_passes[j])
        padded = rows if shapes is None else (rows // per_pass) * per_pass + shapes.rows(rows % per_pass)
        cost = best[: j + 1] + padded * length + -(-rows // per_pass) * overhead_tokens
        i = int(np.argmin(cost))
        best[j + 1], choice[j + 1] = cost[i], i
    return choice


def _rows_per_pass(length: int, pass_tokens: int, shapes: ShapeSet | None) -> int:
    per_pass = max(1, pass_tokens // length)
    return per_pass if shapes is None else shapes.fit(min(per_pass, shapes.max_rows))


def flatten(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ids -> (them one after another, int32; each row's count, int64)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    return tokens, lengths


def scatter_rows(out: np.ndarray, starts: np.ndarray, lengths: np.ndarray, tokens: np.ndarray) -> None:
    """Writes row i of ``tokens`` (rows of ``lengths`` one after another) to ``out[starts[i]:]``."""
    firsts = np.cumsum(lengths) - lengths  # where each row starts in tokens
    out[np.repeat(starts - firsts, lengths) + np.arange(len(tokens))] = tokens


def splice(tokens: np.ndarray, lengths: np.ndarray, rows: np.ndarray,
           ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """`tokenize_flat`'s rows with ``rows`` (empty in ``tokens``) given ``ids``: (tokens, lengths) of all."""
    more, more_lengths = flatten(ids)
    lengths = lengths.copy()
    lengths[rows] = more_lengths
    out = np.empty(int(lengths.sum()), dtype=np.int32)
    starts = np.cumsum(lengths) - lengths
    keep = np.ones(len(lengths), dtype=bool)
    keep[rows] = False
    scatter_rows(out, starts[keep], lengths[keep], tokens)
    scatter_rows(out, starts[rows], more_lengths, more)
    return out, lengths
