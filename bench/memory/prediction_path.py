"""The path a setting takes into its plan: which lora_gui modules run, and how often a call goes
back up a layer (a lower layer calling a higher one), from the Train form's prediction and from
``plan`` on the CLI, for a text and an image preset.

Run: ``PYTHONPATH=. .venv/bin/python -m bench.memory.prediction_path`` (about a minute). It records every
Python call between two lora_gui modules (sys.setprofile) while each entry point computes its
plan, and prints the distinct modules on the path and the calls that point up a layer. The
layers are tests/test_architecture.py's.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable

from tests.test_architecture import _graph, layer_of


def walk(entry: Callable[[], object]) -> tuple[set[str], set[tuple[str, str]]]:
    """(modules whose code ran, (caller, callee) module pairs of calls that go up a layer to a
    module the caller imports; a callback handed down, such as a loss function the trace gives
    the model, runs the higher module's code without the lower one naming it, and is not one)."""
    imports = _graph()
    modules: set[str] = set()
    up: set[tuple[str, str]] = set()

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith("lora_gui"):
            return
        modules.add(callee)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if caller.startswith("lora_gui") and caller != callee:
            a, b = layer_of(caller), layer_of(callee)
            if a is not None and b is not None and b > a and callee in imports.get(caller, ()):
                up.add((caller, callee))

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            entry()
    finally:
        sys.setprofile(None)
    return modules, up


def entries() -> dict[str, Callable[[], object]]:
    from lora_gui.cli import main
    from lora_gui.ui.tabs.train_prediction_handlers import prediction_view

    def form(preset: str) -> Callable[[], object]:
        from lora_gui.config import RunConfig
        from lora_gui.presets import load_config

        values = load_config(preset).to_dict()
        values = {k: v for k, v in values.items() if k in RunConfig.__dataclass_fields__}
        return lambda: prediction_view(values, 1, True)

    return {"Train form, text-demo": form("text-demo"),
            "plan CLI, text-demo": lambda: main(["plan", "--preset", "text-demo", "--device", "cpu"]),
            "Train form, image-768": form("image-768"),
            "plan CLI, image-768": lambda: main(["plan", "--preset", "image-768", "--device", "cpu"])}


if __name__ == "__main__":
    for name, entry in entries().items():
        modules, up = walk(entry)
        print(f"{name}: {len(modules)} modules on the path, {len(up)} calls up a layer")
        for caller, callee in sorted(up):
            print(f"    up: {caller} -> {callee}")
