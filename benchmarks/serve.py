"""Served sentences/s of the Ray Serve translation service with dynamic batching versus batch size 1.

With ctranslate2 installed, a third setting serves the same model's CTranslate2 int8 export (`nmt export`,
serve.engine=ctranslate2) with dynamic batching, under the same load.

Prints one JSON object. Builds a tiny Transformer (random weights: a trained one stops decoding
sooner, so absolute numbers are pessimistic, the ratio is what counts) with a SentencePiece
tokenizer trained on demo sentences, registers it in a temporary SQLite MLflow store, and serves
it in-process twice, the same model under the same load: `--clients` threads each sending
one-sentence POST /translate requests back to back for `--seconds`, first with
serve.max_batch_size=16, then 1. Ray runs locally with 2 CPUs (one replica, one CPU).

    python benchmarks/serve.py                      # 20 s per setting, 16 clients, beam 4
    python benchmarks/serve.py --seconds 10 --beam 1
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import logging
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def build_model(workdir: Path, uri: str) -> str:
    """Register a random-init tiny Transformer with a demo-trained tokenizer; returns its models:/ URI."""
    import torch

    from model import Transformer, TransformerConfig
    from pipeline.data.demo_corpus import generate_pairs
    from pipeline.text.tokenizer import train_tokenizer
    from pipeline.text.translator import Translator
    from pipeline.track import registry, tracking

    torch.manual_seed(0)
    pairs = generate_pairs(3000, seed=1)
    tokenizer = train_tokenizer([s for s, _ in pairs], [t for _, t in pairs], vocab_size=600)
    config = TransformerConfig.preset("tiny", vocab_size=tokenizer.src_vocab_size, d_model=64, d_ff=128,
                                      num_layers=1)
    translator = Translator(Transformer(config), tokenizer)
    with tracking.mlflow_run(uri, "serve-benchmark", "random-tiny", {"model": "random-init tiny"}, {}) as run:
        registry.register(run, translator, "serve-benchmark", 0.0, {}, pairs[0][0])
    return "models:/serve-benchmark@champion"


def load(port: int, sentences: list[str], clients: int, seconds: float, beam: int) -> dict:
    """Closed-loop load: each client sends the next sentence when its last answer came; counts by status."""
    stop_at = time.monotonic() + seconds
    counts: dict[str, int] = {}
    latencies: list[float] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        i = k
        while time.monotonic() < stop_at:
            body = json.dumps({"texts": [sentences[i % len(sentences)]], "beam_size": beam})
            started = time.monotonic()
            try:
                conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = str(response.status)
            except OSError as err:
                status = type(err).__name__
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            with lock:
                counts[status] = counts.get(status, 0) + 1
                if status == "200":
                    latencies.append(time.monotonic() - started)
            i += clients
        conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    ok = counts.get("200", 0)
    return {"sentences_per_s": round(ok / elapsed, 2), "requests": counts, "seconds": round(elapsed, 1),
            "p50_latency_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
            "p95_latency_s": round(latencies[int(len(latencies) * 0.95)], 3) if latencies else None}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthz(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/healthz")
    return json.loads(conn.getresponse().read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="load duration per setting")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    parser.add_argument("--beam", type=int, default=4, help="beam size of every request")
    parser.add_argument("--batch", type=int, default=16, help="max_batch_size of the batched setting")
    parser.add_argument("--wait", type=float, default=0.05, help="batch_wait_timeout_s (the service's default)")
    args = parser.parse_args()

    import ray
    from ray import serve

    from pipeline.config import ServeConfig
    from pipeline.data.demo_corpus import generate_pairs
    from pipeline.serve.app import app_for

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="nmt-serve-bench-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = uri
        model_uri = build_model(Path(tmp), uri)
        sentences = [s for s, _ in generate_pairs(500, seed=7)]
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
        port = free_port()
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            settings = [("batched", args.batch, "pytorch"), ("batch_1", 1, "pytorch")]
            if importlib.util.find_spec("ctranslate2") is not None:
                from pipeline.serve.commands import export

                export(uri, model_uri, str(Path(tmp) / "ct2"), "int8")  # attached to the version
                settings.append(("batched_ctranslate2_int8", args.batch, "ctranslate2"))
            for name, batch, engine in settings:
                cfg = ServeConfig(model_uri=model_uri, max_batch_size=batch, batch_wait_timeout_s=args.wait,
                                  max_ongoing_requests=max(args.clients, batch) * 2,
                                  max_queued_requests=args.clients * 4, request_timeout_s=120, engine=engine)
                serve.run(app_for(cfg, uri), name="bench", route_prefix="/")
                load(port, sentences, args.clients, min(3.0, args.seconds), args.beam)  # warm-up, not counted
                results[name] = load(port, sentences, args.clients, args.seconds, args.beam)
                results[name]["mean_batch_size"] = healthz(port)["mean_batch_size"]
                print(f"[bench] {name}: {results[name]}", file=sys.stderr, flush=True)
        finally:
            serve.shutdown()
            ray.shutdown()
    speedup = results["batched"]["sentences_per_s"] / max(results["batch_1"]["sentences_per_s"], 1e-9)
    ct2 = results.get("batched_ctranslate2_int8")
    print(json.dumps({
        "batched_sentences_per_s": results["batched"]["sentences_per_s"],
        "batch_1_sentences_per_s": results["batch_1"]["sentences_per_s"],
        "speedup": round(speedup, 2),
        **({"ctranslate2_int8_batched_sentences_per_s": ct2["sentences_per_s"],
            "ctranslate2_over_pytorch_batched":
                round(ct2["sentences_per_s"] / results["batched"]["sentences_per_s"], 2)}
           if ct2 else {}), "max_batch_size": args.batch, "clients": args.clients, "beam_size": args.beam,
        "seconds_per_setting": args.seconds, "model": "random-init tiny (d_model 64, 1+1 layers, vocab 600)",
        "cpus": os.cpu_count(), "machine": platform.machine(), "details": results,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
