"""The team's logins on an MLflow server with basic-auth, made with MLflow's auth API (run as its admin).

    export MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=...    # the admin's login
    python deploy/mlflow_users.py --server URL person alice               # EDITs her experiments, READs the rest
    python deploy/mlflow_users.py --server URL serving serving            # reads models: the RayService's login
    python deploy/mlflow_users.py --server URL promoter promoter --model transformer-nmt-wmt14-en-de
    python deploy/mlflow_users.py --server URL share wmt14-team --user alice --permission EDIT

A new user's password comes from --password-file (a file, or - for stdin), else it is asked twice.
The server must run with `default_permission = READ`, `grant_default_workspace_access = true` and
--enable-workspaces (deploy/kuberay/mlflow.yaml): every login then reads every experiment and model,
changes only what it created or was granted, and creates experiments and registered models only as a
member of the role `nmt-creators` (people and the promoting login; `serving` is not one). Without
workspaces MLflow lets every login create, so `serving` refuses such a server. `promoter` makes each
registered model it names (as the admin, so no person owns it) and alone gets MANAGE on it: only that
login may register versions and move @champion. deploy/tracking-server.md explains the whole setup.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

PERMISSIONS = ("READ", "USE", "EDIT", "MANAGE")
# With workspaces on, MLflow's basic-auth lets a login create experiments and registered models (and so
# runs, in an experiment it made) only with a USE grant on the workspace (_can_create_in_workspace in
# mlflow/server/auth/__init__.py); the role carries that grant for everyone who may create.
WORKSPACE = "default"  # MLflow's default workspace: the team's experiments and models all live there
CREATORS_ROLE = "nmt-creators"


def _auth(server: str):
    from mlflow.server import get_app_client

    return get_app_client("basic-auth", tracking_uri=server)


def _tracking(server: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(server, registry_uri=server)


def create_user(server: str, name: str, password: str) -> None:
    """A login; what it may do comes from default_permission and the grants below."""
    from mlflow.exceptions import MlflowException

    try:
        _auth(server).create_user(name, password)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        _auth(server).update_user_password(name, password)  # running it again resets the password


def _workspaces_enabled(server: str) -> bool:
    """Whether the server runs with --enable-workspaces (its /server-info says so without a login)."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{server.rstrip('/')}/api/3.0/mlflow/server-info", timeout=60) as response:
        return bool(json.load(response).get("workspaces_enabled"))


def _creators_role(server: str) -> int:
    """The id of the role whose members may create experiments and registered models (made on first use)."""
    auth = _auth(server)
    for role in auth.list_roles(WORKSPACE):
        if role.name == CREATORS_ROLE:
            return role.id
    role = auth.create_role(WORKSPACE, CREATORS_ROLE, "may create experiments and registered models")
    auth.add_role_permission(role.id, "workspace", "*", "USE")
    return role.id


def may_create(server: str, name: str) -> None:
    """Let a login create experiments and registered models: a member of the creators role."""
    from mlflow.exceptions import MlflowException

    try:
        _auth(server).assign_role(name, _creators_role(server))
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def require_workspaces(server: str) -> None:
    """Refuse a server where a login cannot be kept from creating: one without workspaces."""
    if not _workspaces_enabled(server):
        raise SystemExit(
            f"mlflow_users: {server} runs without workspaces, where MLflow lets every login create experiments, "
            "runs and registered models; a read-only login needs `mlflow server --enable-workspaces` and "
            "`grant_default_workspace_access = true` in basic_auth.ini (deploy/kuberay/mlflow.yaml): "
            "restart the server so and run this again")


def read_only(server: str, name: str) -> None:
    """Make sure a login creates nothing: no member of the creators role, on a server that enforces it."""
    require_workspaces(server)
    auth = _auth(server)
    if any(role.name == CREATORS_ROLE for role in auth.list_user_roles(name)):
        auth.unassign_role(name, _creators_role(server))


def team_model(server: str, name: str, promoter: str) -> None:
    """A registered model made by the admin, with MANAGE for the promoting login only (the others READ it)."""
    from mlflow.exceptions import MlflowException

    try:
        _tracking(server).create_registered_model(name)
    except MlflowException as err:
        if err.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    _auth(server).grant_user_permission(promoter, "registered_model", name, "MANAGE")


def share_experiment(server: str, experiment: str, user: str, permission: str) -> None:
    """Grant a login a permission on an experiment someone else made (EDIT: it may log runs there)."""
    found = _tracking(server).get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"mlflow_users: there is no experiment {experiment!r} on {server}")
    _auth(server).grant_user_permission(user, "experiment", found.experiment_id, permission)


def _password(path: str | None, name: str) -> str:
    if path == "-":
        return sys.stdin.readline().rstrip("\n")
    if path:
        return Path(path).read_text(encoding="utf-8").rstrip("\n")
    first = getpass.getpass(f"password for {name}: ")
    if first != getpass.getpass(f"password for {name} (again): "):
        raise SystemExit("mlflow_users: the two passwords differ")
    return first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the MLflow server, e.g. http://127.0.0.1:5000")
    commands = parser.add_subparsers(dest="command", required=True)
    for kind, meaning in (("person", "a person: EDITs the experiments they make, READs everything else"),
                          ("serving", "a read-only login for serving (the RayService)"),
                          ("promoter", "the promoting login: alone MANAGEs the registered models named")):
        sub = commands.add_parser(kind, help=meaning)
        sub.add_argument("name")
        sub.add_argument("--password-file", help="the password (- for stdin); asked twice without it")
        if kind == "promoter":
            sub.add_argument("--model", action="append", default=[], help="a registered model it manages "
                                                                           "(made now if missing); repeatable")
    share = commands.add_parser("share", help="grant a login a permission on someone else's experiment")
    share.add_argument("experiment")
    share.add_argument("--user", required=True)
    share.add_argument("--permission", choices=PERMISSIONS, default="EDIT")
    args = parser.parse_args(argv)
    if args.command == "share":
        share_experiment(args.server, args.experiment, args.user, args.permission)
        print(f"{args.user} has {args.permission} on experiment {args.experiment}")
        return 0
    if args.command == "serving":
        require_workspaces(args.server)  # before the login exists
    create_user(args.server, args.name, _password(args.password_file, args.name))
    if args.command == "serving":
        read_only(args.server, args.name)
    else:
        may_create(args.server, args.name)
    for model in getattr(args, "model", []):
        team_model(args.server, model, args.name)
    print(f"{args.command} login {args.name} ready" + (f"; it manages {', '.join(args.model)}"
                                                         if getattr(args, "model", None) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
