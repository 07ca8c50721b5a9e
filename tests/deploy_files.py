"""Reading deploy/ for its tests: the YAML, its Kubernetes objects and Ray pods, the README's table, headers' steps."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from small import ROOT

DEPLOY = ROOT / "deploy"
KUBERAY = DEPLOY / "kuberay"
RAY_KINDS = {"RayCluster": "rayclusters", "RayJob": "rayjobs", "RayService": "rayservices"}
MLFLOW_SERVER = ("StatefulSet", "mlflow", "mlflow")  # mlflow.yaml's server: (kind, namespace, name)
# Variable names whose values are secrets: they must come from a Secret, never from the file.
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY\b|CREDENTIAL")


def docs(path: Path) -> list[dict]:
    """The YAML documents of a file, empty ones left out."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def objects() -> list[tuple[Path, dict]]:
    """Every Kubernetes object in deploy/kuberay, with its file."""
    return [(p, d) for p in sorted(KUBERAY.glob("*.yaml")) for d in docs(p)]


def by_kind(kind: str) -> list[tuple[Path, dict]]:
    """The objects of deploy/kuberay of one kind, with their files."""
    return [(p, d) for p, d in objects() if d["kind"] == kind]


def namespace(doc: dict) -> str:
    return doc["metadata"].get("namespace", "")  # "": kubectl's current namespace


def cluster_spec(doc: dict) -> dict:
    """The RayCluster spec of a RayCluster, RayJob or RayService."""
    return {"RayCluster": lambda: doc["spec"], "RayJob": lambda: doc["spec"]["rayClusterSpec"],
            "RayService": lambda: doc["spec"]["rayClusterConfig"]}[doc["kind"]]()


def ray_clusters() -> list[tuple[str, dict, dict]]:
    """(where, the object, its cluster spec) for each RayCluster, RayJob and RayService."""
    found = [(f"{p.name} {d['kind']}", d, cluster_spec(d)) for p, d in objects() if d["kind"] in RAY_KINDS]
    assert {d["kind"] for _, d, _ in found} == set(RAY_KINDS)
    return found


def groups(spec: dict) -> list[dict]:
    """A cluster spec's head group, then its worker groups."""
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def ray_pod_templates(doc: dict) -> list[dict]:
    """The pod templates of a RayCluster, RayJob or RayService: one per Ray group, then a RayJob's submitter."""
    found = [group["template"] for group in groups(cluster_spec(doc))]
    if doc["kind"] == "RayJob" and "submitterPodTemplate" in doc["spec"]:
        found.append(doc["spec"]["submitterPodTemplate"])
    return found


def pod_specs(doc: dict) -> list[dict]:
    """The pod specs an object runs: one per Ray group and submitter, one per workload template."""
    if doc["kind"] in RAY_KINDS:
        return [template["spec"] for template in ray_pod_templates(doc)]
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        return [doc["spec"]["template"]["spec"]]
    return []


def containers(pod: dict) -> list[dict]:
    """A pod's init containers, then its containers."""
    return [*pod.get("initContainers", []), *pod["containers"]]


def container_env(container: dict) -> dict[str, dict]:
    """A container's environment variables by name."""
    return {e["name"]: e for e in container.get("env", [])}


GUIDES = [KUBERAY / "README.md", DEPLOY / "aws" / "README.md"]  # one per platform, each with its prerequisites


def prerequisites() -> list[dict]:
    """The tables of the platform guides' "What must exist before you apply": kind, name, namespace, keys."""
    sections = [guide.read_text().split("## What must exist before you apply", 1)[1].split("\n## ", 1)[0]
                for guide in GUIDES]
    rows = []
    for line in "\n".join(sections).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("kind", "") or set(cells[0]) <= {"-"}:
            continue
        name = re.match(r"`([^`]+)`", cells[1])
        rows.append({"kind": cells[0], "name": name.group(1) if name else cells[1],
                     "namespace": "" if cells[2] in ("", "current") else cells[2].strip("`"),
                     "keys": set(re.findall(r"`([^`]+)`", cells[3]))})
    assert rows, "the platform guides have no prerequisites table"
    return rows


