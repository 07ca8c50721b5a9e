"""The experiment config tree: defaults, then a YAML file, then `--set a.b=value` overrides."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .common.errors import UserError

if typing.TYPE_CHECKING:  # torch is imported only where a model is built, not by Ray Data workers
    from model import TransformerConfig


class ConfigError(UserError):
    """A mistake in a config file or override; the message names the file, line and key."""


@dataclass
class DataConfig:
    """Where the corpus comes from, how it is cleaned and tokenized, where shards go."""

    source: str = "demo"  # demo | files | hf
    src_lang: str = "en"  # source language code: file suffix and default field name
    tgt_lang: str = "de"  # target language code
    path: str = ""  # files: directory of the split files, local or a URI (s3://, gs://, hf://); hf: a saved dataset
    format: str = "text"  # files: text (one file per language) | tsv | jsonl | parquet
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
    seed: int = 0  # seed of the demo corpus and of the tokenizer's training sample
    on_bad_utf8: str = "error"  # error | replace
    max_len: int = 128  # subword tokens per side, longer pairs are dropped
    max_len_ratio: float = 3.0  # drop pairs whose token-length ratio exceeds this
    dedup: bool = False  # drop exact duplicate pairs in the training split (a distributed group-by)
    vocab_size: int = 8000  # SentencePiece vocabulary size (each side's, if not joint)
    tokenizer_type: str = "bpe"  # bpe | unigram
    joint_vocab: bool = True  # one vocabulary for both sides, so embeddings can be tied
    tokenizer_sample: int = 200_000  # sentences per side sampled to train SentencePiece
    character_coverage: float = 1.0  # SentencePiece: share of characters covered; 1.0 keeps all
    output_dir: str = "data/prepared"  # local path or storage URI
    num_shards: int = 0  # Parquet files per split (at most); 0: one per block it is in (blocks: up to 100k pairs)


@dataclass
class ModelConfig:
    """A TransformerConfig preset plus overrides; None keeps the preset's value."""

    preset: str = "tiny"  # tiny | base | big (Table 3 of the paper; tiny is CPU-sized)
    d_model: int | None = None  # model width
    d_ff: int | None = None  # inner size of the feed-forward layers
    num_heads: int | None = None  # attention heads; must divide d_model
    num_layers: int | None = None  # both stacks; the two below win if set
    num_encoder_layers: int | None = None  # encoder layers
    num_decoder_layers: int | None = None  # decoder layers
    dropout: float | None = None  # P_drop: sublayer outputs and embeddings + positions
    attention_dropout: float | None = None  # dropout on attention weights; not in the paper
    norm_first: bool | None = None  # true: pre-norm; false: post-norm as in the paper
    positional_encoding: str | None = None  # sinusoidal | learned
    tie_embeddings: bool | None = None  # share embeddings and pre-softmax weights (needs a joint vocabulary)
    max_positions: int | None = None  # longest sequence the positional encoding covers


