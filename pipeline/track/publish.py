"""What a run leaves in MLflow around training: its inputs before, its best checkpoint as a model after.

`nmt train` and `nmt tune` both log their inputs with `log_inputs` and publish through
`publish`, so a trial's champion is packaged exactly like a single run's.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..common import checkpoint, log
from ..common.errors import UserError
from ..common.userinfo import without_secret
from ..config import Config
from ..data.manifest import Manifest
from . import tracking
from .login import redact_yaml, redacted
from .provenance import git_commit

logger = log.get("train")


def log_inputs(run: tracking.Run, cfg: Config, manifest: Manifest, config_file: str | None,
               extra_files: tuple[str, ...] = ()) -> None:
    """The resolved config (and the file it came from), the manifest and the tokenizer, as run artifacts."""
    with tempfile.TemporaryDirectory() as tmp:
        resolved = Path(tmp) / "config.resolved.yaml"
        resolved.write_text(yaml.safe_dump(redacted(cfg.to_dict()), sort_keys=False))
        tok_dir = Path(tmp) / "tokenizer"
        tok_dir.mkdir()
        manifest.tokenizer().save(tok_dir)
        manifest_file = Path(tmp) / "manifest.json"
        manifest_file.write_text(json.dumps(manifest.content, indent=2))
        paths: list[str | Path] = [resolved, manifest_file, *extra_files]
        if config_file and os.path.isfile(config_file):  # a copy, with any password in a URI redacted
            paths.append(Path(tmp) / Path(config_file).name)
            paths[-1].write_text(redact_yaml(Path(config_file).read_text(encoding="utf-8")))
        run.log_artifacts(paths)
        run.log_artifacts(sorted(tok_dir.iterdir()), artifact_path="tokenizer")
    run.log_datasets(dataset_inputs(manifest))


def dataset_inputs(manifest: Manifest) -> list[dict[str, Any]]:
    """The prepared data as MLflow datasets, one per split: the manifest's digest, its path, the split as context."""
    name = manifest.name
    return [{"name": f"{name}/{split}", "digest": manifest.sha256, "source": manifest.split_dir(split),
             "context": split, "profile": {"pairs": stats.pairs, "src_tokens": stats.src_tokens,
                                           "tgt_tokens": stats.tgt_tokens}}
            for split, stats in manifest.splits.items()]


def best_checkpoint(result) -> tuple[Any, dict] | None:
    """The kept checkpoint of a Ray Train result with the highest val_bleu (the averaged one if it won) that loads."""
    scored = [(c, m) for c, m in (result.best_checkpoints or []) if math.isfinite(m.get("val_bleu", math.nan))]
    for candidate, metrics in sorted(scored, key=lambda cm: cm[1]["val_bleu"], reverse=True):
        try:
            with candidate.as_directory() as directory:
                checkpoint.load(directory)
        except UserError as err:  # damaged after it was reported: the next best one is published instead
            logger.warning(f"{err}; publishing the next best checkpoint")
            continue
        return candidate, metrics
    return None


def kept_checkpoint(metrics: dict) -> str:
    """Which weights a run keeps (its kept_checkpoint tag), from the metrics of best_checkpoint's choice: the
    average of the last weights, which is kept only where it won on validation, or one update's."""
    if "averaged" in metrics:
        return f"average of the last {int(metrics['averaged'])} weights"
    return f"update {int(metrics.get('step', 0))}"


def publish(cfg: Config, run: tracking.Run, best, metrics: dict, manifest: Manifest, register: bool = True,
            create_model: bool = True):
    """Pictures and sample translations for the run, then (optionally) a registered model version.

    Done once per run: a rerun of a finished run finds its version and adds nothing. create_model False (a
    login on a team's server): a missing registered model is not made; the run becomes a candidate.
    """
    from ..text.translator import Translator
    from . import registry
    from .report import log_run_report, validation_sample

    name = cfg.tracking.registered_model
    existing = registry.version_of_run(run.uri, name, run.id)
    if existing:
        logger.info(f"run already registered as {name} version {existing}")
        return None
    if run.client().get_run(run.id).data.tags.get(registry.CANDIDATE_TAG) == name:
        logger.info(f"run is already a candidate for {name}: `nmt promote` with the promoting login registers it")
        return None
    with best.as_directory() as directory:
        translator = Translator.from_checkpoint(directory, manifest.tokenizer(), beam_size=cfg.train.beam_size,
                                                alpha=cfg.train.length_penalty)
    log_run_report(run, translator, manifest, title=cfg.tracking.experiment)
    if not register:
        return None
    val_bleu = float(metrics["val_bleu"])
    if cfg.train.val_beam_size not in (0, cfg.train.beam_size):  # validation decoded otherwise: score as deployed
        val_bleu = packaged_val_bleu(run, translator, manifest, int(metrics.get("step", 0)))
    tags = {"data_manifest": manifest.sha256, "git_commit": git_commit(), "data_path": without_secret(manifest.path),
            "beam_size": translator.beam_size, "length_penalty": translator.alpha}  # stored in decoding.json too
    return registry.register(run, translator, name, val_bleu, tags, example=validation_sample(manifest, 1)[0][0],
                             create_model=create_model)


def packaged_val_bleu(run: tracking.Run, translator, manifest: Manifest, step: int) -> float:
    """BLEU of the validation split decoded as the packaged model decodes (its beam and length penalty), logged
    as val_bleu_packaged: what a version is compared by when validation decoded otherwise (greedily, say)."""
    from ..text.metrics import score
    from .reports import log_values

    table = manifest.read_split("validation", ["src", "tgt"])
    sources, references = table.column("src").to_pylist(), table.column("tgt").to_pylist()
    logger.info(f"scoring the packaged model's decoding (beam {translator.beam_size}, length penalty "
                f"{translator.alpha}) on the {len(sources)} validation sentences")
    bleu = score(translator.translate(sources), references)["bleu"]
    log_values(run, {"val_bleu_packaged": bleu}, step)
    return bleu
