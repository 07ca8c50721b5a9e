"""The `nmt` command line: one subcommand per pipeline stage, user mistakes without tracebacks."""

from __future__ import annotations

import argparse
import os
import sys

from .common import compat, log
from .common.errors import UserError
from .launch import job_env
from .parser import build_parser


def _load(args: argparse.Namespace):
    from .config import load_config

    return load_config(args.config, args.overrides)


def _model_uri(args: argparse.Namespace, cfg) -> str:
    """--model, else the champion of tracking.registered_model."""
    from .track.registry import champion_uri

    return args.model or champion_uri(cfg.tracking.registered_model)


def _mlflow_run_id() -> str | None:
    """The run `mlflow run` made for this command (MLFLOW_RUN_ID), which becomes the command's run."""
    import os

    return os.environ.get("MLFLOW_RUN_ID") or None


def _cmd_prepare(args: argparse.Namespace) -> int:
    from .data.prepare import prepare

    manifest = prepare(_load(args).data, address=args.address, force=args.force)
    print(manifest.summary())
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .train.driver import train

    outcome = train(_load(args), address=args.address, config_file=args.config, adopt_run_id=_mlflow_run_id())
    metrics = outcome.metrics
    print(f"run {outcome.run_name}: best val_bleu {metrics.get('val_bleu', float('nan')):.2f} "
          f"(step {metrics.get('step', '?')}); MLflow run {outcome.run_id}; checkpoint {outcome.checkpoint_path}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from .tune.summary import format_trials
    from .tune.sweep import sweep

    outcome = sweep(_load(args), args.space, address=args.address, resume=args.resume, config_file=args.config,
                    adopt_run_id=_mlflow_run_id())
    print(format_trials(outcome))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .launch.demo import run_demo

    run_demo(quick=args.quick, workdir=args.workdir, overrides=args.overrides, address=args.address)
    sys.stdout.flush()
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from .track.login import redacted

    if args.keys:
        from .config_keys import sections, yaml_value

        for section in sections():
            print(f"{section.name}: {section.doc}")
            for key in section.keys:
                print(f"  {key.name} ({key.type}, default {yaml_value(key.default)}): {key.described()}")
        return 0
    cfg = _load(args)
    sources = " < ".join(["defaults", *([args.config] if args.config else []), *(["--set"] if args.overrides else [])])
    print(f"# nmt config: {sources}")
    print(yaml.safe_dump(redacted(cfg.to_dict()), sort_keys=False), end="")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from .serve.commands import evaluate

    if bool(args.split) == bool(args.src or args.ref):
        raise UserError("give either --split NAME or both --src FILE and --ref FILE")
    if not args.split and not (args.src and args.ref):
        raise UserError("--src and --ref go together: the source file and its reference translations")
    cfg = _load(args)
    scores = evaluate(cfg.tracking.tracking_uri, cfg.tracking.experiment, _model_uri(args, cfg), args.beam,
                      src_file=args.src, ref_file=args.ref, split=args.split, data_dir=args.data,
                      device=args.device, engine=args.engine)
    print(f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})")
    print(f"BLEU lowercased, tokenized {scores['bleu_lc']:.2f}  ({scores['bleu_lc_signature']})")
    print(f"{scores['sentences']} sentences; MLflow evaluation run {scores['run_id']}")
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from .common.devices import resolve_device
    from .data.textfiles import read_lines
    from .serve.commands import load_engine, translate
    from .track.target import connect

    texts = list(args.text)
    if args.input:
        texts += read_lines(Path(args.input))
    from_stdin = not texts and not sys.stdin.isatty()
    if from_stdin:
        texts = [line.rstrip("\n") for line in sys.stdin]
    if not texts:
        raise UserError("nothing to translate: give sentences as arguments, --input FILE, or lines on stdin")
    device = str(resolve_device(args.device))
    cfg = _load(args)
    uri = connect(cfg.tracking.tracking_uri).uri
    with tempfile.TemporaryDirectory() as workdir:
        engine = load_engine(uri, _model_uri(args, cfg), args.engine, device, workdir).translate
        for line in translate(engine, texts, args.beam, progress=bool(args.input) or from_stdin):  # on stderr
            print(line)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .serve.commands import export

    cfg = _load(args)
    directory, version = export(cfg.tracking.tracking_uri, _model_uri(args, cfg), args.out, args.quantization)
    attached = f"; attached to {version.name} version {version.version}" if version is not None else ""
    print(f"CTranslate2 model ({args.quantization}) in {directory}{attached}")
    return 0


