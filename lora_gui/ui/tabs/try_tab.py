"""Try tab: a finished run's adapter against its base, side by side, and Export."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui.tabs import try_handlers

refresh = try_handlers.refresh_runs  # the list of finished runs, called when the tab opens


def build() -> dict[str, gr.components.Component]:
    gr.Markdown("Pick a finished run, type a prompt: the base model and the adapter answer from the "
                "same seed (chat runs get their chat template); for a picture run, base and adapter "
                "pictures from the same prompt and seed at the chosen LoRA scale (a video run: clips "
                "that play here). Generation is refused "
                "while a training job would not leave the memory it needs.")
    runs = try_handlers.finished_runs()
    # the first run's task decides the panes shown at first (then each pick of a run)
    (show_tokens, show_temperature, show_scale, show_base, show_start, show_tuned, show_base_image,
     show_tuned_image) = try_handlers.task_panes(runs[0] if runs else None)
    show_base_clip, show_tuned_clip = try_handlers.clip_panes(runs[0] if runs else None)
    with gr.Row():
        run = gr.Dropdown(runs, value=runs[0] if runs else None, label="Run (runs/NAME with an adapter)",
                          elem_id="try-run", allow_custom_value=True)
        refresh = gr.Button("Refresh", elem_id="try-refresh")
    prompt = gr.Textbox(label="Prompt", lines=2, elem_id="try-prompt")
    with gr.Row():
        max_new = gr.Slider(1, 512, value=64, step=1, label="Max new tokens", visible=show_tokens)
        temperature = gr.Slider(0.0, 2.0, value=0.7, step=0.05, label="Temperature (0 = greedy)",
                                visible=show_temperature)
        seed = gr.Number(value=0, precision=0, label="Seed")
        scale = gr.Slider(0.0, 2.0, value=1.0, step=0.05, label="LoRA scale", visible=show_scale)
    go = gr.Button("Generate", variant="primary", elem_id="try-generate")
    message = gr.Markdown(elem_id="try-message")
    with gr.Row():
        base_text = gr.Textbox(label="Base model", lines=6, elem_id="try-base", visible=show_base)
        start_text = gr.Textbox(label="Adapter the run started from (e.g. its sft run)", lines=6,
                                elem_id="try-start", visible=show_start)
        tuned_text = gr.Textbox(label="With the adapter", lines=6, elem_id="try-adapter",
                                visible=show_tuned)
    with gr.Row():
        base_image = gr.Image(label="Base picture", type="pil", elem_id="try-base-image",
                              visible=show_base_image)
        tuned_image = gr.Image(label="Adapter picture", type="pil", elem_id="try-adapter-image",
                               visible=show_tuned_image)
    with gr.Row():  # a video run's clips (mp4), played in the page
        base_clip = gr.Video(label="Base clip", elem_id="try-base-clip", visible=show_base_clip)
        tuned_clip = gr.Video(label="Adapter clip", elem_id="try-adapter-clip", visible=show_tuned_clip)
    with gr.Accordion("Export this run", open=False):
        with gr.Row():
            out = gr.Textbox(label="Export folder (new or empty; default runs/NAME-export)",
                             elem_id="export-out")
            merged = gr.Checkbox(label="Merged model (text: base + adapter, safetensors)", value=False)
            gguf = gr.Dropdown(["none", "f16", "bf16", "q8_0"], value="none", elem_id="export-gguf",
                               label="GGUF for llama.cpp / Ollama (text: merged model + Modelfile)")
            export = gr.Button("Export", elem_id="export-button")
        export_message = gr.Markdown(elem_id="export-message")
    by_task = [max_new, temperature, scale, base_text, start_text, tuned_text, base_image, tuned_image,
               base_clip, tuned_clip]
    refresh.click(try_handlers.refresh_runs, run, run)
    run.change(try_handlers.task_view, run, by_task)
    go.click(try_handlers.generate, [run, prompt, max_new, temperature, seed, scale],
             [base_text, tuned_text, base_image, tuned_image, start_text, base_clip, tuned_clip, message])
    export.click(try_handlers.export, [run, out, merged, gguf], export_message)
    return {"run": run, "prompt": prompt, "generate": go, "base": base_text, "adapter": tuned_text,
            "start": start_text,
            "message": message, "export": export}
