"""The Transformer's building blocks, one class per concept of the paper (Section 3)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import TransformerConfig

# A layer's cached self-attention keys and values, each [batch, heads, steps, d_k].
KeyValue = tuple[Tensor, Tensor]


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Sec. 3.2.2): h scaled dot-product attentions (Eq. 1) in parallel."""

    def __init__(self, d_model: int, num_heads: int, attention_dropout: float = 0.0):
        super().__init__()
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.attention_dropout = attention_dropout
        # W^Q, W^K, W^V of all heads stacked in one [3 * d_model, d_model] matrix, as in
        # nn.MultiheadAttention: self-attention projects with a single matmul.
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)  # W^O
        self.store_attention = False  # set True to keep the weights for plots (slower)
        self.last_attention: Tensor | None = None

    def split_heads(self, x: Tensor) -> Tensor:
        """[batch, len, d_model] -> [batch, heads, len, d_k]."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_k).transpose(1, 2)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of self-attention, each [batch, heads, len, d_k]."""
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        """Queries only (cross-attention), [batch, heads, len, d_k]."""
        d = self.d_model
        return self.split_heads(F.linear(x, self.in_proj.weight[:d], self.in_proj.bias[:d]))

    def project_kv(self, memory: Tensor) -> KeyValue:
        """Keys and values of the encoder output (cross-attention), computed once per sentence."""
        d = self.d_model
        kv = F.linear(memory, self.in_proj.weight[d:], self.in_proj.bias[d:])
        k, v = kv.chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               is_causal: bool = False) -> Tensor:
        """softmax(QK^T / sqrt(d_k)) V for every head, concatenated and projected by W^O.

        q may have g times the rows of k and v: then each g consecutive query rows (the g beams of
        one source in beam search) attend to one source's keys together, in one matrix product.
        """
        rows, _, length, _ = q.shape
        sources = k.shape[0]
        group = rows // sources
        # [sources * g, heads, len, d_k] -> [sources, heads, g * len, d_k]; a view when g is 1.
        q = q.view(sources, group, self.num_heads, length, self.d_k).transpose(1, 2).reshape(
            sources, self.num_heads, group * length, self.d_k)
        dropout_p = self.attention_dropout if self.training else 0.0
        if self.store_attention:
            weights = self._weights(q, k, mask, is_causal)
            self.last_attention = weights.detach()
            heads = weights @ v
        elif length == 1 and q.device.type == "cpu" and not (dropout_p or is_causal):
            # A decoding step (one query per row): two small matmuls are faster on CPU than the
            # fused kernel, whose set-up per call dominates at this size.
            heads = self._weights(q, k, mask, is_causal) @ v
        else:
            heads = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )  # [sources, heads, g * len, d_k]
        heads = heads.view(sources, self.num_heads, group, length, self.d_k).permute(0, 2, 3, 1, 4)
        return self.out_proj(heads.reshape(rows, length, self.d_model))

    def _weights(self, q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """softmax(QK^T / sqrt(d_k)) computed explicitly, [batch, heads, len_q, len_k]."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if is_causal:
            len_q, len_k = scores.shape[-2:]
            causal = torch.ones(len_q, len_k, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.relu(self.w_1(x)))


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (Sec. 3.5)."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        position = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)
        inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        table = torch.zeros(max_positions, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(position * inv_freq)
        table[:, 1::2] = torch.cos(position * inv_freq)[:, : d_model // 2]
        # Not a parameter and not saved: it is a pure function of the config.
        self.register_buffer("table", table.float(), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset + length - 1, [length, d_model]."""
        if offset + length > self.table.shape[0]:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_positions="
                f"{self.table.shape[0]}; raise TransformerConfig.max_positions"
            )
        return self.table[offset: offset + length]


class LearnedPositionalEncoding(nn.Module):
    """Learned position embeddings, the variant of Table 3 row (E)."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model ** -0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Embeddings of positions offset .. offset + length - 1, [length, d_model]."""
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_positions="
                f"{self.embedding.num_embeddings}; raise TransformerConfig.max_positions"
            )
        positions = torch.arange(offset, offset + length, device=self.embedding.weight.device)
        return self.embedding(positions)


class SublayerConnection(nn.Module):
    """Residual + LayerNorm around a sublayer: LayerNorm(x + Dropout(Sublayer(x))) (Sec. 3.1, 5.4).

    With norm_first, the pre-norm variant x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


def _sublayers(cfg: TransformerConfig, count: int) -> list[SublayerConnection]:
    """The residual connections around a layer's sublayers, as the config sets them (post- or pre-norm)."""
    return [SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.layer_norm_eps) for _ in range(count)]


class EncoderLayer(nn.Module):
    """One encoder layer (Fig. 1, left): self-attention, then the feed-forward network."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.attention_dropout)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff)
        self.sublayer = nn.ModuleList(_sublayers(cfg, 2))

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        """x: [batch, src_len, d_model]; src_mask: [batch, 1, 1, src_len], True = real token."""
        x = self.sublayer[0](x, lambda y: self.self_attn.attend(*self.self_attn.project_qkv(y), src_mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    """One decoder layer (Fig. 1, right): masked self-attention, cross-attention, feed-forward."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.attention_dropout)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff)
        self.sublayer = nn.ModuleList(_sublayers(cfg, 3))

    def forward(self, x: Tensor, memory_kv: KeyValue, src_mask: Tensor | None,
                cache: KeyValue | None = None) -> tuple[Tensor, KeyValue]:
        """x: [batch, new_len, d_model]; returns the output and the grown self-attention cache.

        Without a cache, the causal mask stops position i from attending to positions > i.
        With a cache (incremental decoding), x holds only the newest position, which may
        attend to every cached one, so no mask is needed.
        """
        new_cache: list[KeyValue] = []

        def masked_self_attention(y: Tensor) -> Tensor:
            q, k, v = self.self_attn.project_qkv(y)
            if cache is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            new_cache.append((k, v))
            # Padding after the last real target token needs no mask: under the causal mask
            # no real position ever attends to a later (padded) one.
            is_causal = False
            if cache is None and y.shape[1] > 1:  # a branch: compiled with dynamic shapes, the test is symbolic
                is_causal = True  # and SDPA takes only a plain bool
            return self.self_attn.attend(q, k, v, is_causal=is_causal)

        def cross_attention(y: Tensor) -> Tensor:
            return self.cross_attn.attend(self.cross_attn.project_q(y), *memory_kv, src_mask)

        x = self.sublayer[0](x, masked_self_attention)
        x = self.sublayer[1](x, cross_attention)
        return self.sublayer[2](x, self.feed_forward), new_cache[0]
