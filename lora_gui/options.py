"""How a setting is declared: :func:`option`, shared by :class:`lora_gui.config.RunConfig` and the
groups of settings it is composed of (:mod:`lora_gui.objective`, :mod:`lora_gui.task_settings`...),
and the error a bad value raises."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from lora_gui.errors import UserError

TEXT = ("text",)  # option(tasks=TEXT): a setting of text runs only
# option(path=...): the setting names a file or folder; the dashboard checks every such value
# (from any route) against the folders it may use before the value is used
READS, WRITES = "reads", "writes"  # a file or folder the run reads / a folder it writes into


class ConfigError(UserError, ValueError):
    """A setting is unknown or out of range; the message names it."""


def option(default: Any, help: str, group: str, *, low: float | None = None,
           high: float | None = None, choices: tuple[str, ...] | None = None,
           tasks: tuple[str, ...] | None = None, label: str | None = None,
           kinds: tuple[str, ...] | None = None, path: str | None = None) -> Any:
    """Declares one setting with its default, help text, UI group, range and choices.

    ``tasks`` lists the tasks the setting applies to (None: the "image" group's fields apply to
    image runs, every other field to all tasks); ``label`` is the form's label (None: derived
    from the name); ``kinds`` lists the image pipelines it applies to ('sd', 'sdxl', 'sd3',
    'flux'; None: all). The form hides a setting for the tasks (and pipelines) it does not apply to.
    ``path`` (READS or WRITES) marks a setting whose value names a file or folder: the dashboard's
    folder check (``lora_gui.ui.paths``) finds every such setting by this mark.
    """
    if path not in (None, READS, WRITES):
        raise ValueError(f"option(path=...): {path!r} is not {READS!r} or {WRITES!r}")
    meta = {"help": help, "group": group, "low": low, "high": high, "choices": choices,
            "tasks": tasks or (("image",) if group == "image" else None), "label": label,
            "kinds": kinds, "path": path}
    return field(default=default, metadata=meta)


def path_settings(settings: type) -> dict[str, str]:
    """{setting name: READS or WRITES} of a settings dataclass's fields declared with ``path``."""
    import dataclasses

    return {f.name: f.metadata["path"] for f in dataclasses.fields(settings)
            if f.metadata.get("path")}
