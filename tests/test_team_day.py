"""The team's day, run from the guides' own text: an admin, two members and a promoter, from an empty AWS
account to a served champion, by the command blocks of deploy/aws/README.md and deploy/tracking-server.md.

Each person has a laptop of their own (a host, rehearsal/hosts.py) and a terminal there; each labelled block
of the two guides runs, as written, in the terminal of whoever its label and DAY below name, in DAY's order.
What stands in for AWS, Docker and the cluster launcher is the table STAND_INS of rehearsal/cloud.py; every
other command (nmt, ray, serve, curl, sed, python, mlflow) is the real one. A command changed in a guide is
what runs here; a block added to a guide and missing from DAY fails the test.

Needs root (network, mount and PID namespaces), iproute2, util-linux's `script` and PostgreSQL's server.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from rehearsal.cloud import STAND_INS, Cloud
from rehearsal.containers import restart_cluster
from rehearsal.guides import labelled_blocks
from rehearsal.shell import BlockFailed, Person
from small import ROOT

AWS = ROOT / "deploy" / "aws" / "README.md"
TRACKING = ROOT / "deploy" / "tracking-server.md"
# The day: (who, page, block), in order. The blocks between them are what each person does meanwhile.
DAY = [
    ("admin", AWS, "admin:account"), ("admin", AWS, "admin:images"), ("admin", AWS, "admin:database"),
    ("admin", AWS, "admin:server"), ("admin", AWS, "admin:forward"), ("admin", TRACKING, "admin:logins"),
    ("admin", AWS, "admin:serving-login"), ("admin", AWS, "admin:node-roles"), ("admin", AWS, "admin:cluster"),
    ("alice", AWS, "member:shell"), ("bob", AWS, "member:shell"), ("promoter", AWS, "member:shell"),
    ("alice", AWS, "member:train"),
    ("bob", AWS, "member:sweep"),  # the head restarts under it
    ("bob", AWS, "member:resume"),
    ("promoter", AWS, "promoter:promote"),
    ("alice", AWS, "member:evaluate"),
    ("admin", AWS, "admin:serve"),
]
PEOPLE = ("admin", "alice", "bob", "promoter")
MODEL = "transformer-nmt-demo-en-de"  # configs/cluster_check.yaml's registered model


def _required() -> None:
    missing = [tool for tool in ("ip", "script", "nsenter", "unshare", "setpriv") if shutil.which(tool) is None]
    reason = "needs root" if os.geteuid() != 0 else f"needs {', '.join(missing)}" if missing else ""
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the team's day {reason}")
        pytest.skip(f"the team's day {reason}")


def test_team_day_every_guide_block_has_a_place_in_the_day():
    """Nothing of the two guides is skipped: each labelled block runs once, by someone of its role."""
    blocks = {**{(AWS, label): block for label, block in labelled_blocks(AWS).items()},
              **{(TRACKING, label): block for label, block in labelled_blocks(TRACKING).items()}}
    day = [(page, label) for _, page, label in DAY]
    assert sorted(map(str, blocks)) == sorted(map(str, set(day))), "a guide's block is missing from DAY, or gone"
    for who, _, label in DAY:
        role = label.split(":")[0]
        assert role == who or (role == "member" and who in ("alice", "bob", "promoter")), (who, label)


def _copy_checkout(destination: Path) -> None:
    """The admin's clone of the project: the files git knows (tracked, or untracked and not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


