"""The package's modules import each other only downward: the graph of intra-package imports has no cycle.

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


def test_the_graph_is_read_from_the_real_imports():
    graph = import_graph()
    assert "isiwatch.checkpoint" in graph["isiwatch.models"] and "isiwatch.specialize" in graph["isiwatch.models"]
    assert "isiwatch.truncate_report" in graph["isiwatch.report"]
    assert "isiwatch.analysis" in graph["isiwatch.offline"]


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_the_package_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_separated_concepts_stay_separated():
    graph = import_graph()
    assert "isiwatch.specialize" not in graph["isiwatch.checkpoint"]  # reading files knows no model transformation
    assert "isiwatch.truncate" not in graph["isiwatch.report"]
    assert "isiwatch.offline" not in graph["isiwatch.truncate"]
