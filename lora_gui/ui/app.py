"""The dashboard: composes the tabs. Handlers live in handlers.py, figures in charts.py."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui import handlers
from lora_gui.ui.tabs import compare, plan, presets, train, try_tab


def build_app() -> gr.Blocks:
    with gr.Blocks(title="lora_gui") as demo:
        gr.Markdown("# lora_gui — LoRA training that fits\nMemory figures name their source: "
                    "`tracker` (live tensor bytes, CPU stand-in for the CUDA allocator) or "
                    "`cuda_allocator`.")
        with gr.Tab("Train"):
            train_tab = train.build()
        demo.load(handlers.predict, [train_tab["preset"], *train_tab["form"]], train_tab["predicted"])
        with gr.Tab("Plan"):
            plan.build()
        with gr.Tab("Compare"):
            compare.build()
        with gr.Tab("Presets"):
            presets.build()
        with gr.Tab("Try"):
            try_tab.build()
    return demo
