"""The guides hold: every `nmt submit` example works as written, every relative link leads somewhere.

A markdown file is one route, read top to bottom as a user types it: its shell lines set the
environment (`export`, `read`, `unset`, assignments), and each `nmt submit` example is planned
(`pipeline.launch.submit.plan`, no network) against a cluster that does not share this machine's
files, in the environment the route has set up by then and nothing else. So an example fails here
when it sends a path or an MLflow store only this machine has, names a variable the route never
sets, relies on a login or a cluster token the route never provides, or puts a password on the
command line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pytest
from small import ROOT

from pipeline.common.errors import UserError
from pipeline.launch import dashboard, submit
from pipeline.parser import build_parser

PAGES = sorted({ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "deploy").rglob("*.md")})
GUIDES = [ROOT / "deploy" / "kuberay" / "README.md", ROOT / "deploy" / "aws" / "README.md"]
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
# The environment a submitted command may read here; everything else of this process's own is cleared.
CLEARED = re.compile(r"^(MLFLOW_|RAY_|AWS_|NMT_)")
SHELL = {"HOME", "PWD", "USER", "PATH"}  # what every shell has set
# Commands whose job logs to MLflow: the submitter's login must be in the route's environment.
LOGS_TO_MLFLOW = {"train", "tune", "evaluate", "promote", "demo", "export"}


@dataclass
class Route:
    """What the lines of one page have set up so far: shell variables, which are exported, a token file."""

    variables: dict[str, str] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    token_file: bool = False

    def expand(self, word: str, where: str, strict: bool = True) -> str:
        """word with $NAME and ${NAME} replaced; strict: a name the route has not set fails the test."""
        def value(match: re.Match) -> str:
            name = match[1] or match[2]
            if name in self.variables:
                return self.variables[name]
            if name in SHELL or not strict:
                return ""
            pytest.fail(f"{where}: uses ${name}, which the page does not set before (export it or read it)")
        if "$(" in word or "`" in word:  # a command's output: a value of its own, not checked
            return re.sub(r"\$\([^)]*\)|`[^`]*`", "output-of-a-command", word)
        return VARIABLE.sub(value, word)

    def environment(self) -> dict[str, str]:
        return {name: self.variables[name] for name in self.exported if name in self.variables}


@dataclass
class Example:
    page: Path
    line: int
    words: list[str]
    route: Route

    def __str__(self) -> str:
        return f"{_name(self.page)}:{self.line}"


def _simple_commands(line: str) -> list[list[str]]:
    """A shell line split at its operators into simple commands (words still quoted as written)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, words = [], []
    try:
        for token in lexer:
            if token in OPERATORS:  # a subshell's parentheses open or close a command; `$(` opens none
                commands += [words, [token]] if token in "()" and not words else [words]
                words = []
            else:
                words.append(token)
    except ValueError:  # an unbalanced quote: a line the route does not run (JSON inside a comment, say)
        return []
    return [c for c in [*commands, words] if c]


def _assign(route: Route, word: str, where: str, export: bool) -> None:
    name, _, value = word.partition("=")
    route.variables[name] = route.expand(value, where, strict=False)
    if export:
        route.exported.add(name)


def _read_names(words: list[str]) -> list[str]:
    """The variable names a `read` fills (its -p prompt and other option arguments skipped)."""
    names, skip = [], False
    for word in words[1:]:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word[-1] in "pdtnNua"  # options whose argument is the next word
        else:
            names.append(word)
    return names


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _shell_lines(text: str):
    """(line number, logical line) of every code block's lines, continuation lines joined."""
    for block in FENCED.finditer(text):
        number = text.count("\n", 0, block.start(1)) + 1
        start, pending = number, ""
        for offset, line in enumerate(block.group(1).splitlines()):
            if not pending:
                start = number + offset
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            yield start, pending + line
            pending = ""


def examples(page: Path) -> list[Example]:
    """Every `nmt submit` of the page's code blocks, each with the route as it stood just before it."""
    route, found, outer = Route(), [], []
    for number, line in _shell_lines(page.read_text(encoding="utf-8")):
        where = f"{_name(page)}:{number}"
        for words in _simple_commands(line):
            if words == ["("]:  # a subshell: what it sets ends with it
                outer.append(route)
                route = Route(dict(route.variables), set(route.exported), route.token_file)
            elif words == [")"] and outer:
                route = outer.pop()
            elif words[0] == "export":
                for word in words[1:]:
                    if "=" in word:
                        _assign(route, word, where, export=True)
                    elif not word.startswith("-"):
                        route.exported.add(word)
            elif words[0] == "read":
                for name in _read_names(words):
                    route.variables[name] = f"typed-{name.lower()}"
            elif words[0] == "unset":
                for name in words[1:]:
                    route.variables.pop(name, None)
                    route.exported.discard(name)
            elif all(re.fullmatch(r"[A-Za-z_]\w*=.*", w, re.S) for w in words):
                for word in words:
                    _assign(route, word, where, export=False)
            elif words[:2] == ["ray", "get-auth-token"]:
                route.token_file = True
            elif words[:2] == ["nmt", "submit"]:
                snapshot = Route(dict(route.variables), set(route.exported), route.token_file)
                found.append(Example(page, number, words[2:], snapshot))
    return found


