"""Search spaces (tune_spaces/*.yaml): dotted config keys -> distributions, checked before anything starts."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError, read_yaml, set_value

# name -> (arguments it takes, what they mean)
DISTRIBUTIONS = {
    "choice": "a list of values",
    "grid": "a list of values, every one tried (grid search)",
    "uniform": "[low, high]",
    "loguniform": "[low, high], both > 0",
    "randint": "[low, high) integers",
    "qrandint": "[low, high, q] integers, multiples of q",
}


def load_space(path: str | Path, base: Config) -> dict[str, tuple[str, list]]:
    """The space in path as {dotted key: (distribution, arguments)}, every value checked against base."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"search space {path} does not exist; see tune_spaces/ for examples")
    tree, lines = read_yaml(path)
    if not isinstance(tree, dict) or not tree:
        raise ConfigError(f"{path}: a search space is a mapping of config keys to distributions, "
                          f"e.g. 'model.num_heads: {{choice: [4, 8]}}'")
    space = {}
    for key, spec in tree.items():
        where = f"{path}:{lines.get(key, '?')}"
        space[key] = _distribution(key, spec, where)
        for value in _corners(*space[key]):
            set_value(copy.deepcopy(base), key, value, where=where)  # unknown key, wrong type, bad value
    _check_heads(space, base, path, lines)
    return space


def largest(space: dict[str, tuple[str, list]], key: str, default: Any) -> Any:
    """The largest value `key` can take in the space; default when the space leaves it alone."""
    if key not in space:
        return default
    name, args = space[key]
    if name in ("choice", "grid"):
        return max(args)
    return args[1] - 1 if name == "randint" else args[1]  # randint's high is exclusive, the others' inclusive


def base_point(space: dict[str, tuple[str, list]], base: Config) -> dict[str, Any]:
    """The base config's values of the swept keys, each checked to lie in the space (searches sample only there)."""
    point = {key: base.flat()[key] for key in space}
    for key, value in point.items():
        name, args = space[key]
        inside = value in args if name in ("choice", "grid") else (
            isinstance(value, (int, float)) and args[0] <= value <= (args[1] - 1 if name == "randint" else args[1]))
        if not inside:
            raise ConfigError(f"tune.start_with_base: {key} is {value!r} in the config, outside the space's "
                              f"{name} {args}; set it inside with --set {key}=..., or leave start_with_base off")
    return point


def _distribution(key: str, spec: Any, where: str) -> tuple[str, list]:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{where}: {key} needs exactly one distribution, e.g. '{key}: {{choice: [1, 2]}}'; "
                          f"known: {', '.join(DISTRIBUTIONS)}")
    (name, args), = spec.items()
    if name not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: unknown distribution {name!r} for {key}; known: {', '.join(DISTRIBUTIONS)}")
    if not isinstance(args, list) or not args:
        raise ConfigError(f"{where}: {key}: {name} takes {DISTRIBUTIONS[name]}, got {args!r}")
    sizes = {"uniform": 2, "loguniform": 2, "randint": 2, "qrandint": 3}
    if name in sizes:
        if len(args) != sizes[name] or not all(isinstance(a, (int, float)) and not isinstance(a, bool)
                                               for a in args):
            raise ConfigError(f"{where}: {key}: {name} takes {DISTRIBUTIONS[name]}, got {args!r}")
        if args[0] >= args[1] or (name == "loguniform" and args[0] <= 0):
            raise ConfigError(f"{where}: {key}: {name} needs low < high{' and low > 0' if name == 'loguniform' else ''}"
                              f", got {args!r}")
    return name, args


def _corners(name: str, args: list) -> list:
    """Values that stand for the whole range when checking types and bounds."""
    if name in ("choice", "grid"):
        return args
    if name == "randint":
        return [int(args[0]), int(args[1]) - 1]
    if name == "qrandint":
        return [int(args[0]), int(args[1])]
    return [float(args[0]), float(args[1])]


def _check_heads(space: dict, base: Config, path: Path, lines: dict) -> None:
    """A number of heads that divides no possible d_model can never make a valid model."""
    if "model.num_heads" not in space or space["model.num_heads"][0] not in ("choice", "grid"):
        return
    d_models = space["model.d_model"][1] if space.get("model.d_model", ("",))[0] in ("choice", "grid") else \
        [base.model.d_model or base.transformer_config(8).d_model]
    for heads in space["model.num_heads"][1]:
        if not any(d % heads == 0 for d in d_models):
            raise ConfigError(f"{path}:{lines.get('model.num_heads', '?')}: model.num_heads {heads} divides no "
                              f"d_model in {d_models}; every head needs d_model / num_heads dimensions")


def to_tune(space: dict[str, tuple[str, list]]) -> dict[str, Any]:
    """Ray Tune's param_space for the space (keys stay dotted; the trial applies them)."""
    from ray import tune

    make = {"choice": tune.choice, "grid": tune.grid_search, "uniform": lambda a: tune.uniform(*a),
            "loguniform": lambda a: tune.loguniform(*a), "randint": lambda a: tune.randint(*a),
            "qrandint": lambda a: tune.qrandint(*a)}
    return {key: make[name](args) for key, (name, args) in space.items()}


def grid_size(space: dict[str, tuple[str, list]]) -> int:
    """How many combinations the grid keys multiply to (1 without grid keys)."""
    return len(list(itertools.product(*(args for name, args in space.values() if name == "grid")))) or 1


def apply(base: Config, params: dict[str, Any]) -> tuple[Config, str | None]:
    """base with the sampled params set, and why the combination is invalid (None when it is fine)."""
    cfg = copy.deepcopy(base)
    for key, value in params.items():
        if isinstance(value, float) and key in INTEGER_KEYS:
            value = int(round(value))
        set_value(cfg, key, value, where="sampled")
    try:
        cfg.transformer_config(8)
    except ValueError as err:
        return cfg, str(err)
    return cfg, None


INTEGER_KEYS = {"model.d_model", "model.d_ff", "model.num_heads", "model.num_layers", "train.warmup_steps"}
