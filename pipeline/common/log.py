"""One `pipeline` logger tree: "[stage] message" lines on stderr, set up by `nmt -v/-q` and by each worker loop.

Modules log through `get(stage)` (a logger named `pipeline.<stage>`); nothing is printed until
`setup` adds the one handler, so importing the package configures nothing.
"""

from __future__ import annotations

import logging
import sys

from .compat import RAY_NOTICE_LOGGERS
from .environment import default_for_process
from .userinfo import redact

ROOT = "pipeline"
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}  # -q, default, -v


def get(stage: str) -> logging.Logger:
    """The logger of a stage; its lines read "[stage] message"."""
    return logging.getLogger(f"{ROOT}.{stage}")


class _Formatter(logging.Formatter):
    """"[stage] message", with "warning: " or "error: " before the message at those levels.

    Every URI's credentials hidden: a path or store may carry them, and a job's lines reach its logs on the cluster.
    """

    def format(self, record: logging.LogRecord) -> str:
        stage = record.name.removeprefix(f"{ROOT}.") if record.name != ROOT else "nmt"
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        text = f"[{stage}] {level}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return redact(text)


class _StderrHandler(logging.StreamHandler):
    """Writes to stderr as it is at each line (pytest and Ray swap sys.stderr), or to the process's own.

    Ray Train patches sys.stderr in workers to echo prints to the driver, which would show every
    line twice; the workers' handler writes to sys.__stderr__, which Ray forwards once.
    """

    def __init__(self, process_stderr: bool):
        super().__init__()
        self.process_stderr = process_stderr

    @property
    def stream(self):
        return sys.__stderr__ if self.process_stderr else sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns one; the property decides
        pass


def setup(level: int = logging.INFO, process_stderr: bool = False) -> None:
    """Send the pipeline's lines to stderr at `level` (once per process; later calls only set the level)."""
    root = logging.getLogger(ROOT)
    root.setLevel(level)
    root.propagate = False  # a host application's handlers would print each line again
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler(process_stderr)
        handler.setFormatter(_Formatter())
        root.addHandler(handler)


def quiet_exit_in_finalizers() -> None:
    """In a Ray worker: an exit Ray raises inside a finalizer prints no "Exception ignored in" traceback.

    Ray turns the SIGTERM that ends a finished trial's actor into SystemExit in whatever code runs at
    that moment; in a finalizer (a WeakSet callback, a __del__) Python cannot raise it and prints it
    instead, under the worker's "(run_trial pid=...)" prefix. Other exceptions there still print, and
    with `nmt -v` this one too.
    """
    if verbose() or getattr(sys.unraisablehook, "quiet_exit", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not issubclass(unraisable.exc_type, SystemExit):
            previous(unraisable)

    hook.quiet_exit = True
    sys.unraisablehook = hook


# Read when each library starts (so set before importing Ray or MLflow); Ray workers of a local
# instance inherit them. Set unless `nmt -v`.
QUIET = {
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # no "Creating initial MLflow database tables", "Validating input example"
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # "View run ... at: URL" on stdout, where results go
    "RAY_AIR_NEW_OUTPUT": "0",  # Tune's legacy reporter, silent at verbose=0 (the new one still prints a box)
    "RAY_DEDUP_LOGS": "0",  # dedup folds concurrent trials' progress lines into "[repeated 3x across cluster]"
}
# Library warnings that are notices, not problems, silenced unless `nmt -v`.
NOTICES = RAY_NOTICE_LOGGERS

# Warnings that are false alarms in this pipeline, dropped by message unless `nmt -v`.
FALSE_ALARMS = {
    # "... does not have any available CPUs. The Dataset job will hang": ray.data.from_arrow's own
    # metadata tasks hold the CPUs at the moment the check runs (prepare of an in-memory corpus).
    "ray.data.dataset": "does not have any available CPUs",
}


class _DropMessage(logging.Filter):
    """Drops the records whose message contains a text."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def configure_libraries() -> None:
    """Ray's and MLflow's output as a command wants it: colour on a terminal only, their chatter with `-v` only."""
    if not sys.stderr.isatty():  # the "(worker pid=...)" prefixes of forwarded lines
        default_for_process({"RAY_COLOR_PREFIX": "0"})
    if not verbose():
        default_for_process(QUIET)
        for name in NOTICES:
            logging.getLogger(name).setLevel(logging.ERROR)
        for name, text in FALSE_ALARMS.items():
            if not any(isinstance(f, _DropMessage) and f.text == text for f in logging.getLogger(name).filters):
                logging.getLogger(name).addFilter(_DropMessage(text))


def level() -> int:
    """The pipeline's current level, for passing on to worker processes."""
    return logging.getLogger(ROOT).getEffectiveLevel()


def verbose() -> bool:
    """Whether `nmt -v` asked for everything, the libraries' own INFO lines and tables included."""
    return level() <= logging.DEBUG
