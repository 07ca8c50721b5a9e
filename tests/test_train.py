"""Training: end to end on Ray Train with MLflow, exact resume, clear capacity errors (killed worker: S3 tests;
a truncated checkpoint on Ray Train: test_train_driver)."""

import math
from pathlib import Path

import pytest
import torch
from loop_runs import StopAfter
from mlflow.tracking import MlflowClient
from small import small_config

from model import cooldown_factor, transformer_lr
from pipeline.common import checkpoint
from pipeline.common.errors import UserError
from pipeline.common.messages import EARLIER_KEY, FINAL_KEY, NODE_KEY
from pipeline.data.prepare import prepare
from pipeline.train.driver import train
from pipeline.train.loop import train_loop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("train")


def test_training_end_to_end_tracks_one_mlflow_run(champion):
    # The session's champion is `nmt train`'s code path on the small config (conftest): this test reads its run.
    cfg, outcome = champion.cfg, champion.outcome
    assert outcome.checkpoint_path and Path(outcome.checkpoint_path, checkpoint.MODEL_FILE).is_file()
    client = MlflowClient(cfg.tracking.tracking_uri)
    run = client.get_run(outcome.run_id)
    assert run.info.status == "FINISHED"
    assert {"train_loss", "val_loss", "val_bleu", "val_chrf", "val_seconds", "lr", "tokens_per_s",
            "epoch"} <= set(run.data.metrics)
    assert run.data.params["model.d_model"] == "64" and run.data.tags["data_manifest"]
    losses = [m.value for m in client.get_metric_history(outcome.run_id, "train_loss")]
    assert len(losses) >= 4 and losses[-1] < losses[0]  # it learns
    artifacts = {a.path for a in client.list_artifacts(outcome.run_id)}
    assert {"config.resolved.yaml", "manifest.json", "tokenizer", "demo.yaml"} - {"demo.yaml"} <= artifacts
    # The same command again finds the finished run: test_storage_s3.py runs it again, with its storage on S3.


def test_an_interrupted_run_resumes_to_exactly_the_same_parameters(ray_session, workdir, tmp_path):
    # Checkpoints at every validation (12, 24, ...) and every 5 updates besides (5, 10, 15, 20, ...); 120 updates,
    # past the end of the first epoch.
    cfg = small_config(workdir, "train.epochs=2", "train.max_steps=120", "train.val_interval=12",
                       "train.checkpoint_every=5", "train.average_last=1", "model.dropout=0.1", "train.cooldown=0.5")
    manifest = prepare(cfg.data)
    loop_config = {"config": cfg.to_dict(), "data_path": manifest.path}
    straight_run = StopAfter(tmp_path / "straight")
    train_loop(loop_config, straight_run)
    # Eq. 3 for the first half of the run, then falling linearly to 0 at its last update.
    rows = straight_run.rows()
    end = rows[-1]["step"]
    for row in rows:
        expected = transformer_lr(row["step"] + 1, cfg.model.d_model, cfg.train.warmup_steps, cfg.train.lr_scale) \
            * cooldown_factor(row["step"] / end, 0.5)
        assert row["lr"] == pytest.approx(expected, rel=1e-6, abs=1e-12), row
    assert rows[-1]["lr"] == 0 < rows[len(rows) // 3]["lr"]
    assert rows[0]["epoch"] < rows[-1]["epoch"], (rows[0], rows[-1])  # the resumed run crosses an epoch's end too
    saved = [(r["step"], math.isnan(r["val_bleu"])) for r in straight_run.saved]
    assert saved[:4] == [(5, True), (10, True), (12, False), (15, True)]
    stopped, again = StopAfter(tmp_path / "resumed", stop_after=2), StopAfter(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):  # stopped mid-epoch, at the checkpoint of update 10 (no validation)
        train_loop(loop_config, stopped)
    assert stopped.reports[-1]["step"] == 10
    train_loop(loop_config, again)
    # Had the stop come before the last report reached MLflow (a SIGKILL), nothing is lost: the resumed
    # run's first report carries the checkpoint's report again, values and timestamps unchanged (not the
    # node's system-metric samples, which each report carries once).
    last = stopped.reports[-1]
    own = {k: v for k, v in last.items() if k not in (EARLIER_KEY, FINAL_KEY, NODE_KEY)}
    replayed = again.reports[0][EARLIER_KEY][:len(last[EARLIER_KEY]) + 1]
    assert repr(replayed) == repr([*last[EARLIER_KEY], own])  # repr: NaN (this checkpoint's val_bleu) equals NaN
    straight = checkpoint.load(sorted((tmp_path / "straight").glob("checkpoint_*"))[-1])
    resumed = checkpoint.load(sorted((tmp_path / "resumed").glob("checkpoint_*"))[-1])
    assert straight["progress"]["step"] == resumed["progress"]["step"] == 120
    for name, tensor in straight["model"].items():
        assert torch.allclose(tensor, resumed["model"][name], atol=1e-6, rtol=0), name


def test_the_weights_averaged_at_the_end_are_kept_at_their_own_cadence_apart_from_validation(ray_session, workdir,
                                                                                           tmp_path):
    """One validation, at the last update; weights kept every 4 updates: the average is of updates 8, 12 and 16
    (average_last 3), reported after the last validation. Kept only at validations, there would be one: no average."""
    runs = {}
    for every in (4, 0):
        cfg = small_config(workdir, "train.max_steps=16", "train.epochs=100", "train.val_interval=0",
                           "train.average_last=3", f"train.average_every={every}", "train.checkpoint_every=0")
        manifest = prepare(cfg.data)
        runs[every] = StopAfter(tmp_path / str(every))
        train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, runs[every])
    validated = [(r["step"], r.get("averaged")) for r in runs[4].saved if math.isfinite(r["val_bleu"])]
    assert validated == [(16, None), (16, 3)], validated
    assert runs[4].saved[-1][FINAL_KEY] and not runs[4].saved[0][FINAL_KEY]
    assert [(r["step"], r.get("averaged")) for r in runs[0].saved] == [(16, None)] and runs[0].saved[-1][FINAL_KEY]


