"""deploy/kuberay applies as written: each object against its schema, every name it uses defined, the pods complete.

- Kubernetes objects against the Kubernetes API schemas (kubernetes-validate, strict: an unknown field
  fails), for the oldest Kubernetes the README supports and the newest one shipped: built-in kinds whole,
  the pod templates inside KubeRay's custom resources as PodTemplates;
- RayCluster, RayJob and RayService against KubeRay's own CRD schemas (tests/data/kuberay/, KubeRay
  v1.7.0, strict like `kubectl apply`), plus the operator's admission checks that apply to them;
- every image, Secret (and key), claim, ConfigMap, ServiceAccount, namespace and storage class a file
  names is made by a file here or listed as a prerequisite in deploy/README.md (so are cluster-aws.yaml's
  image, instance profiles and SSM parameters), and each file's header creates and applies what the file
  needs before the file itself;
- the Ray pods: MLflow's address and login (from a Secret), /dev/shm, GPUs and tolerations; the
  RayJob's nmt command parses, its config loads and its batch is the config's (update_freq);
- the Serve configs against Ray Serve's schema (autoscaling), their import_path imports, args load; the
  RayService has the GPUs its replicas ask for;
- locked down for a shared Kubernetes cluster: a token Secret per Ray cluster, pods as deploy/Dockerfile's
  non-root user without privileges, a Kubernetes API token only in the autoscaler sidecar, and
  NetworkPolicies that admit, port by port, what each pod must be reached by and nothing else.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import itertools
import json
import re
import shlex
import urllib.parse
from pathlib import Path

import jsonschema
import kubernetes_validate as kv
import pytest
import yaml
from deploy_files import (
    DEPLOY,
    KUBERAY,
    RAY_KINDS,
    SECRET_NAME,
    by_kind,
    cluster_spec,
    container_env,
    containers,
    defined_objects,
    docs,
    groups,
    header,
    mlflow_args,
    namespace,
    objects,
    pod_specs,
    prerequisites,
    ray_clusters,
    ray_pod_templates,
    references,
    steps,
)
from small import ROOT

CRD_SCHEMAS = ROOT / "tests" / "data" / "kuberay"
KUBERAY_VERSION = "1.7.0"  # of the CRD schemas there and of the operator deploy/README.md installs
IMAGE_ROOT = "/home/ray/nmt"  # where deploy/Dockerfile puts the project
# The oldest Kubernetes these files use nothing newer than, and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30", kv.latest_version())
MAX_NAME_LENGTH = {"RayCluster": 53, "RayJob": 47, "RayService": 47}  # KubeRay's utils/constant.go
MLFLOW_LOGIN = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


# ---- Kubernetes and KubeRay schemas ----

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_objects_match_the_kubernetes_schema(version):
    """Built-in kinds whole; in KubeRay's custom resources, every pod template (strict: unknown fields fail)."""
    plain = [(p, d) for p, d in objects() if d["kind"] not in RAY_KINDS]
    assert {d["kind"] for _, d in plain} >= {"PersistentVolumeClaim", "Deployment", "Service", "ConfigMap",
                                             "NetworkPolicy"}
    checks = [(f"{p.name} {d['kind']}/{d['metadata']['name']}", d) for p, d in plain]
    for where, doc, _ in ray_clusters():
        for i, template in enumerate(ray_pod_templates(doc)):
            checks.append((f"{where} pod template {i}", {"apiVersion": "v1", "kind": "PodTemplate",
                                                         "metadata": {"name": f"template-{i}"}, "template": template}))
    errors = []
    for where, doc in checks:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as err:  # its text holds the whole schema: the first line says what is wrong
            errors.append(f"{where}: {'.'.join(map(str, err.path))}: {str(err).splitlines()[0]}")
    assert not errors, "\n".join(errors)


