"""The AWS CLI's commands of the guides, answered here: responses shaped as AWS's, --query and --output applied."""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import tempfile
import time
from glob import glob
from pathlib import Path

import jmespath

REGION = "us-west-2"
VPC = {"VpcId": "vpc-0rehearsal", "CidrBlock": "10.66.0.0/24", "IsDefault": True}


class CloudError(Exception):
    """What the AWS CLI prints for a refused call, with its exit status."""

    def __init__(self, message: str, code: int = 254):
        super().__init__(message)
        self.code = code


def options(argv: list[str]) -> dict[str, list[str]]:
    """`--name value ...` pairs of a command (a flag without values maps to [])."""
    found: dict[str, list[str]] = {}
    name = None
    for word in argv:
        if word.startswith("--"):
            name, _, value = word[2:].partition("=")
            found.setdefault(name, [])
            if value:
                found[name].append(value)
        elif name is not None:
            found[name].append(word)
    return found


def one(opts: dict[str, list[str]], name: str) -> str:
    values = opts.get(name) or []
    if len(values) != 1:
        raise CloudError(f"aws: --{name} needs one value, got {values}", 252)
    return values[0]


def respond(cloud, call, response) -> object:
    """The response as the CLI prints it: --query (JMESPath) applied, then --output text or JSON."""
    from .cloud import Reply

    opts = options(call.argv)
    if "query" in opts:
        response = jmespath.search(one(opts, "query"), response)
    if (opts.get("output") or ["json"])[0] == "text":
        if isinstance(response, list):
            text = "\t".join("None" if v is None else str(v) for v in response)
        else:
            text = "None" if response is None else str(response)
        return Reply(stdout=text + "\n")
    return Reply(stdout=json.dumps(response, indent=2) + "\n")


def _file(call, value: str) -> str:
    """A `file://PATH` argument's content, as the calling host read it."""
    if not value.startswith("file://"):
        return value
    path = value.removeprefix("file://")
    if path not in call.files:
        raise CloudError(f"Error parsing parameter: Unable to load paramfile {value}: no such file", 255)
    return call.files[path]


def ok(cloud, call):
    return respond(cloud, call, {})


def caller_identity(cloud, call):
    from .cloud import ACCOUNT

    return respond(cloud, call, {"Account": ACCOUNT, "UserId": "AIDAREHEARSAL",
                                 "Arn": f"arn:aws:iam::{ACCOUNT}:user/admin"})


def make_bucket(cloud, call):
    from .cloud import Reply

    bucket = call.argv[3].removeprefix("s3://").strip("/")
    host = cloud.host(call.host)
    code = (f"import boto3; boto3.client('s3').create_bucket(Bucket={bucket!r}, "
            f"CreateBucketConfiguration={{'LocationConstraint': {REGION!r}}})")
    done = cloud.run_on(host, ["python", "-c", code], {**cloud.base_env(host, "/root"), **cloud.role_env()})
    if done.returncode != 0:
        raise CloudError(f"make_bucket failed: s3://{bucket} {done.stderr.strip().splitlines()[-1:]}", 1)
    cloud.records["buckets"].append(bucket)

    return Reply(stdout=f"make_bucket: {bucket}\n")


def bucket_setting(cloud, call):
    """Versioning and lifecycle rules, set on the bucket of the local S3 server as boto3 sets them."""
    opts = options(call.argv)
    bucket = one(opts, "bucket")
    if "versioning-configuration" in opts:
        status = one(opts, "versioning-configuration").removeprefix("Status=")
        code = f"c.put_bucket_versioning(Bucket={bucket!r}, VersioningConfiguration={{'Status': {status!r}}})"
    else:
        rules = json.loads(_file(call, one(opts, "lifecycle-configuration")))
        code = f"c.put_bucket_lifecycle_configuration(Bucket={bucket!r}, LifecycleConfiguration={rules!r})"
    host = cloud.host(call.host)
    done = cloud.run_on(host, ["python", "-c", f"import boto3; c = boto3.client('s3'); {code}"],
                        {**cloud.base_env(host, "/root"), **cloud.role_env()})
    if done.returncode != 0:
        raise CloudError(f"An error occurred: {done.stderr.strip().splitlines()[-1:]}", 254)
    return respond(cloud, call, {})


