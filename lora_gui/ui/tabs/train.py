"""Train tab: preset, model, data, memory switches, Start/Stop/Resume, live charts."""

from __future__ import annotations

import gradio as gr

from lora_gui.config import RunConfig
from lora_gui.ui import handlers


def build() -> dict[str, gr.components.Component]:
    names = handlers.preset_names()
    default = "text-demo" if "text-demo" in names else names[0]
    values = handlers.form_defaults(default)
    with gr.Row():
        preset = gr.Dropdown(names, value=default, label="Preset", elem_id="preset")
        out_name = gr.Textbox(value=default, label="Run name (folder under runs/)", elem_id="run-name")
    with gr.Row():
        model = gr.Textbox(value=values[0], label="Model: builtin, a Hugging Face id or a local folder")
        data = gr.Textbox(value=values[1], label="Data: builtin or a .txt/.jsonl/.csv path")
    with gr.Row():
        max_seq_len = gr.Number(value=values[2], label="Max sequence length (tokens)", precision=0)
        budget = gr.Number(value=values[3], label=handlers.budget_label(), elem_id="budget")
    with gr.Row():
        mode = gr.Radio(["traditional", "optimized"], value=values[4], label="Mode")
        batching = gr.Dropdown(["auto", "fixed", "bucketed", "packed"], value=values[5],
                               label="Batching (dynamic sequence sizing)",
                               info=RunConfig.__dataclass_fields__["batching"].metadata["help"])
        checkpointing = gr.Checkbox(value=values[6], label="Gradient checkpointing")
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="start")
        stop = gr.Button("Stop", elem_id="stop")
        resume = gr.Button("Resume", elem_id="resume")
    message = gr.Markdown(elem_id="message")
    status = gr.Markdown(elem_id="status")
    with gr.Row():
        memory_plot = gr.Plot(label="Memory", elem_id="memory-plot")
        loss_plot = gr.Plot(label="Loss", elem_id="loss-plot")
    throughput_plot = gr.Plot(label="Throughput", elem_id="throughput-plot")
    events = gr.Textbox(label="Events", lines=6, interactive=False, elem_id="events")

    form = [model, data, max_seq_len, budget, mode, batching, checkpointing]
    preset.change(handlers.form_defaults, preset, form).then(lambda p: p, preset, out_name)
    start.click(handlers.start, [preset, out_name, *form], message)
    resume.click(lambda p, o, *v: handlers.start(p, o, *v, resume=True), [preset, out_name, *form], message)
    stop.click(handlers.stop, None, message)
    timer = gr.Timer(1.0)
    timer.tick(handlers.poll, None, [memory_plot, loss_plot, throughput_plot, status, events])
    return {"preset": preset, "start": start, "stop": stop, "memory_plot": memory_plot,
            "status": status, "message": message, "timer": timer}
