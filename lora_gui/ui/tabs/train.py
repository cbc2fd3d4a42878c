"""Train tab: preset, run name, every setting (derived from RunConfig), the predicted peak,
Start / Stop / Resume, live charts. Handlers: train_handlers.py."""

from __future__ import annotations

from typing import Any

import gradio as gr

from lora_gui.ui import common, forms
from lora_gui.ui.tabs import longest_handlers
from lora_gui.ui.tabs import train_handlers as handle


def _prediction_panel() -> dict[str, Any]:
    with gr.Group():
        text = gr.Markdown(elem_id="predicted")
        with gr.Row():
            chart = gr.Plot(label="Predicted peak by category", elem_id="predicted-chart")
            table = gr.Dataframe(headers=["bucket", "micro-batch"], label="Micro-batch per bucket",
                                 interactive=False, elem_id="predicted-buckets")
    return {"text": text, "chart": chart, "table": table}


def _charts() -> dict[str, Any]:
    with gr.Row():
        memory = gr.Plot(label="Memory over time", elem_id="memory-plot")
        step_peak = gr.Plot(label="Peak per step", elem_id="step-peak-plot")
    with gr.Row():
        with gr.Column():
            loss = gr.Plot(label="Loss", elem_id="loss-plot")
            smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01, label="Loss smoothing (EMA weight)",
                                  elem_id="loss-smoothing")
        throughput = gr.Plot(label="Throughput", elem_id="throughput-plot")
    return {"memory": memory, "step_peak": step_peak, "loss": loss, "smoothing": smoothing,
            "throughput": throughput}


