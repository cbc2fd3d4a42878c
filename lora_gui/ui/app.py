"""The dashboard: composes the tabs (ui/tabs/NAME.py builds a tab, NAME_handlers.py handles it)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from lora_gui.ui import common
from lora_gui.ui.tabs import compare, plan, presets, runs, train, try_tab


def _refresh_presets(dropdowns: list[gr.Dropdown]):
    """After a preset is saved (Train or Presets tab) every preset dropdown lists it."""
    def refresh() -> list:
        return [gr.update(choices=common.preset_names())] * len(dropdowns)
    return refresh


# The key settings' help shows two lines until the pointer rests on the field or it has focus,
# then all of it (the first screen holds the settings that decide a run, the plan and Start).
CSS = """
.key-field .info-text { display: -webkit-box; -webkit-line-clamp: 2; -webkit-box-orient: vertical;
                        overflow: hidden; cursor: help; }
.key-field:hover .info-text, .key-field:focus-within .info-text { display: block; }
"""


def _remember_card(demo: gr.Blocks, pickers: dict[str, gr.Dropdown]) -> None:
    """Each tab's card picker shows the card last picked on that tab in this browser; a pick on
    one tab changes no other tab's budget (choices stay where they are made)."""
    def restore(card: str | None) -> Any:
        known = {key for _, key in common.card_choices()}
        return card if card in known and card != common.CUSTOM_CARD else gr.update()

    for tab, picker in pickers.items():
        key = f"{common.CARD_STORAGE_KEY}-{tab}"  # a preference, not a secret
        memory = gr.BrowserState(common.CUSTOM_CARD, storage_key=key, secret=key)
        demo.load(restore, memory, picker)
        picker.input(lambda card: card, picker, memory)


def build_app() -> gr.Blocks:
    from lora_gui.models.warm_imports import load_diffusers

    load_diffusers()  # before any request: handlers and runs import diffusers from several threads
    common.MANAGER.attach_live(common.runs_root())  # a run that kept training while no dashboard ran
    common.MANAGER.run_queue(common.runs_root())  # queued runs start here when the card is free
    with gr.Blocks(title="lora_gui") as demo:
        gr.Markdown("**lora_gui — LoRA training that fits.** Every memory figure names its source: "
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
        with gr.Tab("Try") as try_page:
            try_parts = try_tab.build()
        dropdowns = [train_tab["preset"], compare_tab["preset"], plan_tab["preset"], presets_tab["name"]]
        for saved in (train_tab["saved"], presets_tab["saved"]):
            saved.then(_refresh_presets(dropdowns), None, dropdowns)
        runs_page.select(runs_tab["reload"], None, runs_tab["outputs"]).then(
            runs_tab["reload_queue"], None, runs_tab["queue_outputs"])
        try_page.select(try_tab.refresh, try_parts["run"], try_parts["run"])  # runs finished since
        # the card picked on each tab, kept in this browser between visits
        _remember_card(demo, {"train": train_tab["card"], "plan": plan_tab["card"],
                              "compare": compare_tab["card"]})
        demo.load(train_tab["estimate"], train_tab["estimate_in"], train_tab["estimate_out"]).then(
            train_tab["plan"], train_tab["inputs"], train_tab["panel_out"], concurrency_limit=1,
            concurrency_id="plan")
        demo.load(compare_tab["instant"], compare_tab["instant_in"], compare_tab["shown"])
    return demo
