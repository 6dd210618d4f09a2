"""``--model minilm`` against sentence-transformers' own embeddings (tests/fixtures/minilm_reference.json, written
by tests/fixtures/make_minilm_reference.py), and its length bucketing, truncation and bad input."""

from __future__ import annotations

import collections
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from producers.texts import generate_texts
from stream.errors import ConfigError, UnrecoverableModelError
from stream.models import bert, minilm, passes
from stream.models.minilm import MiniLMHandler, read_model_files
from stream.models.passes import plan_passes
from stream.models.shapes import ShapeSet
from stream.pipeline.inference import TextOptions, create_handler

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
REFERENCE = json.loads((FIXTURES / "minilm_reference.json").read_text())
SENTENCES = json.loads((FIXTURES / "minilm_sentences.json").read_text())


@pytest.fixture(scope="module")
def handler() -> MiniLMHandler:
    h = MiniLMHandler()
    h.load(torch.device("cpu"))
    return h


@pytest.fixture(scope="module")
def embedded(handler: MiniLMHandler) -> np.ndarray:
    return handler.embed(REFERENCE["texts"])


def test_embeddings_equal_sentence_transformers_to_1e_4(embedded: np.ndarray) -> None:
    want = np.asarray(REFERENCE["embeddings"], dtype=np.float64)
    assert embedded.shape == want.shape == (len(REFERENCE["texts"]), 384)
    assert embedded.dtype == np.float32
    assert float(np.abs(embedded - want).max()) <= 1e-4
    # the fixture holds a text that sentence-transformers cut to its max_seq_length: ours is cut the same way
    assert REFERENCE["max_seq_length"] == 256 and max(REFERENCE["token_lengths"]) == 256


def test_every_embedding_has_unit_norm(embedded: np.ndarray) -> None:
    norms = np.linalg.norm(embedded.astype(np.float64), axis=1)
    assert np.all(np.abs(norms - 1.0) <= 1e-3)


def test_paraphrases_score_higher_than_every_unrelated_pair(embedded: np.ndarray) -> None:
    n = len(SENTENCES["pairs"])
    assert n >= 20
    a, b = embedded[0:2 * n:2].astype(np.float64), embedded[1:2 * n:2].astype(np.float64)
    cosine = a @ b.T  # unit vectors: [i, j] is the similarity of a_i and b_j
    paraphrase = np.diag(cosine)
    unrelated = cosine[~np.eye(n, dtype=bool)]
    assert paraphrase.min() > unrelated.max(), (paraphrase.min(), unrelated.max())


def test_bucketing_keeps_input_order_and_equals_plain_padding(handler: MiniLMHandler) -> None:
    texts = generate_texts(96, seed=5).texts
    texts[7] = "short"
    bucketed = handler.embed(texts)
    plain = handler.embed(texts, bucketing=False)
    one_by_one = np.stack([handler.embed([t])[0] for t in texts[:12]])
    assert float(np.abs(bucketed - plain).max()) < 1e-5
    assert float(np.abs(bucketed[:12] - one_by_one).max()) < 1e-5
    shuffled = np.random.default_rng(1).permutation(len(texts))
    again = handler.embed([texts[i] for i in shuffled])
    assert float(np.abs(again - bucketed[shuffled]).max()) < 1e-5


def test_bucketing_pads_less_than_plain_padding(handler: MiniLMHandler) -> None:
    ids = handler.tokenize(generate_texts(256, seed=6).texts)
    bucketed, plain = handler.layout(ids), handler.layout(ids, bucketing=False)
    real = sum(len(r) for r in ids)
    assert len(plain["ids"]) == 256 * max(len(r) for r in ids)
    assert real <= len(bucketed["ids"]) < len(plain["ids"]) / 2
    assert len(bucketed["passes"]) > 1


