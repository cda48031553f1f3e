"""The shape of the house: no import cycle among podkit's modules and no import against the
layer order, read from the source with `ast` (function-level imports included, so an import
moved into a function to survive a cycle is still seen).

The layer order is docs/design.md's: a module imports only from its own layer or below."""

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "podkit"

# Layer of each top-level name under podkit (a module or a subpackage and all it holds).
LAYERS = {
    1: ["errors", "_version", "_lazy", "lifetime", "config", "utils", "serialization",
        "paths"],
    2: ["compile_cache", "cluster", "console", "jobenv", "elastic", "agree", "termination",
        "heartbeat", "hardware", "topology", "sharding", "strategy", "kernels", "io", "image",
        "data", "checkpoint"],
    3: ["layers", "symbolic", "functional", "architectures", "losses", "metrics", "optimizers",
        "initializers", "regularizers"],
    4: ["train"],
    5: ["trainer", "model", "sequential", "saving", "interop", "callbacks", "monitor"],
    6: ["models", "datasets", "runs", "launch", "submit", "sim", "cli"],
    7: ["__init__"],  # the public API: podkit itself, above everything
}
LAYER = {name: layer for layer, names in LAYERS.items() for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The podkit modules `name` imports (`from pkg import mod` counts as importing mod)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base
                                                                           else []))
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                          for a in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:  # a name inside a module
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYER, (f"podkit.{top} has no layer: add it to LAYERS in this test and to "
                          "the layer order in docs/design.md")
    return LAYER[top]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    edges = graph()
    assert "podkit.model" in edges and "podkit.train.loop" in edges["podkit.model"] or any(
        m.startswith("podkit.train") for m in edges["podkit.model"]), edges["podkit.model"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_follow_the_layer_order():
    wrong = []
    for module, targets in sorted(graph().items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                wrong.append(f"{module} (layer {layer_of(module)}) imports {target} "
                             f"(layer {layer_of(target)})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)
