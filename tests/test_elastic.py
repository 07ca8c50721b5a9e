"""Spot nodes: the batch an update averages across resizes, restart causes, the preemption checks and the
notice's hook (the rehearsal on real Ray nodes is tests/test_spot.py)."""

import math
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.common.messages import NODE_KEY, Report
from pipeline.config import ConfigError, load_config
from pipeline.text.tokenizer import PAD_ID
from pipeline.track import reports
from pipeline.train import elastic
from pipeline.train.epoch_plan import NO_EXAMPLES, EpochData, pack
from pipeline.train.prefetch import BatchPrefetcher
from pipeline.train.progress import Progress
from pipeline.train.shapes import ShapePolicy, batch_shapes
from pipeline.train.shard import TokenShard

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("workers, expected", [(4, 1), (2, 2), (1, 4), (3, 1)])
def test_elastic_accumulation_keeps_the_tokens_of_an_update(workers, expected):
    # Configured for 4 workers x 2048 tokens x 1 batch: 8192 tokens per update at any size.
    cfg = load_config(None, ["train.num_workers=4", "train.min_workers=1", "train.max_tokens=2048"])
    target = cfg.train.target_tokens()
    assert target == 8192
    assert elastic.accumulation(target, 2048, workers) == expected
    # Wherever the count divides the target, an update averages exactly the same tokens.
    if 8192 % (2048 * workers) == 0:
        assert elastic.accumulation(target, 2048, workers) * workers * 2048 == target


def test_elastic_target_is_explicit_or_derived_from_the_most_workers():
    assert load_config(None, ["train.num_workers=2", "train.update_freq=3", "train.max_tokens=100"]
                       ).train.target_tokens() == 600
    assert load_config(None, ["train.tokens_per_update=5000"]).train.target_tokens() == 5000
    assert elastic.accumulation(5000, 4096, 8) == 1  # never below one batch