def _strict(schema):
    """The schema with unknown fields refused where the API server refuses them (kubectl's strict validation)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _cel_rules(validator, rules, instance, schema):
    yield jsonschema.ValidationError(
        f"sets a field whose validity is a CEL rule, not checked here: {[r['rule'] for r in rules]}")


CRD_VALIDATOR = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-validations": _cel_rules})


def test_kuberay_objects_match_kuberays_crd_schemas():
    assert f"release tag `v{KUBERAY_VERSION}`" in (CRD_SCHEMAS / "README.md").read_text(), "schemas of another release"
    assert f"kuberay/kuberay-operator --version {KUBERAY_VERSION}" in (DEPLOY / "README.md").read_text()
    for where, doc, _ in ray_clusters():
        schema = json.loads((CRD_SCHEMAS / f"ray.io_{RAY_KINDS[doc['kind']]}.v1.json").read_text())
        errors = sorted(CRD_VALIDATOR(_strict(schema)).iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, f"{where}: " + "; ".join(f"{'.'.join(map(str, e.path))}: {e.message[:200]}" for e in errors)
        assert doc["apiVersion"] == "ray.io/v1", where


def test_kuberay_admission_checks():
    """What KubeRay's operator rejects (ray-operator/controllers/ray/utils/validation.go) beyond the schema."""
    from packaging.version import Version

    for where, doc, spec in ray_clusters():
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= MAX_NAME_LENGTH[doc["kind"]], where
        assert spec["headGroupSpec"]["template"]["spec"]["containers"], where
        if spec.get("authOptions", {}).get("mode") == "token":
            assert Version(spec["rayVersion"]) >= Version("2.52.0"), f"{where}: token auth needs Ray >= 2.52"
        for group in groups(spec):
            params = group.get("rayStartParams", {})
            assert "labels" not in params, where
            assert not (group.get("resources") and {"num-cpus", "num-gpus", "memory", "resources"} & set(params)), where
        for group in spec["workerGroupSpecs"]:
            assert group["groupName"], where
            assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
        if doc["kind"] == "RayService":
            assert not spec["headGroupSpec"].get("headService", {}).get("metadata", {}).get("name"), where


# ---- names: everything a file uses exists ----

def test_every_name_a_file_uses_is_defined_here_or_a_listed_prerequisite():
    """Images, Secrets and their keys, claims, ConfigMaps, ServiceAccounts, namespaces, storage classes."""
    defined, listed = defined_objects(), prerequisites()
    missing = []
    for path, doc in objects():
        for kind, ns, name, key, _ in references(doc):
            target = defined.get((kind, ns, name))
            if target is not None:
                if key is not None and kind == "ConfigMap":
                    assert key in target["data"], f"{path.name}: ConfigMap {name} has no key {key}"
                continue
            rows = [r for r in listed if r["kind"] == kind and r["name"] == name
                    and (kind in ("Image", "StorageClass", "Namespace") or r["namespace"] == ns)]
            if not rows:
                missing.append(f"{path.name}: {kind} {name!r} (namespace {ns or 'current'})")
            elif key is not None and key not in rows[0]["keys"]:
                missing.append(f"{path.name}: key {key!r} of Secret {name!r} is not in the README's table")
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    aws = {("Image", config["docker"]["image"])}
    aws |= {("IAM instance profile", t["node_config"]["IamInstanceProfile"]["Arn"].rsplit("/", 1)[1])
            for t in config["available_node_types"].values()}
    aws |= {("SSM parameter", n) for c in config["initialization_commands"] for n in re.findall(r"--name (/\S+)", c)}
    for kind, name in aws:
        if not any(r["kind"] == kind and r["name"] == name for r in listed):
            missing.append(f"cluster-aws.yaml: {kind} {name!r}")
    assert not missing, "named but neither in deploy/ nor in deploy/README.md's prerequisites:\n" + "\n".join(missing)


