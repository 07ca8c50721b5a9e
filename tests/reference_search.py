"""The beam search as it was before it was made faster (commit 44d2fe2), kept as the oracle of equality tests.

Every beam gets its own copy of the source's memory and attends alone; finished sentences are
counted in Python; each step ranks all beam x vocab log-probabilities. `model.beam_search` must
return exactly what this returns.
"""

import torch

from model.decoding import length_penalty


@torch.no_grad()
def reference_beam_search(model, src, beam_size, alpha=0.6, max_len=None):
    """Best hypothesis per sentence (token ids without bos/eos), as model.beam_search computed it at 44d2fe2."""
    cfg, batch, k = model.cfg, src.shape[0], beam_size
    state = model.start_decoding(src)
    per_beam = torch.arange(batch).repeat_interleave(k)
    state.select(per_beam, sources=per_beam)  # a copy of the memory per beam
    limit = (src != cfg.pad_id).sum(dim=1) + 50 if max_len is None else torch.full((batch,), max_len)
    max_lens = limit.repeat_interleave(k)
    scores = torch.full((batch, k), float("-inf"))
    scores[:, 0] = 0.0
    tokens = torch.full((batch * k, 1), cfg.bos_id, dtype=torch.long)
    active = torch.arange(batch)
    finished = [[] for _ in range(batch)]
    while active.numel():
        n = active.numel()
        log_probs = model.decode_step(tokens[:, -1], state).float().log_softmax(dim=-1)
        log_probs[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")
        at_limit = max_lens <= state.step - 1
        if at_limit.any():
            eos = log_probs[at_limit, cfg.eos_id].clone()
            log_probs[at_limit] = float("-inf")
            log_probs[at_limit, cfg.eos_id] = eos
        vocab = log_probs.shape[-1]
        cand_scores, cand_index = (scores.view(-1, 1) + log_probs).view(n, k * vocab).topk(2 * k, dim=-1)
        cand_beam, cand_token = cand_index // vocab, cand_index % vocab
        is_eos = cand_token == cfg.eos_id
        for sent, rank in is_eos[:, :k].nonzero().tolist():
            row = sent * k + cand_beam[sent, rank].item()
            score = cand_scores[sent, rank].item() / length_penalty(state.step, alpha)
            finished[active[sent].item()].append((score, tokens[row, 1:].tolist()))
        alive_scores, alive_rank = cand_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=-1)
        alive_token = cand_token.gather(1, alive_rank)
        rows = (torch.arange(n)[:, None] * k + cand_beam.gather(1, alive_rank)).view(-1)
        keep = torch.tensor([len(finished[s]) < k for s in active.tolist()]).nonzero().squeeze(1)
        if keep.numel() < n:
            active, alive_scores, alive_token = active[keep], alive_scores[keep], alive_token[keep]
            rows = rows.view(n, k)[keep].view(-1)
            max_lens = max_lens[rows]
        state.select(rows, sources=rows)
        scores = alive_scores
        tokens = torch.cat([tokens[rows], alive_token.view(-1, 1)], dim=1)
    return [max(hyps, key=lambda h: h[0])[1] for hyps in finished]
