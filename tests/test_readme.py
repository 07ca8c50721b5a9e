"""The README and docs/ stay true: the config reference, the `nmt` commands they show and the files they name."""

import argparse
import itertools
import json
import re
import shlex
from pathlib import Path

import benchmark_table
import pytest
from config_reference import END, START, reference_markdown

from pipeline.config import Config
from pipeline.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent

# The front page and the docs it links to: their commands and paths are checked alike.
README = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
CONFIG_DOC = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
REGENERATE = "regenerate it: .venv/bin/python tools/config_reference.py --write"
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# The deploy module adds these two subcommands; the README may name them before the parser has them.
DEPLOY_COMMANDS = {"serve", "submit"}
SHELL_OPERATORS = {">", ">>", "<", "|", "&&", "||", ";"}
PATH_PREFIXES = ("configs/", "tune_spaces/", "benchmarks/", "deploy/", "pipeline/", "model/")
PROJECT_PATH = re.compile(r"(?<![\w./:-])((?:" + "|".join(map(re.escape, PATH_PREFIXES)) + r")[\w./*-]*)")


def _code() -> list[str]:
    """The README's code: every fenced block and every inline `code span` outside them."""
    blocks = FENCED.findall(README)
    prose = FENCED.sub("", README)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_config_reference_is_the_generated_table_and_names_every_key():
    assert README.count(START) == 1 and README.count(END) == 1, "docs/configuration.md needs one reference block"
    block = CONFIG_DOC.split(START, 1)[1].split(END, 1)[0]
    assert block.strip() == reference_markdown().strip(), f"the configuration reference is out of date; {REGENERATE}"
    missing = [key for key in Config().flat() if f"| `{key}` |" not in block]
    assert not missing, f"keys missing from the configuration reference: {missing}"
    rows = [re.split(r"(?<!\\)\|", line) for line in block.splitlines() if line.startswith("| `")]
    unexplained = [cells[1].strip() for cells in rows if not cells[3].strip()]
    assert not unexplained, f"keys without a meaning (add a trailing # comment in pipeline/config.py): {unexplained}"


def test_the_benchmark_table_is_generated_from_results_json():
    # Every headline figure has one source: a hand edit of the table, or a results.json that
    # changed without it, fails here.
    page = benchmark_table.PAGE.read_text(encoding="utf-8")
    block = page.split(benchmark_table.START, 1)[1].split(benchmark_table.END, 1)[0]
    results = json.loads(benchmark_table.RESULTS.read_text(encoding="utf-8"))
    assert block.strip() == benchmark_table.headline_markdown(results).strip(), \
        "docs/benchmarks.md's table is out of date; regenerate it: .venv/bin/python tools/benchmark_table.py --write"
    assert block.count("\n| `") == len(benchmark_table.HEADLINES), "a headline's benchmark is missing from results.json"
    load_page = benchmark_table.LOAD_PAGE.read_text(encoding="utf-8")
    load_block = load_page.split(benchmark_table.LOAD_START, 1)[1].split(benchmark_table.LOAD_END, 1)[0]
    assert load_block.strip() == benchmark_table.tracking_load_markdown(results).strip(), \
        "deploy/tracking-server.md's table is out of date; regenerate it: python tools/benchmark_table.py --write"


def test_every_nmt_subcommand_in_the_readme_exists():
    named = {m for text in _code() for m in re.findall(r"(?<![\w/-])nmt (\w+)", text)}
    assert named, "the README shows no nmt commands"
    unknown = named - set(_subcommands(build_parser())) - DEPLOY_COMMANDS
    assert not unknown, f"the README names nmt subcommands the CLI lacks: {sorted(unknown)}"


def _command_lines() -> list[str]:
    """Each `nmt ...` command line of the fenced blocks, continuation lines joined."""
    lines = []
    for block in FENCED.findall(README):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("nmt "):
                lines.append(line)
    return lines


@pytest.mark.parametrize("line", _command_lines())
def test_nmt_command_lines_parse(line):
    args = list(itertools.takewhile(lambda a: a not in SHELL_OPERATORS, shlex.split(line, comments=True)))[1:]
    commands = [args]
    if args[0] == "submit" and "--" in args:  # the submitted command must parse too
        inner = args[args.index("--") + 1:]
        commands.append(inner[1:] if inner[:1] == ["nmt"] else inner)
    for command in commands:
        assert command[0] in _subcommands(build_parser()), f"nmt {command[0]} is not a subcommand"
        try:
            build_parser().parse_args(command)
            parsed = True
        except SystemExit:
            parsed = False
        assert parsed, f"the README's command does not parse: nmt {shlex.join(command)}"