def _available_before(path: Path, seen: frozenset = frozenset()) -> set[tuple[str, str, str]]:
    """What exists when the file's header reaches `kubectl apply -f` of the file itself."""
    made: set[tuple[str, str, str]] = set()
    for verb, ns, arg, _ in steps(header(path)):
        if verb == "create namespace":
            made.add(("Namespace", "", arg))
        elif verb == "create secret generic":
            made.add(("Secret", ns, arg))
        elif arg == f"deploy/kuberay/{path.name}":
            return made
        else:
            other = ROOT / arg
            assert other.is_file(), f"{path.name}'s header applies {arg}, which does not exist"
            assert other not in seen, f"{path.name}'s header: {arg} applies in a circle"
            made |= _available_before(other, seen | {path})
            made |= {(d["kind"], namespace(d), d["metadata"]["name"]) for d in docs(other)}
            made |= {("Secret", ns2, a) for v, ns2, a, _ in steps(header(other)) if v == "create secret generic"}
    pytest.fail(f"{path.name}'s header never applies the file itself (kubectl apply -f deploy/kuberay/{path.name})")


def test_each_header_makes_what_its_file_needs_before_applying_it():
    """Applied as each header says, in that order, nothing a file names is missing when it is applied."""
    listed_keys = {(r["namespace"], r["name"]): r["keys"] for r in prerequisites() if r["kind"] == "Secret"}
    for path in sorted(KUBERAY.glob("*.yaml")):
        available = _available_before(path)
        own = {(d["kind"], namespace(d), d["metadata"]["name"]) for d in docs(path)}
        for doc in docs(path):
            for kind, ns, name, _, optional in references(doc):
                if kind in ("Image", "StorageClass") or optional or (kind, ns, name) in own:
                    continue
                assert (kind, ns, name) in available, f"{path.name}: {kind} {name} is not made before the file"
    readme = (DEPLOY / "README.md").read_text().replace("\\\n", " ")
    texts = [(p.name, header(p)) for p in sorted(KUBERAY.glob("*.yaml"))] + [("README", readme)]
    for where, text in texts:
        for verb, ns, name, keys in steps(text):
            if verb == "create secret generic":
                assert keys and keys <= listed_keys[(ns, name)], f"{where}: Secret {name} with keys {keys}"


def test_the_ray_pods_find_the_mlflow_server_of_mlflow_yaml():
    """Every MLflow URL in the Ray files is a Service port of mlflow.yaml that its server answers for."""
    defined = defined_objects()
    deployment = defined[("Deployment", "mlflow", "mlflow")]
    allowed = mlflow_args(deployment)["allowed_hosts"].split(",")
    urls = set()
    for _, doc, spec in ray_clusters():
        for group in groups(spec):
            for container in group["template"]["spec"]["containers"]:
                urls.add(container_env(container)["MLFLOW_TRACKING_URI"]["value"])
        if doc["kind"] == "RayJob":
            urls.add(yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]["MLFLOW_TRACKING_URI"])
    assert len(urls) == 1, urls
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        service, ns = parts.hostname.split(".")[:2]
        assert parts.hostname == f"{service}.{ns}.svc.cluster.local" and not parts.username, url
        target = defined[("Service", ns, service)]
        assert parts.port in {p["port"] for p in target["spec"]["ports"]}, url
        assert any(fnmatch.fnmatch(parts.netloc, host) for host in allowed), f"{url} is not in --allowed-hosts"


# ---- the Ray pods ----

def _memory_gib(quantity: str) -> float:
    """A Kubernetes memory quantity (Ki, Mi, Gi, Ti) in GiB."""
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10}
    number, unit = re.fullmatch(r"([\d.]+)([KMGT]i)", quantity).groups()
    return float(number) * units[unit]


