"""Object storage for real: prepared data and training checkpoints on a local S3-compatible server (moto)."""

import uuid

import pyarrow.dataset as ds
import pytest
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


def test_training_reads_its_data_from_s3_and_keeps_its_checkpoints_there(ray_session, s3_bucket, tmp_path):
    """Nothing on a local disk is shared: data in, checkpoints out, the best one read back, all through S3."""
    prefix = f"{s3_bucket}/{uuid.uuid4().hex[:8]}"
    cfg = small_config(tmp_path, f"data.output_dir={prefix}/prepared", f"train.storage_path={prefix}/runs",
                       "train.max_steps=20", "train.val_interval=10", "train.average_last=1")
    outcome = train(cfg)
    assert outcome.checkpoint_path.removeprefix("s3://").startswith(prefix.removeprefix("s3://"))
    assert outcome.metrics["step"] == 20
    written = _objects(f"{prefix}/runs")
    assert any(name.endswith(checkpoint.MODEL_FILE) for name in written), written
    assert not any(tmp_path.glob("runs/*")), "a checkpoint went to local disk"
    # A rerun of the same command finds the finished run on S3 and trains no further.
    again = train(cfg)
    assert again.run_id == outcome.run_id and again.metrics["step"] == 20
