"""A cloud command on a rehearsal host: sent to the rehearsal's Cloud, or run as written when nothing stands in.

    python -m rehearsal.shim aws ec2 describe-vpcs ...      (the shims on each host's PATH call this)
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from .cloud import VENV_BIN, stand_in

REAL = {"curl": "/usr/bin/curl", "ray": str(VENV_BIN / "ray")}


def _reads_stdin(argv: list[str]) -> bool:
    """Whether the command takes input on stdin (docker login --password-stdin, docker run -i)."""
    return argv[:2] == ["docker", "login"] and "--password-stdin" in argv or argv[:2] == ["docker", "run"] and any(
        word in ("-i", "--interactive", "-it") for word in argv[2:argv.index(next((w for w in argv[2:] if not
                                                                                     w.startswith("-")), argv[-1]))])


def _files(argv: list[str]) -> dict[str, str]:
    """The files named by file:// arguments, read here (a /dev/fd of a process substitution included)."""
    found = {}
    for word in argv:
        if "file://" in word:
            path = word[word.index("file://") + len("file://"):]
            try:
                found[path] = Path(path).read_text()
            except OSError:
                pass  # the stand-in says which file could not be loaded
    return found


def main(argv: list[str]) -> int:
    if stand_in(argv) is None and argv[0] in REAL:
        os.execv(REAL[argv[0]], [argv[0], *argv[1:]])
    call = {"argv": argv, "host": os.environ["REHEARSAL_HOST"], "cwd": os.getcwd(), "env": dict(os.environ),
            "stdin": sys.stdin.read() if _reads_stdin(argv) else "", "files": _files(argv)}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(os.environ["REHEARSAL_SOCKET"])
        sock.sendall((json.dumps(call) + "\n").encode())
        reply = json.loads(sock.makefile().readline())
    sys.stdout.write(reply["stdout"])
    sys.stderr.write(reply["stderr"])
    return reply["code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
