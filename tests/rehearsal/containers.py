"""docker and the Ray cluster launcher of the guides, answered on the rehearsal's hosts.

An image is what its Dockerfile's ENTRYPOINT and CMD say it runs, over this machine's virtualenv (the
project and its requirements, as the image has them). A container is a process of the host it runs on.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path

import yaml

from .aws import CloudError
from .docker import command_of, image_command, image_user, parse_run

HEAD_PORTS = {"dashboard": 8265}
WORKER_RESOURCES = {"CPU": 1}  # this machine's share for the one worker node that stands in for the GPU group


def _reply(stdout: str = "", stderr: str = "", code: int = 0):
    from .cloud import Reply

    return Reply(stdout, stderr, code)


def ok(cloud, call):
    return _reply()


def login(cloud, call):
    return _reply("Login Succeeded\n")


def _flag(argv: list[str], *names: str) -> str | None:
    for i, word in enumerate(argv):
        if word in names and i + 1 < len(argv):
            return argv[i + 1]
    return None


def build(cloud, call):
    argv = call.argv[2:]
    dockerfile, tag = _flag(argv, "-f", "--file") or "Dockerfile", _flag(argv, "-t", "--tag")
    path = cloud.host(call.host).real_path(Path(call.cwd) / dockerfile)
    if not path.is_file() or not tag:
        raise CloudError(f"docker build: no Dockerfile at {dockerfile} or no -t TAG", 1)
    entrypoint, cmd = image_command(path)
    cloud.records["images"][tag] = {"dockerfile": str(path), "entrypoint": entrypoint, "cmd": cmd,
                                    "user": image_user(path), "pushed": False}
    return _reply(f"Successfully tagged {tag}\n")


def push(cloud, call):
    tag = call.argv[2]
    if tag not in cloud.records["images"]:
        raise CloudError(f"An image does not exist locally with the tag: {tag}", 1)
    cloud.records["images"][tag]["pushed"] = True
    return _reply(f"{tag}: pushed\n")


def _pushed(cloud, tag: str) -> dict:
    image = cloud.records["images"].get(tag)
    if image is None or not image["pushed"]:
        raise CloudError(f"Error response from daemon: manifest for {tag} not found: manifest unknown", 1)
    return image


def pull(cloud, call):
    _pushed(cloud, call.argv[2])
    return _reply(f"Status: Downloaded newer image for {call.argv[2]}\n")


def _env_file(host, path: str) -> dict[str, str]:
    lines = host.real_path(Path(path)).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def container_env(cloud, host, run_env: dict[str, str]) -> dict[str, str]:
    """A container's environment: the image's (this machine's virtualenv), the host's role, then the run's."""
    from .cloud import VENV_BIN

    return {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "REHEARSAL_HOST": host.name,
            **cloud.role_env(), **run_env}


def run(cloud, call):
    spec = parse_run(call.argv[2:])
    image = _pushed(cloud, spec.image)
    host = cloud.host(call.host)
    if spec.values("--network", "--net") != ["host"]:
        raise CloudError("rehearsal: a container here shares its host's network (--network host)", 125)
    for volume in spec.values("-v", "--volume"):
        source, target = volume.split(":")[:2]
        if source != target:
            raise CloudError(f"rehearsal: volume {volume} maps a path elsewhere; containers here see the host's", 125)
    env: dict[str, str] = {}
    for path in spec.values("--env-file"):
        env.update(_env_file(host, path))
    for item in spec.values("-e", "--env"):
        name, eq, value = item.partition("=")
        if eq:
            env[name] = value
        elif name in call.env:
            env[name] = call.env[name]
    command = command_of(spec, (image["entrypoint"], image["cmd"]))
    user = (spec.values("-u", "--user") or [image["user"] or "0"])[-1]
    if user.split(":")[0] in ("0", "root"):
        raise CloudError(f"rehearsal: {spec.image} would run as root; the project's containers run as a user", 125)
    # Checked, not applied: this machine's Python (the image's software here) is readable by its owner alone.
    full_env = container_env(cloud, host, env)
    if spec.has("-d", "--detach"):
        name = (spec.values("--name") or ["container"])[-1]
        cloud.spawn(host, command, f"{host.name}-{name}", full_env, cwd="/")
        return _reply(f"{name}-rehearsal\n")
    done = cloud.run_on(host, command, full_env, stdin=call.stdin)
    return _reply(done.stdout, done.stderr, done.returncode)


# -- the Ray cluster launcher ------------------------------------------------------------------------------

def _config(cloud, call) -> tuple[dict, Path]:
    target = next((w for w in call.argv[2:] if w.endswith((".yaml", ".yml"))), None)
    if target is None:
        raise CloudError("ray: the cluster's YAML file is missing", 2)
    path = cloud.host(call.host).real_path(Path(call.cwd) / target)
    return yaml.safe_load(path.read_text()), path


def ray_up(cloud, call):
    config, _ = _config(cloud, call)
    _pushed(cloud, config["docker"]["image"])
    caller = cloud.host(call.host)
    cloud.cluster = {"config": config, "caller_home": call.env.get("HOME", "/root"), "caller": caller.name}
    name = config["cluster_name"]
    nodes = {"head": f"ray-{name}-head", "worker": f"ray-{name}-worker"}
    for kind, host_name in nodes.items():
        if host_name not in cloud.network.hosts:
            cloud.add_host(host_name)
            tags = {"ray-cluster-name": name, "ray-node-type": kind, "Name": host_name}
            cloud.records["instances"][f"i-0{host_name.replace('-', '')}"] = {"host": host_name, "tags": tags}
    start_cluster(cloud)
    return _reply(f"Cluster {name} is up: head {cloud.host(nodes['head']).ip}, 1 worker\n")


def start_cluster(cloud) -> None:
    """Each node as the launcher starts it: initialization commands, file mounts, then its start commands."""
    config = cloud.cluster["config"]
    name = config["cluster_name"]
    head, worker = cloud.host(f"ray-{name}-head"), cloud.host(f"ray-{name}-worker")
    _start_node(cloud, config, head, "head", {})
    cloud.wait_port(head, HEAD_PORTS["dashboard"], 180)
    _start_node(cloud, config, worker, "worker",
                {"RAY_HEAD_IP": head.ip, "RAY_OVERRIDE_RESOURCES": json.dumps(WORKER_RESOURCES)})
    _wait_nodes(cloud, head, 2, 180)


def restart_cluster(cloud) -> None:
    """What `ray up --restart-only` does after the head's machine restarts: every node's Ray started again."""
    name = cloud.cluster["config"]["cluster_name"]
    for kind in ("worker", "head"):
        cloud.host(f"ray-{name}-{kind}").restart()
    start_cluster(cloud)


def _start_node(cloud, config: dict, host, kind: str, extra: dict[str, str]) -> None:
    (host.home / "ubuntu").mkdir(parents=True, exist_ok=True)
    (host.home / "ray").mkdir(parents=True, exist_ok=True)
    shell_env = {**cloud.base_env(host, "/home/ubuntu"), **cloud.role_env()}
    for command in config.get("initialization_commands", []):
        _check(cloud.run_on(host, ["bash", "-c", command], shell_env), host, command)
    caller = cloud.host(cloud.cluster["caller"])
    for target, source in config.get("file_mounts", {}).items():
        source_path = caller.real_path(Path(source.replace("~", cloud.cluster["caller_home"], 1)))
        destination = host.real_path(Path(target))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source_path, destination)
    run_env: dict[str, str] = {"HOME": "/home/ray"}
    for option in config["docker"].get("run_options", []):
        words = shlex.split(option)
        if words[0] == "--env":
            name, _, value = words[1].partition("=")
            run_env[name] = value
        elif words[0] == "--env-file":
            run_env.update(_env_file(host, words[1]))
    env = {**container_env(cloud, host, run_env), **extra}
    for command in config[f"{kind}_start_ray_commands"]:
        # No EC2 here for the autoscaler to scale: the stand-in started the worker node itself.
        command = command.replace("--autoscaling-config=~/ray_bootstrap_config.yaml", "")
        _check(cloud.run_on(host, ["bash", "-c", command], env, cwd="/home/ray", timeout_s=300), host, command)


