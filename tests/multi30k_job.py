"""The work of tests/test_multi30k.py, a script of its own: prepare a Multi30k subset, train a few
hundred updates in this process, then decode test2016 with our beam search, the reference search and the
CTranslate2 export. It writes the figures the test asserts on to WORKDIR/result.json.

    python tests/multi30k_job.py MULTI30K_DIR WORKDIR
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import sacrebleu
import torch
from reference_search import reference_beam_search

from model import TransformerConfig, beam_search
from pipeline.common import checkpoint, log
from pipeline.config import load_config
from pipeline.data.prepare import prepare
from pipeline.text.tokenizer import PAD_ID
from pipeline.text.translator import Translator
from pipeline.train.loop import train_loop
from pipeline.train.workers import TorchrunContext

SUBSET = {"train": 12000, "val": 300, "test_2016_flickr": 100}  # lines per split
# A quick recipe of its own, model included: its learning rate suits 4 heads, not every shipped config.
RECIPE = ["data.vocab_size=3000", "model.num_heads=4", "model.num_layers=2", "model.dropout=0.1",
          "train.num_workers=1", "train.max_tokens=3000", "train.max_steps=400", "train.epochs=100",
          "train.val_interval=200", "train.warmup_steps=300", "train.lr_scale=2.0", "train.beam_size=1",
          "train.average_last=1", "train.log_every=50"]


ROOT = Path(__file__).resolve().parents[1]

def subset(multi30k: Path, corpus: Path) -> None:
    """The first lines of each split, in both languages."""
    corpus.mkdir(parents=True, exist_ok=True)
    for split, lines in SUBSET.items():
        for lang in ("en", "de"):
            text = (multi30k / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
            (corpus / f"{split}.{lang}").write_text("".join(text[:lines]), encoding="utf-8")


def beam_differences(state: dict, tokenizer, multi30k: Path) -> int:
    """How many of test2016's 1,000 beam-4 outputs differ between model.beam_search and the reference search."""
    model = Translator.from_state(state["model"], TransformerConfig.from_dict(state["model_config"]),
                                  tokenizer).model.eval()
    lines = (multi30k / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    ids = sorted(tokenizer.encode_src(lines), key=len)
    assert len(ids) == 1000, len(ids)
    differing = 0
    for start in range(0, len(ids), 125):  # length-sorted batches, as translate_ids makes them
        chunk = ids[start: start + 125]
        src = torch.full((len(chunk), max(map(len, chunk))), PAD_ID, dtype=torch.long)
        for row, sentence in enumerate(chunk):
            src[row, : len(sentence)] = torch.tensor(sentence)
        ours, reference = beam_search(model, src, beam_size=4), reference_beam_search(model, src, 4)
        differing += sum(a != b for a, b in zip(ours, reference))
    return differing


def ct2_comparison(state: dict, manifest, tokenizer, workdir: Path) -> dict | None:
    """The CTranslate2 export against PyTorch on the test subset: identical outputs and BLEU per quantization."""
    try:
        import ctranslate2  # noqa: F401

        from pipeline.text import ct2
    except ImportError:
        return None
    translator = Translator.from_state(state["model"], TransformerConfig.from_dict(state["model_config"]),
                                       tokenizer, beam_size=4)
    test = manifest.read_split("test", ["src", "tgt"])
    sources, references = test.column("src").to_pylist(), [test.column("tgt").to_pylist()]
    # alpha 0: CTranslate2 divides a beam's score by length ** alpha, model.decoding by the GNMT penalty, so
    # only without length normalisation are the two searches the same algorithm.
    options = {"alpha": 0.0, "max_len": 80}
    ours = translator.translate(sources, **options)
    outputs = {quantization: ct2.Ct2Translator(ct2.export(translator, workdir / quantization, quantization),
                                               beam_size=4).translate(sources, **options)
               for quantization in ("float32", "int8")}
    bleu = {name: sacrebleu.corpus_bleu(hyps, references).score for name, hyps in {"pytorch": ours, **outputs}.items()}
    return {"same_as_float32": sum(a == b for a, b in zip(ours, outputs["float32"])) / len(ours), "bleu": bleu}


def main(multi30k: Path, workdir: Path) -> None:
    log.setup()
    subset(multi30k, workdir / "multi30k")
    cfg = load_config(str(ROOT / "configs" / "multi30k_en_de.yaml"),
                      [f"data.path={workdir / 'multi30k'}", f"data.output_dir={workdir / 'data'}", *RECIPE])
    import ray

    # The test session's Ray when it names one; else "local", a new instance of its own even while another
    # job's `ray start` cluster runs on this machine.
    own = {} if os.environ.get("NMT_TEST_RAY_ADDRESS") else {"num_cpus": 2, "include_dashboard": False}
    ray.init(address=os.environ.get("NMT_TEST_RAY_ADDRESS", "local"), logging_level=logging.WARNING, **own)
    manifest = prepare(cfg.data)
    ray.shutdown()
    runs = workdir / "runs"
    train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, TorchrunContext(str(runs)))
    last = checkpoint.load(sorted(runs.glob("checkpoint_*"))[-1])
    tokenizer = manifest.tokenizer()  # read once from the prepared data
    result = {"history": last["progress"]["history"], "beam_differences": beam_differences(last, tokenizer, multi30k),
              "ct2": ct2_comparison(last, manifest, tokenizer, workdir)}
    partial = workdir / "result.json.partial"
    partial.write_text(json.dumps(result, indent=1))
    partial.rename(workdir / "result.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
