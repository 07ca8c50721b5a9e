"""deploy/ as a whole: every file known and parsing, no credential in any, versions and images agreed.

- every file under deploy/ is one a test knows, and parses;
- no file holds a credential: secret-looking variables come from Secrets, URLs carry no user:password@;
- versions agree: Ray (image, rayVersion, installed), CUDA (image tag, torch index), torch (Makefile),
  MLflow (server image, installed client); images are pinned, the project's to its version;
- the `nmt` commands of deploy/'s guides parse and the files they name exist.

The rest is by file: test_deploy_kuberay.py (Kubernetes and KubeRay), test_deploy_kuberay_security.py
(their lock-down), test_deploy_mlflow.py (the MLflow server), test_deploy_aws.py (the cluster launcher);
deploy_files.py reads deploy/ for all of them.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml
from deploy_files import (
    DEPLOY,
    MLFLOW_SERVER,
    SECRET_NAME,
    by_kind,
    containers,
    defined_objects,
    docs,
    mlflow_container,
    objects,
    pod_specs,
    ray_clusters,
    references,
)
from small import ROOT


def test_every_file_parses_and_is_known():
    files = {p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*") if p.is_file()}
    assert files == {
        "README.md", "Dockerfile", "cluster-aws.yaml", "serve_config.yaml", "aws/ec2-trust-policy.json",
        "aws/ray-head-policy.json", "aws/ray-worker-policy.json", "kuberay/mlflow.yaml", "kuberay/storage.yaml",
        "kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "kuberay/rayservice.yaml", "kuberay/members.yaml",
        # the guides and the AWS MLflow server's files: tests/test_guide.py
        "kuberay/README.md", "aws/README.md", "aws/mlflow-server.sh", "aws/mlflow-server-policy.json",
        # the bucket's lifecycle and the members' policy: tests/test_deploy_aws.py
        "aws/bucket-lifecycle.json", "aws/member-policy.json",
        # the tracking server's image and logins: tests/test_deploy_mlflow.py, tests/test_permissions.py
        "mlflow.Dockerfile", "mlflow_users.py", "tracking-server.md",
    }, "a new file here needs tests"
    for path in DEPLOY.rglob("*.y*ml"):
        for doc in docs(path):
            assert isinstance(doc, dict), path
            assert ("kind" in doc) != ("cluster_name" in doc or "applications" in doc), path
    for path in DEPLOY.glob("aws/*-policy.json"):
        assert json.loads(path.read_text())["Version"] == "2012-10-17", path
    for path, doc in objects():
        assert doc["apiVersion"] and doc["metadata"]["name"], path
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"], path


def test_no_file_holds_a_credential():
    """Secret-looking variables come from Secrets; URLs carry no user:password@."""
    for path in sorted(DEPLOY.rglob("*.yaml")):
        assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", path.read_text()), f"{path.name}: a URL with a password"
    for path, doc in objects():
        assert doc["kind"] != "Secret", f"{path.name}: Secrets are made with kubectl create secret, not committed"
        for pod in pod_specs(doc):
            for container in containers(pod):
                for var in container.get("env", []):
                    if SECRET_NAME.search(var["name"]):
                        assert "valueFrom" in var, f"{path.name}: {var['name']} has a literal value"
    for _, doc in by_kind("RayJob"):
        env = yaml.safe_load(doc["spec"]["runtimeEnvYAML"]).get("env_vars", {})
        assert not any(SECRET_NAME.search(name) for name in env), "Ray shows a job's runtime_env to anyone"


# ---- versions ----

def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M))


def _project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def _tested_releases() -> dict[str, str]:
    """constraints.txt's pins: package name -> the release this project is tested with."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def test_versions_agree_ray_cuda_torch_mlflow():
    """One Ray, one CUDA, one torch, one MLflow: constraints.txt's, the images', the manifests', the installed."""
    import mlflow
    import ray
    import torch
    from packaging.specifiers import SpecifierSet

    tested = _tested_releases()
    assert set(tested) == {"ray", "mlflow", "torch"}, tested
    # make setup installs with these pins, so a release of MLflow or Ray after they were checked changes nothing.
    installed = {"ray": ray.__version__, "mlflow": mlflow.__version__, "torch": torch.__version__.split("+")[0]}
    assert installed == tested, "this environment is not the tested one: make setup installs with constraints.txt"
    makefile = (ROOT / "Makefile").read_text()
    assert '-m pip install --quiet -c constraints.txt -e ".[dev]"' in makefile
    args, dockerfile = _dockerfile_args(), (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-py311-\$\{CUDA_TAG\}$", dockerfile, re.M)
    assert (args["RAY_VERSION"], args["TORCH_VERSION"]) == (tested["ray"], tested["torch"])
    ray_requirement = re.search(r'"ray\[[^\]]*\]([^"]*)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert tested["ray"] in SpecifierSet(ray_requirement)
    for where, _, spec in ray_clusters():
        assert spec["rayVersion"] == tested["ray"], where
    # The torch build of the Makefile's GPU instructions, from the index of the image's CUDA.
    gpu = re.search(r"GPU machines: make setup TORCH_INDEX=(\S+)", makefile)
    assert gpu and "TORCH_SPEC ?= $(shell grep '^torch==' constraints.txt)" in makefile
    assert gpu.group(1) == f"https://download.pytorch.org/whl/{args['CUDA_TAG']}"
    assert '"torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${CUDA_TAG}"' in dockerfile
    assert "-c constraints.txt -e ." in dockerfile and "constraints.txt ./" in dockerfile, "pin the image's install"
    # The MLflow server is the client's release: deploy/mlflow.Dockerfile's, built on MLflow's image of it.
    image = mlflow_container(defined_objects()[MLFLOW_SERVER])["image"]
    built = re.search(r"^ARG MLFLOW_VERSION=(\S+)$", (DEPLOY / "mlflow.Dockerfile").read_text(), re.M).group(1)
    assert image == f"REGISTRY/nmt-mlflow:{built}" and built == tested["mlflow"], (image, built)
    for guide in (DEPLOY / "aws/README.md", DEPLOY / "kuberay/README.md", DEPLOY / "aws/mlflow-server.sh"):
        tags = set(re.findall(r"nmt-mlflow:(\S+?)[\s\"`]", guide.read_text()))
        assert tags == {built}, (guide, tags)


def test_images_are_pinned_and_the_same_everywhere():
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    images = {ref[2] for path, doc in objects() for ref in references(doc) if ref[0] == "Image"}
    images.add(config["docker"]["image"])
    version = _project_version()
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, f"{image}: pin a version"
        if name.endswith("/transformer-nmt"):
            assert tag == version, f"{image}: the project's image is tagged with its version, {version}"
    assert sum(i.endswith("/transformer-nmt:" + version) for i in images) == 2, "REGISTRY/... and its ECR copy"


def test_readme_commands_parse_and_its_paths_exist():
    from pipeline.parser import build_parser

    text = "\n".join(p.read_text() for p in sorted(DEPLOY.rglob("*.md")))  # the index and the platform guides
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.startswith("nmt ")]
    assert len(lines) >= 5
    operators = {">", ">>", "<", "|", "&&", "||", ";", "&"}
    for line in lines:
        words = shlex.split(line, comments=True)[1:]
        args = words[:next((i for i, w in enumerate(words) if w in operators), len(words))]
        commands = [args] + ([args[args.index("--") + 1:]] if args[0] == "submit" else [])
        for command in commands:
            try:
                build_parser().parse_args(command)
            except SystemExit:
                pytest.fail(f"deploy/'s guides: `nmt {shlex.join(command)}` does not parse")
    paths = {p.rstrip(".,:;") for p in re.findall(r"deploy/[^\s`'\"()]+", text) if "$" not in p}
    # Files (a name with an extension, Dockerfile, a glob) or folders; not kubectl's deploy/NAME.
    paths = {p for p in paths if re.search(r"[.*][^/]*$|/Dockerfile$|/$", p)}
    missing = sorted(p for p in paths if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()))
    assert not missing, f"deploy/'s guides name files that do not exist: {missing}"