def test_ray_pods_have_mlflow_login_shm_and_gpus():
    for where, doc, spec in ray_clusters():
        assert spec["rayVersion"] and spec["authOptions"]["mode"] == "token", where
        head = spec["headGroupSpec"]
        assert head.get("serviceType", "ClusterIP") == "ClusterIP", f"{where}: the dashboard must not be exposed"
        assert {6379, 8265} <= {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}, where
        for group in groups(spec):
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            gpu = any("nvidia.com/gpu" in c["resources"]["limits"] for c in pod["containers"])
            assert gpu == (group is not head), f"{where}: GPUs on the workers, none on the head"
            if gpu:
                assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
            for container in pod["containers"]:
                resources = container["resources"]
                assert resources["requests"] == resources["limits"], f"{where}: Ray sizes itself by the limits"
                env = container_env(container)
                assert env["MLFLOW_TRACKING_URI"]["value"].startswith("http://"), where
                for name in MLFLOW_LOGIN:
                    ref = env[name]["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "nmt-mlflow-credentials" and "value" not in env[name], where
                mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
                shm = next((v for v in volumes.values() if mounts.get(v["name"]) == "/dev/shm"), None)
                assert shm and shm["emptyDir"]["medium"] == "Memory", f"{where}: no memory-backed /dev/shm"
                object_store = 0.3 * _memory_gib(resources["limits"]["memory"])  # Ray's default share
                assert _memory_gib(shm["emptyDir"]["sizeLimit"]) >= object_store, f"{where}: /dev/shm too small"
                if doc["kind"] != "RayService":  # data and checkpoints; the service loads models from MLflow
                    assert mounts.get("shared") == "/mnt/shared", where
                    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "nmt-shared", where


def test_rayjob_entrypoint_is_a_valid_nmt_command_with_the_configs_batch():
    from pipeline.config import load_config
    from pipeline.parser import build_parser

    for path, doc in by_kind("RayJob"):
        spec = doc["spec"]
        words = shlex.split(spec["entrypoint"])
        assert words[:3] == ["python", "-m", "pipeline"], path
        args = build_parser().parse_args(words[3:])
        config = Path(args.config.replace(IMAGE_ROOT, str(ROOT)))
        cfg, base = load_config(config, args.overrides), load_config(config)
        assert cfg.train.storage_path.startswith("/mnt/shared/") and cfg.data.output_dir.startswith("/mnt/shared/")
        assert cfg.tracking.tracking_uri == yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["MLFLOW_TRACKING_URI"]
        assert spec["shutdownAfterJobFinishes"] is True, path
        # The same tokens per update as the config: fewer GPUs accumulate more micro-batches.
        assert cfg.train.max_tokens == base.train.max_tokens, path
        assert cfg.train.num_workers * cfg.train.update_freq == base.train.num_workers * base.train.update_freq, path
        assert cfg.train.use_gpu, path
        workers = cluster_spec(doc)["workerGroupSpecs"]
        assert all(g["minReplicas"] == g["replicas"] == g["maxReplicas"] for g in workers), "a fixed-size cluster"
        gpus = sum(g["replicas"] * int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
                   for g in workers for c in g["template"]["spec"]["containers"])
        assert gpus == cfg.train.num_workers, f"{path.name}: {gpus} GPUs for {cfg.train.num_workers} workers"


# ---- Ray Serve ----

def _serve_apps() -> list[tuple[str, dict]]:
    found = [("serve_config.yaml", docs(DEPLOY / "serve_config.yaml")[0])]
    found += [(f"{p.name} serveConfigV2", yaml.safe_load(d["spec"]["serveConfigV2"]))
              for p, d in by_kind("RayService")]
    assert len(found) == 2
    return found


def test_serve_configs_validate_import_and_autoscale():
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    from pipeline.config import Config, set_value
    from pipeline.serve.service import TranslationService

    configs = _serve_apps()
    for where, config in configs:
        ServeDeploySchema.model_validate(config)
        for app in config["applications"]:
            module, _, attr = app["import_path"].partition(":")
            assert callable(getattr(importlib.import_module(module), attr)), where
            args = dict(app["args"])
            assert args.pop("tracking_uri") == "", f"{where}: the MLflow server comes from the nodes' environment"
            cfg = Config()
            for key, value in args.items():  # the same check build_app makes, without contacting MLflow
                set_value(cfg, f"serve.{key}", value)
            env = app.get("runtime_env", {}).get("env_vars", {})
            assert not any(SECRET_NAME.search(name) for name in env), f"{where}: Ray shows runtime_env to anyone"
            for deployment in app["deployments"]:
                assert deployment["name"] == TranslationService.name, where
                assert "num_replicas" not in deployment, f"{where}: replicas follow the load"
                AutoscalingConfig(**deployment["autoscaling_config"])
    assert [a["args"] for a in configs[0][1]["applications"]] == [a["args"] for a in configs[1][1]["applications"]]


def test_rayservice_has_the_gpus_its_replicas_ask_for():
    for where, doc, spec in ray_clusters():
        if doc["kind"] != "RayService":
            continue
        assert spec["enableInTreeAutoscaling"] is True, f"{where}: Serve's replicas need pods to grow into"
        gpu_groups = [g for g in spec["workerGroupSpecs"]
                      if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]]
        for app in yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]:
            for deployment in app["deployments"]:
                options, scaling = deployment["ray_actor_options"], deployment["autoscaling_config"]
                assert options["num_gpus"] == 1, where
                limits = [g["template"]["spec"]["containers"][0]["resources"]["limits"] for g in gpu_groups]
                capacity = sum(g["maxReplicas"] * int(lim["nvidia.com/gpu"]) for g, lim in zip(gpu_groups, limits))
                assert scaling["max_replicas"] * options["num_gpus"] <= capacity, where
                assert all(int(lim["cpu"]) >= options["num_cpus"] for lim in limits), where
                assert scaling["min_replicas"] <= sum(g["minReplicas"] for g in gpu_groups), where


