"""A BERT encoder (the architecture of Hugging Face's ``BertModel``, without its pooler) that loads a
``model.safetensors`` of that layout, and sentence-transformers' mean pooling with L2 normalisation.

It is small on purpose: embeddings, ``num_hidden_layers`` post-LayerNorm blocks (self-attention through
``torch.nn.functional.scaled_dot_product_attention``, exact-erf GELU), nothing for training (no dropout, no
heads). A key the file lacks or one the module does not know is an error, not a silent random weight.
`attention_backends`: the attention kernels a batch of a stream of ever new shapes may use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

try:  # torch 2.9 and later: flash attention over packed texts of any lengths (CUDA, 16-bit floats)
    from torch.nn.attention.varlen import varlen_attn as _varlen
except ImportError:
    _varlen = None  # type: ignore[assignment]


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> BertConfig:
        """The fields this module uses from a ``config.json``; an architecture it does not implement is refused."""
        if config.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type {config.get('model_type')!r} is not bert")
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"hidden_act {config.get('hidden_act')!r} is not supported (gelu only)")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        if config["hidden_size"] % config["num_attention_heads"]:
            raise ValueError("hidden_size is not a multiple of num_attention_heads")
        return cls(**{name: config[name] for name in cls.__dataclass_fields__})


class _Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.heads = c.num_attention_heads
        self.qkv = nn.Linear(h, 3 * h)  # query, key and value in one GEMM (the file's three, concatenated)
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(h, c.intermediate_size)
        self.out = nn.Linear(c.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.attention_norm(x + self.attention_out(context.transpose(1, 2).reshape(b, n, h)))
        out: torch.Tensor = self.out_norm(x + self.out(F.gelu(self.intermediate(x))))
        return out

    def packed(self, x: torch.Tensor, attend: Attention) -> torch.Tensor:
        """``x`` (tokens, h): every text's tokens one after another, no padding; ``attend`` the attention within
        each text (`varlen_attention`)."""
        t, h = x.shape
        q, k, v = self.qkv(x).view(t, 3, self.heads, h // self.heads).unbind(1)
        x = self.attention_norm(x + self.attention_out(attend(q, k, v).reshape(t, h)))
        out: torch.Tensor = self.out_norm(x + self.out(F.gelu(self.intermediate(x))))
        return out


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, h)
        self.position = nn.Embedding(config.max_position_embeddings, h)
        self.token_type = nn.Embedding(config.type_vocab_size, h)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``ids`` (b, n) token ids, ``mask`` (b, n) True on real tokens -> the last hidden states (b, n, h)."""
        n = ids.shape[1]
        x = self.word(ids) + self.position.weight[:n] + self.token_type.weight[0]
        x = self.norm(x)
        attend = mask[:, None, None, :]  # every query attends to the real tokens of its row
        for layer in self.layers:
            x = layer(x, attend)
        out: torch.Tensor = x
        return out

    def forward_packed(self, ids: torch.Tensor, positions: torch.Tensor, attend: Attention) -> torch.Tensor:
        """``ids`` (tokens,): texts one after another, ``positions`` each token's place in its text, ``attend``
        attention within each text -> the last hidden states (tokens, h). No padding, no mask."""
        x = self.word(ids) + self.position(positions) + self.token_type.weight[0]
        x = self.norm(x)
        for layer in self.layers:
            x = cast(_Layer, layer).packed(x, attend)
        out: torch.Tensor = x
        return out

    def load_hf_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load a Hugging Face ``BertModel`` state dict (``bert.`` prefix or not; the pooler is not used)."""
        state = {k.removeprefix("bert."): v for k, v in state.items()}
        renamed: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            if key.startswith("pooler.") or key == "embeddings.position_ids":
                continue
            renamed[_rename(key)] = value
        for i in range(self.config.num_hidden_layers):  # the fused projection: query, key, value in that order
            for leaf in ("weight", "bias"):
                parts = [renamed.pop(f"layers.{i}.{name}.{leaf}", None) for name in ("query", "key", "value")]
                if all(p is not None for p in parts):
                    renamed[f"layers.{i}.qkv.{leaf}"] = torch.cat(parts)  # type: ignore[arg-type]
                else:
                    renamed.update({f"layers.{i}.{name}.{leaf}": p for name, p in
                                    zip(("query", "key", "value"), parts, strict=True) if p is not None})
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not fit the BERT layout (missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]})")


_EMBEDDINGS = {"embeddings.word_embeddings": "word", "embeddings.position_embeddings": "position",
               "embeddings.token_type_embeddings": "token_type", "embeddings.LayerNorm": "norm"}
_LAYER = {"attention.self.query": "query", "attention.self.key": "key", "attention.self.value": "value",
          "attention.output.dense": "attention_out", "attention.output.LayerNorm": "attention_norm",
          "intermediate.dense": "intermediate", "output.dense": "out", "output.LayerNorm": "out_norm"}


def _rename(key: str) -> str:
    """A Hugging Face BERT weight name -> this module's (``encoder.layer.3.output.dense.weight`` ->
    ``layers.3.out.weight``); an unknown name is returned as is (and then refused by ``load_state_dict``)."""
    stem, _, leaf = key.rpartition(".")
    if stem in _EMBEDDINGS:
        return f"{_EMBEDDINGS[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) > 3 and parts[0] == "encoder" and parts[1] == "layer":
        inner = ".".join(parts[3:])
        if inner in _LAYER:
            return f"layers.{parts[2]}.{_LAYER[inner]}.{leaf}"
    return key


Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def varlen_attention(cu_lengths: torch.Tensor, max_length: int) -> Attention:
    """Attention within each text of a packed batch: q, k, v (tokens, heads, d) -> (tokens, heads, d), text i
    being tokens ``cu_lengths[i]:cu_lengths[i + 1]`` (int32, texts + 1 entries), none longer than
    ``max_length``. On CUDA in 16-bit floats, torch's variable-length flash attention (no mask, no padding);
    elsewhere `padded_attention`, the same result through a padded copy."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if _takes_varlen(q):
            return cast(torch.Tensor, _varlen(q, k, v, cu_lengths, cu_lengths, max_length, max_length))
        return padded_attention(q, k, v, cu_lengths, max_length)
    return attend


