"""The argument parser of `nmt`: every subcommand and its options (what they do is in cli.py)."""

from __future__ import annotations

import argparse

from .common.devices import CHOICES_HELP


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="experiment YAML file (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set train.epochs=3 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    verbosity = argparse.ArgumentParser(add_help=False)
    verbosity.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                           default=argparse.SUPPRESS, help="more detail, Ray's own INFO lines included")
    verbosity.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                           default=argparse.SUPPRESS, help="warnings and errors only")
    parser = argparse.ArgumentParser(
        prog="nmt", description="Train, tune, evaluate and serve Transformer translation models on Ray.",
        parents=[verbosity],
    )
    parser.set_defaults(verbosity=0)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prepare = commands.add_parser("prepare", parents=[verbosity],
                                  help="clean, tokenize and shard a corpus with Ray Data")
    _add_config_options(prepare)
    prepare.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    prepare.add_argument("--force", action="store_true", help="prepare anew even if a cached copy exists")

    train = commands.add_parser("train", parents=[verbosity],
                                help="train on Ray Train (resumes a run of the same name)")
    _add_config_options(train)
    train.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")

    tune = commands.add_parser("tune", parents=[verbosity],
                               help="sweep hyperparameters with Ray Tune (ASHA), trials on Ray Train")
    _add_config_options(tune)
    tune.add_argument("--space", required=True, help="search space YAML (see tune_spaces/)")
    tune.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    tune.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same name")

    demo = commands.add_parser("demo", parents=[verbosity],
                               help="the whole pipeline on the built-in corpus in minutes (make demo)")
    demo.add_argument("--quick", action="store_true", help="a smaller corpus, model and sweep (for CI)")
    demo.add_argument("--workdir", help="where data, runs and mlflow.db go (default: here)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    device_help = f"where to decode: {CHOICES_HELP} (default auto)"
    model_help = "MLflow model URI (default: models:/NAME@champion, NAME from tracking.registered_model)"
    evaluate = commands.add_parser("evaluate", parents=[verbosity],
                                   help="score a model with sacreBLEU (BLEU, chrF, lowercased BLEU)")
    _add_config_options(evaluate)
    evaluate.add_argument("--model", help=model_help)
    evaluate.add_argument("--src", help="source sentences, one per line")
    evaluate.add_argument("--ref", help="reference translations, one per line")
    evaluate.add_argument("--split", help="a prepared split instead (e.g. test)")
    evaluate.add_argument("--data", help="the prepared dataset for --split (default: the one the model was trained on)")
    evaluate.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    evaluate.add_argument("--device", default="auto", help=device_help)

    translate = commands.add_parser("translate", parents=[verbosity],
                                    help="translate sentences with a registered model")
    _add_config_options(translate)
    translate.add_argument("text", nargs="*", help="sentences to translate")
    translate.add_argument("--model", help=model_help)
    translate.add_argument("--input", help="a file of sentences, one per line")
    translate.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    translate.add_argument("--device", default="auto", help=device_help)

    promote = commands.add_parser("promote", parents=[verbosity],
                                  help="move the champion alias to a model version by hand")
    _add_config_options(promote)
    promote.add_argument("version", help="the model version number")
    promote.add_argument("--name", help="registered model name (default: tracking.registered_model)")

    serve = commands.add_parser("serve", parents=[verbosity],
                                help="serve a registered model over HTTP with Ray Serve (Ctrl-C stops)")
    _add_config_options(serve)
    serve.add_argument("--model", help="MLflow model URI (default: serve.model_uri, else the champion)")
    serve.add_argument("--port", type=int, help="HTTP port (default: serve.port, 8000)")
    serve.add_argument("--host", help="interface to listen on (default: serve.host, 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")

    submit = commands.add_parser(
        "submit", parents=[verbosity], help="run an nmt command as a Ray Job on a cluster",
        usage="nmt submit [--address URL] [--follow] [--no-pip] [--forward-env NAMES] -- COMMAND [ARGS ...]",
        description="Submit `nmt COMMAND ARGS` as a Ray Job: the project directory is its working_dir; the MLflow "
                    "tracking URI and storage paths are passed explicitly. Token-authenticated clusters: set "
                    "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token).")
    submit.add_argument("--address", help="the cluster's dashboard URL, e.g. http://HEAD:8265 (default: RAY_ADDRESS)")
    submit.add_argument("--follow", action="store_true",
                        help="stream the job's logs; the exit status is the job's (0 succeeded, 1 failed, 130 stopped)")
    submit.add_argument("--pip", action=argparse.BooleanOptionalAction, default=True,
                        help="add the project's requirements (all but Ray) to the job's runtime_env; --no-pip when "
                             "the cluster's image already has them (default: --pip)")
    submit.add_argument("--forward-env", metavar="NAMES", default="",
                        help="comma-separated environment variables whose values the job gets (e.g. "
                             "MLFLOW_TRACKING_USERNAME,MLFLOW_TRACKING_PASSWORD) without showing them in its "
                             "command or job record; a tracking URI's user:password@ is forwarded this way too")
    submit.add_argument("job", nargs=argparse.REMAINDER, metavar="COMMAND", help="the nmt command, after --")
    return parser
