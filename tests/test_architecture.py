"""The package's shape: layers that only point down (lazy imports inside functions included,
since they only hide an upward edge), no import circles, and a house plan that names every
package (docs/ARCHITECTURE.md)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lora_gui"
DOC = PACKAGE.parent / "docs" / "ARCHITECTURE.md"

# Bottom to top. A module may import its own layer and the layers below it, never one above.
# memory.runtime (the tracker and what runs beside training) sits below models, which mark
# host storages for the tracker; memory.predict sits above models, whose real code it traces.
LAYERS = (
    ("errors", "units", "options", "objective", "task_settings", "memory_settings",
     "training_settings", "image_settings", "adapter_settings", "config", "cards", "presets"),
    ("data",),
    ("memory.runtime",),
    ("attention",),
    ("models",),
    ("memory",),  # memory/__init__ and memory.predict
    ("engine",),
    ("ui",),
    ("cli", "__main__"),
)
# Inside the engine, the core is written once for every task: it never imports a task, the
# comparisons, the job manager, queue or launcher (engine.jobs), the export (engine.export), nor
# the engine's own entry point above them.
ENGINE_CORE = "lora_gui.engine.core"
ENGINE_FLAT_MODULES_MAX = 6  # modules directly in engine/: the rest lives in its packages


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, modules: set[str], here: str) -> dict[str, int]:
    """Every lora_gui module a file imports at run time (not under TYPE_CHECKING), with the line
    of its first import."""
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        found.setdefault(name, line)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against this module's package
                pkg = here.split(".")[: -node.level] if not here.endswith("__init__") else here.split(".")
                base = ".".join([*pkg, node.module])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m: line for m, line in found.items() if m in modules and m != here}


def _files() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _graph_with_lines() -> dict[str, dict[str, int]]:
    files = _files()
    modules = set(files)
    return {name: _imports(ast.parse(path.read_text(encoding="utf-8")), modules, name)
            for name, path in files.items()}


def _graph() -> dict[str, set[str]]:
    return {name: set(deps) for name, deps in _graph_with_lines().items()}


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest layer prefix that names ``module`` (None: the package root)."""
    rel = module.removeprefix("lora_gui").lstrip(".")
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (rel == name or rel.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    return best


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """One line per import that points up a layer (or from the engine's core into the rest of the
    engine): 'file:line: a imports b (layer x above y)'."""
    found = []
    for name, deps in sorted(graph.items()):
        mine = layer_of(name)
        for dep, line in sorted(deps.items()):
            theirs = layer_of(dep)
            up = mine is not None and theirs is not None and theirs > mine
            core_up = name.startswith(ENGINE_CORE) and dep.startswith("lora_gui.engine") \
                and not dep.startswith(ENGINE_CORE)
            if up or core_up:
                where = name.replace(".", "/") + ".py"
                found.append(f"{where}:{line}: {name} imports {dep}")
    return found


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


def test_every_module_has_a_layer():
    loose = [m for m in _files() if m != "lora_gui" and layer_of(m) is None]
    assert not loose, f"modules in no layer (add them to LAYERS and docs/ARCHITECTURE.md): {loose}"


def test_imports_only_point_down():
    found = upward_imports(_graph_with_lines())
    assert not found, "imports that point up a layer:\n" + "\n".join(found)


def test_a_planted_upward_import_is_caught_with_its_line():
    graph = _graph_with_lines()
    graph["lora_gui.models.text"] = {**graph["lora_gui.models.text"], "lora_gui.engine.jobs.manager": 7}
    loop = "lora_gui.engine.core.loop"
    graph[loop] = {**graph[loop], "lora_gui.engine.text.train": 3}
    graph["lora_gui.memory.runtime.tracker"] = {"lora_gui.memory.predict.trace": 12}
    found = upward_imports(graph)
    assert "lora_gui/models/text.py:7: lora_gui.models.text imports lora_gui.engine.jobs.manager" in found
    assert f"lora_gui/engine/core/loop.py:3: {loop} imports lora_gui.engine.text.train" in found
    assert any(f.startswith("lora_gui/memory/runtime/tracker.py:12:") for f in found)


def test_a_lazy_import_inside_a_function_counts():
    tree = ast.parse("def f():\n    from lora_gui.ui import app\n")
    assert _imports(tree, {"lora_gui.ui.app", "lora_gui.ui"}, "lora_gui.models.x") == {"lora_gui.ui.app": 2}


def test_the_house_plan_names_every_package():
    doc = DOC.read_text(encoding="utf-8")
    packages = sorted({p.parent.relative_to(PACKAGE).as_posix()
                       for p in PACKAGE.rglob("__init__.py")} - {"."})
    missing = [pkg for pkg in packages if f"{pkg}/" not in doc]
    assert not missing, f"docs/ARCHITECTURE.md does not name these packages: {missing}"


def test_the_engine_keeps_its_modules_in_packages():
    flat = sorted(p.name for p in (PACKAGE / "engine").glob("*.py"))
    assert len(flat) <= ENGINE_FLAT_MODULES_MAX, (
        f"engine/ holds {len(flat)} modules directly ({', '.join(flat)}): at most "
        f"{ENGINE_FLAT_MODULES_MAX}; put the new one in the package it belongs to")
