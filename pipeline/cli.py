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


def _cmd_tune(args: argparse.Namespace) -> int:
    from .sweep import sweep

    outcome = sweep(_load(args), args.space, address=args.address, resume=args.resume, config_file=args.config)
    print(format_trials(outcome))
    return 0


def format_trials(outcome) -> str:
    """The sweep's trials as a text table, the best one marked."""
    keys = list(outcome.trials[0]["params"]) if outcome.trials else []
    header = ["trial", *(k.split(".")[-1] for k in keys), "val_bleu", "steps", "status"]
    rows = [[t["trial_id"], *(_short(t["params"][k]) for k in keys), f"{t['val_bleu']:.2f}", str(t["steps"]),
             t["status"] + (" *best*" if t is outcome.best else "")] for t in outcome.trials]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    registered = outcome.registered
    if registered is not None:
        lines.append(f"registered {registered.name} version {registered.version}"
                     + (" (champion)" if registered.champion else " (champion unchanged)"))
    lines.append(f"sweep {outcome.name}: MLflow parent run {outcome.parent_run_id}; results in {outcome.path}")
    return "\n".join(lines)


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main_demo

    return main_demo(args)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from .inference import evaluate

    if bool(args.split) == bool(args.src or args.ref):
        raise UserError("give either --split NAME or both --src FILE and --ref FILE")
    if not args.split and not (args.src and args.ref):
        raise UserError("--src and --ref go together: the source file and its reference translations")
    cfg = _load(args)
    scores = evaluate(cfg.tracking.tracking_uri, cfg.tracking.experiment, args.model, args.beam,
                      src_file=args.src, ref_file=args.ref, split=args.split, data_dir=args.data)
    print(f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})")
    print(f"BLEU lowercased, tokenized {scores['bleu_lc']:.2f}  ({scores['bleu_lc_signature']})")
    print(f"{scores['sentences']} sentences; MLflow evaluation run {scores['run_id']}")
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import registry, tracking
    from .corpus import read_lines
    from .inference import translate

    texts = list(args.text)
    if args.input:
        texts += read_lines(Path(args.input))
    if not texts and not sys.stdin.isatty():
        texts = [line.rstrip("\n") for line in sys.stdin]
    if not texts:
        raise UserError("nothing to translate: give sentences as arguments, --input FILE, or lines on stdin")
    cfg = _load(args)
    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    tracking.check_reachable(uri)
    model = registry.load(uri, args.model)
    for line in translate(model, texts, args.beam, progress=bool(args.input)):
        print(line)
    return 0


def _cmd_promote(args: argparse.Namespace) -> int:
    from . import registry, tracking

    cfg = _load(args)
    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    tracking.check_reachable(uri)
    name = args.name or cfg.tracking.registered_model
    registry.promote(uri, name, args.version)
    print(f"{name} version {args.version} is now @{registry.CHAMPION}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from .config import set_value
    from .serve import run

    cfg = _load(args)
    for key, value in (("model_uri", args.model), ("port", args.port), ("host", args.host)):
        if value is not None:
            set_value(cfg, f"serve.{key}", value, where=f"--{key.split('_')[0]}")
    return run(cfg, address=args.address)


def _cmd_submit(args: argparse.Namespace) -> int:
    from .submit import submit

    return submit(args.job, address=args.address, follow=args.follow, pip=args.pip)


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

    tune = commands.add_parser("tune", help="sweep hyperparameters with Ray Tune (ASHA), trials on Ray Train")
    _add_config_options(tune)
    tune.add_argument("--space", required=True, help="search space YAML (see tune_spaces/)")
    tune.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    tune.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same name")
    tune.set_defaults(func=_cmd_tune)

    demo = commands.add_parser("demo", help="the whole pipeline on the built-in corpus in minutes (make demo)")
    demo.add_argument("--quick", action="store_true", help="a smaller corpus, model and sweep (for CI)")
    demo.add_argument("--workdir", help="where data, runs and mlflow.db go (default: here)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    demo.set_defaults(func=_cmd_demo)

    model_help = "MLflow model URI (default: models:/transformer-nmt@champion)"
    evaluate = commands.add_parser("evaluate", help="score a model with sacreBLEU (BLEU, chrF, lowercased BLEU)")
    _add_config_options(evaluate)
    evaluate.add_argument("--model", default="models:/transformer-nmt@champion", help=model_help)
    evaluate.add_argument("--src", help="source sentences, one per line")
    evaluate.add_argument("--ref", help="reference translations, one per line")
    evaluate.add_argument("--split", help="a prepared split instead (e.g. test)")
    evaluate.add_argument("--data", help="the prepared dataset for --split (default: the one the model was trained on)")
    evaluate.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    evaluate.set_defaults(func=_cmd_evaluate)

    translate = commands.add_parser("translate", help="translate sentences with a registered model")
    _add_config_options(translate)
    translate.add_argument("text", nargs="*", help="sentences to translate")
    translate.add_argument("--model", default="models:/transformer-nmt@champion", help=model_help)
    translate.add_argument("--input", help="a file of sentences, one per line")
    translate.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    translate.set_defaults(func=_cmd_translate)

    promote = commands.add_parser("promote", help="move the champion alias to a model version by hand")
    _add_config_options(promote)
    promote.add_argument("version", help="the model version number")
    promote.add_argument("--name", help="registered model name (default: tracking.registered_model)")
    promote.set_defaults(func=_cmd_promote)

    serve = commands.add_parser("serve", help="serve a registered model over HTTP with Ray Serve (Ctrl-C stops)")
    _add_config_options(serve)
    serve.add_argument("--model", help="MLflow model URI (default: serve.model_uri, models:/transformer-nmt@champion)")
    serve.add_argument("--port", type=int, help="HTTP port (default: serve.port, 8000)")
    serve.add_argument("--host", help="interface to listen on (default: serve.host, 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    serve.set_defaults(func=_cmd_serve)

    submit = commands.add_parser(
        "submit", help="run an nmt command as a Ray Job on a cluster",
        usage="nmt submit [--address URL] [--follow] [--no-pip] -- COMMAND [ARGS ...]",
        description="Submit `nmt COMMAND ARGS` as a Ray Job: the project directory is its working_dir; the MLflow "
                    "tracking URI and storage paths are passed explicitly. Token-authenticated clusters: set "
                    "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token).")
    submit.add_argument("--address", help="the cluster's dashboard URL, e.g. http://HEAD:8265 (default: RAY_ADDRESS)")
    submit.add_argument("--follow", action="store_true",
                        help="stream the job's logs; the exit status is the job's (0 succeeded, 1 failed, 130 stopped)")
    submit.add_argument("--pip", action=argparse.BooleanOptionalAction, default=True,
                        help="add the project's requirements (all but Ray) to the job's runtime_env; --no-pip when "
                             "the cluster's image already has them (default: --pip)")
    submit.add_argument("job", nargs=argparse.REMAINDER, metavar="COMMAND", help="the nmt command, after --")
    submit.set_defaults(func=_cmd_submit)
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
        hint = {"train": "; the same command again resumes from the last checkpoint",
                "tune": "; the same command with --resume continues the sweep"}.get(args.command, "")
        print(f"nmt {args.command}: interrupted{hint}", file=sys.stderr)
        return 130
