"""The `nmt` command line: one subcommand per pipeline stage, user mistakes without tracebacks."""

from __future__ import annotations

import argparse
import sys

from .errors import UserError


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="experiment YAML file (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set train.epochs=3 (repeatable)")


def _load(args: argparse.Namespace):
    from .config import load_config

    return load_config(args.config, args.overrides)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from .data import prepare

    manifest = prepare(_load(args).data, address=args.address, force=args.force)
    print(manifest.summary())
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import train

    outcome = train(_load(args), address=args.address, config_file=args.config)
    metrics = outcome.metrics
    print(f"run {outcome.run_name}: best val_bleu {metrics.get('val_bleu', float('nan')):.2f} "
          f"(step {metrics.get('step', '?')}); MLflow run {outcome.run_id}; checkpoint {outcome.checkpoint_path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="nmt", description="Train, tune, evaluate and serve Transformer translation models on Ray.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prepare = commands.add_parser("prepare", help="clean, tokenize and shard a corpus with Ray Data")
    _add_config_options(prepare)
    prepare.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    prepare.add_argument("--force", action="store_true", help="prepare anew even if a cached copy exists")
    prepare.set_defaults(func=_cmd_prepare)

    train = commands.add_parser("train", help="train on Ray Train (resumes a run of the same name)")
    _add_config_options(train)
    train.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    train.set_defaults(func=_cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nmt` and `python -m pipeline`; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as err:
        print(f"nmt {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nmt {args.command}: interrupted", file=sys.stderr)
        return 130
