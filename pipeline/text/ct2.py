"""CTranslate2, the inference engine OpenNMT and Marian models are served with: convert a Translator, translate.

The conversion goes through CTranslate2's Python spec API, weight by weight, so no checkpoint format
of another toolkit is involved. The converted directory holds CTranslate2's model.bin, its vocabularies
and this project's SentencePiece model(s), and translates on its own with Ct2Translator.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from model import Transformer
from model.decoding import MAX_LEN_OFFSET  # outputs up to the source length + 50 tokens

from ..common.errors import UserError
from .tokenizer import BOS_ID, PAD_ID, Tokenizer
from .translator import SourceTooLong, Translator, read_decoding, write_decoding

QUANTIZATIONS = ("int8", "float32")
# Written into every export: the model it holds and its positions. Only a directory holding it is ever replaced.
EXPORT_MARKER = "nmt-export.json"


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise UserError("the CTranslate2 engine needs the ctranslate2 package: pip install -e '.[ct2]'") from None
    return ctranslate2


def _array(tensor) -> np.ndarray:
    # A copy: numpy() shares the tensor's memory, and the spec's optimize() rewrites arrays in place.
    return tensor.detach().cpu().float().numpy().copy()


def _linear(spec, weight, bias=None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _norm(spec, module) -> None:
    spec.gamma, spec.beta = _array(module.weight), _array(module.bias)


def _attention(spec, module, d_model: int, cross: bool) -> None:
    """Our stacked W^Q,W^K,W^V: one fused linear for self-attention; queries apart from keys+values for cross."""
    weight, bias = module.in_proj.weight, module.in_proj.bias
    if cross:
        _linear(spec.linear[0], weight[:d_model], bias[:d_model])
        _linear(spec.linear[1], weight[d_model:], bias[d_model:])
    else:
        _linear(spec.linear[0], weight, bias)
    _linear(spec.linear[-1], module.out_proj.weight, module.out_proj.bias)


def _self_attention(layer_spec, layer, d_model: int) -> None:
    """A layer's self-attention sublayer and the norm after (or before) it."""
    _attention(layer_spec.self_attention, layer.self_attn, d_model, cross=False)
    _norm(layer_spec.self_attention.layer_norm, layer.sublayer[0].norm)


def _feed_forward(layer_spec, layer, norm) -> None:
    """A layer's position-wise feed-forward sublayer (Eq. 2) and its norm."""
    _linear(layer_spec.ffn.linear_0, layer.feed_forward.w_1.weight, layer.feed_forward.w_1.bias)
    _linear(layer_spec.ffn.linear_1, layer.feed_forward.w_2.weight, layer.feed_forward.w_2.bias)
    _norm(layer_spec.ffn.layer_norm, norm)


def _inputs(spec, embed) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(embed.token_embedding.weight)
    spec.scale_embeddings = True  # x sqrt(d_model), Sec. 3.4
    positions = embed.positions
    table = positions.table if hasattr(positions, "table") else positions.embedding.weight
    spec.position_encodings.encodings = _array(table)


def _spec(model: Transformer, src_vocab: list[str], tgt_vocab: list[str]):
    """A CTranslate2 TransformerSpec holding the model's weights and the vocabularies' tokens, by id."""
    _ctranslate2()  # a clear message when it is missing
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.num_encoder_layers, cfg.num_decoder_layers), cfg.num_heads, pre_norm=cfg.norm_first,
        activation=common_spec.Activation.RELU)
    encoder, decoder = spec.encoder, spec.decoder
    _inputs(encoder, model.encoder.embed)
    for layer_spec, layer in zip(encoder.layer, model.encoder.layers):
        _self_attention(layer_spec, layer, cfg.d_model)
        _feed_forward(layer_spec, layer, layer.sublayer[1].norm)
    _inputs(decoder, model.decoder.embed)
    for layer_spec, layer in zip(decoder.layer, model.decoder.layers):
        _self_attention(layer_spec, layer, cfg.d_model)
        _attention(layer_spec.attention, layer.cross_attn, cfg.d_model, cross=True)
        _norm(layer_spec.attention.layer_norm, layer.sublayer[1].norm)
        _feed_forward(layer_spec, layer, layer.sublayer[2].norm)
    if cfg.norm_first:  # pre-norm stacks end in a layer norm of their own
        _norm(encoder.layer_norm, model.encoder.norm)
        _norm(decoder.layer_norm, model.decoder.norm)
    _linear(decoder.projection, model.decoder.generator.weight)
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    # Sources are fed without bos/eos and targets start from bos, as in training.
    spec.config.add_source_bos = spec.config.add_source_eos = False
    spec.config.decoder_start_token = spec.config.bos_token
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    return spec


