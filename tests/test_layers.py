"""The package's import graph: no cycles, and no import from a lower layer to a higher one
(README, "Layout"). Every import counts, also those inside functions: a lazy import defers a
module's loading, it does not change which layer depends on which."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS = ["core", "codecheck", "backends", "exec", "search", "run", "llm", "sweeps", "offline",
          "serve", "model", "cli"]
# Top-level modules: `tuner.api` (the Python API), `tuner.runtime` (the public serving API) and
# `__main__` sit on top, and so does the package's own __init__, which names the API's entry
# points (lazily) besides the version and the value types; importing it from below (for the
# version) is not counted as going up.
TOP_LEVEL = {"tuner": "api", "tuner.runtime": "api", "tuner.__main__": "api", "tuner.api": "api",
             # what a `cuda` launch module imports: a public short name, in the backends layer
             "tuner.cuda": "backends"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _layer(module: str) -> str:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    return module.split(".")[1]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    # a package's __init__ is reached through any of its modules: leave it out as a target
    # unless it is imported by name.
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_every_module_is_in_a_layer():
    unknown = sorted(m for m in _graph() if _layer(m) not in LAYERS and _layer(m) != "api")
    assert not unknown, f"modules in no layer (add their package to LAYERS): {unknown}"


def test_no_import_goes_up_a_layer():
    order = {layer: i for i, layer in enumerate(LAYERS)}
    order["api"] = len(LAYERS)
    upward = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts
                    if t != "tuner" and order[_layer(t)] > order[_layer(m)])
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if t == "tuner" or t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
