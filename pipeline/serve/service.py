"""The Ray Serve translation service: POST /translate, GET /healthz, dynamic batching over sentences.

`nmt serve` runs it on a local (or RAY_ADDRESS) Ray instance; `serve run deploy/serve_config.yaml`
and `serve deploy` build it through `build_app`, Serve's application builder.
"""

# No `from __future__ import annotations`: Ray pickles the deployment class by value, with only the globals
# its code names, so FastAPI could not resolve a string annotation such as "Request" in the replica.
import asyncio
import json
import logging
import os
import time
import uuid
from collections import defaultdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException

from ..common import log
from ..common.errors import UserError
from ..config import Config, ServeConfig, config_from_dict, set_value
from ..text.translator import SourceTooLong
from ..track.login import redact
from ..track.registry import champion_uri
from ..track.target import TrackingTarget, connect

PROBE_TEXT = "a"  # what a health check translates: the shortest input that runs the whole model
MAX_BEAM_SIZE = 16  # beam search cost grows with the beam; larger beams are for offline `nmt evaluate`
FIELDS = ("texts", "beam_size")
APP_NAME = "nmt"
logger = log.get("serve")

api = FastAPI(title="Transformer NMT", docs_url=None, redoc_url=None)


class BadRequest(Exception):
    """A request the service refuses: HTTP status and the message of its JSON error body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@api.exception_handler(HTTPException)
async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    # FastAPI's own 404/405 answers, in the same {"error": ...} shape as ours.
    return JSONResponse({"error": str(err.detail)}, status_code=err.status_code)


def body_limit(max_texts: int, max_chars: int) -> int:
    """The largest /translate body worth parsing: every text at its longest, each character escaped."""
    return max_texts * (max_chars + 8) * 12 + 4096  # \ud83d\ude00: 12 bytes of JSON for one character


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 from its Content-Length, or as it arrives, once it passes limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"request body of {int(declared)} bytes is too large; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no Content-Length: count what arrives
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"request body is too large; at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(body: bytes, max_texts: int, max_chars: int) -> tuple[list[str], int | None]:
    """(texts, beam_size or None) of a /translate body, or BadRequest saying what is wrong with it."""
    if len(body) > body_limit(max_texts, max_chars):
        raise BadRequest(413, f"request body of {len(body)} bytes is too large")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: nesting thousands deep
        reason = err if not isinstance(err, RecursionError) else "nested too deeply"
        raise BadRequest(400, f"request body is not valid JSON: {reason}") from None
    if not isinstance(payload, dict):
        raise BadRequest(400, 'request body must be a JSON object like {"texts": ["..."], "beam_size": 4}')
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r}; known fields: {', '.join(FIELDS)}")
    if "texts" not in payload:
        raise BadRequest(400, '"texts" is required: a list of strings to translate')
    texts = payload["texts"]
    if not isinstance(texts, list):
        raise BadRequest(400, f'"texts" must be a list of strings, got {type(texts).__name__}')
    if not texts:
        raise BadRequest(400, '"texts" is empty: give at least one sentence')
    if len(texts) > max_texts:
        raise BadRequest(413, f'"texts" has {len(texts)} items; at most {max_texts} per request')
    for i, text in enumerate(texts):
        _check_text(i, text, max_chars)
    if "beam_size" not in payload:  # the model's own, stored with it at registration
        return texts, None
    beam_size = payload["beam_size"]
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise BadRequest(400, f'"beam_size" must be an integer from 1 to {MAX_BEAM_SIZE}, got {beam_size!r}')
    return texts, beam_size


def _check_text(i: int, text: Any, max_chars: int) -> None:
    if not isinstance(text, str):
        raise BadRequest(400, f'"texts"[{i}] must be a string, got {type(text).__name__}')
    if len(text) > max_chars:
        raise BadRequest(413, f'"texts"[{i}] has {len(text)} characters; at most {max_chars}')
    try:
        text.encode("utf-8")  # JSON's \ud800 escape decodes to a lone surrogate, which no tokenizer takes
    except UnicodeEncodeError as err:
        raise BadRequest(400, f'"texts"[{i}] is not valid Unicode text: a lone surrogate '
                              f'(\\u{ord(text[err.start]):04x}) at character {err.start}') from None


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


async def translate_apart(engine, texts: list[str], beam_size: int) -> list[str | Exception]:
    """One engine call for all texts; if it fails, one call per text, so that each failure is only its own.

    Errors are returned, not raised: @serve.batch would raise one for every request of the batch. The
    calls run in a thread: decoding holds the event loop otherwise, and /healthz and new requests wait.
    """
    def predict(group: list[str]) -> list[str]:
        return [str(t) for t in engine(group, beam_size)]

    try:
        return await asyncio.to_thread(predict, texts)
    except Exception as err:  # one line per failed batch; each sentence's own failure is logged where it is answered
        logging.getLogger("ray.serve").warning(f"a batch of {len(texts)} sentence(s) failed ({_first_line(err)}); "
                                               f"translating them one by one")
    out: list[str | Exception] = []
    for text in texts:
        try:
            out.append((await asyncio.to_thread(predict, [text]))[0])
        except Exception as err:
            out.append(err)
    return out


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"


def failure_response(i: int, err: Exception) -> JSONResponse:
    """The answer to a request whose sentence i failed: 422 with the reason when the model cannot take it (longer
    than its positions), else 500 naming a reference to the replica's log line: internal errors stay there."""
    if isinstance(err, SourceTooLong):
        return JSONResponse({"error": f'"texts"[{i}] cannot be translated: {err}'}, status_code=422)
    reference = uuid.uuid4().hex[:12]
    logging.getLogger("ray.serve").error(f"translation failed (reference {reference}): {_first_line(err)}")
    return JSONResponse({"error": f'translation of "texts"[{i}] failed; the service logged the cause under reference '
                                  f'{reference}'}, status_code=500)


