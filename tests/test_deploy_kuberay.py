"""deploy/kuberay applies as written: each object against its schema, every name it uses defined, the pods complete.

- Kubernetes objects against the Kubernetes API schemas (kubernetes-validate, strict: an unknown field
  fails), for the oldest Kubernetes the README supports and the newest one shipped: built-in kinds whole,
  the pod templates inside KubeRay's custom resources as PodTemplates;
- RayCluster, RayJob and RayService against KubeRay's own CRD schemas (tests/data/kuberay/, KubeRay
  v1.7.0, strict like `kubectl apply`), plus the operator's admission checks that apply to them;
- every image, Secret (and key), claim, ConfigMap, ServiceAccount, namespace and storage class a file
  names is made by a file here or listed as a prerequisite in its platform guide (so are cluster-aws.yaml's
  image, instance profiles and SSM parameters), and each file's header creates and applies what the file
  needs before the file itself;
- the Ray pods: MLflow's address and login (from a Secret), /dev/shm, GPUs and tolerations; the
  RayJob's nmt command parses, its config loads and its batch is the config's (update_freq);
- the Serve configs against Ray Serve's schema (autoscaling), their import_path imports, args load; the
  RayService has the GPUs its replicas ask for.

How they are locked down for a shared Kubernetes cluster: tests/test_deploy_kuberay_security.py.
"""

from __future__ import annotations

import fnmatch
import importlib
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
    MLFLOW_SERVER,
    RAY_KINDS,
    SECRET_NAME,
    by_kind,
    cluster_spec,
    container_env,
    defined_objects,
    docs,
    groups,
    header,
    mlflow_args,
    namespace,
    objects,
    prerequisites,
    ray_clusters,
    ray_pod_templates,
    references,
    steps,
)
from small import ROOT

CRD_SCHEMAS = ROOT / "tests" / "data" / "kuberay"
KUBERAY_VERSION = "1.7.0"  # of the CRD schemas there and of the operator deploy/kuberay/README.md installs
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
    assert {d["kind"] for _, d in plain} >= {"PersistentVolumeClaim", "StatefulSet", "Service", "ConfigMap",
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
    assert f"kuberay/kuberay-operator --version {KUBERAY_VERSION}" in (KUBERAY / "README.md").read_text()
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
    assert not missing, "named but neither in deploy/ nor in the guides' prerequisites:\n" + "\n".join(missing)


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
    readme = (KUBERAY / "README.md").read_text().replace("\\\n", " ")
    texts = [(p.name, header(p)) for p in sorted(KUBERAY.glob("*.yaml"))] + [("README", readme)]
    for where, text in texts:
        for verb, ns, name, keys in steps(text):
            if verb == "create secret generic":
                assert keys and keys <= listed_keys.get((ns, name), set()), \
                    f"{where}: Secret {name} with keys {keys}, which the README's prerequisites table does not list"


def test_the_ray_pods_find_the_mlflow_server_of_mlflow_yaml():
    """Every MLflow URL in the Ray files is a Service port of mlflow.yaml that its server answers for."""
    defined = defined_objects()
    deployment = defined[MLFLOW_SERVER]
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
                for name in MLFLOW_LOGIN:  # the serving login; a RayJob's run has its owner's (security tests)
                    ref = env[name]["valueFrom"]["secretKeyRef"]
                    assert "value" not in env[name] and (ref["name"] == "nmt-mlflow-credentials") == (
                        doc["kind"] != "RayJob"), where
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
    # The same service; each file names its own model (serve_config.yaml the platform guides' first champion,
    # the RayService the WMT14 recipe's).
    same = [[{k: v for k, v in a["args"].items() if k != "model_uri"} for a in c["applications"]] for _, c in configs]
    assert same[0] == same[1]
    assert all(a["args"]["model_uri"].endswith("@champion") for _, c in configs for a in c["applications"])


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


def test_the_spot_group_takes_spot_nodes_of_gke_eks_and_aks_not_gke_alone():
    (cluster,) = [d for _, d in by_kind("RayCluster")]
    (spot,) = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu-spot"]
    pod = spot["template"]["spec"]
    assert "nodeSelector" not in pod, "a nodeSelector names one cloud's label: the others' spot nodes never match"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for term in terms for e in term["matchExpressions"]}
    assert {"cloud.google.com/gke-spot", "eks.amazonaws.com/capacityType", "kubernetes.azure.com/scalesetpriority"} \
        == keys