def build() -> dict[str, Any]:
    names = common.preset_names()
    default = "text-demo" if "text-demo" in names else names[0]
    values = handle.form_values(default)
    with gr.Row():
        preset = gr.Dropdown(names, value=default, label="Preset", elem_id="preset")
        run_name = gr.Textbox(value=default, label="Run name (a folder under runs/)", elem_id="run-name")
        processes = gr.Number(value=max(1, common.gpu_count()), precision=0, elem_id="processes",
                              label="Processes (one per GPU; started with accelerate launch)",
                              visible=common.gpu_count() > 1)
    gr.Markdown(common.budget_note())
    form = forms.build_form(values)
    upload = gr.File(label="Upload a text data file (.txt, .jsonl, .csv)", elem_id="upload",
                     file_types=[".txt", ".jsonl", ".csv"], visible=values["task"] == "text")
    with gr.Accordion("Save these settings as a preset", open=False):
        with gr.Row():
            preset_name = gr.Textbox(label="Preset name", elem_id="save-preset-name")
            preset_note = gr.Textbox(label="What it is for (first line of the file)")
            save = gr.Button("Save as preset", elem_id="save-preset")
        save_message = gr.Markdown(elem_id="save-preset-message")
    panel = _prediction_panel()
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="start")
        stop = gr.Button("Stop", elem_id="stop")
        resume = gr.Button("Resume", elem_id="resume")
        longest = gr.Button("Longest that fits", elem_id="longest")
    message = gr.Markdown(elem_id="message")
    with gr.Row(visible=False) as confirm:
        overwrite_btn = gr.Button("Overwrite that run", variant="stop", elem_id="confirm-overwrite")
        resume_btn = gr.Button("Resume that run", elem_id="confirm-resume")
        cancel_btn = gr.Button("Cancel", elem_id="confirm-cancel")
    status = gr.Markdown(elem_id="status")
    plots = _charts()
    events = gr.Textbox(label="Events", lines=6, interactive=False, elem_id="events")
    gallery = gr.Gallery(label="Sample pictures (image runs)", columns=4, height=260, elem_id="samples")

    inputs = {processes, *form.components}
    panel_out = [panel["text"], panel["chart"], panel["table"]]

    def estimate(data: dict, request: gr.Request) -> dict:
        cfg_values = form.named(data)
        handle.SHOWN_FORMS.mark(request.session_hash, cfg_values, data[processes])
        _, errors = handle.config_from_form(cfg_values)
        text, fig, rows = handle.prediction_view(cfg_values, data[processes], exact=False)
        return {**forms.error_updates(form, errors), panel["text"]: text, panel["chart"]: fig,
                panel["table"]: rows}

    def plan(data: dict, request: gr.Request) -> tuple:
        values = form.named(data)
        view = handle.prediction_view(values, data[processes], exact=True)
        if not handle.SHOWN_FORMS.is_current(request.session_hash, values, data[processes]):
            return (gr.update(),) * len(view)  # the page's settings changed while this planned
        return view

    def fill(name: str) -> dict:
        filled = handle.form_values(name)
        updates = forms.visibility(form, filled["task"])  # one update per widget: value and visible
        for key, value in filled.items():
            if key in form.widgets:
                updates[form.widgets[key]] = {**updates[form.widgets[key]], "value": value}
        return {**updates, **forms.error_updates(form, {}),
                run_name: name, upload: gr.update(visible=filled["task"] == "text")}

    def on_task(task: str) -> dict:
        return {**forms.visibility(form, task), upload: gr.update(visible=task == "text")}

    estimate_out = [*form.errors.values(), *panel_out]
    fill_out = [*form.components, *form.groups.values(), *form.errors.values(), run_name, upload]
    preset.change(fill, preset, fill_out).then(estimate, inputs, estimate_out).then(
        plan, inputs, panel_out, concurrency_limit=1, concurrency_id="plan")
    form.widgets["task"].change(on_task, form.widgets["task"], [*form.components, *form.groups.values(),
                                                                 upload])
    gr.on([w.input for w in [*form.components, processes]], estimate, inputs, estimate_out,
          trigger_mode="always_last").then(plan, inputs, panel_out, concurrency_limit=1,
                                           concurrency_id="plan", trigger_mode="always_last")

    def start_as(how: str):
        def go(data: dict) -> dict:
            text, errors, ask = handle.start(data[run_name], data[processes], form.named(data), how)
            return {message: text, confirm: gr.update(visible=ask), **forms.error_updates(form, errors)}
        return go

    start_out = [message, confirm, *form.errors.values()]
    start.click(start_as(handle.START_NEW), {run_name, *inputs}, start_out)
    overwrite_btn.click(start_as(handle.START_OVERWRITE), {run_name, *inputs}, start_out)
    for button in (resume, resume_btn):
        button.click(start_as(handle.START_RESUME), {run_name, *inputs}, start_out)
    cancel_btn.click(lambda: ("", gr.update(visible=False)), None, [message, confirm])
    stop.click(handle.stop, None, message)

    filled = [form.widgets[k] for k in longest_handlers.FILLED if k in form.widgets]

    def fill_longest(data: dict) -> dict:
        values, text = longest_handlers.fill_form(form.named(data))
        return {message: text, **{form.widgets[k]: v for k, v in values.items() if k in form.widgets}}

    longest.click(fill_longest, inputs, [message, *filled], concurrency_limit=1,
                  concurrency_id="plan").then(estimate, inputs, estimate_out).then(
        plan, inputs, panel_out, concurrency_limit=1, concurrency_id="plan")

    def uploaded(path: str | None) -> tuple:
        value, text = handle.use_upload(path)
        return (gr.update() if value is None else value), text

    upload.upload(uploaded, upload, [form.widgets["data"], message])
    save_event = save.click(lambda d: handle.save_as_preset(d[preset_name], form.named(d), d[preset_note]),
                            {preset_name, preset_note, *form.components}, save_message)
    timer = gr.Timer(1.0)
    timer.tick(handle.poll, plots["smoothing"], [plots["memory"], plots["step_peak"], plots["loss"],
                                                 plots["throughput"], status, events])
    plots["smoothing"].release(handle.poll, plots["smoothing"],
                               [plots["memory"], plots["step_peak"], plots["loss"], plots["throughput"],
                                status, events])
    timer.tick(handle.sample_gallery, None, gallery)
    return {"preset": preset, "form": form, "inputs": inputs, "estimate": estimate, "plan": plan,
            "estimate_out": estimate_out, "panel_out": panel_out, "start": start, "status": status,
            "message": message, "longest": longest, "saved": save_event, "save_message": save_message,
            "timer": timer}