def test_texts_over_max_tokens_are_cut_and_counted() -> None:
    h = MiniLMHandler(max_tokens=16)
    h.load(torch.device("cpu"))
    long_text = "the quick brown fox jumps over the lazy dog " * 20
    ids = h.tokenize(["hello world", long_text, long_text * 500])  # the last is cut in characters first
    assert [len(r) for r in ids[1:]] == [16, 16] and len(ids[0]) == 4
    assert ids[1][0] == ids[0][0] and ids[1][-1] == ids[0][-1]  # still [CLS] ... [SEP]
    assert h.truncated == 2
    h.embed([long_text])
    assert h.truncated == 3
    # what prepare reports as each text's usage: the tokens the model takes, [CLS] and [SEP] and the cut included
    prepared = h.prepare({"text": ["hello world", long_text, "a"]})
    assert prepared["tokens"].tolist() == [4, 16, 3] and prepared["truncated"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(2, 512), min_size=1, max_size=300), st.integers(0, 5000), st.integers(64, 20_000),
       st.booleans())
def test_plan_passes_covers_every_row_once_within_the_token_cap(lengths: list[int], overhead: int, cap: int,
                                                                bucketing: bool) -> None:
    sorted_lengths = np.sort(np.asarray(lengths))
    passes = plan_passes(sorted_lengths, overhead, cap, bucketing)
    assert passes[0].start == 0 and passes[-1].stop == len(lengths)
    offset = 0
    for before, after in itertools.pairwise(passes):
        assert before.stop == after.start
    for p in passes:
        assert p.stop > p.start and p.offset == offset and p.rows == p.stop - p.start and p.row_offset == p.start
        assert p.length >= sorted_lengths[p.stop - 1]  # every row fits
        assert (p.stop - p.start) * p.length <= cap or p.stop - p.start == 1
        offset += (p.stop - p.start) * p.length
    if not bucketing:
        assert {p.length for p in passes} == {int(sorted_lengths[-1])}
    else:  # never costlier than plain padding, by the planner's own measure
        plain = plan_passes(sorted_lengths, overhead, cap, False)
        cost = sum((p.stop - p.start) * p.length + overhead for p in passes)
        assert cost <= sum((p.stop - p.start) * p.length + overhead for p in plain)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(2, 512), min_size=1, max_size=600), st.integers(0, 5000),
       st.sampled_from([16_384, 262_144]))
def test_a_fixed_shape_set_plans_passes_of_its_shapes_only(lengths: list[int], overhead: int, cap: int) -> None:
    shapes = ShapeSet(max_rows=cap // 16)
    sorted_lengths = np.sort(np.asarray(lengths))
    passes = plan_passes(sorted_lengths, overhead, cap, True, shapes)
    sizes = set(shapes.row_sizes.tolist())
    assert passes[0].start == 0 and passes[-1].stop == len(lengths)
    offset = row_offset = 0
    for before, after in itertools.pairwise(passes):
        assert before.stop == after.start
    for p in passes:
        assert p.length % 16 == 0 and p.length >= sorted_lengths[p.stop - 1] and p.length <= 512
        assert p.rows in sizes and p.rows >= p.stop - p.start and p.rows * p.length <= cap
        assert p.offset == offset and p.row_offset == row_offset
        offset += p.rows * p.length
        row_offset += p.rows
    assert len({(p.rows, p.length) for p in passes}) <= len(passes)


@pytest.mark.skipif(passes._textprep is None, reason="stream.models._textprep not compiled")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 512), min_size=1, max_size=400), st.integers(0, 5000), st.integers(1, 40_000),
       st.booleans())