def _takes_varlen(q: torch.Tensor) -> bool:
    """Whether torch's variable-length flash attention takes ``q`` (CUDA, 16-bit floats, a torch that has it)."""
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and _varlen is not None


def varlen_available() -> bool:
    """Whether this torch has variable-length flash attention (`varlen_attention`'s fast path on CUDA)."""
    return _varlen is not None


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_lengths: torch.Tensor,
                     max_length: int) -> torch.Tensor:
    """`varlen_attention`'s result the plain way: each text's tokens gathered into a (texts, max_length) padded
    layout, attention with a key mask, the real rows scattered back (the reference, and the CPU's path)."""
    starts, lengths = cu_lengths[:-1].long(), (cu_lengths[1:] - cu_lengths[:-1]).long()
    steps = torch.arange(max_length, device=q.device)
    real = steps < lengths[:, None]  # (texts, max_length)
    index = torch.where(real, starts[:, None] + steps, 0)

    def padded(t: torch.Tensor) -> torch.Tensor:
        return t[index].transpose(1, 2)  # (texts, heads, max_length, d)

    context = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), attn_mask=real[:, None, None, :])
    out = torch.empty_like(q)
    out[index[real]] = context.transpose(1, 2)[real]
    return out


def mean_pool_normalized(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' mean pooling over the real tokens, then L2 normalisation; in float32 whatever the
    model's dtype."""
    weights = mask.unsqueeze(-1).to(torch.float32)
    summed = (hidden.to(torch.float32) * weights).sum(dim=1)
    pooled = summed / weights.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, p=2.0, dim=1)


# Attention backends for a stream of ever new input shapes: every one but cuDNN's, which builds a graph for each new
# shape (in bfloat16 that made the model alone 10x slower than float32 on an H200 until the shapes repeated).
STREAM_ATTENTION = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends() -> contextlib.AbstractContextManager[None]:
    """The backends `torch.nn.functional.scaled_dot_product_attention` may choose from while a batch runs (the
    CPU's are all among them)."""
    return sdpa_kernel(list(STREAM_ATTENTION))
