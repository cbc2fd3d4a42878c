"""Presets tab: view, edit and save a preset (YAML of overrides), validated before saving."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui import common
from lora_gui.ui.tabs import presets_handlers as handle


def build() -> dict[str, gr.components.Component]:
    gr.Markdown("A preset lists only the settings that differ from the defaults, after a comment "
                "line that says what it is for. It is validated before it is saved.")
    names = common.preset_names()
    first = "text-demo" if "text-demo" in names else (names[0] if names else "")
    with gr.Row():
        name = gr.Dropdown(names, value=first, allow_custom_value=True,
                           label="Preset (pick one, or type a new name)", elem_id="preset-name")
        load = gr.Button("Load")
    text = gr.Code(value=handle.read_preset(first), language="yaml", label="YAML", elem_id="preset-yaml")
    save = gr.Button("Validate and save", variant="primary", elem_id="preset-save")
    message = gr.Markdown(elem_id="preset-message")
    load.click(handle.read_preset, name, text)
    name.change(handle.read_preset, name, text)
    saved = save.click(handle.save_preset, [name, text], message)
    return {"name": name, "text": text, "save": save, "saved": saved, "message": message}
