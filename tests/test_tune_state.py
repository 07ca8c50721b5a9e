"""A sweep's Tune state on shared storage: a resume unpickles only what its owner wrote; people never share a path."""

import hashlib
import json
import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from small import ROOT

from pipeline.cli import main
from pipeline.common.errors import UserError
from pipeline.config import load_config
from pipeline.track import provenance
from pipeline.train.driver import default_run_name
from pipeline.tune import state_seal
from pipeline.tune.sweep import default_sweep_name


class Planted:
    """What another person's job leaves in the sweep's directory: a pickle that runs code when it is loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


@pytest.fixture
def my_key(tmp_path, monkeypatch):
    """This person's key file, in a config directory of the test's own."""
    monkeypatch.delenv(state_seal.KEY_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return state_seal.state_key()


def _seal(directory, files, key):
    files = {name: [hashlib.sha256(data).hexdigest()] for name, data in files.items()}
    (directory / state_seal.SEAL_NAME).write_text(json.dumps({"files": files, "mac": state_seal._mac(key, files)}))


def _resume(tmp_path, name="shared-sweep"):
    (tmp_path / "space.yaml").write_text("train.lr_scale: {choice: [1.0, 2.0]}\n")
    return main(["tune", "--config", str(ROOT / "configs" / "demo.yaml"), "--space", str(tmp_path / "space.yaml"),
                 "--resume", "--set", f"train.storage_path={tmp_path / 'runs'}", "--set", f"tune.name={name}",
                 "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])


@pytest.mark.parametrize("seal", ["none", "another key", "mine, before the swap"])
def test_resume_state_planted_by_someone_else_is_refused_and_never_runs(tmp_path, my_key, capsys, seal):
    sweep_dir = tmp_path / "runs" / "shared-sweep"
    sweep_dir.mkdir(parents=True)
    marker = tmp_path / "marker"
    planted = pickle.dumps(Planted(marker))
    if seal == "another key":  # the planter signs with a key of their own
        _seal(sweep_dir, {"tuner.pkl": planted}, b"k" * 32)
    elif seal == "mine, before the swap":  # my sweep, its tuner.pkl replaced after I sealed it
        _seal(sweep_dir, {"tuner.pkl": pickle.dumps({"mine": True})}, my_key)
    (sweep_dir / "tuner.pkl").write_bytes(planted)
    assert _resume(tmp_path) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "refusing" in err and "Traceback" not in err, err
    assert not marker.exists()  # the pickle never ran
    assert not (tmp_path / "mlflow.db").exists()  # refused before any work


def test_resume_state_is_read_back_only_as_its_writer_sealed_it(tmp_path, my_key):
    directory = str(tmp_path / "sweep")
    fs, inner_dir = state_seal.sealed_filesystem(directory, resume=False)
    fs.create_dir(inner_dir)
    for name, data in (("tuner.pkl", b"one"), ("experiment_state-1.json", b"{}"), ("tuner.pkl", b"two")):
        with fs.open_output_stream(f"{inner_dir}/{name}") as out:  # as Tune writes it
            out.write(data)
    fs.create_dir(f"{inner_dir}/trial_1")
    with fs.open_output_stream(f"{inner_dir}/trial_1/result.json") as out:  # below the directory: not state
        out.write(b"{}")
    fs, _ = state_seal.sealed_filesystem(directory, resume=True)
    assert fs.open_input_file(f"{inner_dir}/tuner.pkl").readall() == b"two"
    # Swapped after the check (between it and Tune's read): the read itself is refused.
    pafs.LocalFileSystem().open_output_stream(f"{inner_dir}/experiment_state-1.json").write(b'{"x": 1}')
    with pytest.raises(UserError, match="was not written by this sweep's owner"):
        fs.open_input_stream(f"{inner_dir}/experiment_state-1.json").read()
    with pytest.raises(UserError, match="experiment_state-1.json was not written"):
        state_seal.sealed_filesystem(directory, resume=True)
    # A trial's actor gets the filesystem without the key: it can neither seal nor read state.
    unpickled = pickle.loads(pickle.dumps(fs))
    assert unpickled.open_input_file(f"{inner_dir}/trial_1/result.json").readall() == b"{}"
    with pytest.raises(UserError):
        unpickled.open_input_file(f"{inner_dir}/tuner.pkl").readall()


def test_resume_state_key_is_private_or_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(state_seal.KEY_VARIABLE, raising=False)
    key = state_seal.state_key()
    path = state_seal.key_file()
    assert path.stat().st_mode & 0o777 == 0o600 and state_seal.state_key() == key
    path.chmod(0o644)
    with pytest.raises(UserError, match="chmod 600"):
        state_seal.state_key()
    monkeypatch.setenv(state_seal.KEY_VARIABLE, "short")
    with pytest.raises(UserError, match="at least 32"):
        state_seal.state_key()
    monkeypatch.setenv(state_seal.KEY_VARIABLE, "x" * 40)  # a job's key, forwarded by nmt submit
    assert state_seal.state_key() != key


def test_resume_state_default_names_differ_per_person(monkeypatch):
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    names = {}
    for user in ("alice", "bob"):  # one login per person on a team's server
        names[user] = (default_sweep_name(cfg, "space", user), default_run_name(cfg, user))
    assert names["alice"] != names["bob"]
    assert all("alice" in name for name in names["alice"]) and all("bob" in name for name in names["bob"])
    assert "/" not in default_sweep_name(cfg, "space", "eve/../x y") and " " not in default_run_name(cfg, "e v")
    # Without a login (a local store): the person who submitted the job, else this process's user.
    monkeypatch.setenv(provenance.SUBMITTED_BY, "carol@laptop")
    provenance.current.cache_clear()
    try:
        assert "carol" in default_run_name(cfg) and "carol" in default_sweep_name(cfg, "space")
    finally:
        provenance.current.cache_clear()


# ---- whose key seals a sweep on a cluster ----

def _submitted(command: list[str], key: str, monkeypatch) -> list[str]:
    """The job `nmt submit` plans for command on a machine with this key, its environment set up as the job's
    (env_vars and the forwarded variables, nothing else of this machine); returns the job's nmt arguments."""
    import shlex

    from pipeline.launch.submit import plan

    monkeypatch.setenv(state_seal.KEY_VARIABLE, key)
    job = plan(command, "http://127.0.0.1:8265", pip=False)
    monkeypatch.delenv(state_seal.KEY_VARIABLE)
    for name, value in {**job.runtime_env["env_vars"], **job.secrets}.items():
        monkeypatch.setenv(name, value)
    provenance.current.cache_clear()
    return shlex.split(job.entrypoint)[3:]  # after `python -m pipeline`