class Day:
    """The rehearsal's cloud and its people."""

    def __init__(self, root: Path):
        self.cloud = Cloud(root, tag=f"td{secrets.token_hex(2)}")
        self.passwords = {name: secrets.token_urlsafe(12) for name in ("alice", "bob", "serving", "promoter")}
        self.people: dict[str, Person] = {}
        self.outputs: dict[str, str] = {}

    def start(self) -> None:
        self.cloud.start()
        for name in PEOPLE:
            host = self.cloud.add_host(f"{name}-laptop", vpc=False)
            cwd = ROOT if name != "admin" else Path("/home/admin/transformer-nmt")
            if name == "admin":
                _copy_checkout(host.real_path(cwd))
            person = Person(self.cloud, name, host, str(cwd), self._answers(name))
            self.people[name] = person

    def _answers(self, name: str) -> dict[str, str]:
        """What each person types at the guides' prompts."""
        if name == "admin":
            answers = {f"password for {login}: ": pw for login, pw in self.passwords.items()}
            answers.update({f"password for {login} (again): ": pw for login, pw in self.passwords.items()})
            return {**answers, "password of the serving login: ": self.passwords["serving"]}
        return {"MLflow login: ": name, "MLflow password: ": self.passwords[name],
                "promoter password: ": self.passwords["promoter"]}

    def hand_out_token(self) -> None:
        """The admin gives each member the cluster's token, as the guide says (a password manager, say)."""
        admin = self.people["admin"]
        token = admin.host.real_path(Path(admin.home) / ".ray" / "auth_token").read_text().strip()
        for name in ("alice", "bob", "promoter"):
            self.people[name].answers["cluster token: "] = token

    def run(self, who: str, page: Path, label: str, timeout_s: float = 1200) -> str:
        started = time.monotonic()
        output = self.people[who].run(labelled_blocks(page)[label], timeout_s)
        self.outputs[f"{who} {label}"] = output
        print(f"{who} ran {label} in {time.monotonic() - started:.0f} s")  # the day's timetable (pytest -s)
        return output

    def mlflow(self, who: str, code: str) -> object:
        """A Python snippet run on someone's laptop with their login, through their port-forward; its JSON."""
        person = self.people[who]
        login = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_TRACKING_USERNAME": who,
                 "MLFLOW_TRACKING_PASSWORD": self.passwords.get(who) or self._admin_password()}
        env = {**self.cloud.base_env(person.host, person.home), **login}
        done = self.cloud.run_on(person.host, ["python", "-c", "import json, mlflow; from mlflow.tracking import "
                                               "MlflowClient; c = MlflowClient(); " + code], env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def _admin_password(self) -> str:
        return self.cloud.records["parameters"]["/nmt/mlflow/server/admin-password"]["Value"]

    def stop(self) -> None:
        self.cloud.stop()


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    _required()
    root = Path(tmp_path_factory.mktemp("team-day"))
    day = Day(root)
    try:
        day.start()
        yield day
    finally:
        day.stop()


@pytest.mark.rehearse
@pytest.mark.timeout(3600)
def test_team_day_from_an_empty_account_to_a_served_champion(day):
    print("stand-ins:", *(f"  {' '.join(prefix)}: {what}" for prefix, _, what in STAND_INS), sep="\n")
    steps = iter(DAY)
    for who, page, label in steps:
        day.run(who, page, label)
        if label == "admin:cluster":
            day.hand_out_token()
        if (who, label) == ("promoter", "member:shell"):
            break
    # Two members, two experiments of their own: neither is refused.
    day.run(*next(steps))  # alice trains
    started = time.monotonic()
    sweep = day.people["bob"].start(labelled_blocks(AWS)["member:sweep"])
    next(steps)
    sweep.wait_for(r"\[tune\] trial \w+ ended", 1200)
    restarted = time.monotonic()
    print(f"bob's sweep ended its first trial in {restarted - started:.0f} s")
    restart_cluster(day.cloud)  # the head's machine restarts under bob's sweep
    with pytest.raises(BlockFailed) as failed:
        sweep.wait(600)
    # The new head answers that it knows no such job: bob is told at once, not after a minute of silence.
    assert "the cluster no longer knows job" in str(failed.value) and "--resume" in str(failed.value), failed.value
    print(f"the head restarted under bob's sweep, which ended {time.monotonic() - restarted:.0f} s later")
    resumed = day.run(*next(steps))
    trials = re.findall(r"^\w+_\d{5} .*$", resumed, re.M)  # the table of the sweep it finished
    assert len(trials) == 2 and all(" nan " not in row for row in trials) and "*best*" in resumed, trials

    checking = time.monotonic()
    # Before any promote: candidates only, no version of the team's model, no champion, no member's model.
    # Each member opens the UI through their own tunnel, logged in as themselves, and sees both members' runs.
    look = ("import base64, os, urllib.request as u; login = base64.b64encode(f\"{os.environ["
            "'MLFLOW_TRACKING_USERNAME']}:{os.environ['MLFLOW_TRACKING_PASSWORD']}\".encode()); "
            "r = u.urlopen(u.Request('http://127.0.0.1:5000/', "
            "headers={'Authorization': b'Basic ' + login}), timeout=30); "
            f"print(json.dumps({{'versions': [v.version for v in c.search_model_versions(\"name='{MODEL}'\")], "
            "'models': [m.name for m in c.search_registered_models()], 'page': [r.status, r.read().decode()], "
            "'experiments': sorted({e.name for e in c.search_experiments() if c.search_runs([e.experiment_id])})}))")
    for who in ("alice", "bob"):
        seen = day.mlflow(who, look)
        assert seen["versions"] == [], (who, seen["versions"])
        assert set(seen["models"]) <= {MODEL, "transformer-nmt-wmt14-en-de"}, seen["models"]  # the admin's
        assert seen["page"][0] == 200 and "<title>MLflow" in seen["page"][1], (who, seen["page"][1][:300])
        assert {"transformer-nmt-alice", "transformer-nmt-bob"} <= set(seen["experiments"]), (who, seen["experiments"])

    print(f"the members' checks through their own tunnels took {time.monotonic() - checking:.0f} s")
    promoted = day.run(*next(steps))
    assert f"registered as {MODEL} version" in promoted and "is @champion" in promoted, promoted[-3000:]
    assert "rejected" not in promoted, promoted[-3000:]
    champion = day.mlflow("alice", f"v = c.get_model_version_by_alias('{MODEL}', 'champion'); "
                                   "user = c.get_run(v.run_id).data.tags['mlflow.user']; "
                                   "print(json.dumps({**v.tags, 'user': user}))")
    assert champion["user"] == "promoter" and champion["candidate_user"] in ("alice", "bob"), champion

    evaluated = day.run(*next(steps))
    assert re.search(r"BLEU \d+\.\d+", evaluated), evaluated[-3000:]
    served = day.run(*next(steps))
    assert re.search(r'"translations": ?\["\w', served), served[-3000:]  # through the nodes' read-only login
