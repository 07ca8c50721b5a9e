"""Batches built ahead of the step that needs them: a background thread collates into (pinned) tensors.

A GPU step takes milliseconds; collating the next batch on the step's own thread would leave
the device idle for that long every micro-batch. The thread runs NumPy gathers (which release
the GIL) while the main thread waits on CUDA, and pins each batch so that the copy to the
device is truly asynchronous. It uses no random numbers, so resumed runs stay exact.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import numpy as np
import torch

from ..text.tokenizer import BOS_ID, EOS_ID, PAD_ID
from .shapes import ShapePolicy
from .shard import TokenShard

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # src, tgt_in, tgt_out
_DONE = object()


def _no_examples() -> Batch:
    """A step without examples (epoch_plan.NO_EXAMPLES): one source token and a target of padding only, so its
    loss, token count and gradients are 0 while the rank still takes part in the update's all-reduce."""
    return torch.tensor([[EOS_ID]]), torch.tensor([[BOS_ID]]), torch.tensor([[PAD_ID]])


def _collate(shard: TokenShard, index: np.ndarray, shapes: ShapePolicy | None) -> Batch:
    """The batch of `index` (empty: a step without examples), shaped by `shapes` when it is active."""
    if shapes is not None and shapes.active:
        return shard.collate(index, shapes=shapes)
    return shard.collate(index) if len(index) else _no_examples()


class BatchPrefetcher:
    """Yields shard.collate(index) for each index in order (an empty one: a step without examples), built up to
    `depth` batches ahead, shaped by `shapes` when given."""

    def __init__(self, shard: TokenShard, batches: Sequence[np.ndarray], pin: bool = False, depth: int = 4,
                 shapes: ShapePolicy | None = None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._exhausted = False
        self._thread = threading.Thread(target=self._fill, args=(shard, batches, pin, shapes), daemon=True,
                                        name="nmt-batch-prefetch")
        self._thread.start()

    def _fill(self, shard: TokenShard, batches: Sequence[np.ndarray], pin: bool, shapes: ShapePolicy | None) -> None:
        try:
            for index in batches:
                batch = _collate(shard, index, shapes)
                if pin:
                    batch = tuple(t.pin_memory() for t in batch)
                if not self._put(batch):
                    return
            self._put(_DONE)
        except BaseException as err:  # handed to the consumer, which raises it where the batch was wanted
            self._put(err)

    def _put(self, item) -> bool:
        """Block until there is room or close() is called; False when closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> BatchPrefetcher:
        return self

    def __next__(self) -> Batch:
        if self._exhausted:
            raise StopIteration
        item = self._queue.get()
        if item is _DONE:
            self._exhausted = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._exhausted = True
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue) and drop what it built."""
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
