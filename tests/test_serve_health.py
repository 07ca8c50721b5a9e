"""A replica's failures: Ray Serve's health check replaces one whose device broke, callers never see internal
error text, and a failed batch is logged once (the replica as Ray Serve builds it, without starting Serve)."""

import asyncio
import json
import logging

import pytest
from registry_files import small_tokenizer, small_translator

from pipeline.serve import requests, service
from pipeline.text.translator import SourceTooLong

pytestmark = pytest.mark.filterwarnings("ignore:coroutine .*ASGIIngressWrapper.__del__.* was never awaited")
CUDA_FAULT = "CUDA error: an illegal memory access was encountered (at /opt/build/secret/kernel.cu:42)"


@pytest.fixture
def replica():
    """A replica's state as __init__ leaves it, with a real small model as its engine."""
    cls = service.TranslationService.func_or_class
    instance = cls.__new__(cls)
    translator = small_translator(small_tokenizer(), max_positions=64)
    instance._engine = lambda texts, beam: translator.translate(texts, beam_size=beam)
    instance.translator, instance.unhealthy, instance.batch_sizes = translator, "", []
    instance.model_uri, instance.version, instance.engine, instance.beam_size, instance.alpha = (
        "models:/m/1", "1", "pytorch", 1, 0.6)
    return instance


def _break_the_device(monkeypatch, translator):
    def broken(*args, **kwargs):
        raise RuntimeError(CUDA_FAULT)

    monkeypatch.setattr(translator.model.encoder, "forward", broken)


def test_health_check_passes_then_fails_once_the_device_breaks_and_healthz_says_so(replica, monkeypatch):
    asyncio.run(replica.check_health())
    assert asyncio.run(replica.healthz()).status_code == 200
    _break_the_device(monkeypatch, replica.translator)
    with pytest.raises(RuntimeError, match="fails a probe sentence"):  # Ray Serve replaces the replica
        asyncio.run(replica.check_health())
    answer = asyncio.run(replica.healthz())
    assert answer.status_code == 503 and json.loads(answer.body)["status"] == "unhealthy"


def test_health_of_a_failed_request_hides_internal_text_and_logs_it_once(replica, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="ray.serve")
    _break_the_device(monkeypatch, replica.translator)
    results = asyncio.run(service.translate_apart(replica._engine, ["a dog", "a small dog"], 1))
    assert all(isinstance(r, RuntimeError) for r in results)
    assert len([r for r in caplog.records if "a batch of 2 sentence(s) failed" in r.message]) == 1
    caplog.clear()
    answer = requests.failure_response(1, results[1])
    body = json.loads(answer.body)["error"]
    assert answer.status_code == 500 and "CUDA" not in body and "secret" not in body and '"texts"[1]' in body
    (line,) = [r.message for r in caplog.records]
    assert body.rsplit(" ", 1)[1] in line and CUDA_FAULT[:40] in line  # the reference leads to the cause
    for internal in (ValueError("operands could not be broadcast together"), KeyError("weight")):
        assert requests.failure_response(0, internal).status_code == 500
    too_long = requests.failure_response(0, SourceTooLong("a source of 300 tokens is longer than the model's 64 "
                                                         "positions"))
    assert too_long.status_code == 422 and "64 positions" in json.loads(too_long.body)["error"]
