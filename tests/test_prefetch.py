"""Tests of BatchPrefetcher: the batches of collating on the spot, in order; errors surfaced; a clean stop."""

import threading

import numpy as np
import pytest
import torch

from pipeline.train.prefetch import BatchPrefetcher
from pipeline.train.shard import TokenShard


def _shard(n=50, seed=0):
    rng = np.random.default_rng(seed)
    sources = [rng.integers(4, 100, rng.integers(1, 12)).tolist() for _ in range(n)]
    targets = [rng.integers(4, 100, rng.integers(0, 12)).tolist() for _ in range(n)]
    return TokenShard.from_lists(sources, targets)


def test_prefetched_batches_equal_collating_in_place_in_order():
    shard = _shard()
    batches = [np.array(b) for b in ([3, 1, 4], [1, 5], [9, 2, 6, 5], [3], [5, 8, 9, 7])]
    with BatchPrefetcher(shard, batches, depth=2) as stream:
        got = list(stream)
        assert next(stream, None) is None  # exhausted stays exhausted, it does not block
    assert len(got) == len(batches)
    for batch, index in zip(got, batches):
        for tensor, expected in zip(batch, shard.collate(index)):
            assert torch.equal(tensor, expected)


class _FailsOnSecond:
    def __init__(self):
        self.calls = 0

    def collate(self, index):
        self.calls += 1
        if self.calls == 2:
            raise ValueError("broken batch")
        return _shard().collate(index)


def test_a_collate_error_is_raised_where_the_batch_is_wanted():
    with BatchPrefetcher(_FailsOnSecond(), [np.array([0, 1]), np.array([2])]) as stream:
        next(stream)
        with pytest.raises(ValueError, match="broken batch"):
            next(stream)


def test_close_stops_a_producer_blocked_on_a_full_queue():
    shard = _shard()
    before = threading.active_count()
    stream = BatchPrefetcher(shard, [np.array([i]) for i in range(50)], depth=1)
    next(stream)
    stream.close()
    assert not stream._thread.is_alive() and threading.active_count() == before
