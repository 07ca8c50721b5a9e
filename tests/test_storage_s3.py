"""Object storage for real: prepared data and training checkpoints on a local S3-compatible server (moto)."""

import threading
import uuid

import psutil
import pyarrow.dataset as ds
import pytest
from mlflow.tracking import MlflowClient
from small import small_config

from pipeline.common import checkpoint, storage
from pipeline.data import prepare as prepare_module
from pipeline.data.manifest import MANIFEST
from pipeline.train.driver import train

pytestmark = pytest.mark.slow


def _objects(uri: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    return sorted(info.path for info in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
                  if info.type == pafs.FileType.File)


def test_prepare_on_s3_writes_the_manifest_last_and_a_rerun_after_a_crash_starts_clean(ray_session, s3_bucket,
                                                                                      tmp_path, monkeypatch):
    cfg = small_config(tmp_path, f"data.output_dir={s3_bucket}/prepared-{uuid.uuid4().hex[:8]}")
    final, _, _ = prepare_module.prepared_path(cfg.data)

    def crash(*args, **kwargs):
        raise RuntimeError("the node died while saving the tokenizer")

    monkeypatch.setattr(prepare_module, "save_tokenizer", crash)
    with pytest.raises(RuntimeError, match="node died"):
        prepare_module.prepare(cfg.data)
    shards = [name for name in _objects(final) if name.endswith(".parquet")]
    assert shards and not storage.exists(storage.join(final, MANIFEST))  # shards written, no manifest: incomplete
    # A shard as another cluster size would have cut it, left by the crashed attempt.
    stale = storage.join(final, "train", "part-9999999999.parquet")
    storage.write_bytes(stale, storage.read_bytes(f"s3://{shards[-1]}"))
    monkeypatch.undo()

    manifest = prepare_module.prepare(cfg.data)
    assert manifest.path == final and not storage.exists(stale)
    pairs = manifest.content["splits"]["train"]["pairs"]
    assert ds.dataset(manifest.split_dir("train"), format="parquet").count_rows() == pairs > 2000
    assert prepare_module.prepare(cfg.data).content["created_s"] == manifest.content["created_s"]  # reused


def _checkpoints(uri: str) -> set[str]:
    """The checkpoint directories under uri that hold a model file."""
    return {name.rsplit("/", 1)[0] for name in _objects(uri) if name.endswith(f"/{checkpoint.MODEL_FILE}")}


def _registered(uri: str) -> bool:
    """Whether Ray Train has registered a checkpoint under uri (its checkpoint manager's snapshot file).

    Until then a restart has nothing to resume from: reports still queued on the workers die with them.
    """
    return any(name.endswith("/checkpoint_manager_snapshot.json") for name in _objects(uri))


def _kill_a_worker_after(uri: str, checkpoints: int, killed: list, done: threading.Event) -> None:
    """SIGKILL a Ray Train worker once `checkpoints` checkpoints are on storage and one of them is registered."""
    while not done.wait(0.5):
        if len(_checkpoints(uri)) >= checkpoints and _registered(uri):
            for proc in psutil.process_iter(["cmdline"]):
                if any("RayTrainWorker" in part for part in proc.info["cmdline"] or []):
                    proc.kill()  # no chance to clean up
                    killed.append(proc.pid)
                    return


def test_training_on_s3_survives_a_killed_worker_and_resumes_from_its_s3_checkpoint(ray_session, s3_bucket,
                                                                                    tmp_path):
    """Nothing on a local disk is shared: data in, checkpoints out, the restart's checkpoint, all through S3."""
    prefix = f"{s3_bucket}/{uuid.uuid4().hex[:8]}"
    cfg = small_config(tmp_path, f"data.output_dir={prefix}/prepared", f"train.storage_path={prefix}/runs",
                       "train.max_steps=30", "train.val_interval=6", "train.average_last=1", "train.max_failures=1",
                       "train.keep_checkpoints=5")
    killed: list[int] = []
    done = threading.Event()
    killer = threading.Thread(target=_kill_a_worker_after, args=(f"{prefix}/runs", 2, killed, done))
    killer.start()
    try:
        outcome = train(cfg)
    finally:
        done.set()
        killer.join()
    assert killed, "no training worker was found to kill"
    assert outcome.checkpoint_path.removeprefix("s3://").startswith(prefix.removeprefix("s3://"))
    assert len(_checkpoints(f"{prefix}/runs")) >= 5  # one per validation (and any the killed attempt left)
    assert not any(tmp_path.glob("runs/*")), "a checkpoint went to local disk"
    client = MlflowClient(cfg.tracking.tracking_uri)
    steps = [m.step for m in client.get_metric_history(outcome.run_id, "val_loss")]
    # Every validation logged once: the restart went on from a checkpoint on S3, not from scratch.
    assert sorted(steps) == [6, 12, 18, 24, 30]
    resumed = [m.value for m in client.get_metric_history(outcome.run_id, "resumed_from_step")]
    assert len(resumed) == 1 and resumed[0] in (6, 12, 18, 24), resumed  # the run records its one restart
    # A rerun of the same command finds the finished run on S3 and trains no further.
    again = train(cfg)
    assert again.run_id == outcome.run_id and again.metrics["step"] == outcome.metrics["step"]
    assert len(MlflowClient(cfg.tracking.tracking_uri).get_metric_history(outcome.run_id, "val_loss")) == 5
