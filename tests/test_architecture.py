"""The package's shape: stages import one another without circles, and nobody imports another module's private names."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("common", "data", "train", "tune", "track", "serve", "text", "launch")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in the file, at any depth."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [alias.name for alias in node.names]
            found.append((base, names, node.lineno))
            # `from . import tracking` imports the module pipeline.track.tracking
            found += [(f"{base}.{name}", [], node.lineno) for name in names]
    return found


def _pipeline_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / "pipeline").rglob("*.py")}


def test_there_are_no_import_cycles_among_pipeline_modules():
    modules = _pipeline_modules()
    graph = {name: sorted({target for target, _, _ in _imports(path) if target in modules and target != name})
             for name, path in modules.items()}
    # A package's __init__ is imported with each of its modules: it must import nothing of the pipeline.
    for name in modules:
        if modules[name].name == "__init__.py" and name != "pipeline":
            assert not graph[name], f"{name} imports {graph[name]}: stage packages only describe themselves"
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in graph[name]:
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target] if target in path else [name, target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_module_imports_private_names_of_another():
    modules = _pipeline_modules()
    local = {_module_name(p) for folder in ("tests", "benchmarks") for p in (ROOT / folder).glob("*.py")}
    local |= {name.rpartition(".")[2] for name in local}  # tests import their helpers by bare name
    offenders = []
    for folder in ("pipeline", "tests", "benchmarks", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for target, names, line in _imports(path):
                if target not in modules and target not in local:
                    continue
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    offenders.append(f"{path.relative_to(ROOT)}:{line}: {', '.join(private)} from {target}")
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


def test_each_stage_package_says_in_one_line_what_it_does():
    for stage in STAGES:
        init = ROOT / "pipeline" / stage / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert docstring and "\n" not in docstring.strip(), f"{init}: a one-line docstring"



# Lower layers never import higher ones: the order a reader can learn the package in.
LAYERS = (("pipeline.common",), ("pipeline.config", "pipeline.config_keys"), ("pipeline.text", "pipeline.data"),
          ("pipeline.track",), ("pipeline.train", "pipeline.serve"), ("pipeline.tune",),
          ("pipeline.launch", "pipeline.parser"),  # nmt submit checks the command it sends with nmt's own parser
          ("pipeline.cli", "pipeline.__main__"))


def _layer(module: str) -> int | None:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def test_no_module_imports_from_a_higher_layer():
    modules = _pipeline_modules()
    upward = []
    for name, path in sorted(modules.items()):
        mine = _layer(name)
        for target, _, line in _imports(path):
            theirs = _layer(target) if target in modules else None
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {name} (layer {mine}) imports {target} "
                              f"(layer {theirs})")
    order = " < ".join("/".join(p.split(".")[-1] for p in layer) for layer in LAYERS)
    assert not upward, f"imports that run up the layers {order}:\n" + "\n".join(upward)
