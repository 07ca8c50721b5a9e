"""`nmt submit`: run an `nmt` command as a Ray Job on a cluster, through the Ray Jobs API.

The job gets the project directory as its working_dir (data, runs, stores and caches left out),
the MLflow tracking URI and the storage paths spelled out, so the job writes where the user
looks; with --follow the logs stream here and the exit status mirrors the job's final status.
Whether the cluster sees this machine's files is asked of the cluster, not guessed from the
address: through a tunnel every cluster is at 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from ..common import log, storage
from ..common.errors import UserError
from ..common.userinfo import SCHEME, redact, secret_in, strings
from ..track import provenance
from ..track.login import credential_home
from ..track.target import configured_uri, resolve
from ..tune import state_seal
from . import job_env
from .dashboard import LOCAL_HOSTS, check_listening, client, cluster_address, cluster_errors, cluster_is_remote

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# What the job does not need: the virtualenv, prepared data, runs, local MLflow stores, caches.
# Anchored at the project root (gitignore syntax); Ray also honours .gitignore.
EXCLUDES = [
    "/.venv/", "/data/", "/runs/", "/mlruns/", "/mlartifacts/", "/mlflow.db", "/benchmarks/.multi30k*",
    "/test-artifacts/", "/.git/", "__pycache__/", "*.egg-info/", ".pytest_cache/", ".ruff_cache/",
]
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 130}
TERMINAL = set(EXIT_CODES)
LOST_AFTER_S = 60.0  # a job's status unanswered this long while following it: the cluster is gone, not slow
logger = log.get("submit")
NOT_AS_JOBS = {
    "submit": "a job cannot submit jobs",
    "serve": "deploy the service with `serve deploy deploy/serve_config.yaml` instead (see deploy/README.md)",
}
# The settings each command reads or writes on the cluster, checked when the cluster does not see this machine.
PATH_KEYS = {"prepare": ("data.path", "data.output_dir"),
             "train": ("data.path", "data.output_dir", "train.storage_path", "tracking.tracking_uri"),
             "tune": ("data.path", "data.output_dir", "train.storage_path", "tracking.tracking_uri"),
             "demo": ("data.output_dir", "train.storage_path", "tracking.tracking_uri")}
SWEEPS = {"tune", "demo"}  # commands that seal a sweep's state with the submitter's key (tune/state_seal.py)


@dataclass
class Job:
    """What is submitted: the entrypoint, its runtime_env, and warnings about paths the cluster may not see."""

    entrypoint: str
    runtime_env: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # Forwarded variables (credentials): they reach the job through job_env, never through the fields above.
    secrets: dict[str, str] = field(default_factory=dict, repr=False)


def nmt_args(command: list[str]) -> list[str]:
    """The nmt arguments of `nmt submit -- [nmt | python -m pipeline] COMMAND ...`."""
    args = list(command)
    if args[:1] == ["--"]:
        args = args[1:]
    if args[:1] == ["nmt"]:
        args = args[1:]
    elif len(args) >= 3 and Path(args[0]).name.startswith("python") and args[1:3] == ["-m", "pipeline"]:
        args = args[3:]
    if not args:
        raise UserError("nothing to submit: give the nmt command after --, e.g. nmt submit -- train --config "
                        "configs/demo.yaml")
    if args[0] in NOT_AS_JOBS:
        raise UserError(f"`nmt {args[0]}` does not run as a job: {NOT_AS_JOBS[args[0]]}")
    return args


def forwarded(names: list[str]) -> dict[str, str]:
    """The values of the variables named for --forward-env, each of which must be set here."""
    secrets = {}
    for name in names:
        if not job_env.NAME.fullmatch(name):
            raise UserError(f"--forward-env: {name!r} is not an environment variable name")
        if name not in os.environ:
            raise UserError(f"--forward-env: {name} is not set here; export it first (its value is never shown)")
        secrets[name] = os.environ[name]
    return secrets


def plan(command: list[str], address: str, pip: bool = True, forward_env: list[str] = (),
         remote: bool | None = None) -> Job:
    """Check the nmt command here, then build its entrypoint and runtime_env (no network).

    remote: whether the cluster's nodes do not see this machine's files (submit asks the cluster);
    then a local store or path the command uses is an error. None: unknown, judged by the address's
    host, and only warned about.

    Credentials never enter the entrypoint or the runtime_env's env_vars (Ray shows both): the submitter's
    MLflow login (a tracking URI's user:password@, else MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN here) is
    forwarded like --forward-env names. So is a sweep's key (NMT_STATE_KEY here, else the key file here): the
    job seals the sweep's state with it, and only the same key resumes it. Who submits from which commit goes
    in the env_vars (no secret).
    """
    from ..parser import build_parser

    if not (PROJECT_ROOT / "pyproject.toml").is_file():
        raise UserError(f"nmt submit uploads the project checkout as the job's working_dir, but {PROJECT_ROOT} "
                        f"is not one (an installed copy?); run it from a clone installed with pip install -e")
    args = nmt_args(command)
    parsed = build_parser().parse_args(args)  # a bad command fails here, with argparse's message, exit 2
    warnings: list[str] = []
    env = {"PYTHONUNBUFFERED": "1", **provenance.job_variables()}
    secrets = forwarded(list(forward_env))
    known = remote is not None
    remote = remote if known else urlparse(address).hostname not in LOCAL_HOSTS
    if hasattr(parsed, "overrides"):
        for flag in ("--config", "--space"):
            args = _project_relative(args, flag)
        from ..config import load_config

        config_file = _value_of(args, "--config")
        cfg = load_config(PROJECT_ROOT / config_file if config_file else None, parsed.overrides)
        target = resolve(_tracking_uri(cfg.tracking.tracking_uri))
        uri = target.uri
        login = {name: value for name, value in target.login.variables().items() if value} if target.login else {}
        secrets = {**login, **secrets}  # variables named explicitly win over the login found here
        values = {key: value for key, value in strings(cfg.to_dict()) if key != "tracking.tracking_uri"}
        _refuse_credentials({"tracking.tracking_uri": uri, **values})  # an http(s) login is split off above
        runs, output = storage.absolute(cfg.train.storage_path), storage.absolute(cfg.data.output_dir)
        env["MLFLOW_TRACKING_URI"] = uri
        args = [*_without_set(args, "tracking.tracking_uri"), *_set("tracking.tracking_uri", uri),
                *_set("train.storage_path", runs), *_set("data.output_dir", output)]
        problems = _local_paths(cfg, uri, runs, output, PATH_KEYS.get(args[0], ("tracking.tracking_uri",)))
        if remote and problems and known:
            raise UserError(f"the cluster at {address} does not see this machine's files (its nodes' Ray sessions "
                            f"are not here), but {problems[0]}")
        if remote:
            warnings += problems
    if args[0] in SWEEPS:  # the submitter's key, read here: the cluster's home is every job's
        secrets.setdefault(state_seal.KEY_VARIABLE, state_seal.key_text())
    runtime_env: dict[str, Any] = {"working_dir": str(PROJECT_ROOT), "excludes": EXCLUDES, "env_vars": env}
    if pip:
        runtime_env["pip"] = {"packages": requirements(), "pip_check": False}
    _refuse_credentials({f"argument {i + 1}": arg for i, arg in enumerate(args)})
    entrypoint = "python -m pipeline " + shlex.join(args)
    for name, value in secrets.items():
        if value and value in entrypoint:
            raise UserError(f"the job's command line holds the value of {name}, and Ray shows a job's command to "
                            f"anyone who lists jobs: take it out of the arguments (the job gets it via --forward-env)")
    return Job(entrypoint, runtime_env, warnings, secrets)


def _refuse_credentials(values: dict[str, str]) -> None:
    """A UserError for the first value holding a URI with credentials: Ray shows a job's command and environment
    to anyone who lists jobs, and the pipeline would log and tag the path."""
    for where, value in values.items():
        for found in SCHEME.finditer(value):
            if secret_in(value[found.start():]):
                home, names = credential_home(value[found.start():])
                send = f", sent to the job with --forward-env {','.join(names)}" if names else " on every node"
                raise UserError(f"{where} ({redact(value)}) holds credentials in a URI, which anyone who lists the "
                                f"cluster's jobs would see: take them out of the URI and put them in {home}{send}")


def _local_paths(cfg, uri: str, runs: str, output: str, keys: tuple[str, ...]) -> list[str]:
    """What the command would read or write on this machine's disk instead of where every node reaches."""
    found = []
    if "tracking.tracking_uri" in keys and not uri.startswith(("http://", "https://", "databricks")):
        found.append(f"tracking.tracking_uri={uri} is a store on this machine: the job would write another one "
                     f"on the cluster; use an MLflow server the nodes reach (--set tracking.tracking_uri=http://...)")
    data = cfg.data
    if "data.path" in keys and data.path and data.source != "demo" and "://" not in data.path:
        found.append(f"data.path={data.path} is a directory on this machine: copy the corpus to object storage "
                     f"(e.g. aws s3 sync {data.path} s3://BUCKET/corpus) and --set data.path=s3://BUCKET/corpus")
    for key, path in (("train.storage_path", runs), ("data.output_dir", output)):
        if key in keys and "://" not in path:
            found.append(f"{key}={path} is a path on this machine: workers on other nodes could not read what "
                         f"others wrote; --set {key}=s3://BUCKET/... (or a volume every node mounts, given as "
                         f"file://PATH)")
    return found


def requirements() -> list[str]:
    """The project's dependencies without Ray: the job runs on the cluster's Ray, which must not be replaced.

    Ray builds the job's virtualenv on top of the node's site-packages, so requirements the image already
    satisfies (torch above all) are not downloaded again; the env is cached per node for later jobs.
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed package's metadata says the same
        from importlib import metadata

        deps = [r for r in metadata.requires("transformer-nmt") or [] if "extra ==" not in r]
    else:
        deps = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not d.replace("[", " ").replace(">", " ").replace("=", " ").split()[0] == "ray"]


def submit(command: list[str], address: str | None = None, follow: bool = False, pip: bool = True,
           forward_env: list[str] = ()) -> int:
    """Submit the command as a Ray Job; with follow, stream its logs and return its exit status."""
    address = cluster_address(address)
    plan(command, address, pip=pip, forward_env=forward_env, remote=False)  # the command's own mistakes first
    check_listening(address)
    with cluster_errors(address):
        remote = cluster_is_remote(address)
    job = plan(command, address, pip=pip, forward_env=forward_env, remote=remote)
    for warning in job.warnings:
        logger.warning(warning)
    with cluster_errors(address), tempfile.TemporaryDirectory(prefix="nmt-submit-") as tmp:
        runtime_env = dict(job.runtime_env)
        if job.secrets:  # uploaded with the submission; the temporary copy here goes right after
            runtime_env["py_modules"] = [str(job_env.write_package(job.secrets, Path(tmp)))]
            runtime_env["worker_process_setup_hook"] = job_env.SETUP_HOOK  # sets them in every worker of the job
            logger.info(f"forwarding {', '.join(sorted(job.secrets))} to the job (values not shown)")
        if state_seal.KEY_VARIABLE in job.secrets:
            logger.info(f"the sweep is sealed with your key ({state_seal.key_source()} here): a --resume must come "
                        f"from you, with the same key (nmt submit sends it again)")
        jobs = client(address)
        job_id = jobs.submit_job(entrypoint=job.entrypoint, runtime_env=runtime_env,
                                 metadata={"nmt_command": job.entrypoint[:500]})
    logger.info(f"job {job_id} submitted to {address}: {job.entrypoint}")
    if not follow:
        print(job_id)
        logger.info(f"follow it: ray job logs --address {address} --follow {job_id}\n"
                    f"status:    ray job status --address {address} {job_id}\n"
                    f"stop it:   ray job stop --address {address} {job_id}")
        return 0
    try:
        with cluster_errors(address):
            status, message = asyncio.run(_follow(jobs, job_id))
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the interrupted log stream was on
        logger.info(f"stopped following; job {job_id} keeps running (ray job stop --address {address} {job_id} "
                    "stops it)")
        return 130
    logger.info(f"job {job_id} {status}" + (f": {message}" if message and status != "SUCCEEDED" else ""))
    return EXIT_CODES.get(status, 1)


async def _follow(jobs, job_id: str) -> tuple[str, str]:
    """Print the job's logs as they come; then its final (status, message)."""
    try:
        async for lines in jobs.tail_job_logs(job_id):
            sys.stdout.write(lines)
            sys.stdout.flush()
    except RuntimeError as err:  # the log stream broke (head restarted, proxy timeout): wait for the status
        logger.warning(f"log stream ended early ({err}); waiting for the job to finish")
    unanswered_since = None
    while True:
        try:
            info = jobs.get_job_info(job_id)
        except (OSError, RuntimeError) as err:  # no answer (requests' errors are OSErrors), or not this job (404)
            if "status code 404" in str(err):  # an answer: a head that restarted without its job table
                raise UserError(f"the cluster no longer knows job {job_id}: its head restarted (a new head "
                                "starts with no jobs); `ray job list` shows what runs now, and a sweep goes on "
                                "with the same command and --resume") from None
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since > LOST_AFTER_S:
                raise UserError(f"the cluster has not answered about job {job_id} for {LOST_AFTER_S:.0f}s "
                                f"({str(err).splitlines()[0][:200]}): its head restarted, or the tunnel to its "
                                "dashboard closed; `ray job status` tells where the job stands, and a sweep goes on "
                                "with the same command and --resume") from None
            await asyncio.sleep(2.0)
            continue
        unanswered_since = None
        status = str(getattr(info.status, "value", info.status))
        if status in TERMINAL:
            return status, info.message or ""
        await asyncio.sleep(1.0)


def _project_relative(args: list[str], flag: str) -> list[str]:
    """args with the file after flag made relative to the project root, the job's working directory."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = _relative_file(out[i + 1], flag)
        elif arg.startswith(flag + "="):
            out[i] = f"{flag}={_relative_file(arg.split('=', 1)[1], flag)}"
    return out


def _relative_file(value: str, flag: str) -> str:
    for candidate in (Path(value), PROJECT_ROOT / value):
        if candidate.is_file():
            try:
                return str(candidate.resolve().relative_to(PROJECT_ROOT))
            except ValueError:
                raise UserError(f"{flag} {value} is outside the project directory {PROJECT_ROOT}, which is all "
                                f"the job receives: copy it into the project (e.g. configs/)") from None
    raise UserError(f"{flag} {value} does not exist (looked in {Path.cwd()} and {PROJECT_ROOT})")


def _value_of(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _tracking_uri(configured: str) -> str:
    """The store the job should log to: as `nmt` would resolve it here, with a relative SQLite path made absolute."""
    uri = configured_uri(configured)  # its login still in it: plan() forwards it apart
    if "://" not in uri:  # a bare directory: MLflow's file store
        uri = str(Path(uri).resolve())
    return uri


def _without_set(args: list[str], key: str) -> list[str]:
    """args without any `--set key=...` (the job gets its own, resolved and without credentials)."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--set" and i + 1 < len(args) and args[i + 1].startswith(f"{key}="):
            skip = True
        elif not arg.startswith(f"--set={key}="):
            out.append(arg)
    return out


def _set(key: str, value: str) -> list[str]:
    """A --set pair whose value reads back as the same string (quoted when YAML would read it otherwise)."""
    import json

    return ["--set", f"{key}={value}" if yaml.safe_load(value) == value else f"{key}={json.dumps(value)}"]

