"""What a finished training run leaves in MLflow besides metrics: curves, attention maps, sample translations."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..data.manifest import Manifest
from ..text.translator import Translator
from . import tracking

CURVE_KEYS = ("train_loss", "val_loss", "val_bleu")


def validation_sample(manifest: Manifest, count: int) -> tuple[list[str], list[str]]:
    """The first `count` validation pairs (source, reference), in corpus order."""
    table = manifest.read_split("validation", ["src", "tgt"]).slice(0, count)
    return table.column("src").to_pylist(), table.column("tgt").to_pylist()


def log_run_report(run: tracking.Run, translator: Translator, manifest: Manifest, title: str = "",
                   samples: int = 16, attention_sentences: int = 2) -> None:
    """Log learning_curves.png, attention/*.png and a samples table to the run."""
    import matplotlib.pyplot as plt

    from .plots import attention_maps, learning_curves

    sources, references = validation_sample(manifest, samples)
    translations = translator.translate(sources)
    history = {key: run.metric_history(key) for key in CURVE_KEYS}
    with tempfile.TemporaryDirectory() as tmp:
        curves = Path(tmp) / "learning_curves.png"
        figure = learning_curves(history, title)
        figure.savefig(curves, dpi=110)
        plt.close(figure)
        run.log_artifacts([curves])
        attention_dir = Path(tmp) / "attention"
        attention_dir.mkdir()
        # Short sentences make legible maps; heads specialize in ways worth seeing (Sec. 4, Fig. 3-5).
        for index, source in enumerate(sorted(sources, key=len)[:attention_sentences]):
            for kind, figure in attention_maps(translator, source).items():
                figure.savefig(attention_dir / f"sentence{index + 1}_{kind}.png", dpi=100)
                plt.close(figure)
        run.log_artifacts(sorted(attention_dir.iterdir()), artifact_path="attention")
    run.client().log_table(run.id, data={"source": sources, "reference": references, "translation": translations},
                           artifact_file="samples.json")
