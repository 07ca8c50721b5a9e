"""The experiment config tree: defaults, then a YAML file, then `--set a.b=value` overrides."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from model.config import PRESETS, TransformerConfig  # no torch: the model package loads it on first use

from .common.errors import UserError


class ConfigError(UserError):
    """A mistake in a config file or override; the message names the file, line and key."""


@dataclass(frozen=True)
class Limit:
    """A bound a numeric key's values must keep, carried on its annotation: Annotated[int, POSITIVE]."""

    allows: Callable[[float], bool]
    message: str  # what a refused value is told, after the key's name
    shown: str  # how the key reference writes it


POSITIVE = Limit(lambda v: v > 0, "must be positive", "> 0")
NON_NEGATIVE = Limit(lambda v: v >= 0, "must be >= 0", ">= 0")
COUNT_OR_UNLIMITED = Limit(lambda v: v >= -1, "must be -1 (no limit) or a count >= 0", "-1 or >= 0")
DEFAULT_EXPERIMENT = "transformer-nmt"  # the MLflow experiment without a server login
BELOW_ONE = Limit(lambda v: v < 1, "is a fraction of the run and must be below 1", "< 1")
PositiveInt, PositiveFloat = Annotated[int, POSITIVE], Annotated[float, POSITIVE]
NonNegativeInt, NonNegativeFloat = Annotated[int, NON_NEGATIVE], Annotated[float, NON_NEGATIVE]
Fraction = Annotated[float, NON_NEGATIVE, BELOW_ONE]  # of the run: in [0, 1)
CountOrUnlimited = Annotated[int, COUNT_OR_UNLIMITED]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]  # torch.compile's


@dataclass
class DataConfig:
    """Where the corpus comes from, how it is cleaned and tokenized, where shards go."""

    source: Literal["demo", "files", "hf"] = "demo"  # the built-in demo corpus, files (data.path) or a hub dataset
    src_lang: str = "en"  # source language code: file suffix and default field name
    tgt_lang: str = "de"  # target language code
    path: str = ""  # files: directory of the split files, local or a URI (s3://, gs://, hf://); hf: a saved dataset
    format: Literal["text", "tsv", "jsonl", "parquet"] = "text"  # files: their layout (text: one file per language)
    splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "validation": "val", "test": "test"}
    )  # our split name -> file stem (text: <stem>.<lang>; parquet: a glob too, de-en/train-*) or HF split name
    src_field: str = ""  # tsv/jsonl/parquet/hf column; "" = the language code; dots nest
    tgt_field: str = ""  # like src_field, for the target side
    hf_name: str = ""  # a hub dataset, e.g. bentrevett/multi30k or wmt/wmt14
    hf_config: str = ""  # e.g. de-en for wmt/wmt14
    demo_sizes: dict[str, int] = field(
        default_factory=lambda: {"train": 50_000, "validation": 1_000, "test": 1_000}
    )  # demo only: sentence pairs per split
    seed: NonNegativeInt = 0  # seed of the demo corpus and of the tokenizer's training sample
    on_bad_utf8: Literal["error", "replace"] = "error"  # a line that is not UTF-8: an error, or its bad bytes replaced
    max_len: PositiveInt = 128  # subword tokens per side, longer pairs are dropped
    max_len_ratio: PositiveFloat = 3.0  # drop pairs whose token-length ratio exceeds this
    dedup: bool = False  # drop exact duplicate pairs in the training split (a distributed group-by)
    vocab_size: PositiveInt = 8000  # SentencePiece vocabulary size (each side's, if not joint)
    tokenizer_type: Literal["bpe", "unigram"] = "bpe"  # SentencePiece's model type
    joint_vocab: bool = True  # one vocabulary for both sides, so embeddings can be tied
    tokenizer_sample: PositiveInt = 200_000  # sentences per side sampled to train SentencePiece
    character_coverage: PositiveFloat = 1.0  # SentencePiece: share of characters covered; 1.0 keeps all
    output_dir: str = "data/prepared"  # local path or storage URI
    num_shards: NonNegativeInt = 0  # Parquet files per split (at most); 0: one per block (up to 100k pairs)


# TransformerConfig's fields that no model.* key sets: the data decides the vocabularies and the
# tokenizer the special ids, train.label_smoothing the loss; the norm's epsilon stays PyTorch's.
SET_ELSEWHERE = ("vocab_size", "tgt_vocab_size", "label_smoothing", "layer_norm_eps", "pad_id", "unk_id", "bos_id",
                 "eos_id")