def ecr_password(cloud, call):
    from .cloud import Reply

    return Reply(stdout="rehearsal-ecr-token\n")


def describe_vpcs(cloud, call):
    return respond(cloud, call, {"Vpcs": [VPC]})


def describe_subnets(cloud, call):
    zones = ("a", "b")
    return respond(cloud, call, {"Subnets": [{"SubnetId": f"subnet-0rehearsal{z}", "VpcId": VPC["VpcId"],
                                              "AvailabilityZone": f"{REGION}{z}"} for z in zones]})


def security_group(cloud, call):
    name = one(options(call.argv), "group-name")
    return respond(cloud, call, {"GroupId": f"sg-0{name.replace('-', '')}"})


def iam(cloud, call):
    """Role, policy and profile calls: recorded; a policy document must parse."""
    opts = options(call.argv)
    for name in ("assume-role-policy-document", "policy-document"):
        if name in opts:
            try:
                json.loads(_file(call, one(opts, name)))
            except ValueError as err:
                raise CloudError(f"An error occurred (MalformedPolicyDocument): {err}") from None
    return respond(cloud, call, {})


# -- RDS: PostgreSQL with TLS on a host of its own ----------------------------------------------------------

def _pg_bin() -> Path:
    found = sorted(glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise CloudError("rehearsal: PostgreSQL's server is not installed (apt-get install postgresql)", 1)
    return Path(found[-1]).parent


class Database:
    """The RDS instance: a PostgreSQL cluster owned by `postgres`, TLS on, on the host `rds` at port 5432."""

    def __init__(self, cloud, identifier: str, master: str):
        self.cloud, self.identifier, self.master = cloud, identifier, master
        self.password = secrets.token_urlsafe(18)
        self.arn = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:rds!db-{secrets.token_hex(4)}"
        self.host = cloud.add_host("rds")
        # Under /tmp itself: the test's own directories are its owner's alone, and `postgres` runs the server.
        self.dir = Path(tempfile.mkdtemp(prefix="nmt-rds-", dir="/tmp")) / "pg"
        self.process = None

    def start(self) -> None:
        import pwd
        import subprocess

        owner = pwd.getpwnam("postgres")
        self.dir.mkdir(parents=True)
        superuser = secrets.token_urlsafe(18)
        (self.dir / "pw").write_text(superuser)
        subprocess.run(["chown", "-R", "postgres:postgres", str(self.dir.parent)], check=True)
        as_owner = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        subprocess.run([str(_pg_bin() / "initdb"), "-D", str(self.dir / "data"), "-U", "rdsadmin",
                        "--auth=scram-sha-256", f"--pwfile={self.dir / 'pw'}", "-E", "UTF8", "--locale=C.UTF-8"],
                       check=True, capture_output=True, timeout=120, **as_owner)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        f"/CN={self.identifier}", "-keyout", str(self.dir / "server.key"), "-out",
                        str(self.dir / "server.crt")], check=True, capture_output=True, timeout=60, **as_owner)
        (self.dir / "server.key").chmod(0o600)
        with (self.dir / "data" / "pg_hba.conf").open("a") as hba:
            hba.write("hostssl all all 0.0.0.0/0 scram-sha-256\n")
        settings = {"listen_addresses": "*", "port": 5432, "ssl": "on", "ssl_cert_file": self.dir / "server.crt",
                    "ssl_key_file": self.dir / "server.key", "unix_socket_directories": self.dir, "fsync": "off",
                    "max_connections": 300}
        argv = [str(_pg_bin() / "postgres"), "-D", str(self.dir / "data"),
                *[f"-c{key}={value}" for key, value in settings.items()]]
        self.process = self.cloud.spawn(self.host, argv, "rds", user="postgres")
        self.wait()
        # RDS's master user: no superuser, but it may make roles and databases.
        sql = (f"CREATE ROLE {self.master} LOGIN CREATEROLE CREATEDB PASSWORD '{self.password}'")
        self.psql(sql, user="rdsadmin", password=superuser)

    def psql(self, sql: str, user: str, password: str) -> str:
        env = {"PGPASSWORD": password, "PATH": "/usr/bin:/bin"}
        done = self.cloud.run_on(self.host, [str(_pg_bin() / "psql"), "-h", str(self.dir), "-U", user, "-d",
                                             "postgres", "-v", "ON_ERROR_STOP=1", "-Atc", sql], env, user="postgres")
        if done.returncode != 0:
            raise RuntimeError(f"psql on the RDS stand-in: {done.stderr}")
        return done.stdout

    def wait(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = self.cloud.run_on(self.host, [str(_pg_bin() / "pg_isready"), "-h", str(self.dir), "-p", "5432"],
                                     {"PATH": "/usr/bin:/bin"}, user="postgres")
            if done.returncode == 0:
                return
            time.sleep(0.5)
        raise CloudError("rehearsal: the RDS stand-in did not accept connections in time", 1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        shutil.rmtree(self.dir.parent, ignore_errors=True)


def create_database(cloud, call):
    opts = options(call.argv)
    if cloud.database is not None:
        raise CloudError("An error occurred (DBInstanceAlreadyExists) when calling the CreateDBInstance operation")
    cloud.database = Database(cloud, one(opts, "db-instance-identifier"), one(opts, "master-username"))
    cloud.database.start()
    cloud.records["secrets"][cloud.database.arn] = {"username": cloud.database.master,
                                                    "password": cloud.database.password}
    return respond(cloud, call, {"DBInstance": _db_instance(cloud)})


def _db_instance(cloud) -> dict:
    db = cloud.database
    return {"DBInstanceIdentifier": db.identifier, "Endpoint": {"Address": db.host.ip, "Port": 5432},
            "MasterUsername": db.master, "MasterUserSecret": {"SecretArn": db.arn}, "DBInstanceStatus": "available"}


def wait_database(cloud, call):
    if cloud.database is None:
        raise CloudError("Waiter DBInstanceAvailable failed: no such DB instance", 255)
    cloud.database.wait()
    return respond(cloud, call, {})


def describe_database(cloud, call):
    if cloud.database is None:
        raise CloudError("An error occurred (DBInstanceNotFound) when calling the DescribeDBInstances operation")
    return respond(cloud, call, {"DBInstances": [_db_instance(cloud)]})


def secret_value(cloud, call):
    arn = one(options(call.argv), "secret-id")
    if arn not in cloud.records["secrets"]:
        raise CloudError("An error occurred (ResourceNotFoundException) when calling the GetSecretValue operation")
    return respond(cloud, call, {"ARN": arn, "SecretString": json.dumps(cloud.records["secrets"][arn])})


# -- EC2 instances, DNS, Session Manager, SSM parameters ------------------------------------------------------

def run_instance(cloud, call):
    """A host whose user data runs as root at once (cloud-init's log in its directory)."""
    opts = options(call.argv)
    tags = {}
    for spec in opts.get("tag-specifications", []):
        tags.update(dict(part.split(",Value=") for part in spec.split("Tags=[{Key=", 1)[1].rstrip("}]").split(
            "},{Key=")))
    name = tags.get("Name", f"instance{len(cloud.records['instances'])}")
    host = cloud.add_host(name, binds={"/etc/mlflow": None})
    instance = f"i-0{name.replace('-', '')}"
    cloud.records["instances"][instance] = {"host": name, "tags": tags}
    script = host.root / "user-data"
    script.write_text(_file(call, one(opts, "user-data")))
    env = {**cloud.base_env(host, "/root"), **cloud.role_env()}
    cloud.spawn(host, ["bash", str(script)], f"{name}-cloud-init-output", env)
    return respond(cloud, call, {"Instances": [{"InstanceId": instance, "PrivateIpAddress": host.ip}]})


def describe_instances(cloud, call):
    opts = options(call.argv)
    wanted = set(opts.get("instance-ids", []))
    filters = {}
    for spec in opts.get("filters", []):
        key, values = spec.removeprefix("Name=").split(",Values=")
        filters[key] = set(values.split(","))
    found = []
    for instance, record in cloud.records["instances"].items():
        tags = record["tags"]
        if wanted and instance not in wanted:
            continue
        if any(key.startswith("tag:") and tags.get(key[4:]) not in values for key, values in filters.items()):
            continue
        if "instance-state-name" in filters and "running" not in filters["instance-state-name"]:
            continue
        found.append({"InstanceId": instance, "PrivateIpAddress": cloud.host(record["host"]).ip,
                      "State": {"Name": "running"}, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]})
    return respond(cloud, call, {"Reservations": [{"Instances": [i]} for i in found]})


def hosted_zone(cloud, call):
    return respond(cloud, call, {"HostedZone": {"Id": "/hostedzone/Z0REHEARSAL", "Name": "internal."}})


def record_sets(cloud, call):
    batch = json.loads(one(options(call.argv), "change-batch"))
    names = {}
    for change in batch["Changes"]:
        record = change["ResourceRecordSet"]
        if record["Type"] == "A":
            names[record["Name"].rstrip(".")] = record["ResourceRecords"][0]["Value"]
    cloud.records["zone"].update(names)
    for host in cloud.network.hosts.values():
        if getattr(host, "vpc", False):
            host.add_names(names)
    return respond(cloud, call, {"ChangeInfo": {"Status": "PENDING"}})


def start_session(cloud, call):
    from .cloud import Reply

    opts = options(call.argv)
    document = one(opts, "document-name")
    if document != "AWS-StartPortForwardingSession":
        raise CloudError(f"An error occurred (AccessDeniedException): not allowed to use document {document}")
    target = cloud.records["instances"].get(one(opts, "target"))
    if target is None:
        raise CloudError(f"An error occurred (TargetNotConnected): {one(opts, 'target')} is not connected")
    parameters = dict(pair.split("=") for pair in one(opts, "parameters").split(","))
    cloud.forward(cloud.host(call.host), int(parameters["localPortNumber"]), cloud.host(target["host"]),
                  int(parameters["portNumber"]))
    return Reply(stdout=f"Starting session with SessionId: rehearsal-{secrets.token_hex(4)}\n"
                        f"Port {parameters['localPortNumber']} opened for sessionId rehearsal.\n")


def get_parameter(cloud, call):
    name = one(options(call.argv), "name")
    found = cloud.records["parameters"].get(name)
    if found is None:
        raise CloudError(f"An error occurred (ParameterNotFound) when calling the GetParameter operation: "
                         f"Parameter {name} not found.")
    return respond(cloud, call, {"Parameter": {"Name": name, **found}})


def put_parameter(cloud, call):
    opts = options(call.argv)
    name = one(opts, "name")
    if name in cloud.records["parameters"] and "overwrite" not in opts:
        raise CloudError("An error occurred (ParameterAlreadyExists) when calling the PutParameter operation: "
                         "The parameter already exists. To overwrite this request value, set the overwrite option")
    cloud.records["parameters"][name] = {"Type": one(opts, "type"), "Value": _file(call, one(opts, "value"))}
    return respond(cloud, call, {"Version": 1, "Tier": "Standard"})


def check_ip(cloud, call):
    from .cloud import Reply

    return Reply(stdout=cloud.host(call.host).ip + "\n")


def instance_metadata(cloud, call):
    """IMDSv2 as the guides' scripts ask it: a session token, then the region."""
    from .cloud import Reply

    url = next(word for word in call.argv if "169.254.169.254" in word)
    if url.endswith("/latest/api/token"):
        return Reply(stdout="rehearsal-imds-token")
    if url.endswith("/placement/region"):
        return Reply(stdout=REGION)
    raise CloudError(f"curl: (22) The requested URL returned error: 404 ({shlex.quote(url)})", 22)