# Ray Serve calls check_health every period and replaces a replica whose check raises or outlasts the timeout.
@serve.deployment(name="Translator", max_ongoing_requests=32, max_queued_requests=64, health_check_period_s=10,
                  health_check_timeout_s=60)
@serve.ingress(api)
class TranslationService:
    """One replica: a loaded model (PyTorch or its CTranslate2 export); requests are split into sentences that
    @serve.batch regroups."""

    def __init__(self, model_uri: str, version: str, tracking_uri: str, max_batch_size: int,
                 batch_wait_timeout_s: float, max_texts: int, max_chars: int, request_timeout_s: float,
                 engine: str = "auto", target: TrackingTarget | None = None):
        import tempfile

        from .commands import load_engine

        # The driver's tracking target (its login) travels as an argument (pickled to the replica), never
        # in the URI or in a runtime_env, which the dashboard shows.
        if target is not None:
            target.activate()
        self.model_uri, self.version, self.tracking_uri = model_uri, version, tracking_uri
        self.max_texts, self.max_chars, self.request_timeout_s = max_texts, max_chars, request_timeout_s
        # "auto": the GPU Serve gave this replica (serve.num_gpus), else the CPU. A CTranslate2 model is
        # read into memory when loaded, so its downloaded files can go.
        with tempfile.TemporaryDirectory() as workdir:
            loaded = load_engine(tracking_uri, model_uri, engine, "auto", workdir)
            self.engine, self._engine = loaded.name, loaded.translate
            # A request without beam_size decodes as the model was validated, within the service's bound.
            self.beam_size, self.alpha = min(loaded.beam_size, MAX_BEAM_SIZE), loaded.alpha
        self._translate_one.set_max_batch_size(max_batch_size)
        self._translate_one.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.batch_sizes: list[int] = []  # sentences per model call: what dynamic batching achieved (last 1000)
        self.unhealthy = ""  # why the last health check failed

    @api.get("/healthz")
    async def healthz(self) -> JSONResponse:
        """Liveness and the model served; a replica answers only after its model has loaded, and 503 while its last
        health check failed (Ray Serve is replacing it)."""
        return JSONResponse({
            "status": "unhealthy" if self.unhealthy else "ok", "model_uri": self.model_uri,
            "model_version": self.version, "engine": self.engine, "beam_size": self.beam_size,
            "length_penalty": self.alpha,
            "mean_batch_size": sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else None,
        }, status_code=503 if self.unhealthy else 200)

    async def check_health(self) -> None:
        """Ray Serve's health check: a probe sentence through the model. A replica whose device broke (a CUDA
        context gone bad fails every call while the process lives on) raises here, and Serve replaces it."""
        try:
            await asyncio.to_thread(self._engine, [PROBE_TEXT], 1)
        except Exception as err:
            self.unhealthy = _first_line(err)
            logging.getLogger("ray.serve").error(f"health check failed, the replica will be replaced: {self.unhealthy}")
            raise RuntimeError(f"the model fails a probe sentence ({type(err).__name__})") from None
        self.unhealthy = ""

    @api.post("/translate")
    async def translate(self, request: Request) -> JSONResponse:
        """{"texts": [...], "beam_size": 4} -> {"translations": [...], "model_version": "..."}."""
        try:
            body = await read_body(request, body_limit(self.max_texts, self.max_chars))
            texts, beam_size = parse_request(body, self.max_texts, self.max_chars)
            beam_size = beam_size or self.beam_size
        except BadRequest as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        try:
            # On timeout wait_for cancels this request's sentences: those still queued never reach the model.
            results = await asyncio.wait_for(
                asyncio.gather(*(self._translate_one((text, beam_size)) for text in texts)), self.request_timeout_s)
        except asyncio.TimeoutError:
            return JSONResponse({"error": f"no translation within {self.request_timeout_s:g}s; the service is "
                                          f"overloaded, retry later"}, status_code=504, headers={"Retry-After": "1"})
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
        if failed:
            return failure_response(*failed[0])
        return JSONResponse({"translations": results, "model_version": self.version})

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.05)
    async def _translate_one(self, items: list[tuple[str, int]]) -> list[str | Exception]:
        """Sentences from any requests, one model call per beam size (the decoder batches them).

        Each sentence gets its translation or its own error: a sentence that fails the model call is
        found by translating the group's sentences one by one, so other requests never see its error.
        """
        self.batch_sizes = [*self.batch_sizes[-999:], len(items)]
        by_beam: dict[int, list[int]] = defaultdict(list)
        for i, (_, beam_size) in enumerate(items):
            by_beam[beam_size].append(i)
        out: list[str | Exception] = [""] * len(items)
        for beam_size, rows in by_beam.items():
            result = await translate_apart(self._engine, [items[i][0] for i in rows], beam_size)
            for i, translation in zip(rows, result):
                out[i] = translation
        return out


