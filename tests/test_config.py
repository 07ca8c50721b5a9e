"""The config tree: defaults, then YAML, then --set; unknown keys and wrong types name the key and line."""

from pathlib import Path

import pytest

from pipeline.config import Config, ConfigError, config_from_dict, load_config


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_precedence_is_defaults_then_file_then_overrides(tmp_path):
    path = write(tmp_path, "train:\n  epochs: 7\n  warmup_steps: 100\nmodel:\n  preset: base\n")
    cfg = load_config(path, ["train.epochs=3", "data.splits={train: a, validation: b}"])
    assert cfg.train.epochs == 3  # --set beats the file
    assert cfg.train.warmup_steps == 100  # the file beats the default
    assert cfg.train.max_tokens == Config().train.max_tokens  # untouched default
    assert cfg.model.preset == "base" and cfg.data.splits == {"train": "a", "validation": "b"}
    assert cfg.train.lr_scale == 1.0 and isinstance(load_config(None, ["train.lr_scale=2"]).train.lr_scale, float)


def test_a_worker_rebuilds_the_same_config_from_its_plain_dict(tmp_path):
    cfg = load_config(None, ["model.num_heads=8", "train.use_gpu=true", "tracking.experiment=x"])
    assert config_from_dict(cfg.to_dict()) == cfg
    assert cfg.flat()["model.num_heads"] == 8 and cfg.flat()["train.use_gpu"] is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  epochs: 3\n  warmup_stpes: 10\n", r"exp\.yaml:3: unknown key 'train\.warmup_stpes'; "
                                                    r"did you mean 'train\.warmup_steps'\?"),
        ("trian:\n  epochs: 3\n", r"exp\.yaml:1: unknown section 'trian'; did you mean 'train'\?"),
        ("train:\n  epochs: three\n", r"exp\.yaml:2: train\.epochs must be of type int, got 'three'"),
        ("train:\n  use_gpu: 1\n", r"train\.use_gpu must be of type bool"),
        ("train:\n  epochs: 0\n", r"train\.epochs must be positive"),
        ("train:\n  cooldown: 1.0\n", r"exp\.yaml:2: train\.cooldown is a fraction of the run and must be below 1"),
        ("data:\n  source: web\n", r"data\.source must be one of \['demo', 'files', 'hf'\]"),
        ("train: [1, 2]\n", r"section 'train' must be a mapping"),
        ("train:\n  epochs: [\n", r"exp\.yaml:\d+: invalid YAML"),
    ],
)
def test_bad_config_files_name_the_file_line_and_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_bad_overrides_name_the_override():
    with pytest.raises(ConfigError, match=r"--set train\.epoch=3: unknown key 'train\.epoch'"):
        load_config(None, ["train.epoch=3"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["train.epochs"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/no/such/file.yaml")


def test_impossible_model_settings_are_caught_when_the_model_config_is_built():
    cfg = load_config(None, ["model.d_model=100", "model.num_heads=8"])
    with pytest.raises(ConfigError, match="d_model .* must be divisible by num_heads"):
        cfg.transformer_config(vocab_size=1000)
    assert load_config(None, ["model.num_layers=3"]).transformer_config(1000).num_decoder_layers == 3


def test_each_corpus_and_language_pair_registers_under_its_own_name():
    root = Path(__file__).resolve().parents[1] / "configs"
    names = {load_config(root / name).tracking.registered_model
             for name in ("demo.yaml", "multi30k_en_de.yaml", "wmt14_en_de.yaml")}
    assert names == {"transformer-nmt-demo-en-de", "transformer-nmt-multi30k-en-de", "transformer-nmt-wmt14-en-de"}
    # Derived from the data as overridden, so a champion of one corpus never competes with another's.
    moved = load_config(root / "multi30k_en_de.yaml", ["data.path=s3://team/corpora/IWSLT17/", "data.tgt_lang=fr"])
    assert moved.tracking.registered_model == "transformer-nmt-iwslt17-en-fr"
    assert load_config(None, ["tracking.registered_model=mine", "data.src_lang=fr"]).tracking.registered_model == "mine"
    assert config_from_dict(load_config(root / "wmt14_en_de.yaml").to_dict()).tracking.registered_model == \
        "transformer-nmt-wmt14-en-de"  # what a worker rebuilds


def test_a_yaml_boolean_word_set_on_a_text_key_stays_the_word():
    # YAML 1.1 reads off/on/yes/no as booleans; train.amp's choices include "off".
    assert load_config(None, ["train.amp=off"]).train.amp == "off"
    assert load_config(None, ["train.use_gpu=yes"]).train.use_gpu is True  # a bool key keeps YAML's reading
    with pytest.raises(ConfigError, match=r"train\.amp must be of type str, got True"):
        load_config(None, ["train.amp=true"])


def test_the_model_section_has_a_key_for_each_transformer_field_no_other_section_sets():
    import dataclasses

    from model import TransformerConfig
    from pipeline.config import SET_ELSEWHERE, ModelConfig

    derived = {f.name for f in dataclasses.fields(TransformerConfig)} - set(SET_ELSEWHERE)
    assert {f.name for f in dataclasses.fields(ModelConfig)} == derived | {"preset", "num_layers"}
    built = load_config(None, ["model.positional_encoding=learned", "model.d_ff=96"]).transformer_config(500)
    tiny = TransformerConfig.preset("tiny")
    assert (built.positional_encoding, built.d_ff, built.d_model) == ("learned", 96, tiny.d_model)


def test_reading_a_config_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, pipeline.config, pipeline.config_keys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False", out.stderr  # Ray Data workers read configs and never build a model


def test_the_gpu_recipe_shares_the_multi30k_data_and_ends_its_budget_in_a_cooldown():
    from pipeline.train import elastic
    from pipeline.train.shapes import ShapePolicy

    root = Path(__file__).resolve().parents[1] / "configs"
    gpu, cpu = load_config(root / "multi30k_gpu.yaml"), load_config(root / "multi30k_en_de.yaml")
    assert gpu.data == cpu.data  # one prepared dataset serves both
    assert gpu.tracking.registered_model == cpu.tracking.registered_model  # their champions compete
    train = gpu.train
    assert train.use_gpu and train.amp == "bf16" and train.compile and train.compile_mode == "reduce-overhead"
    # CUDA graphs replay one micro-batch per update (pipeline/train/step.py), at the recipe's worker count.
    assert elastic.accumulation(train.target_tokens(), train.max_tokens, train.num_workers) == 1
    assert ShapePolicy.of(train).active and train.pad_multiple in (8, 16) and train.batch_buckets >= 1
    # Five minutes end the run, not the epochs, and the budget ends in the cooldown.
    assert train.time_budget_s == 300 and train.epochs >= 1000 and 0 < train.cooldown < 1
    assert train.average_last >= 2 and train.val_interval > 0
    model = gpu.transformer_config(8000)
    assert (model.num_encoder_layers, model.num_heads, model.d_model, model.dropout) == (4, 4, 128, 0.3)


def test_each_login_gets_an_experiment_of_its_own_unless_one_is_configured():
    from pipeline.config import TrackingConfig

    assert TrackingConfig().experiment_for("") == "transformer-nmt"  # a laptop's local store
    assert TrackingConfig().experiment_for("alice") == "transformer-nmt-alice"  # she owns it; bob's is his
    assert TrackingConfig().experiment_for("bob") != TrackingConfig().experiment_for("alice")
    assert TrackingConfig(experiment="wmt14-team").experiment_for("alice") == "wmt14-team"
