"""The paper's formulas (positions, schedule, label smoothing), checkpoint averaging, and real learning."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import (
    Transformer,
    TransformerConfig,
    average_checkpoints,
    cooldown_factor,
    greedy_search,
    label_smoothed_cross_entropy,
    transformer_lr,
    warmup_schedule,
)
from model.layers import SinusoidalPositionalEncoding

PAD, BOS, EOS = 0, 2, 3


def test_positional_encoding_equals_the_paper_formula():
    d_model = 16
    table = SinusoidalPositionalEncoding(d_model, max_positions=100)(100)
    for pos in (0, 1, 7, 42, 99):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positions_beyond_the_table_are_a_clear_error():
    with pytest.raises(ValueError, match="max_positions"):
        SinusoidalPositionalEncoding(8, max_positions=10)(5, offset=6)


def test_schedule_equals_equation_3():
    d_model, warmup = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        expected = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        assert transformer_lr(step, d_model, warmup) == pytest.approx(expected)
    # Linear increase during warmup, peak at warmup_steps, then inverse square root decay.
    rates = [transformer_lr(s, d_model, warmup) for s in range(1, 20_000)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup
    assert transformer_lr(2, d_model, warmup, scale=2.0) == pytest.approx(2 * transformer_lr(2, d_model, warmup))


def test_cooldown_holds_then_falls_linearly_to_zero_at_the_end():
    assert [cooldown_factor(done, 0.2) for done in (0.0, 0.5, 0.8, 0.9, 1.0, 1.5)] == pytest.approx(
        [1.0, 1.0, 1.0, 0.5, 0.0, 0.0])
    assert cooldown_factor(0.99, 0.0) == 1.0  # no cooldown: Eq. 3 to the end


def test_warmup_schedule_drives_the_optimizer_by_equation_3():
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([param], lr=123.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = warmup_schedule(optimizer, d_model=64, warmup_steps=10, scale=0.5)
    for step in range(1, 30):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(transformer_lr(step, 64, 10, 0.5))
        optimizer.step()
        scheduler.step()
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_schedule(optimizer, d_model=64, warmup_steps=0)


def test_label_smoothed_loss_and_its_gradient_equal_pytorchs_cross_entropy():
    torch.manual_seed(0)
    logits = (3 * torch.randn(4, 7, 50)).requires_grad_()
    target = torch.randint(4, 50, (4, 7))
    target[2, 4:] = PAD
    reference = logits.detach().clone().requires_grad_()
    expected = F.cross_entropy(reference.view(-1, 50), target.view(-1), ignore_index=PAD, label_smoothing=0.1,
                               reduction="sum")
    (expected * 0.5).backward()
    loss, nll, _ = label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    (loss * 0.5).backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert nll.item() == pytest.approx(F.cross_entropy(reference.view(-1, 50), target.view(-1), ignore_index=PAD,
                                                       reduction="sum").item(), rel=1e-5)
    assert torch.allclose(logits.grad, reference.grad, atol=1e-6)
    assert not logits.grad[2, 4:].any()  # padded positions get no gradient


def test_label_smoothed_loss_ignores_padding_and_matches_its_definition():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.randint(4, 11, (2, 5))
    target[1, 3:] = PAD
    loss, nll, count = label_smoothed_cross_entropy(logits, target, epsilon=0.1, pad_id=PAD)
    assert count.item() == 8
    log_probs = logits.log_softmax(-1)
    real = target != PAD
    token_nll = -log_probs.gather(-1, target[..., None]).squeeze(-1)
    smooth = -log_probs.mean(-1)  # uniform prior over the vocabulary
    expected = ((0.9 * token_nll + 0.1 * smooth) * real).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert nll.item() == pytest.approx((token_nll * real).sum().item(), rel=1e-5)
    # Whatever the model says at padded positions does not matter.
    noisy = logits.clone()
    noisy[1, 3:] = 100 * torch.randn(2, 11)
    assert label_smoothed_cross_entropy(noisy, target, 0.1, PAD)[0].item() == pytest.approx(loss.item())
    no_smoothing = label_smoothed_cross_entropy(logits, target, 0.0, PAD)[0]
    assert no_smoothing.item() == pytest.approx(nll.item(), rel=1e-6)


def test_average_checkpoints_is_the_elementwise_mean():
    first = {"w": torch.tensor([1.0, 2.0]), "step": torch.tensor(3)}
    second = {"w": torch.tensor([3.0, 6.0]), "step": torch.tensor(3)}
    averaged = average_checkpoints([first, second])
    assert torch.equal(averaged["w"], torch.tensor([2.0, 4.0]))
    assert averaged["w"].dtype == torch.float32 and averaged["step"].item() == 3
    with pytest.raises(ValueError, match="different parameters"):
        average_checkpoints([first, {"v": torch.zeros(2)}])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])


def _reverse_batch(gen, batch, vocab):
    """Random sequences of 3..8 symbols and their reversal, as padded src / tgt_in / tgt_out."""
    lengths = torch.randint(3, 9, (batch,), generator=gen)
    src = torch.full((batch, 10), PAD)
    tgt = torch.full((batch, 12), PAD)
    for i, n in enumerate(lengths.tolist()):
        seq = torch.randint(4, vocab, (n,), generator=gen)
        src[i, :n] = seq
        tgt[i, 0], tgt[i, 1: n + 1], tgt[i, n + 1] = BOS, seq.flip(0), EOS
    return src, tgt[:, :-1], tgt[:, 1:]


# Seeds spread more than CPUs do: `python benchmarks/reverse_seeds.py` gave 0.94 to 1.0 over seeds 0-7 on
# two threads of a 2-core machine of this project's kind (as `make test` trains it), 0.935 to 1.0 on one;
# seed 0, the test's: 1.0 and 0.955 there, 0.985 on two threads of a host with AMX. The floor sits under the
# lowest seed; an untrained model scores 0.
REVERSE_FLOOR = 0.90


def reverse_exact_match(seed: int) -> float:
    """Exact match on 200 held-out sequences after 800 updates of a small Transformer (seeded by `seed`)."""
    torch.manual_seed(seed)
    vocab = 36
    cfg = TransformerConfig.preset("tiny", vocab_size=vocab, d_model=64, d_ff=128, num_heads=4,
                                   num_layers=2, dropout=0.0, label_smoothing=0.0)
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    scheduler = warmup_schedule(optimizer, cfg.d_model, warmup_steps=50, scale=0.25)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(800):
        src, tgt_in, tgt_out = _reverse_batch(gen, 64, vocab)
        loss, _, count = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, 0.0, PAD)
        optimizer.zero_grad()
        (loss / count).backward()
        optimizer.step()
        scheduler.step()
    model.eval()
    src, tgt_in, tgt_out = _reverse_batch(torch.Generator().manual_seed(99), 200, vocab)
    hypotheses = greedy_search(model, src)
    references = [[t for t in row if t not in (PAD, EOS)] for row in tgt_out.tolist()]
    return sum(h == r for h, r in zip(hypotheses, references)) / len(references)


def test_the_model_learns_to_reverse_sequences():
    """Real learning on CPU in well under a minute: nearly every held-out sequence reversed exactly."""
    exact = reverse_exact_match(0)
    assert exact >= REVERSE_FLOOR, exact
