"""How a setting is declared: :func:`option`, shared by :class:`lora_gui.config.RunConfig` and the
groups of settings it is composed of (:mod:`lora_gui.objective`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

TEXT = ("text",)  # option(tasks=TEXT): a setting of text runs only


def option(default: Any, help: str, group: str, *, low: float | None = None,
           high: float | None = None, choices: tuple[str, ...] | None = None,
           tasks: tuple[str, ...] | None = None, label: str | None = None,
           kinds: tuple[str, ...] | None = None) -> Any:
    """Declares one setting with its default, help text, UI group, range and choices.

    ``tasks`` lists the tasks the setting applies to (None: the "image" group's fields apply to
    image runs, every other field to all tasks); ``label`` is the form's label (None: derived
    from the name); ``kinds`` lists the image pipelines it applies to ('sd', 'sdxl', 'sd3',
    'flux'; None: all). The form hides a setting for the tasks (and pipelines) it does not apply to.
    """
    meta = {"help": help, "group": group, "low": low, "high": high, "choices": choices,
            "tasks": tasks or (("image",) if group == "image" else None), "label": label,
            "kinds": kinds}
    return field(default=default, metadata=meta)
