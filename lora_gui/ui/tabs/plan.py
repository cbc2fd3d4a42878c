"""Plan tab: will it fit? Predicted breakdown against the budget, batch per bucket, what to switch.
Handlers: plan_handlers.py."""

from __future__ import annotations

import gradio as gr

from lora_gui.config import choices_of
from lora_gui.ui import common, forms
from lora_gui.ui.tabs import longest_handlers
from lora_gui.ui.tabs import plan_handlers as handlers


def build() -> dict[str, gr.components.Component]:
    gr.Markdown("Predicted on this machine's CPU from the model's real shapes (a fake-tensor trace "
                "of one training step); no weights are downloaded. Bundled architectures: "
                + ", ".join(handlers.bundled_model_names()) + ".")
    with gr.Row():
        preset = gr.Dropdown(common.preset_names(), value="text-demo", label="Preset")
        model = gr.Dropdown(["builtin", *handlers.bundled_model_names()], value="builtin",
                            allow_custom_value=True, label="Model (bundled config, builtin or local dir)")
        card = gr.Dropdown(common.card_choices(), value=common.CUSTOM_CARD,
                           label="GPU card (sets the budget)",
                           elem_id="plan-card", scale=2)
    fields = {f.name: f for f in forms.settings_fields()}
    with gr.Row():  # the settings' own widgets (choices, ranges and help from RunConfig)
        max_seq_len, resolution, budget = (forms.widget_for(fields[name], value, elem_prefix="plan")
                                           for name, value in handlers.FIELD_DEFAULTS[:3])
        device = gr.Radio(["cuda", "cpu"], value="cuda", label="Plan for")
        checkpointing, quantization, optimizer = (forms.widget_for(fields[name], value, elem_prefix="plan")
                                                  for name, value in handlers.FIELD_DEFAULTS[3:])
    with gr.Row():
        button = gr.Button("Plan", variant="primary", elem_id="plan-button")
        longest = gr.Button("Longest that fits", elem_id="plan-longest")
    message = gr.Markdown(elem_id="plan-message")
    longest_message = gr.Markdown(elem_id="plan-longest-message")
    chart = gr.Plot(label="Breakdown", elem_id="plan-chart")
    buckets = gr.Dataframe(headers=["bucket (tokens or px)", "micro-batch", "grad accum",
                                    "predicted peak GB"], label="Batch per bucket", interactive=False)
    cards = gr.Dataframe(headers=["card GB", "longest / largest at batch 1", "batch at chosen size",
                                  *(f"{n} GPUs FSDP: longest / batch per GPU" for n in (2, 4, 8)),
                                  *(f"1 GPU, {q} base: longest / batch" for q in choices_of("quantization"))],
                         label="What fits where (N GPUs: FSDP shards the frozen weights)", interactive=False)
    card.change(lambda name: common.card_budget_gb(name) or gr.update(), card, budget)
    budget.input(lambda: common.CUSTOM_CARD, None, card)
    inputs = [preset, model, max_seq_len, resolution, budget, device, checkpointing, quantization, optimizer]
    button.click(handlers.plan, inputs, [chart, message, buckets, cards])
    longest.click(longest_handlers.plan_tab,
                  [preset, model, budget, device, checkpointing, quantization, optimizer], longest_message)
    return {"card": card, "button": button, "chart": chart, "message": message, "preset": preset,
            "longest": longest, "longest_message": longest_message}