def _check(done, host, command: str) -> None:
    if done.returncode != 0 and "ray stop" not in command:
        raise CloudError(f"on {host.name}: `{command}` failed ({done.returncode}):\n{done.stderr[-3000:]}", 1)


def _wait_nodes(cloud, head, count: int, timeout_s: float) -> None:
    token = (head.home / "ray" / ".ray" / "auth_token").read_text().strip()
    probe = ("import json, sys, urllib.request as u; r = u.Request('http://127.0.0.1:8265/nodes?view=summary', "
             f"headers={{'Authorization': 'Bearer {token}'}}); nodes = json.load(u.urlopen(r, timeout=10))"
             "['data']['summary']; sys.exit(0 if sum(n['raylet'].get('state') == 'ALIVE' for n in nodes) >= "
             f"{count} else 1)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cloud.run_on(head, ["python", "-c", probe], cloud.base_env(head, "/root"), timeout_s=30).returncode == 0:
            return
        time.sleep(1)
    raise CloudError(f"the cluster did not reach {count} nodes within {timeout_s:.0f}s", 1)


def ray_down(cloud, call):
    name = cloud.cluster["config"]["cluster_name"]
    for kind in ("worker", "head"):
        cloud.host(f"ray-{name}-{kind}").stop()
    return _reply("Destroyed.\n")


def _head(cloud):
    return cloud.host(f"ray-{cloud.cluster['config']['cluster_name']}-head")


def ray_dashboard(cloud, call):
    cloud.forward(cloud.host(call.host), HEAD_PORTS["dashboard"], _head(cloud), HEAD_PORTS["dashboard"])
    return _reply("Forwarding ports 8265 of the head to 127.0.0.1:8265\n")


def ray_attach(cloud, call):
    port = int(_flag(call.argv, "-p", "--port-forward") or 0)
    if not port:
        raise CloudError("rehearsal: ray attach stands in for its -p PORT forward only", 2)
    cloud.forward(cloud.host(call.host), port, _head(cloud), port)
    return _reply(f"Forwarding port {port} of the head to 127.0.0.1:{port}\n")
