"""Compare tab: the predicted comparison at first sight (every mode, per length or resolution),
measured rows on demand as a background job, saved comparisons reloaded. Handlers:
compare_handlers.py."""

from __future__ import annotations

from typing import Any

import gradio as gr

from lora_gui.config import ADAPTERS
from lora_gui.ui import common
from lora_gui.ui.tabs import compare_handlers as handle


def build() -> dict[str, Any]:
    from lora_gui.engine.compare.quick import QUICK_STEPS

    names = common.preset_names()
    default = "text-demo" if "text-demo" in names else names[0]
    gr.Markdown("Traditional training (padding to the full length, eager attention, one fixed batch) "
                "against a strong baseline and the optimized mode, and each optimization alone. "
                "Predicted rows appear at once; measured rows come from short real runs on this "
                "machine. Every figure names its source.")
    with gr.Row():
        preset = gr.Dropdown(names, value=default, label="Preset", elem_id="compare-preset")
        model = gr.Dropdown(handle.model_choices(), value=handle.PRESET_MODEL, label="Model shapes",
                            elem_id="compare-model")
        sizes = gr.Textbox(value="", label="Lengths or resolutions (empty: the usual range)",
                           elem_id="compare-sizes")
        card = gr.Dropdown(common.card_choices(), value=common.CUSTOM_CARD, elem_id="compare-card",
                           label="GPU card (its memory drawn as a line)")
    message = gr.Markdown(elem_id="compare-message")
    with gr.Row():
        bars = gr.Plot(label="Peak memory per mode", elem_id="compare-bars")
        lines = gr.Plot(label="Peak memory over length", elem_id="compare-lines")
    table = gr.Dataframe(headers=list(handle.TABLE_COLUMNS), interactive=False, label="Rows",
                         elem_id="compare-table")
    with gr.Accordion("Measure on this machine", open=True):
        gr.Markdown(common.budget_note(), elem_id="compare-budget-note")
        with gr.Row():
            measure_sizes = gr.Textbox(value="512", label="Lengths (text) or resolutions (image) to measure",
                                       elem_id="compare-measure-sizes")
            steps = gr.Number(value=QUICK_STEPS, precision=0, label="Steps a row", elem_id="compare-steps")
            out = gr.Textbox(value=handle.default_out(default), label="Saved as (a folder under runs/)",
                             elem_id="compare-out")
        variants = gr.CheckboxGroup(list(ADAPTERS), value=[], elem_id="compare-variants",
                                    label="Adapter variants side by side (text: same data, steps and "
                                          "budget at the first length; none: traditional vs optimized)")
        with gr.Row():
            measure = gr.Button("Measure", variant="primary", elem_id="compare-measure")
            stop = gr.Button("Stop", elem_id="compare-stop")
        progress = gr.Markdown(elem_id="compare-progress")
        with gr.Row():
            saved = gr.Dropdown(handle.saved_comparisons(), label="Saved comparisons",
                                elem_id="compare-saved")
            load = gr.Button("Load", elem_id="compare-load")
    shown = [message, bars, lines, table]
    instant_in = [preset, model, sizes, card]
    for trigger in (preset.change, model.change, sizes.submit, card.change):
        trigger(handle.instant, instant_in, shown, trigger_mode="always_last")
    preset.change(handle.default_out, preset, out)
    measure.click(handle.measure, [preset, measure_sizes, steps, out, variants], progress)
    load.click(handle.load_saved, saved, shown)
    saved.focus(lambda: gr.update(choices=handle.saved_comparisons()), None, saved)
    seen = gr.State(None)  # what this page last drew of the measuring job
    timer = gr.Timer(2.0)
    stop.click(handle.stop, None, [progress, seen])
    timer.tick(handle.progress_and_header, [preset, model, sizes, out, seen, card],
               [progress, bars, lines, table, seen, message])
    return {"preset": preset, "model": model, "sizes": sizes, "card": card, "shown": shown,
            "instant": handle.instant, "instant_in": instant_in}
