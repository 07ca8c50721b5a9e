"""The Ray Serve translation service over real HTTP, as `nmt serve` runs it: translations, every bad request's
4xx, a burst, sustained load, /healthz, and Ctrl-C shutting it down (the module's last test)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest
from conftest import environment, free_port, stop_process, wait_http
from hypothesis import given, settings
from hypothesis import strategies as st
from small import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
PREFIX = ""  # `nmt serve` serves at the root
SENTENCES = ["the dog sees the cat .", "a small child plays in the garden ."]


def post(port: int, method: str, path: str, body: bytes | None = None, timeout_s: float = 120):
    """(status, parsed JSON body or the raw text) of one HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", "replace")


def _translate(port: int, payload) -> tuple[int, object]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return post(port, "POST", f"{PREFIX}/translate", body)


def test_nmt_serve_with_a_missing_model_is_one_line(champion):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "serve", "--model", "models:/no-such-model@champion", "--set",
         f"tracking.tracking_uri={champion.uri}"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2
    assert "not in the registry" in result.stderr and "Traceback" not in result.stderr


LIMITS = {"max_batch_size": 8, "batch_wait_timeout_s": 0.02, "max_ongoing_requests": 2, "max_queued_requests": 2,
          "request_timeout_s": 90, "max_texts": 4, "max_chars": 200}  # small: a burst overflows them


