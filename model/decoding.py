"""Greedy and batched beam search (Sec. 6.1: beam 4, length penalty 0.6), with incremental state."""

from __future__ import annotations

import torch
from torch import Tensor

from .transformer import DecoderState, Transformer

MAX_LEN_OFFSET = 50  # the paper's maximum output length: input length + 50


def _max_lengths(model: Transformer, src: Tensor, max_len: int | None) -> Tensor:
    """Per-sentence output length limit (excluding eos): src length + 50, or max_len if given.

    Never past the positional table: the token fed at step t sits at position t (bos at 0).
    """
    if max_len is not None:
        limits = torch.full((src.shape[0],), max_len, dtype=torch.long, device=src.device)
    else:
        limits = (src != model.cfg.pad_id).sum(dim=1) + MAX_LEN_OFFSET
    return limits.clamp(max=model.cfg.max_positions - 1)


def _restrict(model: Transformer, scores: Tensor, state: DecoderState, max_lens: Tensor) -> Tensor:
    """Ban pad and bos, and force eos on rows at their length limit, in place on scores [rows, vocab]."""
    cfg = model.cfg
    scores[:, cfg.pad_id] = float("-inf")
    scores[:, cfg.bos_id] = float("-inf")
    at_limit = max_lens <= state.step - 1  # state.step - 1 tokens have been generated
    if at_limit.any():
        eos_score = scores[at_limit, cfg.eos_id].clone()
        scores[at_limit] = float("-inf")
        scores[at_limit, cfg.eos_id] = eos_score
    return scores


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, max_len: int | None = None) -> list[list[int]]:
    """Most likely next token at each step; returns token ids per sentence, without bos/eos."""
    cfg, batch = model.cfg, src.shape[0]
    state = model.start_decoding(src)
    max_lens = _max_lengths(model, src, max_len)
    tokens = torch.full((batch,), cfg.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    outputs: list[Tensor] = []
    while not finished.all():
        tokens = _restrict(model, model.decode_step(tokens, state).float(), state, max_lens).argmax(dim=-1)
        tokens = tokens.masked_fill(finished, cfg.eos_id)  # finished rows only repeat eos
        outputs.append(tokens)
        finished |= tokens == cfg.eos_id
    steps = torch.stack(outputs, dim=1).tolist()
    return [row[: row.index(cfg.eos_id)] for row in steps]


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), used by the paper."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_len: int | None = None) -> list[list[int]]:
    """Batched beam search; returns the best hypothesis per sentence, without bos/eos.

    Each step scores beam_size x vocab continuations per sentence and keeps the 2 * beam
    best: those ending in eos (within the top beam) are finished with the score
    log P / lp(length); the best beam_size others stay alive. A sentence is done once it
    has beam_size finished hypotheses, and its rows leave the batch; decoding stops when
    every sentence is done.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    cfg, batch, device = model.cfg, src.shape[0], src.device
    k = beam_size
    # Every sentence is k consecutive rows that share its memory; only the first beam is live
    # at step 0 so the k beams do not all pick the same first token.
    state = model.start_decoding(src)
    max_lens = _max_lengths(model, src, max_len).repeat_interleave(k)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    tokens = torch.full((batch * k, 1), cfg.bos_id, dtype=torch.long, device=device)
    active = torch.arange(batch, device=device)  # original indices of sentences still decoding
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    num_finished = torch.zeros(batch, dtype=torch.long, device=device)  # per active sentence

    while active.numel():
        num_active = active.numel()
        log_probs = _restrict(model, model.decode_step(tokens[:, -1], state).float().log_softmax(dim=-1),
                              state, max_lens)
        vocab = log_probs.shape[-1]
        candidates = log_probs.add_(scores.view(-1, 1)).view(num_active, k * vocab)  # in place: no new [rows, vocab]
        cand_scores, cand_index = candidates.topk(2 * k, dim=-1)  # [active, 2k]
        cand_beam, cand_token = cand_index // vocab, cand_index % vocab
        is_eos = cand_token == cfg.eos_id

        # Finish hypotheses that end in eos among the top k candidates.
        length = state.step  # tokens generated, counting this step's eos
        for sent, rank in (is_eos[:, :k]).nonzero().tolist():
            row = sent * k + cand_beam[sent, rank].item()
            hypothesis = tokens[row, 1:].tolist()
            normalized = cand_scores[sent, rank].item() / length_penalty(length, alpha)
            finished[active[sent].item()].append((normalized, hypothesis))

        # The k best candidates that do not end in eos stay alive.
        alive_scores, alive_rank = cand_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=-1)
        alive_beam = cand_beam.gather(1, alive_rank)
        alive_token = cand_token.gather(1, alive_rank)
        rows = (torch.arange(num_active, device=device)[:, None] * k + alive_beam).view(-1)

        num_finished += is_eos[:, :k].sum(dim=1)
        keep = (num_finished < k).nonzero().squeeze(1)
        if keep.numel() < num_active:  # drop finished sentences from the batch
            active, num_finished = active[keep], num_finished[keep]
            alive_scores, alive_token = alive_scores[keep], alive_token[keep]
            rows = rows.view(num_active, k)[keep].view(-1)
            state.select(rows, sources=keep)
            max_lens = max_lens[rows]
        else:
            state.select(rows)
        scores = alive_scores
        tokens = torch.cat([tokens[rows], alive_token.view(-1, 1)], dim=1)

    return [max(hyps, key=lambda h: h[0])[1] for hyps in finished]
