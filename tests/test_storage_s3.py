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
from pipeline.data.manifest import MANIFEST, load_manifest
from pipeline.train.driver import train

pytestmark = pytest.mark.slow


def _objects(uri: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    return sorted(info.path for info in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
                  if info.type == pafs.FileType.File)


def test_prepare_on_s3_publishes_a_version_last_and_never_deletes_one_under_a_reader(ray_session, s3_bucket,
                                                                                     tmp_path, monkeypatch):
    cfg = small_config(tmp_path, f"data.output_dir={s3_bucket}/prepared-{uuid.uuid4().hex[:8]}")
    final, _, _ = prepare_module.prepared_path(cfg.data)

    def crash(*args, **kwargs):
        raise RuntimeError("the node died while saving the tokenizer")

    monkeypatch.setattr(prepare_module, "save_tokenizer", crash)
    with pytest.raises(RuntimeError, match="node died"):
        prepare_module.prepare(cfg.data)
    shards = [name for name in _objects(final) if name.endswith(".parquet")]
    assert shards and not storage.exists(storage.join(final, MANIFEST))  # shards written, no pointer: absent
    monkeypatch.undo()

    manifest = prepare_module.prepare(cfg.data)
    assert manifest.path.startswith(f"{final}/v-") and manifest.name == final.rsplit("/", 1)[-1]
    crashed = shards[0].split("/v-", 1)[1].split("/", 1)[0]
    assert f"/v-{crashed}/" not in manifest.path + "/"  # the crashed attempt is never pointed to
    pairs = manifest.content["splits"]["train"]["pairs"]
    assert ds.dataset(manifest.split_dir("train"), format="parquet").count_rows() == pairs > 2000
    assert prepare_module.prepare(cfg.data).content["created_s"] == manifest.content["created_s"]  # reused
    # --force while a run reads the published version: a new version is published, the old one stays whole.
    newer = prepare_module.prepare(cfg.data, force=True)
    assert newer.path != manifest.path and load_manifest(final).path == newer.path
    assert ds.dataset(manifest.split_dir("train"), format="parquet").count_rows() == pairs
    manifest.check_files()


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
    # A rerun of the same command finds the finished run on S3: no new training, no second MLflow run, no new
    # model version.
    versions = len(client.search_model_versions(f"run_id = '{outcome.run_id}'"))
    again = train(cfg)
    assert again.run_id == outcome.run_id and again.metrics["step"] == outcome.metrics["step"]
    assert again.registered is None and versions == 1
    assert len(client.get_metric_history(outcome.run_id, "val_loss")) == 5
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert len(client.search_runs([experiment.experiment_id], f"tags.`nmt.run_name` = '{outcome.run_name}'")) == 1
    assert len(client.search_model_versions(f"run_id = '{outcome.run_id}'")) == versions


def _write_hub_parquet(uri: str, pairs: list[tuple[str, str]]) -> None:
    """Pairs in the schema of the hub's wmt/wmt14 Parquet files: one `translation` struct with `de` and `en`."""
    import pyarrow as pa

    translation = pa.array([{"de": tgt, "en": src} for src, tgt in pairs],
                           pa.struct([("de", pa.string()), ("en", pa.string())]))
    storage.write_table(uri, pa.table({"translation": translation}))


def test_s3_corpus_prepares_from_hub_parquet_shards_and_names_the_file_and_line_of_a_bad_s3_line(
        ray_session, s3_bucket, tmp_path):
    from pipeline.common.errors import CorpusError
    from pipeline.data.demo_corpus import demo_corpus

    corpus = f"{s3_bucket}/corpora-{uuid.uuid4().hex[:8]}"
    pairs = demo_corpus(3000, 100, 100, seed=3)
    # The hub's layout: de-en/<split>-0000i-of-0000n.parquet, the training split in two shards.
    _write_hub_parquet(f"{corpus}/wmt/de-en/train-00000-of-00002.parquet", pairs["train"][:1700])
    _write_hub_parquet(f"{corpus}/wmt/de-en/train-00001-of-00002.parquet", pairs["train"][1700:])
    for split in ("validation", "test"):
        _write_hub_parquet(f"{corpus}/wmt/de-en/{split}-00000-of-00001.parquet", pairs[split])
    cfg = small_config(tmp_path, "data.source=files", "data.format=parquet", f"data.path={corpus}/wmt",
                       "data.src_field=translation.en", "data.tgt_field=translation.de",
                       "data.splits={train: de-en/train-*, validation: de-en/validation-*, test: de-en/test-*}",
                       f"data.output_dir={corpus}/prepared", "data.max_len=256")
    manifest = prepare_module.prepare(cfg.data)
    assert manifest.path.startswith(f"{corpus}/prepared/")
    assert {split: entry["read"] for split, entry in manifest.content["splits"].items()} == \
        {"train": 3000, "validation": 100, "test": 100}
    test = manifest.read_split("test", ["src", "tgt"])
    assert test.num_rows == manifest.content["splits"]["test"]["pairs"] > 90  # read back from S3
    assert cfg.tracking.registered_model == "transformer-nmt-wmt-en-de"

    # Text files on S3 with a byte that is not UTF-8 on line 1234 of the German side.
    lines = {lang: [src if lang == "en" else tgt for src, tgt in pairs["train"]] for lang in ("en", "de")}
    bad = "\n".join(lines["de"][:1233]).encode() + b"\nein Hund \xff\n" + "\n".join(lines["de"][1234:]).encode()
    storage.write_bytes(f"{corpus}/text/train.de", bad + b"\n")
    storage.write_bytes(f"{corpus}/text/train.en", ("\n".join(lines["en"]) + "\n").encode())
    for split in ("val", "test"):
        for lang, side in (("en", 0), ("de", 1)):
            key = "validation" if split == "val" else "test"
            storage.write_bytes(f"{corpus}/text/{split}.{lang}", "".join(p[side] + "\n" for p in pairs[key]).encode())
    text = small_config(tmp_path, "data.source=files", f"data.path={corpus}/text", f"data.output_dir={corpus}/out")
    with pytest.raises(CorpusError, match=rf"^{corpus}/text/train\.de:1234: invalid UTF-8"):
        prepare_module.prepare(text.data)
    with pytest.raises(CorpusError, match=r"data\.path .* is not a directory"):
        prepare_module.prepare(small_config(tmp_path, "data.source=files", f"data.path={corpus}/nothing-here").data)
