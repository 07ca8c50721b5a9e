"""A person's terminal on their own host: a guide's block run in bash as they would type it, prompts answered.

Each block runs in `bash -euo pipefail` under a terminal (util-linux `script`), so `read -s` and getpass
prompt as they do for a person; a prompt is answered from the person's answers by its text. The
variables a block sets (exported or not) carry over to the person's next block, as in one shell.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from pathlib import Path

# Shell variables of bash's own (and the rehearsal's): never carried from one block to the next. POSIX ERE,
# as bash's =~ reads it.
BASH_OWN = ("^(BASH.*|SHELLOPTS|PWD|OLDPWD|SHLVL|HOSTNAME|HOSTTYPE|MACHTYPE|OSTYPE|IFS|PS[124]|OPTERR|OPTIND|PPID|"
            "UID|EUID|_|COLUMNS|LINES|RANDOM|SRANDOM|SECONDS|LINENO|EPOCH[A-Z]+|HISTCMD|PIPESTATUS|GROUPS|DIRSTACK|"
            "FUNCNAME|COMP_[A-Z_]+|HOME|PATH|TERM|USER|REHEARSAL_[A-Z_]+|__[a-z]+)$")
STATE = ".rehearsal-state"


class BlockFailed(AssertionError):
    """A guide's block that did not run through: what it printed says why."""


class Running:
    """A block running in a person's terminal."""

    def __init__(self, person: Person, label: str, process: subprocess.Popen):
        self.person, self.label, self.process = person, label, process
        self.output, self.answered_to = "", 0

    def poll(self, wait_s: float = 0.5) -> int | None:
        """Read what it printed so far (answering prompts); its exit status once it ended."""
        fd = self.process.stdout.fileno()
        readable, _, _ = select.select([fd], [], [], wait_s)
        if readable:
            data = os.read(fd, 65536)
            if data:
                text = data.decode(errors="replace").replace("\r\n", "\n")
                self.output += text
                with self.person.transcript.open("a") as log:
                    log.write(text)
                self._answer()
                return None
        return self.process.poll()

    def _answer(self) -> None:
        pending = self.output[self.answered_to:]
        for prompt, answer in self.person.answers.items():
            at = pending.find(prompt)
            if at >= 0:
                self.process.stdin.write((answer + "\n").encode())
                self.process.stdin.flush()
                self.answered_to += at + len(prompt)
                return

    def wait(self, timeout_s: float) -> str:
        """Until it ends: its output, or BlockFailed with the end of it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.poll()
            if code is not None:
                while self.poll(0.1) is None and self.process.stdout and not self.process.stdout.closed:
                    pass  # the rest of its output
                if code != 0:
                    raise BlockFailed(f"{self.person.name}'s {self.label} exited {code}:\n{self.output[-6000:]}")
                return self.output
        self.process.kill()
        raise BlockFailed(f"{self.person.name}'s {self.label} did not end within {timeout_s:.0f}s:\n"
                          f"{self.output[-6000:]}")

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        """Until its output shows the pattern (it goes on running)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.poll() is not None:
                break
        raise BlockFailed(f"{self.person.name}'s {self.label} never printed {pattern!r}:\n{self.output[-6000:]}")


class Person:
    """Someone with a terminal on a host of their own, a home there, and what they type at prompts."""

    def __init__(self, cloud, name: str, host, cwd: str, answers: dict[str, str]):
        self.cloud, self.name, self.host, self.cwd, self.answers = cloud, name, host, cwd, answers
        self.home = f"/home/{name}"
        host.real_path(Path(self.home)).mkdir(parents=True, exist_ok=True)
        self.transcript = cloud.root / "people" / f"{name}.log"
        self.transcript.parent.mkdir(exist_ok=True)
        self.blocks = 0

    def start(self, block) -> Running:
        """The block running in this person's terminal."""
        self.blocks += 1
        script = Path(self.home) / f".block-{self.blocks}.sh"
        self.host.real_path(script).write_text(
            f"set -euo pipefail\n[ -f ~/{STATE} ] && source ~/{STATE}\ncd {self.cwd}\n"
            f"# {block}\n{block.text}\n"
            f"wait\n"  # what the block started with & has handed its work on before the shell ends
            f"__own='{BASH_OWN}'\n"
            f"for __n in $(compgen -v); do [[ $__n =~ $__own ]] || declare -p \"$__n\"; done "
            f"2>/dev/null | grep -Ev '^declare -[a-zA-Z]*r' > ~/{STATE}\n")
        with self.transcript.open("a") as log:
            log.write(f"\n$ # {block}\n")
        # The person's own AWS login (what `aws configure` gives them): credentials for the local S3 server.
        env = {**self.cloud.base_env(self.host, self.home, TERM="dumb", USER=self.name), **self.cloud.role_env()}
        process = self.host.popen(["script", "-qefc", f"bash --noprofile --norc {script}", "/dev/null"], env,
                                  self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return Running(self, block.label, process)

    def run(self, block, timeout_s: float = 900) -> str:
        """The block, to its end: its output."""
        return self.start(block).wait(timeout_s)