@dataclass
class ModelPreset:
    """A TransformerConfig preset plus overrides; None keeps the preset's value."""

    preset: Literal[tuple(PRESETS)] = "tiny"  # Table 3 of the paper; tiny is CPU-sized
    num_layers: int | None = None  # both stacks; num_encoder_layers / num_decoder_layers win if set


def _with_overrides(base: type) -> type:
    """`base` and an override (None: the preset's value) of each TransformerConfig field not SET_ELSEWHERE."""
    hints = typing.get_type_hints(TransformerConfig)
    overrides = [(f.name, hints[f.name] | None, field(default=None))
                 for f in dataclasses.fields(TransformerConfig) if f.name not in SET_ELSEWHERE]
    return dataclasses.make_dataclass("ModelConfig", overrides, bases=(base,),
                                      namespace={"__module__": __name__, "__doc__": base.__doc__})


# The model section: derived from TransformerConfig, so a new model field is a new key (its meaning: the
# field's comment in model/config.py).
ModelConfig = _with_overrides(ModelPreset)


@dataclass
class TrainConfig:
    """Ray Train scaling and the optimisation recipe of Sec. 5."""

    num_workers: PositiveInt = 1  # Ray Train workers (DDP ranks); with min_workers, the most the run grows to
    min_workers: NonNegativeInt = 0  # elastic: start with what fits (at least this), grow and shrink; 0: fixed
    use_gpu: bool = False  # one GPU per worker
    cpus_per_worker: PositiveInt = 1  # CPUs reserved for each worker
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"  # workers on nodes (Ray)
    max_tokens: PositiveInt = 4096  # padded source + target tokens per batch per worker
    update_freq: PositiveInt = 1  # gradient accumulation at num_workers workers
    tokens_per_update: NonNegativeInt = 0  # kept at any worker count; 0: max_tokens x num_workers x update_freq
    epochs: PositiveInt = 10  # passes over the training split
    max_steps: NonNegativeInt = 0  # 0: no limit besides epochs
    time_budget_s: NonNegativeFloat = 0.0  # stop (validate, average, finish) after this much training time; 0: none
    warmup_steps: PositiveInt = 4000  # Eq. 3: the learning rate rises linearly for this many updates, then decays
    lr_scale: PositiveFloat = 1.0  # multiplies the learning rate of Eq. 3
    cooldown: Fraction = 0.0  # lr falls linearly to 0 over this last fraction of the run (its epochs, steps or time)
    label_smoothing: float = 0.1  # epsilon_ls of Sec. 5.4
    clip_norm: NonNegativeFloat = 0.0  # 0: no clipping
    amp: Literal["auto", "bf16", "fp16", "off"] = "auto"  # mixed precision on GPUs; auto: bf16 where supported
    compile: bool = False  # torch.compile the training step (the model and the loss, with dynamic shapes)
    compile_mode: CompileMode = "default"  # with compile; reduce-overhead and max-autotune replay CUDA graphs on a GPU
    pad_multiple: PositiveInt = 1  # batch widths rounded up to a multiple (8, 16: few shapes to compile); 1: exact
    batch_buckets: NonNegativeInt = 0  # a batch's rows padded to one of N sizes (the most that fit, half, ...); 0: off
    seed: int = 0  # seed of initialisation and batch shuffling
    val_interval: NonNegativeInt = 0  # updates between validations; 0: every epoch
    checkpoint_every: NonNegativeInt = 0  # updates between checkpoints besides each validation's; 0: validations' only
    log_every: PositiveInt = 10  # updates between progress lines and train_loss values
    init_from: str = ""  # fine-tune from a checkpoint directory, MLflow run id or models:/ URI (its tokenizer too)
    report_interval_s: NonNegativeFloat = 10.0  # progress values go to Ray Train (and MLflow) at most this often
    beam_size: PositiveInt = 4  # beam of the packaged model's decoding (and of validation's, without val_beam_size)
    length_penalty: NonNegativeFloat = 0.6  # beam search length penalty alpha, of both
    val_beam_size: NonNegativeInt = 0  # beam of validation decoding (1: greedy, cheaper); 0: beam_size
    keep_checkpoints: PositiveInt = 3  # checkpoints kept: the best by val_bleu, plus the latest
    average_last: PositiveInt = 5  # average the last N weights kept (Sec. 6.1) at the end and keep it if it wins
    average_every: NonNegativeInt = 0  # updates between the weights kept for that average; 0: each validation's
    storage_path: str = "runs"  # Ray Train / Tune results and checkpoints: local path or storage URI
    run_name: str = ""  # "": a hash of the config; the same name resumes the run
    max_failures: NonNegativeInt = 0  # restarts from the latest checkpoint after a worker failure
    max_preemption_failures: CountOrUnlimited = -1  # restarts after a node is preempted (not failures); -1: no limit
    preemption_check_s: NonNegativeFloat = 5.0  # ask this often whether a node is preempted (then checkpoint); 0: never
    preemption_grace_s: NonNegativeFloat = 30.0  # restart this long after a preemption deadline, once the node is gone
    resize_interval_s: NonNegativeFloat = 60.0  # elastic: how often Ray Train checks whether more workers fit
    # A cluster that starts at zero GPU workers needs minutes to boot one and pull its image.
    resource_wait_s: NonNegativeFloat = 1200.0  # on a cluster: how long the workers may wait for nodes

    @property
    def elastic(self) -> bool:
        """Whether the worker count follows the cluster (min_workers set) instead of being fixed."""
        return 0 < self.min_workers

    def fewest_workers(self) -> int:
        """The workers a run needs to start: min_workers when elastic, else num_workers."""
        return self.min_workers if self.elastic else self.num_workers

    def worker_bundle(self) -> dict[str, float]:
        """The resources of one training worker, as Ray schedules them."""
        return {"CPU": self.cpus_per_worker, **({"GPU": 1} if self.use_gpu else {})}

    def target_tokens(self) -> int:
        """Padded tokens an update averages over, whatever the number of workers."""
        return self.tokens_per_update or self.max_tokens * self.num_workers * self.update_freq


