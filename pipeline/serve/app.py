"""The Serve application: the model resolved and pinned to a version, the deployment bound to its config section.

`serve run deploy/serve_config.yaml`, `serve deploy` and the RayService build it through `build_app`,
Serve's application builder; `nmt serve` through `bind`.
"""

from typing import Any

from ..common.errors import UserError
from ..config import ServeConfig, config_from_dict, set_value
from ..track.login import redact
from ..track.registry import champion_uri
from ..track.target import TrackingTarget, connect
from .service import ServiceSpec, TranslationService


def resolve_model(tracking_uri: str, model_uri: str) -> tuple[str, str]:
    """(URI to load, version label): an alias pinned to its version now, so every replica loads the same one."""
    from ..track.registry import model_version

    version = model_version(tracking_uri, model_uri)
    if version is not None:
        return f"models:/{version.name}/{version.version}", str(version.version)
    if model_uri.startswith("models:/"):
        raise UserError(f"model {model_uri!r} is not in the registry at {redact(tracking_uri)}; register one with "
                        f"`nmt train` / `nmt promote`, or pass --model runs:/RUN_ID/model")
    return model_uri, model_uri


def app_for(cfg: ServeConfig, tracking_uri: str, registered_model: str = ""):
    """The Serve application for a serve config section: the model resolved and pinned, limits applied.

    The model is cfg.model_uri, else the champion of registered_model.
    """
    if not cfg.model_uri and not registered_model:
        raise UserError("no model to serve: set serve.model_uri (e.g. models:/NAME@champion) or "
                        "tracking.registered_model")
    target = connect(tracking_uri)
    model_uri, version = resolve_model(target.uri, cfg.model_uri or champion_uri(registered_model))
    return bind(cfg, target, model_uri, version)


def bind(cfg: ServeConfig, target: TrackingTarget, model_uri: str, version: str):
    """The deployment of one pinned model version with the section's limits, replicas and GPUs."""
    gpus = {"ray_actor_options": {"num_cpus": 1, "num_gpus": cfg.num_gpus}} if cfg.num_gpus else {}
    deployment = TranslationService.options(
        max_ongoing_requests=cfg.max_ongoing_requests, max_queued_requests=cfg.max_queued_requests,
        # Overflow answers 503 at once, with a hint when to retry, instead of queueing without bound.
        backpressure_config={"status_code": 503, "retry_after_s": 1}, **gpus,
    )
    return deployment.bind(ServiceSpec.of(cfg, target, model_uri, version))


def build_app(args: dict[str, Any] | None = None):
    """Serve's application builder (import_path pipeline.serve.app:build_app): serve-section keys and tracking_uri.

    Values from `serve run pipeline.serve.app:build_app model_uri=... max_batch_size=8` arrive as strings and are
    read as YAML scalars, the same as `--set`; unknown keys are errors that name the key.
    """
    args = dict(args or {})
    tracking_uri = str(args.pop("tracking_uri", "") or "")
    cfg = config_from_dict({})  # the defaults, the registered model's name derived from them
    for key, value in args.items():
        if isinstance(value, str):
            import yaml

            value = yaml.safe_load(value) if value.strip() else ""
        set_value(cfg, f"serve.{key}", value, where="serve application args")
    return app_for(cfg.serve, tracking_uri, cfg.tracking.registered_model)
