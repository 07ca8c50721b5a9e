"""deploy/cluster-aws.yaml and deploy/aws/: the cluster launcher against Ray's own schema, its AMI and IAM policies.

The policies keep the autoscaler's EC2 rights as Ray's AWS provider uses them, on this cluster's workers
only (the tags Ray puts on each), and add the bucket, the image and the SSM parameters the launcher reads.
Every job holds its node's role (the containers use the host's network), so each role is checked as what
any member's job may do: launch only into the named subnets and security group, never destroy a version of
the bucket's objects; and members reach the MLflow server and the head by port forwarding alone.
"""

from __future__ import annotations

import fnmatch
import json
import re
import urllib.parse
from pathlib import Path

import jsonschema
import yaml
from deploy_files import DEPLOY, docs, header
from small import ROOT


def _ray_aws_source(module: str) -> str:
    """A module of Ray's AWS provider, read as text: importing it needs boto3, which this project does not."""
    import ray.autoscaler

    return (Path(ray.autoscaler.__file__).parent / "_private" / "aws" / f"{module}.py").read_text()


def test_cluster_launcher_matches_rays_schema_and_pins_its_ami():
    import ray.autoscaler

    default_amis = set(re.findall(r'"(ami-[0-9a-f]+)"', _ray_aws_source("config").split("DEFAULT_AMI = {")[1]
                                  .split("}")[0]))
    assert default_amis, "Ray's DEFAULT_AMI moved: update this test"
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    assert config["provider"]["type"] == "aws" and config["provider"]["region"]
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    gpu = [t for name, t in types.items() if name != config["head_node_type"] and t["resources"].get("GPU", 0) > 0]
    assert gpu and all(t["max_workers"] >= 1 and t["node_config"]["InstanceType"] for t in gpu)
    assert sum(t["max_workers"] for t in gpu) <= config["max_workers"]
    for name, node_type in types.items():
        # No ImageId: Ray's DEFAULT_AMI, a Deep Learning AMI with CUDA 11 drivers, too old for the image.
        image = node_type["node_config"].get("ImageId", "")
        assert image and image.lower() != "latest_dlami" and image not in default_amis, name
        assert re.fullmatch(r"ami-[0-9a-f]+|resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
                            r"base-oss-nvidia-driver-gpu-ubuntu-22\.04/latest/ami-id", image), name
    run_options = " ".join(config["docker"]["run_options"])
    assert "RAY_AUTH_MODE=token" in run_options and "MLFLOW_TRACKING_URI=" in run_options
    env_file = re.search(r"--env-file (\S+)", run_options).group(1)
    assert any(c.rstrip().endswith(f"> {env_file}") and "umask 077" in c for c in config["initialization_commands"])
    assert any("--head" in c for c in config["head_start_ray_commands"])
    assert config["file_mounts"]["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _allows(policy: dict, action: str, resource: str, context: dict | None = None) -> bool:
    """Whether the policy allows the call: a statement allows it and none denies it (IAM's explicit deny wins)."""
    applying = [s for s in policy["Statement"] if _applies(s, action, resource, context or {})]
    return any(s["Effect"] == "Allow" for s in applying) and not any(s["Effect"] == "Deny" for s in applying)


def _denies(policy: dict, action: str, resource: str, context: dict | None = None) -> bool:
    """Whether a statement of the policy denies the call, whatever other policies of the role allow."""
    return any(s["Effect"] == "Deny" and _applies(s, action, resource, context or {}) for s in policy["Statement"])


def _applies(statement: dict, action: str, resource: str, context: dict) -> bool:
    """Whether a statement speaks to the call: its action, its resource (or not one of NotResource), its condition."""
    if not any(fnmatch.fnmatch(action, a) for a in _listed(statement["Action"])):
        return False
    if "NotResource" in statement:
        if any(fnmatch.fnmatch(resource, r) for r in _listed(statement["NotResource"])):
            return False
    elif not any(fnmatch.fnmatch(resource, r) for r in _listed(statement["Resource"])):
        return False
    return _conditions_hold(statement.get("Condition", {}), context)


def _conditions_hold(condition: dict, context: dict) -> bool:
    """Every operator's every key must match (IAM's AND); a key the request lacks matches nothing, except under
    IfExists and ForAllValues, which hold without it (as IAM evaluates them)."""
    tests = {"StringEquals": lambda have, want: have == want, "ArnEquals": lambda have, want: have == want,
             "StringLike": fnmatch.fnmatchcase, "ArnLike": fnmatch.fnmatchcase,
             "NumericLessThanEquals": lambda have, want: float(have) <= float(want),
             "Bool": lambda have, want: have.lower() == want.lower()}
    for operator, pairs in condition.items():
        every_value, _, test = operator.rpartition(":")
        test, if_exists = (test[:-len("IfExists")], True) if test.endswith("IfExists") else (test, False)
        assert test in tests and every_value in ("", "ForAllValues"), f"{operator}: not evaluated here"
        for key, values in pairs.items():
            if key not in context:
                if if_exists or every_value:
                    continue
                return False
            have = _listed(context[key]) if every_value else [context[key]]
            if not all(any(tests[test](str(h), str(v)) for v in _listed(values)) for h in have):
                return False
    return True


def _autoscaler_ec2_actions() -> set[str]:
    """The EC2 API calls of Ray's AWS node provider, which runs on the head with the head's profile."""
    source = _ray_aws_source("node_provider")
    verbs = r"\.((?:run|create|start|stop|terminate)_instances|(?:create|delete)_tags|describe_\w+)\b"
    calls = set(re.findall(verbs, source))
    calls |= {"describe_instances"} if ".instances.filter(" in source else set()
    names = {"create_instances": "RunInstances"}
    return {"ec2:" + names.get(c, "".join(w.capitalize() for w in c.split("_"))) for c in calls}


def test_aws_instance_profiles_keep_the_autoscalers_rights_and_add_the_bucket():
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    head = json.loads((DEPLOY / "aws/ray-head-policy.json").read_text())
    worker = json.loads((DEPLOY / "aws/ray-worker-policy.json").read_text())
    trust = json.loads((DEPLOY / "aws/ec2-trust-policy.json").read_text())
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    types = config["available_node_types"]
    profile = {name: t["node_config"]["IamInstanceProfile"]["Arn"] for name, t in types.items()}
    assert profile[config["head_node_type"]].endswith("instance-profile/ray-nmt-head")
    account = profile[config["head_node_type"]].split(":")[4]
    actions = _autoscaler_ec2_actions()
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreateTags", "ec2:DescribeInstances"} <= actions
    instance, tagged = _instance_and_tags(config)
    for action in actions:
        resource, context = ("*", {}) if action.startswith("ec2:Describe") else (instance, tagged)
        assert _allows(head, action, resource, context), f"the head's profile lacks {action}, which Ray calls"
    for name, arn in profile.items():
        if name != config["head_node_type"]:
            role = arn.replace(":instance-profile/", ":role/")  # the README names each role like its profile
            assert _allows(head, "iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}), \
                f"the head cannot launch {name} with {arn}"
    region = config["provider"]["region"]
    for name, node_type in types.items():
        image = node_type["node_config"]["ImageId"]
        if image.startswith("resolve:ssm:"):
            parameter = f"arn:aws:ssm:{region}::parameter{image.removeprefix('resolve:ssm:')}"
            assert _allows(head, "ssm:GetParameters", parameter), f"the head cannot resolve {name}'s AMI"
    wmt = yaml.safe_load((ROOT / "configs" / "wmt14_en_de.yaml").read_text())
    repository = config["docker"]["image"].split("/", 1)[1].split(":")[0]
    for policy in (head, worker):
        for uri in (wmt["train"]["storage_path"], wmt["data"]["output_dir"]):
            bucket, key = urllib.parse.urlsplit(uri).netloc, urllib.parse.urlsplit(uri).path.lstrip("/")
            assert _allows(policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}")
            for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
                assert _allows(policy, action, f"arn:aws:s3:::{bucket}/{key}/part-0.parquet"), (action, uri)
        for action in ("ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"):
            assert _allows(policy, action, f"arn:aws:ecr:{region}:{account}:repository/{repository}"), action
        for command in config["initialization_commands"]:
            for parameter in re.findall(r"--name (/\S+)", command):
                assert _allows(policy, "ssm:GetParameter", f"arn:aws:ssm:{region}:{account}:parameter{parameter}")
    assert not any(_allows(worker, a, "*") for a in ("ec2:RunInstances", "ec2:TerminateInstances", "iam:PassRole"))


def _instance_and_tags(config: dict) -> tuple[str, dict]:
    """An instance of the cluster's account and region, and the context of a call on one of its workers: its tags,
    the tags Ray's updater changes after a launch, and for a launch what the autoscaler asks for a worker as
    cluster-aws.yaml describes it, tagged as Ray's node launcher tags it."""
    from ray.autoscaler.tags import (
        NODE_KIND_WORKER,
        TAG_RAY_CLUSTER_NAME,
        TAG_RAY_FILE_MOUNTS_CONTENTS,
        TAG_RAY_NODE_KIND,
        TAG_RAY_NODE_STATUS,
        TAG_RAY_RUNTIME_CONFIG,
    )

    account = config["available_node_types"][config["head_node_type"]]["node_config"]["IamInstanceProfile"]["Arn"]
    instance = f"arn:aws:ec2:{config['provider']['region']}:{account.split(':')[4]}:instance/i-0123456789abcdef0"
    name = config["cluster_name"]
    [worker] = [t["node_config"] for n, t in config["available_node_types"].items() if n != config["head_node_type"]]
    assert '"ray-{}-worker".format(config["cluster_name"])' in _ray_source("node_launcher"), "Ray names workers anew"
    return instance, {f"ec2:ResourceTag/{TAG_RAY_CLUSTER_NAME}": name, f"ec2:ResourceTag/{TAG_RAY_NODE_KIND}":
                      NODE_KIND_WORKER, f"aws:RequestTag/{TAG_RAY_CLUSTER_NAME}": name,
                      f"aws:RequestTag/{TAG_RAY_NODE_KIND}": NODE_KIND_WORKER,
                      "aws:RequestTag/Name": f"ray-{name}-worker",
                      "aws:TagKeys": [TAG_RAY_NODE_STATUS, TAG_RAY_RUNTIME_CONFIG, TAG_RAY_FILE_MOUNTS_CONTENTS],
                      "ec2:InstanceType": worker["InstanceType"],
                      "ec2:InstanceProfile": worker["IamInstanceProfile"]["Arn"],
                      "ec2:MetadataHttpTokens": worker["MetadataOptions"]["HttpTokens"],
                      "ec2:MetadataHttpPutResponseHopLimit": worker["MetadataOptions"]["HttpPutResponseHopLimit"]}


def _ray_source(module: str) -> str:
    """A module of Ray's autoscaler, read as text."""
    import ray.autoscaler

    return (Path(ray.autoscaler.__file__).parent / "_private" / f"{module}.py").read_text()


def test_the_heads_ec2_rights_reach_only_its_own_clusters_instances():
    """Ray tags every node it launches ray-cluster-name=<cluster_name>: the head launches, stops, starts,
    terminates and retags only such instances, never another team's; describe calls take no resource."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    head = json.loads((DEPLOY / "aws/ray-head-policy.json").read_text())
    instance, ours = _instance_and_tags(config)
    assert '"Key": TAG_RAY_CLUSTER_NAME' in _ray_aws_source("node_provider"), "Ray no longer tags its nodes so"
    theirs = {key: "another-team" if "Tag/" in key else value for key, value in ours.items()}
    for action in ("ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances", "ec2:CreateTags",
                   "ec2:RunInstances"):
        assert _allows(head, action, instance, ours), action
        assert not _allows(head, action, instance, theirs), f"{action} on another cluster's instance"
        assert not _allows(head, action, instance), f"{action} on an untagged instance"
    # A launch names its AMI, subnet, security group, interface, volume and key pair too; those carry no tag.
    region, account = instance.split(":")[3:5]
    worker = next(t["node_config"] for n, t in config["available_node_types"].items() if n != config["head_node_type"])
    for resource in (f"arn:aws:ec2:{region}::image/ami-0abc",
                     f"arn:aws:ec2:{region}:{account}:subnet/{worker['SubnetIds'][0]}",
                     f"arn:aws:ec2:{region}:{account}:security-group/{worker['SecurityGroupIds'][0]}",
                     f"arn:aws:ec2:{region}:{account}:network-interface/eni-0abc",
                     f"arn:aws:ec2:{region}:{account}:volume/vol-0abc",
                     f"arn:aws:ec2:{region}:{account}:key-pair/ray-autoscaler_1_{region}"):
        assert _allows(head, "ec2:RunInstances", resource, {"ec2:Owner": "amazon"}), resource
    # The tags of RunInstances' TagSpecifications are authorised as CreateTags on the new instance.
    assert _allows(head, "ec2:CreateTags", instance, {"ec2:CreateAction": "RunInstances"})
    assert not _allows(head, "ec2:CreateTags", instance, {"ec2:CreateAction": "CreateVolume"})
    for statement in head["Statement"]:
        changes = [a for a in _listed(statement["Action"]) if a.startswith("ec2:") and not a.startswith("ec2:Describe")]
        if changes:
            assert "*" not in _listed(statement["Resource"]), f"{statement['Sid']}: {changes} on every resource"
            if any(":instance/" in r for r in _listed(statement["Resource"])):
                assert statement.get("Condition"), f"{statement['Sid']}: {changes} on any instance"


def test_the_head_launches_only_this_clusters_workers_as_configured_and_passes_only_their_role():
    """A job on the head holds the head's role: it must not launch any AMI, type or key, nor pass any role."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    head = json.loads((DEPLOY / "aws/ray-head-policy.json").read_text())
    instance, launch = _instance_and_tags(config)
    region, account = instance.split(":")[3:5]
    assert _allows(head, "ec2:RunInstances", instance, launch)
    for key, other in (("ec2:InstanceType", "p5.48xlarge"), ("ec2:MetadataHttpTokens", "optional"),
                       ("ec2:MetadataHttpPutResponseHopLimit", 2),
                       ("ec2:InstanceProfile", f"arn:aws:iam::{account}:instance-profile/ray-nmt-head"),
                       ("ec2:InstanceProfile", f"arn:aws:iam::{account}:instance-profile/admin")):
        assert not _allows(head, "ec2:RunInstances", instance, {**launch, key: other}), (key, other)
    for missing in ("ec2:InstanceProfile", "ec2:MetadataHttpTokens"):
        assert not _allows(head, "ec2:RunInstances", instance, {k: v for k, v in launch.items() if k != missing})
    image = f"arn:aws:ec2:{region}::image/ami-0abc"
    assert not _allows(head, "ec2:RunInstances", image, {"ec2:Owner": "111122223333"})  # someone's own AMI
    assert not _allows(head, "ec2:RunInstances", f"arn:aws:ec2:{region}:{account}:key-pair/my-own-key")
    to_ec2 = {"iam:PassedToService": "ec2.amazonaws.com"}
    assert _allows(head, "iam:PassRole", f"arn:aws:iam::{account}:role/ray-nmt-worker", to_ec2)
    for role in ("ray-nmt-head", "admin", "nmt-mlflow"):
        assert not _allows(head, "iam:PassRole", f"arn:aws:iam::{account}:role/{role}", to_ec2), role
    assert not _allows(head, "iam:PassRole", f"arn:aws:iam::{account}:role/ray-nmt-worker",
                       {"iam:PassedToService": "lambda.amazonaws.com"})


def test_every_node_requires_imdsv2_one_hop_away():
    """A session token for the metadata service, one hop. Ray's containers use the host's network (--net=host), so
    this keeps the role from a container on a bridge network only: a job holds it (the policies' tests)."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    from ray.autoscaler._private.docker import docker_start_cmds

    command = docker_start_cmds("ray", "image", {}, "c", [], config["cluster_name"], "/home/ray", "docker")
    assert "--net=host" in command, "Ray's containers left the host network: the hop limit must be 2"
    for name, node_type in config["available_node_types"].items():
        options = node_type["node_config"]["MetadataOptions"]
        assert options["HttpTokens"] == "required" and options["HttpPutResponseHopLimit"] == 1, name


def test_each_role_reaches_only_its_clusters_prefixes_and_reads_no_other_login():
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    region, cluster = config["provider"]["region"], config["cluster_name"]
    wmt = yaml.safe_load((ROOT / "configs" / "wmt14_en_de.yaml").read_text())
    bucket = urllib.parse.urlsplit(wmt["train"]["storage_path"]).netloc
    for name in ("head", "worker"):
        policy = json.loads((DEPLOY / f"aws/ray-{name}-policy.json").read_text())
        objects = [r for s in policy["Statement"] if s["Effect"] == "Allow" for r in _listed(s["Resource"])
                   if r.startswith("arn:aws:s3:::") and "/" in r]
        assert objects and all(r.startswith((f"arn:aws:s3:::{bucket}/{cluster}/", f"arn:aws:s3:::{bucket}/corpora/"))
                               and r.count("*") == 1 for r in objects), (name, objects)
        for key in ("other-team/runs/x/model.pt", f"{cluster}-b/runs/x", "mlflow-artifacts/1/model.bin", "x"):
            for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
                assert not _allows(policy, action, f"arn:aws:s3:::{bucket}/{key}"), (name, action, key)
        assert _allows(policy, "s3:GetObject", f"arn:aws:s3:::{bucket}/corpora/wmt14/de-en/train-0.parquet")
        assert not _allows(policy, "s3:PutObject", f"arn:aws:s3:::{bucket}/corpora/wmt14/de-en/train-0.parquet")
        # The nodes' own login only: not the MLflow server's admin password beside it in SSM.
        account = config["available_node_types"]["head"]["node_config"]["IamInstanceProfile"]["Arn"].split(":")[4]
        for parameter in ("/nmt/mlflow/server/admin-password", "/nmt/mlflow/promoter/password"):
            assert not _allows(policy, "ssm:GetParameter", f"arn:aws:ssm:{region}:{account}:parameter{parameter}")


def _bucket_and_cluster(config: dict) -> tuple[str, str]:
    wmt = yaml.safe_load((ROOT / "configs" / "wmt14_en_de.yaml").read_text())
    return urllib.parse.urlsplit(wmt["train"]["storage_path"]).netloc, config["cluster_name"]


def test_the_head_launches_workers_only_into_the_named_subnets_and_security_group():
    """A job on the head holds the head's role: its launches go into the subnets and the security group that
    cluster-aws.yaml names, as a worker of this cluster (type, profile, IMDSv2, the tags Ray gives a worker). IAM
    has no condition on user data: what such a launch runs holds the worker's role, which launches nothing."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    head = json.loads((DEPLOY / "aws/ray-head-policy.json").read_text())
    worker_policy = json.loads((DEPLOY / "aws/ray-worker-policy.json").read_text())
    instance, launch = _instance_and_tags(config)
    region, account = instance.split(":")[3:5]
    named = set()
    for name, node_type in config["available_node_types"].items():
        node = node_type["node_config"]
        assert node.get("SubnetIds") and node.get("SecurityGroupIds"), f"{name}: Ray picks any subnet or makes a group"
        named |= {f"arn:aws:ec2:{region}:{account}:subnet/{subnet}" for subnet in node["SubnetIds"]}
        named |= {f"arn:aws:ec2:{region}:{account}:security-group/{group}" for group in node["SecurityGroupIds"]}
    for resource in named:
        assert _allows(head, "ec2:RunInstances", resource), resource
    for resource in (f"arn:aws:ec2:{region}:{account}:subnet/subnet-0fedcba9876543210",
                     f"arn:aws:ec2:{region}:{account}:security-group/sg-0fedcba9876543210"):
        assert not _allows(head, "ec2:RunInstances", resource), f"a launch into {resource}"
    assert not any(r.endswith(("subnet/*", "security-group/*")) for s in head["Statement"]
                   for r in _listed(s.get("Resource", []))), "a launch into any subnet or security group"
    # Tagged as Ray's node launcher tags a worker: not as the head (members' tunnel to the dashboard trusts that
    # tag), not named as the MLflow server (theirs to MLflow trusts the name), not another cluster's.
    for key, other in (("aws:RequestTag/ray-node-type", "head"), ("aws:RequestTag/Name", "nmt-mlflow"),
                       ("aws:RequestTag/ray-cluster-name", "another-team")):
        assert not _allows(head, "ec2:RunInstances", instance, {**launch, key: other}), (key, other)
    assert not any(_allows(worker_policy, action, "*") for action in (
        "ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreateTags", "iam:PassRole")), "the launched node's role"
    assert "Every job holds its node's role" in header(DEPLOY / "cluster-aws.yaml")


def test_the_head_stops_terminates_and_retags_only_this_clusters_workers_never_the_head():
    """Ray's autoscaler stops and terminates workers only, and after a launch changes the status tags its updater
    writes: a job with the head's role cannot take the head down, nor retag a node into the head or out of the
    cluster (and then terminate or tunnel to it)."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    head = json.loads((DEPLOY / "aws/ray-head-policy.json").read_text())
    instance, worker = _instance_and_tags(config)
    the_head = {**worker, "ec2:ResourceTag/ray-node-type": "head"}
    for action in ("ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"):
        assert _allows(head, action, instance, worker), action
        assert not _allows(head, action, instance, the_head), f"{action} on the head"
    import ray.autoscaler.tags as tags

    updated = {getattr(tags, name) for name in re.findall(r"\bTAG_RAY_\w+", _ray_source("updater"))}
    assert updated == set(worker["aws:TagKeys"]), f"Ray's updater now uses the tags {updated}"
    assert _allows(head, "ec2:CreateTags", instance, worker)
    for keys in (["ray-node-type"], ["Name"], ["ray-cluster-name"], ["ray-node-status", "ray-node-type"]):
        assert not _allows(head, "ec2:CreateTags", instance, {**worker, "aws:TagKeys": keys}), keys
    assert not _allows(head, "ec2:DeleteTags", instance, worker), "Ray deletes no tag"


def test_node_roles_cannot_destroy_a_version_of_runs_or_data_and_the_bucket_keeps_them():
    """Instance roles cannot tell members' jobs apart, so runs are kept recoverable: the bucket is versioned and
    keeps replaced and deleted objects; the roles may delete (a marker: checkpoint rotation, `nmt prepare` replacing
    stale data) but never a version, nor change versioning, the lifecycle or the bucket policy."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    bucket, cluster = _bucket_and_cluster(config)
    for name in ("head", "worker"):
        policy = json.loads((DEPLOY / f"aws/ray-{name}-policy.json").read_text())
        for key in (f"{cluster}/runs/alice-run/checkpoint_000004/model.pt",
                    f"{cluster}/prepared/wmt14/train-0.parquet"):
            arn = f"arn:aws:s3:::{bucket}/{key}"
            assert _allows(policy, "s3:PutObject", arn) and _allows(policy, "s3:DeleteObject", arn), (name, key)
            assert _denies(policy, "s3:DeleteObjectVersion", arn), f"{name} destroys {key} for good"
        for action in ("s3:PutBucketVersioning", "s3:PutLifecycleConfiguration", "s3:PutBucketPolicy",
                       "s3:DeleteBucketPolicy", "s3:DeleteBucket"):
            assert _denies(policy, action, f"arn:aws:s3:::{bucket}"), (name, action)
    steps = header(DEPLOY / "cluster-aws.yaml")
    assert "put-bucket-versioning --bucket YOUR-BUCKET --versioning-configuration Status=Enabled" in steps
    assert "file://deploy/aws/bucket-lifecycle.json" in steps
    [rule] = json.loads((DEPLOY / "aws/bucket-lifecycle.json").read_text())["Rules"]
    assert rule["Status"] == "Enabled" and f"{cluster}/".startswith(rule["Filter"]["Prefix"]), rule
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] >= 7, "too short to notice and restore a loss"
    assert "Days" not in rule.get("Expiration", {}), "current objects must not expire"


def test_members_may_only_port_forward_to_the_mlflow_server_and_the_ray_head():
    """Session Manager as a member: AWS-StartPortForwardingSession to the MLflow instance (the UI) and to this
    cluster's head (the dashboard), never a shell there (which reads the admin's and the database's passwords), an
    SSH session, a forward to another host, a command, nor the project's secrets."""
    config = docs(DEPLOY / "cluster-aws.yaml")[0]
    member = json.loads((DEPLOY / "aws/member-policy.json").read_text())
    instance, _ = _instance_and_tags(config)
    region, account = instance.split(":")[3:5]
    cluster = config["cluster_name"]
    mlflow = {"ssm:resourceTag/Name": "nmt-mlflow", "ssm:SessionDocumentAccessCheck": "true"}
    ray_head = {"ssm:resourceTag/ray-cluster-name": cluster, "ssm:resourceTag/ray-node-type": "head",
                "ssm:SessionDocumentAccessCheck": "true"}

    def document(name: str) -> str:
        return f"arn:aws:ssm:{region}:{'' if name.startswith('AWS-') else account}:document/{name}"

    def session(target: dict, name: str) -> bool:
        """StartSession authorises the instance and the document: both must be allowed."""
        return _allows(member, "ssm:StartSession", instance, target) and _allows(
            member, "ssm:StartSession", document(name), target)

    for target in (mlflow, ray_head):
        assert session(target, "AWS-StartPortForwardingSession"), target
        for name in ("SSM-SessionManagerRunShell", "AWS-StartSSHSession", "AWS-StartInteractiveCommand",
                     "AWS-StartNonInteractiveCommand", "AWS-StartPortForwardingSessionToRemoteHost"):
            assert not session(target, name), (target, name)
            assert _denies(member, "ssm:StartSession", document(name), target), f"{name} despite another policy"
    # No document named: Session Manager opens a shell, and with the access check asks for that document.
    assert not _allows(member, "ssm:StartSession", document("SSM-SessionManagerRunShell"), mlflow)
    for other in ({"ssm:resourceTag/Name": "ray-nmt-worker"}, {**ray_head, "ssm:resourceTag/ray-node-type": "worker"},
                  {**ray_head, "ssm:resourceTag/ray-cluster-name": "another-team"}, {}):
        assert not session(other, "AWS-StartPortForwardingSession"), other
    for action in ("ssm:SendCommand", "ec2-instance-connect:SendSSHPublicKey", "ssm:StartAutomationExecution"):
        assert _denies(member, action, instance), action
    for parameter in ("/nmt/mlflow/server/admin-password", "/nmt/mlflow/password"):
        assert _denies(member, "ssm:GetParameter", f"arn:aws:ssm:{region}:{account}:parameter{parameter}")
    # The head runs the Session Manager agent, with no more of SSM than the agent needs (not AmazonSSMManagedInstance
    # Core, whose ssm:GetParameter on every parameter would give jobs the MLflow admin's password).
    head = json.loads((DEPLOY / "aws/ray-head-policy.json").read_text())
    for action in ("ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel", "ssmmessages:OpenDataChannel"):
        assert _allows(head, action, "*"), action