# ---- locked down for a shared Kubernetes cluster ----

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where a pod's API token is mounted


def test_each_ray_cluster_has_a_token_secret_of_its_own():
    """A job holds its own cluster's token only: it cannot submit to another cluster or redeploy the service."""
    readme = steps((DEPLOY / "README.md").read_text().replace("\\\n", " "))
    secrets = {}
    for path, doc in objects():
        if doc["kind"] not in RAY_KINDS:
            continue
        auth = cluster_spec(doc)["authOptions"]
        secret = auth["secretName"]
        assert auth["mode"] == "token" and secret == f"{doc['metadata']['name']}-ray-token", path.name
        secrets[path.name] = secret
        # The header, and deploy/README.md before applying the file, make this token and no other cluster's.
        made = {arg for verb, _, arg, _ in steps(header(path)) if verb == "create secret generic"}
        assert {s for s in made if s.endswith("-ray-token")} == {secret}, path.name
        applied = readme.index(("apply -f", "", f"deploy/kuberay/{path.name}", set()))
        tokens = [arg for verb, _, arg, _ in readme[:applied] if verb == "create secret generic" and "ray-token" in arg]
        assert tokens and tokens[-1] == secret, f"deploy/README.md applies {path.name} after making {tokens}"
    assert len(set(secrets.values())) == len(secrets) == 3, secrets