def test_the_c_planner_chooses_what_the_numpy_one_does(lengths: list[int], overhead: int, cap: int,
                                                      fixed: bool) -> None:
    cap = max(cap, 8 * 512) if fixed else cap  # a shape set's smallest pass: 8 rows of the longest length
    shapes = ShapeSet(max_rows=cap // 16) if fixed else None
    planned = shapes.lengths(np.sort(np.asarray(lengths))) if shapes is not None else np.sort(np.asarray(lengths))
    values, counts = np.unique(planned, return_counts=True)
    ends = np.concatenate([[0], np.cumsum(counts)])
    assert np.array_equal(passes.plan_groups(values, ends, cap, overhead, shapes),
                          passes.plan_groups(values, ends, cap, overhead, shapes, native=False))


def test_row_sizes_are_few_and_pad_a_pass_by_at_most_a_third() -> None:
    shapes = ShapeSet(max_rows=16_384)
    sizes = shapes.row_sizes
    assert sizes[0] == 8 and sizes[-1] == 16_384 and len(sizes) == 23
    rows = np.arange(1, 16_385)
    padded = shapes.rows(rows)
    assert (padded >= rows).all() and np.isin(padded, sizes).all()
    assert ((padded - rows)[rows >= 8] <= rows[rows >= 8] / 2).all()  # 8 -> 12 -> 16 -> 24: under 1.5x
    assert shapes.fit(100) == 96 and shapes.fit(3) == 8 and list(shapes.lengths(np.array([1, 16, 17]))) == [16, 16, 32]


def test_a_fixed_shape_set_embeds_as_each_batchs_own_shapes_do(handler: MiniLMHandler) -> None:
    """Lengths rounded up and padding rows change what runs, not what comes out: the masks keep padding out."""
    fixed = MiniLMHandler(fixed_shapes=True)
    fixed.load(torch.device("cpu"))
    texts = generate_texts(150, seed=8).texts
    layout = fixed.layout(fixed.tokenize(texts))
    assert {p.length % 16 for p in layout["passes"]} == {0}
    assert sum(p.rows for p in layout["passes"]) > len(texts), "padding rows were added"
    assert float(np.abs(fixed.embed(texts) - handler.embed(texts)).max()) < 1e-5


def test_no_pass_may_use_cudnn_attention(handler: MiniLMHandler, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's attention builds a graph per new input shape (bfloat16 ran 10x slower than float32 on a stream of
    new shapes until that backend was left out): every forward pass runs with it disabled."""
    import stream.models.bert as bert

    seen: list[bool] = []
    real = bert.F.scaled_dot_product_attention

    def attention(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bert.F, "scaled_dot_product_attention", attention)
    handler.embed(["one text", "and another, longer text"])
    assert seen and not any(seen), "a pass ran with cuDNN attention enabled"
    assert torch.backends.cuda.cudnn_sdp_enabled(), "the default is back once the batch is done"


def test_model_files_from_a_folder_and_clear_errors(tmp_path: Path) -> None:
    files = read_model_files(None)
    folder = tmp_path / "minilm"
    (folder / "1_Pooling").mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    h = MiniLMHandler(folder)
    h.load(torch.device("cpu"))
    assert h.version.startswith("sha256-") and h.outputs[0].size == 384
    (folder / "tokenizer.json").unlink()
    with pytest.raises(UnrecoverableModelError, match=r"lacks tokenizer\.json"):
        MiniLMHandler(folder).load(torch.device("cpu"))
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (folder / "tokenizer.json").write_bytes(files["tokenizer.json"])
    with pytest.raises(UnrecoverableModelError, match="not mean pooling"):
        MiniLMHandler(folder).load(torch.device("cpu"))
    with pytest.raises(UnrecoverableModelError, match="needs a CUDA device"):
        MiniLMHandler(dtype="float16").load(torch.device("cpu"))
    with pytest.raises(UnrecoverableModelError, match="--cuda-graphs needs a CUDA device"):
        MiniLMHandler(cuda_graphs=True).load(torch.device("cpu"))


def test_text_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="between 3 and"):
        create_handler("minilm", None, TextOptions(max_tokens=600))
    with pytest.raises(ConfigError, match="apply to --model minilm only"):
        create_handler("demo", None, TextOptions(max_tokens=64))
    with pytest.raises(ConfigError, match="--cuda-graphs apply to --model minilm only"):
        create_handler("demo", None, TextOptions(cuda_graphs=True))
    graphs = create_handler("minilm", None, TextOptions(cuda_graphs=True))
    assert isinstance(graphs, MiniLMHandler) and graphs.cuda_graphs and graphs.shapes is not None
    handler = create_handler("minilm", None, TextOptions(max_tokens=64, dtype="bfloat16"))
    assert isinstance(handler, MiniLMHandler) and handler.max_tokens == 64 and handler.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="--packing apply to --model minilm only"):
        create_handler("demo", None, TextOptions(packing=False))


def test_the_worker_s_defaults_are_float32_padded_passes_on_the_cpu() -> None:
    """--dtype and --packing not given: decided at load, for the device (bfloat16 and packing on CUDA)."""
    handler = create_handler("minilm", None, TextOptions())
    assert isinstance(handler, MiniLMHandler) and handler.dtype == "auto" and handler.packing is None
    handler.load(torch.device("cpu"))
    assert handler.dtype == "float32" and handler.packing is False
    asked = create_handler("minilm", None, TextOptions(packing=True))
    assert isinstance(asked, MiniLMHandler)
    asked.load(torch.device("cpu"))
    assert asked.packing is True and asked.dtype == "float32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_path_matches_the_cpu_and_half_precision_stays_close(embedded: np.ndarray) -> None:
    from stream.pipeline.inference import InferenceEngine

    texts = REFERENCE["texts"]
    engine = InferenceEngine(MiniLMHandler(), torch.device("cuda"))  # pinned staging, copy and compute streams
    ahead = [engine.submit({"text": texts[i:i + 8]}) for i in range(0, len(texts), 8)]  # several in flight
    got = np.concatenate([engine.result(f).outputs["embedding"] for f in ahead])
    assert float(np.abs(got - embedded).max()) <= 1e-4
    half = InferenceEngine(MiniLMHandler(dtype="bfloat16"), torch.device("cuda")).run({"text": texts})
    cosine = (half.outputs["embedding"].astype(np.float64) * embedded).sum(axis=1)
    assert cosine.min() > 0.99


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_replay_what_the_eager_passes_compute_and_stay_bounded(embedded: np.ndarray) -> None:
    from stream.pipeline.inference import InferenceEngine

    texts = REFERENCE["texts"] + generate_texts(600, seed=9).texts
    eager = InferenceEngine(MiniLMHandler(fixed_shapes=True), torch.device("cuda")).run({"text": texts})
    handler = MiniLMHandler(cuda_graphs=True)
    engine = InferenceEngine(handler, torch.device("cuda"))
    assert handler._graphs is not None
    handler._graphs._limit = 4  # evicts as it goes
    for size in (7, 64, 300, len(texts)):  # new shapes, then shapes seen before
        got = engine.run({"text": texts[:size]}).outputs["embedding"]
        want = eager.outputs["embedding"][:size]
        assert float(np.abs(got - want).max()) < 1e-4
    assert float(np.abs(got[: len(REFERENCE["texts"])] - embedded).max()) <= 1e-4
    assert len(handler._graphs) <= 4 and handler._graphs.captured > 4
    assert engine.run({"text": texts}).outputs["embedding"].tobytes() == got.tobytes(), "replays are deterministic"


@pytest.fixture(scope="module")
def packed() -> MiniLMHandler:
    h = MiniLMHandler(packing=True)
    h.load(torch.device("cpu"))
    return h


def test_packed_texts_embed_as_padded_passes_and_sentence_transformers_do(packed: MiniLMHandler,
                                                                         embedded: np.ndarray,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    got = packed.embed(REFERENCE["texts"])
    want = np.asarray(REFERENCE["embeddings"], dtype=np.float64)
    assert float(np.abs(got - want).max()) <= 1e-4
    cosine = (got.astype(np.float64) * embedded).sum(axis=1)
    assert cosine.min() >= 0.99999, cosine.min()
    # 120 texts in packs of at most 1,024 tokens (the CPU's are 16,384: one pack): several packs and their seams
    monkeypatch.setitem(minilm.PACK_TOKENS, "cpu", 1024)
    texts = generate_texts(120, seed=11).texts
    assert len(packed.layout(packed.tokenize(texts))["packs"]) >= 3
    assert float(np.abs(packed.embed(texts) - packed.embed(texts, bucketing=True)).max()) < 1e-5


def test_a_packed_layout_holds_every_token_once_in_order_within_its_budget(packed: MiniLMHandler,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(minilm.PACK_BUCKET, "cpu", 64)  # CUDA's rounding, at a size a test can read
    monkeypatch.setitem(minilm.PACK_TOKENS, "cpu", 500)
    tokens, lengths, _ = packed.tokenize_flat(generate_texts(120, seed=12).texts)
    layout = packed.layout_packed(tokens, lengths)
    packs = layout["packs"]
    assert len(packs) > 1
    ids, segments, positions = layout["ids"], layout["segments"], layout["positions"]
    got, texts = [], []
    for p in packs:
        span = slice(p.offset, p.offset + p.tokens)
        real = segments[span] < p.count  # its texts, numbered from 0; its padding is numbered p.count
        got += ids[span][real].tolist()
        texts += (segments[span][real] + p.first).tolist()
        assert p.tokens % 64 == 0 and (p.tokens <= 500 + 63 or p.count == 1)  # a longer text travels alone
        cu = layout["cu"][p.cu_offset: p.cu_offset + p.cu_count]
        assert cu[0] == 0 and cu[-1] == p.tokens and np.all(np.diff(cu) > 0)
        assert np.diff(cu).max() == p.max_length and p.max_length <= max(packed.max_tokens, minilm.PAD_TEXT)
        starts = np.zeros(p.tokens, dtype=bool)  # positions restart at every text: 0 at each boundary
        starts[cu[:-1]] = True
        assert np.all(positions[span][starts & real] == 0)
    assert got == tokens.tolist()  # in input order, none lost, none twice
    assert texts == np.repeat(np.arange(len(lengths)), lengths).tolist()
    assert sum(p.tokens for p in packs) == len(layout["ids"])


def test_variable_length_attention_equals_each_text_alone() -> None:
    torch.manual_seed(0)
    lengths = [5, 1, 17, 3]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    q, k, v = (torch.randn(sum(lengths), 4, 8) for _ in range(3))
    got = bert.padded_attention(q, k, v, cu, max(lengths))
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = torch.nn.functional.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)))
        assert torch.allclose(got[a:b], alone.transpose(0, 1), atol=1e-6)


def test_packing_takes_no_fixed_shape_set() -> None:
    with pytest.raises(ConfigError, match="packing takes no fixed shape set"):
        MiniLMHandler(packing=True, fixed_shapes=True)
    assert MiniLMHandler(packing=True, cuda_graphs=True).shapes is None  # its graphs are per token bucket


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_on_cuda_matches_the_cpu_in_float32_and_stays_close_in_bfloat16(embedded: np.ndarray) -> None:
    from stream.pipeline.inference import InferenceEngine

    texts = REFERENCE["texts"]
    full = InferenceEngine(MiniLMHandler(packing=True), torch.device("cuda")).run({"text": texts})
    assert float(np.abs(full.outputs["embedding"] - embedded).max()) <= 1e-4
    half = InferenceEngine(MiniLMHandler(packing=True, dtype="bfloat16"), torch.device("cuda")).run({"text": texts})
    cosine = (half.outputs["embedding"].astype(np.float64) * embedded).sum(axis=1)
    assert cosine.min() > 0.99


def test_the_warm_up_meets_every_token_bucket_a_packed_pass_can_have(monkeypatch: pytest.MonkeyPatch) -> None:
    h = MiniLMHandler(packing=True, max_tokens=100)
    h.load(torch.device("cpu"))
    monkeypatch.setattr(h, "_pin", True)  # lay out as for CUDA (its buckets), run nothing
    seen = set()
    for batch in h.warm_inputs():
        tokens, lengths, _ = h.tokenize_flat(batch["text"])
        seen.update(p.tokens for p in h.layout_packed(tokens, lengths)["packs"])
    bucket, budget = minilm.PACK_BUCKET["cuda"], minilm.PACK_TOKENS["cuda"]
    assert seen == set(range(bucket, budget + 1, bucket))


def test_the_engine_warms_through_the_records_path_and_stops_when_told() -> None:
    from stream.pipeline.inference import InferenceEngine

    h = MiniLMHandler(packing=True)
    engine = InferenceEngine(h, torch.device("cpu"))
    steps: list[tuple[int, int]] = []
    done, total, seconds = engine.warm(60.0, progress=lambda d, t: steps.append((d, t)))
    assert done == total == len(h.warm_inputs()) > 0 and steps[-1] == (total, total) and seconds > 0
    assert engine.warm(60.0, stop=lambda: True)[0] == 0
    assert engine.warm(-1.0)[0] == 0  # past its bound at once: nothing run, a warning logged


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_worker_s_defaults_on_cuda_are_bfloat16_packed() -> None:
    handler = create_handler("minilm", None, TextOptions())
    assert isinstance(handler, MiniLMHandler)
    handler.load(torch.device("cuda"))
    assert handler.dtype == "bfloat16" and handler.packing is bert.varlen_available()


class _Calls(TorchDispatchMode):
    """Counts the torch calls a forward pass makes (each call is a launch on a GPU) and refuses the ones that make
    the host wait for the device (a scalar read, ``nonzero``'s data-dependent shape, a copy to the host)."""

    SYNCING = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item", "aten.is_nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in self.SYNCING or (name == "aten._to_copy" and (kwargs or {}).get("device") == torch.device("cpu")):
            raise AssertionError(f"{name}: the host would wait for the device here")
        self.calls.append(name)
        return func(*args, **(kwargs or {}))


@torch.library.custom_op("stream_test::varlen", mutates_args=())
def _fake_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_q: int,
                 max_k: int) -> torch.Tensor:
    """One call standing for the CUDA kernel (its inside is not counted: a dispatch mode sees the call only)."""
    return bert.padded_attention(q, k, v, cu, max_q)


@_fake_varlen.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_q: int, max_k: int) -> torch.Tensor:
    return torch.empty_like(q)


