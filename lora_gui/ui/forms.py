"""The run settings form, derived from RunConfig's fields: one widget per setting, one accordion
per group, each setting shown for the tasks it applies to, a message next to each setting.

Nothing here lists settings by hand: a field added to :class:`RunConfig` with :func:`option`
appears in the form (and in presets, the CLI and validation) without a UI edit. Values travel
as a dict keyed by setting name.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from lora_gui.config import BUILTIN_DATA, ConfigError, RunConfig, apply_overrides

GROUP_TITLES = {"task": "Task, model and data", "train": "Training", "image": "Images",
                "memory": "Memory", "lora": "LoRA"}
GROUP_ORDER = ("task", "train", "image", "memory", "lora")  # unknown groups follow, closed
OPEN_GROUPS = ("task", "train", "image")  # the everyday settings; the rest start closed


def settings_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(RunConfig))


def field_kind(f: dataclasses.Field) -> type:
    return typing.get_type_hints(RunConfig)[f.name]


def applies_to(f: dataclasses.Field, task: str) -> bool:
    """Whether a setting matters for a task (declared by ``option(tasks=...)``)."""
    tasks = f.metadata.get("tasks")
    return tasks is None or task in tasks


def label_for(f: dataclasses.Field) -> str:
    return f.metadata.get("label") or f.name.replace("_", " ").capitalize()


def range_text(f: dataclasses.Field) -> str:
    low, high = f.metadata.get("low"), f.metadata.get("high")
    if low is None and high is None:
        return ""
    return f" Range: {low:g} to {high:g}." if high is not None else f" At least {low:g}."


def widget_for(f: dataclasses.Field, value: Any, visible: bool = True,
               elem_prefix: str = "field") -> gr.components.Component:
    """The widget of one setting: choices -> dropdown, bool -> checkbox, numbers with their range
    in the help (the message next to the field names a bad value), text -> textbox. Its element
    id is ``{elem_prefix}-{name}`` (each tab its own prefix)."""
    meta, kind = f.metadata, field_kind(f)
    common = {"label": label_for(f), "info": meta.get("help", "") + range_text(f),
              "elem_id": f"{elem_prefix}-{f.name}", "visible": visible}
    if meta.get("choices"):
        return gr.Dropdown(list(meta["choices"]), value=value, **common)
    if kind is bool:
        return gr.Checkbox(value=value, **common)
    if kind in (int, float):
        return gr.Number(value=value, precision=0 if kind is int else None, **common)
    return gr.Textbox(value=value, **common)


@dataclass
class Form:
    """The widgets (by setting name), the message next to each, and the group accordions."""

    widgets: dict[str, gr.components.Component]
    errors: dict[str, gr.Markdown]
    groups: dict[str, gr.Accordion]

    def named(self, values: dict[Any, Any]) -> dict[str, Any]:
        """{setting name: value} from gradio's {component: value} input dict."""
        return {name: values[w] for name, w in self.widgets.items() if w in values}

    @property
    def components(self) -> list[gr.components.Component]:
        return list(self.widgets.values())


def _groups() -> dict[str, list[dataclasses.Field]]:
    groups: dict[str, list[dataclasses.Field]] = {}
    for f in settings_fields():
        groups.setdefault(f.metadata.get("group", "other"), []).append(f)
    order = [g for g in GROUP_ORDER if g in groups] + [g for g in groups if g not in GROUP_ORDER]
    return {g: groups[g] for g in order}


def build_form(values: dict[str, Any]) -> Form:
    """Builds the accordions and widgets inside the current gradio Blocks context."""
    task = values.get("task", "text")
    widgets: dict[str, gr.components.Component] = {}
    errors: dict[str, gr.Markdown] = {}
    accordions: dict[str, gr.Accordion] = {}
    for group, fields in _groups().items():
        title = GROUP_TITLES.get(group, group.replace("_", " ").capitalize())
        shown = any(applies_to(f, task) for f in fields)
        with gr.Accordion(title, open=group in OPEN_GROUPS, visible=shown,
                          elem_id=f"group-{group}") as accordion:
            for f in fields:
                widgets[f.name] = widget_for(f, values.get(f.name, f.default), applies_to(f, task))
                errors[f.name] = gr.Markdown("", visible=False, elem_id=f"error-{f.name}",
                                             elem_classes=["field-error"])
        accordions[group] = accordion
    return Form(widgets, errors, accordions)


def visibility(form: Form, task: str) -> dict[Any, Any]:
    """Updates that show each setting (and group) only for the tasks it applies to."""
    updates: dict[Any, Any] = {}
    for group, fields in _groups().items():
        updates[form.groups[group]] = gr.update(visible=any(applies_to(f, task) for f in fields))
        for f in fields:
            updates[form.widgets[f.name]] = gr.update(visible=applies_to(f, task))
    return updates


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Widget value -> setting value: empty numbers are refused with the field's range."""
    kind = field_kind(f)
    if kind in (int, float):
        if value is None or value == "":
            raise ConfigError(f"{f.name}: empty; enter a number.{range_text(f)}")
        if kind is int and float(value).is_integer():
            return int(value)
        return float(value) if kind is float else value
    if kind is str:
        return str(value).strip() if value is not None else ""
    return value


def check_data_path(value: str, task: str) -> None:
    """A data path must be 'builtin' or a readable file (text) / folder (image)."""
    from lora_gui.data.text import DataError

    if not value:
        raise DataError("data: empty; use 'builtin' or a file path")
    if value in BUILTIN_DATA or value == "builtin":
        return
    path = Path(value).expanduser()
    wanted = path.is_dir() if task == "image" else path.is_file()
    if not wanted:
        kind = "image folder" if task == "image" else "file"
        raise DataError(f"data: {value} is not a readable {kind}")
    try:
        if path.is_file():
            path.open("rb").close()
        else:
            next(path.iterdir(), None)
    except OSError as err:
        raise DataError(f"data: {value} cannot be read ({err.strerror})") from None


def validate(values: dict[str, Any]) -> tuple[RunConfig | None, dict[str, str]]:
    """The form's values -> (validated RunConfig or None, {setting name: message}).

    Every setting is checked on its own first (so each bad field gets its message), then
    together (settings that depend on each other: the message goes to the field it names).
    """
    errors: dict[str, str] = {}
    clean: dict[str, Any] = {}
    for f in settings_fields():
        if f.name not in values:
            continue
        try:
            clean[f.name] = _coerce(f, values[f.name])
            apply_overrides(RunConfig(), {f.name: clean[f.name]})
        except ConfigError as err:
            errors[f.name] = str(err)
    if "data" in clean and "data" not in errors:
        try:
            check_data_path(clean["data"], clean.get("task", "text"))
        except ValueError as err:
            errors["data"] = str(err)
    if errors:
        return None, errors
    try:
        return apply_overrides(RunConfig(), clean), {}
    except ConfigError as err:
        name = str(err).split(":", 1)[0].strip()
        return None, {name if name in clean else "task": str(err)}


def error_updates(form: Form, errors: dict[str, str]) -> dict[Any, Any]:
    """Shows each message next to its field and hides the others."""
    return {md: gr.update(value=f"⚠ {errors[name]}" if name in errors else "", visible=name in errors)
            for name, md in form.errors.items()}
