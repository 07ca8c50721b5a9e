"""The MLflow model registry: package a checkpoint as a pyfunc model, register it, move the champion alias."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from ..common import log
from ..common.environment import environment
from ..common.errors import UserError
from ..text.tokenizer import JOINT_FILE, SRC_FILE
from ..text.translator import CONFIG_FILE, WEIGHTS_FILE, Translator
from . import champion
from .champion import CHAMPION
from .login import redact
from .target import mlflow_client
from .tracking import END_WAIT_S, Run, already_exists, error_line, retrying

logger = log.get("registry")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
MODEL_CODE = PACKAGE_ROOT / "pipeline" / "serve" / "pyfunc_model.py"
TRANSLATOR_FILES = "artifacts/translator"  # where log_model puts Translator.save()'s files inside a model
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


_FLUENT_LOCK = threading.RLock()


@contextlib.contextmanager
def _fluent(uri: str) -> Iterator[None]:
    """MLflow's fluent API (log_model, load_model) pointed at uri for a block: it reads the tracking and
    registry URIs from the environment, set here and restored after (never mlflow.set_tracking_uri).

    The environment is the whole process's: one block at a time, else one thread's restore would point
    another's calls elsewhere mid-block (two registrations at once in one process).
    """
    with _FLUENT_LOCK, environment(MLFLOW_TRACKING_URI=uri, MLFLOW_REGISTRY_URI=uri):
        yield


def log_model(run: Run, translator: Translator, example: str):
    """Log a model into the run as a self-contained pyfunc model; returns ModelInfo."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    params = {"beam_size": translator.beam_size, "max_len": 0}
    with tempfile.TemporaryDirectory() as tmp:
        translator.save(Path(tmp) / "translator")
        sample = pd.DataFrame({"src": [example]})
        signature = infer_signature(sample, pd.DataFrame({"translation": translator.translate([example])}), params)
        # The fluent log_model needs an active run; leaving the block marks it FINISHED (a training run's
        # owner, mlflow_run, sets its final status after; a sweep's trial run had ended already).
        with _fluent(run.uri), mlflow.start_run(run_id=run.id):
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
        found = mlflow_client(uri).search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except MlflowException:
        return None
    return str(found[0].version) if found else None


def register(run: Run, translator: Translator, name: str, val_bleu: float,
             tags: dict[str, str], example: str, create_model: bool = True) -> Registered | None:
    """Register a model as a new version of `name`; it becomes champion only if its val_bleu is higher.

    A login that may not add versions of `name` (on a team's server only the promoting identity may), or
    that may not create it (create_model False: a login on a team's server, whose model the admin makes):
    the model stays logged in the run, which is marked a candidate for `nmt promote` (None).
    """
    from mlflow.exceptions import MlflowException

    info = log_model(run, translator, example)
    tags = {"val_bleu": f"{val_bleu:.4f}", "run_id": run.id, **{key: str(value) for key, value in tags.items()}}
    if not create_model and not _exists(run.uri, name):
        mark_candidate(run, name, info.model_uri, info.model_id, tags)
        logger.info(f"there is no registered model {name} yet, and a run on a team's server never makes one: the "
                    f"model is logged in run {run.id}, a candidate; the admin makes the model for the promoting "
                    "login, and `nmt promote` with that login checks and registers it")
        return None
    try:
        version = create_version(run.uri, name, info.model_uri, info.model_id, run.id, tags)
    except MlflowException as err:
        if err.get_http_status_code() != 403:
            raise
        mark_candidate(run, name, info.model_uri, info.model_id, tags)
        logger.info(f"this MLflow login may not register versions of {name} (HTTP 403): the model is logged in run "
                    f"{run.id}, a candidate; `nmt promote` with the promoting login checks and registers it")
        return None
    decision = champion.decide(run.uri, name)
    better = decision.version == version
    logger.info(f"registered {name} version {version} (val_bleu {val_bleu:.2f}); " + (
        "it is the champion" if better else f"champion stays version {decision.version} ({decision.val_bleu:.2f})"))
    return Registered(name, version, val_bleu, better, decision.previous[1] if decision.previous else None)


def _exists(uri: str, name: str) -> bool:
    """Whether the registered model exists (a login that cannot read it sees none)."""
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client(uri).get_registered_model(name)
    except MlflowException:
        return False
    return True


CANDIDATE_TAG = "nmt.candidate"  # on a run whose login could not register its model: the registered model's name
CANDIDATE_MODEL_TAG = "nmt.candidate_model"  # {"model_uri", "model_id", "tags"}: what registering it takes


def create_version(uri: str, name: str, model_uri: str, model_id: str | None, run_id: str,
                    tags: dict[str, str]) -> str:
    """A new version of `name` (made first if it does not exist) from a logged model; its number."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    # Through the client rather than log_model(registered_model_name=): the same registration
    # without MLflow's "Successfully registered model" prints (our own line says it).
    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if not already_exists(err):
            raise
    with _fluent(uri):  # a database store finds the logged model through the process-wide URI, not the client's
        return str(client.create_model_version(name, model_uri, run_id=run_id, model_id=model_id, tags=tags).version)


def mark_candidate(run: Run, name: str, model_uri: str, model_id: str | None, tags: dict[str, str]) -> None:
    """Tag a run whose model this login could not register: `nmt promote` finds and registers it."""
    import json

    found = {CANDIDATE_MODEL_TAG: json.dumps({"model_uri": model_uri, "model_id": model_id, "tags": tags}),
             CANDIDATE_TAG: name}  # the name last: a run is a candidate only once its model is named
    for key, value in found.items():
        retrying(partial(run.client().set_tag, run.id, key, value), f"marking run {run.id} a candidate", END_WAIT_S)


def candidate_runs(uri: str, name: str) -> list:
    """Every run of any experiment marked a candidate of `name`, oldest first (what `nmt promote` judges)."""
    client = mlflow_client(uri)
    experiments = [e.experiment_id for e in _all_experiments(client)]
    found = []
    for start in range(0, len(experiments), 100):  # search_runs takes at most 100 experiments at a time
        found += client.search_runs(experiments[start: start + 100], f"tags.`{CANDIDATE_TAG}` = '{name}'",
                                    max_results=1000)
    return sorted(found, key=lambda r: r.info.start_time)


@contextlib.contextmanager
def refused_as_user_error(uri: str, doing: str, user: str) -> Iterator[None]:
    """A 403 of the tracking server inside the block as one line saying which login it needs."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as err:
        if err.get_http_status_code() != 403:
            raise
        who = f"MLflow user {user!r}" if user else "this MLflow login"
        raise UserError(f"{redact(uri)} refused {doing} (HTTP 403): {who} may not change the registered model; "
                        "registering versions and moving @champion take the promoting login "
                        "(deploy/tracking-server.md, users and permissions)") from None


