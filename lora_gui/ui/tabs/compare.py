"""Compare tab: traditional vs optimized from a compare.json (grouped bars with the saving,
tokens/s at the same budget, the ablation waterfall), or run a comparison from here."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui import handlers


def build() -> dict[str, gr.components.Component]:
    gr.Markdown("Rows of `python -m lora_gui compare` (or of a run started below). Every memory "
                "figure names its source; rows labelled predicted were not measured.")
    with gr.Row():
        path = gr.Textbox(value="runs/cmp/compare.json", label="compare.json (or its folder)",
                          elem_id="compare-path")
        data = gr.Radio(["corpus", "full"], value="corpus", label="Data")
        size = gr.Textbox(value="", label="Length / resolution for the waterfall (empty: longest)")
        load = gr.Button("Load", variant="primary", elem_id="compare-load")
    message = gr.Markdown(elem_id="compare-message")
    with gr.Row():
        bars = gr.Plot(label="Peak memory, same work", elem_id="compare-bars")
        speed = gr.Plot(label="Tokens/s, same budget", elem_id="compare-speed")
    waterfall = gr.Plot(label="Ablation", elem_id="compare-waterfall")
    table = gr.Dataframe(headers=list(handlers.COMPARE_TABLE_COLUMNS), interactive=False, label="Rows")
    load.click(handlers.load_compare, [path, data, size], [message, bars, speed, waterfall, table])
    with gr.Accordion("Run a comparison (CPU: minutes per length)", open=False):
        with gr.Row():
            preset = gr.Dropdown(handlers.preset_names(), value="text-demo", label="Preset")
            seq_lens = gr.Textbox(value="512,1024", label="Sequence lengths")
            steps = gr.Number(value=3, precision=0, label="Steps per row")
            out = gr.Textbox(value="runs/cmp", label="Output folder")
        with gr.Row():
            run = gr.Button("Run", elem_id="compare-run")
            stop = gr.Button("Stop", elem_id="compare-stop")
        status = gr.Markdown()
    run.click(handlers.start_compare, [preset, seq_lens, steps, out], status)
    stop.click(handlers.stop_compare, None, status)
    gr.Markdown("Measured table of the issue-2 benchmark (docs/BENCHMARKS.md, source: tracker), "
                "reproduced by `python -m bench.text_memory`:")
    gr.Markdown(handlers.benchmark_table(), elem_id="compare-table")
    return {"load": load, "message": message, "bars": bars, "table": table}