def test_a_run_validated_greedily_registers_the_configured_beam_scored_as_it_decodes(workdir, tmp_path,
                                                                                    monkeypatch):
    """train.val_beam_size 1: validation decodes greedily, the packaged model keeps beam_size and length_penalty,
    and the version is compared by the validation split decoded as it will be deployed."""
    from ray.train import Checkpoint

    from pipeline.text.metrics import score
    from pipeline.text.translator import Translator
    from pipeline.track import registry, tracking
    from pipeline.track.publish import publish
    from pipeline.train import validate

    cfg = small_config(workdir, "train.max_steps=20", "train.epochs=100", "train.val_interval=10",
                       "train.average_last=1", "train.val_beam_size=1", "train.beam_size=3", "train.length_penalty=1.0",
                       "tracking.registered_model=greedy-validation", "tracking.experiment=greedy-validation")
    manifest = prepare(cfg.data)
    beams, translate_ids = [], validate.translate_ids

    def recorded(model, sources, beam_size, **options):  # validation's decoding, watched
        beams.append(beam_size)
        return translate_ids(model, sources, beam_size=beam_size, **options)

    monkeypatch.setattr(validate, "translate_ids", recorded)
    run_dir = StopAfter(tmp_path / "run")
    train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, run_dir)
    assert beams and set(beams) == {1}
    final = sorted((tmp_path / "run").glob("checkpoint_*"))[-1]
    metrics = run_dir.saved[-1]

    uri = cfg.tracking.tracking_uri
    with tracking.mlflow_run(uri, cfg.tracking.experiment, "greedy", {}, {}) as run:
        registered = publish(cfg, run, Checkpoint.from_directory(str(final)), metrics, manifest)
    client = MlflowClient(uri)
    version = client.get_model_version(registered.name, registered.version)
    assert (version.tags["beam_size"], version.tags["length_penalty"]) == ("3", "1.0")
    translator = registry.load_translator(uri, f"models:/{registered.name}/{registered.version}", device="cpu")
    assert (translator.beam_size, translator.alpha) == (3, 1.0)
    # Its val_bleu is the split decoded with beam 3 and length penalty 1.0, logged to the run as well.
    table = manifest.read_split("validation", ["src", "tgt"])
    packaged = Translator.from_checkpoint(final, manifest.tokenizer(), beam_size=3, alpha=1.0, device="cpu")
    expected = score(packaged.translate(table.column("src").to_pylist()), table.column("tgt").to_pylist())["bleu"]
    logged = client.get_run(run.id).data.metrics["val_bleu_packaged"]
    assert float(version.tags["val_bleu"]) == pytest.approx(expected, abs=1e-4) == logged


