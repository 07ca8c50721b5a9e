"""Tests of TokenShard: flat arrays built from Arrow blocks in any order, and vectorised collation."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.train.batching import batch_cost
from pipeline.train.shard import TokenShard


def _reference_collate(sources, targets, pad=0, bos=2, eos=3):
    """The padded batch written out row by row: what collate must equal."""
    width_s, width_t = max(map(len, sources)), max(map(len, targets)) + 1
    src = [list(s) + [pad] * (width_s - len(s)) for s in sources]
    tgt_in = [[bos, *t] + [pad] * (width_t - len(t) - 1) for t in targets]
    tgt_out = [[*t, eos] + [pad] * (width_t - len(t) - 1) for t in targets]
    return [src, tgt_in, tgt_out]


def _table(rows, sources, targets, id_type=None):
    return pa.table({"row": pa.array(rows, pa.int64()),
                     "src_ids": pa.array(sources, pa.list_(id_type or pa.int32())),
                     "tgt_ids": pa.array(targets, pa.list_(id_type or pa.int32()))})


def test_collate_pads_right_and_places_bos_and_eos():
    shard = TokenShard.from_lists([[5, 6, 7], [8], [9, 10]], [[11, 12], [13, 14, 15, 16], []])
    src, tgt_in, tgt_out = shard.collate([0, 1, 2])
    assert all(x.dtype == torch.long for x in (src, tgt_in, tgt_out))
    assert src.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert tgt_in.tolist() == [[2, 11, 12, 0, 0], [2, 13, 14, 15, 16], [2, 0, 0, 0, 0]]
    assert tgt_out.tolist() == [[11, 12, 3, 0, 0], [13, 14, 15, 16, 3], [3, 0, 0, 0, 0]]


def test_collate_honours_other_special_ids_and_matches_batch_cost():
    shard = TokenShard.from_lists([[4, 4], [5]], [[6], [7, 7, 7]])
    src, tgt_in, tgt_out = shard.collate(np.array([0, 1]), pad_id=9, bos_id=1, eos_id=8)
    assert src.tolist() == [[4, 4], [5, 9]]
    assert tgt_in.tolist() == [[1, 6, 9, 9], [1, 7, 7, 7]]
    assert tgt_out.tolist() == [[6, 8, 9, 9], [7, 7, 7, 8]]
    assert src.numel() + tgt_in.numel() == batch_cost([2, 1], [1, 3], [0, 1])


def test_collate_rejects_empty_batch_and_from_lists_mismatched_sides():
    with pytest.raises(ValueError, match="at least one example"):
        TokenShard.from_lists([[1]], [[1]]).collate([])
    with pytest.raises(ValueError, match="1 sources but 2 targets"):
        TokenShard.from_lists([[1]], [[1], [2]])


def test_blocks_in_any_order_give_the_same_shard_in_corpus_order():
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 8000, rng.integers(0, 30)).tolist() for _ in range(500)]
    targets = [rng.integers(4, 8000, rng.integers(0, 30)).tolist() for _ in range(500)]
    rows = np.arange(500) * 3  # rows with gaps, as cleaning leaves them
    perm = rng.permutation(500)
    blocks = [_table(rows[part], [sources[i] for i in part], [targets[i] for i in part])
              for part in np.array_split(perm, 7)]
    shard = TokenShard.from_batches(blocks[::-1])
    assert shard.rows.tolist() == rows.tolist()
    assert [shard.src.ids(i).tolist() for i in range(500)] == sources
    assert [shard.tgt.ids(i).tolist() for i in range(500)] == targets
    # Ids fit uint16 (the vocabulary is under 65,536): half the bytes of the int32 on disk.
    assert shard.src.tokens.dtype == np.uint16 and shard.tgt.tokens.dtype == np.uint16
    index = rng.permutation(500)[:64]
    expected = _reference_collate([sources[i] for i in index], [targets[i] for i in index])
    assert [t.tolist() for t in shard.collate(index)] == expected


def test_ids_keep_their_values_past_uint16_and_record_batches_work():
    big = [[70000, 5], [65535, 65536, 1]]
    batch = _table([1, 0], big, big[::-1], pa.int64()).to_batches()[0]
    shard = TokenShard.from_batches([batch])
    assert shard.src.tokens.dtype == np.uint32
    assert [shard.src.ids(i).tolist() for i in range(2)] == [big[1], big[0]]


def test_sliced_chunks_are_read_from_their_offset():
    table = _table(range(6), [[i] * (i + 1) for i in range(6)], [[7]] * 6)
    shard = TokenShard.from_batches([table.slice(2, 3), table.slice(0, 2), table.slice(5)])
    assert [shard.src.ids(i).tolist() for i in range(6)] == [[i] * (i + 1) for i in range(6)]


def test_damaged_ids_are_refused_with_the_fix():
    nulls = pa.table({"row": [0, 1], "src_ids": pa.array([[4], None], pa.list_(pa.int32())),
                      "tgt_ids": pa.array([[4], [5]], pa.list_(pa.int32()))})
    with pytest.raises(ValueError, match="nmt prepare"):
        TokenShard.from_batches([nulls])
    with pytest.raises(ValueError, match="negative"):
        TokenShard.from_batches([_table([0], [[-1]], [[4]])])


ids = st.lists(st.integers(0, 9000), max_size=12)


@settings(max_examples=150, deadline=None, database=None)
@given(pairs=st.lists(st.tuples(ids, ids), min_size=1, max_size=20), data=st.data())
def test_collate_equals_row_by_row_padding(pairs, data):
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    shard = TokenShard.from_lists(sources, targets)
    index = data.draw(st.lists(st.integers(0, len(pairs) - 1), min_size=1, max_size=10))
    expected = _reference_collate([sources[i] for i in index], [targets[i] for i in index])
    assert [t.tolist() for t in shard.collate(index)] == expected


def test_ranks_split_the_corpus_between_them_in_row_order(tmp_path):
    """What every worker reads, under Ray Train or torchrun alike (WorkerContext.train_shard)."""

    import pyarrow.parquet as pq

    from pipeline.data.manifest import Manifest, SplitStats, TokenizerInfo
    from pipeline.train.workers import RayContext, TorchrunContext

    (tmp_path / "train").mkdir()
    Manifest(str(tmp_path), fingerprint="0" * 16, source="files", src_lang="en", tgt_lang="de", source_sha256="",
             config_sha256="", data_config={}, splits={"train": SplitStats(40, 40, {}, 0, 0, 0.0, 0.0, 0, 0, 0.0)},
             tokenizer_info=TokenizerInfo("bpe", True, [], 8, 8, "", 0, 1, 2, 3), created_s=0.0, seconds=0.0).write()
    rows = np.arange(40) * 2 + 1
    sources = [[int(r)] * (int(r) % 5 + 1) for r in rows]
    for part, index in enumerate(np.array_split(np.random.default_rng(1).permutation(40), 3)):
        pq.write_table(_table(rows[index], [sources[i] for i in index], [[7]] * index.size),
                       tmp_path / "train" / f"part-{part}.parquet")
    shards = []
    for rank, kind in zip(range(3), (RayContext, TorchrunContext, RayContext)):
        context = kind.__new__(kind)  # a rank of three, without a process group
        context.world_rank, context.world_size = rank, 3
        shards.append(context.train_shard(str(tmp_path)))
    for rank, shard in enumerate(shards):
        assert shard.rows.tolist() == rows[rank::3].tolist()
        assert [shard.src.ids(i).tolist() for i in range(len(shard))] == sources[rank::3]
