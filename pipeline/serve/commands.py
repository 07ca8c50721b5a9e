"""`nmt translate` and `nmt evaluate`: a packaged model (any MLflow model URI) applied to text files or a split."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..common import log
from ..common.devices import resolve_device
from ..common.errors import UserError
from ..config import experiment_name
from ..data.textfiles import read_lines
from ..text.metrics import check_counts, score_with_signatures
from ..track import registry, reports, tracking
from ..track.target import connect, mlflow_client

PROGRESS_EVERY_S = 5.0
logger = log.get("translate")


Engine = Callable[[list[str], int | None], list[str]]  # (texts, beam size or None: the model's) -> translations


class LoadedEngine(NamedTuple):
    """A model ready to translate, and the decoding settings it uses unless told otherwise."""

    name: str  # pytorch or ctranslate2
    model: Any  # Translator or Ct2Translator: translate(texts, beam_size=, truncate=), too_long(texts)
    beam_size: int
    alpha: float

    def translate(self, texts: list[str], beam_size: int | None, truncate: bool = False) -> list[str]:
        """Translations; a source longer than the model's positions is a ValueError, or with truncate cut to fit."""
        return self.model.translate(texts, beam_size=beam_size, truncate=truncate)


def pin(uri: str, model_uri: str) -> tuple[str, Any | None]:
    """(URI to load, registry version): an alias such as @champion resolved once, to models:/NAME/VERSION.

    Everything after reads that version's files by number, so an alias that a sweep moves in between can
    never put one version's files under another's name.
    """
    version = registry.model_version(uri, model_uri)
    return (f"models:/{version.name}/{version.version}", version) if version is not None else (model_uri, None)


def load_engine(uri: str, model_uri: str, engine: str, device: str, workdir: str) -> LoadedEngine:
    """A model's packaged PyTorch model or its CTranslate2 export, decoding as the model was validated.

    "auto" takes CTranslate2 when the package is installed and the model version has an export.
    """
    model_uri, version = pin(uri, model_uri)
    if engine != "pytorch":
        has_ct2 = importlib.util.find_spec("ctranslate2") is not None
        directory = registry.ctranslate2_export(uri, version, workdir) if has_ct2 or engine == "ctranslate2" else None
        if directory is not None:
            from ..text.ct2 import Ct2Translator

            on_gpu = resolve_device(device).type == "cuda"
            ct2 = Ct2Translator(directory, device="cuda" if on_gpu else "cpu")
            return LoadedEngine("ctranslate2", ct2, ct2.beam_size, ct2.alpha)
        if engine == "ctranslate2":
            raise UserError(f"{model_uri} has no CTranslate2 export: run `nmt export --model {model_uri}` first "
                            "(it needs a registered model version: models:/NAME/VERSION or models:/NAME@ALIAS)")
    translator = registry.load_translator(uri, model_uri, device=device)
    return LoadedEngine("pytorch", translator, translator.beam_size, translator.alpha)


def export(tracking_uri: str, model_uri: str, out: str, quantization: str) -> tuple[Path, Any]:
    """`nmt export`: the model as a CTranslate2 directory, attached to its model version when it has one."""
    from ..text.ct2 import export as export_ct2

    uri = connect(tracking_uri).uri
    model_uri, version = pin(uri, model_uri)
    translator = registry.load_translator(uri, model_uri, device="cpu")
    directory = export_ct2(translator, out, quantization, source=model_uri)
    if version is not None:
        registry.log_ctranslate2(uri, version, directory, quantization)
    return directory, version


def translate(engine: Engine, texts: list[str], beam_size: int | None, batch_size: int = 32,
              progress: bool = False) -> list[str]:
    """Translations in batches, with progress: a bar on a terminal, elsewhere a line every few seconds."""
    out: list[str] = []
    started = last_line = time.perf_counter()
    with _progress_bar(len(texts)) if progress and sys.stderr.isatty() else contextlib.nullcontext() as bar:
        for start in range(0, len(texts), batch_size):
            try:
                out.extend(batch := engine(texts[start: start + batch_size], beam_size))
            except ValueError as err:  # a sentence the model cannot take (longer than its positions)
                raise UserError(f"sentence {start + 1}-{start + batch_size}: {err}; shorten or split it") from None
            now = time.perf_counter()
            if bar is not None:
                bar.update(len(batch))
            elif progress and (now - last_line >= PROGRESS_EVERY_S or len(out) == len(texts)):
                rate = len(out) / max(now - started, 1e-9)
                eta = (len(texts) - len(out)) / max(rate, 1e-9)
                logger.info(f"{len(out)}/{len(texts)} sentences, {rate:.1f}/s, ETA {eta:.0f}s")
                last_line = now
    return out


