"""The package's shape: no import circles (lazy imports inside functions included, since they
only hide a circle), and the engine never imports the UI."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lora_gui"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, modules: set[str], here: str) -> set[str]:
    """Every lora_gui module a file imports at run time (not under TYPE_CHECKING)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against this module's package
                pkg = here.split(".")[: -node.level] if not here.endswith("__init__") else here.split(".")
                base = ".".join([*pkg, node.module])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules and m != here}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {name: _imports(ast.parse(path.read_text(encoding="utf-8")), modules, name)
            for name, path in files.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    colour: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        colour[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if colour.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in colour and (cycle := dfs(nxt)):
                return cycle
        path.pop()
        colour[node] = 2
        return None

    for start in sorted(graph):
        if start not in colour and (cycle := dfs(start)):
            return cycle
    return None


def test_no_import_circles():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]


def test_engine_memory_data_models_never_import_the_ui():
    graph = _graph()
    for name, deps in graph.items():
        if name.startswith(("lora_gui.engine", "lora_gui.memory", "lora_gui.data", "lora_gui.models")):
            assert not any(d.startswith("lora_gui.ui") for d in deps), (name, deps)