def header(path: Path) -> str:
    """The file's leading comment block, continuation lines joined."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines).replace("\\\n", " ")


STEP = re.compile(r"kubectl (?:-n (\S+) )?(create namespace|create secret generic|apply -f) (\S+)(.*)")


def steps(text: str) -> list[tuple[str, str, str, set[str]]]:
    """The `kubectl` steps of a text, in order: (verb, namespace, argument, --from-literal keys)."""
    return [(verb, ns or "", arg, set(re.findall(r"--from-literal=([\w.-]+)=", rest)))
            for ns, verb, arg, rest in STEP.findall(text)]


def references(doc: dict) -> list[tuple[str, str, str, str | None, bool]]:
    """What an object names without defining it: (kind, namespace, name, key, optional)."""
    ns, refs = namespace(doc), []
    if doc["kind"] in RAY_KINDS:
        auth = cluster_spec(doc).get("authOptions", {})
        if auth.get("secretName"):
            refs.append(("Secret", ns, auth["secretName"], "auth_token", False))
    if doc["kind"] == "PersistentVolumeClaim" and doc["spec"].get("storageClassName"):
        refs.append(("StorageClass", "", doc["spec"]["storageClassName"], None, False))
    if doc["kind"] == "NetworkPolicy":  # namespaces it admits by name; optional: the policy applies without them
        for rule in doc["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                name = peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                if name:
                    refs.append(("Namespace", "", name, None, True))
    if ns:
        refs.append(("Namespace", "", ns, None, False))
    for pod in pod_specs(doc):
        if pod.get("serviceAccountName"):
            refs.append(("ServiceAccount", ns, pod["serviceAccountName"], None, False))
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                refs.append(("PersistentVolumeClaim", ns, volume["persistentVolumeClaim"]["claimName"], None, False))
            if "secret" in volume:
                secret = volume["secret"]
                refs.append(("Secret", ns, secret["secretName"], None, secret.get("optional", False)))
            if "configMap" in volume:
                config_map = volume["configMap"]
                refs.append(("ConfigMap", ns, config_map["name"], None, config_map.get("optional", False)))
        for container in containers(pod):
            refs.append(("Image", "", container["image"], None, False))
            for var in container.get("env", []):
                for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                    ref = var.get("valueFrom", {}).get(field)
                    if ref:
                        refs.append((kind, ns, ref["name"], ref["key"], ref.get("optional", False)))
            for source in container.get("envFrom", []):
                for kind, field in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                    if field in source:
                        refs.append((kind, ns, source[field]["name"], None, source[field].get("optional", False)))
    return refs


def defined_objects() -> dict[tuple[str, str, str], dict]:
    """Every object of deploy/kuberay by (kind, namespace, name)."""
    return {(d["kind"], namespace(d), d["metadata"]["name"]): d for _, d in objects()}


def mlflow_container(deployment: dict) -> dict:
    """The MLflow server's container in mlflow.yaml's StatefulSet (MLFLOW_SERVER)."""
    return deployment["spec"]["template"]["spec"]["containers"][0]


def mlflow_args(deployment: dict) -> dict:
    """The server's settings as `mlflow server` parses the manifest's command line and environment."""
    from mlflow.cli import cli

    from pipeline.common.environment import environment

    container = mlflow_container(deployment)
    assert container["command"] == ["mlflow", "server"]
    values = {name: entry["value"] for name, entry in container_env(container).items() if "value" in entry}
    with environment(**values):  # e.g. MLFLOW_BACKEND_STORE_URI, which the server reads as --backend-store-uri
        return cli.commands["server"].make_context("server", list(container["args"])).params
