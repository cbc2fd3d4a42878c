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
from typing import Any

import gradio as gr

from lora_gui.config import ConfigError, RunConfig, apply_overrides

GROUP_TITLES = {"task": "Task, model and data", "train": "Training", "image": "Images",
                "memory": "Memory", "lora": "LoRA"}
GROUP_ORDER = ("task", "train", "image", "memory", "lora")  # unknown groups follow, closed
OPEN_GROUPS = ()  # every group starts closed: the everyday settings sit above them (KEY_FIELDS)
# The settings that decide a run, shown together at the top of the Train tab (the rest stay in
# their groups below, several a row). Each still shows only for the tasks it applies to.
# five a row: max_seq_len (text) and resolution (image) share the first row, one of them hidden
KEY_FIELDS = ("task", "model", "data", "max_seq_len", "resolution", "batch_size", "lr", "lora_rank",
              "max_steps")
BUDGET_FIELDS = ("budget_gb",)  # beside the card picker, which sets it
PER_ROW = 4  # fields a row in the groups; a row wraps on narrow screens (FIELD_MIN_WIDTH px each)
FIELD_MIN_WIDTH = 170  # px


# A setting's help in the words of the task shown, where its declared help speaks of another
# task's things (tokens, documents, q_proj) or of both
TASK_HELP = {
    "eval_fraction": {"text": "Share of documents held out for eval_loss.",
                      "image": "Share of pictures held out for eval_loss.",
                      "video": "Share of clips held out for eval_loss."},
    "mode": {"text": "traditional: pad to max_seq_len, eager attention, fixed batch. optimized: "
                     "dynamic sizing, SDPA, token budget.",
             "image": "traditional: one fixed batch, eager attention. optimized: the batch of each "
                      "resolution bucket planned under the budget, SDPA, the image memory switches on."},
    "lora_targets": {"text": "Modules that get LoRA: 'all-linear' or a comma list such as q_proj,v_proj.",
                     "image": "Modules that get LoRA: 'all-linear' or a comma list such as "
                              "to_q,to_k,to_v,to_out.0.",
                     "video": "Modules that get LoRA: 'all-linear' (the attention projections of every "
                              "block) or a comma list such as to_q,to_k,to_v,to_out.0."},
    "model": {"text": "Base model: 'builtin' (the bundled 4M-parameter Llama), a Hugging Face id "
                      "(needs network) or a local folder saved with save_pretrained.",
              "image": "Base model: 'builtin' (the bundled small SD-style pipeline), 'builtin:drawing' "
                       "(an SD3-style pipeline that draws shapes at 64 px), a Hugging Face id (needs "
                       "network) or a local pipeline folder (SD 1.x, SDXL, SD3 / SD3.5 or Flux.1).",
              "video": "Base model: 'builtin:video' (a bundled tiny Wan-shaped pipeline), 'builtin:ltx' "
                       "(a bundled tiny LTX-Video pipeline), a Hugging Face id (needs network) or a local "
                       "pipeline folder (Wan 2.1 / 2.2 or LTX-Video)."},
    "resolution": {"video": "Video: clips of about resolution x resolution px, unless video_size gives "
                            "WxH (multiples of the model's grid: 16 px for Wan 2.1, 32 px for LTX-Video)."},
    "sample_images": {"video": "Video: sample clips generated from validation prompts at the end "
                               "(samples/*.mp4; 0 = none)."},
    "text_max_length": {"video": "Video: T5 tokens per caption; 0 = the pipeline's default (Wan: 512, "
                                 "LTX-Video: 128)."},
    "data": {"text": "Training data: 'builtin' (the bundled fine-tune corpus) or a .txt / .jsonl / "
                     ".csv file.",
             "image": "Training data: 'builtin' (the bundled demo pictures) or a folder of pictures "
                      "with .txt captions or metadata.jsonl.",
             "video": "Training data: 'builtin' (the bundled demo clips) or a folder of clips (.mp4, "
                      ".webm, .mov, .gif) with .txt captions, or a .jsonl list of path and caption."},
}


def help_for(f: dataclasses.Field, task: str) -> str:
    """The help under a setting for ``task``, with its range."""
    return TASK_HELP.get(f.name, {}).get(task, f.metadata.get("help", "")) + range_text(f)


def settings_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(RunConfig))


def field_kind(f: dataclasses.Field) -> type:
    return typing.get_type_hints(RunConfig)[f.name]


