"""deploy/kuberay/mlflow.yaml serves MLflow as written: the manifest's settings, and a server run from them.

- the manifest: logins (basic-auth) whose passwords come from Secrets, artifacts proxied to object storage,
  both databases on the volume, one replica on a ReadWriteOnce claim, a ClusterIP Service, a non-root pod;
- the MLflow server starts with the manifest's command, settings and login steps (slow).
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import free_port, stop_process, wait_http
from deploy_files import KUBERAY, container_env, defined_objects, header, mlflow_args, mlflow_container


def test_mlflow_server_manifest():
    defined = defined_objects()
    deployment = defined[("Deployment", "mlflow", "mlflow")]
    pod = deployment["spec"]["template"]["spec"]
    container, args = mlflow_container(deployment), mlflow_args(deployment)
    env = container_env(container)
    assert args["app_name"] == "basic-auth" and args["host"] == "0.0.0.0", "logins, reachable through the Service"
    for name, key in (("MLFLOW_AUTH_ADMIN_PASSWORD", "admin-password"),
                      ("MLFLOW_FLASK_SERVER_SECRET_KEY", "flask-secret-key")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-auth", "key": key}
    assert urllib.parse.urlsplit(args["artifacts_destination"]).scheme in ("s3", "gs", "wasbs"), "object storage"
    assert args["serve_artifacts"], "clients reach artifacts through the server, with no bucket credentials"
    # Both databases on the volume; the users database configured by the ConfigMap's ini file.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    ini_dir, ini_name = env["MLFLOW_AUTH_CONFIG_PATH"]["value"].rsplit("/", 1)
    ini = configparser.ConfigParser()
    ini.read_string(defined[("ConfigMap", "mlflow", volumes[mounts[ini_dir]]["configMap"]["name"])]["data"][ini_name])
    assert "admin_password" not in ini["mlflow"], "the admin password comes from the Secret only"
    for uri in (args["backend_store_uri"], ini["mlflow"]["database_uri"]):
        directory = uri.removeprefix("sqlite:///").rsplit("/", 1)[0]
        assert uri.startswith("sqlite:////") and "persistentVolumeClaim" in volumes[mounts[directory]], uri
    claim_name = volumes[mounts[directory]]["persistentVolumeClaim"]["claimName"]
    claim = defined[("PersistentVolumeClaim", "mlflow", claim_name)]
    if claim["spec"]["accessModes"] == ["ReadWriteOnce"]:
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    service = defined[("Service", "mlflow", "mlflow")]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP", "MLflow stays inside the cluster"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {p["name"] for p in container["ports"]}
    assert pod["securityContext"]["runAsNonRoot"] is True


@pytest.mark.slow
def test_mlflow_server_runs_as_the_manifest_and_its_header_say(tmp_path, monkeypatch):
    """The manifest's command, ini file and env (Secrets filled in) start a server; the header's curl makes a user.

    Only what exists in the cluster alone changes: the volume becomes a directory, the bucket a directory,
    the port a free one. The user logs in, writes a run with an artifact through the server's proxy, and
    the server answers the Service's host name and refuses others.
    """
    import secrets
    import shutil

    from mlflow.tracking import MlflowClient

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    # The image (-full) has MLflow's auth extra; a development environment may lack it.
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs mlflow[auth] (Flask-WTF)")
    defined = defined_objects()
    deployment = defined[("Deployment", "mlflow", "mlflow")]
    container = mlflow_container(deployment)
    data, artifacts, port = tmp_path / "data", tmp_path / "artifacts", free_port()
    data.mkdir()
    ini = tmp_path / "basic_auth.ini"
    ini.write_text(defined[("ConfigMap", "mlflow", "mlflow-auth-config")]["data"]["basic_auth.ini"]
                   .replace("/mlflow/data", str(data)))
    swaps = {"--host": "127.0.0.1", "--port": str(port), "--artifacts-destination": str(artifacts)}
    args = [f"{a.split('=')[0]}={swaps[a.split('=')[0]]}" if a.split("=")[0] in swaps
            else a.replace("/mlflow/data", str(data)) for a in container["args"]]
    admin_password, user_password = secrets.token_hex(16), secrets.token_hex(16)
    filled = {"admin-password": admin_password, "flask-secret-key": secrets.token_hex(16)}
    env = {e["name"]: e["value"] if "value" in e else filled[e["valueFrom"]["secretKeyRef"]["key"]]
           for e in container["env"]}
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
    env["HOME"] = str(tmp_path)
    log = open(tmp_path / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "mlflow", "server", *args], cwd=tmp_path,
                               env={**_clean_env(), **env}, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{uri}/health", 300, process)
        # The header's own command, with its variables set and the port-forward's port swapped.
        curl = next(line for line in header(KUBERAY / "mlflow.yaml").splitlines() if line.startswith("curl "))
        subprocess.run(["bash", "-c", curl.replace("127.0.0.1:5000", f"127.0.0.1:{port}")], check=True,
                       env={**_clean_env(), "MLFLOW_ADMIN_PASSWORD": admin_password,
                            "NMT_MLFLOW_PASSWORD": user_password}, capture_output=True, timeout=60)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "nmt")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", user_password)
        client = MlflowClient(uri)
        run = client.create_run(client.create_experiment("deploy-check"))
        (tmp_path / "note.txt").write_text("through the proxy")
        client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
        assert [p.name for p in artifacts.rglob("note.txt")], "the artifact did not reach the artifact store"
        assert _status(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", "nmt", "wrong-password") == 401
        service_host = "mlflow.mlflow.svc.cluster.local:5000"
        assert _status(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", "nmt", user_password,
                       host=service_host) == 200
        assert _status(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", "nmt", user_password,
                       host="attacker.example:5000") == 403
    finally:
        stop_process(process)
        log.close()


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
