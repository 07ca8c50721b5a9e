"""The Transformer's forward pass: masks, incremental decoding and equivalence with nn.Transformer."""

import pytest
import torch
from reference_search import reference_beam_search
from torch import nn

from model import Transformer, TransformerConfig, beam_search, greedy_search

PAD, BOS, EOS = 0, 2, 3


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    values = dict(vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_layers=2, dropout=0.0)
    values.update(overrides)
    return Transformer(TransformerConfig.preset("tiny", **values)).eval()


def random_batch(batch=4, src_len=9, tgt_len=7, vocab=40, seed=1):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=gen)
    tgt = torch.randint(4, vocab, (batch, tgt_len), generator=gen)
    src[1, 6:] = PAD  # ragged source lengths
    src[2, 3:] = PAD
    tgt[:, 0] = BOS
    return src, tgt


VARIANTS = [
    pytest.param({}, id="post-norm"),
    pytest.param({"norm_first": True}, id="pre-norm"),
    pytest.param({"positional_encoding": "learned", "tie_embeddings": False}, id="learned-untied"),
]


def test_forward_returns_logits_batch_by_length_by_vocab():
    model = make_model()
    src, tgt = random_batch()
    assert model(src, tgt).shape == (4, 7, 40)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_no_future_leakage(overrides):
    model = make_model(**overrides)
    src, tgt = random_batch()
    logits = model(src, tgt)
    for t in range(1, tgt.shape[1]):
        changed = tgt.clone()
        changed[:, t:] = torch.randint(4, 40, changed[:, t:].shape)
        assert torch.allclose(model(src, changed)[:, :t], logits[:, :t], atol=1e-5)
        # Sanity: the changed positions themselves do see the change.
        assert not torch.allclose(model(src, changed)[:, t:], logits[:, t:], atol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_padding_changes_no_real_position(overrides):
    model = make_model(**overrides)
    src, tgt = random_batch()
    logits = model(src, tgt)
    padded_src = torch.cat([src, torch.full((4, 5), PAD)], dim=1)
    padded_tgt = torch.cat([tgt, torch.full((4, 3), PAD)], dim=1)
    padded_logits = model(padded_src, padded_tgt)
    assert torch.allclose(padded_logits[:, : tgt.shape[1]], logits, atol=1e-5)
    # Each sentence alone, without the batch's padding, gives the same result as in the batch.
    for i in range(src.shape[0]):
        length = int((src[i] != PAD).sum())
        alone = model(src[i: i + 1, :length], tgt[i: i + 1])
        assert torch.allclose(alone[0], logits[i], atol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_incremental_decoding_equals_the_full_forward_pass(overrides):
    model = make_model(**overrides)
    src, tgt = random_batch()
    full = model(src, tgt)
    state = model.start_decoding(src)
    steps = [model.decode_step(tgt[:, t], state) for t in range(tgt.shape[1])]
    assert torch.allclose(torch.stack(steps, dim=1), full, atol=1e-5)
    assert state.step == tgt.shape[1]
    assert state.cache[0][0].shape == (4, 4, tgt.shape[1], 8)  # [batch, heads, steps, d_k]


def _tensor_transformer_with_our_weights(model, cfg):
    """A torch.nn.Transformer holding exactly our layers' weights."""
    common = dict(d_model=cfg.d_model, nhead=cfg.num_heads, dim_feedforward=cfg.d_ff, dropout=0.0,
                  batch_first=True, norm_first=cfg.norm_first, layer_norm_eps=cfg.layer_norm_eps)
    final = (lambda: nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)) if cfg.norm_first else (lambda: None)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**common), cfg.num_encoder_layers,
                                    norm=final(), enable_nested_tensor=False)
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**common), cfg.num_decoder_layers,
                                    norm=final())
    reference = nn.Transformer(**common, custom_encoder=encoder, custom_decoder=decoder)

    def copy_attention(ours, theirs):
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.load_state_dict(ours.out_proj.state_dict())

    with torch.no_grad():
        for ours, theirs in zip(model.encoder.layers, encoder.layers):
            copy_attention(ours.self_attn, theirs.self_attn)
            theirs.linear1.load_state_dict(ours.feed_forward.w_1.state_dict())
            theirs.linear2.load_state_dict(ours.feed_forward.w_2.state_dict())
            theirs.norm1.load_state_dict(ours.sublayer[0].norm.state_dict())
            theirs.norm2.load_state_dict(ours.sublayer[1].norm.state_dict())
        for ours, theirs in zip(model.decoder.layers, decoder.layers):
            copy_attention(ours.self_attn, theirs.self_attn)
            copy_attention(ours.cross_attn, theirs.multihead_attn)
            theirs.linear1.load_state_dict(ours.feed_forward.w_1.state_dict())
            theirs.linear2.load_state_dict(ours.feed_forward.w_2.state_dict())
            for j, norm in enumerate((theirs.norm1, theirs.norm2, theirs.norm3)):
                norm.load_state_dict(ours.sublayer[j].norm.state_dict())
        if cfg.norm_first:
            encoder.norm.load_state_dict(model.encoder.norm.state_dict())
            decoder.norm.load_state_dict(model.decoder.norm.state_dict())
    return reference.train()  # train mode with dropout 0: the plain path, not the fused fast path


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_numerically_equal_to_torch_nn_transformer(norm_first):
    model = make_model(norm_first=norm_first, seed=3)
    cfg = model.cfg
    reference = _tensor_transformer_with_our_weights(model, cfg)
    src, tgt = random_batch()
    with torch.no_grad():
        ours = model(src, tgt)
        hidden = reference(
            model.encoder.embed(src), model.decoder.embed(tgt),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]),
            src_key_padding_mask=src == PAD, memory_key_padding_mask=src == PAD,
        )
        theirs = model.decoder.generator(hidden)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