def applies_to(f: dataclasses.Field, task: str, kind: str | None = None) -> bool:
    """Whether a setting matters for a task (declared by ``option(tasks=...)``) and, for image
    runs whose pipeline is known ('sd', 'sdxl', 'sd3', 'flux'), for that pipeline
    (``option(kinds=...)``); an unknown pipeline shows every image setting."""
    tasks, kinds = f.metadata.get("tasks"), f.metadata.get("kinds")
    if tasks is not None and task not in tasks:
        return False
    return kind is None or task != "image" or kinds is None or kind in kinds


# words a setting's name spells in lower case that people write otherwise
NAME_WORDS = {"lora": "LoRA", "dora": "DoRA", "loha": "LoHa", "lokr": "LoKr", "oft": "OFT", "lr": "LR",
              "gguf": "GGUF", "vae": "VAE", "dit": "DiT", "eva": "EVA", "mlp": "MLP", "gb": "GB",
              "kohya": "kohya", "dpo": "DPO", "orpo": "ORPO", "simpo": "SimPO"}


def label_for(f: dataclasses.Field) -> str:
    """The setting's label: its own, else its name in words ('lora_rank' -> 'LoRA rank')."""
    if f.metadata.get("label"):
        return f.metadata["label"]
    words = f.name.split("_")
    named = [NAME_WORDS.get(w, w) for w in words]
    if named[0] == words[0]:
        named[0] = named[0].capitalize()
    return " ".join(named)


def number_text(value: float, integer: bool = False) -> str:
    """A bound as people read it: 1048576 -> "1,048,576", 1e-05 -> "0.00001", 0.9 -> "0.9"."""
    if integer or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.12f}".rstrip("0") if abs(value) >= 1e-12 else f"{value:g}"


def range_text(f: dataclasses.Field) -> str:
    low, high = f.metadata.get("low"), f.metadata.get("high")
    if low is None and high is None:
        return ""
    integer = field_kind(f) is int
    if high is None:
        return f" At least {number_text(low, integer)}."
    return f" Range: {number_text(low, integer)} to {number_text(high, integer)}."


def widget_for(f: dataclasses.Field, value: Any, visible: bool = True,
               classes: list[str] | None = None, *, elem_prefix: str = "field",
               task: str | None = None) -> gr.components.Component:
    """The widget of one setting: choices -> dropdown, bool -> checkbox, numbers with their range
    in the help (the message next to the field names a bad value), text -> textbox. Its element
    id is ``{elem_prefix}-{name}`` (each tab its own prefix)."""
    meta, kind = f.metadata, field_kind(f)
    info = help_for(f, task) if task else meta.get("help", "") + range_text(f)
    common = {"label": label_for(f), "info": info,
              "elem_id": f"{elem_prefix}-{f.name}", "visible": visible, "elem_classes": classes}
    if meta.get("choices"):
        return gr.Dropdown(list(meta["choices"]), value=value, **common)
    if kind is bool:
        return gr.Checkbox(value=value, **common)
    if kind in (int, float):
        return gr.Number(value=value, precision=0 if kind is int else None, **common)
    return gr.Textbox(value=value, **common)


@dataclass
class Form:
    """The widgets (by setting name), the message next to each, the group accordions and the box
    (a column in a row of fields) that holds each widget and its message."""

    widgets: dict[str, gr.components.Component]
    errors: dict[str, gr.Markdown]
    groups: dict[str, gr.Accordion]
    boxes: dict[str, gr.Column] = dataclasses.field(default_factory=dict)
    members: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # group -> settings in it

    def named(self, values: dict[Any, Any]) -> dict[str, Any]:
        """{setting name: value} from gradio's {component: value} input dict."""
        return {name: values[w] for name, w in self.widgets.items() if w in values}

    @property
    def components(self) -> list[gr.components.Component]:
        return list(self.widgets.values())

    @property
    def layout(self) -> list[Any]:
        """The accordions and boxes whose visibility follows the task."""
        return [*self.groups.values(), *self.boxes.values()]

    def merge(self, other: Form) -> Form:
        """One form of two parts (the key settings at the top, the groups below)."""
        return Form({**self.widgets, **other.widgets}, {**self.errors, **other.errors},
                    {**self.groups, **other.groups}, {**self.boxes, **other.boxes},
                    {**self.members, **other.members})


def _groups() -> dict[str, list[dataclasses.Field]]:
    groups: dict[str, list[dataclasses.Field]] = {}
    for f in settings_fields():
        groups.setdefault(f.metadata.get("group", "other"), []).append(f)
    order = [g for g in GROUP_ORDER if g in groups] + [g for g in groups if g not in GROUP_ORDER]
    return {g: groups[g] for g in order}


