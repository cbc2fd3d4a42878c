"""The dashboard loads every diffusers class lora_gui uses before it serves requests (two threads
importing a lazy diffusers class at once can fail), so the list must cover the code."""

import ast
from pathlib import Path

from lora_gui.models import diffusion, dit
from lora_gui.models.warm_imports import CLASSES, SUBMODULES, load_diffusers

PACKAGE = Path(__file__).resolve().parents[2] / "lora_gui"


def _imported_from_diffusers() -> tuple[set[str], set[str]]:
    names, modules = set(), set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "diffusers":
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("diffusers."):
                modules.add(node.module)
    return names, modules


def test_the_warm_up_covers_every_diffusers_class_the_code_uses():
    names, modules = _imported_from_diffusers()
    names |= set(diffusion.PIPELINE_CLASSES.values()) | set(dit.DIT_TRANSFORMERS.values())  # getattr'd
    assert names and names <= set(CLASSES), sorted(names - set(CLASSES))
    assert modules <= set(SUBMODULES), sorted(modules - set(SUBMODULES))
    load_diffusers()
    import diffusers

    assert all(name in vars(diffusers) for name in CLASSES)  # loaded, not left to the lazy module