def app_for(cfg: ServeConfig, tracking_uri: str, registered_model: str = ""):
    """The Serve application for a serve config section: the model resolved and pinned, limits applied.

    The model is cfg.model_uri, else the champion of registered_model.
    """
    if not cfg.model_uri and not registered_model:
        raise UserError("no model to serve: set serve.model_uri (e.g. models:/NAME@champion) or "
                        "tracking.registered_model")
    target = connect(tracking_uri)
    model_uri, version = resolve_model(target.uri, cfg.model_uri or champion_uri(registered_model))
    return _bind(cfg, target, model_uri, version)


def _bind(cfg: ServeConfig, target: TrackingTarget, model_uri: str, version: str):
    gpus = {"ray_actor_options": {"num_cpus": 1, "num_gpus": cfg.num_gpus}} if cfg.num_gpus else {}
    deployment = TranslationService.options(
        max_ongoing_requests=cfg.max_ongoing_requests, max_queued_requests=cfg.max_queued_requests,
        # Overflow answers 503 at once, with a hint when to retry, instead of queueing without bound.
        backpressure_config={"status_code": 503, "retry_after_s": 1}, **gpus,
    )
    return deployment.bind(model_uri, version, target.uri, cfg.max_batch_size, cfg.batch_wait_timeout_s,
                           cfg.max_texts, cfg.max_chars, cfg.request_timeout_s, cfg.engine, target)


def build_app(args: dict[str, Any] | None = None):
    """Serve's application builder (import_path pipeline.serve.service:build_app): serve-section keys and tracking_uri.

    Values from `serve run pipeline.serve.service:build_app model_uri=... max_batch_size=8` arrive as strings and are
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


def _check_port_free(host: str, port: int) -> None:
    """Fail before starting Ray when the port is taken: Serve's proxy would only log the failure and retry."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            raise UserError(f"cannot listen on {host}:{port} ({err.strerror}); choose another with --port, "
                            f"or --host") from None


def run(cfg: Config, address: str | None = None) -> int:
    """`nmt serve`: deploy on Ray, print the URL, block until Ctrl-C or SIGTERM, then shut Serve down."""
    import signal

    from ..common.cluster import ensure_ray

    s = cfg.serve
    target = connect(cfg.tracking.tracking_uri)
    asked = s.model_uri or champion_uri(cfg.tracking.registered_model)
    model_uri, version = resolve_model(target.uri, asked)  # fails fast, before Ray starts, when it is missing
    app = _bind(s, target, model_uri, version)
    if address == "local" or not (address or os.environ.get("RAY_ADDRESS")):  # Serve's proxy will run here
        _check_port_free(s.host, s.port)
    ensure_ray(address)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    # Both signals stop the service, whatever this process inherited: a shell's background job
    # starts with SIGINT ignored, and Python then never raises KeyboardInterrupt on Ctrl-C.
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Serve's own end-to-end timeout is the backstop for requests still queued at the proxy.
        serve.start(http_options={"host": s.host, "port": s.port, "request_timeout_s": s.request_timeout_s + 5})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except RuntimeError as err:
            raise UserError(f"the translation service did not start: {str(err).splitlines()[0][:300]}") from None
        host = f"[{s.host}]" if ":" in s.host else s.host
        print(f"serving {asked} (version {version}) at http://{host}:{s.port}  "
              f"(POST /translate, GET /healthz); Ctrl-C stops", flush=True)
        if s.host not in ("127.0.0.1", "localhost", "::1"):
            logger.warning(f"listening on {s.host}: anyone who can reach this port can use the service")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        logger.info("shutting down")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        serve.shutdown()
        import ray

        ray.shutdown()
