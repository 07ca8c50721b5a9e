"""A sweep's Tune state on shared storage: a resume unpickles only what its owner wrote; people never share a path."""

import hashlib
import json
import pickle

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
