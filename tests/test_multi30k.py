"""Real learning on real data: a few minutes of training on a Multi30k subset lifts held-out BLEU well above 0."""

import pytest
import sacrebleu
import torch
from reference_search import reference_beam_search

from model import TransformerConfig, beam_search
from pipeline.common import checkpoint
from pipeline.config import load_config
from pipeline.data.prepare import prepare
from pipeline.text.tokenizer import PAD_ID
from pipeline.text.translator import Translator
from pipeline.train.loop import train_loop
from pipeline.train.workers import TorchrunContext

pytestmark = pytest.mark.slow


def _subset(source, target, lines: int) -> None:
    target.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]),
                      encoding="utf-8")


def test_a_few_minutes_on_multi30k_lift_validation_bleu_well_above_zero(ray_session, multi30k_dir, tmp_path):
    corpus = tmp_path / "multi30k"
    corpus.mkdir()
    for split, lines in (("train", 12000), ("val", 300), ("test_2016_flickr", 100)):
        for lang in ("en", "de"):
            _subset(multi30k_dir / f"{split}.{lang}", corpus / f"{split}.{lang}", lines)
    cfg = load_config("configs/multi30k_en_de.yaml", [
        f"data.path={corpus}", f"data.output_dir={tmp_path / 'data'}", "data.vocab_size=3000",
        # A quick recipe of its own, model included: its learning rate suits 4 heads, not every shipped config.
        "model.num_heads=4", "model.num_layers=2", "model.dropout=0.1", "train.num_workers=1", "train.max_tokens=3000",
        "train.max_steps=400", "train.epochs=100", "train.val_interval=200", "train.warmup_steps=300",
        "train.lr_scale=2.0", "train.beam_size=1", "train.average_last=1", "train.log_every=50"])
    manifest = prepare(cfg.data)
    train_loop({"config": cfg.to_dict(), "data_path": manifest.path}, TorchrunContext(str(tmp_path / "runs")))
    last = checkpoint.load(sorted((tmp_path / "runs").glob("checkpoint_*"))[-1])
    history = last["progress"]["history"]
    assert history[0]["val_bleu"] < history[-1]["val_bleu"]
    assert history[-1]["val_bleu"] >= 5.0, history  # an untrained model scores ~0; 400 updates: 8.1-9.7

    _beam_search_returns_what_the_reference_returns_on_test2016(last, manifest, multi30k_dir)
    _the_ctranslate2_export_decodes_like_pytorch(last, manifest, tmp_path)


def _beam_search_returns_what_the_reference_returns_on_test2016(state: dict, manifest, multi30k_dir) -> None:
    """The trained model's beam-4 outputs for all 1,000 sentences of test2016 equal the reference search's."""
    model = Translator.from_state(state["model"], TransformerConfig.from_dict(state["model_config"]),
                                  manifest.tokenizer()).model.eval()
    lines = (multi30k_dir / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    ids = sorted(manifest.tokenizer().encode_src(lines), key=len)
    assert len(ids) == 1000
    differing = 0
    for start in range(0, len(ids), 125):  # length-sorted batches, as translate_ids makes them
        chunk = ids[start: start + 125]
        src = torch.full((len(chunk), max(map(len, chunk))), PAD_ID, dtype=torch.long)
        for row, sentence in enumerate(chunk):
            src[row, : len(sentence)] = torch.tensor(sentence)
        ours, reference = beam_search(model, src, beam_size=4), reference_beam_search(model, src, 4)
        differing += sum(a != b for a, b in zip(ours, reference))
    assert differing == 0, f"{differing} of 1000 test2016 translations differ from the reference search"


def _the_ctranslate2_export_decodes_like_pytorch(state: dict, manifest, tmp_path) -> None:
    """The trained model's CTranslate2 export: the same beam outputs, and int8 close to float32 in BLEU."""
    ct2 = pytest.importorskip("pipeline.text.ct2")
    pytest.importorskip("ctranslate2")
    translator = Translator.from_state(state["model"], TransformerConfig.from_dict(state["model_config"]),
                                       manifest.tokenizer(), beam_size=4)
    test = manifest.read_split("test", ["src", "tgt"])
    sources, references = test.column("src").to_pylist(), [test.column("tgt").to_pylist()]
    # alpha 0: CTranslate2 divides a beam's score by length ** alpha, model.decoding by the GNMT penalty, so
    # only without length normalisation are the two searches the same algorithm.
    options = {"alpha": 0.0, "max_len": 80}
    ours = translator.translate(sources, **options)
    outputs = {quantization: ct2.Ct2Translator(ct2.export(translator, tmp_path / quantization, quantization),
                                               beam_size=4).translate(sources, **options)
               for quantization in ("float32", "int8")}
    bleu = {name: sacrebleu.corpus_bleu(hyps, references).score
            for name, hyps in {"pytorch": ours, **outputs}.items()}
    same = sum(a == b for a, b in zip(ours, outputs["float32"])) / len(ours)
    print(f"CTranslate2 float32: {same:.1%} identical to PyTorch; BLEU {bleu}")
    assert same >= 0.99 and abs(bleu["float32"] - bleu["pytorch"]) <= 0.1, (same, bleu)
    # 100 sentences of a 400-update model: BLEU moves by about a point for any small change in the outputs.
    assert abs(bleu["int8"] - bleu["float32"]) <= 1.5, bleu
