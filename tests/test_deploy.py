"""Every YAML file in deploy/ parses and has what its tool needs: schemas where a validator exists, else by hand.

- the cluster launcher file against Ray's own schema (ray/autoscaler/ray-schema.json);
- the Serve config against Ray Serve's ServeDeploySchema, and its import_path imports;
- KubeRay manifests by hand (no CRD schema ships in a package), their Kubernetes parts (pod
  templates, volume claims) against the Kubernetes schema when kubernetes-validate is installed;
- every nmt command in them (RayJob entrypoint) parses and its config overrides load.
"""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import pytest
import yaml
from small import ROOT

DEPLOY = ROOT / "deploy"
IMAGE_ROOT = "/home/ray/nmt"  # where deploy/Dockerfile puts the project


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _by_kind(kind: str) -> list[tuple[Path, dict]]:
    return [(p, d) for p in sorted(DEPLOY.rglob("*.yaml")) for d in _docs(p) if d.get("kind") == kind]


def test_every_yaml_parses_and_is_known():
    files = sorted(DEPLOY.rglob("*.y*ml"))
    assert {p.relative_to(DEPLOY).as_posix() for p in files} >= {
        "cluster-aws.yaml", "serve_config.yaml", "kuberay/raycluster.yaml", "kuberay/rayjob.yaml"}
    for path in files:
        for doc in _docs(path):
            assert isinstance(doc, dict), path
            assert ("kind" in doc) != ("cluster_name" in doc or "applications" in doc), path


def test_cluster_launcher_matches_rays_schema():
    import jsonschema
    import ray.autoscaler

    config = _docs(DEPLOY / "cluster-aws.yaml")[0]
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    assert config["provider"]["type"] == "aws" and config["provider"]["region"]
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    gpu = [t for name, t in types.items() if name != config["head_node_type"] and t["resources"].get("GPU", 0) > 0]
    assert gpu and all(t["max_workers"] >= 1 and t["node_config"]["InstanceType"] for t in gpu)
    assert sum(t["max_workers"] for t in gpu) <= config["max_workers"]
    run_options = " ".join(config["docker"]["run_options"])
    assert "RAY_AUTH_MODE=token" in run_options and "MLFLOW_TRACKING_URI=" in run_options
    assert any("--head" in c for c in config["head_start_ray_commands"])


def test_serve_config_validates_and_imports():
    from ray.serve.schema import ServeDeploySchema

    from pipeline.config import Config, set_value
    from pipeline.serve.service import TranslationService

    config = _docs(DEPLOY / "serve_config.yaml")[0]
    schema = ServeDeploySchema.model_validate(config)
    assert schema.applications
    for app in config["applications"]:
        module, _, attr = app["import_path"].partition(":")
        builder = getattr(importlib.import_module(module), attr)
        assert callable(builder)
        args = dict(app["args"])
        args.pop("tracking_uri")
        cfg = Config()
        for key, value in args.items():  # the same check build_app makes, without contacting MLflow
            set_value(cfg, f"serve.{key}", value)
        names = {d["name"] for d in app.get("deployments", [])}
        assert names <= {TranslationService.name}, names
        assert "MLFLOW_TRACKING_URI" in app["runtime_env"]["env_vars"]


def _cluster_specs() -> list[tuple[str, dict]]:
    specs = [(f"{p.name} RayCluster", d["spec"]) for p, d in _by_kind("RayCluster")]
    specs += [(f"{p.name} RayJob", d["spec"]["rayClusterSpec"]) for p, d in _by_kind("RayJob")]
    assert specs
    return specs


def _containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def test_kuberay_clusters_have_head_and_gpu_workers():
    for where, spec in _cluster_specs():
        assert spec["rayVersion"].startswith("2.") and spec["authOptions"]["mode"] == "token", where
        head = spec["headGroupSpec"]
        assert "rayStartParams" in head and _containers(head)[0]["image"], where
        ports = {p["containerPort"] for p in _containers(head)[0].get("ports", [])}
        assert {6379, 8265} <= ports, where
        groups = spec["workerGroupSpecs"]
        assert groups, where
        for group in groups:
            assert group["groupName"] and "rayStartParams" in group, where
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
            for container in _containers(group):
                limits = container["resources"]["limits"]
                assert int(limits["nvidia.com/gpu"]) >= 1, where
        for group in [head, *groups]:
            for container in _containers(group):
                assert container["name"] and container["image"], where
                assert "MLFLOW_TRACKING_URI" in {e["name"] for e in container.get("env", [])}, where
                mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
                assert mounts.get("shared") == "/mnt/shared", where  # checkpoints on a shared volume
            volumes = {v["name"]: v for v in group["template"]["spec"].get("volumes", [])}
            assert volumes["shared"]["persistentVolumeClaim"]["claimName"], where


def test_kuberay_manifests_have_kubernetes_metadata():
    for kind in ("RayCluster", "RayJob"):
        found = _by_kind(kind)
        assert found, kind
        for path, doc in found:
            assert doc["apiVersion"] == "ray.io/v1", path
            assert doc["metadata"]["name"] and doc["spec"], path


def test_rayjob_entrypoint_is_a_valid_nmt_command():
    from pipeline.cli import build_parser
    from pipeline.config import load_config

    for path, doc in _by_kind("RayJob"):
        spec = doc["spec"]
        words = shlex.split(spec["entrypoint"])
        assert words[:3] == ["python", "-m", "pipeline"], path
        args = build_parser().parse_args(words[3:])
        config = Path(args.config.replace(IMAGE_ROOT, str(ROOT)))
        cfg = load_config(config, args.overrides)
        assert cfg.train.storage_path.startswith(("/mnt/shared", "s3://", "gs://")), path
        assert cfg.data.output_dir.startswith(("/mnt/shared", "s3://", "gs://")), path
        assert cfg.tracking.tracking_uri.startswith("http"), path
        assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["MLFLOW_TRACKING_URI"], path
        assert spec["shutdownAfterJobFinishes"] is True, path


def test_kubernetes_parts_match_the_kubernetes_schema():
    """Pod templates and plain Kubernetes objects against the API schema (strict: unknown fields fail)."""
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.latest_version()
    plain = [d for p in sorted((DEPLOY / "kuberay").glob("*.yaml")) for d in _docs(p)
             if not d["apiVersion"].startswith("ray.io/")]
    assert plain  # the shared volume's claim
    for doc in plain:
        kv.validate(doc, version, strict=True)
    for where, spec in _cluster_specs():
        for i, group in enumerate([spec["headGroupSpec"], *spec["workerGroupSpecs"]]):
            template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"group-{i}"},
                        "template": group["template"]}
            try:
                kv.validate(template, version, strict=True)
            except kv.ValidationError as err:
                pytest.fail(f"{where} group {i}: {str(err).splitlines()[0]}")