ALL = [example for page in PAGES for example in examples(page)]


def test_guide_pages_have_submit_examples_to_check():
    pages = {example.page for example in ALL}
    assert set(GUIDES) <= pages and ROOT / "README.md" in pages, sorted(str(p) for p in pages)


@pytest.mark.parametrize("example", ALL, ids=str)
def test_guide_submit_example_is_accepted_for_a_cluster_that_shares_no_files(example, monkeypatch):
    where, route = str(example), example.route
    words = [route.expand(word, where) for word in example.words]
    args = build_parser().parse_args(["submit", *words])
    for name in [n for n in os.environ if CLEARED.match(n)]:
        monkeypatch.delenv(name)
    for name, value in route.environment().items():
        monkeypatch.setenv(name, value)
    forward = [n for n in args.forward_env.split(",") if n]
    try:
        job = submit.plan(args.job, dashboard.cluster_address(args.address), pip=args.pip, forward_env=forward,
                          remote=True)
    except UserError as err:
        pytest.fail(f"{where}: `nmt submit {shlex.join(words)}` is refused: {err}")
    env = route.environment()
    assert env.get("RAY_AUTH_MODE") == "token", f"{where}: the route never sets RAY_AUTH_MODE=token for the cluster"
    assert "RAY_AUTH_TOKEN" in env or "RAY_AUTH_TOKEN_PATH" in env or route.token_file, \
        f"{where}: the route gives no cluster token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ray get-auth-token)"
    assert not any(re.search(r"://[^/\s:@]+:[^/\s@]+@", word) for word in words), \
        f"{where}: a password on the command line; export MLFLOW_TRACKING_PASSWORD (read -s) instead"
    command = submit.nmt_args(args.job)[0]
    if command in LOGS_TO_MLFLOW:
        login = {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} <= set(env) or "MLFLOW_TRACKING_TOKEN" in env
        assert login, f"{where}: `nmt {command}` logs to MLflow, but the route exports no MLflow login before it"
        # The guides say the job runs under the submitter's login: nmt submit forwards it, apart from the command.
        assert set(job.secrets) & {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_TOKEN"}, \
            f"{where}: nmt submit does not forward the route's MLflow login to the job"


def test_guide_route_reader_catches_what_breaks_an_example(tmp_path, monkeypatch):
    """The checks above fail on the mistakes they are for (a bare path, an unset variable, no login)."""
    page = tmp_path / "guide.md"
    page.write_text("```bash\n"
                    "export RAY_ADDRESS=http://127.0.0.1:8265 RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\"$(cat token)\"\n"
                    "export MLFLOW_TRACKING_URI=http://mlflow.example:5000 MLFLOW_TRACKING_USERNAME=alice\n"
                    "read -rsp 'password: ' MLFLOW_TRACKING_PASSWORD && export MLFLOW_TRACKING_PASSWORD\n"
                    "nmt submit -- train --config configs/wmt14_en_de.yaml --set data.output_dir=$BUCKET/x\n"
                    "nmt submit -- train --config configs/wmt14_en_de.yaml \\\n"
                    "    --set train.storage_path=/mnt/shared/runs\n"
                    "BUCKET=s3://b\n"
                    "nmt submit -- train --config configs/wmt14_en_de.yaml --set data.output_dir=$BUCKET/x\n"
                    "```\n")
    unset, bare, good = examples(page)
    assert (unset.line, bare.line, good.line) == (5, 6, 9)
    assert good.route.environment()["MLFLOW_TRACKING_PASSWORD"] and "BUCKET" not in good.route.exported
    test_guide_submit_example_is_accepted_for_a_cluster_that_shares_no_files(good, monkeypatch)
    for broken, message in ((unset, "uses $BUCKET"), (bare, "train.storage_path=/mnt/shared/runs")):
        with pytest.raises(pytest.fail.Exception, match=re.escape(message)):
            test_guide_submit_example_is_accepted_for_a_cluster_that_shares_no_files(broken, monkeypatch)
    good.route.exported.discard("MLFLOW_TRACKING_PASSWORD")
    with pytest.raises(AssertionError, match="no MLflow login"):
        test_guide_submit_example_is_accepted_for_a_cluster_that_shares_no_files(good, monkeypatch)


# ---- links ----

def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug, n = _slug(heading), 0
        while (f"{slug}-{n}" if n else slug) in anchors:
            n += 1
        anchors.add(f"{slug}-{n}" if n else slug)
    return anchors


def _links(page: Path) -> list[str]:
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_guide_links_lead_to_files_and_headings_that_exist(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / unquote(path)).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no heading #{anchor} in {target.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_guide_each_platform_has_numbered_steps_its_mlflow_server_and_security_last():
    for guide in GUIDES:
        text = guide.read_text(encoding="utf-8")
        headings = re.findall(r"^## (.+)$", FENCED.sub("", text), re.M)
        numbers = [int(m[1]) for h in headings if (m := re.match(r"(\d+)\. ", h))]
        assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 5, (guide, headings)
        assert any(re.match(r"\d+\. .*MLflow server", h) for h in headings), f"{guide}: no MLflow server step"
        assert "../tracking-server.md" in text, f"{guide}: no link to the tracking server's guide"
        assert headings[-1].startswith("Security"), f"{guide}: security comes last, not {headings[-1]!r}"
        assert not re.search(r"step \d+/\d+|AWS step", text), f"{guide}: a step that points into another file"


# ---- the AWS MLflow server's files ----

AWS = ROOT / "deploy" / "aws"


def test_guide_aws_mlflow_server_script_parses_and_its_role_allows_what_it_calls():
    import json

    import yaml

    script = (AWS / "mlflow-server.sh").read_text()
    commands = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert subprocess.run(["bash", "-n", str(AWS / "mlflow-server.sh")]).returncode == 0
    policy = json.loads((AWS / "mlflow-server-policy.json").read_text())
    actions = {a.lower() for s in policy["Statement"] if s["Effect"] == "Allow"
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    # A CLI command's IAM action: its name without dashes, but for those named otherwise.
    renamed = {"ecr:getloginpassword": "ecr:getauthorizationtoken"}
    called = {renamed.get(name, name) for name in (f"{service}:{op.replace('-', '')}".lower() for service, op
                                                   in re.findall(r"\baws (\w+) ([a-z][a-z-]+)", commands))}
    assert called and called <= actions, f"the script calls {sorted(called - actions)}, which its role lacks"
    bucket = re.search(r"^BUCKET=(\S+)$", script, re.M)[1]
    prefix = re.search(r"s3://\$BUCKET/([\w-]+)", script)[1]
    resources = {r for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str)
                                                          else s["Resource"])}
    assert f"arn:aws:s3:::{bucket}/{prefix}/*" in resources and f"arn:aws:s3:::{bucket}" in resources
    # The same MLflow server as on Kubernetes, and no secret in the file.
    images = {c["image"] for d in yaml.safe_load_all((ROOT / "deploy/kuberay/mlflow.yaml").read_text())
              if d and d["kind"] in ("Deployment", "StatefulSet")
              for c in d["spec"]["template"]["spec"]["containers"] if "/nmt-mlflow:" in c["image"]}
    image = re.search(r"^IMAGE=\$REGISTRY(/\S+)$", script, re.M)
    assert image and {f"REGISTRY{image[1]}"} == images, f"deploy/aws/mlflow-server.sh runs another image than {images}"
    assert "--app-name basic-auth" in script and "postgresql+psycopg://" in script
    assert not re.search(r"://[^/\s:@$]+:[^/\s@$]+@", script), "a URL with a literal password"