def _all_experiments(client) -> list:
    experiments, token = [], None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        experiments += page
        token = page.token
        if not token:
            return experiments


def load(uri: str, model_uri: str, device: str = "auto"):
    """The packaged pyfunc by URI, for callers that want MLflow's model: it imports the model's stored code.

    The pipeline itself loads with load_translator, which runs nothing from the store.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        with warnings.catch_warnings():  # predict takes a DataFrame, a list or a str: no one type hint fits
            warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method")
            # models:/ is resolved in the registry of the tracking server, as mlflow_client does, whatever
            # MLFLOW_REGISTRY_URI said before.
            with _fluent(uri):
                return mlflow.pyfunc.load_model(model_uri, model_config={"device": device})
    except (MlflowException, OSError) as err:
        raise UserError(f"cannot load model {model_uri!r} from {redact(uri)}: {error_line(err)}") from None


@contextlib.contextmanager
def translator_files(uri: str, model_uri: str) -> Iterator[Path]:
    """A packaged model's data files (models:/, runs:/, a path), downloaded to a temporary directory.

    Only `artifacts/translator/` is downloaded: safetensors weights, a JSON config, the decoding
    settings and SentencePiece models. No Python file or pickle stored with the model is imported, so
    a model version anyone could have logged on a shared server runs no code here.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    with tempfile.TemporaryDirectory() as tmp:
        try:
            # MLflow resolves models:/ and a run's logged model through the process-wide URIs, whatever
            # the repository is given: pointed at this server for the block.
            with _fluent(uri):
                repository = get_artifact_repository(model_uri, tracking_uri=uri, registry_uri=uri)
                if not repository.list_artifacts(TRANSLATOR_FILES):
                    raise UserError(f"model {model_uri!r} has no {TRANSLATOR_FILES}/ (safetensors weights, JSON "
                                    "config, SentencePiece): it was not packaged by `nmt train`; register one that "
                                    "was")
                local = Path(repository.download_artifacts(TRANSLATOR_FILES, dst_path=tmp))
        except (MlflowException, OSError) as err:
            raise UserError(f"cannot load model {model_uri!r} from {redact(uri)}: {error_line(err)}") from None
        check_translator_files(local, model_uri)
        yield local


def load_translator(uri: str, model_uri: str, device: str = "auto") -> Translator:
    """The translator of a packaged model, read from its data files alone (see translator_files)."""
    with translator_files(uri, model_uri) as local:
        return translator_from_files(local, model_uri, device)


def check_translator_files(directory: Path, model_uri: str) -> None:
    """The files Translator.save() writes are there, or an error naming the first one missing."""
    missing = [name for name in (WEIGHTS_FILE, CONFIG_FILE) if not (directory / name).is_file()]
    if not any((directory / name).is_file() for name in (JOINT_FILE, SRC_FILE)):
        missing.append(JOINT_FILE)
    if missing:
        raise UserError(f"model {model_uri!r} has no {missing[0]} in {TRANSLATOR_FILES}/: it was not packaged by "
                        f"`nmt train`; register one that was, or pass a training checkpoint")


def translator_from_files(directory: Path, model_uri: str, device: str = "cpu") -> Translator:
    """Translator.from_files of files translator_files checked, every way they can still be wrong as one line."""
    from safetensors import SafetensorError

    try:
        return Translator.from_files(directory, device=device)
    except (ValueError, TypeError, KeyError, RuntimeError, SafetensorError) as err:
        raise UserError(f"model {model_uri!r}: its {TRANSLATOR_FILES}/ files do not make a model: "
                        f"{error_line(err)}") from None


def model_version(uri: str, model_uri: str) -> Any | None:
    """The registry version behind models:/NAME@ALIAS or models:/NAME/VERSION, else None."""
    from mlflow.exceptions import MlflowException

    if not model_uri.startswith("models:/"):
        return None
    name, _, ref = model_uri.removeprefix("models:/").partition("@")
    client = mlflow_client(uri)
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
    client = mlflow_client(uri)
    client.log_artifacts(version.run_id, str(directory), CT2_ARTIFACTS)
    client.set_model_version_tag(version.name, version.version, CT2_TAG, quantization)


def ctranslate2_export(uri: str, version: Any, destination: str) -> Path | None:
    """A local copy of the version's CTranslate2 export, or None when it has none."""
    if version is None or CT2_TAG not in version.tags:
        return None
    import mlflow

    return Path(mlflow.artifacts.download_artifacts(run_id=version.run_id, artifact_path=CT2_ARTIFACTS,
                                                    dst_path=destination, tracking_uri=uri))
