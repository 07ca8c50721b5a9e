"""deploy/kuberay/mlflow.yaml serves MLflow as written: the manifest's settings, and a server run from them.

- the manifest: logins (basic-auth) whose passwords come from Secrets, the runs and the logins in a
  PostgreSQL StatefulSet of its own (password from a Secret, never in a URI), connections sized within
  its max_connections, artifacts proxied to object storage, a ClusterIP Service, non-root pods, only the
  server admitted to the database;
- the MLflow server starts with the manifest's command, settings and login steps on PostgreSQL (slow).
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import ROOT, PostgresCluster, environment, free_port, stop_process, wait_http
from deploy_files import (
    KUBERAY,
    MLFLOW_SERVER,
    container_env,
    defined_objects,
    header,
    mlflow_args,
    mlflow_container,
)

SERVICE_DB = "mlflow@mlflow-postgres.mlflow.svc.cluster.local:5432"


def _auth_ini(defined: dict, container: dict) -> configparser.ConfigParser:
    pod_volumes = {v["name"]: v for v in defined[MLFLOW_SERVER]["spec"]["template"]["spec"]
                   ["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    ini_dir, ini_name = container_env(container)["MLFLOW_AUTH_CONFIG_PATH"]["value"].rsplit("/", 1)
    ini = configparser.ConfigParser()
    ini.read_string(defined[("ConfigMap", "mlflow", pod_volumes[mounts[ini_dir]]["configMap"]["name"])]["data"]
                    [ini_name])
    return ini


def test_mlflow_server_manifest_runs_on_postgresql_with_logins_and_object_storage():
    defined = defined_objects()
    deployment = defined[MLFLOW_SERVER]
    pod = deployment["spec"]["template"]["spec"]
    container, args = mlflow_container(deployment), mlflow_args(deployment)
    env = container_env(container)
    assert args["app_name"] == "basic-auth" and args["host"] == "0.0.0.0", "logins, reachable through the Service"
    for name, key in (("MLFLOW_AUTH_ADMIN_PASSWORD", "admin-password"),
                      ("MLFLOW_FLASK_SERVER_SECRET_KEY", "flask-secret-key")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-auth", "key": key}
    assert urllib.parse.urlsplit(args["artifacts_destination"]).scheme in ("s3", "gs", "wasbs"), "object storage"
    assert args["serve_artifacts"], "clients reach artifacts through the server, with no bucket credentials"
    # Runs and logins in the StatefulSet's PostgreSQL, through psycopg 3; its password from a Secret only.
    ini = _auth_ini(defined, container)
    assert "admin_password" not in ini["mlflow"], "the admin password comes from the Secret only"
    assert int(ini["mlflow"]["auth_cache_ttl_seconds"]) > 0, "a password hash checked on every request"
    for uri in (args["backend_store_uri"], ini["mlflow"]["database_uri"]):
        parts = urllib.parse.urlsplit(uri)
        assert parts.scheme == "postgresql+psycopg" and parts.password is None, uri
        assert f"{parts.username}@{parts.hostname}:{parts.port}" == SERVICE_DB, uri
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-postgres", "key": "password"}
    database = defined[("StatefulSet", "mlflow", "mlflow-postgres")]
    postgres = database["spec"]["template"]["spec"]["containers"][0]
    postgres_env = container_env(postgres)
    assert postgres_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == env["PGPASSWORD"]["valueFrom"][
        "secretKeyRef"]
    claims = {c["metadata"]["name"] for c in database["spec"]["volumeClaimTemplates"]}
    assert {m["name"] for m in postgres["volumeMounts"] if m["mountPath"] == "/var/lib/postgresql/data"} <= claims
    # Every worker of every replica holds at most pool + overflow connections to each of the two databases.
    workers, replicas = int(args["workers"]), deployment["spec"]["replicas"]
    per_engine = int(env["MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"]["value"]) + int(
        env["MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW"]["value"])
    max_connections = int(next(a.split("=")[1] for a in postgres["args"] if a.startswith("max_connections=")))
    assert replicas * workers * 2 * per_engine < max_connections, (replicas, workers, per_engine, max_connections)
    # A worker answers up to 40 requests at once (its thread pool), and MLflow's log_batch holds two connections:
    # a smaller pool deadlocks under a burst, every request waiting for a connection the others hold.
    assert per_engine >= 2 * 40, per_engine
    rolling = deployment["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert replicas >= 2 and rolling, "one restarting, one serving"
    service = defined[("Service", "mlflow", "mlflow")]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP", "MLflow stays inside the cluster"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {p["name"] for p in container["ports"]}
    for spec in (pod, database["spec"]["template"]["spec"]):
        assert spec["securityContext"]["runAsNonRoot"] is True
    # Only the MLflow server reaches the database.
    policy = defined[("NetworkPolicy", "mlflow", "mlflow-postgres")]["spec"]
    assert policy["podSelector"]["matchLabels"] == database["spec"]["selector"]["matchLabels"]
    assert [rule["from"] for rule in policy["ingress"]] == [[{"podSelector": {"matchLabels": deployment["spec"][
        "selector"]["matchLabels"]}}]]


def _postgres_as_the_manifest_makes_it(database: dict, password: str):
    """A throwaway PostgreSQL whose superuser is the StatefulSet's, set up by the manifest's init scripts with
    the mlflow-postgres Secret's password, as the image's entrypoint runs them on a new volume."""
    import os

    env = container_env(database["spec"]["template"]["spec"]["containers"][0])
    try:
        cluster = PostgresCluster(durable=False, user=env["POSTGRES_USER"]["value"])
        cluster.start()
    except RuntimeError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(str(err))
        pytest.skip(str(err))
    scripts = defined_objects()[("ConfigMap", "mlflow", "mlflow-postgres-init")]["data"]
    for name in sorted(scripts):  # the entrypoint's order; the pod reaches the server on its socket, here TCP
        result = subprocess.run(["sh", "-c", scripts[name]], capture_output=True, text=True, timeout=120, env={
            "PATH": f"{cluster.bindir}:/usr/bin:/bin", "POSTGRES_USER": cluster.user, "POSTGRES_PASSWORD": password,
            "PGHOST": "127.0.0.1", "PGPORT": str(cluster.port), "PGPASSWORD": cluster.password})
        assert result.returncode == 0, f"{name}: {result.stderr}"
    return cluster


@pytest.fixture(scope="module")
def manifest_server(tmp_path_factory):
    """The manifest's command, ini file and env (Secrets filled in) run on the manifest's PostgreSQL; the
    header's deploy/mlflow_users.py steps made the team's logins.

    Only what exists in the cluster alone changes: the database's host becomes a throwaway PostgreSQL's,
    the bucket a directory, the port a free one.
    """
    import secrets
    import types

    tmp_path = tmp_path_factory.mktemp("manifest-mlflow")
    defined = defined_objects()
    deployment = defined[MLFLOW_SERVER]
    container = mlflow_container(deployment)
    database_password = secrets.token_hex(16)
    postgres = _postgres_as_the_manifest_makes_it(defined[("StatefulSet", "mlflow", "mlflow-postgres")],
                                                  database_password)
    local_db = f"mlflow@127.0.0.1:{postgres.port}"
    artifacts, port = tmp_path / "artifacts", free_port()
    ini = tmp_path / "basic_auth.ini"
    ini.write_text(defined[("ConfigMap", "mlflow", "mlflow-auth-config")]["data"]["basic_auth.ini"]
                   .replace(SERVICE_DB, local_db))
    swaps = {"--host": "127.0.0.1", "--port": str(port), "--artifacts-destination": str(artifacts)}
    args = [f"{a.split('=')[0]}={swaps[a.split('=')[0]]}" if a.split("=")[0] in swaps else a
            for a in container["args"]]
    admin_password = secrets.token_hex(16)
    filled = {("mlflow-auth", "admin-password"): admin_password, ("mlflow-auth", "flask-secret-key"):
              secrets.token_hex(16), ("mlflow-postgres", "password"): database_password}
    env = {e["name"]: e["value"] if "value" in e else filled[(e["valueFrom"]["secretKeyRef"]["name"],
                                                              e["valueFrom"]["secretKeyRef"]["key"])]
           for e in container["env"]}
    env["MLFLOW_BACKEND_STORE_URI"] = env["MLFLOW_BACKEND_STORE_URI"].replace(SERVICE_DB, local_db)
    env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), HOME=str(tmp_path))
    log = open(tmp_path / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "mlflow", "server", *args], cwd=tmp_path,
                               env={**_clean_env(), **env}, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{uri}/health", 300, process)
        # The header's own login steps, run as its admin with the port-forward's port swapped.
        passwords = {}
        for line in header(KUBERAY / "mlflow.yaml").splitlines():
            if line.startswith("python deploy/mlflow_users.py"):
                passwords[line.split()[5]] = secrets.token_hex(12)
                subprocess.run([sys.executable, *line.replace("127.0.0.1:5000", f"127.0.0.1:{port}").split()[1:],
                                "--password-file", "-"], input=passwords[line.split()[5]] + "\n", text=True,
                               check=True, cwd=ROOT, capture_output=True, timeout=120,
                               env={**_clean_env(), "MLFLOW_TRACKING_USERNAME": "admin",
                                    "MLFLOW_TRACKING_PASSWORD": admin_password})
        assert {"alice", "serving", "promoter"} <= set(passwords)
        yield types.SimpleNamespace(uri=uri, passwords=passwords, artifacts=artifacts, tmp_path=tmp_path,
                                    postgres=postgres, database_password=database_password)
    finally:
        stop_process(process)
        log.close()
        postgres.stop()


def _login(server, name: str) -> dict[str, str]:
    """The variables MLflow's client logs in with, as one of the header's logins."""
    return {"MLFLOW_TRACKING_USERNAME": name, "MLFLOW_TRACKING_PASSWORD": server.passwords[name],
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


@pytest.mark.slow
def test_mlflow_server_runs_as_the_manifest_and_its_header_say(manifest_server):
    """A person logs in, writes a run with an artifact through the server's proxy; the server answers the
    Service's host name and refuses others."""
    from mlflow.tracking import MlflowClient

    server, tmp_path = manifest_server, manifest_server.tmp_path
    with environment(**_login(server, "alice")):
        client = MlflowClient(server.uri)
        run = client.create_run(client.create_experiment("deploy-check"))
        (tmp_path / "note.txt").write_text("through the proxy")
        client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
    assert [p.name for p in server.artifacts.rglob("note.txt")], "the artifact did not reach the artifact store"
    search = f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1"
    password = server.passwords["alice"]
    assert _status(search, "alice", "wrong-password") == 401
    assert _status(search, "alice", password, host="mlflow.mlflow.svc.cluster.local:5000") == 200
    assert _status(search, "alice", password, host="attacker.example:5000") == 403
    with _connect(server, "mlflow") as conn:  # the run is in PostgreSQL
        assert conn.execute("SELECT count(*) FROM runs WHERE run_uuid = %s", (run.info.run_id,)).fetchone()[0]


