"""The package's modules import each other only downward, layer by layer (``LAYERS``), and without cycles.

Every ``import`` in a module counts, including those inside functions (a lazy import still couples the two
modules); only ``if TYPE_CHECKING:`` blocks are left out, since they never run.
"""

import ast
from pathlib import Path

import isiwatch

ROOT = Path(isiwatch.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                # `from . import submodule` imports the submodule; `from .module import name` the module
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


#: The package's layers, lowest first. A module may import from its own layer and the layers before it, never
#: from a later one; layers that share a rank (the watch and truncation, the command line and the integrations)
#: are independent of each other.
LAYERS: list[tuple[str, ...]] = [
    ("isiwatch._utils",),
    ("isiwatch.taps",),
    ("isiwatch.specialization",),
    ("isiwatch.io",),
    ("isiwatch.measure",),
    ("isiwatch.watch", "isiwatch.truncation"),
    ("isiwatch.cli", "isiwatch.integrations"),
    ("isiwatch.__main__",),  # python -m isiwatch: the command line
]


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, layer package) of a module; None for the top-level ``isiwatch`` package (the public API)."""
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return rank, package
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer or across to a sibling layer of the same rank."""
    violations = []
    for module, targets in graph.items():
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here is None or there is None:
                continue
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                violations.append(f"{module} imports {target}")
    return violations


def test_the_graph_is_read_from_the_real_imports():
    graph = import_graph()
    assert {"isiwatch.io.checkpoint", "isiwatch.specialization.convert"} <= graph["isiwatch.io.models"]
    assert "isiwatch.truncation.truncate_report" in graph["isiwatch.truncation.report_html"]
    assert "isiwatch.measure.analysis" in graph["isiwatch.cli.offline"]
    assert "isiwatch.watch.monitor" in graph["isiwatch.integrations.common"]


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in import_graph() if m != "isiwatch" and layer_of(m) is None]
    assert not unplaced, f"modules outside every layer (add them to LAYERS): {unplaced}"


def test_layer_violations_are_found():
    graph = {"isiwatch.io.data": {"isiwatch.measure.analysis"}, "isiwatch.watch.monitor": {"isiwatch.truncation.cost"},
             "isiwatch.measure.depth": {"isiwatch.io.data", "isiwatch._utils.files"}}
    assert layer_violations(graph) == ["isiwatch.io.data imports isiwatch.measure.analysis",
                                       "isiwatch.watch.monitor imports isiwatch.truncation.cost"]


def test_modules_import_only_from_lower_layers():
    violations = layer_violations(import_graph())
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_the_package_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_separated_concepts_stay_separated():
    graph = import_graph()
    assert "isiwatch.cli.offline" not in graph["isiwatch.truncation.truncate"]