def _dockerfile_user() -> tuple[int, int]:
    """The uid and gid of deploy/Dockerfile's last USER, which must be numeric for runAsNonRoot to be checked."""
    users = re.findall(r"^USER (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert users and re.fullmatch(r"\d+:\d+", users[-1]), f"deploy/Dockerfile's USER {users[-1:]}: uid:gid in numbers"
    uid, gid = map(int, users[-1].split(":"))
    return uid, gid


def test_pods_run_as_a_non_root_user_without_privileges():
    """Every pod, Ray and MLflow: non-root (the Ray pods as the image's user), RuntimeDefault seccomp, no capability."""
    uid, gid = _dockerfile_user()
    assert uid != 0
    pods = [(f"{p.name} {d['kind']}", d, pod) for p, d in objects() for pod in pod_specs(d)]
    assert {d["kind"] for _, d, _ in pods} == {*RAY_KINDS, "Deployment"}
    for where, doc, pod in pods:
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        if doc["kind"] in RAY_KINDS:
            assert (context["runAsUser"], context.get("runAsGroup")) == (uid, gid), f"{where}: not the image's user"
        for container in containers(pod):
            _assert_unprivileged(container.get("securityContext", {}), f"{where} {container['name']}")
    for where, _, spec in ray_clusters():
        if spec.get("enableInTreeAutoscaling"):  # KubeRay injects the sidecar with autoscalerOptions' securityContext
            _assert_unprivileged(spec["autoscalerOptions"].get("securityContext", {}), f"{where} autoscaler")


def _assert_unprivileged(security: dict, where: str) -> None:
    assert security.get("allowPrivilegeEscalation") is False, f"{where}: the image's user may sudo"
    assert security.get("capabilities", {}).get("drop") == ["ALL"], where
    assert not security["capabilities"].get("add") and not security.get("privileged"), where
    assert security.get("runAsUser") != 0, where


def test_only_the_autoscaler_sidecar_holds_a_kubernetes_api_token():
    """KubeRay's autoscaler role may patch every pod and RayCluster of the namespace: no Ray container may hold it."""
    import ray.autoscaler

    provider = Path(ray.autoscaler.__file__).parent / "_private" / "kuberay" / "node_provider.py"
    assert f'IN_CLUSTER_TOKEN_PATH = "{SERVICE_ACCOUNT_DIR}/token"' in provider.read_text(), "Ray reads it elsewhere"
    for path, doc in objects():
        for pod in pod_specs(doc):
            where = f"{path.name} {doc['kind']}"
            assert pod.get("automountServiceAccountToken") is False, f"{where}: the kubelet would mount the token"
            tokens = {v["name"] for v in pod.get("volumes", [])
                      if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))}
            for container in containers(pod):
                assert not {m["name"] for m in container.get("volumeMounts", [])} & tokens, where
    for where, _, spec in ray_clusters():
        head = spec["headGroupSpec"]["template"]["spec"]
        volumes = {v["name"]: v for v in head.get("volumes", [])}
        mounts = spec.get("autoscalerOptions", {}).get("volumeMounts", [])
        if not spec.get("enableInTreeAutoscaling"):
            assert not mounts, where
            continue
        # The sidecar gets what the kubelet would have mounted: the token, the cluster's CA and the namespace.
        [mount] = [m for m in mounts if m["mountPath"] == SERVICE_ACCOUNT_DIR]
        assert mount.get("readOnly") is True, where
        sources = volumes[mount["name"]]["projected"]["sources"]
        assert {"serviceAccountToken": {"path": "token"}} in sources, where
        assert {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in sources


# The NetworkPolicies, evaluated as Kubernetes does for a connection from one pod to another. The Ray
# files go to kubectl's current namespace: here the one kuberay/mlflow.yaml's policy names.
RAY_NAMESPACE = "default"
RAY_PORTS = (6379, 8265, 10001, 8000, 8076, 52365, 23456)  # GCS, dashboard, client, Serve, objects, agent, a worker
CONTROL_PORTS = (8265, 6379, 10001)  # dashboard and Jobs API, GCS, Ray client
OTHER_NAMESPACE = "team-b"
PLAIN_POD = {"app.kubernetes.io/name": "notebook"}
ADMIN_POD = {"nmt-admin": "true"}
GATEWAY_POD = {"nmt-client": "true"}
MLFLOW_CLIENT_POD = {"nmt-mlflow-client": "true"}
INGRESS_CONTROLLER = ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})


@functools.cache
def _network_policies() -> tuple[dict, ...]:
    return tuple(d for _, d in by_kind("NetworkPolicy"))


