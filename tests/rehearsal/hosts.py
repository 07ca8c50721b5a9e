"""Hosts on one machine: each a network namespace on a private bridge, with its own processes, /home and /tmp/ray.

A host is a long-lived init process (`sleep`) in namespaces of its own: network (an address on the
bridge, a hosts file of its own), UTS (its name), mount (its own /home, /tmp/ray and any other directories bound
over the machine's) and PID (`ray stop` on one host sees only that host's processes; killing the
init ends every process of the host at once, as a lost machine does). Commands run on a host
through `nsenter` into the init's namespaces. Needs root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Host:
    """One machine of the rehearsal: its address, its directory, its namespaces' init process."""

    def __init__(self, network: Network, name: str, ip: str, binds: dict[str, Path] | None = None):
        self.network, self.name, self.ip = network, name, ip
        self.netns = f"{network.tag}-{name}"
        self.root = network.root / name
        self.home = self.root / "home"
        # Directories of the machine this host has its own of (a None source: one under the host's directory).
        binds = {"/home": self.home, "/tmp/ray": None, **(binds or {})}
        self.binds = {target: source or self.root / target.strip("/").replace("/", "-")
                      for target, source in binds.items()}
        self.init: subprocess.Popen | None = None
        self.pid = 0  # the init's pid as this machine sees it
        self.vpc = True  # whether it resolves the private zone's names (a laptop does not)

    @property
    def hosts_file(self) -> Path:
        return Path("/etc/netns") / self.netns / "hosts"

    def real_path(self, path: Path) -> Path:
        """Where a path of this host is on the machine (its own directories are bound elsewhere)."""
        for target, source in self.binds.items():
            if path == Path(target) or Path(target) in path.parents:
                return source / path.relative_to(target)
        return path

    def start(self) -> None:
        """The namespace on the bridge, its hosts file, then its init with the directories bound in place."""
        for path in self.binds.values():
            path.mkdir(parents=True, exist_ok=True)
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text(f"127.0.0.1 localhost\n{self.ip} {self.name}\n")
        # No DNS server here: a name the hosts file lacks fails at once, as on a network whose resolver knows
        # nothing more, rather than after this machine's resolver times out across the bridge (10 s a lookup,
        # which gloo's rendezvous makes for each worker's address).
        (self.hosts_file.parent / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        _ip("netns", "add", self.netns)
        peer = f"v{self.network.tag}{len(self.network.hosts)}"[:15]
        _ip("link", "add", peer, "netns", self.network.switch, "type", "veth", "peer", "name", "eth0", "netns",
            self.netns)
        _ip("-n", self.network.switch, "link", "set", peer, "master", "br0", "up")
        _ip("-n", self.netns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        _ip("-n", self.netns, "link", "set", "eth0", "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        # A default route, so that programs that find their address by routing (Ray) find this one.
        _ip("-n", self.netns, "route", "add", "default", "via", self.network.gateway)
        self._start_init()

    def _start_init(self) -> None:
        mounts = "; ".join(f"mkdir -p {target} && mount --bind {source} {target}"
                           for target, source in self.binds.items())
        self.init = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private", "--pid", "--fork",
             "--mount-proc", "--uts", "sh", "-c", f"hostname {self.name}; {mounts}; exec sleep infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            sleeper = [p for p in psutil.Process(self.init.pid).children(recursive=True) if p.name() == "sleep"]
            if sleeper:
                self.pid = sleeper[0].pid
                return
            if self.init.poll() is not None:
                raise RuntimeError(f"host {self.name} did not start: {self.init.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"host {self.name} did not start within 20 s")

    def command(self, argv: list[str], cwd: str | Path = "/") -> list[str]:
        """argv as run on this host (its network, mounts and processes), in directory cwd."""
        # The directory is entered inside the host's mounts (nsenter's --wd opens it outside them).
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-p", "-u", "--", "sh", "-c",
                'cd "$1" && shift && exec "$@"', "sh", str(cwd), *argv]

    def popen(self, argv: list[str], env: dict[str, str], cwd: str | Path = "/", **kwargs) -> subprocess.Popen:
        """Start a process on this host."""
        return subprocess.Popen(self.command(argv, cwd), env=env, **kwargs)

    def add_names(self, names: dict[str, str]) -> None:
        """Names this host resolves (name -> address), appended in place: its running processes see them too."""
        with self.hosts_file.open("a") as out:
            out.writelines(f"{ip} {name}\n" for name, ip in names.items())

    def stop(self) -> None:
        """Every process of the host at once (its init is PID 1 of its namespace)."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.init is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.init.wait(30)
        self.pid = 0

    def restart(self) -> None:
        """The machine restarted: every process gone, its disks (directories) and address kept."""
        self.stop()
        self._start_init()

    def remove(self) -> None:
        self.stop()
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)
        shutil.rmtree(self.hosts_file.parent, ignore_errors=True)


class Network:
    """A private network 10.X.0.0/24 of hosts on one bridge (in a namespace of its own: this machine's is untouched)."""

    def __init__(self, root: Path, tag: str, subnet: str = "10.66.0"):
        self.root, self.tag, self.subnet = root, tag, subnet
        self.switch = f"{tag}-switch"
        self.gateway = f"{subnet}.1"
        self.hosts: dict[str, Host] = {}

    def start(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "addr", "add", f"{self.gateway}/24", "dev", "br0")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add(self, name: str, binds: dict[str, Path] | None = None) -> Host:
        """A new host, started, with the next address."""
        host = Host(self, name, f"{self.subnet}.{10 + len(self.hosts)}", binds)
        self.hosts[name] = host
        host.start()
        return host

    def stop(self) -> None:
        for host in reversed(list(self.hosts.values())):
            host.remove()
        subprocess.run(["ip", "netns", "delete", self.switch], capture_output=True)