@dataclass
class TrainConfig:
    """Ray Train scaling and the optimisation recipe of Sec. 5."""

    num_workers: int = 1  # Ray Train workers (DDP ranks); with min_workers, the most the run grows to
    min_workers: int = 0  # elastic: start with what fits (at least this many), grow and shrink with nodes; 0: fixed
    use_gpu: bool = False  # one GPU per worker
    cpus_per_worker: int = 1  # CPUs reserved for each worker
    placement_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    max_tokens: int = 4096  # padded source + target tokens per batch per worker
    update_freq: int = 1  # gradient accumulation at num_workers workers
    tokens_per_update: int = 0  # kept whatever the worker count (accumulation follows); 0: max_tokens x workers x freq
    epochs: int = 10  # passes over the training split
    max_steps: int = 0  # 0: no limit besides epochs
    time_budget_s: float = 0.0  # stop (validate, average, finish) after this much training time; 0: none
    warmup_steps: int = 4000  # Eq. 3: the learning rate rises linearly for this many updates, then decays
    lr_scale: float = 1.0  # multiplies the learning rate of Eq. 3
    cooldown: float = 0.0  # lr falls linearly to 0 over this last fraction of the run (its epochs, steps or time)
    label_smoothing: float = 0.1  # epsilon_ls of Sec. 5.4
    clip_norm: float = 0.0  # 0: no clipping
    amp: str = "auto"  # auto | bf16 | fp16 | off
    compile: bool = False  # torch.compile the model
    seed: int = 0  # seed of initialisation and batch shuffling
    val_interval: int = 0  # updates between validations; 0: every epoch
    log_every: int = 10  # updates between progress lines and train_loss values
    init_from: str = ""  # fine-tune from a checkpoint directory, MLflow run id or models:/ URI (its tokenizer too)
    report_interval_s: float = 10.0  # progress values go to Ray Train (and MLflow) at most this often
    beam_size: int = 4  # beam of validation decoding and of the packaged model
    length_penalty: float = 0.6  # beam search length penalty alpha
    keep_checkpoints: int = 3  # checkpoints kept: the best by val_bleu, plus the latest
    average_last: int = 5  # average the last N checkpoints at the end (Sec. 6.1)
    storage_path: str = "runs"  # Ray Train / Tune results and checkpoints: local path or storage URI
    run_name: str = ""  # "": a hash of the config; the same name resumes the run
    max_failures: int = 0  # restarts from the latest checkpoint after a worker failure
    max_preemption_failures: int = -1  # restarts after a node is preempted (counted apart from failures); -1: no limit
    preemption_check_s: float = 5.0  # ask this often whether a node is being preempted (then checkpoint); 0: never
    preemption_grace_s: float = 30.0  # restart this long after a preemption deadline, once Ray Train sees the node go
    resize_interval_s: float = 60.0  # elastic: how often Ray Train checks whether more workers fit
    resource_wait_s: float = 30.0  # how long to wait for the cluster to fit the workers

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

    num_samples: int = 4  # trials to sample (with grid keys: samples of each grid point)
    max_concurrent_trials: int = 0  # 0: as many as the cluster fits
    scheduler: str = "asha"  # asha | fifo
    grace_period: int = 0  # ASHA: updates every trial trains before it can be stopped; 0: the space's longest warmup
    reduction_factor: int = 2  # ASHA: keep the best 1/reduction_factor at each rung
    name: str = ""  # the sweep's name (its storage directory and MLflow parent run); "" derives one
    search: str = "random"  # random | grid | optuna
    seed: int = 0  # seed of the random and optuna searches: the same space and seed sample the same trials
    start_with_base: bool = False  # random, optuna: the first trial takes the config's own values (a baseline)
    metric: str = "val_bleu"  # what the scheduler and the best trial go by
    mode: str = "max"  # max | min


@dataclass
class TrackingConfig:
    """MLflow tracking and registry; an empty tracking_uri means MLFLOW_TRACKING_URI or sqlite:///mlflow.db."""

    tracking_uri: str = ""  # "": MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory
    experiment: str = "transformer-nmt"  # MLflow experiment of every run
    # One name per corpus and language pair, so champions of different corpora never compete.
    registered_model: str = ""  # registry name; "": transformer-nmt-<corpus>-<src>-<tgt>, e.g. ...-wmt14-en-de
    register: bool = True  # register the best model; @champion moves only if val_bleu improves
    system_metrics_s: float = 10.0  # MLflow system metrics (CPU, memory, disk, network, GPU) every N s; 0: off


