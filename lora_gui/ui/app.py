"""The dashboard: composes the tabs (ui/tabs/NAME.py builds a tab, NAME_handlers.py handles it)."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui import common
from lora_gui.ui.tabs import compare, plan, presets, runs, train, try_tab


def _refresh_presets(dropdowns: list[gr.Dropdown]):
    """After a preset is saved (Train or Presets tab) every preset dropdown lists it."""
    def refresh() -> list:
        return [gr.update(choices=common.preset_names())] * len(dropdowns)
    return refresh


def build_app() -> gr.Blocks:
    from lora_gui.models.warm_imports import load_diffusers

    load_diffusers()  # before any request: handlers and runs import diffusers from several threads
    common.MANAGER.attach_live(common.runs_root())  # a run that kept training while no dashboard ran
    with gr.Blocks(title="lora_gui") as demo:
        gr.Markdown("# lora_gui — LoRA training that fits\nEvery memory figure names its source: "
                    "`cuda_allocator` (GPU), `tracker` (live tensor bytes; the CPU stand-in for the "
                    "GPU allocator) or `predicted` (the planner, before a run).")
        with gr.Tab("Train"):
            train_tab = train.build()
        with gr.Tab("Runs") as runs_page:
            runs_tab = runs.build()
        with gr.Tab("Compare"):
            compare_tab = compare.build()
        with gr.Tab("Plan"):
            plan_tab = plan.build()
        with gr.Tab("Presets"):
            presets_tab = presets.build()
        with gr.Tab("Try"):
            try_tab.build()
        dropdowns = [train_tab["preset"], compare_tab["preset"], plan_tab["preset"], presets_tab["name"]]
        for saved in (train_tab["saved"], presets_tab["saved"]):
            saved.then(_refresh_presets(dropdowns), None, dropdowns)
        runs_page.select(runs_tab["reload"], None, runs_tab["outputs"])
        demo.load(train_tab["estimate"], train_tab["inputs"], train_tab["estimate_out"]).then(
            train_tab["plan"], train_tab["inputs"], train_tab["panel_out"], concurrency_limit=1,
            concurrency_id="plan")
        demo.load(compare_tab["instant"], [compare_tab["preset"], compare_tab["model"], compare_tab["sizes"]],
                  compare_tab["shown"])
    return demo
