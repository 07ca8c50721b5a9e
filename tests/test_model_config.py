"""TransformerConfig: the paper's presets, parameter counts and clear errors for impossible values."""

import ast
import dataclasses
import pathlib
import sys

import pytest
import torch

from model import Transformer, TransformerConfig

MODEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "model"


@pytest.mark.parametrize(
    "name, d_model, d_ff, heads, dropout",
    [("base", 512, 2048, 8, 0.1), ("big", 1024, 4096, 16, 0.3)],
)
def test_presets_follow_table_3(name, d_model, d_ff, heads, dropout):
    cfg = TransformerConfig.preset(name)
    assert (cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.dropout) == (d_model, d_ff, heads, dropout)
    assert cfg.num_encoder_layers == cfg.num_decoder_layers == 6
    assert cfg.label_smoothing == 0.1 and cfg.d_k == 64
    assert not cfg.norm_first and cfg.positional_encoding == "sinusoidal"


@pytest.mark.parametrize("name, paper_millions", [("base", 65), ("big", 213)])
def test_parameter_counts_match_the_paper(name, paper_millions):
    with torch.device("meta"):  # shapes without storage: the big model's 0.9 GB took 11 s to initialize
        model = Transformer(TransformerConfig.preset(name, vocab_size=37_000))
    millions = model.num_parameters() / 1e6
    assert abs(millions - paper_millions) / paper_millions < 0.05, millions


def test_tying_shares_one_matrix_for_both_embeddings_and_the_softmax():
    model = Transformer(TransformerConfig.preset("tiny"))
    src_emb = model.encoder.embed.token_embedding.weight
    assert model.decoder.embed.token_embedding.weight is src_emb
    assert model.decoder.generator.weight is src_emb
    untied = Transformer(TransformerConfig.preset("tiny", tie_embeddings=False))
    assert untied.num_parameters() > model.num_parameters()
    separate = Transformer(TransformerConfig.preset("tiny", tgt_vocab_size=500))
    assert separate.decoder.generator.weight is separate.decoder.embed.token_embedding.weight
    assert separate.encoder.embed.token_embedding.weight.shape[0] == 8000


def test_num_layers_override_sets_both_stacks():
    cfg = TransformerConfig.preset("base", num_layers=4, num_heads=16)
    assert (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.num_heads) == (4, 4, 16)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"d_model": 510}, "d_model"),
        ({"num_heads": 7}, "num_heads"),
        ({"d_ff": 0}, "d_ff"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"num_encoder_layers": 0}, "num_encoder_layers"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"label_smoothing": 1.5}, "label_smoothing"),
        ({"positional_encoding": "rope"}, "positional_encoding"),
        ({"eos_id": 0}, "special ids"),
        ({"bos_id": 40_000}, "bos_id"),
        ({"d_modle": 512}, "d_modle"),
    ],
)
def test_impossible_values_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        TransformerConfig.preset("base", **overrides)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="tiny"):
        TransformerConfig.preset("huge")


def test_config_is_frozen_and_round_trips_through_a_dict():
    cfg = TransformerConfig.preset("tiny", norm_first=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 64
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="colour"):
        TransformerConfig.from_dict({**cfg.to_dict(), "colour": 1})


def test_model_package_imports_only_torch_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"torch"}
    offenders = []
    for path in sorted(MODEL_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not offenders, offenders
