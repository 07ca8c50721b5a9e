"""A cloud on this machine for the team's day: the guides' cloud commands answered by local stand-ins.

Every command a guide runs goes to the real program, except those in STAND_INS below: a shim of the
same name on each host's PATH (rehearsal/shim.py) sends them here, to the Cloud of the rehearsal,
which answers as the cloud would. The table is the whole list of what does not run as written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import socketserver
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import aws, containers
from .hosts import Host, Network

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SHIMS = ("aws", "docker", "dnf", "systemctl", "curl", "ray")
ACCOUNT = "123456789012"
S3_PORT = 9000

# What stands in for each cloud command: (command prefix, handler, what it does here). A command whose
# first words match no entry runs as written; `curl` and `ray` run as written but for these entries.
STAND_INS = [
    (("aws", "sts", "get-caller-identity"), aws.caller_identity, f"the account {ACCOUNT}"),
    (("aws", "s3", "mb"), aws.make_bucket, "a bucket on the local S3 server (moto) every host reaches"),
    (("aws", "s3api", "put-bucket-versioning"), aws.bucket_setting, "set on the local S3 server's bucket"),
    (("aws", "s3api", "put-bucket-lifecycle-configuration"), aws.bucket_setting,
     "set on the local S3 server's bucket (its rules are not enforced there)"),
    (("aws", "ecr", "create-repository"), aws.ok, "a repository name, recorded"),
    (("aws", "ecr", "get-login-password"), aws.ecr_password, "a token docker login takes"),
    (("aws", "ec2", "describe-vpcs"), aws.describe_vpcs, "the default VPC: the rehearsal's bridge, 10.66.0.0/24"),
    (("aws", "ec2", "describe-subnets"), aws.describe_subnets, "two subnets of the bridge, one per zone"),
    (("aws", "ec2", "create-security-group"), aws.security_group, "a group id (no firewall here)"),
    (("aws", "ec2", "authorize-security-group-ingress"), aws.ok, "recorded (no firewall here)"),
    (("aws", "rds", "create-db-instance"), aws.create_database,
     "PostgreSQL 15 on a host of its own, TLS on, the master user (not a superuser: CREATEROLE, CREATEDB) with a "
     "password kept in the Secrets Manager stand-in"),
    (("aws", "rds", "wait", "db-instance-available"), aws.wait_database, "until PostgreSQL accepts connections"),
    (("aws", "rds", "describe-db-instances"), aws.describe_database, "that server's address, master user, secret"),
    (("aws", "secretsmanager", "get-secret-value"), aws.secret_value, "the master password"),
    (("aws", "iam"), aws.iam, "recorded; a policy document must be a file of valid JSON"),
    (("aws", "ec2", "run-instances"), aws.run_instance,
     "a new host on the bridge whose user data runs as root at once, with these stand-ins on its PATH and "
     "its role's credentials for the local S3 server in its environment (its instance metadata)"),
    (("aws", "ec2", "wait", "instance-running"), aws.ok, "the host runs already"),
    (("aws", "ec2", "describe-instances"), aws.describe_instances, "the hosts started so far, with their tags"),
    (("aws", "route53", "create-hosted-zone"), aws.hosted_zone, "a zone id"),
    (("aws", "route53", "change-resource-record-sets"), aws.record_sets,
     "the A records in every VPC host's hosts file (laptops are outside the VPC and resolve none)"),
    (("aws", "ssm", "start-session"), aws.start_session,
     "AWS-StartPortForwardingSession only: 127.0.0.1:localPortNumber of the caller forwarded to the target "
     "host's portNumber"),
    (("aws", "ssm", "get-parameter"), aws.get_parameter, "a parameter store in the rehearsal's directory"),
    (("aws", "ssm", "put-parameter"), aws.put_parameter, "the same store; an existing name needs --overwrite"),
    (("docker", "login"), containers.login, "accepted (the registry is the rehearsal's record of pushed images)"),
    (("docker", "build"), containers.build,
     "records the image with its Dockerfile's ENTRYPOINT and CMD; its software is this machine's virtualenv"),
    (("docker", "push"), containers.push, "a built image becomes pullable"),
    (("docker", "pull"), containers.pull, "a pushed image, else an error"),
    (("docker", "run"), containers.run,
     "the command docker would run (ENTRYPOINT and CMD combined with the arguments) as a process of the calling "
     "host, with -e/--env-file, --user and -i honoured; only --network host; volumes map a path to itself"),
    (("dnf",), containers.ok, "the instance has what it needs"),
    (("systemctl",), containers.ok, "the instance has what it needs"),
    (("curl", "http://169.254.169.254"), aws.instance_metadata, "the instance's metadata: a token, its region"),
    (("curl", "https://checkip.amazonaws.com"), aws.check_ip, "the caller's address on the bridge"),
    (("ray", "up"), containers.ray_up,
     "the head and one worker node (this machine's CPUs, no GPU: the autoscaler's stand-in) as hosts: each runs "
     "the file's initialization_commands, file_mounts and, in the image's environment with docker.run_options, "
     "its start commands as written but for --autoscaling-config (no EC2 to scale here)"),
    (("ray", "down"), containers.ray_down, "the nodes' hosts stopped"),
    (("ray", "dashboard"), containers.ray_dashboard, "127.0.0.1:8265 of the caller forwarded to the head's 8265"),
    (("ray", "attach"), containers.ray_attach, "127.0.0.1:PORT of the caller (-p) forwarded to the head's PORT"),
]


@dataclass
class Call:
    """One command a shim sent: its words, where it ran, and what it read."""

    argv: list[str]
    host: str
    cwd: str
    env: dict[str, str]
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)  # file:// arguments, read on the calling host


@dataclass
class Reply:
    stdout: str = ""
    stderr: str = ""
    code: int = 0


def stand_in(argv: list[str]):
    """The table's entry for a command, or None: the longest prefix of its words (URLs by their start)."""
    best = None
    for prefix, handler, _ in STAND_INS:
        words = argv[: len(prefix)]
        matches = len(words) == len(prefix) and all(
            w == p or (p.startswith("http") and w.startswith(p)) for w, p in zip(words, prefix))
        if prefix[0] == "curl":
            matches = any(w.startswith(prefix[1]) for w in argv[1:])
        if matches and (best is None or len(prefix) > len(best[0])):
            best = (prefix, handler)
    return best