def _wait_for_line(log_path, text: str, timeout_s: float, process) -> None:
    """Poll the command's log until it prints text; fail if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log_path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            pytest.fail(f"`nmt serve` exited with {process.returncode} before printing {text!r}")
        time.sleep(0.5)
    pytest.fail(f"`nmt serve` did not print {text!r} within {timeout_s:.0f}s")


@pytest.fixture(scope="module")
def served(ray_session, champion, tmp_path_factory):
    """`nmt serve` of the champion in its own process, on the session's Ray instance (a second one costs half
    a minute on 2 cores), with LIMITS; (port, process, log path). Stopped afterwards if a test has not."""
    import types

    port, log_path = free_port(), tmp_path_factory.mktemp("nmt-serve") / "serve.log"
    command = [sys.executable, "-m", "pipeline", "serve", "--model", f"models:/{champion.model_name}@champion",
               "--port", str(port), "--address", ray_session.get_runtime_context().gcs_address,
               "--set", f"tracking.tracking_uri={champion.uri}",
               *(x for key, value in LIMITS.items() for x in ("--set", f"serve.{key}={value}"))]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                   env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    try:
        # The URL line is the user's signal that the app is RUNNING; /healthz can answer a moment before
        # serve.run returns, and a Ctrl-C then would interrupt the start-up instead of the service.
        _wait_for_line(log_path, f"at http://127.0.0.1:{port}", 240, process)
        wait_http(f"http://127.0.0.1:{port}/healthz", 30, process)
        yield types.SimpleNamespace(port=port, process=process, log=log_path)
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def service(served):
    """The served port (module-scoped like the service: hypothesis runs its examples on one fixture value)."""
    return served.port


def test_translates_like_the_registered_model(service, champion, tmp_path):
    from pipeline.track import registry

    status, body = _translate(service, {"texts": SENTENCES, "beam_size": 2})
    assert status == 200, body
    assert body["model_version"] == champion.version
    # Another registry named in the environment: the model is still the tracking server's.
    with environment(MLFLOW_REGISTRY_URI=f"sqlite:///{tmp_path / 'elsewhere.db'}"):
        model = registry.load(champion.uri, f"models:/{champion.model_name}/{champion.version}")
    import pandas as pd

    expected = model.predict(pd.DataFrame({"src": SENTENCES}), params={"beam_size": 2})["translation"].tolist()
    assert body["translations"] == expected
    status, body = _translate(service, {"texts": [SENTENCES[0]]})  # beam_size is optional
    assert status == 200 and len(body["translations"]) == 1 and isinstance(body["translations"][0], str)


BAD = [
    pytest.param(b"{not json", 400, "not valid JSON", id="malformed-json"),
    pytest.param(b"\xff\xfe{}", 400, "not valid JSON", id="not-utf8"),
    pytest.param(b"[1, 2]", 400, "JSON object", id="not-an-object"),
    pytest.param({"text": ["hi"]}, 400, "unknown field 'text'", id="unknown-field"),
    pytest.param({"beam_size": 2}, 400, "required", id="no-texts"),
    pytest.param({"texts": "hello"}, 400, "must be a list", id="texts-not-a-list"),
    pytest.param({"texts": []}, 400, "empty", id="empty-list"),
    pytest.param({"texts": ["ok", 3]}, 400, '"texts"[1] must be a string', id="non-string-item"),
    pytest.param({"texts": ["a"] * 5}, 413, "at most 4", id="too-many-texts"),
    pytest.param({"texts": ["x" * 201]}, 413, "at most 200", id="text-too-long"),
    pytest.param({"texts": ["hi"], "beam_size": 0}, 400, "beam_size", id="beam-0"),
    pytest.param({"texts": ["hi"], "beam_size": "x"}, 400, "beam_size", id="beam-x"),
    pytest.param({"texts": ["hi"], "beam_size": True}, 400, "beam_size", id="beam-bool"),
    pytest.param({"texts": ["hi"], "beam_size": 1000}, 400, "beam_size", id="beam-huge"),
    pytest.param(b'{"texts": ["ok", "a \\ud800 b"]}', 400, '"texts"[1] is not valid Unicode', id="lone-surrogate"),
    pytest.param(b'{"texts": [' + b"[" * 5_000 + b"]" * 5_000 + b"]}", 400, "nested too deeply", id="deep-nesting"),
    pytest.param(b'{"texts": ["' + b"x" * 20_000 + b'"]}', 413, "too large", id="body-too-large"),
]


@pytest.mark.parametrize(("payload", "status", "message"), BAD)
def test_bad_request_gets_4xx_with_json_error(service, payload, status, message):
    got, body = _translate(service, payload)
    assert got == status, body
    assert isinstance(body, dict) and message in body["error"]


def _send_headers(port: int, headers: dict[str, str]) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("POST", f"{PREFIX}/translate")
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    return conn


def test_a_huge_body_is_refused_before_it_is_read(service):
    """A declared 10 GB is refused from its Content-Length; an undeclared (chunked) one once it passes the limit."""
    conn = _send_headers(service, {"Content-Type": "application/json", "Content-Length": str(10 * 2**30)})
    try:  # nothing of the body is sent: the answer cannot wait for it
        response = conn.getresponse()
        assert response.status == 413 and "too large" in json.loads(response.read())["error"]
    finally:
        conn.close()
    conn = _send_headers(service, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    try:
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):  # the server may close the connection while we still send
            for _ in range(64):  # 4 MiB, against a limit of some 10 kB; far less is read before the answer
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        response = conn.getresponse()
        assert response.status == 413 and "too large" in json.loads(response.read())["error"]
    finally:
        conn.close()
    assert _translate(service, {"texts": ["the cat ."]})[0] == 200


def test_good_requests_beside_bad_ones_get_their_own_translations(service):
    """Good and bad requests at once, batched together: each good one gets 200 and the translation it gets alone."""
    good = [{"texts": [text], "beam_size": 2} for text in SENTENCES * 3]
    expected = [_translate(service, payload)[1]["translations"] for payload in good[:2]]
    bad = [b'{"texts": ["\\ud83d"], "beam_size": 2}', b'{"texts": ["nul \\u0000 byte"], "beam_size": 2}',
           b'{"texts": [' + b"[" * 5_000 + b"]" * 5_000 + b"]}", b'{"texts": ["' + b"y" * 300 + b'"]}']
    answers: dict[int, tuple[int, object]] = {}

    def client(i: int, body: bytes) -> None:
        answers[i] = post(service, "POST", f"{PREFIX}/translate", body)

    bodies = [json.dumps(payload).encode() for payload in good] + bad
    threads = [threading.Thread(target=client, args=(i, body)) for i, body in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    for i in range(len(good)):
        status, body = answers[i]
        if status == 503:  # refused at the door (2 ongoing + 2 queued): not an answer to compare
            continue
        assert status == 200 and body["translations"] == expected[i % 2], (i, status, body)
    statuses = [answers[len(good) + k][0] for k in range(len(bad))]
    assert statuses[0] in (400, 503) and statuses[2] in (400, 503) and statuses[3] in (413, 503), statuses
    assert statuses[1] in (200, 503), answers[len(good) + 1]  # NUL is a character like any other
    assert sum(answers[i][0] == 200 for i in range(len(good))) >= 2


def test_a_sentence_that_fails_the_model_fails_only_its_own_request(champion):
    """What a replica does with one batch: when the model call fails, each sentence alone, so only one fails."""
    import asyncio

    from pipeline.serve.commands import load_engine
    from pipeline.serve.service import translate_apart

    model_uri = f"models:/{champion.model_name}/{champion.version}"
    engine = load_engine(champion.uri, model_uri, "pytorch", "cpu", "").translate

    def failing_on_one_sentence(texts, beam):  # a fault where the model is called
        if "boom" in texts:
            raise ValueError("a source of 2000 tokens is longer than the model's 1024 positions")
        return engine(texts, beam)

    *good, bad = asyncio.run(translate_apart(failing_on_one_sentence, [*SENTENCES, "boom"], 2))
    assert good == engine(SENTENCES, 2) and isinstance(bad, ValueError)
    assert asyncio.run(translate_apart(failing_on_one_sentence, SENTENCES, 2)) == good


def test_wrong_route_or_method_is_json_4xx_and_replica_survives(service):
    assert post(service, "GET", f"{PREFIX}/translate")[0] == 405
    status, body = post(service, "GET", f"{PREFIX}/nowhere")
    assert status == 404 and "error" in body
    assert _translate(service, {"texts": ["the cat ."]})[0] == 200  # after every bad request above


def test_burst_gets_200_or_503_and_nothing_is_lost(service):
    """200 requests from 20 threads against 2 ongoing + 2 queued: the overflow is refused, not queued."""
    statuses: list[object] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(10):
            try:
                status, _ = _translate(service, {"texts": [SENTENCES[(k + i) % 2]], "beam_size": 1})
            except OSError as err:  # a dropped connection is a lost request
                status = f"{type(err).__name__}: {err}"
            with lock:
                statuses.append(status)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    counts = {str(s): statuses.count(s) for s in set(statuses)}
    print(f"burst of 200 in {time.monotonic() - started:.1f}s: {counts}")
    assert len(statuses) == 200, counts
    assert set(statuses) <= {200, 503}, counts
    assert statuses.count(200) > 0 and statuses.count(503) > 0, counts


def _replica_rss(app_name: str) -> int:
    """Resident memory of the app's one Translator replica process."""
    import psutil
    import ray
    from ray.util.state import list_actors

    # The session's cluster by name: other clusters may run on this machine too, and without an
    # address Ray's State API asks the newest one.
    (actor,) = [a for a in list_actors(address=ray.get_runtime_context().gcs_address,
                                       filters=[("state", "=", "ALIVE")], limit=1000)
                if a.class_name == f"ServeReplica:{app_name}:Translator"]
    return psutil.Process(actor.pid).memory_info().rss


