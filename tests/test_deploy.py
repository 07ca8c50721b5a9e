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


def test_versions_agree_ray_cuda_torch_mlflow():
    """One Ray, one CUDA, one torch, one MLflow: the image's, the manifests', the Makefile's and the tested ones."""
    import mlflow
    import ray
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    args, dockerfile = _dockerfile_args(), (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-py311-\$\{CUDA_TAG\}$", dockerfile, re.M)
    assert args["RAY_VERSION"] == ray.__version__, "the image's Ray is the one the project is tested with"
    ray_requirement = re.search(r'"ray\[[^\]]*\]([^"]*)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert args["RAY_VERSION"] in SpecifierSet(ray_requirement)
    for where, _, spec in ray_clusters():
        assert spec["rayVersion"] == args["RAY_VERSION"], where
    # The torch build of the Makefile's GPU instructions, from the index of the image's CUDA.
    makefile = (ROOT / "Makefile").read_text()
    gpu = re.search(r"GPU machines: make setup TORCH_INDEX=(\S+)", makefile)
    torch_spec = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", makefile, re.M)
    assert gpu and torch_spec, "the Makefile's GPU instructions moved: update this test"
    assert args["TORCH_VERSION"] == torch_spec.group(1)
    assert gpu.group(1) == f"https://download.pytorch.org/whl/{args['CUDA_TAG']}"
    assert '"torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${CUDA_TAG}"' in dockerfile
    assert "-c /tmp/pins.txt -e ." in dockerfile, "the project's install must not replace Ray or torch"
    # The MLflow server speaks the same release series as the client the project is tested with.
    # Its image is deploy/mlflow.Dockerfile's, built on MLflow's release image of the same version.
    image = mlflow_container(defined_objects()[MLFLOW_SERVER])["image"]
    server = re.fullmatch(r"REGISTRY/nmt-mlflow:(\d+\.\d+\.\d+)", image)
    assert server, f"{image}: the image of deploy/mlflow.Dockerfile"
    built = re.search(r"^ARG MLFLOW_VERSION=(\S+)$", (DEPLOY / "mlflow.Dockerfile").read_text(), re.M).group(1)
    assert server.group(1) == built, (image, built)
    assert Version(built).release[:2] == Version(mlflow.__version__).release[:2], image


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