@dataclass
class TuneConfig:
    """Ray Tune sweep settings."""

    num_samples: PositiveInt = 4  # trials to sample (with grid keys: samples of each grid point)
    max_concurrent_trials: NonNegativeInt = 0  # 0: as many as the cluster fits
    scheduler: Literal["asha", "fifo"] = "asha"  # asha stops weak trials early; fifo runs every trial to the end
    grace_period: NonNegativeInt = 0  # ASHA: updates before a trial can be stopped; 0: the longest warmup
    reduction_factor: PositiveInt = 2  # ASHA: keep the best 1/reduction_factor at each rung
    name: str = ""  # the sweep's name (its storage directory and MLflow parent run); "" derives one
    search: Literal["random", "grid", "optuna"] = "random"  # how trials are drawn from the space
    seed: int = 0  # seed of the random and optuna searches: the same space and seed sample the same trials
    start_with_base: bool = False  # random, optuna: the first trial takes the config's own values (a baseline)
    metric: str = "val_bleu"  # what the scheduler and the best trial go by
    mode: Literal["max", "min"] = "max"  # whether a higher or a lower tune.metric is better


def experiment_name(configured: str, username: str) -> str:
    """The experiment runs go to: the one configured, else transformer-nmt, a person's own with a server login."""
    if configured:
        return configured
    return f"{DEFAULT_EXPERIMENT}-{username}" if username else DEFAULT_EXPERIMENT


@dataclass
class TrackingConfig:
    """MLflow tracking and registry; an empty tracking_uri means MLFLOW_TRACKING_URI or sqlite:///mlflow.db."""

    tracking_uri: str = ""  # "": MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory
    # Each person owns their experiment on a team server (others read it): one shared name would be its first
    # user's, and everyone else's runs refused.
    experiment: str = ""  # MLflow experiment; "": transformer-nmt, on a server with a login transformer-nmt-<login>
    # One name per corpus and language pair, so champions of different corpora never compete.
    registered_model: str = ""  # registry name; "": transformer-nmt-<corpus>-<src>-<tgt>, e.g. ...-wmt14-en-de
    register: bool = True  # register the best model; @champion moves only if val_bleu improves
    system_metrics_s: NonNegativeFloat = 10.0  # system metrics (CPU, memory, disk, network, GPU) every N s; 0: off

    def experiment_for(self, username: str) -> str:
        """The experiment runs go to (see experiment_name)."""
        return experiment_name(self.experiment, username)


