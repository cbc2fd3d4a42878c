"""Runs tab: every run under runs/, one run's charts, 2-4 runs overlaid, resume, delete."""

from __future__ import annotations

from typing import Any

import gradio as gr

from lora_gui.ui.tabs import runs_handlers as handle


def build() -> dict[str, Any]:
    refresh = gr.Button("Refresh", elem_id="runs-refresh")
    table = gr.Dataframe(headers=list(handle.RUN_COLUMNS), value=handle.list_runs(), interactive=False,
                         label="Runs (newest first)", elem_id="runs-table")
    with gr.Row():
        chosen = gr.Dropdown(handle.run_names(), label="Run", elem_id="runs-chosen")
        open_btn = gr.Button("Open charts", elem_id="runs-open")
        resume = gr.Button("Resume", elem_id="runs-resume")
        delete = gr.Button("Delete…", variant="stop", elem_id="runs-delete")
    with gr.Row(visible=False) as confirm_row:
        confirm = gr.Button("Yes, delete it", variant="stop", elem_id="runs-delete-confirm")
        cancel = gr.Button("Cancel", elem_id="runs-delete-cancel")
    message = gr.Markdown(elem_id="runs-message")
    with gr.Row():
        several = gr.Dropdown(handle.run_names(), multiselect=True, max_choices=handle.OVERLAY_RUNS[1],
                              label="Runs to overlay (2-4)", elem_id="runs-overlay-pick")
        smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01, label="Loss smoothing (EMA weight)")
        overlay_btn = gr.Button("Overlay", variant="primary", elem_id="runs-overlay")
    with gr.Row():
        memory = gr.Plot(label="Memory", elem_id="runs-memory")
        loss = gr.Plot(label="Loss", elem_id="runs-loss")
    with gr.Row():
        speed = gr.Plot(label="Throughput", elem_id="runs-speed")
        timeline = gr.Plot(label="Memory over time (one run)", elem_id="runs-timeline")

    def reload() -> tuple:
        names = handle.run_names()
        return handle.list_runs(), gr.update(choices=names), gr.update(choices=names)

    refresh.click(reload, None, [table, chosen, several])
    open_btn.click(handle.open_run, [chosen, smoothing], [message, memory, loss, speed, timeline])
    overlay_btn.click(handle.overlay, [several, smoothing], [message, memory, loss, speed])
    resume.click(handle.resume_run, chosen, message)
    delete.click(lambda n: (handle.delete_run(n, False), gr.update(visible=bool(n))), chosen,
                 [message, confirm_row])
    confirm.click(lambda n: (handle.delete_run(n, True), gr.update(visible=False)), chosen,
                  [message, confirm_row]).then(reload, None, [table, chosen, several])
    cancel.click(lambda: ("", gr.update(visible=False)), None, [message, confirm_row])
    return {"refresh": refresh, "table": table, "reload": reload, "outputs": [table, chosen, several]}
