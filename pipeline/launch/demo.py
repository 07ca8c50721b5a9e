"""`nmt demo`: the whole pipeline on the built-in corpus in minutes, then the commands to explore it.

Ray Data prepares the corpus, a Ray Tune sweep over heads, layers and warmup runs 2-worker
Ray Train trials, MLflow records everything and registers the champion, which is then
scored on the test split and asked for a few translations.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG, SPACE = ROOT / "configs" / "demo.yaml", ROOT / "tune_spaces" / "demo.yaml"
QUICK_SPACE = ROOT / "tune_spaces" / "demo_quick.yaml"
EXAMPLES = 3  # translations shown at the end
# The sweep's trials are short: a fixed number of updates, validated every 100. ASHA's first rung
# is the longest warmup of the space (200): the demo model starts translating after about 150
# updates of 2 x 4096 tokens, and no trial is judged while it is still warming up.
# A progress line every 75 updates (~20 s here; 50 in --quick) keeps the whole demo to about 80 lines.
FULL = ["train.max_steps=300", "train.epochs=100", "train.val_interval=100", "train.log_every=75",
        "train.average_last=2", "tune.num_samples=4", "tune.name=demo"]
# --quick (CI): a smaller corpus, two 200-update trials that both run to the end (their warmup is
# the whole run's first 200 updates: there is nothing for ASHA to judge fairly), on batches of half
# the full demo's tokens. The demo model learns the corpus from about update 150 on: val BLEU ~1 at
# 100, 8-13 at 200 (three seeds; 21 with the full batches, in half again as much time).
QUICK = ["data.demo_sizes={train: 20000, validation: 300, test: 300}", "train.max_tokens=2048",
         "train.max_steps=200", "train.epochs=100",
         "train.val_interval=100", "train.log_every=50", "train.average_last=1", "train.beam_size=2",
         "tune.search=grid", "tune.scheduler=fifo", "tune.name=demo-quick"]


def _banner(step: int, total: int, text: str) -> None:
    print(f"\n=== [{step}/{total}] {text}", flush=True)


def run_demo(quick: bool = False, workdir: str | None = None, overrides: list[str] | None = None,
             address: str | None = None) -> dict:
    """Prepare, sweep, register, evaluate, translate; returns the figures the summary shows."""
    from ..serve.commands import evaluate, load_engine, pin, split_texts, translate
    from ..track.registry import champion_uri
    from ..track.target import connect
    from ..tune.summary import format_trials
    from ..tune.sweep import sweep

    work = Path(workdir or ".").resolve()
    settings = [*(QUICK if quick else FULL), f"data.output_dir={work / 'data' / 'prepared'}",
                f"train.storage_path={work / 'runs'}"]
    if workdir is not None:  # else MLflow's default: MLFLOW_TRACKING_URI, or sqlite:///mlflow.db here
        settings.append(f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}")
    cfg = load_config(CONFIG, [*settings, *(overrides or [])])
    uri = connect(cfg.tracking.tracking_uri).uri
    space = QUICK_SPACE if quick else SPACE
    started = time.perf_counter()
    _banner(1, 4, f"Ray Tune sweep of {space.relative_to(ROOT)} (each trial a {cfg.train.num_workers}-worker Ray "
                  f"Train run of {cfg.train.max_steps} updates; the corpus is prepared with Ray Data first)")
    outcome = sweep(cfg, str(space), address=address, resume=None)  # a second run continues or reports it
    _banner(2, 4, "trials (val BLEU on the validation split)")
    print(format_trials(outcome))
    model_uri = champion_uri(cfg.tracking.registered_model)
    pinned, version = pin(uri, model_uri)  # steps 3 and 4 use this version, wherever the alias moves meanwhile
    _banner(3, 4, f"test BLEU of the champion ({model_uri})")
    scores = evaluate(uri, cfg.tracking.experiment, pinned, None, split="test")  # decoding stored with the model
    print(f"test BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f}  ({scores['bleu_signature']})")
    _banner(4, 4, "example translations from the test split")
    sources, references, _ = split_texts(version, "test", None)
    with tempfile.TemporaryDirectory() as scratch:  # where a CTranslate2 export would be downloaded to
        engine = load_engine(uri, pinned, "auto", "auto", scratch).translate
        hypotheses = translate(engine, sources[:EXAMPLES], None)
    for src, ref, hyp in zip(sources, references, hypotheses):
        print(f"  en : {src}\n  de*: {ref}\n  out: {hyp}\n")
    minutes = (time.perf_counter() - started) / 60
    store = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else uri
    print(f"Done in {minutes:.1f} min. Next:")
    if uri.startswith("sqlite:///"):
        print(f"  mlflow ui --backend-store-uri sqlite:///{store} --host 127.0.0.1 --port 5000   # then open "
              f"http://127.0.0.1:5000")
    print(f"  nmt translate --model {model_uri} \"the small dog sees a red house .\"")
    print(f"  nmt serve --model {model_uri} --port 8000   # POST /translate {{\"texts\": [...]}}")
    print(f"  nmt evaluate --model {model_uri} --split test")
    print(f"  nmt tune --config {CONFIG.relative_to(ROOT)} --space {SPACE.relative_to(ROOT)}   # a sweep of your own")
    return {"test_bleu": scores["bleu"], "trials": outcome.trials, "best": outcome.best,
            "registered": outcome.registered, "minutes": minutes}