@dataclass
class ServeConfig:
    """The Ray Serve translation service."""

    model_uri: str = ""  # MLflow model URI to serve; empty: the champion of tracking.registered_model
    host: str = "127.0.0.1"  # interface to listen on; 0.0.0.0 for all
    port: PositiveInt = 8000  # HTTP port
    max_batch_size: PositiveInt = 16  # sentences decoded together (dynamic batching)
    batch_wait_timeout_s: NonNegativeFloat = 0.05  # how long a batch waits to fill up
    max_ongoing_requests: PositiveInt = 32  # requests a replica works on at once
    max_queued_requests: PositiveInt = 64  # requests waiting beyond those; more get 503
    request_timeout_s: PositiveFloat = 30.0  # seconds until a request's answer is 504
    max_texts: PositiveInt = 64  # sentences per request, more get 413
    max_chars: PositiveInt = 1000  # characters per sentence, longer get 413
    num_gpus: float = 0.0  # GPUs per replica (1, or 0.5 to share one); 0: replicas decode on the CPU
    engine: Literal["auto", "pytorch", "ctranslate2"] = "auto"  # auto: ctranslate2 when the model has an `nmt export`


@dataclass
class Config:
    """The whole experiment: one section per pipeline stage."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict: what the driver hands to Ray and what MLflow logs."""
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted keys ("train.warmup_steps") to values, as --set and search spaces name them."""
        return dict(_flatten(self.to_dict()))

    def digest(self, sections: tuple[str, ...], leave_out: tuple[str, ...] = (), extra: str = "") -> str:
        """10 hex digits of the sections' settings (less dotted leave_out keys, plus extra): a stable name part."""
        settings = {k: v for k, v in self.to_dict().items() if k in sections}
        for dotted in leave_out:
            section, key = dotted.split(".")
            settings[section] = {k: v for k, v in settings[section].items() if k != key}
        return hashlib.sha256((json.dumps(settings, sort_keys=True) + extra).encode()).hexdigest()[:10]

    def check(self, where: str = "<config>") -> Config:
        """Limits that span keys; returns self."""
        if self.train.min_workers > self.train.num_workers:
            raise ConfigError(f"{where}: train.min_workers ({self.train.min_workers}) is above train.num_workers "
                              f"({self.train.num_workers}), the most the run grows to; lower it or raise num_workers")
        return self

    def transformer_config(self, vocab_size: int, tgt_vocab_size: int | None = None) -> TransformerConfig:
        """The model's TransformerConfig: the preset, this section's overrides and the data's vocabulary."""
        overrides = {k: v for k, v in dataclasses.asdict(self.model).items() if v is not None and k != "preset"}
        overrides.update(vocab_size=vocab_size, tgt_vocab_size=tgt_vocab_size,
                         label_smoothing=self.train.label_smoothing)
        try:
            return TransformerConfig.preset(self.model.preset, **overrides)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from None