def test_a_packed_pass_is_a_few_calls_none_waiting_for_the_device(packed: MiniLMHandler,
                                                                  handler: MiniLMHandler,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU proof of the GPU path: with the variable-length kernel as one call (as on CUDA), a batch of 256
    texts in one pack is about a hundred torch calls and none of them makes the host wait; the padded passes make
    many times as many (every pass repeats the whole encoder)."""
    monkeypatch.setattr(bert, "_takes_varlen", lambda q: True)
    monkeypatch.setattr(bert, "_varlen", lambda q, k, v, cu, _, max_q, max_k: _fake_varlen(q, k, v, cu, max_q, max_k))
    texts = generate_texts(256, seed=13).texts
    counted = {}
    for name, h in (("packed", packed), ("padded", handler)):
        inputs = h.collate(h.prepare({"text": texts}), torch.device("cpu"))
        mode = _Calls()
        with torch.inference_mode(), mode:
            h.predict(inputs)
        counted[name] = mode.calls
    layers = packed._encoder.config.num_hidden_layers if packed._encoder is not None else 0
    assert len(counted["packed"]) <= 20 * layers + 20, collections_count(counted["packed"])
    assert counted["packed"].count("stream_test.varlen") == layers
    assert len(counted["padded"]) > 5 * len(counted["packed"])  # 102 against 1,192 here
    want = np.stack([handler.embed([t])[0] for t in texts[:4]])
    assert float(np.abs(packed.embed(texts[:16])[:4] - want).max()) < 1e-5  # the fake kernel computes the real thing


def collections_count(calls: list[str]) -> dict[str, int]:
    return dict(collections.Counter(calls).most_common())


@functools.cache
def warmed_graph_keys() -> frozenset[tuple[int, int]]:
    """(tokens, boundaries) of every pack the warm-up lays out under graphs, with CUDA's buckets (no device)."""
    h = MiniLMHandler(packing=True)
    h.load(torch.device("cpu"))
    h._pin, h._graphs = True, object()  # CUDA's buckets, laid out as under graphs (run nothing)
    keys = set()
    for batch in h.warm_inputs():
        tokens, lengths, _ = h.tokenize_flat(batch["text"])
        keys.update((p.tokens, p.cu_count) for p in h.layout_packed(tokens, lengths)["packs"])
    return frozenset(keys)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(2, 256), min_size=1, max_size=3000), st.booleans())