def test_sustained_load_keeps_latency_bounded_refuses_overflow_and_memory_flat(service):
    """LOAD_S seconds (default 15) of 8 clients against 2 ongoing + 2 queued: always more than it takes."""
    seconds = float(os.environ.get("LOAD_S", "15"))
    results: list[tuple[object, float]] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            started = time.monotonic()
            try:
                status, _ = _translate(service, {"texts": [SENTENCES[(k + i) % 2]], "beam_size": 2})
            except OSError as err:
                status = f"{type(err).__name__}: {err}"
            with lock:
                results.append((status, time.monotonic() - started))
            if status == 503:
                time.sleep(0.1)  # an impatient client: Retry-After asks for 1 s
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    rss = []  # the replica's memory once a second, from the 5th second on (after warm-up)
    while time.monotonic() < stop:
        time.sleep(1)
        if stop - time.monotonic() < seconds - 5:
            rss.append(_replica_rss("nmt"))
    for t in threads:
        t.join(timeout=120)
    statuses = [s for s, _ in results]
    counts = {str(s): statuses.count(s) for s in set(statuses)}
    ok = sorted(latency for status, latency in results if status == 200)
    refused = sorted(latency for status, latency in results if status == 503)
    p99 = ok[int(0.99 * (len(ok) - 1))]
    tenth = max(1, len(rss) // 10)
    growth_mib = (statistics.median(rss[-tenth:]) - statistics.median(rss[:tenth])) / 2**20
    print(f"{seconds:.0f}s of load: {counts}, 200 p50 {ok[len(ok) // 2]:.3f}s p99 {p99:.3f}s, "
          f"503 p99 {refused[int(0.99 * (len(refused) - 1))] if refused else 0:.3f}s, "
          f"replica RSS {rss[0] / 2**20:.0f} -> {rss[-1] / 2**20:.0f} MiB")
    assert set(statuses) <= {200, 503}, counts  # nothing lost, no 5xx other than the overflow's 503
    assert len(ok) > 10 * seconds / 60 and refused, counts
    assert p99 < 5.0  # at most 4 requests wait at the replica, each well under a second
    assert refused[-1] < 5.0  # overflow is answered at once, not after queueing
    assert growth_mib < 64, [r // 2**20 for r in rss]


CHARACTERS = st.characters(codec=None, exclude_categories=())  # every code point: lone surrogates and NUL too
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
REQUESTS = st.one_of(
    st.binary(max_size=200),  # anything at all
    JSON.map(lambda value: json.dumps(value).encode()),  # any JSON
    st.fixed_dictionaries({"texts": JSON}, optional={"beam_size": JSON}).map(lambda d: json.dumps(d).encode()),
    # nearly right: real text (lone surrogates, control characters, emoji), odd beams, limits crossed
    st.fixed_dictionaries({"texts": st.lists(st.text(CHARACTERS, max_size=230), max_size=6)},
                          optional={"beam_size": st.integers(-3, 20)}).map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=120, deadline=None, database=None)
@given(body=REQUESTS)
def test_fuzzed_requests_get_200_or_a_json_4xx_never_a_5xx(service, body):
    status, answer = post(service, "POST", f"{PREFIX}/translate", body)
    assert status == 200 or (400 <= status < 500 and isinstance(answer, dict) and "error" in answer), \
        (status, answer, body[:300])
    if status == 200:
        assert isinstance(answer["translations"], list) and all(isinstance(t, str) for t in answer["translations"])


def test_healthz(service, champion):
    status, body = post(service, "GET", f"{PREFIX}/healthz")
    assert status == 200
    assert body["status"] == "ok" and body["model_version"] == champion.version
    assert body["engine"] == "pytorch"  # auto, and the champion has no CTranslate2 export
    # Requests without a beam_size decode as the model was validated: the settings stored with it.
    assert (body["beam_size"], body["length_penalty"]) == (champion.cfg.train.beam_size,
                                                            champion.cfg.train.length_penalty)


def test_parse_request_limits():
    from pipeline.serve.requests import BadRequest, parse_request

    assert parse_request(b'{"texts": ["a", ""], "beam_size": 3}', 4, 10) == (["a", ""], 3)
    assert parse_request(b'{"texts": ["a"]}', 4, 10) == (["a"], None)  # the model's own beam size
    with pytest.raises(BadRequest, match="beam_size"):  # null is not "absent"
        parse_request(b'{"texts": ["a"], "beam_size": null}', 4, 10)
    with pytest.raises(BadRequest) as err:
        parse_request(b"x" * 100_000, 4, 10)
    assert err.value.status == 413


def test_build_app_checks_args_and_model(champion):
    from pipeline.common.errors import UserError
    from pipeline.config import ConfigError
    from pipeline.serve.app import build_app

    with pytest.raises(ConfigError, match="serve.max_batch_sizes"):
        build_app({"max_batch_sizes": "4"})
    with pytest.raises(ConfigError, match="serve.max_batch_size must be positive"):
        build_app({"max_batch_size": "0"})
    with pytest.raises(UserError, match="not in the registry"):
        build_app({"model_uri": "models:/no-such-model@champion", "tracking_uri": champion.uri})


def test_nmt_serve_command_serves_until_interrupted(served):
    """The module's last test: Ctrl-C shuts Serve down (its proxy with it) and `nmt serve` exits 0."""
    assert _translate(served.port, {"texts": SENTENCES})[0] == 200
    served.process.send_signal(signal.SIGINT)
    assert served.process.wait(90) == 0, served.log.read_text()[-3000:]
    with pytest.raises(OSError):  # Serve was shut down, its proxy with it
        post(served.port, "GET", "/healthz", timeout_s=5)
    assert "[serve] shutting down" in served.log.read_text()
