"""Fine-tuning with train.init_from: the champion, its run id or a checkpoint as the parent model.

That fine-tuning pays (the demo champion on a shifted corpus) is tested in test_demo.py, on a model
that translates: the `champion` fixture here scores about 1 BLEU.
"""

import dataclasses

import pytest
import torch
from small import small_config

from model import TransformerConfig
from pipeline.common.errors import UserError
from pipeline.train import parent

CHAMPION = "models:/transformer-nmt-demo-en-de@champion"


@pytest.mark.slow
def test_every_kind_of_init_from_names_the_same_parent(champion):
    by_model = parent.resolve(CHAMPION, champion.uri)
    by_run = parent.resolve(champion.run_id, champion.uri)
    by_checkpoint = parent.resolve(champion.outcome.checkpoint_path, champion.uri)
    assert by_run.described == f"run {champion.run_id}"
    for other in (by_run, by_checkpoint):
        assert other.tokenizer.sha256() == by_model.tokenizer.sha256()
        assert dataclasses.asdict(other.config) == dataclasses.asdict(by_model.config)
        assert all(torch.equal(other.weights[k], by_model.weights[k]) for k in by_model.weights)


@pytest.mark.slow
def test_a_parent_of_another_shape_or_vocabulary_is_refused_in_one_line_naming_both(champion, tmp_path):
    from pipeline.train.run import prepare_run

    init = [f"train.init_from={CHAMPION}", "tracking.experiment=nmt-tests"]
    with pytest.raises(UserError) as shape:
        prepare_run(small_config(tmp_path, *init, "model.d_model=32", tracking_uri=champion.uri))
    with pytest.raises(UserError) as vocabulary:
        prepare_run(small_config(tmp_path, *init, "data.vocab_size=700", tracking_uri=champion.uri))
    for err, parts in ((shape, ["d_model 64", "asks for d_model 32"]),
                       (vocabulary, ["vocabulary of 600", "data.vocab_size=700"])):
        message = str(err.value)
        assert "\n" not in message and f"transformer-nmt-demo-en-de version {champion.version}" in message, message
        assert all(part in message for part in parts), message


def test_the_shape_check_names_what_differs_and_lets_regularization_change():
    mine = TransformerConfig(vocab_size=600, d_model=64, d_ff=128, num_heads=4, num_encoder_layers=1,
                             num_decoder_layers=1)
    parent.check_shape(dataclasses.replace(mine, dropout=0.3, attention_dropout=0.1), "p", mine)
    with pytest.raises(UserError, match=r"p is a Transformer with d_ff 256, num_heads 2; this run's model.\* "
                                        r"asks for d_ff 128, num_heads 4"):
        parent.check_shape(dataclasses.replace(mine, num_heads=2, d_ff=256), "p", mine)


def test_weights_that_do_not_fit_their_config_are_named():
    from model import Transformer

    config = TransformerConfig(vocab_size=100, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=1,
                               num_decoder_layers=1)
    weights = Transformer(config).state_dict()
    parent.check_weights(config, weights)
    with pytest.raises(ValueError, match="do not fit model_config.json: .*64"):
        parent.check_weights(dataclasses.replace(config, d_ff=128), weights)
    missing = next(iter(weights))
    with pytest.raises(ValueError, match=f"{missing} \\(None in the weights"):
        parent.check_weights(config, {k: v for k, v in weights.items() if k != missing})


def test_an_init_from_that_names_nothing_says_what_it_may_be(tmp_path):
    with pytest.raises(UserError, match="not a models:/ URI, an MLflow run id .* or a training checkpoint"):
        parent.resolve(str(tmp_path / "nothing"), f"sqlite:///{tmp_path / 'mlflow.db'}")