def test_every_packed_pass_is_one_of_the_warmed_buckets(lengths: list[int], short: bool) -> None:
    """Eager: every pack a token bucket. Under graphs: every (bucket, boundaries' tier) one the warm-up met."""
    if short:  # many texts a pack: the higher tiers, and packs closed on their count of texts
        lengths = [2 + n % 3 for n in lengths] * 4
    h = MiniLMHandler(packing=True)
    h._pin = True  # CUDA's buckets, no device needed
    tokens = np.zeros(sum(lengths), dtype=np.int32)
    packs = h.layout_packed(tokens, np.asarray(lengths, dtype=np.int64))["packs"]
    bucket, budget = minilm.PACK_BUCKET["cuda"], minilm.PACK_TOKENS["cuda"]
    assert {p.tokens for p in packs} <= set(range(bucket, budget + 1, bucket))
    assert sum(p.cu_count - 1 for p in packs) >= len(lengths)
    h._graphs = object()  # laid out as under graphs
    packs = h.layout_packed(tokens, np.asarray(lengths, dtype=np.int64))["packs"]
    assert sum(p.count for p in packs) == len(lengths) and all(p.cu_count in passes.CU_TIERS for p in packs)
    assert {(p.tokens, p.cu_count) for p in packs} <= warmed_graph_keys()


