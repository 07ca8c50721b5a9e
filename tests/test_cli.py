"""The `nmt` command line itself: --version, help that explains each subcommand, `nmt config`."""

import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli import HANDLERS, main
from pipeline.config import load_config
from pipeline.parser import build_parser


def test_the_command_ends_after_its_threads_and_exit_handlers_without_the_interpreters_teardown():
    """`nmt` (cli.run) keeps main()'s exit status, waits for threads and runs the exit handlers as CPython's exit
    does, then ends: an object that only the teardown of the modules would free is never freed."""
    script = """
import atexit, sys, threading, time
from pipeline.cli import run
class FreedAtTeardown:
    def __del__(self):
        print("module teardown", flush=True)
kept = FreedAtTeardown()  # a module global: only the interpreter's teardown frees it
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
atexit.register(print, "exit handler ran")
sys.argv = ["nmt", "config", "--config", "configs/demo.yaml", "--set", "train.epochs=oops"]
run()
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "train.epochs must be of type int" in result.stderr, result.stderr
    assert result.stdout.splitlines() == ["thread finished", "exit handler ran"], result.stdout


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == "nmt 0.1.0"


@pytest.mark.parametrize("command", sorted(HANDLERS))
def test_every_subcommand_help_has_a_summary_and_examples_that_parse(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]
    assert description.strip() and not description.startswith(("positional", "options")), text
    examples = [line.strip() for line in text.split("examples:\n", 1)[1].splitlines() if line.strip()]
    assert examples and all(example.startswith("nmt ") or "| nmt " in example for example in examples), text
    for example in examples:
        (nmt,) = [part for part in example.split(" | ") if part.startswith("nmt ")]  # the shell around it aside
        words = shlex.split(nmt.split(" > ")[0])
        args = build_parser().parse_args(words[1:])  # an example that does not parse exits here
        assert args.command == command


def test_config_prints_the_resolved_tree_with_passwords_redacted_and_starts_nothing(capsys):
    argv = ["--config", "configs/demo.yaml", "--set", "train.epochs=3",
            "--set", "tracking.tracking_uri=http://trainer:s3cret@127.0.0.1:5000"]
    assert main(["config", *argv]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# nmt config: defaults < configs/demo.yaml < --set\n") and "s3cret" not in out
    printed = yaml.safe_load(out)
    expected = load_config("configs/demo.yaml", argv[3::2]).to_dict()
    expected["tracking"]["tracking_uri"] = "http://trainer:***@127.0.0.1:5000"
    assert printed == expected


def test_config_with_a_wrong_key_is_one_line_with_a_suggestion(capsys):
    assert main(["config", "--set", "train.epochz=3"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("nmt config: error: --set train.epochz=3: unknown key 'train.epochz'; "
                           "did you mean 'train.epochs'?")


def test_config_keys_lists_every_key_once_with_type_default_and_meaning(capsys):
    assert main(["config", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("  ")]
    assert sorted(listed) == sorted(load_config().flat())
    warmup = next(line for line in lines if line.startswith("  train.warmup_steps "))
    assert warmup.startswith("  train.warmup_steps (int, default 4000): ") and len(warmup) > 50


def test_worker_output_is_tidied_and_library_notices_and_false_alarms_stay_out(monkeypatch, capsys):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from pipeline.common import cluster, log

    printed = []
    monkeypatch.setattr(dispatcher, "handlers", [("ray_print_logs", printed.append), ("other", lambda data: None)])
    cluster._tidy_worker_output()
    cluster._tidy_worker_output()  # a second connection in the same process wraps nothing twice
    batch = {"pid": 7, "is_err": True, "lines": [
        "[2026-12-02 13:51:42,566 E 23727 23759] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher'",
        "[rank 0] a user's line keeps its prefix",
        "a user's own line mentioning core_worker.cc:2465: stays"]}
    dispatcher.emit(batch)
    dispatcher.emit({**batch, "lines": ["[2026-12-02 13:51:43,001 W 1 2] raylet_client.cc:40: only Ray's"]})
    dispatcher.emit({**batch, "actor_name": "PlacementGroupCleaner", "lines": ["Detected that the Ray Train ..."]})
    # A worker Tune stops mid-step dumps its stack: from Ray's announcement on, its lines stay in its log file.
    dispatcher.emit({**batch, "pid": 8, "lines": ["[train] step 200/300 loss 3.2",
                                                  "[2026-12-02 17:18:29,574 E 8 9] logging.cc:125: Stack trace: "]})
    dispatcher.emit({**batch, "pid": 8, "lines": [" /x/_raylet.so(+0x1812b9a) [0x7fe139a12b9a] ray::operator<<()",
                                                  "*** SIGABRT received at time=1796231909 on cpu 1 ***"]})
    assert capsys.readouterr().err == "[train] step 200/300 loss 3.2\n"
    dispatcher.emit({"pid": "raylet", "is_err": False, "lines": [
        "WARNING: 8 PYTHON worker processes have been started on node: 6bea with address: 192.0.2.2, which is 4x"]})
    assert printed == [{**batch, "lines": batch["lines"][1:]}]
    # The project's own "[stage] ..." lines print without Ray's "(RayTrainWorker pid=...)" prefix, in order.
    printed.clear()
    dispatcher.emit({**batch, "lines": ["[train] step 10/200 loss 7.1", "Traceback (most recent call last):"]})
    assert capsys.readouterr().err == "[train] step 10/200 loss 7.1\n"
    assert printed == [{**batch, "lines": ["Traceback (most recent call last):"]}]
    for name, value in log.QUIET.items():  # what configure_libraries sets is undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    for name in log.NOTICES:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    data_logger = logging.getLogger("ray.data.dataset")
    monkeypatch.setattr(data_logger, "filters", [])
    log.configure_libraries()
    log.configure_libraries()  # adds its filter once
    assert all(logging.getLogger(name).getEffectiveLevel() == logging.ERROR for name in log.NOTICES)
    assert len(data_logger.filters) == 1

    def record(message):
        return logging.LogRecord(data_logger.name, logging.WARNING, __file__, 1, message, None, None)

    assert not data_logger.filter(record("Warning: The Ray cluster currently does not have any available CPUs."))
    assert data_logger.filter(record("another warning"))



@pytest.mark.parametrize("verbosity", [0, 1])
def test_a_sigterm_exit_inside_a_finalizer_prints_no_traceback_in_a_worker_but_other_errors_do(verbosity):
    """What Ray does to a finished trial's actor: its SIGTERM handler raises SystemExit in whatever runs."""
    script = f"""
import os, signal, sys
from pipeline.common import log
log.setup(log.LEVELS[{verbosity}])
log.quiet_exit_in_finalizers()
log.quiet_exit_in_finalizers()  # installed once
signal.signal(signal.SIGTERM, lambda *args: sys.exit(1))
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the signal lands inside the finalizer
        for _ in range(1000):
            pass
class Broken:
    def __del__(self):
        raise ValueError("a finalizer's own error")
Finalized()
Broken()
print("went on")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout == "went on\n", done.stderr
    assert "ValueError: a finalizer's own error" in done.stderr
    assert ("SystemExit" in done.stderr) == (verbosity == 1), done.stderr  # `nmt -v` shows everything

def test_translating_shows_a_bar_on_a_terminal_and_progress_lines_elsewhere(monkeypatch, caplog):
    import io
    import logging
    import sys

    from pipeline.serve.commands import translate

    def engine(texts, beam):
        return [text.upper() for text in texts]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        assert translate(engine, ["a"] * 100, 1, batch_size=10, progress=True) == ["A"] * 100
        assert "[translate]" in terminal.getvalue() and "100/100" in terminal.getvalue() and not caplog.records
        monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file or a pipe: lines, no bar
        assert translate(engine, ["b"] * 100, 1, batch_size=10, progress=True) == ["B"] * 100
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["100/100 sentences"]


def test_demo_runs_its_sweep_on_the_cluster_given_like_train_and_tune(monkeypatch):
    """`nmt demo --address` reaches the sweep as `nmt tune --address` does; without it, RAY_ADDRESS or a local Ray."""
    from pipeline.launch import demo

    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: calls.append(kwargs) or {})
    assert main(["demo", "--quick", "--address", "ray://head:10001", "--workdir", "/tmp/w"]) == 0
    assert main(["demo"]) == 0
    assert [(c["address"], c["quick"], c["workdir"]) for c in calls] == [("ray://head:10001", True, "/tmp/w"),
                                                                         (None, False, None)]


def test_a_dashboard_url_in_ray_address_is_a_line_saying_to_submit_or_unset_it(tmp_path):
    """The team guides export RAY_ADDRESS=http://...:8265 for `nmt submit`; a local command then says what to do.
    In a process of its own, as a command runs: one where a test started Ray already never reads RAY_ADDRESS."""
    from commands import nmt

    done = subprocess.run(nmt("prepare", "--config", "configs/demo.yaml", sets=[f"data.output_dir={tmp_path}/x"]),
                          capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=120,
                          env={**os.environ, "RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert done.returncode == 2, done.stderr
    err = done.stderr
    assert "RAY_ADDRESS is http://127.0.0.1:8265, a dashboard URL" in err and "env -u RAY_ADDRESS" in err, err
    assert "Traceback" not in err