class Cloud:
    """The rehearsal's cloud: the network of hosts, the services standing in for AWS's, and their records."""

    def __init__(self, root: Path, tag: str):
        self.root = root
        self.network = Network(root / "hosts", tag)
        self.shims = root / "shims"
        self.socket = root / "cloud.sock"
        self.lock = threading.Lock()
        self.records: dict = {"parameters": {}, "secrets": {}, "images": {}, "instances": {}, "zone": {},
                              "buckets": [], "log": []}
        self.processes: list[subprocess.Popen] = []
        self.database = None
        self.s3: Host | None = None
        self.cluster: dict = {}  # the Ray cluster `ray up` made: its config, who made it
        self.server: socketserver.ThreadingUnixStreamServer | None = None

    # -- the hosts --------------------------------------------------------------------------------------

    def start(self) -> None:
        """The network, the local S3 server, the shims, and the socket the shims talk to."""
        self.network.start()
        self.s3 = self.network.add("s3")
        self.spawn(self.s3, [str(VENV_BIN / "moto_server"), "-H", "0.0.0.0", "-p", str(S3_PORT)], "s3")
        self._write_shims()
        cloud = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                call = Call(**json.loads(self.rfile.readline()))
                reply = cloud.answer(call)
                self.wfile.write((json.dumps(reply.__dict__) + "\n").encode())

        self.server = socketserver.ThreadingUnixStreamServer(str(self.socket), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.wait_port(self.s3, S3_PORT, 60)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
        if self.database is not None:
            self.database.stop()
        self.network.stop()

    def host(self, name: str) -> Host:
        return self.network.hosts[name]

    def add_host(self, name: str, vpc: bool = True, binds: dict[str, Path] | None = None) -> Host:
        """A new host; in the VPC it resolves the private zone's names, a laptop does not."""
        host = self.network.add(name, binds)
        host.vpc = vpc
        if vpc:  # the VPC's own DNS: every instance's name, both ways, and the private zone's records
            others = [h for h in self.network.hosts.values() if h.vpc and h is not host]
            host.add_names({**{h.name: h.ip for h in others}, **self.records["zone"]})
            for other in others:
                other.add_names({host.name: host.ip})
        return host

    @property
    def s3_url(self) -> str:
        return f"http://{self.s3.ip}:{S3_PORT}"

    def role_env(self) -> dict[str, str]:
        """What an instance's role gives its processes here: credentials for the local S3 server."""
        return {"AWS_ENDPOINT_URL": self.s3_url, "MLFLOW_S3_ENDPOINT_URL": self.s3_url,
                "AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal",
                "AWS_DEFAULT_REGION": "us-west-2", "AWS_EC2_METADATA_DISABLED": "true"}

    def base_env(self, host: Host, home: str, **extra: str) -> dict[str, str]:
        """A shell's environment on a host: the shims first on PATH, then this machine's virtualenv and tools."""
        return {"PATH": f"{self.shims}:{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
                "REHEARSAL_HOST": host.name, "REHEARSAL_SOCKET": str(self.socket),
                "PYTHONPATH": str(ROOT / "tests"), **extra}

    def spawn(self, host: Host, argv: list[str], log: str, env: dict[str, str] | None = None,
              cwd: str = "/", stdin: str | None = None, user: str | None = None) -> subprocess.Popen:
        """A long-lived process on a host, in a session of its own, its output in logs/<log>.log."""
        (self.root / "logs").mkdir(exist_ok=True)
        out = open(self.root / "logs" / f"{log}.log", "ab")
        if user:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        process = host.popen(argv, env or self.base_env(host, "/root"), cwd, stdin=subprocess.PIPE if stdin
                             else subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if stdin:
            process.stdin.write(stdin.encode())
            process.stdin.close()
        self.processes.append(process)
        return process

    def run_on(self, host: Host, argv: list[str], env: dict[str, str], cwd: str = "/", stdin: str = "",
               user: str | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess:
        """A command on a host to its end."""
        if user:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        return subprocess.run(host.command(argv, cwd), env=env, input=stdin, capture_output=True, text=True,
                              timeout=timeout_s)

    def forward(self, host: Host, local_port: int, target: Host, port: int) -> None:
        """127.0.0.1:local_port of `host` forwarded to `target`'s port, for as long as the rehearsal runs."""
        self.spawn(host, [sys.executable, "-m", "rehearsal.forward", str(local_port), target.ip, str(port)],
                   f"forward-{host.name}-{local_port}", self.base_env(host, "/root"))
        self.wait_port(host, local_port, 30, address="127.0.0.1")

    def wait_port(self, host: Host, port: int, timeout_s: float, address: str | None = None) -> None:
        """Until something listens on the host's port."""
        deadline = time.monotonic() + timeout_s
        probe = f"import socket; socket.create_connection(('{address or host.ip}', {port}), 2).close()"
        while time.monotonic() < deadline:
            if self.run_on(host, [sys.executable, "-c", probe], self.base_env(host, "/root"),
                           timeout_s=30).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError(f"nothing listens on {address or host.ip}:{port} of host {host.name} after {timeout_s}s")

    # -- the shims' requests ------------------------------------------------------------------------------

    def answer(self, call: Call) -> Reply:
        """The stand-in's reply to one command; its failure is the command's (exit 1 and the reason)."""
        found = stand_in(call.argv)
        with self.lock:
            self.records["log"].append({"host": call.host, "argv": call.argv})
        if found is None:
            return Reply(stderr=f"rehearsal: no stand-in for `{shlex.join(call.argv)}`\n", code=127)
        try:
            return found[1](self, call)
        except aws.CloudError as err:
            return Reply(stderr=f"{err}\n", code=err.code)
        except Exception as err:  # a stand-in's own failure: shown as the command's
            return Reply(stderr=f"rehearsal stand-in for `{shlex.join(call.argv[:3])}` failed: "
                                f"{type(err).__name__}: {err}\n", code=1)

    def _write_shims(self) -> None:
        self.shims.mkdir(parents=True, exist_ok=True)
        for name in SHIMS:
            shim = self.shims / name
            shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rehearsal.shim {name} "$@"\n')
            shim.chmod(0o755)


def probe_socket(path: Path) -> bool:
    """Whether the cloud's socket answers (for the shim's error message)."""
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True
