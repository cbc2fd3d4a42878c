"""Presets tab: view, edit and save a preset (YAML of overrides), validated before saving."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui import handlers


def build() -> dict[str, gr.components.Component]:
    gr.Markdown("A preset lists only the settings that differ from the defaults, after a comment "
                "line that says what it is for. It is validated before it is saved.")
    with gr.Row():
        name = gr.Dropdown(handlers.preset_names(), value="text-demo", allow_custom_value=True,
                           label="Preset (pick one, or type a new name)", elem_id="preset-name")
        load = gr.Button("Load")
    text = gr.Code(value=handlers.read_preset("text-demo"), language="yaml", label="YAML",
                   elem_id="preset-yaml")
    save = gr.Button("Validate and save", variant="primary", elem_id="preset-save")
    message = gr.Markdown(elem_id="preset-message")
    load.click(handlers.read_preset, name, text)
    name.change(handlers.read_preset, name, text)
    save.click(handlers.save_preset, [name, text], message)
    return {"name": name, "text": text, "save": save, "message": message}