def test_beam_of_one_equals_greedy():
    model = make_model(seed=5)
    src, _ = random_batch(batch=6, seed=7)
    greedy = greedy_search(model, src, max_len=12)
    assert greedy == beam_search(model, src, beam_size=1, max_len=12)
    assert any(len(h) > 0 for h in greedy)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batched_search_equals_one_sentence_at_a_time(beam_size):
    model = make_model(seed=11)
    src, _ = random_batch(batch=5, seed=13)
    batched = beam_search(model, src, beam_size=beam_size)
    for i in range(src.shape[0]):
        length = int((src[i] != PAD).sum())
        assert beam_search(model, src[i: i + 1, :length], beam_size=beam_size) == [batched[i]]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_beam_search_returns_what_the_reference_search_returns(overrides):
    # The reference copies the memory per beam and ranks every beam x vocab log-probability;
    # the search shares the memory between a source's beams: the same hypotheses, to the token.
    for seed, vocab, beam in ((21, 40, 4), (22, 300, 5), (23, 1000, 2)):
        model = make_model(seed=seed, vocab_size=vocab, **overrides)
        src, _ = random_batch(batch=12, src_len=11, vocab=vocab, seed=seed)
        for max_len in (None, 6):
            expected = reference_beam_search(model, src, beam, max_len=max_len)
            assert beam_search(model, src, beam_size=beam, max_len=max_len) == expected


def test_outputs_respect_the_length_limits_and_contain_no_special_tokens():
    model = make_model(seed=2)
    src, _ = random_batch(batch=4, seed=3)
    for hyps in (beam_search(model, src, max_len=5), greedy_search(model, src, max_len=5)):
        assert all(len(h) <= 5 for h in hyps)
        assert not {PAD, BOS, EOS} & {t for h in hyps for t in h}
    source_lengths = (src != PAD).sum(dim=1).tolist()
    for hyp, length in zip(beam_search(model, src), source_lengths):
        assert len(hyp) <= length + 50


def test_outputs_stop_at_the_last_position_the_model_has():
    model = make_model(seed=2, max_positions=12)  # src length + 50 would run far past position 11
    def no_eos(module, inputs, logits):  # eos only when forced: every output runs to its limit
        logits[..., EOS] -= 1e4

    model.decoder.generator.register_forward_hook(no_eos)
    src, _ = random_batch(batch=4, seed=3)
    searches = (beam_search(model, src, beam_size=3), greedy_search(model, src), greedy_search(model, src, max_len=40))
    for hyps in searches:
        assert max(len(h) for h in hyps) == 11


def test_beam_search_rejects_a_beam_of_zero():
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(make_model(), random_batch()[0], beam_size=0)


def test_stored_attention_weights_are_rows_that_sum_to_one_and_change_nothing():
    model = make_model()
    src, tgt = random_batch()
    expected = model(src, tgt)
    for module in model.attention_modules().values():
        module.store_attention = True
    assert torch.allclose(model(src, tgt), expected, atol=1e-5)
    cross = model.attention_modules()["decoder.layers.0.cross_attn"].last_attention
    assert cross.shape == (4, 4, 7, 9)  # [batch, heads, tgt_len, src_len]
    assert torch.allclose(cross.sum(-1), torch.ones(4, 4, 7), atol=1e-5)
    assert cross[2, :, :, 3:].abs().max() == 0  # padding gets no attention
    self_attn = model.attention_modules()["decoder.layers.1.self_attn"].last_attention
    assert torch.triu(self_attn[0, 0], diagonal=1).abs().max() == 0  # causal
