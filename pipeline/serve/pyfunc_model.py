"""The packaged MLflow model (Models from Code): a pyfunc that translates the `src` column.

MLflow copies this file, `model/` and `pipeline/` into the model as code; the artifacts are
safetensors weights, a JSON config and SentencePiece files, so loading runs no pickle.
"""

from __future__ import annotations

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE


def _bad_input(message: str) -> MlflowException:
    # INVALID_PARAMETER_VALUE makes `mlflow models serve` answer 400 instead of 500.
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def _texts(model_input) -> list[str]:
    """The source sentences: a DataFrame `src` column, a list of strings or one string."""
    if isinstance(model_input, pd.DataFrame):
        if "src" not in model_input.columns:
            raise _bad_input(f"input needs a 'src' column; it has {list(model_input.columns)}")
        texts = model_input["src"].tolist()
    elif isinstance(model_input, str):
        texts = [model_input]
    else:
        texts = list(model_input)
    wrong = [i for i, text in enumerate(texts) if not isinstance(text, str)]
    if wrong:
        raise _bad_input(f"src row {wrong[0]} is {type(texts[wrong[0]]).__name__}, not a string")
    return texts


class TranslationModel(mlflow.pyfunc.PythonModel):
    """English in, German out (or whatever pair it was trained on), with beam search."""

    def load_context(self, context) -> None:
        """Build the Transformer and tokenizer from the model's artifact files, on model_config's device."""
        from pipeline.text.translator import Translator

        device = (context.model_config or {}).get("device", "auto")  # load_model(..., model_config={"device": ...})
        self.translator = Translator.from_files(context.artifacts["translator"], device=device)

    # The DataFrame hint tells MLflow to validate nothing beyond the signature (it warns on every load
    # without a hint); called directly, predict takes a list of strings or one string as well.
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """A `translation` column per source sentence; params beam_size (0: the model's), max_len (0: src + 50)."""
        params = params or {}
        beam_size = int(params.get("beam_size") or min(self.translator.beam_size, 64))
        max_len = int(params.get("max_len") or 0)
        if not 1 <= beam_size <= 64:
            raise _bad_input(f"beam_size must be between 1 and 64, got {beam_size}")
        texts = _texts(model_input)
        translations = self.translator.translate(texts, beam_size=beam_size, max_len=max_len or None)
        return pd.DataFrame({"translation": translations})


mlflow.models.set_model(TranslationModel())