def _flatten(tree: dict[str, Any], prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and prefix == "":
            yield from _flatten(value, f"{key}.")
        else:
            yield f"{prefix}{key}", value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at path, then each "a.b=value" override, checked as they apply."""
    tree: dict[str, Any] = {}
    lines: dict[str, int] = {}
    where = "<defaults>"
    if path is not None:
        where = str(path)
        tree, lines = read_yaml(Path(path))
    config = config_from_dict(tree, where=where, lines=lines, check=False)  # checked once overridden
    named = bool((tree.get("tracking") or {}).get("registered_model")) if isinstance(tree, dict) else False
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.epochs=3")
        value = yaml.safe_load(raw) if raw.strip() else ""
        if isinstance(value, bool) and raw.strip().lower() not in ("true", "false") and _is_text(config, key.strip()):
            value = raw.strip()  # YAML 1.1 reads off, on, yes, no as booleans: train.amp=off means "off"
        set_value(config, key.strip(), value, where=f"--set {item}")
        named = named or (key.strip() == "tracking.registered_model" and bool(config.tracking.registered_model))
    if not named:  # derived from the data as overridden, not as the file had it
        config.tracking.registered_model = default_model_name(config.data)
    return config.check(where if not overrides else f"{where} with --set")


def _is_text(config: Config, dotted: str) -> bool:
    """Whether a known key of the config holds a string."""
    section, _, key = dotted.partition(".")
    part = getattr(config, section, None) if section in {f.name for f in dataclasses.fields(Config)} else None
    if part is None or key not in {f.name for f in dataclasses.fields(part)}:
        return False
    hint = field_type(type(part), key)[0]
    return hint is str or typing.get_origin(hint) is Literal


def default_model_name(data: DataConfig) -> str:
    """The registry name of a corpus and language pair: transformer-nmt-<corpus>-<src>-<tgt>."""
    if data.source == "demo":
        corpus = "demo"
    else:
        corpus = (data.hf_name if data.source == "hf" and data.hf_name else data.path).rstrip("/").rsplit("/", 1)[-1]
    corpus = re.sub(r"[^a-z0-9._-]+", "-", corpus.lower()).strip("-.") or data.source
    return f"transformer-nmt-{corpus}-{data.src_lang}-{data.tgt_lang}"


def config_from_dict(tree: dict[str, Any], where: str = "<dict>", lines: dict[str, int] | None = None,
                     check: bool = True) -> Config:
    """Build and check a Config from a nested dict (a YAML file, or the dict a Ray worker receives)."""
    config = Config()
    if not isinstance(tree, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections, got {type(tree).__name__}")
    sections = [f.name for f in dataclasses.fields(Config)]
    for section, values in tree.items():
        if section not in sections:
            raise ConfigError(f"{_at(where, lines, section)}: unknown section {section!r}{_suggest(section, sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{_at(where, lines, section)}: section {section!r} must be a mapping")
        for key, value in values.items():
            set_value(config, f"{section}.{key}", value, where=_at(where, lines, f"{section}.{key}"))
    if not config.tracking.registered_model:
        config.tracking.registered_model = default_model_name(config.data)
    return config.check(where) if check else config


def set_value(config: Config, dotted: str, value: Any, where: str = "<override>") -> None:
    """Set config[dotted] = value after checking the key exists and the value has its type."""
    section_name, _, key = dotted.partition(".")
    sections = {f.name: f for f in dataclasses.fields(Config)}
    if section_name not in sections:
        raise ConfigError(f"{where}: unknown section {section_name!r}{_suggest(section_name, sections)}")
    section = getattr(config, section_name)
    fields = {f.name: f for f in dataclasses.fields(section)}
    if key not in fields:
        raise ConfigError(
            f"{where}: unknown key {dotted!r}{_suggest(key, fields, prefix=section_name + '.')}"
        )
    hint, limits = field_type(type(section), key)
    choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else ()
    value = _check_type(value, type(choices[0]) if choices else hint, dotted, where)
    if choices and value not in choices:
        raise ConfigError(f"{where}: {dotted} must be one of {list(choices)}, got {value!r}")
    for limit in limits:
        if not limit.allows(value):
            raise ConfigError(f"{where}: {dotted} {limit.message}, got {value!r}")
    setattr(section, key, value)


def field_type(cls: type, key: str) -> tuple[Any, tuple[Limit, ...]]:
    """A key's type (a Literal for a fixed set of values) and the limits its annotation carries."""
    hint = typing.get_type_hints(cls, include_extras=True)[key]
    if typing.get_origin(hint) is Annotated:
        base, *limits = typing.get_args(hint)
        return base, tuple(limits)
    return hint, ()


def _check_type(value: Any, hint: Any, dotted: str, where: str) -> Any:
    """The value converted to the field's type where that is lossless (int -> float), else an error."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(o for o in options if o is not type(None))
        origin = typing.get_origin(hint)
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {dotted} must be a mapping, got {value!r}")
        return {_check_type(k, key_type, dotted, where): _check_type(v, value_type, f"{dotted}.{k}", where)
                for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. hf_config: 2016 read by YAML as a number
    if isinstance(value, bool) and hint is not bool or not isinstance(value, hint):
        raise ConfigError(
            f"{where}: {dotted} must be of type {hint.__name__}, got {value!r} ({type(value).__name__})"
        )
    return value


def _suggest(name: str, known, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    return f"; known: {', '.join(prefix + k for k in known)}"


def _at(where: str, lines: dict[str, int] | None, key: str) -> str:
    line = (lines or {}).get(key)
    return f"{where}:{line}" if line else where


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The YAML mapping in path and the line of each "section" / "section.key"."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see configs/ for examples")
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        tree = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            lines[key_node.value] = key_node.start_mark.line + 1
            if isinstance(value_node, yaml.MappingNode):
                for sub_key, _ in value_node.value:
                    lines[f"{key_node.value}.{sub_key.value}"] = sub_key.start_mark.line + 1
    return (tree or {}), lines