def test_a_compiled_model_trains_like_the_eager_one_and_a_time_budget_ends_at_a_validation(ray_session, workdir,
                                                                                              tmp_path):
    # No progress line before step 1000: the budget (long spent after one step) must stop the run at
    # the first validation, step 3. Dropout 0: inductor draws other random numbers than eager.
    overrides = ["train.epochs=50", "train.val_interval=3", "train.log_every=1000", "train.time_budget_s=0.001",
                 "train.average_last=1", "model.dropout=0", "model.attention_dropout=0"]
    finals = {}
    for compiled in (False, True):
        cfg = small_config(workdir, *overrides, f"train.compile={str(compiled).lower()}")
        manifest = prepare(cfg.data)
        train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, StopAfter(tmp_path / str(compiled)))
        finals[compiled] = checkpoint.load(sorted((tmp_path / str(compiled)).glob("checkpoint_*"))[-1])
    assert finals[True]["progress"]["step"] == finals[False]["progress"]["step"] == 3
    assert finals[True]["model"].keys() == finals[False]["model"].keys()  # the bare model, no _orig_mod prefix
    # Not element by element: Adam turns a rounding-sized gradient (the key bias's is zero in exact
    # arithmetic) into a full-sized step of either sign. The model as a whole must agree.
    eager, compiled = (torch.cat([t.flatten().double() for t in finals[c]["model"].values()]) for c in (False, True))
    assert (eager - compiled).norm() / eager.norm() < 1e-3
    assert abs(finals[True]["metrics"]["val_loss"] - finals[False]["metrics"]["val_loss"]) < 1e-3


def test_more_workers_than_the_cluster_has_is_a_clear_error(ray_session, tmp_path):
    cfg = small_config(tmp_path, "train.num_workers=8")
    with pytest.raises(UserError, match=r"cannot fit 8 training workers x 1 CPU: it has 2 CPUs"):
        train(cfg)


class Detonator:
    """Unpickling this runs a shell command: what a crafted checkpoint would do without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_corrupt_or_crafted_latest_checkpoint_falls_back_to_the_previous_one(ray_session, workdir, tmp_path,
                                                                                capfd):
    cfg = small_config(workdir, "train.epochs=3", "train.val_interval=7", "train.average_last=1",
                       "train.keep_checkpoints=5")
    manifest = prepare(cfg.data)
    loop_config = {"config": cfg.to_dict(), "data_path": manifest.path}
    with pytest.raises(KeyboardInterrupt):  # three checkpoints, then stopped
        train_loop(loop_config, StopAfter(tmp_path, stop_after=3))
    first, second, third = sorted(tmp_path.glob("checkpoint_*"))
    model_file = third / checkpoint.MODEL_FILE
    model_file.write_bytes(model_file.read_bytes()[:1000])  # truncated, as by a full disk
    marker = tmp_path / "pwned"
    torch.save({"model": Detonator(marker)}, second / checkpoint.MODEL_FILE)  # a crafted pickle
    capfd.readouterr()
    with pytest.raises(KeyboardInterrupt):  # resumes, writes one more checkpoint, stops
        train_loop(loop_config, StopAfter(tmp_path, stop_after=1))
    err = capfd.readouterr().err
    assert not marker.exists()  # the pickle was refused, never run
    assert err.count("falling back to the checkpoint before it") == 2, err[-3000:]
    assert f"{third.name}/model.pt: cannot be loaded safely" in err and f"{second.name}/model.pt" in err
    step = checkpoint.load(first)["progress"]["step"]
    assert f"resumed from step {step} " in err
    # Nothing loadable at all: a clear error instead of silently training from scratch.
    directories = list(tmp_path.glob("checkpoint_*"))
    for directory in directories:
        (directory / checkpoint.MODEL_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match=f"none of this run's {len(directories)} checkpoints can be loaded"):
        train_loop(loop_config, StopAfter(tmp_path))
