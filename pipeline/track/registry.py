"""The MLflow model registry: package a checkpoint as a pyfunc model, register it, move the champion alias."""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..common import log
from ..common.errors import UserError
from ..text.translator import Translator
from .tracking import redact

CHAMPION = "champion"
logger = log.get("registry")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
MODEL_CODE = PACKAGE_ROOT / "pipeline" / "serve" / "pyfunc_model.py"
REQUIREMENTS = ("torch", "sentencepiece", "safetensors", "mlflow", "pandas", "numpy")


@dataclass
class Registered:
    """A new model version and whether it became the champion."""

    name: str
    version: str
    val_bleu: float
    champion: bool
    previous_bleu: float | None  # the champion's val_bleu before this version


def champion_uri(name: str) -> str:
    """The model URI of the registered model's champion: what translate, evaluate and serve load by default."""
    return f"models:/{name}@{CHAMPION}"


def pip_requirements() -> list[str]:
    """The inference dependencies pinned to the versions this process runs (torch without its +cpu tag)."""
    return [f"{name}=={metadata.version(name).split('+')[0]}" for name in REQUIREMENTS]


def _client(uri: str):
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri)


def champion_bleu(uri: str, name: str) -> tuple[str, float] | None:
    """(version, val_bleu) of the current champion, or None when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        version = _client(uri).get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None
    return version.version, float(version.tags.get("val_bleu", "-inf"))


def log_model(uri: str, run_id: str, translator: Translator, example: str):
    """Log a model into the run as a self-contained pyfunc model; returns ModelInfo."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    _client(uri)
    params = {"beam_size": translator.beam_size, "max_len": 0}
    with tempfile.TemporaryDirectory() as tmp:
        translator.save(Path(tmp) / "translator")
        sample = pd.DataFrame({"src": [example]})
        signature = infer_signature(sample, pd.DataFrame({"translation": translator.translate([example])}), params)
        with mlflow.start_run(run_id=run_id):
            return mlflow.pyfunc.log_model(
                name="model", python_model=str(MODEL_CODE), artifacts={"translator": str(Path(tmp) / "translator")},
                code_paths=[str(PACKAGE_ROOT / "model"), str(PACKAGE_ROOT / "pipeline")],
                signature=signature, input_example=(sample, params), pip_requirements=pip_requirements(),
                model_config={"device": "auto"},  # load_model(model_config={"device": "cpu"}) overrides it
            )


def version_of_run(uri: str, name: str, run_id: str) -> str | None:
    """The version of `name` already registered from this run, if any (a rerun must not add another)."""
    from mlflow.exceptions import MlflowException

    try:
        found = _client(uri).search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except MlflowException:
        return None
    return str(found[0].version) if found else None


def register(uri: str, run_id: str, translator: Translator, name: str, val_bleu: float,
             tags: dict[str, str], example: str) -> Registered:
    """Register a model as a new version of `name`; it becomes champion only if its val_bleu is higher."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    info = log_model(uri, run_id, translator, example)
    # Through the client rather than log_model(registered_model_name=): the same registration
    # without MLflow's "Successfully registered model" prints (our own line below says it).
    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    tags = {"val_bleu": f"{val_bleu:.4f}", "run_id": run_id, **tags}
    version = str(client.create_model_version(name, info.model_uri, run_id=run_id, model_id=info.model_id,
                                              tags={key: str(value) for key, value in tags.items()}).version)
    current = champion_bleu(uri, name)
    better = current is None or val_bleu > current[1]
    if better:
        client.set_registered_model_alias(name, CHAMPION, version)
    logger.info(f"registered {name} version {version} (val_bleu {val_bleu:.2f}); "
                + ("it is the champion" if better else f"champion stays version {current[0]} ({current[1]:.2f})"))
    return Registered(name, version, val_bleu, better, current[1] if current else None)


def promote(uri: str, name: str, version: str) -> None:
    """Move the champion alias to a version by hand (`nmt promote`)."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        client.get_model_version(name, str(version))
    except MlflowException:
        raise UserError(f"registered model {name!r} has no version {version} in {redact(uri)}; "
                        f"list versions in the MLflow UI or with `mlflow models`") from None
    client.set_registered_model_alias(name, CHAMPION, str(version))


def load(uri: str, model_uri: str, device: str = "auto"):
    """A pyfunc model by URI (models:/name@alias, runs:/id/model, a path) on a device; a clear error if absent."""
    import mlflow
    from mlflow.exceptions import MlflowException

    _client(uri)
    try:
        with warnings.catch_warnings():  # predict takes a DataFrame, a list or a str: no one type hint fits
            warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method")
            return mlflow.pyfunc.load_model(model_uri, model_config={"device": device})
    except (MlflowException, OSError) as err:
        reason = redact(str(err).splitlines()[0][:300])
        raise UserError(f"cannot load model {model_uri!r} from {redact(uri)}: {reason}") from None


def model_version(uri: str, model_uri: str) -> Any | None:
    """The registry version behind models:/NAME@ALIAS or models:/NAME/VERSION, else None."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if not model_uri.startswith("models:/"):
        return None
    name, _, ref = model_uri.removeprefix("models:/").partition("@")
    client = MlflowClient(uri)
    try:
        if ref:
            return client.get_model_version_by_alias(name, ref)
        name, _, number = name.rpartition("/")
        return client.get_model_version(name, number) if number.isdigit() and name else None
    except MlflowException:
        return None


CT2_ARTIFACTS = "ctranslate2"  # where an export sits among the artifacts of a version's run
CT2_TAG = "ctranslate2"  # set on a model version that has an export; its value is the quantization


def log_ctranslate2(uri: str, version: Any, directory: Path, quantization: str) -> None:
    """Attach a CTranslate2 export to a model version: artifacts of its run, and a tag on the version."""
    client = _client(uri)
    client.log_artifacts(version.run_id, str(directory), CT2_ARTIFACTS)
    client.set_model_version_tag(version.name, version.version, CT2_TAG, quantization)


def ctranslate2_export(uri: str, version: Any, destination: str) -> Path | None:
    """A local copy of the version's CTranslate2 export, or None when it has none."""
    if version is None or CT2_TAG not in version.tags:
        return None
    import mlflow

    _client(uri)
    return Path(mlflow.artifacts.download_artifacts(run_id=version.run_id, artifact_path=CT2_ARTIFACTS,
                                                    dst_path=destination, tracking_uri=uri))