def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, f"{selector}: matchExpressions are not evaluated here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _admitted(source: tuple[str, dict], target: tuple[str, dict], port: int) -> bool:
    """Whether a pod (namespace, labels) may open a TCP connection to another pod's port under the policies here."""
    (source_ns, source_labels), (target_ns, target_labels) = source, target
    policies = [d for d in _network_policies() if (namespace(d) or RAY_NAMESPACE) == target_ns
                and "Ingress" in d["spec"]["policyTypes"] and _selects(d["spec"]["podSelector"], target_labels)]
    if not policies:
        return True  # a pod no policy selects accepts everything
    for rule in (rule for policy in policies for rule in policy["spec"].get("ingress", [])):
        ports = rule.get("ports", [])
        assert all(isinstance(p["port"], int) and p.get("protocol", "TCP") == "TCP" for p in ports), ports
        if ports and port not in {p["port"] for p in ports}:
            continue
        for peer in rule.get("from", [{"namespaceSelector": {}}]):
            assert "ipBlock" not in peer, peer
            in_namespace = (_selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source_ns})
                            if "namespaceSelector" in peer else source_ns == target_ns)
            if in_namespace and _selects(peer.get("podSelector", {}), source_labels):
                return True
    return False


def _ray_pods(doc: dict) -> list[tuple[dict, dict]]:
    """(pod spec, labels) of the Ray pods KubeRay makes: the template's labels over its own (common/pod.go labelPod)."""
    spec = cluster_spec(doc)
    cluster = doc["metadata"]["name"] + ("" if doc["kind"] == "RayCluster" else "-x7k2p")  # a RayJob's: a suffix
    pods = []
    for group in groups(spec):
        node_type, name = ("head", "headgroup") if group is spec["headGroupSpec"] else ("worker", group["groupName"])
        labels = {"ray.io/is-ray-node": "yes", "ray.io/cluster": cluster, "ray.io/node-type": node_type,
                  "ray.io/group": name, "app.kubernetes.io/name": "kuberay",
                  "app.kubernetes.io/created-by": "kuberay-operator"}
        pods.append((group["template"]["spec"], {**labels, **group["template"]["metadata"].get("labels", {})}))
    return pods


def _operator_pod() -> dict:
    """The KubeRay operator's pod labels (its Helm chart), installed in the namespace of the Ray files (step 2)."""
    [operator] = [r["name"] for r in prerequisites() if r["kind"] == "Operator"]
    return {"app.kubernetes.io/name": operator, "app.kubernetes.io/instance": operator}


def _submitter_pod(doc: dict) -> dict:
    """The labels of a RayJob's submitter pod: its template's and those KubeRay adds (rayjob_controller.go)."""
    labels = doc["spec"].get("submitterPodTemplate", {}).get("metadata", {}).get("labels", {})
    return {**labels, "ray.io/originated-from-cr-name": doc["metadata"]["name"],
            "ray.io/originated-from-crd": "RayJob", "app.kubernetes.io/created-by": "kuberay-operator"}


def test_ray_pods_reach_their_own_cluster_on_every_port_and_nothing_reaches_them_from_another():
    clusters = {where: _ray_pods(doc) for where, doc, _ in ray_clusters()}
    for where, pods in clusters.items():
        for (_, a), (_, b) in itertools.product(pods, repeat=2):
            for port in RAY_PORTS:
                assert _admitted((RAY_NAMESPACE, a), (RAY_NAMESPACE, b), port), f"{where}: Ray's port {port}"
                assert not _admitted((OTHER_NAMESPACE, a), (RAY_NAMESPACE, b), port), f"{where}: a look-alike pod"
                assert not _admitted((RAY_NAMESPACE, PLAIN_POD), (RAY_NAMESPACE, b), port), where
        for other, other_pods in clusters.items():
            for (_, a), (_, b) in itertools.product(other_pods, pods):
                if other != where:
                    assert not any(_admitted((RAY_NAMESPACE, a), (RAY_NAMESPACE, b), p) for p in RAY_PORTS), \
                        f"{other} reaches {where}"