def test_elastic_config_limits_are_checked_with_the_key_named():
    with pytest.raises(ConfigError, match="train.min_workers .3. is above train.num_workers .2."):
        load_config(None, ["train.num_workers=2", "train.min_workers=3"])
    with pytest.raises(ConfigError, match="max_preemption_failures must be -1"):
        load_config(None, ["train.max_preemption_failures=-2"])
    cfg = load_config(None, ["train.num_workers=4", "train.min_workers=2"])
    assert cfg.train.elastic and cfg.train.fewest_workers() == 2
    assert not load_config(None, ["train.num_workers=4"]).train.elastic


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """A training split of 2,000 pairs in three Parquet files, its corpus rows with gaps (as cleaning leaves them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = tmp_path_factory.mktemp("split")
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(5000, 2000, replace=False))
    ids = pa.list_(pa.int32())
    for part, chunk in enumerate(np.array_split(rng.permutation(rows), 3)):
        lengths = rng.integers(1, 30, (chunk.size, 2))
        pq.write_table(pa.table({"row": pa.array(chunk, pa.int64()),
                                 "src_ids": pa.array([list(range(4, 4 + a)) for a, _ in lengths], ids),
                                 "tgt_ids": pa.array([list(range(4, 4 + b)) for _, b in lengths], ids)}),
                       directory / f"part-{part}.parquet")
    return str(directory), rows


def _segment(split_dir, progress, workers, steps, shapes=None):
    """`workers` ranks (threads, with the collectives between them) resume from a checkpoint's progress and take
    `steps` batches each (None: to the epoch's end); (the rows each consumed, the new checkpoint's progress)."""
    import copy
    import threading

    slots, barrier, out = [None] * workers, threading.Barrier(workers), [None] * workers

    def gather(rank, value):
        slots[rank] = value
        barrier.wait()
        found = list(slots)
        barrier.wait()
        return found

    def rank_run(rank):
        mine = copy.deepcopy(progress)
        data = EpochData(split_dir, rank, workers, 600, seed=0, gather=lambda v: gather(rank, v),
                         largest=lambda n: max(gather(rank, n)), shapes=shapes)
        batches = data.begin(mine)
        start = mine.batch_in_epoch
        end = len(batches) if steps is None else min(len(batches), start + steps)
        consumed = [data.shard.rows[index] for index in batches[start:end]]
        mine.batch_in_epoch = end
        mine.record_seen(data.seen(mine))
        out[rank] = (consumed, mine, batches)

    threads = [threading.Thread(target=rank_run, args=(rank,)) for rank in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(o is not None for o in out)
    assert len({len(o[2]) for o in out}) == 1  # the same number of steps on every rank
    return [row for o in out for part in o[0] for row in part], out[0][1]


def test_resize_4_3_4_in_one_epoch_sees_every_example_exactly_once(split):
    split_dir, rows = split
    seen, progress = [], Progress()
    for workers, steps in ((4, 7), (3, 5), (4, None)):  # a resize mid-epoch, then another
        consumed, progress = _segment(split_dir, progress, workers, steps)
        assert consumed, workers
        seen += consumed
    assert len(seen) == rows.size and np.array_equal(np.sort(seen), rows)  # none twice, none skipped


def test_shaped_batches_see_every_example_once_across_resizes_within_the_budget(split):
    split_dir, rows = split
    shapes = ShapePolicy(600, multiple=8, buckets=2)
    seen, progress = [], Progress()
    for workers, steps in ((4, 5), (3, None)):
        consumed, progress = _segment(split_dir, progress, workers, steps, shapes)
        seen += consumed
    assert len(seen) == rows.size and np.array_equal(np.sort(seen), rows)
    data = EpochData(split_dir, 0, 1, 600, seed=0, gather=lambda v: [v], largest=lambda n: n, shapes=shapes)
    batches = data.begin(Progress())
    lengths = data.shard.src.lengths, data.shard.tgt.lengths
    assert data.shapes.kept and all(n * (s + t) <= 600 for n, s, t in batch_shapes(batches, *lengths, data.shapes))


def test_resize_restart_at_the_same_size_takes_the_same_batches_from_the_same_position(split):
    split_dir, _ = split
    _, after_resize = _segment(split_dir, Progress(), 4, 6)
    straight, _ = _segment(split_dir, after_resize, 3, 8)  # 3 workers for 8 batches
    first, checkpoint = _segment(split_dir, after_resize, 3, 3)  # the same, stopped after 3 and restarted
    rest, _ = _segment(split_dir, checkpoint, 3, 5)
    assert np.array_equal(np.sort(np.concatenate([first, rest])), np.sort(straight))
    assert checkpoint.segment_workers == 3 and checkpoint.batch_in_epoch == 3


def test_resize_near_an_epochs_end_gives_ranks_without_examples_empty_steps(split):
    split_dir, rows = split
    # Two examples left when four workers take over: two ranks have none and make steps without examples.
    seen = np.zeros(int(rows[-1]) + 1, bool)
    seen[rows[:-2]] = True
    rest, _ = _segment(split_dir, Progress(seen=pack(seen), segment_workers=2, batch_in_epoch=1), 4, None)
    assert np.array_equal(np.sort(rest), rows[-2:])
    src, tgt_in, tgt_out = next(iter(BatchPrefetcher(TokenShard.from_lists([[5]], [[6]]), [NO_EXAMPLES])))
    assert (tgt_out == PAD_ID).all() and src.numel() == 1  # no target token: no loss, no gradient


def test_elastic_restart_causes_are_read_from_the_checkpoint():
    assert elastic.restart_cause({"preempted": True, "world_size": 2, "attempt": "a"}, 1, "a") == elastic.PREEMPTION
    assert elastic.restart_cause({"world_size": 1, "attempt": "a"}, 2, "a") == elastic.RESIZE
    assert elastic.restart_cause({"world_size": 2, "attempt": "a"}, 1, "a") == elastic.FAILURE  # lost unannounced
    assert elastic.restart_cause({"world_size": 2, "attempt": "a"}, 2, "a") == elastic.FAILURE
    assert elastic.restart_cause({"world_size": 2, "attempt": "a"}, 2, "b") == elastic.RERUN


def test_preemption_checks_come_at_the_same_updates_on_every_rank_about_every_check_s():
    cadence = elastic.NoticeCadence(check_s=5.0, first_every=10)
    assert [s for s in range(1, 31) if cadence.due(s)] == [10, 20, 30]
    cadence.retune(steps=100, seconds=50.0)  # 0.5 s per update: every 10 updates is 5 s
    assert cadence.every == 10
    cadence.retune(steps=100, seconds=1000.0)  # 10 s per update: every update
    assert cadence.every == 1
    assert not elastic.NoticeCadence(check_s=0.0, first_every=1).due(1)  # 0: never asks


def test_preemption_restart_tags_node_metrics_and_no_nan_reach_mlflow():
    report = Report({"step": 12, "time": 1.0, "val_bleu": math.nan, "world_size": 1},
                    ({"step": 11, "time": 0.5, "train_loss": 2.0, "world_size": 1, "resumed_from_step": 10,
                      "restarts": 1, "restart_cause": "preemption", "restart_from_workers": 2},))
    assert reports.restart_tags(report) == {"restart.1": "preemption at step 10, 2 -> 1 workers"}
    keys = {m.key for m in reports.metric_entries(report)}
    assert "val_bleu" not in keys and {"train_loss", "world_size", "resumed_from_step"} <= keys
    ranks = [Report.from_metrics({NODE_KEY: [{"time": 2.0, "step": 12, "system/node-a/cpu_utilization_percentage":
                                                50.0}]}),
             Report.from_metrics({NODE_KEY: [{"time": 2.5, "step": 12, "system/node-b/cpu_utilization_percentage":
                                                70.0}]})]
    entries = reports.node_metric_entries([sample for rank in ranks for sample in rank.node_samples])
    assert {(m.key, m.value, m.step, m.timestamp) for m in entries} == {
        ("system/node-a/cpu_utilization_percentage", 50.0, 12, 2000),
        ("system/node-b/cpu_utilization_percentage", 70.0, 12, 2500)}


def test_the_spot_groups_prestop_hook_passes_the_preemption_notice_on_within_the_grace_period():
    import yaml

    from pipeline.launch import preemption_notice

    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kuberay" / "raycluster.yaml").read_text()) if d]
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    (spot,) = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu-spot"]
    pod = spot["template"]["spec"]
    command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python", "-m", "pipeline.launch.preemption_notice"]
    deadline = float(command[command.index("--deadline-s") + 1])
    assert 0 < deadline < pod["terminationGracePeriodSeconds"]  # the hook is not cut off before the deadline
    with pytest.raises(SystemExit) as exit_:
        preemption_notice.main([*command[3:], "--help"])
    assert exit_.value.code == 0


class Reclaimed(Exception):
    """Stands for Ray Train tearing the workers down at the deadline."""


@pytest.mark.slow
def test_on_a_preemption_notice_the_loop_checkpoints_that_update_and_makes_no_other(ray_session, tmp_path, monkeypatch):
    from ray.train import PreemptionInfo
    from small import small_config

    from pipeline.common import checkpoint
    from pipeline.data.prepare import prepare
    from pipeline.train.loop import train_loop
    from pipeline.train.workers import TorchrunContext

    class NoticeAt(TorchrunContext):  # announces a drain once the loop has asked a few times
        def __init__(self, root):
            super().__init__(str(root))
            self.asked, self.reports = 0, []

        def preemption_notice(self):
            self.asked += 1
            return PreemptionInfo(deadline_ms=int((time.time() + 20) * 1000),
                                  preempted_node_to_ranks={"n1": [0]}) if self.asked == 3 else None

        def report(self, metrics, checkpoint_dir=None):
            super().report(metrics, checkpoint_dir)
            self.reports.append((metrics, checkpoint_dir is not None))

    def reclaimed(deadline_ms, noticed_at):
        raise Reclaimed

    monkeypatch.setattr(elastic, "wait_for_restart", reclaimed)
    cfg = small_config(tmp_path, "train.max_steps=40", "train.val_interval=0", "train.log_every=2",
                       "train.preemption_check_s=0.001")  # ask at every update
    manifest = prepare(cfg.data)
    ctx = NoticeAt(tmp_path / "ckpt")
    with pytest.raises(Reclaimed):
        train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, ctx)
    (last, with_checkpoint), = ctx.reports[-1:]
    assert with_checkpoint and math.isnan(last["val_bleu"]) and 0 < last["preemption_warning_s"] <= 20
    (saved,) = sorted((tmp_path / "ckpt").glob("checkpoint_*"))
    state = checkpoint.load(saved)
    assert state["progress"]["preempted"] and state["progress"]["step"] == last["step"]
    assert ctx.asked == 3 and last["step"] >= 3  # it held at the notice: no question, update or report since


def test_tokens_per_update_counts_the_updates_of_a_line_that_spans_an_epoch_end(tmp_path):
    """A progress window across an epoch boundary divides its tokens by all of its updates."""
    from small import small_config

    from pipeline.common.messages import EARLIER_KEY
    from pipeline.data.prepare import prepare
    from pipeline.train.loop import train_loop
    from pipeline.train.workers import TorchrunContext

    class Recording(TorchrunContext):
        def __init__(self, root):
            super().__init__(str(root))
            self.lines = []

        def report(self, metrics, checkpoint_dir=None):
            super().report(metrics, checkpoint_dir)
            self.lines += [*metrics.get(EARLIER_KEY, []), metrics]

    cfg = small_config(tmp_path, "train.max_steps=60", "train.max_tokens=4096", "train.val_interval=1000",
                       "train.log_every=10", "train.report_interval_s=0", "train.epochs=100")
    ctx = Recording(tmp_path / "ckpt")
    train_loop({"config": cfg.to_dict(), "data_path": prepare(cfg.data).path}, ctx)
    values = [line["tokens_per_update"] for line in ctx.lines if "tokens_per_update" in line]
    epochs = {line["epoch"] for line in ctx.lines if "epoch" in line}
    assert len(values) >= 5 and len(epochs) >= 2  # several lines, some across an epoch's end
    assert all(0 < value <= cfg.train.target_tokens() for value in values), values
    assert max(values) < 1.5 * statistics.median(values), values  # counted over fewer updates, one would stand out


def _noticed_run(tmp_path, monkeypatch, notice_from: int, restart, *settings):
    """The small loop on a plain process whose context announces a drain from its `notice_from`-th question on
    (and keeps it up: a drain that never completes); (context, calls of wait_for_restart)."""
    from ray.train import PreemptionInfo
    from small import small_config

    from pipeline.data.prepare import prepare
    from pipeline.train.loop import train_loop
    from pipeline.train.workers import TorchrunContext

    deadline_ms = int((time.time() + 20) * 1000)

    class NoticeFrom(TorchrunContext):
        def __init__(self, root):
            super().__init__(str(root))
            self.asked, self.reports = 0, []

        def preemption_notice(self):
            self.asked += 1
            return PreemptionInfo(deadline_ms=deadline_ms, preempted_node_to_ranks={"n1": [0]}) \
                if self.asked >= notice_from else None

        def report(self, metrics, checkpoint_dir=None):
            super().report(metrics, checkpoint_dir)
            self.reports.append((metrics, checkpoint_dir is not None, self.asked))

    holds = []

    def held(deadline, noticed_at):
        holds.append(deadline)
        restart()

    monkeypatch.setattr(elastic, "wait_for_restart", held)
    cfg = small_config(tmp_path, "train.log_every=2", "train.preemption_check_s=0.001", *settings)
    ctx = NoticeFrom(tmp_path / "ckpt")
    loop_config = {"config": cfg.to_dict(), "data_path": prepare(cfg.data).path}
    try:
        train_loop(loop_config, ctx)
    except Reclaimed:
        pass
    return ctx, holds, loop_config


def test_resize_notice_during_validation_checkpoints_at_once_and_the_restart_validates_first(
        tmp_path, monkeypatch):
    from pipeline.common import checkpoint
    from pipeline.train import validate
    from pipeline.train.loop import train_loop
    from pipeline.train.workers import TorchrunContext

    monkeypatch.setattr(validate, "DECODE_CHUNK", 10)  # 100 validation sentences: 10 questions while decoding

    def reclaimed():
        raise Reclaimed

    # Updates 1..4 ask 4 times; the validation at update 4 asks after each chunk: the 7th question is inside it.
    ctx, holds, loop_config = _noticed_run(tmp_path, monkeypatch, 7, reclaimed, "train.max_steps=12",
                                           "train.val_interval=4")
    (last, with_checkpoint, asked), = ctx.reports[-1:]
    assert with_checkpoint and math.isnan(last["val_bleu"]) and last["step"] == 4 and asked == 7 and holds
    assert not any("val_loss" in metrics for metrics, _, _ in ctx.reports)  # the validation was left
    (saved,) = sorted((tmp_path / "ckpt").glob("checkpoint_*"))
    assert checkpoint.load(saved)["progress"]["validate_first"]
    restarted = TorchrunContext(str(tmp_path / "ckpt"))
    reports = []
    restarted.report = lambda metrics, checkpoint_dir=None: reports.append(metrics)
    train_loop(loop_config, restarted)
    first = next(metrics for metrics in reports if "val_bleu" in metrics)
    assert first["step"] == 4 and math.isfinite(first["val_bleu"])  # the validation of step 4, first


def test_resize_drain_that_never_completes_holds_the_run_once(tmp_path, monkeypatch):
    ctx, holds, _ = _noticed_run(tmp_path, monkeypatch, 3, lambda: None, "train.max_steps=16",
                                 "train.val_interval=4")
    preemption_checkpoints = [m for m, saved, _ in ctx.reports if saved and math.isnan(m.get("val_bleu", 0))]
    assert len(holds) == 1 and len(preemption_checkpoints) == 1
    assert max(m["step"] for m, _, _ in ctx.reports) == 16  # then it trained on to the end, validating as due