def _pieces(processor) -> list[str]:
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def export(translator: Translator, directory: str | Path, quantization: str = "int8", source: str = "") -> Path:
    """Write the translator as a CTranslate2 model directory, its SentencePiece model(s) included.

    source: the model it came from (models:/NAME/VERSION), recorded in the directory's marker.
    """
    tokenizer = translator.tokenizer

    def also(where: Path) -> None:
        tokenizer.save(where)
        write_decoding(where, translator.beam_size, translator.alpha)

    return write_model(translator.model, _pieces(tokenizer.src), _pieces(tokenizer.tgt), directory, quantization,
                       also=also, source=source)


def write_model(model: Transformer, src_vocab: list[str], tgt_vocab: list[str], directory: str | Path,
                quantization: str = "int8", also: Callable[[Path], object] | None = None, source: str = "") -> Path:
    """The model as a CTranslate2 directory (also(dir) adds files), written aside, then renamed into place."""
    if quantization not in QUANTIZATIONS:
        raise UserError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    directory = Path(directory).absolute()  # "." has no name to put a sibling beside
    _check_replaceable(directory)
    spec = _spec(model, src_vocab, tgt_vocab)
    spec.validate()
    spec.optimize(quantization=quantization)
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    earlier = partial.with_name(partial.name + ".old")
    try:
        spec.save(str(partial))
        if also is not None:
            also(partial)
        (partial / EXPORT_MARKER).write_text(json.dumps({"model": source, "quantization": quantization,
                                                         "max_positions": model.cfg.max_positions}, indent=2))
        if directory.exists():  # an earlier export: moved aside, not deleted until the new one is in place
            directory.rename(earlier)
        partial.rename(directory)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(earlier, ignore_errors=True)
    return directory


def _check_replaceable(directory: Path) -> None:
    """Refuse to replace anything but a missing or empty directory or an export marked as ours: never a user's files.

    Nor the working directory or one above it, whatever it holds: the process would delete where it stands.
    """
    if not directory.exists():
        return
    if not directory.is_dir():
        raise UserError(f"{directory} is a file, not a directory: choose another --out")
    if any(directory.iterdir()) and not (directory / EXPORT_MARKER).is_file():
        raise UserError(f"{directory} is not empty and holds no CTranslate2 model exported by nmt (no "
                        f"{EXPORT_MARKER}): export into a new or empty directory, or into an earlier export to "
                        f"replace it")
    if Path.cwd().resolve().is_relative_to(directory.resolve()):
        raise UserError(f"{directory} is the working directory or holds it: export into a new directory, e.g. "
                        f"--out ct2-model")


def export_info(directory: str | Path) -> dict:
    """What an export's marker says (model, quantization, max_positions); {} for an export made before markers."""
    path = Path(directory) / EXPORT_MARKER
    return json.loads(path.read_text()) if path.is_file() else {}


def load_engine(directory: str | Path, device: str = "cpu", threads: int = 0):
    """A ctranslate2.Translator for an exported directory, set up for throughput, leaving PyTorch its threads.

    On a CPU, one single-threaded translator per core (threads: 0 = every core), each taking whole
    batches: at this project's model sizes two threads on one batch mostly wait on each other (beam 5
    on 2 cores: 2,700 tokens/s as 1 x 2 threads, 8,250 as 2 x 1).
    """
    ctranslate2 = _ctranslate2()
    if device == "cpu":
        workers, threads_per_worker = threads or os.cpu_count() or 1, 1
    else:
        workers, threads_per_worker = 1, threads
    torch_threads = torch.get_num_threads()
    engine = ctranslate2.Translator(str(directory), device=device, inter_threads=workers,
                                    intra_threads=threads_per_worker)
    # Loading sets the calling thread's OpenMP thread count to intra_threads, which is torch's too:
    # PyTorch work in this process would then run on one thread.
    torch.set_num_threads(torch_threads)
    return engine


