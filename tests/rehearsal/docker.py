"""What `docker run IMAGE ARGS` runs: the image's ENTRYPOINT and CMD combined with ARGS as docker combines them."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The project's images, by repository name: the Dockerfile each is built from.
DOCKERFILES = {"nmt-mlflow": ROOT / "deploy" / "mlflow.Dockerfile", "transformer-nmt": ROOT / "deploy" / "Dockerfile"}
# `docker run` options that take a value (the rest of those used are flags).
VALUED = {"-e", "--env", "--env-file", "-v", "--volume", "--network", "--net", "--name", "--restart", "-u", "--user",
          "--entrypoint", "-p", "--publish", "--ulimit", "-w", "--workdir", "--mount", "--gpus", "--shm-size"}
FLAGS = {"-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "-it", "--init", "--privileged"}


@dataclass
class Run:
    """One `docker run`: its options (in order, as (name, value)), the image, and the arguments after it."""

    options: list[tuple[str, str | None]] = field(default_factory=list)
    image: str = ""
    args: list[str] = field(default_factory=list)

    def values(self, *names: str) -> list[str]:
        return [value for name, value in self.options if name in names and value is not None]

    def has(self, *names: str) -> bool:
        return any(name in names for name, _ in self.options)


def parse_run(argv: list[str]) -> Run:
    """`docker run ...` (argv after `docker run`) as options, image and arguments; an unknown option is an error."""
    run, i = Run(), 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            run.image, run.args = word, argv[i + 1:]
            return run
        name, eq, value = word.partition("=")
        if name in VALUED:
            if not eq:
                i += 1
                value = argv[i]
            run.options.append((name, value))
        elif word in FLAGS:
            run.options.append((word, None))
        else:
            raise ValueError(f"docker run option {word!r} is not one this stand-in knows")
        i += 1
    raise ValueError(f"docker run without an image: {shlex.join(argv)}")


def _instruction(value: str) -> list[str]:
    """An ENTRYPOINT or CMD value: the exec form's JSON list, or the shell form wrapped in /bin/sh -c."""
    value = value.strip()
    if value.startswith("["):
        return json.loads(value)
    return ["/bin/sh", "-c", value]


def image_command(dockerfile: Path) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) the Dockerfile's last stage sets; an ENTRYPOINT set there empties the base image's CMD."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    logical = dockerfile.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in logical.splitlines():
        keyword, _, value = line.strip().partition(" ")
        if keyword.upper() == "FROM":  # a new stage: what the project's base images set is not known here
            entrypoint, cmd = [], []
        elif keyword.upper() == "ENTRYPOINT":
            entrypoint, cmd = _instruction(value), []
        elif keyword.upper() == "CMD":
            cmd = _instruction(value)
    return entrypoint, cmd


def image_user(dockerfile: Path) -> str:
    """The USER the Dockerfile's last stage runs as ("" for root)."""
    user = ""
    for line in dockerfile.read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        keyword, _, value = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            user = ""
        elif keyword.upper() == "USER":
            user = value.strip()
    return user


def dockerfile_of(image: str) -> Path:
    """The project's Dockerfile an image reference was built from (REGISTRY/name:tag)."""
    name = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    if name not in DOCKERFILES:
        raise ValueError(f"image {image!r} is none of the project's ({', '.join(DOCKERFILES)})")
    return DOCKERFILES[name]


def command_of(run: Run, image: tuple[list[str], list[str]] | None = None) -> list[str]:
    """The command the container runs: --entrypoint or ENTRYPOINT, then the arguments or else CMD.

    image: (ENTRYPOINT, CMD) as built; by default those of the project's Dockerfile for run.image.
    """
    entrypoint, cmd = image or image_command(dockerfile_of(run.image))
    if run.has("--entrypoint"):
        entrypoint, cmd = [run.values("--entrypoint")[-1]], []
    command = [*entrypoint, *(run.args or cmd)]
    if not command:
        raise ValueError(f"{run.image}: no ENTRYPOINT, no CMD and no arguments: nothing to run")
    return command