@dataclass
class ServeConfig:
    """The Ray Serve translation service."""

    model_uri: str = ""  # MLflow model URI to serve; empty: the champion of tracking.registered_model
    host: str = "127.0.0.1"  # interface to listen on; 0.0.0.0 for all
    port: int = 8000  # HTTP port
    max_batch_size: int = 16  # sentences decoded together (dynamic batching)
    batch_wait_timeout_s: float = 0.05  # how long a batch waits to fill up
    max_ongoing_requests: int = 32  # requests a replica works on at once
    max_queued_requests: int = 64  # requests waiting beyond those; more get 503
    request_timeout_s: float = 30.0  # seconds until a request's answer is 504
    max_texts: int = 64  # sentences per request, more get 413
    max_chars: int = 1000  # characters per sentence, longer get 413
    num_gpus: float = 0.0  # GPUs per replica (1, or 0.5 to share one); 0: replicas decode on the CPU
    engine: str = "auto"  # pytorch, ctranslate2 (the model's `nmt export`), or auto: ctranslate2 when both exist


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
        from model import TransformerConfig

        overrides = {k: v for k, v in dataclasses.asdict(self.model).items() if v is not None and k != "preset"}
        overrides.update(vocab_size=vocab_size, tgt_vocab_size=tgt_vocab_size,
                         label_smoothing=self.train.label_smoothing)
        try:
            return TransformerConfig.preset(self.model.preset, **overrides)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from None


# Keys whose values come from a fixed set, and numeric keys with a lower bound.
CHOICES: dict[str, tuple[Any, ...]] = {
    "data.source": ("demo", "files", "hf"),
    "data.format": ("text", "tsv", "jsonl", "parquet"),
    "data.on_bad_utf8": ("error", "replace"),
    "data.tokenizer_type": ("bpe", "unigram"),
    "model.preset": ("tiny", "base", "big"),
    "train.amp": ("auto", "bf16", "fp16", "off"),
    "train.placement_strategy": ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
    "tune.scheduler": ("asha", "fifo"),
    "tune.search": ("random", "grid", "optuna"),
    "tune.mode": ("max", "min"),
    "serve.engine": ("auto", "pytorch", "ctranslate2"),
}
POSITIVE = {
    "data.max_len", "data.max_len_ratio", "data.vocab_size", "data.tokenizer_sample",
    "data.character_coverage", "train.num_workers", "train.cpus_per_worker", "train.max_tokens",
    "train.update_freq", "train.epochs", "train.log_every", "train.warmup_steps", "train.lr_scale",
    "train.beam_size",
    "train.keep_checkpoints", "train.average_last", "tune.num_samples",
    "tune.reduction_factor", "serve.port", "serve.max_batch_size", "serve.max_ongoing_requests",
    "serve.max_queued_requests", "serve.request_timeout_s", "serve.max_texts", "serve.max_chars",
}
FRACTIONS = {"train.cooldown"}  # in [0, 1)
COUNT_OR_UNLIMITED = {"train.max_preemption_failures"}  # -1 (no limit) or more
NON_NEGATIVE = {
    "data.num_shards", "data.seed", "train.max_steps", "train.time_budget_s", "train.clip_norm", "train.val_interval",
    "train.max_failures", "train.length_penalty", "train.resource_wait_s", "train.report_interval_s",
    "train.min_workers", "train.tokens_per_update", "train.preemption_check_s", "train.resize_interval_s",
    "train.preemption_grace_s",
    "tune.max_concurrent_trials", "tune.grace_period", "tracking.system_metrics_s",
    "serve.batch_wait_timeout_s", "train.cooldown",
}


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
    return part is not None and typing.get_type_hints(type(part)).get(key) is str


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
    hint = typing.get_type_hints(type(section))[key]
    value = _check_type(value, hint, dotted, where)
    if dotted in CHOICES and value not in CHOICES[dotted]:
        raise ConfigError(f"{where}: {dotted} must be one of {list(CHOICES[dotted])}, got {value!r}")
    if dotted in POSITIVE and value <= 0:
        raise ConfigError(f"{where}: {dotted} must be positive, got {value!r}")
    if dotted in NON_NEGATIVE and value < 0:
        raise ConfigError(f"{where}: {dotted} must be >= 0, got {value!r}")
    if dotted in COUNT_OR_UNLIMITED and value < -1:
        raise ConfigError(f"{where}: {dotted} must be -1 (no limit) or a count >= 0, got {value!r}")
    if dotted in FRACTIONS and not value < 1:
        raise ConfigError(f"{where}: {dotted} is a fraction of the run and must be below 1, got {value!r}")
    setattr(section, key, value)


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
