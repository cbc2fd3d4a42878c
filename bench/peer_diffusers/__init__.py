"""Bench: diffusers' own LoRA training scripts against lora_gui (see __main__.py)."""