def _connect(server, database: str, user: str = "mlflow", password: str | None = None):
    """A connection to the manifest's PostgreSQL, by default as the server's own role."""
    import psycopg

    return psycopg.connect(host="127.0.0.1", port=server.postgres.port, dbname=database, user=user,
                           password=server.database_password if password is None else password, autocommit=True)


def test_the_tracking_database_role_is_not_the_images_superuser():
    """The server's database user is a role of its own that mlflow-role.sh makes, not the image's superuser."""
    defined = defined_objects()
    database = defined[("StatefulSet", "mlflow", "mlflow-postgres")]
    superuser = container_env(database["spec"]["template"]["spec"]["containers"][0])["POSTGRES_USER"]["value"]
    container = mlflow_container(defined[MLFLOW_SERVER])
    users = {urllib.parse.urlsplit(uri).username for uri in (mlflow_args(defined[MLFLOW_SERVER])[
        "backend_store_uri"], _auth_ini(defined, container)["mlflow"]["database_uri"])}
    assert users == {"mlflow"} and superuser != "mlflow", (users, superuser)
    init = defined[("ConfigMap", "mlflow", "mlflow-postgres-init")]
    volume = next(v for v in database["spec"]["template"]["spec"]["volumes"] if v.get("configMap", {}).get(
        "name") == init["metadata"]["name"])
    assert volume["configMap"]["defaultMode"] & 0o111, "the entrypoint sources a script it cannot execute"


