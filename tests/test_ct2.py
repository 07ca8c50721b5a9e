"""The CTranslate2 export: the same network weight by weight, so the same token probabilities and greedy outputs."""

import numpy as np
import pytest
import torch
from stores import sqlite_uri

from model import Transformer, TransformerConfig
from pipeline.common.errors import UserError
from pipeline.text.tokenizer import BOS_ID, EOS_ID, train_tokenizer
from pipeline.text.translator import Translator

ct2 = pytest.importorskip("pipeline.text.ct2")
pytest.importorskip("ctranslate2")

WORDS = "a small dog runs over the green grass while two men watch the big red ball".split()


@pytest.fixture(scope="module")
def tokenizer():
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, 8)) for _ in range(300)]
    return train_tokenizer(sentences, sentences, vocab_size=60, model_type="bpe")


def _translator(tokenizer, **overrides) -> Translator:
    cfg = TransformerConfig(vocab_size=tokenizer.src_vocab_size, d_model=32, d_ff=64, num_heads=4,
                            num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, max_positions=128, **overrides)
    torch.manual_seed(0)
    return Translator(Transformer(cfg), tokenizer, device="cpu")


@torch.no_grad()
def _log_probs(translator: Translator, source: list[int], target: list[int]) -> list[float]:
    """Our teacher-forced log-probabilities of target then eos."""
    logits = translator.model(torch.tensor([source]), torch.tensor([[BOS_ID, *target]]))
    return logits.log_softmax(-1)[0, torch.arange(len(target) + 1), torch.tensor([*target, EOS_ID])].tolist()


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True, "positional_encoding": "learned"},
                                       {"tie_embeddings": False}])
def test_a_float32_export_scores_and_translates_like_the_pytorch_model(tokenizer, tmp_path, overrides):
    translator = _translator(tokenizer, **overrides)
    engine = ct2.Ct2Translator(ct2.export(translator, tmp_path / "ct2", "float32"), beam_size=1)
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, int(rng.integers(2, 9)))) for _ in range(12)]
    sources, targets = tokenizer.encode_src(texts), tokenizer.encode_tgt(texts[::-1])
    for source, target, scored in zip(sources, targets, engine.score(sources, targets)):
        np.testing.assert_allclose(scored, _log_probs(translator, source, target), atol=1e-4)
    # Greedy: the same outputs. (An untrained model's beams all run into the length limit, where the two
    # searches rank unfinished hypotheses differently; tests/test_multi30k.py compares beams of a trained one.)
    assert engine.translate(texts, max_len=12) == translator.translate(texts, beam_size=1, max_len=12)


def test_the_export_leaves_the_model_unchanged_and_replaces_an_earlier_export(tokenizer, tmp_path):
    translator = _translator(tokenizer)
    before = {k: v.clone() for k, v in translator.model.state_dict().items()}
    ct2.export(translator, tmp_path / "ct2", "float32")
    directory = ct2.export(translator, tmp_path / "ct2", "int8")  # int8 quantizes the arrays it was given
    assert all(torch.equal(before[k], v) for k, v in translator.model.state_dict().items())
    assert {"model.bin", "spm.model"} <= {p.name for p in directory.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]  # nothing half-written left beside it
    assert len(ct2.Ct2Translator(directory).translate(["a small dog"])) == 1


def test_the_export_never_replaces_a_directory_of_other_files(tokenizer, tmp_path, monkeypatch):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    monkeypatch.chdir(mine)
    for out in (".", str(mine), "notes.txt"):  # `nmt export --out .` in a project directory
        with pytest.raises(UserError, match="not empty and holds no CTranslate2 model|is a file"):
            ct2.export(_translator(tokenizer), out, "int8")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert (ct2.export(_translator(tokenizer), tmp_path / "empty", "int8") / "model.bin").is_file()


def test_an_unknown_quantization_is_a_clear_error(tokenizer, tmp_path):
    with pytest.raises(UserError, match="quantization must be one of int8, float32"):
        ct2.export(_translator(tokenizer), tmp_path / "ct2", "int4")
    assert not (tmp_path / "ct2").exists()