class Ct2Translator:
    """Translations with a CTranslate2 model directory from export(): the same calls as Translator."""

    def __init__(self, directory: str | Path, device: str = "cpu", beam_size: int | None = None,
                 alpha: float | None = None, threads: int = 0):
        self.engine = load_engine(directory, device, threads)
        self.tokenizer = Tokenizer.load(directory)
        stored = read_decoding(Path(directory))  # the export's settings; 4 and 0.6 for exports without them
        self.beam_size = beam_size or stored.get("beam_size", 4)
        self.alpha = stored.get("alpha", 0.6) if alpha is None else alpha
        # The position table's size: CTranslate2 fails a whole batch on a longer sequence. None: an export made
        # before the marker recorded it (too long then fails as CTranslate2's error).
        self.max_positions: int | None = export_info(directory).get("max_positions")

    def too_long(self, texts: Sequence[str]) -> list[int]:
        """Indices of the texts whose source tokens do not fit the model's positions."""
        limit = self.max_positions
        return [i for i, row in enumerate(self.tokenizer.encode_src(list(texts))) if limit and len(row) > limit]

    def translate(self, texts: Sequence[str], beam_size: int | None = None, alpha: float | None = None,
                  max_len: int | None = None, batch_size: int = 64, truncate: bool = False) -> list[str]:
        """Translations of texts, in order; a source longer than the model's positions is SourceTooLong, or with
        truncate translated from its first max_positions tokens.

        Outputs are limited as in model.decoding (source length + 50 tokens, or max_len, within the positions),
        so sources are decoded in groups of one length. CTranslate2 normalises beam scores by length ** alpha,
        not by the GNMT penalty of model.decoding: beam outputs can differ from Translator's, greedy ones match.
        """
        tokenizer, src, tgt, limit = self.tokenizer, self.tokenizer.src, self.tokenizer.tgt, self.max_positions
        ids = tokenizer.encode_src(list(texts))
        if limit:
            longest = max((len(row) for row in ids), default=0)
            if longest > limit and not truncate:
                raise SourceTooLong(f"a source of {longest} tokens is longer than the model's {limit} positions")
            ids = [row[:limit] for row in ids]
        outputs: list[list[int]] = [[] for _ in ids]  # an empty source translates to nothing, as in translate_ids
        by_length = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
        pending = []  # every group is queued at once, so that the translators work on groups in parallel
        for length, group in itertools.groupby(by_length, key=lambda i: max_len or len(ids[i])):
            rows = list(group)
            longest_output = length if max_len else length + MAX_LEN_OFFSET
            pending += zip(rows, self.engine.translate_batch(
                [[src.id_to_piece(t) for t in ids[i]] for i in rows], max_batch_size=batch_size, asynchronous=True,
                beam_size=beam_size or self.beam_size, length_penalty=self.alpha if alpha is None else alpha,
                # bos takes the decoder's first position: as model.decoding, outputs end at the last one.
                max_decoding_length=min(longest_output, limit - 1) if limit else longest_output,
                # As model.decoding: eos may come first (an empty translation), bos and pad never come.
                min_decoding_length=0, suppress_sequences=[[tgt.id_to_piece(i)] for i in (BOS_ID, PAD_ID)]))
        for i, result in pending:
            try:
                hypothesis = result.result().hypotheses[0]
            except RuntimeError as err:  # an export without the marker: CTranslate2 finds the limit itself
                if "position" not in str(err):
                    raise
                raise SourceTooLong(f"a source of {len(ids[i])} tokens is longer than the model's positions") from None
            outputs[i] = [tgt.piece_to_id(p) for p in hypothesis]
        return tokenizer.decode_tgt(outputs)

    def score(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probabilities of each target token (then eos) given its source, teacher-forced."""
        src, tgt = self.tokenizer.src, self.tokenizer.tgt
        results = self.engine.score_batch([[src.id_to_piece(i) for i in row] for row in sources],
                                          [[tgt.id_to_piece(i) for i in row] for row in targets])
        return [list(r.log_probs) for r in results]
