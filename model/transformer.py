"""The encoder-decoder Transformer of Figure 1, with incremental decoding state."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .config import TransformerConfig
from .layers import (
    DecoderLayer,
    EncoderLayer,
    KeyValue,
    LearnedPositionalEncoding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
)


class Embeddings(nn.Module):
    """Token embeddings scaled by sqrt(d_model) plus positional encodings, then dropout (Sec. 3.4-3.5)."""

    def __init__(self, token_embedding: nn.Embedding, positions: nn.Module, dropout: float):
        super().__init__()
        self.token_embedding = token_embedding
        self.positions = positions  # shared by encoder and decoder: it has no state to learn
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(token_embedding.embedding_dim)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """tokens: [batch, len] -> [batch, len, d_model], positions starting at offset."""
        x = self.token_embedding(tokens) * self.scale
        return self.dropout(x + self.positions(tokens.shape[1], offset))


class Encoder(nn.Module):
    """A stack of N encoder layers; maps source tokens to the memory the decoder attends to."""

    def __init__(self, cfg: TransformerConfig, embed: Embeddings):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers))
        # Pre-norm leaves the residual stream unnormalised, so it ends with a LayerNorm.
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src: [batch, src_len] -> memory [batch, src_len, d_model]."""
        x = self.embed(src)
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of N decoder layers and the pre-softmax projection to the target vocabulary."""

    def __init__(self, cfg: TransformerConfig, embed: Embeddings, generator: nn.Linear):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
        self.generator = generator

    def project_memory(self, memory: Tensor) -> list[KeyValue]:
        """Cross-attention keys and values of every layer, computed once per source."""
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def forward(self, tgt: Tensor, memory_kv: list[KeyValue], src_mask: Tensor,
                cache: list[KeyValue] | None = None, offset: int = 0) -> tuple[Tensor, list[KeyValue]]:
        """tgt: [batch, len] (len 1 when incremental) -> hidden states [batch, len, d_model] and the new cache.

        The pre-softmax projection is left to the caller, which may need it for the last position only.
        """
        x = self.embed(tgt, offset)
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(x, memory_kv[i], src_mask, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        return self.norm(x), new_cache


@dataclass
class DecoderState:
    """What incremental decoding carries between steps: the memory once per source, the cache once per hypothesis."""

    memory_kv: list[KeyValue]  # per decoder layer, [sources, heads, src_len, d_k]
    src_mask: Tensor  # [sources, 1, 1, src_len]
    cache: list[KeyValue] | None = None  # per decoder layer, [rows, heads, steps, d_k]
    step: int = 0  # number of target tokens fed so far

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep (and reorder) the hypotheses' rows; with sources, keep only those sources' memory.

        The memory has one row per source, shared by the source's consecutive hypothesis rows
        (its beams), so a reorder within sources leaves it alone; dropping finished sources
        selects it too.
        """
        if sources is not None:
            self.memory_kv = [(k.index_select(0, sources), v.index_select(0, sources)) for k, v in self.memory_kv]
            self.src_mask = self.src_mask.index_select(0, sources)
        if self.cache is not None:
            self.cache = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cache]


class Transformer(nn.Module):
    """The Transformer (Fig. 1): Transformer(cfg)(src, tgt_in) -> logits [batch, tgt_len, vocab]."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        positional = SinusoidalPositionalEncoding if cfg.positional_encoding == "sinusoidal" \
            else LearnedPositionalEncoding
        positions = positional(cfg.d_model, cfg.max_positions)
        src_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        tie_all = cfg.tie_embeddings and cfg.shared_vocab
        tgt_tokens = src_tokens if tie_all else nn.Embedding(cfg.target_vocab_size, cfg.d_model,
                                                             padding_idx=cfg.pad_id)
        generator = nn.Linear(cfg.d_model, cfg.target_vocab_size, bias=not cfg.tie_embeddings)
        self.encoder = Encoder(cfg, Embeddings(src_tokens, positions, cfg.dropout))
        self.decoder = Decoder(cfg, Embeddings(tgt_tokens, positions, cfg.dropout), generator)
        self._reset_parameters()
        if cfg.tie_embeddings:  # the pre-softmax weights are the target embedding (Sec. 3.4)
            generator.weight = tgt_tokens.weight

    def _reset_parameters(self) -> None:
        """Xavier-uniform projections; embeddings N(0, d_model^-0.5) so that x sqrt(d_model) is unit scale."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.d_model ** -0.5)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()

    def source_mask(self, src: Tensor) -> Tensor:
        """[batch, 1, 1, src_len], True where a key is a real token (not padding)."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder's memory [batch, src_len, d_model] and the source padding mask."""
        src_mask = self.source_mask(src)
        return self.encoder(src, src_mask), src_mask

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits: src [batch, src_len], tgt_in [batch, tgt_len] -> [batch, tgt_len, vocab]."""
        memory, src_mask = self.encode(src)
        hidden, _ = self.decoder(tgt_in, self.decoder.project_memory(memory), src_mask)
        return self.decoder.generator(hidden)

    def start_decoding(self, src: Tensor) -> DecoderState:
        """Encode the source once and return the state that decode_step grows."""
        memory, src_mask = self.encode(src)
        return DecoderState(self.decoder.project_memory(memory), src_mask)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feed one target token per row ([rows], g consecutive rows per source); returns logits [rows, vocab]."""
        hidden, state.cache = self.decoder(
            tokens[:, None], state.memory_kv, state.src_mask, state.cache, offset=state.step
        )
        state.step += 1
        return self.decoder.generator(hidden[:, -1])

    def attention_modules(self) -> dict[str, MultiHeadAttention]:
        """Every attention sublayer by name ("encoder.0.self_attn", ...), for attention plots."""
        return {name: m for name, m in self.named_modules() if isinstance(m, MultiHeadAttention)}

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