def test_loading_an_export_leaves_pytorch_its_threads(tokenizer, tmp_path):
    # CTranslate2 sets the process's OpenMP thread count to its intra_threads (1) when it loads a model;
    # PyTorch shares that count, and training after it would run on one thread.
    directory = ct2.export(_translator(tokenizer), tmp_path / "ct2", "int8")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = ct2.Ct2Translator(directory, threads=2)
        assert torch.get_num_threads() == 2
        assert len(engine.translate(["a small dog", "two men watch the big red ball"])) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_decoding_settings_travel_with_the_model_files_and_the_export(tokenizer, tmp_path):
    translator = _translator(tokenizer)
    translator.beam_size, translator.alpha = 3, 1.1  # as chosen on validation (train.beam_size, length_penalty)
    translator.save(tmp_path / "files")
    loaded = Translator.from_files(tmp_path / "files", device="cpu")
    assert (loaded.beam_size, loaded.alpha) == (3, 1.1)
    assert Translator.from_files(tmp_path / "files", device="cpu", beam_size=2).beam_size == 2  # asked: it wins
    engine = ct2.Ct2Translator(ct2.export(loaded, tmp_path / "ct2", "float32"))
    assert (engine.beam_size, engine.alpha) == (3, 1.1)
    (tmp_path / "files" / "decoding.json").unlink()  # files written before the settings were stored
    older = Translator.from_files(tmp_path / "files", device="cpu")
    assert (older.beam_size, older.alpha) == (4, 0.6)


def test_export_replaces_only_a_directory_it_marked_and_never_the_working_directory(tokenizer, tmp_path,
                                                                                    monkeypatch):
    # Someone's directory that happens to hold a file called model.bin: not an export of ours.
    theirs = tmp_path / "theirs"
    (theirs / "data").mkdir(parents=True)
    for name in ("model.bin", "notes.txt", "data/corpus.txt"):
        (theirs / name).write_text(name)
    with pytest.raises(UserError, match="holds no CTranslate2 model exported by nmt"):
        ct2.export(_translator(tokenizer), theirs, "int8")
    assert sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*")) == [
        "data", "data/corpus.txt", "model.bin", "notes.txt"]
    # An export carries its marker (the model it holds); a second export replaces it.
    ours = ct2.export(_translator(tokenizer), tmp_path / "ours", "int8", source="models:/m/3")
    assert ct2.export_info(ours) == {"model": "models:/m/3", "quantization": "int8", "max_positions": 128}
    assert ct2.export(_translator(tokenizer), ours, "float32", source="models:/m/4") == ours
    # `--out .` from inside an export, or from a directory below it: refused, the directory stays.
    (ours / "work").mkdir()
    for where, out in ((ours, "."), (ours / "work", "..")):
        monkeypatch.chdir(where)
        with pytest.raises(UserError, match="is the working directory or holds it"):
            ct2.export(_translator(tokenizer), out, "int8")
    assert (ours / "work").is_dir() and ct2.export_info(ours)["model"] == "models:/m/4"


def test_ct2_length_cap_refuses_or_truncates_a_source_longer_than_the_positions(tokenizer, tmp_path):
    from registry_files import small_translator

    translator = small_translator(tokenizer, max_positions=24)
    engine = ct2.Ct2Translator(ct2.export(translator, tmp_path / "ct2", "float32"), beam_size=1)
    long, short = " ".join(["dog"] * 40), "a small dog runs over the green grass"
    assert engine.too_long([short, long]) == [1] and translator.too_long([short, long]) == [1]
    for model in (engine, translator):  # the same contract for both engines
        with pytest.raises(ValueError, match="longer than the model's 24 positions"):
            model.translate([short, long])
        assert len(model.translate([short, long], truncate=True)) == 2
    # An untrained model runs its outputs to the limit: the limit stays within the positions (source + 50 would not).
    assert len(engine.translate([short] * 3)) == 3


def test_ct2_length_of_an_evaluation_source_does_not_abort_it(tokenizer, tmp_path, caplog):
    from registry_files import register, small_translator

    from pipeline.serve import commands

    uri = sqlite_uri(tmp_path)
    register(uri, "m", [small_translator(tokenizer, max_positions=24)], tmp_path)
    commands.export(uri, "models:/m/1", str(tmp_path / "ct2"), "float32")
    (tmp_path / "src.txt").write_text("a small dog\n" + " ".join(["dog"] * 40) + "\n")
    (tmp_path / "ref.txt").write_text("a small dog\nthe dogs\n")
    scores = commands.evaluate(uri, "e", "models:/m/1", 1, src_file=str(tmp_path / "src.txt"),
                               ref_file=str(tmp_path / "ref.txt"), engine="ctranslate2")
    assert scores["sentences"] == 2
    assert "1 of 2 sources" in caplog.text and "longer than the model's positions" in caplog.text
