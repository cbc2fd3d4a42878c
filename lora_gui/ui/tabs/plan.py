"""Plan tab: will it fit? Predicted breakdown against the budget, batch per bucket, what to switch.
Every memory figure on this page is in GB (1e9 bytes), the unit of its budget field and of the
card picker. Handlers: plan_handlers.py."""

from __future__ import annotations

import gradio as gr

from lora_gui.adapter_settings import TEXT_QUANTIZATIONS
from lora_gui.config import RunConfig
from lora_gui.ui import common, forms, gpu_share
from lora_gui.ui.tabs import longest_handlers
from lora_gui.ui.tabs import plan_handlers as handlers
from lora_gui.ui.tabs import plan_video_handlers as video


def build() -> dict[str, gr.components.Component]:
    gr.Markdown("Predicted on this machine's CPU from the model's real shapes (a fake-tensor trace "
                "of one training step); no weights are downloaded. Every figure here is in GB (1e9 "
                "bytes). Bundled architectures: " + ", ".join(handlers.bundled_model_names()) + ".")
    with gr.Row():
        preset = gr.Dropdown(common.preset_names(), value="text-demo", label="Preset", elem_id="plan-preset")
        model = gr.Dropdown(["builtin", *video.VIDEO_PIPELINES, *handlers.bundled_model_names()],
                            value="builtin",
                            allow_custom_value=True, label="Model (bundled config, builtin or local dir)",
                            elem_id="plan-model")
        card = gr.Dropdown(common.card_choices(), value=common.CUSTOM_CARD,
                           label="GPU card (sets the budget on this page)",
                           elem_id="plan-card", scale=2, min_width=320)
    fields = {f.name: f for f in forms.settings_fields()}
    defaults = dict(handlers.FIELD_DEFAULTS)
    with gr.Row():  # the settings' own widgets (choices, ranges and help from RunConfig)
        max_seq_len, resolution = (
            forms.widget_for(fields[name], defaults[name], elem_prefix="plan", visible=name != "resolution")
            for name in ("max_seq_len", "resolution"))  # the first preset is a text one
        # a video run's size as its trainers write it (832x480 or a side): RunConfig's resolution,
        # read as `--set resolution=` reads it
        video_resolution = gr.Textbox(
            value=str(defaults["resolution"]), label=forms.label_for(fields["resolution"]),
            info=forms.help_for(fields["resolution"], "video") + " Here: WxH (832x480) or a side (512).",
            elem_id="plan-video-resolution", visible=False)
        budget = forms.widget_for(fields["budget_gb"], defaults["budget_gb"], elem_prefix="plan")
        device = gr.Radio(["cuda", "cpu"], value="cuda", label="Plan for")
        host_gb = gr.Number(value=round(handlers.host_free_gb(), 1), label="Host memory (GB)",
                            info="Memory the offloaded tensors may take on this computer (the longest "
                                 "length stops at it; a video plan's swapped blocks must fit it); default: "
                                 "what is free now.",
                            elem_id="plan-host-gb", minimum=0)
    with gr.Row():
        lora_rank, batch_size, checkpointing, quantization, optimizer = (
            forms.widget_for(fields[name], defaults[name], elem_prefix="plan")
            for name in ("lora_rank", "batch_size", "gradient_checkpointing", "quantization", "optimizer"))
        quantization.choices = [(q, q) for q in TEXT_QUANTIZATIONS]  # the first preset's; video: none / fp8
    with gr.Row():  # a video run's clip and switches (shown for a video preset or model)
        video_fields = [forms.widget_for(fields[name], getattr(RunConfig(), name), elem_prefix="plan",
                                         visible=False, task="video") for name in video.VIDEO_FIELDS]
    with gr.Row():  # several GPUs: the figures are one GPU's (plan --world-size N --fsdp [--offload])
        gpus = gr.Number(value=1, precision=0, minimum=1, label="GPUs", elem_id="plan-gpus",
                         info="Processes of one run, one per GPU; figures per GPU.")
        sharing = gr.Radio(list(gpu_share.CHOICES), value=gpu_share.FSDP, label="Several GPUs",
                           info=gpu_share.HELP, elem_id="plan-sharing", scale=2)
    with gr.Row():
        button = gr.Button("Plan", variant="primary", elem_id="plan-button")
        longest = gr.Button("Longest that fits", elem_id="plan-longest")
    message = gr.Markdown(elem_id="plan-message")
    longest_message = gr.Markdown(elem_id="plan-longest-message")
    chart = gr.Plot(label="Breakdown", elem_id="plan-chart")
    buckets = gr.Dataframe(headers=["bucket (tokens or px)", "micro-batch", "grad accum",
                                    "worst case at this micro-batch, GB"],
                           label="Batch per bucket (a full-length sample in each bucket)", interactive=False)
    cards = gr.Dataframe(headers=["card", "longest / largest at batch 1", "batch at chosen size",
                                  *(f"{n} GPUs FSDP: longest / batch per GPU" for n in (2, 4, 8)),
                                  *(f"1 GPU, {q} base: longest / batch" for q in TEXT_QUANTIZATIONS)],
                         label="What fits where (N GPUs: FSDP shards the frozen weights)", interactive=False)
    card.change(lambda name: common.card_budget_gb(name) or gr.update(), card, budget)
    budget.input(lambda: common.CUSTOM_CARD, None, card)
    settings = [max_seq_len, resolution, budget, device, checkpointing, quantization, optimizer,
                lora_rank, batch_size]
    video_inputs = [video_resolution, *video_fields]
    inputs = [preset, model, *settings, gpus, sharing, host_gb, *video_inputs]
    sizes = [max_seq_len, resolution, *video_inputs]
    preset.input(handlers.preset_settings, [preset, model],
                 [max_seq_len, resolution, checkpointing, quantization, optimizer, lora_rank, batch_size,
                  model, *video_inputs])
    # a model of another kind (a bundled video config...) shows that task's fields
    model.input(lambda p, m, q: video.mode_updates(video.task_for(p, m), q), [preset, model, quantization],
                [*sizes, quantization])
    # an answer for other settings is stale
    for widget in [preset, model, card, host_gb, gpus, sharing, *settings, *video_inputs]:
        widget.change(handlers.mark_stale, [message, longest_message], [message, longest_message])
    button.click(lambda: "", None, longest_message).then(  # the earlier longest answer goes with it
        handlers.plan, inputs, [chart, message, buckets, cards])
    longest.click(longest_handlers.plan_tab,
                  [preset, model, budget, device, checkpointing, quantization, optimizer, host_gb, lora_rank,
                   batch_size, *video_inputs], longest_message)
    return {"card": card, "button": button, "chart": chart, "message": message, "preset": preset,
            "longest": longest, "longest_message": longest_message, "host_gb": host_gb,
            "lora_rank": lora_rank, "batch_size": batch_size, "gpus": gpus, "sharing": sharing,
            "model": model, "max_seq_len": max_seq_len, "resolution": resolution,
            "quantization": quantization,
            "video_resolution": video_resolution, **dict(zip(video.VIDEO_FIELDS, video_fields))}