def _boxes(fields: list[dataclasses.Field], values: dict[str, Any], task: str, form: Form,
           classes: list[str] | None, min_width: int) -> None:
    """One box (a column: the widget, its message under it) per field, in the current row."""
    for f in fields:
        shown = applies_to(f, task)
        with gr.Column(min_width=min_width, visible=shown) as box:
            form.widgets[f.name] = widget_for(f, values.get(f.name, f.default), shown, classes,
                                              task=task)
            form.errors[f.name] = gr.Markdown("", visible=False, elem_id=f"error-{f.name}",
                                              elem_classes=["field-error"])
        form.boxes[f.name] = box


def _rows(fields: list[dataclasses.Field], values: dict[str, Any], task: str, per_row: int,
          form: Form, classes: list[str] | None = None, min_width: int = FIELD_MIN_WIDTH) -> None:
    """Lays ``fields`` out ``per_row`` a row (0: in the current row), each in its box."""
    if not per_row:
        _boxes(fields, values, task, form, classes, min_width)
        return
    for start in range(0, len(fields), per_row):
        with gr.Row(equal_height=False):
            _boxes(fields[start:start + per_row], values, task, form, classes, min_width)


def build_fields(names: tuple[str, ...], values: dict[str, Any], per_row: int = PER_ROW,
                 min_width: int = FIELD_MIN_WIDTH) -> Form:
    """The settings ``names`` in rows of ``per_row`` (0: inside the current row), no accordion
    (the key settings; their widgets carry the ``key-field`` class: help shortened to two
    lines until the field has focus)."""
    task = values.get("task", "text")
    by_name = {f.name: f for f in settings_fields()}
    form = Form({}, {}, {})
    _rows([by_name[n] for n in names if n in by_name], values, task, per_row, form, ["key-field"],
          min_width)
    return form


def build_form(values: dict[str, Any], skip: tuple[str, ...] = (), per_row: int = PER_ROW) -> Form:
    """Builds the accordions (several fields a row) inside the current gradio Blocks context;
    the settings in ``skip`` are left out (built elsewhere with :func:`build_fields`)."""
    task = values.get("task", "text")
    form = Form({}, {}, {})
    for group, all_fields in _groups().items():
        fields = [f for f in all_fields if f.name not in skip]
        if not fields:
            continue
        title = GROUP_TITLES.get(group, group.replace("_", " ").capitalize())
        shown = any(applies_to(f, task) for f in fields)
        with gr.Accordion(title, open=group in OPEN_GROUPS, visible=shown,
                          elem_id=f"group-{group}") as accordion:
            _rows(fields, values, task, per_row, form)
        form.groups[group] = accordion
        form.members[group] = [f.name for f in fields]
    return form


def visibility(form: Form, task: str, kind: str | None = None) -> dict[Any, Any]:
    """Updates that show each setting (its widget and box, and its group) only for the tasks
    (and the image pipeline ``kind``) it applies to."""
    updates: dict[Any, Any] = {}
    for group, fields in _groups().items():
        if group in form.groups:
            inside = [f for f in fields if f.name in form.members.get(group, ())]
            updates[form.groups[group]] = gr.update(visible=any(applies_to(f, task, kind) for f in inside))
        for f in fields:
            if f.name in form.widgets:
                words = {"info": help_for(f, task)} if f.name in TASK_HELP else {}
                updates[form.widgets[f.name]] = gr.update(visible=applies_to(f, task, kind), **words)
            if f.name in form.boxes:
                updates[form.boxes[f.name]] = gr.update(visible=applies_to(f, task, kind))
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
    """A data path must be 'builtin' or a file (text) / folder (image) that exists, is not empty
    and (text) is UTF-8; the message says which (:mod:`lora_gui.ui.input_checks`)."""
    from lora_gui.data.text import DataError
    from lora_gui.ui.input_checks import data_problem

    problem = data_problem(value, task)
    if problem:
        raise DataError(problem)


def check_typed_paths(clean: dict[str, Any], errors: dict[str, str]) -> dict[str, str]:
    """{setting: message} for each path setting (declared with ``option(path=...)``) outside the
    folders the dashboard may use (:mod:`lora_gui.ui.paths`); bundled names and empty values are
    not paths."""
    from lora_gui.ui import paths

    return {name: message for name, message in paths.refusals(clean).items() if name not in errors}


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
    errors.update(check_typed_paths(clean, errors))
    if "data" in clean and "data" not in errors:
        try:
            check_data_path(clean["data"], clean.get("task", "text"))
        except ValueError as err:
            errors["data"] = str(err)
    if "model" in clean and "model" not in errors:
        from lora_gui.ui.input_checks import model_problem, model_task_problem

        task = clean.get("task", "text")
        problem = model_problem(clean["model"]) or model_task_problem(clean["model"], task)
        if problem:
            errors["model"] = problem
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
