"""Images against diffusers' own LoRA scripts: the script vs lora_gui on the same work, one run.

    pip install --no-deps --target bench/.peer_deps -r bench/peer_diffusers/requirements.txt
    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python -m bench.peer_diffusers [--steps 12] [--rounds 2]

Pipelines: a tiny SDXL (UNet, two CLIP encoders; built from configs as tests/engine/test_image_sdxl.py
does) against ``train_text_to_image_lora_sdxl.py``; a tiny Flux (lora_gui.models.build_dit) against
``train_dreambooth_lora_flux.py``; the bundled drawing model (assets/drawing-model, SD3-shaped)
against ``train_dreambooth_lora_sd3.py``. The scripts are diffusers' own, copied unmodified into
scripts/ (see scripts/SOURCE.md) and run in a subprocess by launch.py.

Same work on both sides: the 24 bundled star pictures and their captions (assets/drawing-stars;
the scripts read them as an imagefolder with the same captions), 64 px, batch 4, the same number
of optimizer steps, LoRA rank 4 / alpha 4 on each script's default targets (lora_gui's defaults are
the same lists), AdamW with the script's weight decay, learning rate 1e-3 with no warmup (the
scripts: constant; lora_gui: its own decay),
fp32, seed 0, T5 captions cut at 12 tokens (Flux, SD3; the bundled model's encoders have 12
positions), one torch thread.

Configurations: the script with its defaults, the script with its documented memory switches on
(--gradient_checkpointing, --use_8bit_adam, and --cache_latents where it has it), lora_gui's defaults,
and lora_gui with the same switches. Each run is a fresh subprocess; runs alternate script /
lora_gui and the order is reversed every other round; medians over rounds.

Measured the same way for both: peak = live tensor-storage bytes counted by
``lora_gui.memory.runtime.tracker`` around the whole training call (loading, caching, the loop,
saving; source ``tracker``); images/s = batch x (steps - 1) / the time from the first to the last
optimizer step (a global optimizer-step hook); the loss each side logs per step.

``--untracked-peer``: the first round runs both sides under that tracker and gives the peaks; the
later rounds give the speeds with each side run as its users run it: the script with no tracker
around it (the tracker, a Python dispatch mode on every op, slows it several times), lora_gui with
no tracker around it but its own built-in one (how a CPU run measures its step peaks: the first 2
steps of each step shape, later ones of a measured shape without it).
``--diagnose``: the untracked rounds also run lora_gui's defaults without that built-in tracker
(not a configuration users run: a row that says what the tracker costs).
"""

from bench.peer_diffusers.bench import main

if __name__ == "__main__":
    main()
