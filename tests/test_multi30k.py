"""Real learning on real data: a few minutes of training on a Multi30k subset lifts held-out BLEU well above 0."""

import pytest

from pipeline.common import checkpoint
from pipeline.config import load_config
from pipeline.data.prepare import prepare
from pipeline.train.loop import train_loop
from pipeline.train.workers import TorchrunContext

pytestmark = pytest.mark.slow


def _subset(source, target, lines: int) -> None:
    target.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]),
                      encoding="utf-8")


def test_a_few_minutes_on_multi30k_lift_validation_bleu_well_above_zero(ray_session, multi30k_dir, tmp_path):
    corpus = tmp_path / "multi30k"
    corpus.mkdir()
    for split, lines in (("train", 12000), ("val", 300), ("test_2016_flickr", 100)):
        for lang in ("en", "de"):
            _subset(multi30k_dir / f"{split}.{lang}", corpus / f"{split}.{lang}", lines)
    cfg = load_config("configs/multi30k_en_de.yaml", [
        f"data.path={corpus}", f"data.output_dir={tmp_path / 'data'}", "data.vocab_size=3000",
        "model.num_layers=2", "model.dropout=0.1", "train.num_workers=1", "train.max_tokens=3000",
        "train.max_steps=600", "train.epochs=100", "train.val_interval=300", "train.warmup_steps=300",
        "train.lr_scale=2.0", "train.beam_size=1", "train.average_last=1", "train.log_every=50"])
    manifest = prepare(cfg.data)
    train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, TorchrunContext(str(tmp_path / "runs")))
    last = checkpoint.load(sorted((tmp_path / "runs").glob("checkpoint_*"))[-1])
    history = last["progress"]["history"]
    assert history[0]["val_bleu"] < history[-1]["val_bleu"]
    assert history[-1]["val_bleu"] >= 5.0, history  # an untrained model scores ~0; 600 updates reach ~10
