"""Runs tab: every run under runs/, one run's charts, 2-4 runs overlaid, resume, delete; the
queue (order, state, reorder, cancel), a sweep of one setting and its overlay."""

from __future__ import annotations

from typing import Any

import gradio as gr

from lora_gui.ui import common
from lora_gui.ui.tabs import queue_handlers as queued
from lora_gui.ui.tabs import runs_handlers as handle


def _queue_section() -> dict[str, Any]:
    """The queue's table and its controls, and the sweep helper."""
    rows, line = queued.queue_rows()
    with gr.Accordion("Queue: runs waiting for the card", open=True, elem_id="queue"):
        table = gr.Dataframe(headers=list(queued.QUEUE_COLUMNS), value=rows, interactive=False,
                             label="Queue (runs start in this order when the card is free)",
                             elem_id="queue-table")
        with gr.Row():
            entry = gr.Dropdown(queued.entry_choices(), label="Queued run", elem_id="queue-entry")
            up = gr.Button("Up", elem_id="queue-up", min_width=60)
            down = gr.Button("Down", elem_id="queue-down", min_width=60)
            position = gr.Number(value=1, precision=0, label="Move to position", min_width=100)
            move = gr.Button("Move", elem_id="queue-move", min_width=60)
            cancel = gr.Button("Cancel run", variant="stop", elem_id="queue-cancel", min_width=100)
        with gr.Row():
            names = common.preset_names()
            preset = gr.Dropdown(names, value="text-demo" if "text-demo" in names else None,
                                 label="Sweep: preset", elem_id="sweep-preset")
            key = gr.Textbox(value="lr", label="Setting", elem_id="sweep-key")
            values = gr.Textbox(placeholder="1e-4, 2e-4, 4e-4", label="Values (comma-separated)",
                                elem_id="sweep-values")
            base = gr.Textbox(label="Run name prefix (runs: PREFIX-SETTING-VALUE)", elem_id="sweep-name")
            sweep = gr.Button("Queue sweep", elem_id="sweep-queue")
        with gr.Row():
            sweeps = gr.Dropdown(queued.sweep_choices(), label="Sweep", elem_id="sweep-pick")
            overlay = gr.Button("Overlay sweep", elem_id="sweep-overlay")
        note = gr.Markdown(line, elem_id="queue-note")  # a bad queue file, another dashboard running it
        message = gr.Markdown(elem_id="queue-message")
    return {"note": note, "table": table, "entry": entry, "up": up, "down": down, "position": position,
            "move": move, "cancel": cancel, "preset": preset, "key": key, "values": values, "base": base,
            "sweep": sweep, "sweeps": sweeps, "overlay": overlay, "message": message}


def _wire_queue(q: dict[str, Any], smoothing: gr.Slider, plots: list) -> Any:
    """Each action answers in the queue's message line, then the table and pickers reload."""
    def reload_queue() -> tuple:
        rows, line = queued.queue_rows()
        return (rows, gr.update(choices=queued.entry_choices()), gr.update(choices=queued.sweep_choices()),
                line)

    reload_out = [q["table"], q["entry"], q["sweeps"], q["note"]]
    for event, fn, inputs in (
            (q["up"].click, lambda e: queued.move_by(e, -1), [q["entry"]]),
            (q["down"].click, lambda e: queued.move_by(e, 1), [q["entry"]]),
            (q["move"].click, queued.move_to, [q["entry"], q["position"]]),
            (q["cancel"].click, queued.cancel, [q["entry"]]),
            (q["sweep"].click, queued.queue_sweep, [q["preset"], q["key"], q["values"], q["base"]])):
        event(fn, inputs, q["message"]).then(reload_queue, None, reload_out)
    q["overlay"].click(queued.overlay_sweep, [q["sweeps"], smoothing], [q["message"], *plots])
    return reload_queue, reload_out


def build() -> dict[str, Any]:
    refresh = gr.Button("Refresh", elem_id="runs-refresh")
    table = gr.Dataframe(headers=list(handle.RUN_COLUMNS), value=handle.list_runs(), interactive=False,
                         label="Runs (newest first)", elem_id="runs-table", wrap=True)  # reasons whole
    queue = _queue_section()
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

    reload_queue, queue_out = _wire_queue(queue, smoothing, [memory, loss, speed])

    refresh.click(reload, None, [table, chosen, several]).then(reload_queue, None, queue_out)
    open_btn.click(handle.open_run, [chosen, smoothing], [message, memory, loss, speed, timeline])
    overlay_btn.click(handle.overlay, [several, smoothing], [message, memory, loss, speed])
    resume.click(handle.resume_run, chosen, message)
    delete.click(lambda n: (handle.delete_run(n, False), gr.update(visible=bool(n))), chosen,
                 [message, confirm_row])
    confirm.click(lambda n: (handle.delete_run(n, True), gr.update(visible=False)), chosen,
                  [message, confirm_row]).then(reload, None, [table, chosen, several])
    cancel.click(lambda: ("", gr.update(visible=False)), None, [message, confirm_row])
    return {"refresh": refresh, "table": table, "reload": reload, "outputs": [table, chosen, several],
            "reload_queue": reload_queue, "queue_outputs": queue_out, "queue": queue}