@pytest.mark.slow
def test_the_tracking_database_role_owns_only_its_databases_and_is_no_superuser(manifest_server):
    """The init script run as the image runs it: `mlflow` owns mlflow and mlflow_auth and may do nothing else a
    superuser may; the superuser keeps no password, so no client outside the pod logs in as it."""
    import psycopg

    server = manifest_server
    with _connect(server, "mlflow") as conn:
        role = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles "
                            "WHERE rolname = 'mlflow'").fetchone()
        owned = {row[0] for row in conn.execute("SELECT datname FROM pg_database d JOIN pg_roles r ON "
                                                "d.datdba = r.oid WHERE r.rolname = 'mlflow'")}
        server_users = {row[0] for row in conn.execute("SELECT DISTINCT usename FROM pg_stat_activity WHERE "
                                                       "datname IN ('mlflow', 'mlflow_auth')")}
        superusers = [row[0] for row in conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper")]
    assert role == (False, False, False, False, False), role
    assert owned == {"mlflow", "mlflow_auth"}, owned
    assert server_users == {"mlflow"}, f"the server connects as {server_users}"
    assert superusers == [server.postgres.user], superusers
    for user, password in ((server.postgres.user, server.postgres.password),
                           (server.postgres.user, server.database_password)):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            _connect(server, "postgres", user, password).close()


@pytest.mark.slow
def test_the_serving_login_creates_nothing_but_reads_a_model_version_and_its_files(manifest_server):
    """`mlflow_users.py serving` on the manifest's server: no experiment, run, registered model or logged
    model of its own, and still the champion's version and its files, as the RayService loads them."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipeline.text.tokenizer import JOINT_FILE
    from pipeline.text.translator import CONFIG_FILE, WEIGHTS_FILE
    from pipeline.track import registry

    server = manifest_server
    model = next(line.split("--model ")[1].split()[0] for line in header(KUBERAY / "mlflow.yaml").splitlines()
                 if line.startswith("python deploy/mlflow_users.py") and " promoter " in line)
    files = server.tmp_path / "packaged"
    (files / registry.TRANSLATOR_FILES).mkdir(parents=True)
    for name in (WEIGHTS_FILE, CONFIG_FILE, JOINT_FILE):
        (files / registry.TRANSLATOR_FILES / name).write_text(name)
    with environment(**_login(server, "alice")):  # a person's run and its packaged model
        client = MlflowClient(server.uri)
        experiment = client.create_experiment("alice-serving-check")
        run = client.create_run(experiment)
        logged = client.create_logged_model(experiment, name="model", source_run_id=run.info.run_id)
        client.log_model_artifacts(logged.model_id, str(files))
    with environment(**_login(server, "promoter")):  # the promoting login registers and crowns it
        client = MlflowClient(server.uri, registry_uri=server.uri)
        version = client.create_model_version(model, f"models:/{logged.model_id}", run_id=run.info.run_id,
                                              model_id=logged.model_id)
        client.set_registered_model_alias(model, "champion", version.version)
    with environment(**_login(server, "serving")):
        client = MlflowClient(server.uri, registry_uri=server.uri)
        for what, attempt in (("an experiment", lambda: client.create_experiment("serving-own")),
                              ("a run in the Default experiment", lambda: client.create_run("0")),
                              ("a run in a person's experiment", lambda: client.create_run(experiment)),
                              ("a registered model", lambda: client.create_registered_model("serving-model")),
                              ("a logged model", lambda: client.create_logged_model(experiment)),
                              ("a version of the team's model", lambda: client.create_model_version(
                                  model, f"models:/{logged.model_id}", model_id=logged.model_id))):
            with pytest.raises(MlflowException) as refused:
                attempt()
            assert refused.value.get_http_status_code() == 403, f"serving created {what}"
        assert client.get_model_version_by_alias(model, "champion").version == version.version
        with registry.translator_files(server.uri, f"models:/{model}@champion") as local:
            assert (local / WEIGHTS_FILE).read_text() == WEIGHTS_FILE


def _clean_env() -> dict[str, str]:
    """This process's environment without MLflow and Ray settings, which would change what is tested."""
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_"))}


def _status(url: str, user: str, password: str, host: str | None = None) -> int:
    import base64

    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    if host:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