def test_sweep_key_in_a_job_never_comes_from_the_shared_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "shared-home"))  # the home every job on a cluster shares
    monkeypatch.delenv(state_seal.KEY_VARIABLE, raising=False)
    state_seal.state_key()  # the first sweep ever made one there: every later sweep, anyone's, would use it
    for marker in (provenance.SUBMITTED_BY, "RAY_JOB_CONFIG_JSON_ENV_VAR"):  # nmt submit's job, any Ray job's driver
        monkeypatch.setenv(marker, "x")
        with pytest.raises(UserError) as refused:
            state_seal.state_key()
        message = str(refused.value)
        assert "nmt submit" in message and f"--forward-env {state_seal.KEY_VARIABLE}" in message, message
        monkeypatch.delenv(marker)
    # The command in a job without a key: one line, exit status 2, before anything starts.
    monkeypatch.setenv(provenance.SUBMITTED_BY, "alice@laptop")
    (tmp_path / "space.yaml").write_text("train.lr_scale: {choice: [1.0, 2.0]}\n")
    code = main(["tune", "--config", str(ROOT / "configs" / "demo.yaml"), "--space", str(tmp_path / "space.yaml"),
                 "--set", f"train.storage_path={tmp_path / 'runs'}",
                 "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no sweep key in this job" in err, err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_sweep_key_is_the_submitters_sent_apart_from_the_command(tmp_path, monkeypatch, capsys):
    """`nmt submit` of a sweep sends the key of the machine it runs on, automatically, and never shows it."""
    from pipeline.launch import submit

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "laptop-config"))
    monkeypatch.delenv(state_seal.KEY_VARIABLE, raising=False)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    sweep = ["tune", "--config", "configs/demo.yaml", "--space", "tune_spaces/demo.yaml"]
    state_seal.state_key()  # made here on first use, 0600
    mine = state_seal.key_file().read_text().strip()
    for command in (sweep, [*sweep, "--resume"], ["demo", "--quick"]):
        job = submit.plan(command, "http://127.0.0.1:8265", pip=False)
        assert job.secrets[state_seal.KEY_VARIABLE] == mine, command
        shown = job.entrypoint + json.dumps(job.runtime_env) + repr(job)
        assert mine not in shown and state_seal.KEY_VARIABLE not in shown
    assert state_seal.KEY_VARIABLE not in submit.plan(["train"], "http://127.0.0.1:8265", pip=False).secrets
    monkeypatch.setenv(state_seal.KEY_VARIABLE, "k" * 40)  # a key of one's own in the variable wins
    assert submit.plan(sweep, "http://127.0.0.1:8265", pip=False).secrets[state_seal.KEY_VARIABLE] == "k" * 40
    monkeypatch.delenv(state_seal.KEY_VARIABLE)

    sent = {}

    class Jobs:
        def submit_job(self, **request):
            package = Path(request["runtime_env"]["py_modules"][0])  # uploaded by Ray from here
            sent.update(request, variables=json.loads((package / "variables.json").read_text()))
            return "raysubmit_1"

    monkeypatch.setattr(submit, "check_listening", lambda address: None)
    monkeypatch.setattr(submit, "cluster_is_remote", lambda address: False)
    monkeypatch.setattr(submit, "client", lambda address: Jobs())
    assert submit.submit(sweep, "http://127.0.0.1:8265", pip=False) == 0
    out, err = capsys.readouterr()
    assert sent["variables"][state_seal.KEY_VARIABLE] == mine
    assert mine not in json.dumps({k: v for k, v in sent.items() if k != "variables"}) + out + err
    assert "sealed with your key" in err and "--resume must come from you, with the same key" in err, err
    from pipeline.launch import job_env

    assert state_seal.KEY_VARIABLE in job_env.DRIVER_ONLY  # set in the job's driver, in none of its workers


