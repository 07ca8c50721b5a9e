"""The Ray Serve deployment: POST /translate, GET /healthz, dynamic batching over sentences, a health check.

Its requests are checked by serve/requests.py; serve/app.py binds it to a pinned model version and a
config section (ServiceSpec); serve/lifecycle.py is `nmt serve`.
"""

# No `from __future__ import annotations`: Ray pickles the deployment class by value, with only the globals
# its code names, so FastAPI could not resolve a string annotation such as "Request" in the replica.
import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException

from ..config import ServeConfig
from ..track.target import TrackingTarget
from .requests import MAX_BEAM_SIZE, BadRequest, body_limit, failure_response, first_line, parse_request, read_body

PROBE_TEXT = "a"  # what a health check translates: the shortest input that runs the whole model


@dataclass(frozen=True)
class ServiceSpec:
    """What a replica is built from (pickled to it): the pinned model, its tracking target, the section's limits."""

    model_uri: str  # models:/NAME/VERSION, never an alias: every replica loads the same version
    version: str
    target: TrackingTarget  # the deploying process's tracking URI and login (the read-only one in a RayService)
    max_batch_size: int
    batch_wait_timeout_s: float
    max_texts: int
    max_chars: int
    request_timeout_s: float
    engine: str

    @classmethod
    def of(cls, cfg: ServeConfig, target: TrackingTarget, model_uri: str, version: str) -> "ServiceSpec":
        """The spec of a serve config section for one pinned model version."""
        return cls(model_uri, version, target, cfg.max_batch_size, cfg.batch_wait_timeout_s, cfg.max_texts,
                   cfg.max_chars, cfg.request_timeout_s, cfg.engine)

api = FastAPI(title="Transformer NMT", docs_url=None, redoc_url=None)


@api.exception_handler(HTTPException)
async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    # FastAPI's own 404/405 answers, in the same {"error": ...} shape as ours.
    return JSONResponse({"error": str(err.detail)}, status_code=err.status_code)


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
        logging.getLogger("ray.serve").warning(f"a batch of {len(texts)} sentence(s) failed ({first_line(err)}); "
                                               f"translating them one by one")
    out: list[str | Exception] = []
    for text in texts:
        try:
            out.append((await asyncio.to_thread(predict, [text]))[0])
        except Exception as err:
            out.append(err)
    return out


# Ray Serve calls check_health every period and replaces a replica whose check raises or outlasts the timeout.
@serve.deployment(name="Translator", max_ongoing_requests=32, max_queued_requests=64, health_check_period_s=10,
                  health_check_timeout_s=60)
@serve.ingress(api)
class TranslationService:
    """One replica: a loaded model (PyTorch or its CTranslate2 export); requests are split into sentences that
    @serve.batch regroups."""

    def __init__(self, spec: ServiceSpec):
        import tempfile

        from .commands import load_engine

        # The tracking target (its login) travels in the spec (pickled to the replica), never in the URI or
        # in a runtime_env, which the dashboard shows.
        spec.target.activate()
        self.model_uri, self.version = spec.model_uri, spec.version
        self.max_texts, self.max_chars, self.request_timeout_s = spec.max_texts, spec.max_chars, spec.request_timeout_s
        # "auto": the GPU Serve gave this replica (serve.num_gpus), else the CPU. A CTranslate2 model is
        # read into memory when loaded, so its downloaded files can go.
        with tempfile.TemporaryDirectory() as workdir:
            loaded = load_engine(spec.target.uri, spec.model_uri, spec.engine, "auto", workdir)
            self.engine, self._engine = loaded.name, loaded.translate
            # A request without beam_size decodes as the model was validated, within the service's bound.
            self.beam_size, self.alpha = min(loaded.beam_size, MAX_BEAM_SIZE), loaded.alpha
        # The batch limits of the config section (the decorator's are Serve's placeholders until here).
        self._translate_one.set_max_batch_size(spec.max_batch_size)
        self._translate_one.set_batch_wait_timeout_s(spec.batch_wait_timeout_s)
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
            self.unhealthy = first_line(err)
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

    @serve.batch
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