def _cmd_promote(args: argparse.Namespace) -> int:
    from .track import registry
    from .track.target import connect

    cfg = _load(args)
    target = connect(cfg.tracking.tracking_uri)
    name = args.name or cfg.tracking.registered_model
    with registry.refused_as_user_error(target.uri, f"promoting {name}", target.username):
        if args.version is not None:
            from .track import champion

            champion.promote(target.uri, name, args.version)
            print(f"{name} version {args.version} is now @{champion.CHAMPION}")
            return 0
        return _promote_candidates(target, cfg, name, args)


def _promote_candidates(target, cfg, name: str, args: argparse.Namespace) -> int:
    """Score and register the candidates (the promoter's own check), then decide the champion."""
    from .data.prepare import prepared_path
    from .serve.promote import promote_candidates
    from .track import champion

    data = args.data or prepared_path(cfg.data)[0]
    for verdict in promote_candidates(target, name, data, cfg.tracking.experiment, args.device):
        print(verdict.line(name))
    decision = champion.decide(target.uri, name)
    if decision.version is None:
        raise UserError(f"registered model {name!r} has no version with a val_bleu to decide on")
    print(f"{name} version {decision.version} (val_bleu {decision.val_bleu:.2f}) is @{champion.CHAMPION}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from .config import set_value
    from .serve.lifecycle import run

    cfg = _load(args)
    for key, value in (("model_uri", args.model), ("port", args.port), ("host", args.host), ("engine", args.engine)):
        if value is not None:
            set_value(cfg, f"serve.{key}", value, where=f"--{key.split('_')[0]}")
    return run(cfg, address=args.address)


def _cmd_submit(args: argparse.Namespace) -> int:
    from .launch.submit import submit

    names = [name.strip() for name in args.forward_env.split(",") if name.strip()]
    return submit(args.job, address=args.address, follow=args.follow, pip=args.pip, forward_env=names)


HANDLERS = {"prepare": _cmd_prepare, "train": _cmd_train, "tune": _cmd_tune, "demo": _cmd_demo, "config": _cmd_config,
            "evaluate": _cmd_evaluate, "translate": _cmd_translate, "export": _cmd_export, "promote": _cmd_promote,
            "serve": _cmd_serve, "submit": _cmd_submit}


def run() -> None:
    """The `nmt` command (and `python -m pipeline`): main(), then the interpreter's exit without its teardown."""
    try:
        code = main()
    finally:  # in a submitted job: its forwarded variables off the nodes it ran on, while Ray is still connected
        job_env.forget()
    steps = compat.interpreter_exit_steps()
    if steps is None:  # not CPython: the usual exit
        sys.exit(code)
    wait_for_threads, exit_handlers = steps
    # CPython's exit waits for threads, runs the exit handlers (MLflow's, logging's, temporary files'), then
    # frees every module of torch, Ray and MLflow object by object: 2.6-2.8 s after a short `nmt train` has
    # printed its last line, against 0.3 s this way (benchmarks/cli_exit.py). The first two steps happen here;
    # the last is what os._exit skips, as multiprocessing's children do. Ray's own exit handler would first
    # wait 0.5 s for late worker lines: the command's lines have all arrived by now, so Ray is disconnected
    # directly.
    if "ray" in sys.modules:
        import ray

        ray.shutdown()
    wait_for_threads()
    exit_handlers()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """The `nmt` command's work; returns the exit status (run() is the process's entry point)."""
    job_env.apply()  # in a job from `nmt submit --forward-env`: its variables, before anything reads them
    args = build_parser().parse_args(argv)
    log.setup(log.LEVELS[args.verbosity])
    log.configure_libraries()
    try:
        return HANDLERS[args.command](args)
    except UserError as err:
        print(f"nmt {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = {"train": "; the same command again resumes from the last checkpoint",
                "tune": "; the same command with --resume continues the sweep"}.get(args.command, "")
        print(f"nmt {args.command}: interrupted{hint}", file=sys.stderr)
        return 130