def test_sweep_key_of_another_person_cannot_resume_the_sweep(tmp_path, monkeypatch, capsys):
    """Alice's sweep, sealed in her job with her key, refuses Bob's resume (his job has his key) before unpickling."""
    monkeypatch.chdir(ROOT)
    alice, bob = "a" * 64, "b" * 64
    command = ["tune", "--config", "configs/demo.yaml", "--space", "tune_spaces/demo.yaml",
               "--set", f"train.storage_path={tmp_path / 'runs'}", "--set", "tune.name=shared-name",
               "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    try:
        _submitted(command, alice, monkeypatch)  # Alice's sweep: its job seals what Tune writes
        fs, directory = state_seal.sealed_filesystem(str(tmp_path / "runs" / "shared-name"), resume=False)
        fs.create_dir(directory)
        with fs.open_output_stream(f"{directory}/tuner.pkl") as out:
            out.write(pickle.dumps({"alice's": "sweep"}))
        _submitted([*command, "--resume"], alice, monkeypatch)
        state_seal.sealed_filesystem(str(tmp_path / "runs" / "shared-name"), resume=True)  # hers: resumes
        bobs_job = _submitted([*command, "--resume"], bob, monkeypatch)
        with pytest.raises(UserError, match="not signed with your key.*key of the person who started it"):
            state_seal.sealed_filesystem(str(tmp_path / "runs" / "shared-name"), resume=True)
        assert main(bobs_job) == 2  # the command in Bob's job: one line, nothing started
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "not signed with your key" in err, err
        assert not (tmp_path / "mlflow.db").exists()
    finally:
        provenance.current.cache_clear()
