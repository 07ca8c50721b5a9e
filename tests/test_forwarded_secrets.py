"""Forwarded variables (`nmt submit --forward-env`, the MLflow login, a sweep's key) leave nothing to guess in the
job record and nothing behind on the nodes: the package that carries them is salted, and deleted when the job's
command ends. tests/test_submit.py runs such jobs on a real one-node cluster and searches what it keeps."""

from __future__ import annotations

import os
import subprocess
import sys

from small import ROOT

from pipeline.launch import job_env


def _ray_uri(package) -> str:
    """The name Ray gives the package (in the job record's runtime_env py_modules): a hash of its files."""
    from ray._private.runtime_env.packaging import get_uri_for_directory

    return get_uri_for_directory(str(package), include_gitignore=True)


def test_forwarded_secrets_job_record_names_the_package_by_a_salted_hash(tmp_path):
    variables = {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "summer2024"}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = job_env.write_package(variables, tmp_path / "one")
    second = job_env.write_package(variables, tmp_path / "two")
    # What someone who lists jobs can compute offline for a guessed password: the package with only the values.
    guess = tmp_path / "guess" / job_env.PACKAGE
    guess.mkdir(parents=True)
    for name in (job_env.VARIABLES_FILE, "__init__.py"):
        (guess / name).write_bytes((first / name).read_bytes())
    assert len({_ray_uri(first), _ray_uri(second), _ray_uri(guess)}) == 3


def test_forwarded_secrets_are_deleted_from_the_node_when_the_jobs_command_ends(tmp_path):
    """The job's `nmt` (its driver) deletes its node's unpacked copy when the command ends, ok or not."""
    for number, args in enumerate((["config", "--keys"], ["train", "--set", "train.epochz=1"])):  # works, fails
        (tmp_path / str(number)).mkdir()
        package = job_env.write_package({"NMT_FORWARDED_PROBE": "value-42"}, tmp_path / str(number))
        env = {name: value for name, value in os.environ.items() if not name.startswith(("RAY_", "MLFLOW_"))}
        env["PYTHONPATH"] = f"{package.parent}{os.pathsep}{ROOT}"  # as Ray puts a job's py_modules there
        result = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                                cwd=ROOT, timeout=120)
        assert result.returncode == (0 if args[0] == "config" else 2), result.stderr[-2000:]
        assert not package.exists(), args
    # Outside a job there is nothing to delete, and nothing else is touched.
    keep = tmp_path / "elsewhere" / job_env.PACKAGE
    keep.mkdir(parents=True)
    job_env.forget()
    assert keep.exists() and job_env.delete_unpacked() is False
