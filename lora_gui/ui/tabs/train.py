"""Train tab: preset, model, data, memory switches, Start/Stop/Resume, live charts."""

from __future__ import annotations

import gradio as gr

from lora_gui.config import RunConfig
from lora_gui.ui import handlers


def _meta(key: str) -> dict:
    """A setting's declaration in RunConfig (help, choices): widgets are derived from it."""
    return RunConfig.__dataclass_fields__[key].metadata


def build() -> dict[str, gr.components.Component]:
    names = handlers.preset_names()
    default = "text-demo" if "text-demo" in names else names[0]
    values = handlers.form_defaults(default)
    with gr.Row():
        task = gr.Radio(list(_meta("task")["choices"]), value="text", label="Task",
                        info="image: diffusers UNet LoRA at 512-1536 px (phases: caching, training, "
                             "sampling)", elem_id="task")
        preset = gr.Dropdown(names, value=default, label="Preset", elem_id="preset")
        out_name = gr.Textbox(value=default, label="Run name (folder under runs/)", elem_id="run-name")
    with gr.Row():
        model = gr.Textbox(value=values[0], label="Model: builtin, a Hugging Face id or a local folder")
        data = gr.Textbox(value=values[1], label="Data: builtin or a .txt/.jsonl/.csv path", elem_id="data")
        upload = gr.File(label="…or upload a data file", file_types=[".txt", ".jsonl", ".csv"],
                         elem_id="upload")
    with gr.Row():
        max_seq_len = gr.Number(value=values[2], label="Max sequence length (tokens)", precision=0)
        resolution = gr.Number(value=512, label="Resolution (px, image)", precision=0,
                               info=_meta("resolution")["help"], elem_id="resolution")
        budget = gr.Number(value=values[3], label=handlers.budget_label(), elem_id="budget")
    with gr.Row():
        mode = gr.Radio(list(_meta("mode")["choices"]), value=values[4], label="Mode",
                        info=_meta("mode")["help"])
        batching = gr.Dropdown(list(_meta("batching")["choices"]), value=values[5],
                               label="Batching (dynamic sequence sizing)", info=_meta("batching")["help"])
        checkpointing = gr.Checkbox(value=values[6], label="Gradient checkpointing",
                                    info=_meta("gradient_checkpointing")["help"])
    with gr.Row():
        attention = gr.Radio(list(_meta("attention")["choices"]), value=values[7], label="Attention",
                             info=_meta("attention")["help"])
        window = gr.Number(value=values[8], precision=0, label="Window W (tokens)",
                           info=_meta("window")["help"])
        global_tokens = gr.Number(value=values[9], precision=0, label="Global tokens G",
                                  info=_meta("global_tokens")["help"])
        precision = gr.Dropdown(list(_meta("precision")["choices"]), value=values[10],
                                label="Mixed precision", info=_meta("precision")["help"])
    with gr.Row():
        quantization = gr.Dropdown(list(_meta("quantization")["choices"]), value=values[11],
                                   label="Base weights (text)", info=_meta("quantization")["help"],
                                   elem_id="quantization")
        optimizer = gr.Dropdown(list(_meta("optimizer")["choices"]), value=values[12], label="Optimizer",
                                info=_meta("optimizer")["help"], elem_id="optimizer")
    predicted = gr.Markdown(elem_id="predicted")
    processes = gr.Number(value=max(1, handlers.gpu_count()), precision=0, minimum=1, elem_id="processes",
                          label="Processes (one per GPU; started with accelerate launch)",
                          visible=handlers.gpu_count() > 1)
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="start")
        stop = gr.Button("Stop", elem_id="stop")
        resume = gr.Button("Resume", elem_id="resume")
    message = gr.Markdown(elem_id="message")
    status = gr.Markdown(elem_id="status")
    with gr.Row():
        memory_plot = gr.Plot(label="Memory over time", elem_id="memory-plot")
        step_peak_plot = gr.Plot(label="Peak per step", elem_id="step-peak-plot")
    with gr.Row():
        loss_plot = gr.Plot(label="Loss", elem_id="loss-plot")
        throughput_plot = gr.Plot(label="Throughput", elem_id="throughput-plot")
    events = gr.Textbox(label="Events", lines=6, interactive=False, elem_id="events")
    gallery = gr.Gallery(label="Samples (image runs: samples/*.png)", columns=4, height=260,
                         elem_id="samples")

    form = [model, data, max_seq_len, budget, mode, batching, checkpointing, attention, window,
            global_tokens, precision, quantization, optimizer]
    for component in [preset, *form]:  # every switch updates the prediction at once
        component.change(handlers.predict, [preset, *form], predicted)
    preset.change(handlers.form_defaults, preset, form).then(lambda p: p, preset, out_name).then(
        handlers.preset_task, preset, [task, resolution])
    task.input(handlers.task_preset, [task, preset], preset)
    upload.upload(handlers.use_upload, upload, [data, message])
    start.click(lambda n, t, r, p, o, *v: handlers.start_with_processes(n, t, p, o, *v, resolution=r),
                [processes, task, resolution, preset, out_name, *form], message)
    resume.click(lambda n, p, o, *v: handlers.start(p, o, *v, resume=True, processes=n),
                 [processes, preset, out_name, *form], message)
    stop.click(handlers.stop, None, message)
    timer = gr.Timer(1.0)
    timer.tick(handlers.poll, None, [memory_plot, step_peak_plot, loss_plot, throughput_plot, status, events])
    timer.tick(handlers.sample_gallery, None, gallery)
    return {"preset": preset, "form": form, "predicted": predicted, "start": start, "stop": stop,
            "memory_plot": memory_plot,
            "status": status, "message": message, "timer": timer}