def test_ray_control_ports_admit_only_an_admin_pod_the_operator_and_the_jobs_submitter():
    """Dashboard and Jobs API, GCS, client: the labelled admin pod; the operator and submitter where KubeRay calls."""
    operator = _operator_pod()
    for where, doc, _ in ray_clusters():
        head = (RAY_NAMESPACE, _ray_pods(doc)[0][1])
        ports = {p["containerPort"] for p in _ray_pods(doc)[0][0]["containers"][0]["ports"]}
        assert set(CONTROL_PORTS) <= ports, where
        for port in CONTROL_PORTS:
            assert _admitted((RAY_NAMESPACE, ADMIN_POD), head, port), f"{where}: an admin pod on {port}"
            assert not _admitted((OTHER_NAMESPACE, ADMIN_POD), head, port), f"{where}: the admin label elsewhere"
            for client in (PLAIN_POD, GATEWAY_POD, MLFLOW_CLIENT_POD):
                assert not _admitted((RAY_NAMESPACE, client), head, port), f"{where}: {client} on {port}"
            # The operator follows a RayJob and deploys a RayService through the dashboard; nothing else.
            assert _admitted((RAY_NAMESPACE, operator), head, port) == (
                port == 8265 and doc["kind"] in ("RayJob", "RayService")), f"{where}: the operator on {port}"
            assert not _admitted((OTHER_NAMESPACE, operator), head, port), where
        for _, job, _ in ray_clusters():
            if job["kind"] == "RayJob":  # its submitter runs `ray job submit` against its own head only
                submitter = (RAY_NAMESPACE, _submitter_pod(job))
                own = job["metadata"]["name"] == doc["metadata"]["name"] and doc["kind"] == "RayJob"
                assert _admitted(submitter, head, 8265) == own, f"{where}: the submitter of {job['metadata']['name']}"
                assert not _admitted(submitter, head, 6379), where


def test_serve_port_admits_the_labelled_gateway_and_the_ingress_controller_only():
    operator = _operator_pod()
    serving = 0
    for where, doc, _ in ray_clusters():
        for index, (pod, labels) in enumerate(_ray_pods(doc)):
            if 8000 not in {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}:
                continue
            serving += 1
            target = (RAY_NAMESPACE, labels)
            assert _admitted((RAY_NAMESPACE, GATEWAY_POD), target, 8000), f"{where}: your gateway"
            assert _admitted(INGRESS_CONTROLLER, target, 8000), f"{where}: the ingress controller"
            assert not _admitted((OTHER_NAMESPACE, GATEWAY_POD), target, 8000), f"{where}: the label elsewhere"
            for client in (PLAIN_POD, ADMIN_POD, MLFLOW_CLIENT_POD):
                assert not _admitted((RAY_NAMESPACE, client), target, 8000), f"{where}: {client}"
            for port in CONTROL_PORTS:
                assert not _admitted((RAY_NAMESPACE, GATEWAY_POD), target, port), f"{where}: the gateway on {port}"
                assert not _admitted(INGRESS_CONTROLLER, target, port), f"{where}: the ingress controller on {port}"
            # KubeRay checks the service head's Serve proxy before sending it traffic.
            if doc["kind"] == "RayService" and index == 0:
                assert _admitted((RAY_NAMESPACE, operator), target, 8000), where
    assert serving >= 3, "the RayService's head and workers and the RayCluster's head serve"


def test_mlflow_admits_the_ray_pods_and_labelled_clients_only():
    defined = defined_objects()
    deployment = defined[("Deployment", "mlflow", "mlflow")]
    server = ("mlflow", deployment["spec"]["template"]["metadata"]["labels"])
    [port] = [p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]]
    for where, doc, _ in ray_clusters():
        for _, labels in _ray_pods(doc):
            assert _admitted((RAY_NAMESPACE, labels), server, port), f"{where}: a Ray pod"
            assert not _admitted((OTHER_NAMESPACE, labels), server, port), f"{where}: a look-alike in another namespace"
    assert _admitted((RAY_NAMESPACE, MLFLOW_CLIENT_POD), server, port)
    assert not _admitted((OTHER_NAMESPACE, MLFLOW_CLIENT_POD), server, port)
    for client in (PLAIN_POD, ADMIN_POD, GATEWAY_POD, _submitter_pod(by_kind("RayJob")[0][1])):
        assert not _admitted((RAY_NAMESPACE, client), server, port), client
    assert not _admitted(INGRESS_CONTROLLER, server, port)