def _script_docker_runs(script: str) -> list[list[str]]:
    """Each `docker run` of a shell script, continuation lines joined, up to a here-document or pipe."""
    variables = dict(re.findall(r"^([A-Z_]+)=(\S+)", script, re.M))
    runs = []
    for line in script.replace("\\\n", " ").splitlines():
        if "docker run" not in line or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line.split("<<", 1)[0].split(" | ", 1)[0], comments=True)
        words = words[words.index("docker") + 2:]
        runs.append([VARIABLE.sub(lambda m: variables.get(m[1] or m[2], "value"), word) for word in words])
    return runs


def _mlflow_command_error(argv: list[str]) -> str | None:
    """Why `mlflow ...` would refuse these arguments (click's own parsing), or None."""
    import click
    from mlflow.cli import cli

    try:
        with cli.make_context("mlflow", list(argv[1:]), resilient_parsing=False) as context:
            name, command, rest = cli.resolve_command(context, context.protected_args + context.args)
            with command.make_context(name, rest, parent=context):
                return None
    except click.ClickException as err:
        return err.format_message()


def test_guide_aws_mlflow_server_containers_run_valid_commands_with_the_images_entrypoint():
    from rehearsal.docker import command_of, parse_run

    runs = [parse_run(argv) for argv in _script_docker_runs((AWS / "mlflow-server.sh").read_text())]
    commands = [command_of(run) for run in runs]
    assert len(commands) == 2, commands
    database, server = commands
    assert database == ["python", "-"], f"the database step runs {database}, not the image's Python"
    assert server[:2] == ["mlflow", "server"], server
    assert _mlflow_command_error(server) is None, f"`{shlex.join(server)}`: {_mlflow_command_error(server)}"


def test_guide_docker_combination_catches_an_entrypoint_doubled():
    from rehearsal.docker import command_of, parse_run

    doubled = command_of(parse_run(["--rm", "REGISTRY/nmt-mlflow:3.17.2", "mlflow", "server", "--port", "5000"]))
    assert doubled[:4] == ["mlflow", "server", "mlflow", "server"]
    assert "unexpected extra arguments" in _mlflow_command_error(doubled)
    assert command_of(parse_run(["--entrypoint", "python", "REGISTRY/nmt-mlflow:3.17.2", "-"])) == ["python", "-"]