def test_every_pack_of_equal_texts_under_graphs_is_one_the_warm_up_met() -> None:
    """Texts of one length at every count up to a full pass: every bucket and boundaries' tier such batches make
    (the lengths that meet each tier's edges) was laid out by the warm-up."""
    h = MiniLMHandler(packing=True)
    h._pin, h._graphs = True, object()  # CUDA's buckets, laid out as under graphs
    bucket, budget = minilm.PACK_BUCKET["cuda"], minilm.PACK_TOKENS["cuda"]
    seen = set()
    for length in (2, 3, 4, 5, 8, 15, 16, 17, 33, 64, 65, 100, 128, 255, 256):
        for tokens in range(bucket, budget + 1, bucket // 4):
            lengths = np.full(max(1, tokens // length), length, dtype=np.int64)
            seen.update((p.tokens, p.cu_count) for p in h.layout_packed(np.zeros(lengths.sum(), np.int32),
                                                                         lengths)["packs"])
    assert seen <= warmed_graph_keys(), sorted(seen - warmed_graph_keys())[:10]
    assert {tier for _, tier in seen} == set(passes.CU_TIERS)


class _StandInGraphs:
    """`stream.models.shapes.CudaGraphs`' contract without CUDA: static buffers allocated once, each call's inputs
    copied into views at their start, a "capture" the first time a shape is met (counted, and counted as late once
    frozen), the function run on the static views (a replay reads them, never the caller's tensors)."""

    def __init__(self, fn: Any, input_capacity: list[tuple[int, torch.dtype]], output_capacity: int,
                 output_dtype: torch.dtype, device: torch.device, limit: int = 256) -> None:
        self._fn = fn
        self.inputs = [torch.zeros(n, dtype=dtype, device=device) for n, dtype in input_capacity]
        self.output = torch.zeros(output_capacity, dtype=output_dtype, device=device)
        self.addresses = [b.data_ptr() for b in (*self.inputs, self.output)]
        self.shapes: list[tuple[tuple[int, ...], ...]] = []
        self.frozen = False
        self.late = 0
        self.replayed: set[tuple[tuple[int, ...], ...]] = set()  # shapes called once frozen

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple(tuple(t.shape) for t in inputs)
        statics = [buffer[: t.numel()].view(t.shape) for buffer, t in zip(self.inputs, inputs, strict=True)]
        for static, t in zip(statics, inputs, strict=True):
            static.copy_(t)
        if key not in self.shapes:
            self.shapes.append(key)
            self.late += self.frozen
        if self.frozen:
            self.replayed.add(key)
        result = self._fn(*statics)
        out = self.output[: result.numel()].view(result.shape)
        out.copy_(result)
        assert [b.data_ptr() for b in (*self.inputs, self.output)] == self.addresses, "a static buffer moved"
        return out


def test_graphs_per_bucket_are_all_met_by_the_warm_up_and_replay_what_eager_passes_compute(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from stream.pipeline.inference import InferenceEngine

    monkeypatch.setitem(minilm.PACK_BUCKET, "cpu", 128)  # CUDA's rounding, at a size the CPU runs in seconds
    monkeypatch.setitem(minilm.PACK_TOKENS, "cpu", 512)
    h = MiniLMHandler(packing=True, max_tokens=32)
    engine = InferenceEngine(h, torch.device("cpu"))
    h.graph_packs(_StandInGraphs)
    graphs = h._graphs
    assert isinstance(graphs, _StandInGraphs)
    done, total, _ = engine.warm(120.0)
    assert done == total and graphs.frozen
    # every bucket, with each tier of texts' boundaries its packs can have (texts of 2 to 32 tokens), once
    below = dict(zip(passes.CU_TIERS, (0, *passes.CU_TIERS[:-1]), strict=True))
    reachable = {(t, tier) for t in range(128, 513, 128) for tier in passes.CU_TIERS  # boundaries: texts + 1
                 if tier >= -(-t // 32) + 1 and below[tier] < t // 2 + 1}
    assert {tier for _, tier in reachable} == set(passes.CU_TIERS[:3])
    assert {(shape[0][0], shape[3][0]) for shape in graphs.shapes} == reachable
    assert len(graphs.shapes) == len(reachable)
    eager = MiniLMHandler(packing=True, max_tokens=32)
    eager.load(torch.device("cpu"))
    # packs of the lowest tier (texts of a few to 32 tokens), then of 128 texts of 4 tokens and 256 of 2 (the
    # next two tiers), with longer ones among them
    short = [" "] * 300 + ["a b"] * 150 + generate_texts(30, seed=24).texts
    for texts in (generate_texts(3, seed=21).texts, generate_texts(40, seed=22).texts,
                  generate_texts(97, seed=23).texts, short):
        got = engine.run({"text": texts}).outputs["embedding"]
        assert float(np.abs(got - eager.embed(texts)).max()) < 1e-5
    assert {shape[3][0] for shape in graphs.replayed} == set(passes.CU_TIERS[:3])
    assert graphs.late == 0, "after the warm-up no new shape"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_cuda_graphs_are_captured_at_warm_up_and_replay_the_eager_packs() -> None:
    from stream.pipeline.inference import InferenceEngine

    texts = REFERENCE["texts"] + generate_texts(600, seed=9).texts
    eager = InferenceEngine(MiniLMHandler(packing=True, dtype="bfloat16"), torch.device("cuda")).run({"text": texts})
    handler = MiniLMHandler(packing=True, cuda_graphs=True, dtype="bfloat16")
    engine = InferenceEngine(handler, torch.device("cuda"))
    engine.warm(120.0)
    assert handler._graphs is not None and handler._graphs.frozen
    for size in (7, 64, 300, len(texts)):
        got = engine.run({"text": texts[:size]}).outputs["embedding"].astype(np.float64)
        cosine = (got * eager.outputs["embedding"][:size]).sum(axis=1)
        assert cosine.min() > 0.9999
    assert handler._graphs.late == 0