def _progress_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="sentence", desc="[translate]", file=sys.stderr)


def split_texts(version, split: str, data_dir: str | None) -> tuple[list[str], list[str], str]:
    """(sources, references, data path) of a prepared split: --data, else the dataset the version was trained on."""
    from ..data.manifest import load_manifest

    path = data_dir or (version.tags.get("data_path") if version is not None else None)
    if not path:
        raise UserError("--split needs the prepared dataset: pass --data DIR (from `nmt prepare`), or a "
                        "models:/ URI whose version carries a data_path tag")
    table = load_manifest(path).read_split(split, ["src", "tgt"])
    return table.column("src").to_pylist(), table.column("tgt").to_pylist(), path


def _warn_too_long(loaded: LoadedEngine, sources: list[str], where: str) -> None:
    """One line when some sources do not fit the model's positions: scored on a translation of their start."""
    too_long = loaded.model.too_long(sources)
    if too_long:
        logger.warning(f"{len(too_long)} of {len(sources)} sources in {where} are longer than the model's positions "
                       f"(the first: sentence {too_long[0] + 1}); each is translated from its first tokens")


def evaluate(tracking_uri: str, experiment: str, model_uri: str, beam_size: int | None,
             src_file: str | None = None,
             ref_file: str | None = None, split: str | None = None, data_dir: str | None = None,
             device: str = "auto", engine: str = "auto") -> dict:
    """Translate, score with sacreBLEU, log an evaluation run linked to the model version; returns the scores."""
    device = str(resolve_device(device))  # a bad --device fails before any work
    target = connect(tracking_uri)
    uri = target.uri
    pinned, version = pin(uri, model_uri)
    if split:
        sources, references, where = split_texts(version, split, data_dir)
        where = f"{where} split {split}"
    else:
        sources, references = read_lines(Path(src_file)), read_lines(Path(ref_file))
        where = f"{src_file} vs {ref_file}"
        if len(sources) != len(references):
            raise UserError(f"{src_file} has {len(sources)} lines but {ref_file} has {len(references)}: "
                            f"they must pair line by line")
    with tempfile.TemporaryDirectory() as workdir:
        loaded = load_engine(uri, pinned, engine, device, workdir)
        engine, beam_size = loaded.name, beam_size or loaded.beam_size
        logger.info(f"translating {len(sources)} sentences with {engine} (beam {beam_size}, length penalty "
                    f"{loaded.alpha})")
        _warn_too_long(loaded, sources, where)
        hypotheses = translate(functools.partial(loaded.translate, truncate=True), sources, beam_size, progress=True)
    check_counts(hypotheses, references)
    scores = score_with_signatures(hypotheses, references)
    label = split or Path(src_file).stem
    tags = {"nmt.kind": "evaluation", "model_uri": model_uri, "evaluated_on": where, "engine": engine}
    if version is not None:
        tags.update({"registered_model": version.name, "model_version": str(version.version),
                     "source_run_id": version.run_id or ""})
    run_name = f"evaluate-{label}-{version.name}-v{version.version}" if version else f"evaluate-{label}"
    decoding = {"beam_size": beam_size, "length_penalty": loaded.alpha}
    experiment = experiment_name(experiment, target.username)
    with tracking.mlflow_run(uri, experiment, f"{run_name}-{int(time.time())}", decoding, tags,
                             source="nmt evaluate", user=target.username) as run:
        reports.log_metrics(run, {f"{label}_{k}": v for k, v in scores.items() if isinstance(v, float)})
        with tempfile.TemporaryDirectory() as tmp:
            hyp_file = Path(tmp) / f"{label}.hyp.txt"
            hyp_file.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
            run.log_artifacts([hyp_file])
        run.end_tags.update({k: str(v) for k, v in scores.items() if k.endswith("signature")})
    if version is not None:
        _tag_version(uri, version, {f"{label}_bleu": f"{scores['bleu']:.2f}", f"{label}_eval_run": run.id})
    return {**scores, "sentences": len(hypotheses), "run_id": run.id}


def _tag_version(uri: str, version, tags: dict[str, str]) -> None:
    """The evaluation's scores on the model version; a login that may not edit the model (HTTP 403) only warns."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    try:
        for key, value in tags.items():
            client.set_model_version_tag(version.name, version.version, key, value)
    except MlflowException as err:
        if err.get_http_status_code() != 403:
            raise
        logger.warning(f"the scores stay in the evaluation run: tagging {version.name} version {version.version} "
                       "with them needs EDIT on the registered model (the promoting login)")
