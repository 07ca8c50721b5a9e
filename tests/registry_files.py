"""Model versions on a real MLflow registry (SQLite) made from small Translators, without training any."""

import numpy as np
import torch
from mlflow.tracking import MlflowClient

from model import Transformer, TransformerConfig
from pipeline.text.tokenizer import train_tokenizer
from pipeline.text.translator import Translator
from pipeline.track import registry

WORDS = "a small dog runs over the green grass while two men watch the big red ball".split()


def small_tokenizer():
    """A SentencePiece tokenizer of the few WORDS: trained in a second."""
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, 6)) for _ in range(200)]
    return train_tokenizer(sentences, sentences, vocab_size=60, model_type="bpe")


def small_translator(tokenizer, max_positions: int) -> Translator:
    """An untrained one-layer Translator (greedy) whose positions tell it apart."""
    cfg = TransformerConfig(vocab_size=tokenizer.src_vocab_size, d_model=32, d_ff=64, num_heads=4,
                            num_encoder_layers=1, num_decoder_layers=1, dropout=0.0, max_positions=max_positions)
    torch.manual_seed(max_positions)
    return Translator(Transformer(cfg), tokenizer, beam_size=1, device="cpu")


def register(uri: str, name: str, translators: list[Translator], workdir) -> MlflowClient:
    """Versions 1, 2, ... of `name`, one per translator, each with its files where `nmt train` puts them."""
    client = MlflowClient(uri, registry_uri=uri)
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    experiment = client.get_experiment_by_name("e")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("e")
    for translator in translators:
        run = client.create_run(experiment_id).info.run_id
        files = workdir / f"files-{run}"
        translator.save(files)
        client.log_artifacts(run, str(files), f"model/{registry.TRANSLATOR_FILES}")
        client.create_model_version(name, f"runs:/{run}/model", run_id=run, tags={"val_bleu": "1.0"})
        client.set_terminated(run)
    return client
