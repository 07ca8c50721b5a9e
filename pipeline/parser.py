"""The argument parser of `nmt`: every subcommand and its options (what they do is in cli.py)."""

from __future__ import annotations

import argparse
from importlib import metadata

from .common.devices import CHOICES_HELP

ENGINES = ("auto", "pytorch", "ctranslate2")  # decoders of translate, evaluate and serve (serve.engine)


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="experiment YAML file (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set train.epochs=3 (repeatable)")


def _add_decoding_options(parser: argparse.ArgumentParser, device_help: str) -> None:
    """--beam and --device of the commands that decode with a registered model."""
    parser.add_argument("--beam", type=_beam_size, default=None,
                        help="beam size (default: the model's, train.beam_size when it was registered)")
    parser.add_argument("--device", default="auto", help=device_help)


def _beam_size(text: str) -> int:
    """--beam: a whole number of at least 1."""
    try:
        beam = int(text)
    except ValueError:
        beam = 0
    if beam < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return beam


def _version() -> str:
    try:
        return metadata.version("transformer-nmt")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _Commands:
    """Adds subcommands whose --help starts with their one-line summary and ends with examples."""

    def __init__(self, parser: argparse.ArgumentParser, verbosity: argparse.ArgumentParser):
        self.commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        self.verbosity = verbosity

    def add(self, name: str, summary: str, examples: list[str], parents=(), config: bool = False,
            **kwargs) -> argparse.ArgumentParser:
        """A subcommand (with --config and --set when config)."""
        epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples)
        sub = self.commands.add_parser(name, parents=[self.verbosity, *parents], help=summary,
                                       description=kwargs.pop("description", summary), epilog=epilog,
                                       formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        if config:
            _add_config_options(sub)
        return sub


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    address = argparse.ArgumentParser(add_help=False)
    address.add_argument("--address", metavar="RAY_ADDRESS",
                         help="the Ray cluster to run on, as ray.init takes it: auto, HEAD:6379 or ray://HEAD:10001, "
                              "from a node of the cluster (default: RAY_ADDRESS, else a local instance); from a "
                              "laptop use `nmt submit --address http://HEAD:8265` instead")
    verbosity = argparse.ArgumentParser(add_help=False)
    verbosity.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                           default=argparse.SUPPRESS, help="more detail, Ray's own INFO lines included")
    verbosity.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                           default=argparse.SUPPRESS, help="warnings and errors only")
    parser = argparse.ArgumentParser(
        prog="nmt", description="Train, tune, evaluate and serve Transformer translation models on Ray.",
        parents=[verbosity],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.set_defaults(verbosity=0)
    commands = _Commands(parser, verbosity)
    _add_pipeline_commands(commands, address)
    _add_model_commands(commands, address)
    _add_submit(commands)
    return parser


def _add_pipeline_commands(commands: _Commands, address: argparse.ArgumentParser) -> None:
    """prepare, train, tune, demo and config."""
    command = commands.add
    prepare = command("prepare", "clean, tokenize and shard a corpus with Ray Data",
                      ["nmt prepare --config configs/multi30k_en_de.yaml",
                       "nmt prepare --config configs/demo.yaml --set data.output_dir=s3://bucket/prepared"],
                      parents=[address], config=True)
    prepare.add_argument("--force", action="store_true", help="prepare anew even if a cached copy exists")

    command("train", "train on Ray Train (resumes a run of the same name)",
            ["nmt train --config configs/demo.yaml --set train.epochs=3",
             "nmt train --config configs/multi30k_en_de.yaml --set train.num_workers=4 --address auto"],
            parents=[address], config=True)

    tune = command("tune", "sweep hyperparameters with Ray Tune (ASHA), trials on Ray Train",
                   ["nmt tune --config configs/demo.yaml --space tune_spaces/demo.yaml",
                    "nmt tune --config configs/demo.yaml --space tune_spaces/demo.yaml --resume"],
                   parents=[address], config=True)
    tune.add_argument("--space", required=True, help="search space YAML (see tune_spaces/)")
    tune.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same name")

    demo = command("demo", "the whole pipeline on the built-in corpus in minutes (make demo)",
                   ["nmt demo", "nmt demo --quick --workdir /tmp/nmt-demo"], parents=[address])
    demo.add_argument("--quick", action="store_true", help="a smaller corpus, model and sweep (for CI)")
    demo.add_argument("--workdir", help="where data, runs and mlflow.db go (default: here)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override one config key of configs/demo.yaml (repeatable)")

    config = command("config", "print the resolved configuration (a dry run: nothing starts), or every key",
                     ["nmt config --config configs/demo.yaml --set train.epochs=3",
                      "nmt config --keys | grep warmup"], config=True)
    config.add_argument("--keys", action="store_true", help="list every key with its type, default and meaning")


def _add_model_commands(commands: _Commands, address: argparse.ArgumentParser) -> None:
    """evaluate, translate, export, promote and serve: what is done with a registered model."""
    command = commands.add
    device_help = f"where to decode: {CHOICES_HELP} (default auto)"
    engine = argparse.ArgumentParser(add_help=False)
    engine.add_argument("--engine", choices=ENGINES, default="auto",
                        help="decode with PyTorch or with the model's CTranslate2 export (`nmt export`); auto: "
                             "CTranslate2 when it is installed and the model version has an export (default auto)")
    model_help = "MLflow model URI (default: models:/NAME@champion, NAME from tracking.registered_model)"
    evaluate = command("evaluate", "score a model with sacreBLEU (BLEU, chrF, lowercased BLEU)",
                       ["nmt evaluate --split test",
                        "nmt evaluate --model models:/transformer-nmt-wmt14-en-de/3 --src test.en "
                        "--ref test.de --device cuda", "nmt evaluate --split test --engine ctranslate2"],
                       parents=[engine], config=True)
    evaluate.add_argument("--model", help=model_help)
    evaluate.add_argument("--src", help="source sentences, one per line")
    evaluate.add_argument("--ref", help="reference translations, one per line")
    evaluate.add_argument("--split", help="a prepared split instead (e.g. test)")
    evaluate.add_argument("--data", help="the prepared dataset for --split (default: the one the model was trained on)")
    _add_decoding_options(evaluate, device_help)

    translate = command("translate", "translate sentences with a registered model",
                        ["nmt translate \"the small dog sees a red house .\"",
                         "nmt translate --input sentences.en > sentences.de", "cat sentences.en | nmt translate"],
                        parents=[engine], config=True)
    translate.add_argument("text", nargs="*", help="sentences to translate")
    translate.add_argument("--model", help=model_help)
    translate.add_argument("--input", help="a file of sentences, one per line")
    _add_decoding_options(translate, device_help)

    export = command("export", "convert a model to CTranslate2 (int8 or float32) and attach it to its model version",
                     ["nmt export",
                      "nmt export --model models:/transformer-nmt-wmt14-en-de/3 --quantization float32 --out ct2/"],
                     config=True)
    export.add_argument("--model", help=model_help)
    export.add_argument("--format", choices=("ctranslate2",), default="ctranslate2", help="the target format")
    export.add_argument("--quantization", choices=("int8", "float32"), default="int8",
                        help="weight type of the export (default int8: about 4x smaller, slightly lower BLEU)")
    export.add_argument("--out", default="ctranslate2-model", help="the directory to write (default ctranslate2-model)")

    promote = command("promote", "check and register candidate runs, then move the champion alias to the best; or "
                      "pin a version by hand",
                      ["nmt promote --name transformer-nmt-wmt14-en-de --config configs/wmt14_en_de.yaml",
                       "nmt promote --data s3://bucket/nmt/prepared/demo-en-de-0123abcd", "nmt promote 3"],
                      config=True)
    promote.add_argument("version", nargs="?", help="pin @champion to this version (only later ones compete with "
                         "it); else each candidate run's own model is scored here on the validation split, "
                         "registered as a copy, and the best becomes champion")
    promote.add_argument("--name", help="registered model name (default: tracking.registered_model)")
    promote.add_argument("--data", help="the prepared dataset whose validation split scores the candidates "
                                        "(default: the one --config and --set data.* prepare)")
    promote.add_argument("--device", default="auto", help=device_help)

    serve = command("serve", "serve a registered model over HTTP with Ray Serve (Ctrl-C stops)",
                    ["nmt serve --port 8000", "nmt serve --model models:/transformer-nmt-wmt14-en-de/3 --host 0.0.0.0",
                     "nmt serve --engine ctranslate2"],
                    parents=[address], config=True)
    serve.add_argument("--model", help="MLflow model URI (default: serve.model_uri, else the champion)")
    serve.add_argument("--port", type=int, help="HTTP port (default: serve.port, 8000)")
    serve.add_argument("--host", help="interface to listen on (default: serve.host, 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--engine", choices=ENGINES,
                       help="decoder (default: serve.engine, auto: CTranslate2 when installed and exported)")


def _add_submit(commands: _Commands) -> None:
    """submit: an nmt command as a Ray Job."""
    submit = commands.add(
        "submit", "run an nmt command as a Ray Job on a cluster",
        ["nmt submit --address http://HEAD:8265 --follow -- nmt train --config configs/multi30k_en_de.yaml"],
        usage="nmt submit [--address DASHBOARD_URL] [--follow] [--no-pip] [--forward-env NAMES] -- COMMAND [ARGS ...]",
        description="Submit `nmt COMMAND ARGS` as a Ray Job (`-- nmt train ...` and `-- train ...` are the same): "
                    "the project directory is its working_dir; the MLflow tracking URI and storage paths are passed "
                    "explicitly. The cluster is asked whether its nodes see this machine's files (a tunnel's "
                    "127.0.0.1 says nothing about that); when they do not, a local MLflow store, storage path or "
                    "corpus directory is an error naming the key: use an MLflow server and s3://, gs:// ... URIs. "
                    "Token-authenticated clusters: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or "
                    "RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token).")
    submit.add_argument("--address", metavar="DASHBOARD_URL",
                        help="the cluster's dashboard (Jobs API) URL, e.g. http://HEAD:8265, or http://127.0.0.1:8265 "
                             "through a tunnel (default: RAY_API_SERVER_ADDRESS or RAY_ADDRESS); not the Ray address "
                             "(HEAD:6379) that train and tune take")
    submit.add_argument("--follow", action="store_true",
                        help="stream the job's logs; the exit status is the job's (0 succeeded, 1 failed, 130 stopped)")
    submit.add_argument("--pip", action=argparse.BooleanOptionalAction, default=True,
                        help="add the project's requirements (all but Ray) to the job's runtime_env; --no-pip when "
                             "the cluster's image already has them (default: --pip)")
    submit.add_argument("--forward-env", metavar="NAMES", default="",
                        help="comma-separated environment variables whose values the job gets (e.g. HF_TOKEN) "
                             "without showing them in its command or job record; your MLflow login "
                             "(MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN, or a tracking URI's user:password@) is "
                             "forwarded this way without being named")
    submit.add_argument("job", nargs=argparse.REMAINDER, metavar="COMMAND", help="the nmt command, after --")