def _exists(path: str) -> bool:
    path = path.rstrip(".")  # a path that ends a sentence
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def test_every_project_path_in_the_readme_exists():
    paths = {m for text in _code() for m in PROJECT_PATH.findall(text)}
    assert paths, "the README names no project paths"
    if not (ROOT / "deploy").is_dir():
        paths = {p for p in paths if not p.startswith("deploy/")}
    missing = sorted(p for p in paths if not _exists(p))
    assert not missing, f"the README names files that do not exist: {missing}"


def test_the_readme_demo_transcript_is_cut_from_the_committed_capture():
    # Every line the README shows (`...` elides) is a line of docs/demo-output.txt, a real `nmt demo` run.
    capture = [line.rstrip() for line in (ROOT / "docs" / "demo-output.txt").read_text().splitlines()]
    transcript = next(block for block in FENCED.findall(README) if "=== [1/4]" in block)
    shown = [line.rstrip() for line in transcript.splitlines() if line.strip() not in ("", "...")]
    assert len(shown) > 20
    for line in shown:
        pattern = re.compile(re.escape(line).replace(re.escape("..."), ".*"))
        assert any(pattern.fullmatch(real) for real in capture), f"not in docs/demo-output.txt: {line!r}"


def _demo_capture(name: str) -> tuple[float, int, float]:
    """(minutes, lines, test BLEU) of a committed `nmt demo` capture."""
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    minutes = float(re.search(r"^Done in ([0-9.]+) min", text, re.MULTILINE).group(1))
    bleu = float(re.search(r"^test BLEU ([0-9.]+),", text, re.MULTILINE).group(1))
    return minutes, len(text.splitlines()), bleu


def test_the_readme_demo_figures_are_those_of_the_committed_captures():
    page = (ROOT / "README.md").read_text(encoding="utf-8")
    minutes, lines, bleu = _demo_capture("demo-output.txt")
    said = re.search(r"takes about ([0-9.]+) minutes and prints about (\d+) lines", page)
    assert said, "the README no longer says how long `make demo` takes"
    assert abs(float(said[1]) - minutes) <= 0.15 * minutes and abs(int(said[2]) - lines) <= 0.05 * lines, \
        (said.groups(), minutes, lines)
    assert f"test BLEU {bleu:.1f}" in page, bleu
    minutes, lines, bleu = _demo_capture("demo-quick-output.txt")
    recipe = (ROOT / "docs" / "recipes" / "demo.md").read_text(encoding="utf-8")  # the quick demo's details
    said = re.search(r"about ([0-9.]+) minutes and (\d+) lines \(\[the captured run\]\(\.\./demo-quick-output.txt\)"
                     r"\).*?at least 5 \(about (\d+) in that run\)", recipe, re.DOTALL)
    assert said, "docs/recipes/demo.md no longer states the quick demo's figures next to its capture"
    assert abs(float(said[1]) - minutes) <= 0.15 * minutes and int(said[2]) == lines and \
        abs(int(said[3]) - bleu) <= 1, (said.groups(), minutes, lines, bleu)


def test_the_suite_figures_in_the_docs_are_those_of_the_committed_test_run():
    capture = (ROOT / "docs" / "test-run.txt").read_text(encoding="utf-8")
    summary = re.search(r"(\d+) passed(?:, (\d+) skipped)?.* in ([0-9.]+)s", capture)
    passed, skipped, minutes = int(summary[1]), int(summary[2] or 0), float(summary[3]) / 60
    for page in ("README.md", "docs/testing.md"):
        said = re.search(r"make test +# .*?about (\d+) minutes on 2 cores", (ROOT / page).read_text(encoding="utf-8"))
        assert said, f"{page} no longer says how long make test takes"
        assert abs(int(said[1]) - minutes) <= 0.1 * minutes + 1, (page, said[1], minutes)
    testing = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    count = re.search(r"make test +# all (\d+) \((\d+) of them need a GPU", testing)
    assert count and int(count[1]) == passed + skipped and int(count[2]) <= skipped, (count, passed, skipped)


def test_the_docs_read_in_an_afternoon():
    """The README under 1,400 words, each platform guide under 2,500, no other page over 3,000 (as wc -w counts)."""
    limits = {ROOT / "README.md": 1400, ROOT / "deploy/aws/README.md": 2500, ROOT / "deploy/kuberay/README.md": 2500}
    pages = [*limits, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]
    too_long = {str(page.relative_to(ROOT)): words for page in dict.fromkeys(pages)
                if (words := len(page.read_text(encoding="utf-8").split())) >= limits.get(page, 3001)}
    assert not too_long, f"pages at or over their limit (README 1,400, platform guides 2,500, others 3,000): {too_long}"
